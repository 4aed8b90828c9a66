"""Judging a case's throughput: the step between evaluating a run and recording it.

A case flows one way (:mod:`pytest_accelperf.runner`): measured, evaluated (every check
against the stored baseline, giving an :class:`Evaluated`), judged, recorded once, gated.
Judging decides what the throughput check finally says, by one of three strategies; each
takes the evaluated result and returns a new one, never changing what it was given:

:class:`StoredBaseline`
    the stored-baseline verdict stands (``--accelperf-update``, ``--accelperf-confirm=0``,
    a run checked or ingested rather than trained);
:class:`Confirmation`
    an apparent throughput regression is re-measured (``--accelperf-confirm`` times) and
    stands only if confirmed;
:class:`ABComparison`
    A/B mode (``--accelperf-compare``): the throughput check becomes the paired comparison
    with the base revision (:mod:`pytest_accelperf.ab`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from pytest_accelperf.ab.rounds import ABMeasurement, Comparison
from pytest_accelperf.ab.verdict import ab_check, new_in_head, not_compared
from pytest_accelperf.checks.base import CheckResult, Verdict
from pytest_accelperf.contention import wait_for_quiet
from pytest_accelperf.run import Run

METRIC = "throughput"


@dataclass(frozen=True)
class Evaluated:
    """A run with its checks, before it is judged, recorded and gated. ``diffs``: how
    the environment differs from the baseline's (throughput then is ``incomparable``)."""

    run: Run
    block: dict[str, Any]
    baseline: dict[str, Any] | None
    checks: tuple[CheckResult, ...]
    diffs: tuple[str, ...] = ()
    state: Any = None  # the backend's final state of the training, when it returns one

    @property
    def throughput(self) -> CheckResult | None:
        return next((c for c in self.checks if c.metric == METRIC), None)

    def with_throughput(self, check: CheckResult | None, *, first: bool = False) -> Evaluated:
        """This result with its throughput check replaced by ``check`` (dropped when
        None), in its place; with ``first``, every throughput check is dropped and
        ``check`` goes before the others (where A/B mode shows its verdict)."""
        if first:
            others = tuple(c for c in self.checks if c.metric != METRIC)
            return replace(self, checks=(check, *others) if check is not None else others)
        current = self.throughput
        return replace(self, checks=tuple(
            c for c in ((check if c is current else c) for c in self.checks) if c is not None))


class Judge(Protocol):
    """One way to judge throughput: the evaluated result in, a new one out."""

    def __call__(self, evaluated: Evaluated, /) -> Evaluated: ...


class StoredBaseline:
    """The stored-baseline verdict stands, as :func:`~pytest_accelperf.checks.run_checks`
    gave it."""

    def __call__(self, evaluated: Evaluated) -> Evaluated:
        return evaluated


def _ratio_text(seen: Sequence[CheckResult]) -> str:
    ratios = [c.data.get("ratio") for c in seen]
    shown = ", ".join(f"{r:.2f}" for r in ratios if isinstance(r, float))
    return f"step-time ratio(s) {shown}" if shown else "no ratio"


@dataclass(frozen=True)
class Confirmation:
    """Re-measure an apparent throughput regression; it stands only if confirmed.

    One slow measurement on a shared machine is weak evidence: another job may have taken
    the cores for exactly those seconds. So a ``regression`` of throughput trains the case
    again (``remeasure``, up to ``times`` times, each after waiting for a machine where
    other processes use at most ``max_foreign_load`` cores); the first re-measurement that
    does not say ``regression`` decides, and its verdict is reported with a note of what
    the first measurement said.
    """

    remeasure: Callable[[], Evaluated]
    times: int
    max_foreign_load: float

    def __call__(self, first: Evaluated) -> Evaluated:
        __tracebackhide__ = True
        current = first.throughput
        if current is None or current.verdict is not Verdict.REGRESSION:
            return first
        seen = [current]
        evaluated = first
        backoff: list[str] = []
        for _ in range(self.times):
            waited, load = wait_for_quiet(self.max_foreign_load)
            if load is not None and waited >= 1.5:
                backoff.append(f"waited {waited:.0f} s for a quieter machine before "
                               f"re-measuring (then other processes used "
                               f"{load.foreign_cores:.2f} cores)")
            evaluated = self.remeasure()
            again = evaluated.throughput
            if again is None:
                return evaluated
            if again.verdict is not Verdict.REGRESSION:
                return evaluated.with_throughput(replace(
                    again,
                    detail=again.detail + (
                        f" (re-measured: a first measurement looked like a regression, "
                        f"{_ratio_text(seen)}; not confirmed"
                        f"{''.join('; ' + b for b in backoff)})"),
                    data={**again.data, "unconfirmed": [c.data.get("ratio") for c in seen]}))
            seen.append(again)
        final = evaluated.throughput
        assert final is not None
        return evaluated.with_throughput(replace(
            final,
            detail=final.detail + (f" (confirmed by {len(seen) - 1} re-measurement(s): "
                                   f"{_ratio_text(seen)}{''.join('; ' + b for b in backoff)})"),
            data={**final.data, "confirmations": [c.data.get("ratio") for c in seen]}))


@dataclass(frozen=True)
class ABComparison:
    """A/B mode: the throughput check becomes the paired comparison with the base revision.

    ``comparison()`` is the session's A/B setup (made on first use); ``rounds(comparison)``
    measures this case's alternating rounds (under the host lock) and returns ``(status,
    why, measurement)``; a :class:`~pytest_accelperf.ab.CompareError` from either goes to
    the caller. A case the base revision lacks is ``new``; one that cannot be compared
    keeps its stored-baseline check, with a note; a run that did not finish is not
    compared.
    """

    comparison: Callable[[], Comparison]
    rounds: Callable[[Comparison], tuple[str, str, ABMeasurement]]
    tolerance: float
    block: int
    max_foreign_load: float
    program_tolerance: float

    def __call__(self, evaluated: Evaluated) -> Evaluated:
        __tracebackhide__ = True
        if evaluated.run.outcome != "ok":
            return evaluated
        comparison = self.comparison()
        status, why, measured = self.rounds(comparison)
        stored = evaluated.throughput
        check: CheckResult | None
        if status == "ready":
            check = ab_check(comparison.label, measured, evaluated.run.samples_per_step,
                             self.tolerance, self.block, max_foreign_load=self.max_foreign_load,
                             program_tolerance=self.program_tolerance)
        elif status == "absent":
            check = new_in_head(comparison.label, why, stored)
        else:
            check = not_compared(comparison.label, why, stored)
        return evaluated.with_throughput(check, first=True)
