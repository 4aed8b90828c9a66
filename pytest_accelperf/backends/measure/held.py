"""A trainer's loop held at its step boundaries: what A/B mode steps a trainer's case with.

A/B mode (:mod:`pytest_accelperf.ab`) alternates blocks of steps between two revisions: it
asks each arm's stepper to train ``n`` more steps and give their times
(:class:`~pytest_accelperf.backends.protocol.Stepper`). A backend whose step is a function
(JAX, torch) calls it ``n`` times; a trainer (Lightning's ``Trainer.fit``, transformers'
``Trainer.train``, Keras's ``model.fit``) owns its loop and cannot be called a step at a
time. So :class:`HeldLoop` runs the trainer's whole training in a thread of its own and
holds it between two optimizer steps, where the trainer's callback asks its
:class:`~.stamps.StepClock` for the next step (``hold``): :meth:`HeldLoop.run` lets ``n``
steps through, waits for the clock to have stamped them, and gives their times, stamped as
a run stamps them (the device synchronized, the data's fetch left out). While the other
arm runs its block, this arm's trainer waits at a step boundary, its clock stopped.

Importing this module imports no framework.
"""

from __future__ import annotations

import shutil
import threading
from collections.abc import Callable

from pytest_accelperf.backends.measure.stamps import StepClock
from pytest_accelperf.records.program import ProgramRecord

#: The steps a held training is told it trains: more than any comparison asks for (its
#: trainer's ``max_steps``, and the clock's count for spreading its yardstick).
HELD_STEPS = 1_000_000
#: How long :meth:`HeldLoop.close` waits for the trainer to leave its loop once told to stop.
CLOSE_WAIT = 60.0


class TrainerStopped(RuntimeError):
    """The held trainer left its loop before it trained the steps asked for."""


def quiet(done: int, total: int, loss: float, seconds: float, measured: bool) -> None:
    """A held loop's clock reports no progress: A/B mode reports its blocks."""


class HeldLoop:
    """A trainer's training run in a thread, held before each optimizer step until
    :meth:`run` lets it through: :meth:`clock` makes the clock its callback stamps with
    (its ``hold`` is :meth:`hold`), :meth:`start` starts the training."""

    def __init__(self, label: str) -> None:
        self.label = label
        self._cond = threading.Condition()
        self._granted = 0
        self._stop = False
        self._ended = False
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._clock: StepClock | None = None

    def clock(self, sync: Callable[[], None]) -> StepClock:
        """The clock of the held training: every step measured, no drift probe, no
        progress line, held by :meth:`hold` before each step."""
        self._clock = StepClock(warmup=0, steps=HELD_STEPS, sync=sync, report=quiet,
                                hold=self.hold)
        return self._clock

    def start(self, fit: Callable[[], object]) -> None:
        """Start ``fit``, the trainer's training with this loop's clock, in its thread."""
        self._fit = fit
        self._thread = threading.Thread(target=self._train, daemon=True,
                                        name=f"accelperf-held {self.label}")
        self._thread.start()

    # -- the trainer's thread ---------------------------------------------------------------
    def _train(self) -> None:
        try:
            self._fit()
        except BaseException as exc:  # handed to the thread that asked for steps
            self._error = exc
        finally:
            with self._cond:
                self._ended = True
                self._cond.notify_all()

    def hold(self) -> bool:
        """Called by the clock before each optimizer step (in the trainer's thread): waits
        until a step is let through. True: the trainer is to stop instead."""
        with self._cond:
            self._cond.notify_all()  # the step before is stamped: run() may be waiting
            while self._granted == 0 and not self._stop:
                self._cond.wait()
            if self._stop:
                return True
            self._granted -= 1
            return False

    # -- the asking thread ------------------------------------------------------------------
    def run(self, n: int) -> list[float]:
        """Let ``n`` more optimizer steps through; their step times in seconds."""
        if self._clock is None or self._thread is None:
            raise RuntimeError("HeldLoop.run before clock() and start()")
        out = self._clock.out
        with self._cond:
            done = len(out.warmup_times) + len(out.step_times)
            target = done + n
            self._granted += n
            self._cond.notify_all()
            while (len(out.warmup_times) + len(out.step_times) < target
                   and not self._ended):
                self._cond.wait()
            times = [*out.warmup_times, *out.step_times][done:target]
        if len(times) < n:
            error = self._error
            why = (f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
                   if error is not None else "the trainer returned")
            raise TrainerStopped(f"{self.label}: the trainer left its loop after "
                                 f"{done + len(times)} steps, asked for {target} ({why})"
                                 ) from error
        return times

    def close(self) -> None:
        """Tell the trainer to stop at its next step boundary, and wait for it to return."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(CLOSE_WAIT)


class HeldStepper:
    """What every trainer's A/B stepper shares: a :class:`HeldLoop` (``_held``) that
    :meth:`run` lets steps through, the program record counted before it (``_program``),
    and a temporary root the trainer wrote in (``_root``), removed at :meth:`close` after
    the loop ended. A trainer's stepper sets the three in its ``__init__``."""

    _held: HeldLoop
    _program: ProgramRecord | None = None
    _root: str | None = None

    @property
    def program(self) -> ProgramRecord | None:
        return self._program

    def run(self, n: int) -> list[float]:
        return self._held.run(n)

    def close(self) -> None:
        self._held.close()
        if self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)
