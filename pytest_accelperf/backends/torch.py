"""The PyTorch backend: one process, one device (CPU or one CUDA GPU), eager or compiled.

(A case with ``world_size > 1`` trains with DistributedDataParallel in that many processes
instead, :mod:`pytest_accelperf.backends.ddp`: this backend's spec names it as its ranks,
and the plugin, not this module, makes that choice (:mod:`pytest_accelperf.routing`).)

It follows the JAX backend's rules: compile time is kept apart from step times, every
measured step is synchronized, the loss of every step is recorded, a NaN/inf ends the run
as the outcome ``nan``, and running out of memory is an outcome, not a crash.

Memory: on CUDA the caching allocator's peak (``max_memory_allocated``) over the real
training. On CPU, where there is no allocator counter (and RSS is neither per-case nor
deterministic), the peak is counted by ``MemTracker`` (a dispatch mode that sums the
storage bytes of live tensors) over two eager training steps of a *fresh* copy of the model
built before the measured run: parameters, gradients, optimizer state and activations, the
same bytes every run. A CPU case whose peak exceeds its declared ``memory_capacity`` is
recorded as ``oom`` before the measured model is built, as the JAX backend predicts it.

FLOPs per step come from ``FlopCounterMode`` over one untimed forward and backward of step
0's batch on the measured model, before its optimizer exists; the gradients are dropped and
the buffers and the RNG restored afterwards, so training is unchanged by it.
"""

from __future__ import annotations

import importlib.util
import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from pytest_accelperf.accel import Accelerator
from pytest_accelperf.backends.base import Fit, TrainResult
from pytest_accelperf.backends.common import fingerprint, injected_slowdown, stretch
from pytest_accelperf.backends.probe import Probe

# Re-exported: they lived here before DDP and DeepSpeed needed them without this backend.
from pytest_accelperf.backends.torch_task import TorchTask as TorchTask
from pytest_accelperf.backends.torch_task import sync
from pytest_accelperf.backends.torch_task import to_device as to_device
from pytest_accelperf.backends.torch_task import torch_probe as torch_probe
from pytest_accelperf.cases import Case
from pytest_accelperf.report import progress
from pytest_accelperf.run import Run

GIB = 2**30
#: Eager training steps of the throwaway model that CPU memory is counted over: the first
#: creates the optimizer state, the second is the steady state with it.
MEMORY_STEPS = 2


def _device(accel: Accelerator) -> torch.device:
    if accel.name == "cpu":
        return torch.device("cpu")
    if accel.name == "gpu":
        if not torch.cuda.is_available():
            raise RuntimeError(
                "--accel=gpu but torch sees no CUDA device (torch.cuda.is_available() is "
                f"False; torch {torch.__version__}): install a CUDA build of torch")
        return torch.device("cuda", 0)
    raise ValueError(f"the torch backend runs on cpu or gpu, not {accel.name!r}: "
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
    from torch.utils.flop_counter import FlopCounterMode

    buffers = {name: b.detach().clone() for name, b in model.named_buffers()}
    rng = torch.random.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    counter = FlopCounterMode(display=False)
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


def _mem_tracker_peak(task: TorchTask, device: torch.device, steps: int) -> int:
    from torch.distributed._tools.mem_tracker import MemTracker

    model = _build(task, device)
    optimizer = task.make_optimizer(model.parameters())
    tracker = MemTracker()
    tracker.track_external(model, optimizer)
    with tracker:
        for i in range(steps):
            _step(model, optimizer, task, to_device(task.make_batch(i), device)).item()
            tracker.reset_mod_stats()  # per-module stats refuse a second call otherwise
    snapshot = tracker.get_tracker_snapshot("peak")
    totals = [int(s.get("Total", sum(s.values()))) for dev, s in snapshot.items()
              if torch.device(dev).type == device.type]
    if not totals:
        raise RuntimeError(f"MemTracker saw no tensor on {device}")
    return max(totals)


def _profiler_peak(task: TorchTask, device: torch.device, steps: int) -> int:
    """Fallback where MemTracker fails: the peak of the profiler's allocations net of frees."""
    from torch.profiler import ProfilerActivity, profile

    model = _build(task, device)
    optimizer = task.make_optimizer(model.parameters())
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    params += sum(b.numel() * b.element_size() for b in model.buffers())
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        for i in range(steps):
            _step(model, optimizer, task, to_device(task.make_batch(i), device)).item()
    # Each op's *self* allocations minus frees (children excluded, so each byte counts
    # once), summed in start order: the live bytes over time at op granularity.
    events = sorted(prof.events(), key=lambda e: e.time_range.start)
    current = peak = 0
    for event in events:
        current += int(event.self_cpu_memory_usage)
        peak = max(peak, current)
    if peak <= 0:
        raise RuntimeError("the profiler recorded no allocation")
    return params + peak  # parameters were allocated before the profiler started


def cpu_peak_memory(task: TorchTask, device: torch.device) -> tuple[int, str]:
    """Peak bytes of :data:`MEMORY_STEPS` eager steps of a fresh model, and their source."""
    try:
        return _mem_tracker_peak(task, device, MEMORY_STEPS), "mem_tracker"
    except (ImportError, AttributeError, RuntimeError, TypeError, NotImplementedError):
        return _profiler_peak(task, device, MEMORY_STEPS), "profiler"


@dataclass
class _Trained:
    losses: list[float]
    step_times: list[float]
    probe_times: list[float]
    compile_time: float | None = None
    nan_step: int | None = None
    timed_out: bool = False


def _timed_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, task: TorchTask,
                batch: Any, device: torch.device, slower: float) -> tuple[torch.Tensor, float]:
    """One training step, synchronized before and after: (loss, seconds)."""
    sync(device)
    t0 = time.perf_counter()
    loss = _step(model, optimizer, task, batch)
    sync(device)
    return loss, stretch(t0, time.perf_counter(), slower) - t0


