"""Counting the live tensor bytes of torch on a CPU: the one MemTracker the torch backend
and the ranks (DDP, DeepSpeed) count with, and how a device's total is read from it; and
the in-process torch backend's memory counts made with it: the peak and live bytes of
counted CPU steps (:func:`cpu_memory`: MemTracker, or the profiler's allocations where
MemTracker cannot follow the step), the live memory's growth on the CPU
(:func:`cpu_memory_growth`) and on CUDA (:class:`_CudaGrowth`), and the out-of-memory record
and message of a peak over the capacity (:func:`_oom_record`, :func:`_oom_message`); and
where every in-process torch-family case starts its count (:func:`fresh_peak`: the earlier
cases' garbage collected, the CUDA peak reset).

``torch.distributed._tools.mem_tracker.MemTracker`` sums the storage bytes of live tensors
(parameters, buffers, gradients, optimizer state, activations and temporaries) as a
dispatch mode sees them made and freed. After every op it also updates the peak of each
module it has seen (its per-module breakdown), a loop over all the model's modules per op:
a step costs O(ops * modules): 4 counted steps of the suites' two-block GPT took 12 times
as long as 4 eager steps, and more as a model grows. The plugin reads only the device
totals (the peak and the live bytes), so :func:`memory_tracker` keeps MemTracker's
accounting of storages whole (what is allocated, resized and freed, and when) and only
leaves the per-module peaks out: the totals are the same bytes
(``tests/unit/backends/torch/test_memory.py`` compares the two on a real model).
"""

from __future__ import annotations

import functools
import gc
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from torch.distributed._tools.mem_tracker import MemTracker

from pytest_accelperf.backends.measure.common import TaskError
from pytest_accelperf.backends.torch.step import TorchStep, float_metrics, run_step, undone
from pytest_accelperf.backends.torch.task import to_device
from pytest_accelperf.records.run import MemoryGrowth, OomRecord

GIB = 2**30

#: The private attributes the per-op peak update reads; a torch without them gets the stock
#: tracker (slower, the same totals).
_PEAK_STATE = ("_curr_mem_snap", "_peak_mem", "_peak_mem_snap", "_update_peak_stats")
#: Eager training steps (undone afterwards) that CPU memory is counted over: the first
#: creates the optimizer state, the second is the steady state with it.
MEMORY_STEPS = 2


#: Counted steps after :data:`MEMORY_STEPS` over which a CPU case's live memory growth (a
#: leak) is read: the live bytes after them less those after the memory steps.
GROWTH_STEPS = 2


@functools.cache
def _totals_only_class() -> type[Any]:
    from torch.distributed._tools.mem_tracker import MemTracker

    class TotalsTracker(MemTracker):  # type: ignore[no-untyped-call]
        """MemTracker whose per-op update keeps the device totals' peak, not each module's
        (the stock update's first loop): the same storage accounting, O(1) modules per op."""

        def _update_peak_stats(self, peak_state: object) -> None:
            for dev, snap in self._curr_mem_snap.items():
                total = snap["Total"]
                if self._peak_mem.get(dev, 0) < total:
                    self._peak_mem[dev] = total
                    self._peak_mem_snap[dev] = dict(snap)  # str -> int: a full copy

    return TotalsTracker


#: The function ModTracker registers its backward hooks with (:func:`_releasing_class`).
_MULTI_GRAD_HOOK = "register_multi_grad_hook"


@functools.cache
def _releasing_class() -> type[Any]:
    from torch.distributed._tools import mod_tracker

    class ReleasingModTracker(mod_tracker.ModTracker):
        """ModTracker whose backward hooks are removed when it exits.

        In a forward pass ModTracker registers a multi-grad hook on each module's inputs
        (``register_multi_grad_hook``, mode ``"all"``) whose closure holds the inputs'
        ``grad_fn`` nodes: a cycle through C++ (node -> hook -> closure -> node) that
        Python's gc cannot see, and that keeps the whole autograd graph of every counted
        step alive, down to its ``AccumulateGrad`` nodes: the model's parameters and
        their gradients outlived the case (found on torch 2.13: a finished case's
        parameters had no Python referrer). The count runs on the CPU only and sees only
        the tensors it tracks, so no figure moved, but the process grew by each case's
        model and gradients (26.9 MiB after the suites' first torch case). The hooks'
        handles are kept and removed on exit, which breaks the cycle; every backward pass
        the tracker watched has run by then."""

        def __enter__(self) -> ReleasingModTracker:
            registered = getattr(mod_tracker, _MULTI_GRAD_HOOK)
            handles: list[Any] = []

            def register(*args: Any, **kwargs: Any) -> Any:  # noqa: ANN401  # torch's
                handle = registered(*args, **kwargs)
                handles.append(handle)
                return handle

            self._released = (registered, handles)
            setattr(mod_tracker, _MULTI_GRAD_HOOK, register)
            try:
                super().__enter__()  # type: ignore[no-untyped-call]
            except BaseException:
                setattr(mod_tracker, _MULTI_GRAD_HOOK, registered)
                raise
            return self

        def __exit__(self, *args: object) -> None:
            try:
                super().__exit__(*args)  # type: ignore[no-untyped-call]
            finally:
                registered, handles = self._released
                setattr(mod_tracker, _MULTI_GRAD_HOOK, registered)
                for handle in handles:
                    handle.remove()
                handles.clear()

    return ReleasingModTracker


