"""The counting training of a trainer that owns its loop (Lightning's ``Trainer.fit``,
transformers' ``Trainer.train``): :class:`CountedSteps`, what the trainer's callback
drives to count, untimed, what the torch backend counts over its counting steps.

On the CPU the live tensor bytes (``MemTracker``: the peak over the first
:data:`~.memory.MEMORY_STEPS` optimizer steps, then the live bytes after each of
:data:`~.memory.GROWTH_STEPS` more: a leak), and over optimizer step
:data:`COUNTED_STEP`, from the end of the step before (the trainer's work after it
included) to its own end, its FLOPs and what it dispatched: ops by dtype, bytes, host
syncs, each named at the user's line (:class:`~.ops.OpCounter`, the trainer's packages
``libraries`` seen through), the fetch of its batches left out (the input's work); in one
of the plugin's launched ranks (:mod:`.torch.launched`), its collectives too.

The callback calls :meth:`CountedSteps.start` when the trainer starts (with what to
track: the model, the optimizer), :meth:`fetch_started` / :meth:`fetch_ended` around the
trainer's fetch of a batch, :meth:`batch_ended` after each batch, :meth:`stepped` after
each optimizer step (True: stop the trainer), and :meth:`close` when the training ended or
failed.
"""

from __future__ import annotations

import contextlib

import torch

from pytest_accelperf.backends.torch.launched import CollectiveMode, launched
from pytest_accelperf.backends.torch.memory import (
    GROWTH_STEPS,
    MEMORY_STEPS,
    CpuMemory,
    device_total,
    memory_tracker,
)
from pytest_accelperf.backends.torch.ops import OpCounter, OpCounts, uncounted
from pytest_accelperf.backends.torch.task import flop_counter
from pytest_accelperf.backends.types import Untyped

#: The optimizer step whose ops the counting training records: the third (steps 0 and 1
#: create the optimizer's state and the trainer's first-step bookkeeping).
COUNTED_STEP = MEMORY_STEPS


class CountedSteps:
    """Counts memory, FLOPs and ops over a trainer's first optimizer steps (see the module
    docstring); ``steps``: the optimizer steps after which it asks the trainer to stop."""

    def __init__(self, device: torch.device, libraries: tuple[str, ...] = ()) -> None:
        self.device, self.libraries = device, libraries
        self.steps = MEMORY_STEPS + GROWTH_STEPS
        self.done = 0
        self.peak = 0
        self.live: list[int] = []
        self.ops: OpCounts | None = None
        self.flops: float | None = None
        self._tracker: Untyped = None
        self._memory = contextlib.ExitStack()
        self._counting = contextlib.ExitStack()
        self._fetch = contextlib.ExitStack()
        self._counters: tuple[OpCounter, Untyped] | None = None

    def memory(self) -> CpuMemory | None:
        """What ``MemTracker`` counted (on the CPU), or None."""
        if self._tracker is None or not self.live:
            return None
        return CpuMemory(self.peak, "mem_tracker", self.live)

    def start(self, *tracked: object) -> None:
        """The trainer starts: track ``tracked`` (its modules and optimizers) on the CPU."""
        if self.device.type == "cpu":
            self._tracker = memory_tracker()
            self._tracker.track_external(*tracked)
            self._memory.enter_context(self._tracker)
        if COUNTED_STEP == 0:
            self._start_counting()

    def _start_counting(self) -> None:
        rank = launched()
        if rank is not None:  # a launched rank: the step's collectives too, counted below
            # the op counter (which names a host sync at the first frame outside the
            # libraries that called the op: not this mode's)
            self._counting.enter_context(rank.comm.step())
            self._counting.enter_context(CollectiveMode(rank.comm))
        ops, counter = OpCounter(self.device, self.libraries), flop_counter()
        self._counting.enter_context(ops)
        self._counting.enter_context(counter)
        self._counters = (ops, counter)

    def fetch_started(self) -> None:
        self._fetch.enter_context(uncounted())  # the data's work is the input's

    def fetch_ended(self) -> None:
        self._fetch.close()

    def batch_ended(self) -> None:
        """A batch ended (its optimizer stepped or not)."""
        if self._tracker is not None:
            self._tracker.reset_mod_stats()  # per-module stats refuse a second call otherwise

    def stepped(self) -> bool:
        """An optimizer step ended; True when the counting training has what it needs."""
        step = self.done
        self.done += 1
        if step == COUNTED_STEP and self._counters is not None:
            ops, counter = self._counters
            self._counting.close()
            self.ops = ops.record()
            total = float(counter.get_total_flops())
            self.flops = total if total > 0 else None
            self._counters = None
        tracker = self._tracker
        if tracker is not None:
            live = device_total(tracker, "current", self.device)
            self.live.append(int(live or 0))
            if self.done == MEMORY_STEPS:
                self.peak = int(device_total(tracker, "peak", self.device) or 0)
        if self.done == COUNTED_STEP:
            self._start_counting()
        if self.done >= self.steps:
            self.close()
            return True
        return False

    def close(self) -> None:
        """The training ended, or failed: leave nothing entered."""
        self._fetch.close()
        self._counting.close()
        self._memory.close()