class TorchStepper:
    """A case's model and optimizer on its device, trained on demand in blocks of steps
    (the A/B comparison of :mod:`pytest_accelperf.compare`), timed as in a run."""

    def __init__(self, case: Case, task: TorchTask, accel: Accelerator) -> None:
        if case.world_size > 1 or case.n_devices != 1:
            raise ValueError(f"{case.id}: A/B comparison runs single-process torch cases "
                             f"only")
        self._device = _device(accel)
        self._model = _build(task, self._device)
        self._optimizer = task.make_optimizer(self._model.parameters())
        self._runnable: torch.nn.Module = (torch.compile(self._model)  # type: ignore[assignment]
                                           if task.compile else self._model)
        self._task = task
        self._cycle = max(1, case.warmup + case.steps)
        self._step = 0
        self._slower = injected_slowdown()
        torch.manual_seed(task.seed)
        if task.compile:
            self.run(1)  # compiles

    def run(self, n: int) -> list[float]:
        """Train ``n`` more steps; their step times in seconds."""
        times = []
        for _ in range(n):
            batch = to_device(self._task.make_batch(self._step % self._cycle), self._device)
            loss, seconds = _timed_step(self._runnable, self._optimizer, self._task, batch,
                                        self._device, self._slower)
            loss.item()
            times.append(seconds)
            self._step += 1
        return times


def _execute(model: torch.nn.Module, case: Case, task: TorchTask, device: torch.device,
             probe: Probe | None = None, deadline: float | None = None) -> _Trained:
    optimizer = task.make_optimizer(model.parameters())
    runnable: torch.nn.Module = model
    warmup = case.warmup
    if task.compile:
        runnable = torch.compile(model)  # type: ignore[assignment]
        warmup = max(warmup, 1)  # step 0 compiles and is never a measured step
    out = _Trained(losses=[], step_times=[], probe_times=[])
    slower = injected_slowdown()  # 0 unless a gate benchmark injects a slowdown
    for i in range(warmup + case.steps):
        batch = to_device(task.make_batch(i), device)  # the copy is outside the timer
        loss, seconds = _timed_step(runnable, optimizer, task, batch, device, slower)
        value = float(loss.item())  # after the timer: on CPU the step is already done
        out.losses.append(value)
        if task.compile and i == 0:
            # The whole wall time of the first step: tracing + compiling forward and
            # backward, plus one execution (milliseconds against seconds of compile).
            out.compile_time = seconds
        elif i >= warmup:
            out.step_times.append(seconds)
            if probe is not None:
                out.probe_times.append(probe.time())
        progress.step(i + 1, warmup + case.steps, value, seconds)  # outside the timer
        if not math.isfinite(value):
            out.nan_step = i
            break
        if deadline is not None and time.monotonic() > deadline:
            out.timed_out = True
            break
    return out


def _oom_record(required: int, capacity: int, source: str) -> dict[str, Any]:
    return {"required_bytes": required, "capacity_bytes": capacity,
            "exceeded_by_bytes": required - capacity, "source": source}


def _oom_message(oom: dict[str, Any]) -> str:
    return (f"out of memory: a training step needs {oom['required_bytes'] / GIB:.2f} GiB "
            f"({oom['source']}) of {oom['capacity_bytes'] / GIB:.2f} GiB capacity "
            f"(exceeded by {oom['exceeded_by_bytes'] / GIB:.2f} GiB)")


