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
training (``cuda_allocator``). On CPU, where there is no allocator counter (and RSS is
neither per-case nor deterministic), the peak is counted over two eager steps run before
the measured run and undone afterwards (:func:`~.torch.step.undone`): by ``MemTracker`` (a
dispatch mode that sums the storage bytes of live tensors: parameters, gradients,
optimizer state and activations, the same bytes every run), or, where MemTracker cannot
follow the step (it raises on a module called twice in one step, as gradient accumulation
does), by the profiler's allocations. The method that counted is the run's
``memory_source`` and is shown beside the memory check; the memory check refuses to
compare numbers counted by different methods. A CPU case whose peak exceeds its declared
``memory_capacity`` is recorded as ``oom`` before it trains.

FLOPs per step come from ``FlopCounterMode`` (and the program's op counts from a dispatch
mode beside it, :mod:`.torch.ops`) over one untimed call of the step on step 0's
batch (``TorchStep.count_step`` where given), undone afterwards like the memory count:
the optimizer, scheduler and scaler are not advanced by it.

Memory growth (``Run.memory_growth``, a leak): on CPU the same counting runs
:data:`GROWTH_STEPS` more steps after the :data:`MEMORY_STEPS` and reads the live bytes
after each (MemTracker's live tensors, or the profiler's allocations net of frees): their
growth over those steps, per step. On CUDA ``torch.cuda.memory_allocated`` after the
warm-up and after the last measured step of the real training.

The program (``Run.program``, :mod:`.torch.program`): an eager step's FLOPs and what the
same counted call dispatched (:mod:`.torch.ops`: aten ops by dtype, the bytes they move,
host syncs); a compiled step's FLOPs and what dynamo made of it (graphs and graph breaks
of the compile step, frames compiled after it). A compiled case compiles cold
(:func:`.torch.program.cold_compile`: dynamo reset, inductor's caches empty), so its
compile time does not depend on the cases that ran before it in the process;
``Run.extra["compile_time_covers"]`` says what was timed.

Where the case's time went (``Run.extra["phases"]``, wall seconds, :class:`.common.Phases`):
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
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from pytest_accelperf.backends.measure.common import (
    Phases,
    TaskError,
    fingerprint,
    with_state,
)
from pytest_accelperf.backends.measure.data import expect, source_label
from pytest_accelperf.backends.measure.loop import (
    LoopResult,
    StepFns,
    run_steps,
    time_block,
)
from pytest_accelperf.backends.measure.probe import Probe
from pytest_accelperf.backends.protocol import Fit, TrainResult
from pytest_accelperf.backends.torch.memory import device_total, memory_tracker, reset_cuda_peak
from pytest_accelperf.backends.torch.ops import OpCounter
from pytest_accelperf.backends.torch.step import (
    TorchStep,
    as_torch_step,
    metrics_of,
    rewind,
    run_step,
    scaler_readings,
    state_beside,
    step_stateful,
    to_float,
    undone,
)
from pytest_accelperf.backends.torch.step_record import (
    COMPILE_TIME_COVERS,
    DynamoWatch,
    cold_compile,
    eager_program,
)
from pytest_accelperf.backends.torch.task import (
    TorchTask,
    as_tensors,
    flop_counter,
    sync,
    to_device,
    torch_probe,
)
from pytest_accelperf.collect.cases import Case
from pytest_accelperf.errors import ConfigError
from pytest_accelperf.provision.accel import Accelerator
from pytest_accelperf.records.run import MemoryGrowth, OomRecord, Run
from pytest_accelperf.stats.contention import Contention, Load, measuring_root

GIB = 2**30
#: Eager training steps (undone afterwards) that CPU memory is counted over: the first
#: creates the optimizer state, the second is the steady state with it.
MEMORY_STEPS = 2
#: Counted steps after :data:`MEMORY_STEPS` over which a CPU case's live memory growth (a
#: leak) is read: the live bytes after them less those after the memory steps.
GROWTH_STEPS = 2


def _device(accel: Accelerator) -> torch.device:
    if accel.name == "cpu":
        return torch.device("cpu")
    if accel.name == "gpu":
        if not torch.cuda.is_available():
            raise RuntimeError(
                "--accel=gpu but torch sees no CUDA device (torch.cuda.is_available() is "
                f"False; torch {torch.__version__}): install a CUDA build of torch")
        return torch.device("cuda", 0)
    raise ConfigError(f"the torch backend runs on cpu or gpu, not {accel.name!r}: "
                     f"declare the case with accels=('cpu', 'gpu')")


def _label(device: torch.device) -> str:
    return f"{device.type}:{device.index or 0}"


def deadline_after(timeout: float | None) -> float | None:
    """The ``time.monotonic()`` at which a run of ``timeout`` seconds must stop."""
    return time.monotonic() + timeout if timeout else None


def _build(task: TorchTask, device: torch.device) -> torch.nn.Module:
    torch.manual_seed(task.seed)
    return task.make_model().to(device)


def _step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, task: TorchTask,
          batch: Any) -> torch.Tensor:
    """One training step; returns the loss tensor (not synchronized)."""
    optimizer.zero_grad(set_to_none=True)
    loss = task.loss_fn(model, batch)
    loss.backward()  # type: ignore[no-untyped-call]  # untyped in torch
    if task.grad_clip is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), task.grad_clip)
    optimizer.step()
    return loss


