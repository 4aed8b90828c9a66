"""A case's step trained on demand in blocks of steps: what A/B mode
(:mod:`pytest_accelperf.ab`) alternates between two revisions and what an explanation
traces (:mod:`pytest_accelperf.gate.explain`). Written once; a backend gives it the step as
the measured-step loop runs it (:class:`.loop.StepFns`), already built, compiled where it
compiles, and warmed up as far as its own ``__init__`` goes.

Blocks are timed exactly as a run's measured steps (:func:`.loop.time_block`), and take
their batches as a run does, modulo the steps a run would see (``cycle``), so that a long
comparison does not ask a finite data source for more than it has.
"""

from __future__ import annotations

from typing import Generic, TypeVar

from pytest_accelperf.backends.measure.loop import StepFns, time_block
from pytest_accelperf.records.program import ProgramRecord

B = TypeVar("B")
H = TypeVar("H")


class BlockStepper(Generic[B, H]):
    """Steps ``fns`` on demand: :meth:`run` trains ``n`` more and gives their step times.
    ``cycle``: the batches a run would see (warm-up plus measured steps). A backend that
    reads something after a block (the last step's outputs, as a run reads them)
    overrides :meth:`after_block`; one that has a program record to diff between the two
    revisions overrides :attr:`program`."""

    def __init__(self, fns: StepFns[B, H], cycle: int) -> None:
        self._fns = fns
        self._cycle = max(1, cycle)
        self._step = 0

    @property
    def program(self) -> ProgramRecord | None:
        """The step's program record, for A/B mode's diff of the two revisions; None where
        the backend cannot tell it without a run."""
        return None

    def after_block(self, last: H) -> None:
        """Called with the handle of a block's last step, after its timer stopped."""

    def run(self, n: int) -> list[float]:
        """Train ``n`` more steps; their step times in seconds."""
        times, last = time_block(self._fns, self._step, n, self._cycle)
        self.after_block(last)
        self._step += n
        return times