class TorchBackend:
    """Trains a :class:`TorchTask` in this process on the CPU or one CUDA device."""

    name = "torch"

    def unavailable_reason(self) -> str | None:
        if importlib.util.find_spec("torch") is None:
            return ("pip install torch==2.13.0 (CPU) or a CUDA build, then "
                    "pip install 'pytest-accelperf[torch]'")
        return None

    def fits(self, case: Case, task: TorchTask, accel: Accelerator, *,
             timeout: float | None = None) -> Fit:
        """CPU: the MemTracker peak of two eager steps against ``case.memory_capacity``.
        CUDA: two real steps, caught out-of-memory or an allocator peak over capacity.
        A ``world_size > 1`` case is DDP's (:mod:`.ddp`), not this backend's."""
        _one_process(case)
        device = _device(accel)
        capacity = case.memory_capacity
        if device.type == "cpu":
            if not capacity:
                raise ValueError(f"{case.id}: the CPU has no memory counter to search a maximum "
                                 f"batch against; declare memory_capacity on the case")
            peak, source = cpu_peak_memory(task, device)
            return Fit(peak <= capacity, peak, int(capacity), f"{source} peak")
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        total = int(torch.cuda.get_device_properties(device).total_memory)
        limit = int(capacity) if capacity else total
        try:
            model = _build(task, device)
            optimizer = task.make_optimizer(model.parameters())
            for i in range(MEMORY_STEPS):
                _step(model, optimizer, task, to_device(task.make_batch(i), device)).item()
        except torch.OutOfMemoryError as exc:
            return Fit(False, None, limit, f"out of memory: {str(exc).splitlines()[0]}")
        finally:
            model = optimizer = None  # type: ignore[assignment]
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

    def stepper(self, case: Case, task: TorchTask, accel: Accelerator) -> TorchStepper:
        """The case's model, trained in blocks of steps (A/B comparison)."""
        return TorchStepper(case, task, accel)

    def train(self, case: Case, task: TorchTask, accel: Accelerator, *,
              timeout: float | None = None) -> TrainResult:
        _one_process(case)
        if case.reference:
            raise ValueError(
                "reference runs are implemented for the jax backend; the torch backend "
                f"trains on one device only, so {case.id} has nothing to compare against: "
                "drop reference=True")
        if case.n_devices != 1:
            raise ValueError(f"the torch backend trains on one device; {case.id} asks for a "
                             f"mesh of {case.mesh}")
        deadline = deadline_after(timeout)  # memory counting and compiling count too
        device = _device(accel)
        label = _label(device)
        run = Run(case_id=case.id, samples_per_step=case.batch,
                  tokens_per_step=(case.batch * task.tokens_per_sample
                                   if task.tokens_per_sample else None),
                  n_devices=1, peak_flops_per_device=accel.peak_flops)
        capacity = case.memory_capacity
        if device.type == "cpu":
            peak, source = cpu_peak_memory(task, device)
            run.memory_per_device, run.memory_source = {label: peak}, source
            if capacity and peak > capacity:
                run.oom = _oom_record(peak, int(capacity), source)
                run.outcome, run.message = "oom", _oom_message(run.oom)
                return TrainResult(run=run)  # the measured model was never built

        model: torch.nn.Module | None = None
        try:
            if device.type == "cuda":
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats(device)
            model = _build(task, device)
            run.flops_per_step = count_flops(model, task, to_device(task.make_batch(0), device))
            torch.manual_seed(task.seed)  # training draws the same numbers with or without
            probe = torch_probe(device)
            trained = _execute(model, case, task, device, probe, deadline)
        except torch.OutOfMemoryError as exc:
            run.outcome = "oom"
            run.message = f"out of memory: {str(exc).splitlines()[0]}"
            if device.type == "cuda":
                run.memory_per_device = {label: int(torch.cuda.max_memory_allocated(device))}
                run.memory_source = "cuda_allocator"
            return TrainResult(run=run)
        if device.type == "cuda":
            peak = int(torch.cuda.max_memory_allocated(device))
            run.memory_per_device, run.memory_source = {label: peak}, "cuda_allocator"
            if capacity and peak > capacity:
                run.oom = _oom_record(peak, int(capacity), "cuda_allocator")
                run.outcome, run.message = "oom", _oom_message(run.oom)

        run.compile_time = trained.compile_time
        run.losses = trained.losses
        run.loss_steps = list(range(len(trained.losses)))
        run.step_times = trained.step_times
        run.probe_times, run.probe_kind = trained.probe_times, probe.kind
        params: dict[str, np.ndarray] = {
            name: p.detach().cpu().numpy() for name, p in model.named_parameters()}
        run.params_fingerprint = fingerprint(params)
        if trained.nan_step is not None and run.outcome == "ok":
            run.outcome = "nan"
            run.nan_step = trained.nan_step
            run.message = f"loss is {trained.losses[-1]} at step {trained.nan_step}"
        if trained.timed_out and run.outcome == "ok":
            run.outcome = "timeout"
            run.message = timeout_message(timeout, len(trained.losses), case)
        return TrainResult(run=run, params=params)


def _one_process(case: Case) -> None:
    """Refuse a case this backend does not train itself: ``world_size > 1`` is DDP's."""
    if case.world_size > 1:
        raise ValueError(
            f"{case.id}: world_size={case.world_size} trains with DDP in launched ranks, "
            f"not in this process: train it through accelperf.train (the plugin routes it "
            f"to the torch backend's ranks), or call "
            f"pytest_accelperf.backends.ddp.train_ddp(case, task, accel)")


def timeout_message(timeout: float | None, done: int, case: Case) -> str:
    """What a run that hit ``--accelperf-timeout`` reports."""
    return (f"exceeded the {timeout:g} s timeout after {done} of {case.warmup + case.steps} "
            f"steps (raise --accelperf-timeout, or give the case fewer steps)")


BACKEND = TorchBackend()
