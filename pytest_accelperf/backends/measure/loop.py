"""The measured-step loop: written once, used by every backend and by the rank processes.

A backend says how to do one step; the loop owns what makes a measurement one:

- the batch of step ``i`` is made and moved to the device *before* the timer starts
  (``prepare``); where a backend splits that into making the batch on the host (``host``:
  the user's ``make_batch`` or data iterator and the conversion of what it returns) and
  moving it to the device (``put``), making it is measured on its own, per measured step:
  the CPU time of this thread (``time.thread_time()``: another process delays the thread
  without adding to it, though it can slow what the thread computes: ``inputs.times``,
  what the ``input`` check judges, :mod:`pytest_accelperf.checks.input`), the wall time
  (``inputs.wall_times``) and, where
  the kernel counts this thread's run-queue delay, the time it was blocked: neither on a
  CPU nor waiting for one (a sleep, a read, a queue: ``inputs.blocked_times``, what the
  ``input_wait`` check judges, :mod:`.blocked`); beside them, the evidence the ``input``
  check weighs before it believes a change of that CPU time: the time the thread waited
  for a CPU (``inputs.queued_times``) and its page faults (``inputs.faults``, :mod:`.faults`:
  memory the allocator got fresh from the kernel, whose zeroing counts in the CPU time and
  which the process's history decides); and, right after, outside every timer, the CPU
  time of a fixed piece of host work in the same thread (``inputs.yardstick_times``,
  :mod:`pytest_accelperf.stats.yardstick`): how fast the thread computed then, what the
  check corrects the input's CPU time by, as the throughput check corrects the step by
  the drift probe. The
  transfer is left out: waiting for it (JAX's copy to 8 virtual devices) spins this
  thread, and under load its CPU time grew 2.6x on unchanged code;
- the device is synchronized before the timer starts and inside it at the end
  (``sync``), so a step time is the step's device work, not a queue's;
- the loss and the other metrics are read *after* the timer stopped (``read``: a
  device-to-host copy is not part of the step);
- the first ``warmup`` steps are timed apart (compile, allocator warm-up) and never
  measured; after every measured step the drift ``probe`` runs, outside the timer (in a
  run of more than :data:`MAX_PROBES` measured steps, after every k-th, evenly spread:
  :func:`probe_every`);
- progress is reported after every step (outside the timer); a non-finite loss ends the
  run (``nan_step``), and so does the ``deadline`` (``time.monotonic()``), at the next
  step boundary;
- what the rest of the machine used during the measured steps is read from ``/proc``
  (:class:`~pytest_accelperf.stats.contention.Contention`, the session's process tree counted as
  its own) into ``load``: the throughput check does not judge a measurement taken beside
  another job;
- a gate benchmark's injected slowdown (:func:`.common.injected_slowdown`) stretches each
  measured interval, so the gate is exercised without changing the code under test.

Backends differ only in the three callables and in what they do with the result:
:func:`run_steps` for a run, :func:`time_block` for the blocks of A/B mode.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, Required, TypedDict, TypeVar

from pytest_accelperf.backends.measure import progress
from pytest_accelperf.backends.measure.blocked import BlockedClock
from pytest_accelperf.backends.measure.common import injected_slowdown, stretch
from pytest_accelperf.backends.measure.faults import thread_faults
from pytest_accelperf.backends.measure.probe import Probe
from pytest_accelperf.records.run import InputSeries
from pytest_accelperf.stats.contention import Contention, Load, measuring_root
from pytest_accelperf.stats.yardstick import yardstick

B = TypeVar("B")
H = TypeVar("H")

#: The most drift probes one run takes. The throughput check reads the probes' median
#: (and their spread), not a probe per step (per-step pairing was rejected: it widened
#: the interval), so a long run needs no more; every probe costs a few milliseconds of
#: wall time outside the timer (JAX's 256x256 one about 2 ms: 2 s of a 1000-step run).
#: No suite of this project measures more steps than this, so their probes are unchanged.
MAX_PROBES = 100


def probe_every(steps: int) -> int:
    """Probe after every k-th measured step, for ``k`` this: 1 up to :data:`MAX_PROBES`
    measured steps, then the smallest ``k`` that keeps the probes at most that many.

    >>> probe_every(40), probe_every(100), probe_every(101), probe_every(1000)
    (1, 1, 2, 10)
    """
    return _every(steps, MAX_PROBES)


def _every(steps: int, most: int) -> int:
    """The smallest ``k`` such that taking something after every k-th of ``steps`` steps
    takes it at most ``most`` times."""
    return max(1, math.ceil(steps / most))


#: The most input yardsticks (:mod:`pytest_accelperf.stats.yardstick`) one run takes: the
#: input check reads their median, and each costs about 0.3 ms of wall time outside the
#: timers (+9 % of a 3.8 ms Lightning step when taken every step).
MAX_YARDSTICKS = 10


def yardstick_every(steps: int) -> int:
    """Time the yardstick after every k-th measured step's batch, for ``k`` this: at most
    :data:`MAX_YARDSTICKS` a run, evenly spread.

    >>> yardstick_every(4), yardstick_every(10), yardstick_every(20), yardstick_every(1000)
    (1, 1, 2, 100)
    """
    return _every(steps, MAX_YARDSTICKS)


class StepReporter(Protocol):
    """Where progress goes after each step (outside the timer)."""

    def __call__(self, done: int, total: int, loss: float, seconds: float,
                 measured: bool) -> None: ...


def in_process(done: int, total: int, loss: float, seconds: float, measured: bool) -> None:
    """The default reporter: this process's progress sink (:mod:`.progress`)."""
    progress.step(done, total, loss, seconds)