def memory_tracker(*, per_module: bool = False) -> MemTracker:
    """A MemTracker for the device totals (:func:`device_total`); ``per_module`` gives the
    stock one, which also keeps every module's peak. Either leaves nothing of the steps
    it counted alive after it exits (its module tracker's backward hooks are removed:
    ``ReleasingModTracker`` in :func:`_releasing_class`)."""
    from torch.distributed._tools.mem_tracker import MemTracker

    tracker = _totals_only_class()() if not per_module else MemTracker()
    if not per_module and not all(hasattr(tracker, name) for name in _PEAK_STATE):
        tracker = MemTracker()
    if hasattr(tracker, "_mod_tracker"):
        tracker._mod_tracker = _releasing_class()()
    return tracker


def device_total(tracker: MemTracker, kind: str, device: torch.device) -> int | None:
    """The tracker's total bytes on ``device``'s type, ``kind`` ``"current"`` or
    ``"peak"``; None when it saw no tensor there."""
    snapshot = tracker.get_tracker_snapshot(kind)
    totals = [int(s.get("Total", sum(s.values()))) for dev, s in snapshot.items()
              if torch.device(dev).type == device.type]
    return max(totals) if totals else None


def fresh_peak(device: torch.device) -> None:
    """Before a case builds its model (and again before it trains): what earlier code of
    this process left is freed, and on CUDA the allocator's peak starts from what is alive
    now. The one place every in-process torch-family backend (torch, Lightning,
    transformers, and a DDP/DeepSpeed rank's count) starts its memory count.

    ``gc.collect()`` first: a case's models, optimizers and trainers sit in reference
    cycles after it ends (a Lightning ``Trainer`` and its module, a step's closures) and
    are freed only when the cyclic gc runs, at a moment that differs from one session to
    the next. On a GPU their tensors counted in the next case's peak: an H200 run (torch
    2.11+cu130) saw the peaks of unchanged cases move by about 15.5 MiB between two
    sessions, one of them a false regression (docs/checks-and-statistics.md). Then, on
    CUDA, the caching allocator's cached blocks are given back and its peak reset.

    The figure stays the allocator's absolute peak (``max_memory_allocated``: everything
    allocated in the process, the CUDA context's own workspaces such as cuBLAS's
    included), not the growth over what was allocated before: with the earlier cases'
    leftovers gone, that is what a fresh process training only this case shows, the
    number a user sizes a device by; a growth figure would drop the workspaces an earlier
    case happened to create. torch raises ``RuntimeError: Invalid device argument`` when
    the peak of a device is reset before anything was allocated on it in this process
    (seen on torch 2.11+cu130, an H100: every torch case of the suites failed so as its
    first CUDA call); an empty tensor initializes the device's allocator first.
    """
    gc.collect()
    if device.type != "cuda":
        return
    torch.empty(0, device=device)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)


# -- the in-process backend's counts ---------------------------------------------------------
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
            # The batch is not bound to a name: it is freed before the live bytes are read.
            float_metrics(step, run_step(step, to_device(step.make_batch(i), device),
                                         counting=True))
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
            # The batch is not bound to a name: it is freed before the live bytes are read.
            float_metrics(step, run_step(step, to_device(step.make_batch(i), device),
                                         counting=True))
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


class _CudaGrowth:
    """``torch.cuda.memory_allocated`` after the warm-up and after the last measured step
    (the loop's ``after_step``): a CUDA case's live memory growth."""

    def __init__(self, device: torch.device, warmup: int) -> None:
        self.device, self.warmup = device, warmup
        self.after_warmup = int(torch.cuda.memory_allocated(device)) if warmup == 0 else None
        self.after_steps: int | None = None
        self.steps = 0

    def after_step(self, i: int, handle: object, measured: bool) -> None:
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


def _oom_record(required: int, capacity: int, source: str) -> OomRecord:
    return {"required_bytes": required, "capacity_bytes": capacity,
            "exceeded_by_bytes": required - capacity, "source": source}


def _oom_message(oom: OomRecord) -> str:
    return (f"out of memory: a training step needs {oom['required_bytes'] / GIB:.2f} GiB "
            f"({oom['source']}) of {oom['capacity_bytes'] / GIB:.2f} GiB capacity "
            f"(exceeded by {oom['exceeded_by_bytes'] / GIB:.2f} GiB)")
