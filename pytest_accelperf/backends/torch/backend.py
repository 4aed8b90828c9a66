"""The PyTorch backend: one process, one device (CPU or one CUDA GPU), eager or compiled.

(A case with ``world_size > 1`` trains with DistributedDataParallel in that many processes
instead, :mod:`pytest_accelperf.backends.torch.ddp`: this backend's spec names it as its ranks,
and the plugin, not this module, makes that choice (:mod:`pytest_accelperf.gate.routing`).)

What it trains is a :class:`~pytest_accelperf.backends.torch.step.TorchStep`: the user's
own ``step(batch) -> metrics`` over their model, optimizer, scheduler, scaler and
accumulation (a :class:`TorchTask` becomes one through ``TorchTask.to_step``). It follows
the JAX backend's rules: compile time is kept apart from step times, every measured step
is synchronized, the loss and the other metrics of every step are recorded, a NaN/inf
loss ends the run as the outcome ``nan``, and running out of memory is an outcome, not a
crash. The trained model comes back to the test as ``CaseResult.state``.

Memory: on CUDA the caching allocator's peak (``max_memory_allocated``) over the real
training (``cuda_allocator``), from a fresh start (:func:`~.torch.memory.fresh_peak`: the
earlier cases' garbage collected first, so it is not in this case's peak). On CPU, where
there is no allocator counter (and RSS is neither per-case nor deterministic), the peak
is counted over two eager steps run before the measured run and undone afterwards
(:func:`~.torch.step.undone`; :func:`~.torch.memory.cpu_memory`): by ``MemTracker`` (a
dispatch mode that sums the storage bytes of live tensors: parameters, gradients,
optimizer state and activations, the same bytes every run), or, where MemTracker cannot
follow the step (it raises on a module called twice in one step, as gradient accumulation
does), by the profiler's allocations. The method that counted is the run's
``memory_source`` and is shown beside the memory check; the memory check refuses to
compare numbers counted by different methods. A CPU case whose peak exceeds its declared
``memory_capacity`` is recorded as ``oom`` before it trains.

FLOPs per step come from ``FlopCounterMode`` (:mod:`.torch.flops`; and the program's op
counts from a dispatch mode beside it, :mod:`.torch.ops`) over one untimed call of the step
on step 0's batch (``TorchStep.count_step`` where given), undone afterwards like the memory
count: the optimizer, scheduler and scaler are not advanced by it.

Memory growth (``Run.memory_growth``, a leak): on CPU the same counting runs
:data:`~.torch.memory.GROWTH_STEPS` more steps after the :data:`~.torch.memory.MEMORY_STEPS`
and reads the live bytes
after each (MemTracker's live tensors, or the profiler's allocations net of frees): their
growth over those steps, per step. On CUDA ``torch.cuda.memory_allocated`` after the
warm-up and after the last measured step of the real training.

The program (``Run.program``, :mod:`.torch.program`): an eager step's FLOPs and what the
same counted call dispatched (:mod:`.torch.ops`: aten ops by dtype, the bytes they move,
host syncs); a compiled step's FLOPs and what dynamo made of it (graphs and graph breaks
of the compile step, frames compiled after it). A compiled case compiles cold
(:func:`.torch.program.cold_compile`: dynamo reset, inductor's caches empty), so its
compile time does not depend on the cases that ran before it in the process;
``Run.compile_time_covers`` says what was timed.

Where the case's time went (``Run.phases``, wall seconds, :class:`.common.Phases`):
``build`` (making the step: the user's model and optimizer; a process's first
``torch.optim`` optimizer imports ``torch._dynamo``, about a second), ``memory`` (the CPU
count), ``flops``, ``probe`` (making the drift probe), ``train`` (warm-up and measured
steps with the drift probe after each), ``fingerprint``, and ``total``. The LR schedulers
and scalers the counting steps put back are found once per training
(:func:`~.torch.step.live_stateful`, a scan of the process's objects) and shared by the
memory and FLOP counts (or named by the step, ``TorchStep.stateful``: no scan).
"""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch

from pytest_accelperf.backends.measure.common import (
    Phases,
    TaskError,
    fingerprint,
    settled,
    with_state,
)
from pytest_accelperf.backends.measure.data import expect, source_label
from pytest_accelperf.backends.measure.loop import LoopResult, run_steps
from pytest_accelperf.backends.measure.probe import Probe
from pytest_accelperf.backends.measure.recording import RunBuilder, deadline_after
from pytest_accelperf.backends.protocol import Fit, Task, TrainResult
from pytest_accelperf.backends.torch.flops import count_step
from pytest_accelperf.backends.torch.memory import (
    GROWTH_STEPS,
    MEMORY_STEPS,
    _CudaGrowth,
    _oom_message,
    _oom_record,
    cpu_memory,
    cpu_memory_growth,
    cpu_peak_memory,
    fresh_peak,
)
from pytest_accelperf.backends.torch.on_device import _device, _step_fns
from pytest_accelperf.backends.torch.step import (
    TorchStep,
    as_torch_step,
    float_metrics,
    rewind,
    scaler_readings,
    state_beside,
    step_stateful,
)
from pytest_accelperf.backends.torch.step_record import (
    COMPILE_TIME_COVERS,
    DynamoWatch,
    cold_compile,
    eager_program,
)
from pytest_accelperf.backends.torch.stepper import TorchStepper
from pytest_accelperf.backends.torch.task import to_device, torch_probe
from pytest_accelperf.backends.types import Batch
from pytest_accelperf.collect.cases import Case
from pytest_accelperf.errors import ConfigError
from pytest_accelperf.provision.accel import Accelerator
from pytest_accelperf.stats.contention import Contention, Load, measuring_root


def _label(device: torch.device) -> str:
    return f"{device.type}:{device.index or 0}"


#: The in-process torch backend's drift probe: 128 x 128 products. After each measured
#: step the probe's working set displaces the step's from the caches; with 256 x 256
#: products the next 3 ms step of the suite's GPT was 2.5-3.7 % slower than in a hand loop
#: (benchmarks/gate.py overhead --backend torch), with 128 x 128 0.8-1.5 %.
PROBE_N = 128


def _warmup(step: TorchStep, case: Case) -> int:
    """Warm-up steps: with ``compile`` at least one, step 0, which compiles."""
    return max(case.warmup, 1) if step.compile else case.warmup


def _execute(step: TorchStep, case: Case, device: torch.device, probe: Probe | None = None,
             deadline: float | None = None,
             after_step: Callable[[int, Any, bool], None] | None = None,
             watch: DynamoWatch | None = None) -> LoopResult:
    """Warm-up and measured steps in the measured-step loop (:func:`.loop.run_steps`).
    With ``compile``, step 0 compiles: always a warm-up step, its wall time (tracing and
    compiling forward and backward, plus one execution) the compile time; ``watch`` is
    shown each batch as it is made (outside the timer), to say which input changed at a
    step that compiled again."""
    fns = _step_fns(step, device)
    if watch is not None:
        def prepare(i: int) -> Batch:
            batch = to_device(step.make_batch(i), device)
            watch.batch(i, batch)
            return batch

        def put(i: int, host: Batch) -> Batch:
            batch = to_device(host, device)
            watch.batch(i, batch)
            return batch

        fns = replace(fns, prepare=prepare, put=put)
    trained = run_steps(fns, warmup=_warmup(step, case),
                        steps=case.steps, probe=probe, deadline=deadline,
                        after_step=after_step)
    _same_metrics(step, trained)
    return trained


class _CompileLoad:
    """What other processes used of the machine while a compiled step's step 0 compiled
    (``Run.compile_load``, as JAX's compile records it): one compile is one
    sample, and a job beside it stretches it (the compile check leaves such a change
    ``inconclusive``). Started right before the loop, read at the end of step 0
    (``run_steps``' ``after_step``); inductor's compile workers are the session's own."""

    def __init__(self) -> None:
        self._watch = Contention([measuring_root()]).start()
        self.load: Load | None = None

    def after_step(self, i: int, handle: object = None, measured: bool = False) -> None:
        if i == 0:  # the loop runs step 0 once
            self.load = self._watch.reading()


