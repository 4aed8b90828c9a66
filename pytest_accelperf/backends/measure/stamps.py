"""The measured-step loop of a trainer that owns its loop: :class:`StepClock`.

Lightning's ``Trainer.fit`` (and, later, transformers' ``Trainer`` and Keras's
``model.fit``) runs its own loop; the plugin sees it from a callback. :class:`StepClock`
is the callback side of :func:`.loop.run_steps`: the trainer's callback tells it when the
trainer starts and stops fetching a batch and when a batch ends, and it keeps the rules
``run_steps`` keeps, into the same :class:`~.loop.LoopResult` (which
:func:`.recording.record_loop` writes into the run, as for every backend):

- a step is one **optimizer** step: with gradient accumulation, the micro-batches up to
  the one that stepped; its loss is the mean of theirs;
- a step's time is the wall time between two step ends (the device synchronized at each),
  less the fetches of its batches: so it holds the trainer's own work around the step
  (hooks, logging, the scheduler, the batch's move to the device) as well as the user's
  forward, backward and optimizer step, and not the data;
- the fetch of each batch is the step's ``input`` (the CPU time of this thread, the wall
  time, the time blocked and queued, the page faults, then one yardstick per measured
  step, as the loop measures a ``host``), outside the step's time;
- what the plugin does between steps (reading the loss, the drift probe, the progress
  line) is outside the step's time too: the next step's clock starts after it;
- where the callback tells it when the trainer calls the user's code of the step and when
  that returns (:meth:`StepClock.user_started`, :meth:`StepClock.user_ended`: the forward,
  the backward, the optimizer's step, the device synchronized at each), the rest of the
  step is the trainer's own time (``trainer_times``: its hooks, logging, the loop), what
  Lightning's "parity" benchmarks bound, judged by the ``trainer`` check;
- the first ``warmup`` steps are timed apart; a non-finite loss or the deadline ends the
  training (the callback stops the trainer), what the machine's other processes used over
  the measured steps is read into ``load``, and an injected slowdown stretches each step.

Importing this module imports no framework: ``sync`` waits for the device.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from pytest_accelperf.backends.measure.blocked import BlockedClock
from pytest_accelperf.backends.measure.common import injected_slowdown, stretch
from pytest_accelperf.backends.measure.faults import thread_faults
from pytest_accelperf.backends.measure.loop import (
    LoopResult,
    StepReporter,
    _Inputs,
    in_process,
    probe_every,
    yardstick_every,
)
from pytest_accelperf.backends.measure.probe import Probe
from pytest_accelperf.stats.contention import Contention, measuring_root
from pytest_accelperf.stats.yardstick import yardstick


@dataclass(frozen=True)
class _Fetch:
    """Where one fetch started: the blocked clock's mark, page faults, wall and CPU time."""

    mark: tuple[float, float, int] | None
    faults: int | None
    wall: float
    cpu: float