@dataclass(frozen=True)
class StepFns(Generic[B, H]):
    """How one backend does one step.

    ``prepare(i)`` makes batch ``i`` on the device (untimed); ``run(i, batch)`` is the
    step, timed, returning a handle to its outputs; ``sync()`` waits for the device (it
    runs before the timer starts and, inside the timer, after ``run``); ``read(handle)``
    gives ``(loss, other metrics)`` as floats, after the timer stopped. A backend whose
    ``prepare`` already ends by waiting for the device sets ``sync_before=False``.

    ``host(i)`` and ``put(i, host_batch)``, when a backend gives both, are ``prepare``'s
    two halves: the user's data work on the host, and the move to the device. The loop
    then calls them instead of ``prepare`` and times ``host`` as the step's input.
    """

    prepare: Callable[[int], B]
    run: Callable[[int, B], H]
    read: Callable[[H], tuple[float, Mapping[str, float]]]
    sync: Callable[[], None] = lambda: None
    sync_before: bool = True
    host: Callable[[int], Any] | None = None
    put: Callable[[int, Any], B] | None = None


@dataclass
class LoopResult:
    """What the loop measured; ``last`` is the handle of the last step that ran."""

    losses: list[float] = field(default_factory=list)
    metrics: dict[str, list[float]] = field(default_factory=dict)
    step_times: list[float] = field(default_factory=list)
    warmup_times: list[float] = field(default_factory=list)
    probe_times: list[float] = field(default_factory=list)
    nan_step: int | None = None
    timed_out: bool = False
    last: Any = None
    #: What other processes used during the measured steps (None: nothing measured, or no
    #: ``/proc``); a backend stores it as ``Run.step_load``.
    load: Load | None = None
    #: Wall seconds making the batches and moving them to the device (``prepare``, every
    #: step): the user's data work, which any training loop does too.
    batch_time: float = 0.0
    #: Per measured step (one per ``step_times`` entry): the making of its batch in
    #: ``host``, timed in this thread (CPU, wall, blocked and run-queue seconds, page faults,
    #: and the yardstick's CPU seconds after every k-th: :func:`yardstick_every`); empty for
    #: a backend without ``host``.
    inputs: InputSeries = field(default_factory=InputSeries)
    #: Per measured step of a trainer that owns its loop (:class:`.stamps.StepClock`): the
    #: seconds of the step outside the user's forward, backward and optimizer step (the
    #: trainer's hooks, logging and loop); empty for a backend that owns no such loop.
    trainer_times: list[float] = field(default_factory=list)

    @property
    def steps_done(self) -> int:
        return len(self.losses)


@dataclass(frozen=True)
class _Inputs:
    """One step's making of its batch: CPU and wall seconds, the blocked and run-queue
    seconds (None: not counted), the page faults (None: not counted), the yardstick's CPU
    seconds right after (None: a warm-up step's, not taken)."""

    cpu: float
    wall: float
    split: tuple[float, float] | None
    faults: int | None
    yardstick: float | None

    def into(self, out: LoopResult) -> None:
        series = out.inputs
        series.times.append(self.cpu)
        series.wall_times.append(self.wall)
        if self.split is not None:
            series.blocked_times.append(self.split[0])
            series.queued_times.append(self.split[1])
        if self.faults is not None:
            series.faults.append(self.faults)
        if self.yardstick is not None:
            series.yardstick_times.append(self.yardstick)