def _hooks(*hooks: Callable[[int, Any, bool], None] | None
           ) -> Callable[[int, Any, bool], None]:
    """One ``after_step`` that calls each of ``hooks`` given."""
    given = [h for h in hooks if h is not None]

    def after_step(i: int, handle: object, measured: bool) -> None:
        for hook in given:
            hook(i, handle, measured)

    return after_step


def _same_metrics(step: TorchStep, out: LoopResult) -> None:
    """Every metric on every step: one the step returned only sometimes is an error."""
    uneven = sorted(k for k, v in out.metrics.items() if len(v) != len(out.losses))
    if uneven:
        raise TaskError(f"{step.label} returned metric(s) {', '.join(map(repr, uneven))} on "
                        f"some steps only: return the same metrics on every step")


class TorchBackend:
    """Trains a :class:`TorchStep` (or a :class:`TorchTask`) in this process on the CPU or
    one CUDA device."""

    name = "torch"

    def unavailable_reason(self) -> str | None:
        if importlib.util.find_spec("torch") is None:
            return ("pip install torch==2.13.0 (CPU) or a CUDA build, then "
                    "pip install 'pytest-accelperf[torch]'")
        return None

    def fits(self, case: Case, task: Task, accel: Accelerator, *,
             timeout: float | None = None) -> Fit:
        """CPU: the counted peak of two eager steps against ``case.memory_capacity``.
        CUDA: two real steps, caught out-of-memory or an allocator peak over capacity.
        A ``world_size > 1`` case is DDP's (:mod:`.ddp`), not this backend's."""
        _one_process(case)
        device = _device(accel)
        capacity = case.memory_capacity
        if device.type == "cpu":
            if not capacity:
                raise ConfigError(f"{case.id}: the CPU has no memory counter to search a maximum "
                                 f"batch against; declare memory_capacity on the case")
            step = as_torch_step(task, device)
            step.to(device)
            peak, source = cpu_peak_memory(step, device)
            return Fit(peak <= capacity, peak, int(capacity), f"{source} peak")
        fresh_peak(device)
        total = int(torch.cuda.get_device_properties(device).total_memory)
        limit = int(capacity) if capacity else total
        try:
            step = as_torch_step(task, device)
            step.to(device)
            for i in range(MEMORY_STEPS):
                float_metrics(step, step.step(to_device(step.make_batch(i), device)))
        except torch.OutOfMemoryError as exc:
            return Fit(False, None, limit, f"out of memory: {str(exc).splitlines()[0]}")
        finally:
            step = None  # type: ignore[assignment]  # freed before empty_cache
            torch.cuda.empty_cache()
        peak = int(torch.cuda.max_memory_allocated(device))
        return Fit(peak <= limit, peak, limit, "cuda allocator peak")

    def settle(self, accel: Accelerator, within: float) -> bool:
        """After a case was interrupted mid-step: whether the device is idle within
        ``within`` seconds (CPU ops finish before Python gets control back; a CUDA kernel
        that was queued goes on running after an interrupt)."""
        device = _device(accel)
        if device.type != "cuda":
            return True
        return settled(torch.cuda.current_stream(device).query, within)

    def stepper(self, case: Case, task: Task, accel: Accelerator) -> TorchStepper:
        """The case's step, trained in blocks of steps (A/B comparison)."""
        return TorchStepper(case, task, accel)

    def train(self, case: Case, task: Task, accel: Accelerator, *,
              timeout: float | None = None) -> TrainResult:
        _one_process(case)
        if case.reference:
            raise ConfigError(
                "reference runs are implemented for the jax backend; the torch backend "
                f"trains on one device only, so {case.id} has nothing to compare against: "
                "drop reference=True")
        if case.n_devices != 1:
            raise ConfigError(f"the torch backend trains on one device; {case.id} asks for a "
                             f"mesh of {case.mesh}")
        deadline = deadline_after(timeout)  # memory counting and compiling count too
        phases = Phases()
        device = _device(accel)
        label = _label(device)
        fresh_peak(device)  # the cases before this one freed: not in its peak
        with phases("build"):  # the user's model and optimizer (TorchTask.to_step)
            step = as_torch_step(task, device)
            step.to(device)
        # Data given as an iterable: the counting steps and the run each take a pass.
        expect(step.make_batch, max(_warmup(step, case) + case.steps,
                                    MEMORY_STEPS + GROWTH_STEPS))
        rewind(step)  # trained before (a re-measurement): start where that training started
        # The schedulers and scalers the counting steps put back: found once, for both.
        stateful = step_stateful(step)
        scalers = scaler_readings(stateful)  # which scalers the training moves
        draft = RunBuilder.for_case(case, accel.peak_flops, n_devices=1,
                                    tokens_per_sample=step.tokens_per_sample)
        capacity = case.memory_capacity
        if device.type == "cpu":
            with phases("memory"):
                memory = cpu_memory(step, device, MEMORY_STEPS + GROWTH_STEPS, stateful)
            draft.memory({label: memory.peak}, memory.source)
            draft.memory_growth(cpu_memory_growth(memory))
            if capacity and memory.peak > capacity:
                oom = _oom_record(memory.peak, int(capacity), memory.source)
                draft.failed("oom", _oom_message(oom), oom=oom)
                draft.phases(phases.record())
                return TrainResult(run=draft.build())  # never trained

        watch: DynamoWatch | None = None
        compile_load: _CompileLoad | None = None
        cuda_growth: _CudaGrowth | None = None
        try:
            with phases("flops"):
                counted = count_step(step, to_device(step.make_batch(0), device), device,
                                     stateful)
                draft.counted(flops=counted.flops)
            if device.type == "cuda":  # the peak of training, not of the counting step
                fresh_peak(device)
                cuda_growth = _CudaGrowth(device, _warmup(step, case))
            torch.manual_seed(step.seed)  # training draws the same numbers with or without
            with phases("probe"):
                probe = torch_probe(device, n=PROBE_N)
            with (phases("train"),
                  cold_compile(device) if step.compile else contextlib.nullcontext()):
                watch = DynamoWatch(source_label(step.make_batch)) if step.compile else None
                compile_load = _CompileLoad() if step.compile else None
                trained = _execute(step, case, device, probe, deadline, after_step=_hooks(
                    watch.after_step if watch else None,
                    compile_load.after_step if compile_load else None,
                    cuda_growth.after_step if cuda_growth else None), watch=watch)
        except torch.OutOfMemoryError as exc:
            draft.failed("oom", f"out of memory: {str(exc).splitlines()[0]}")
            if device.type == "cuda":
                draft.memory({label: int(torch.cuda.max_memory_allocated(device))},
                             "cuda_allocator")
            draft.phases(phases.record())
            return TrainResult(run=draft.build())
        if device.type == "cuda":
            peak = int(torch.cuda.max_memory_allocated(device))
            draft.memory({label: peak}, "cuda_allocator")
            if capacity and peak > capacity:
                oom = _oom_record(peak, int(capacity), "cuda_allocator")
                draft.failed("oom", _oom_message(oom), oom=oom)

        if watch is not None:
            draft.compiled(trained.warmup_times[0], covers=COMPILE_TIME_COVERS,
                           load=compile_load.load if compile_load is not None else None)
            draft.counted(program=watch.record(counted.flops))
            if watch.recompiles:
                draft.detail(recompile_reasons=watch.recompile_reasons)
        else:
            draft.counted(program=eager_program(counted.flops, counted.ops))
        if cuda_growth is not None:
            draft.memory_growth(cuda_growth.record())
        draft.loop(trained, probe)
        with phases("fingerprint"):  # the parameters and the state beside them
            own = step.params_of()
            params, state_names = with_state(own, state_beside(step, own, stateful, scalers))
            draft.fingerprint(fingerprint(params, state_names))
        draft.end(trained, timeout, case)  # a loss not finite, or the deadline
        draft.phases(phases.record())
        return TrainResult(run=draft.build(), params=params, state=step.final_of())


def _one_process(case: Case) -> None:
    """Refuse a case this backend does not train itself: ``world_size > 1`` is DDP's."""
    if case.world_size > 1:
        raise ConfigError(
            f"{case.id}: world_size={case.world_size} trains with DDP in launched ranks, "
            f"not in this process: train it through accelperf.train (the plugin routes it "
            f"to the torch backend's ranks), or call "
            f"pytest_accelperf.torch.train_ddp(case, task, accel)")




BACKEND = TorchBackend()