class StepClock:
    """Stamps the optimizer steps of a loop the trainer owns (see the module docstring).

    The callback calls :meth:`fetch_started` and :meth:`fetch_ended` around the trainer's
    fetch of each batch, :meth:`batch_ended` at the end of each batch (the device is
    synchronized there), then :meth:`after_batch` with that batch's loss once read (and,
    on the batch whose optimizer stepped, the step's metrics); it returns True when the
    trainer should stop. :meth:`finish` after the trainer returned gives the result.
    """

    def __init__(self, *, warmup: int, steps: int, sync: Callable[[], None],
                 probe: Probe | None = None, deadline: float | None = None,
                 report: StepReporter = in_process,
                 hold: Callable[[], bool] | None = None) -> None:
        self.warmup, self.steps, self.total = warmup, steps, warmup + steps
        self._hold = hold  # a held loop's (.held.HeldLoop.hold): before each step
        self._sync, self._probe, self._deadline, self._report = sync, probe, deadline, report
        self._every, self._stride = probe_every(steps), yardstick_every(steps)
        self._slower = injected_slowdown()
        self.out = LoopResult()
        self._mark: float | None = None  # where the running step's clock last started
        self._seconds = 0.0  # the running step's time so far
        self._losses: list[float] = []  # its micro-batches' losses
        self._inputs: list[_Inputs] = []  # its fetches
        self._fetch: _Fetch | None = None
        self._user: float | None = None  # the running step's time in the user's code so far
        self._user_mark: float | None = None
        self._clock = BlockedClock.open()
        self._watch: Contention | None = None
        if warmup == 0:
            self._watch = Contention([measuring_root()]).start()

    @property
    def done(self) -> int:
        """Optimizer steps stamped so far."""
        return len(self.out.losses)

    def start(self) -> bool:
        """The trainer is about to fetch its first batch: the first step's clock starts
        (once a held loop let the step through). True: stop training instead."""
        self._sync()
        if self._hold is not None and self._hold():
            return True
        self._mark = time.perf_counter()
        return False

    def _stop_clock(self) -> None:
        """Synchronize the device; add the time since the clock started to the step's."""
        self._sync()
        if self._mark is not None:
            self._seconds += time.perf_counter() - self._mark
            self._mark = None

    def fetch_started(self) -> None:
        self._stop_clock()
        mark = self._clock.mark() if self._clock is not None else None
        self._fetch = _Fetch(mark, thread_faults(), time.perf_counter(), time.thread_time())

    def fetch_ended(self) -> None:
        fetch, self._fetch = self._fetch, None
        if fetch is None:
            self._mark = time.perf_counter()
            return
        cpu, wall = time.thread_time() - fetch.cpu, time.perf_counter() - fetch.wall
        split = (None if self._clock is None or fetch.mark is None
                 else self._clock.split(fetch.mark))
        f1 = thread_faults()
        faults = None if f1 is None or fetch.faults is None else f1 - fetch.faults
        # The yardstick after the first fetch of every k-th measured step (outside its
        # clock), as run_steps takes it.
        measured = self.done >= self.warmup
        stick = (yardstick() if measured and not self._inputs
                 and (self.done - self.warmup) % self._stride == 0 else None)
        self._inputs.append(_Inputs(cpu, wall, split, faults, stick))
        self.out.batch_time += wall
        self._mark = time.perf_counter()

    def batch_ended(self) -> None:
        """A batch ended (its optimizer stepped or not): its time is stamped."""
        self._stop_clock()

    def user_started(self) -> None:
        """The trainer calls the user's code of the step (the forward, the backward, the
        optimizer's step): the device is synchronized, what ran before was the trainer's."""
        self._sync()
        self._user_mark = time.perf_counter()

    def user_ended(self) -> None:
        """The user's code returned to the trainer: the device is synchronized and the time
        since :meth:`user_started` is the user's."""
        if self._user_mark is None:
            return
        self._sync()
        self._user = (self._user or 0.0) + time.perf_counter() - self._user_mark
        self._user_mark = None

    def after_batch(self, loss: float, metrics: Mapping[str, float] | None) -> bool:
        """The batch's loss, read after :meth:`batch_ended`; ``metrics`` on the batch whose
        optimizer stepped (None on the others: the step goes on). True: stop training."""
        self._losses.append(loss)
        if metrics is None:
            self._mark = time.perf_counter()
            return False
        i = self.done
        seconds = self._seconds
        if self._slower > 0:
            now = time.perf_counter()
            seconds += stretch(now - seconds, now, self._slower) - now
        step_loss = sum(self._losses) / len(self._losses)
        out = self.out
        out.losses.append(step_loss)
        for name, value in metrics.items():
            out.metrics.setdefault(name, []).append(value)
        measured = i >= self.warmup
        if measured:
            out.step_times.append(seconds)
            if self._user is not None:  # the trainer's own time: the step less the user's
                out.trainer_times.append(max(0.0, seconds - self._user))
            if self._inputs:
                _summed(self._inputs).into(out)
            if self._probe is not None and (i - self.warmup + 1) % self._every == 0:
                out.probe_times.append(self._probe.time())
        else:
            out.warmup_times.append(seconds)
        self._seconds, self._losses, self._inputs, self._user = 0.0, [], [], None
        if i + 1 == self.warmup:
            self._watch = Contention([measuring_root()]).start()
        self._report(i + 1, self.total, step_loss, seconds, measured)
        stop = False
        if not math.isfinite(step_loss):
            out.nan_step, stop = i, True
        elif self._deadline is not None and time.monotonic() > self._deadline:
            out.timed_out, stop = True, True
        if not stop and self._hold is not None:
            stop = self._hold()  # held (A/B mode) until the next step is let through
        self._mark = time.perf_counter()
        return stop

    def finish(self) -> LoopResult:
        """The trainer returned: what was measured."""
        if self._watch is not None and self.out.step_times:
            self.out.load = self._watch.reading()
        if self._clock is not None:
            self._clock.close()
            self._clock = None
        return self.out


def _summed(inputs: list[_Inputs]) -> _Inputs:
    """A step's fetches as one input: a step of several micro-batches fetched each."""
    if len(inputs) == 1:
        return inputs[0]
    splits = [i.split for i in inputs]
    faults = [i.faults for i in inputs]
    return _Inputs(
        sum(i.cpu for i in inputs), sum(i.wall for i in inputs),
        None if any(s is None for s in splits)
        else (sum(s[0] for s in splits if s), sum(s[1] for s in splits if s)),
        None if any(f is None for f in faults) else sum(f for f in faults if f is not None),
        inputs[0].yardstick)


class Clocked:
    """A trainer's watch whose hooks stamp a :class:`StepClock` (the measured training of
    Lightning and transformers): the stamps of a step's parts, forwarded as they come."""

    clock: StepClock

    def fetch_started(self) -> None:
        self.clock.fetch_started()

    def fetch_ended(self) -> None:
        self.clock.fetch_ended()

    def batch_ended(self) -> None:
        self.clock.batch_ended()

    def user_started(self) -> None:
        self.clock.user_started()

    def user_ended(self) -> None:
        self.clock.user_ended()