def timed(fns: StepFns[B, H], i: int, batch: B, slower: float) -> tuple[H, float]:
    """Step ``i`` on ``batch``, synchronized before and after: ``(handle, seconds)``."""
    if fns.sync_before:
        fns.sync()
    t0 = time.perf_counter()
    handle = fns.run(i, batch)
    fns.sync()
    return handle, stretch(t0, time.perf_counter(), slower) - t0


def run_steps(fns: StepFns[B, H], *, warmup: int, steps: int, probe: Probe | None = None,
              deadline: float | None = None, report: StepReporter = in_process,
              after_step: Callable[[int, H, bool], None] | None = None) -> LoopResult:
    """Run ``warmup`` then ``steps`` measured steps (see the module docstring).

    ``after_step(i, handle, measured)`` runs after each step's values were read and
    before progress is reported (a rank's memory count, a lazy device's recompiles).
    """
    out = LoopResult()
    slower = injected_slowdown()  # 0 unless a gate benchmark injects a slowdown
    total = warmup + steps
    every, stride = probe_every(steps), yardstick_every(steps)
    watch: Contention | None = None
    clock = BlockedClock.open() if fns.host is not None else None
    try:
        for i in range(total):
            if i == warmup:
                watch = Contention([measuring_root()]).start()
            mark = clock.mark() if clock is not None else None
            f0 = thread_faults() if fns.host is not None else None
            t0, c0 = time.perf_counter(), time.thread_time()
            inputs: _Inputs | None = None
            if fns.host is not None and fns.put is not None:  # outside the timer
                made = fns.host(i)
                cpu, wall = time.thread_time() - c0, time.perf_counter() - t0
                split = None if clock is None or mark is None else clock.split(mark)
                f1 = thread_faults() if f0 is not None else None
                faults = None if f1 is None or f0 is None else f1 - f0
                inputs = _Inputs(cpu, wall, split, faults,
                                 yardstick() if i >= warmup and (i - warmup) % stride == 0
                                 else None)
                batch = fns.put(i, made)
            else:
                batch = fns.prepare(i)
            out.batch_time += time.perf_counter() - t0
            handle, seconds = timed(fns, i, batch, slower)
            out.last = handle
            loss, metrics = fns.read(handle)
            out.losses.append(loss)
            for name, value in metrics.items():
                out.metrics.setdefault(name, []).append(value)
            measured = i >= warmup
            if measured:
                out.step_times.append(seconds)
                if inputs is not None:
                    inputs.into(out)
                if probe is not None and (i - warmup + 1) % every == 0:
                    out.probe_times.append(probe.time())
            else:
                out.warmup_times.append(seconds)
            if after_step is not None:
                after_step(i, handle, measured)
            report(i + 1, total, loss, seconds, measured)
            if not math.isfinite(loss):
                out.nan_step = i
                break
            if deadline is not None and time.monotonic() > deadline:
                out.timed_out = True
                break
        if watch is not None and out.step_times:
            out.load = watch.reading()
    finally:
        if clock is not None:
            clock.close()
    return out


class LoadJson(TypedDict, total=False):
    """:func:`load_json`: the loop's input wait per step and the machine's load."""

    batch_time: Required[float]
    step_load: dict[str, float | int]


def load_json(result: LoopResult) -> LoadJson:
    """The loop's ``batch_time``, and ``step_load`` when the loop read the machine's load,
    as JSON: what a rank process sends back for ``Run.batch_time`` and ``Run.step_load``
    (what the throughput check reads, :func:`pytest_accelperf.checks.throughput.foreign_load`)."""
    out: LoadJson = {"batch_time": result.batch_time}
    if result.load is not None:
        out["step_load"] = result.load.to_json()
    return out


def time_block(fns: StepFns[B, H], first: int, n: int, cycle: int) -> tuple[list[float], Any]:
    """Steps ``first .. first + n - 1`` (batches taken modulo ``cycle``, the batches a run
    would see), timed as in a run: their step times and the last handle (A/B mode)."""
    slower = injected_slowdown()
    times: list[float] = []
    handle: Any = None
    for i in range(first, first + n):
        batch = fns.prepare(i % max(1, cycle))
        handle, seconds = timed(fns, i, batch, slower)
        times.append(seconds)
    return times, handle