def count_flops(model: torch.nn.Module, task: TorchTask, batch: Any) -> float | None:
    """FLOPs of one forward + backward of ``batch`` (the optimizer's are not counted).

    Leaves ``model`` as it found it: gradients dropped, buffers (batch-norm statistics)
    restored, and the global RNG state restored (dropout draws nothing from training's).
    """
    buffers = {name: b.detach().clone() for name, b in model.named_buffers()}
    rng = torch.random.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    counter = flop_counter()
    try:
        with counter:
            task.loss_fn(model, batch).backward()  # type: ignore[no-untyped-call]
    finally:
        model.zero_grad(set_to_none=True)
        with torch.no_grad():
            for name, b in model.named_buffers():
                b.copy_(buffers[name])
        torch.random.set_rng_state(rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state_all(cuda_rng)
    flops = float(counter.get_total_flops())
    return flops if flops > 0 else None


@dataclass(frozen=True)
class StepCount:
    """What one counted call of the step did: its ``flops`` (None when none were counted)
    and ``ops``, what it dispatched (:meth:`.torch.ops.OpCounter.record`)."""

    flops: float | None
    ops: dict[str, Any]


def count_step(step: TorchStep, batch: Any, device: torch.device,
               stateful: Sequence[Any] | None = None) -> StepCount:
    """FLOPs and dispatched ops of one call of the step (``count_step``, default
    ``step``) on ``batch`` (on ``device``), undone afterwards
    (:func:`~.torch.step.undone`, ``stateful`` as there): parameters, optimizer,
    scheduler, scaler and RNG as before, so the measured run is the same with or without
    it. ``FlopCounterMode`` counts matrix products and convolutions (forward and
    backward): the optimizer's elementwise update adds none. The :class:`OpCounter`
    beside it counts every op of the same call, the optimizer's included (entered first,
    it sees the ops FlopCounterMode decomposes into)."""
    ops, counter = OpCounter(device), flop_counter()
    with undone(step, stateful), ops, counter:
        metrics_of(step, run_step(step, batch, counting=True))
    flops = float(counter.get_total_flops())
    return StepCount(flops if flops > 0 else None, ops.record())


def count_step_flops(step: TorchStep, batch: Any,
                     stateful: Sequence[Any] | None = None) -> float | None:
    """FLOPs of one counted call of the step on ``batch`` (:func:`count_step`; the device
    only decides which ops are host syncs, which this drops)."""
    return count_step(step, batch, torch.device("cpu"), stateful).flops


@dataclass(frozen=True)
class CpuMemory:
    """What counted CPU steps held: ``peak`` bytes over the first :data:`MEMORY_STEPS`,
    ``live`` bytes after each counted step, and the ``source`` that counted them
    (``mem_tracker`` or ``profiler``)."""

    peak: int
    source: str
    live: list[int]


def _mem_tracker_count(step: TorchStep, device: torch.device, steps: int, peak_after: int,
                       stateful: Sequence[Any] | None = None) -> tuple[int, list[int]]:
    """MemTracker over ``steps`` counted steps: the peak over the first ``peak_after`` and
    the bytes of live tensors after each."""
    tracker = memory_tracker()
    tracker.track_external(*step.modules().values())
    live: list[int] = []
    peak = 0
    with undone(step, stateful), tracker:
        for i in range(steps):
            _value(step, run_step(step, to_device(step.make_batch(i), device), counting=True))
            tracker.reset_mod_stats()  # per-module stats refuse a second call otherwise
            live.append(_seen(device_total(tracker, "current", device), device))
            if i + 1 == min(peak_after, steps):
                peak = _seen(device_total(tracker, "peak", device), device)
    return peak, live


def _seen(total: int | None, device: torch.device) -> int:
    if total is None:
        raise RuntimeError(f"MemTracker saw no tensor on {device}")
    return total


#: The profiler event that marks the end of a counted step (:func:`_profiler_count`).
_STEP_END = "accelperf::counted_step_end"


def _profiler_count(step: TorchStep, device: torch.device, steps: int, peak_after: int,
                    stateful: Sequence[Any] | None = None) -> tuple[int, list[int]]:
    """Where MemTracker fails (a module called twice in one step, as gradient accumulation
    does): the peak of the profiler's allocations net of frees over the first
    ``peak_after`` steps, plus the tensors that existed before it started (the models'
    parameters and buffers, and the optimizer state the first counted step leaves: counted
    by its second); and the same count of live bytes at the end of each step."""
    from torch.profiler import ProfilerActivity, profile, record_function

    held = sum({id(t): t.numel() * t.element_size() for module in step.modules().values()
                for t in [*module.parameters(), *module.buffers()]}.values())
    with (undone(step, stateful),
          profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof):
        for i in range(steps):
            _value(step, run_step(step, to_device(step.make_batch(i), device), counting=True))
            with record_function(_STEP_END):  # allocates nothing: a mark in time
                pass
    # Each op's *self* allocations minus frees (children excluded, so each byte counts
    # once), summed in start order: the live bytes over time at op granularity.
    events = sorted(prof.events(), key=lambda e: e.time_range.start)
    current = peak = 0
    live: list[int] = []
    for event in events:
        if event.name == _STEP_END:
            live.append(held + current)
            continue
        current += int(event.self_cpu_memory_usage)
        if len(live) < peak_after:
            peak = max(peak, current)
    if peak <= 0:
        raise RuntimeError("the profiler recorded no allocation")
    return held + peak, live  # held: allocated before the profiler started


def cpu_memory(step: TorchStep, device: torch.device, steps: int = MEMORY_STEPS,
               stateful: Sequence[Any] | None = None) -> CpuMemory:
    """``steps`` eager steps counted (undone afterwards, ``stateful`` as in
    :func:`~.torch.step.undone`): the peak over the first :data:`MEMORY_STEPS`, the live
    bytes after each step, and the method that counted them: ``mem_tracker``, or
    ``profiler`` where MemTracker cannot follow the step (it raises on a module called
    twice in one step: gradient accumulation)."""
    try:
        peak, live = _mem_tracker_count(step, device, steps, MEMORY_STEPS, stateful)
        return CpuMemory(peak, "mem_tracker", live)
    except TaskError:
        raise
    except (ImportError, AttributeError, RuntimeError, TypeError, NotImplementedError):
        peak, live = _profiler_count(step, device, steps, MEMORY_STEPS, stateful)
        return CpuMemory(peak, "profiler", live)


def cpu_peak_memory(step: TorchStep, device: torch.device) -> tuple[int, str]:
    """Peak bytes of :data:`MEMORY_STEPS` eager steps (undone afterwards), and the method
    that counted them (:func:`cpu_memory`)."""
    memory = cpu_memory(step, device)
    return memory.peak, memory.source


def growth_record(after_warmup: int, after_steps: int, steps: int,
                  source: str) -> MemoryGrowth:
    """A ``Run.memory_growth`` record: live bytes after the warm-up and after ``steps``
    more steps, and their growth per step."""
    return {"bytes_per_step": (after_steps - after_warmup) / steps if steps else 0.0,
            "steps": steps, "after_warmup": int(after_warmup),
            "after_steps": int(after_steps), "source": source}


def cpu_memory_growth(memory: CpuMemory) -> MemoryGrowth | None:
    """Live memory's growth over the counted steps after the first :data:`MEMORY_STEPS`
    (which create the optimizer state): a leak's bytes per step. None when no step was
    counted after them."""
    steps = len(memory.live) - MEMORY_STEPS
    if steps <= 0:
        return None
    return growth_record(memory.live[MEMORY_STEPS - 1], memory.live[-1], steps,
                         memory.source)


def _value(step: TorchStep, out: Any) -> dict[str, float]:
    """The step's output as float metrics (waits for them)."""
    return {k: to_float(v) for k, v in metrics_of(step, out).items()}


#: The in-process torch backend's drift probe: 128 x 128 products. After each measured
#: step the probe's working set displaces the step's from the caches; with 256 x 256
#: products the next 3 ms step of the suite's GPT was 2.5-3.7 % slower than in a hand loop
#: (benchmarks/gate.py overhead --backend torch), with 128 x 128 0.8-1.5 %.
PROBE_N = 128


def _step_fns(step: TorchStep, device: torch.device) -> StepFns[Any, Any]:
    """The user's step as the measured-step loop runs it (:mod:`.loop`): the batch moved
    outside the timer, the device synchronized, the metrics read after the timer (on the
    CPU the step is already done)."""

    def read(raw: Any) -> tuple[float, dict[str, float]]:
        values = _value(step, raw)
        return values.pop(step.loss), values

    return StepFns(prepare=lambda i: to_device(step.make_batch(i), device),
                   run=lambda i, batch: step.step(batch), read=read,
                   sync=lambda: sync(device),
                   # The user's data work and the conversion (the step's input time), then
                   # the move, apart (:mod:`.loop`).
                   host=lambda i: as_tensors(step.make_batch(i)),
                   put=lambda i, host: to_device(host, device))


class TorchStepper:
    """A case's step on its device, trained on demand in blocks of steps (the A/B
    comparison of :mod:`pytest_accelperf.ab`), timed as in a run
    (:func:`.loop.time_block`). ``program`` is an eager step's program record, counted
    as a run counts it (one call of the step on step 0's batch, undone) before the first
    block; None for a compiled step (its record needs dynamo's accounting over a run)."""

    def __init__(self, case: Case, task: Any, accel: Accelerator) -> None:
        if case.world_size > 1 or case.n_devices != 1:
            raise ConfigError(f"{case.id}: A/B comparison runs single-process torch cases "
                             f"only")
        device = _device(accel)
        self._step_fn = as_torch_step(task, device)
        self._step_fn.to(device)
        expect(self._step_fn.make_batch, case.warmup + case.steps)
        rewind(self._step_fn)
        self.program: dict[str, Any] | None = None
        if not self._step_fn.compile:
            counted = count_step(self._step_fn, to_device(self._step_fn.make_batch(0), device),
                                 device, step_stateful(self._step_fn))
            self.program = eager_program(counted.flops, counted.ops)
        self._fns = _step_fns(self._step_fn, device)
        self._cycle = max(1, case.warmup + case.steps)
        self._step = 0
        torch.manual_seed(self._step_fn.seed)
        if self._step_fn.compile:
            self.run(1)  # compiles

    def run(self, n: int) -> list[float]:
        """Train ``n`` more steps; their step times in seconds."""
        times, last = time_block(self._fns, self._step, n, self._cycle)
        _value(self._step_fn, last)  # the last step's outputs, as a run reads them
        self._step += n
        return times


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
        def prepare(i: int) -> Any:
            batch = to_device(step.make_batch(i), device)
            watch.batch(i, batch)
            return batch

        def put(i: int, host: Any) -> Any:
            batch = to_device(host, device)
            watch.batch(i, batch)
            return batch

        fns = replace(fns, prepare=prepare, put=put)
    trained = run_steps(fns, warmup=_warmup(step, case),
                        steps=case.steps, probe=probe, deadline=deadline,
                        after_step=after_step)
    _same_metrics(step, trained)
    return trained


class _CudaGrowth:
    """``torch.cuda.memory_allocated`` after the warm-up and after the last measured step
    (the loop's ``after_step``): a CUDA case's live memory growth."""

    def __init__(self, device: torch.device, warmup: int) -> None:
        self.device, self.warmup = device, warmup
        self.after_warmup = int(torch.cuda.memory_allocated(device)) if warmup == 0 else None
        self.after_steps: int | None = None
        self.steps = 0

    def after_step(self, i: int, handle: Any, measured: bool) -> None:
        if i == self.warmup - 1:
            self.after_warmup = int(torch.cuda.memory_allocated(self.device))
        elif measured:
            self.after_steps = int(torch.cuda.memory_allocated(self.device))
            self.steps += 1

    def record(self) -> MemoryGrowth | None:
        if self.after_warmup is None or self.after_steps is None:
            return None
        return growth_record(self.after_warmup, self.after_steps, self.steps,
                             "cuda_allocator")


class _CompileLoad:
    """What other processes used of the machine while a compiled step's step 0 compiled
    (``Run.extra["compile_load"]``, as JAX's compile records it): one compile is one
    sample, and a job beside it stretches it (the compile check leaves such a change
    ``inconclusive``). Started right before the loop, read at the end of step 0
    (``run_steps``' ``after_step``); inductor's compile workers are the session's own."""

    def __init__(self) -> None:
        self._watch = Contention([measuring_root()]).start()
        self.load: Load | None = None

    def after_step(self, i: int, handle: Any = None, measured: bool = False) -> None:
        if i == 0:  # the loop runs step 0 once
            self.load = self._watch.reading()


def _hooks(*hooks: Callable[[int, Any, bool], None] | None
           ) -> Callable[[int, Any, bool], None]:
    """One ``after_step`` that calls each of ``hooks`` given."""
    given = [h for h in hooks if h is not None]

    def after_step(i: int, handle: Any, measured: bool) -> None:
        for hook in given:
            hook(i, handle, measured)

    return after_step


def _same_metrics(step: TorchStep, out: LoopResult) -> None:
    """Every metric on every step: one the step returned only sometimes is an error."""
    uneven = sorted(k for k, v in out.metrics.items() if len(v) != len(out.losses))
    if uneven:
        raise TaskError(f"{step.label} returned metric(s) {', '.join(map(repr, uneven))} on "
                        f"some steps only: return the same metrics on every step")


def _oom_record(required: int, capacity: int, source: str) -> OomRecord:
    return {"required_bytes": required, "capacity_bytes": capacity,
            "exceeded_by_bytes": required - capacity, "source": source}


def _oom_message(oom: OomRecord) -> str:
    return (f"out of memory: a training step needs {oom['required_bytes'] / GIB:.2f} GiB "
            f"({oom['source']}) of {oom['capacity_bytes'] / GIB:.2f} GiB capacity "
            f"(exceeded by {oom['exceeded_by_bytes'] / GIB:.2f} GiB)")


@dataclass
class TorchTrainResult(TrainResult):
    """A :class:`TrainResult` with what the test gets back as ``CaseResult.state``
    (``TorchStep.final``, default: the trained model). The state stays in the process that
    trained it: pickling drops it."""

    state: Any = None

    def __getstate__(self) -> dict[str, Any]:
        data = dict(self.__dict__)
        data["state"] = None
        return data


class TorchBackend:
    """Trains a :class:`TorchStep` (or a :class:`TorchTask`) in this process on the CPU or
    one CUDA device."""

    name = "torch"

    def unavailable_reason(self) -> str | None:
        if importlib.util.find_spec("torch") is None:
            return ("pip install torch==2.13.0 (CPU) or a CUDA build, then "
                    "pip install 'pytest-accelperf[torch]'")
        return None

    def fits(self, case: Case, task: Any, accel: Accelerator, *,
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
        reset_cuda_peak(device)
        total = int(torch.cuda.get_device_properties(device).total_memory)
        limit = int(capacity) if capacity else total
        try:
            step = as_torch_step(task, device)
            step.to(device)
            for i in range(MEMORY_STEPS):
                _value(step, step.step(to_device(step.make_batch(i), device)))
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
        deadline = time.monotonic() + within
        while not torch.cuda.current_stream(device).query():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True

    def stepper(self, case: Case, task: Any, accel: Accelerator) -> TorchStepper:
        """The case's step, trained in blocks of steps (A/B comparison)."""
        return TorchStepper(case, task, accel)

    def train(self, case: Case, task: Any, accel: Accelerator, *,
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
        if device.type == "cuda":
            reset_cuda_peak(device)
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
        run = Run(case_id=case.id, samples_per_step=case.batch,
                  tokens_per_step=(case.batch * step.tokens_per_sample
                                   if step.tokens_per_sample else None),
                  n_devices=1, peak_flops_per_device=accel.peak_flops)
        capacity = case.memory_capacity
        if device.type == "cpu":
            with phases("memory"):
                memory = cpu_memory(step, device, MEMORY_STEPS + GROWTH_STEPS, stateful)
            run.memory_per_device, run.memory_source = {label: memory.peak}, memory.source
            run.memory_growth = cpu_memory_growth(memory)
            if capacity and memory.peak > capacity:
                run.oom = _oom_record(memory.peak, int(capacity), memory.source)
                run.outcome, run.message = "oom", _oom_message(run.oom)
                run.phases = phases.record()
                return TorchTrainResult(run=run)  # never trained

        watch: DynamoWatch | None = None
        compile_load: _CompileLoad | None = None
        cuda_growth: _CudaGrowth | None = None
        try:
            with phases("flops"):
                counted = count_step(step, to_device(step.make_batch(0), device), device,
                                     stateful)
                run.flops_per_step = counted.flops
            if device.type == "cuda":  # the peak of training, not of the counting step
                torch.cuda.reset_peak_memory_stats(device)
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
            run.outcome = "oom"
            run.message = f"out of memory: {str(exc).splitlines()[0]}"
            if device.type == "cuda":
                run.memory_per_device = {label: int(torch.cuda.max_memory_allocated(device))}
                run.memory_source = "cuda_allocator"
            run.phases = phases.record()
            return TorchTrainResult(run=run)
        if device.type == "cuda":
            peak = int(torch.cuda.max_memory_allocated(device))
            run.memory_per_device, run.memory_source = {label: peak}, "cuda_allocator"
            if capacity and peak > capacity:
                run.oom = _oom_record(peak, int(capacity), "cuda_allocator")
                run.outcome, run.message = "oom", _oom_message(run.oom)

        run.compile_time = trained.warmup_times[0] if step.compile else None
        if watch is not None:
            run.program = watch.record(run.flops_per_step)
            run.compile_time_covers = COMPILE_TIME_COVERS
            if compile_load is not None and compile_load.load is not None:
                run.compile_load = compile_load.load
            if watch.recompiles:
                run.extra["recompile_reasons"] = watch.recompile_reasons
        else:
            run.program = eager_program(run.flops_per_step, counted.ops)
        if cuda_growth is not None:
            run.memory_growth = cuda_growth.record()
        run.losses = trained.losses
        run.loss_steps = list(range(len(trained.losses)))
        run.metrics = trained.metrics
        run.step_times = trained.step_times
        run.probe_times, run.probe_kind = trained.probe_times, probe.kind
        run.input_times, run.input_wall_times = trained.input_times, trained.input_wall_times
        run.input_blocked_times = trained.input_blocked_times
        run.step_load, run.batch_time = trained.load, trained.batch_time
        with phases("fingerprint"):  # the parameters and the state beside them
            own = step.params_of()
            params, state_names = with_state(own, state_beside(step, own, stateful, scalers))
            run.params_fingerprint = fingerprint(params, state_names)
        if trained.nan_step is not None and run.outcome == "ok":
            run.outcome = "nan"
            run.nan_step = trained.nan_step
            run.message = f"loss is {trained.losses[-1]} at step {trained.nan_step}"
        if trained.timed_out and run.outcome == "ok":
            run.outcome = "timeout"
            run.message = timeout_message(timeout, len(trained.losses), case)
        run.phases = phases.record()
        return TorchTrainResult(run=run, params=params, state=step.final_of())


def _one_process(case: Case) -> None:
    """Refuse a case this backend does not train itself: ``world_size > 1`` is DDP's."""
    if case.world_size > 1:
        raise ConfigError(
            f"{case.id}: world_size={case.world_size} trains with DDP in launched ranks, "
            f"not in this process: train it through accelperf.train (the plugin routes it "
            f"to the torch backend's ranks), or call "
            f"pytest_accelperf.torch.train_ddp(case, task, accel)")


def timeout_message(timeout: float | None, done: int, case: Case) -> str:
    """What a run that hit ``--accelperf-timeout`` reports."""
    return (f"exceeded the {timeout:g} s timeout after {done} of {case.warmup + case.steps} "
            f"steps (raise --accelperf-timeout, or give the case fewer steps)")


BACKEND = TorchBackend()
