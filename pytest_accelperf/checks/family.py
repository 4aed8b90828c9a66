"""One verdict for the whole suite: how many cases regressed, and whether the timing
regressions are more than chance would give for that many checks.

A session judges many cases, and every timing check is a statistical test: with 24 of them
at 95 % intervals, a false alarm somewhere is no rare event. Per-case verdicts (and test
outcomes) stay as the checks gave them; this module only reads them, to say at the top of a
report what a reviewer needs (:func:`suite_verdict`):

*Statistical* checks are those whose verdict comes from an interval on a timing (kind
``interval`` in the table of checks, :attr:`pytest_accelperf.checks.protocol.Check.kind`):
``throughput`` (stored-baseline mode: ``data["ratio"]``, ``data["ci"]``,
``data["confidence"]``; A/B mode the same, with ``data["mode"] == "ab"``) and ``input``
(``data["ratio"]``, ``data["ci_low"]``, ``data["ci_high"]``). A timing check with such an
interval that was set aside, and so could not have regressed (measured beside another job,
``data["contaminated"]``; against a baseline stored marked noisy,
``data["noisy_baseline"]``; a verdict only the drift probe gave, ``data["probe_only"]``),
is counted apart (:attr:`SuiteVerdict.set_aside`). Timing checks without an interval
(kind ``timing``: ``compile``, one sample against a fixed threshold; ``scaling``; a timing
check that was ``new``, ``incomparable`` or not measured) are counted apart too: no
false-alarm rate can be stated for them. Every other check (outcome, loss, step metrics,
program, memory, numerics, reference, max batch, a hook's own) is *deterministic* here, and
only counted.

For each statistical check, a one-sided p-value for "no slowdown" (H0: ratio <= 1) is
recovered from its interval (:func:`p_value`); Benjamini-Hochberg q-values across the
session's statistical checks control the false-discovery rate
(:func:`q_values`, ``scipy.stats.false_discovery_control``): a timing regression *holds at
the suite's FDR* of 5 % when its q-value is at most 0.05. The verdict of a statistical check
needs its interval's low end above 1, which for a calibrated interval happens with
probability at most ``(1 - confidence) / 2`` when the code did not slow down: that is the
per-check false-alarm bound, their sum the number of false alarms to expect at most
(:func:`expected_false`), and a binomial tail the chance of at least ``k`` by chance alone
(:func:`p_at_least`).

Everything here is a pure function over frozen data.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from pytest_accelperf.checks.table import check_of
from pytest_accelperf.records.suite import SuiteJson, TallyJson, TestedJson
from pytest_accelperf.records.verdict import CheckResult, Verdict
from pytest_accelperf.stats.bootstrap import _scipy_stats

#: The suite's false-discovery rate: a timing regression whose q-value is at most this holds.
FDR = 0.05
#: The confidence of an interval whose check did not store one (the input check before it
#: did: :func:`pytest_accelperf.stats.bootstrap.step_time_ratio`'s default).
DEFAULT_CONFIDENCE = 0.95
#: The data keys that mark a timing check whose interval was set aside (see the module).
SET_ASIDE_KEYS = ("contaminated", "noisy_baseline", "probe_only")


class Case(Protocol):
    """What this module reads of a case record
    (:class:`pytest_accelperf.report.data.CaseRecord`)."""

    @property
    def nodeid(self) -> str: ...

    @property
    def checks(self) -> Sequence[CheckResult]: ...


@dataclass(frozen=True)
class Interval:
    """The interval of one statistical check: ``ratio`` (> 1: slower) within
    ``[low, high]`` at ``confidence``; ``df``: the degrees of freedom of a Student-t
    interval (A/B mode over ``df + 1`` process pairs), None for a normal-theory or bootstrap
    one."""

    ratio: float
    low: float
    high: float
    confidence: float = DEFAULT_CONFIDENCE
    df: int | None = None

    @property
    def false_alarm_rate(self) -> float:
        """The chance, at most, that this check regresses on code that did not slow down:
        its interval's low end lies above 1 with probability ``(1 - confidence) / 2``."""
        return (1 - self.confidence) / 2


@dataclass(frozen=True)
class Tested:
    """A statistical check of the session: where it is (``case``, ``check``: positions in
    the records and in that record's checks), its interval, whether it regressed, its
    p-value and its Benjamini-Hochberg q-value across the session."""

    case: int
    check: int
    nodeid: str
    metric: str
    interval: Interval
    regressed: bool
    p_value: float
    q_value: float

    def to_json(self) -> TestedJson:
        iv = self.interval
        return {"nodeid": self.nodeid, "metric": self.metric, "ratio": iv.ratio,
                "ci": [iv.low, iv.high], "confidence": iv.confidence, "df": iv.df,
                "p_value": self.p_value, "q_value": self.q_value}


@dataclass(frozen=True)
class Tally:
    """Checks of one kind that are only counted: how many, and the regressions by metric."""

    checks: int = 0
    by_metric: tuple[tuple[str, int], ...] = ()

    @property
    def regressions(self) -> int:
        return sum(n for _, n in self.by_metric)

    def to_json(self) -> TallyJson:
        return {"checks": self.checks, "regressions": self.regressions,
                "by_metric": dict(self.by_metric)}


@dataclass(frozen=True)
class SuiteVerdict:
    """The session as one verdict (see the module docstring)."""

    cases: int
    regressed_cases: int
    tested: tuple[Tested, ...]
    set_aside: int
    other_timing: Tally
    deterministic: Tally
    fdr: float = FDR

    @property
    def regressions(self) -> tuple[Tested, ...]:
        """The statistical checks that regressed."""
        return tuple(t for t in self.tested if t.regressed)

    @property
    def held(self) -> tuple[Tested, ...]:
        """The timing regressions that hold at the suite's false-discovery rate."""
        return tuple(t for t in self.regressions if t.q_value <= self.fdr)

    @property
    def not_held(self) -> tuple[Tested, ...]:
        return tuple(t for t in self.regressions if t.q_value > self.fdr)

    @property
    def rates(self) -> tuple[float, ...]:
        return tuple(t.interval.false_alarm_rate for t in self.tested)

    @property
    def expected_false(self) -> float:
        """False alarms to expect at most among the statistical checks, by chance alone."""
        return expected_false(self.rates)

    @property
    def at_least(self) -> int:
        """The count whose chance :attr:`p_at_least` gives: the regressions seen, or 1
        when there are none (the chance of any false alarm)."""
        return max(len(self.regressions), 1)

    @property
    def p_at_least(self) -> float:
        """The chance, at most, of :attr:`at_least` timing regressions or more among the
        statistical checks by chance alone."""
        return p_at_least(self.at_least, self.rates)

    def to_json(self) -> SuiteJson:
        return {
            "cases": self.cases,
            "regressed": self.regressed_cases,
            "statistical": {
                "checks": len(self.tested),
                "set_aside": self.set_aside,
                "regressions": len(self.regressions),
                "expected_false": self.expected_false,
                "at_least": self.at_least,
                "p_at_least": self.p_at_least,
                "fdr": self.fdr,
                "held": [t.to_json() for t in self.held],
                "not_held": [t.to_json() for t in self.not_held],
            },
            "other_timing": self.other_timing.to_json(),
            "deterministic": self.deterministic.to_json(),
        }


def _positive(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) and number > 0 else None


def _degrees_of_freedom(data: Mapping[str, object]) -> int | None:
    """A/B mode over several process pairs has a Student-t interval with one degree of
    freedom fewer than the pairs its rounds came from
    (:func:`pytest_accelperf.stats.bootstrap.process_ratio`); otherwise None."""
    if data.get("mode") != "ab":
        return None
    pairs = data.get("pairs")
    if isinstance(pairs, list) and pairs:
        k = len({p for p in pairs if isinstance(p, int)})
    else:
        processes = data.get("processes")
        k = processes if isinstance(processes, int) and not isinstance(processes, bool) else 1
    return k - 1 if k > 1 else None


def interval(check: CheckResult) -> Interval | None:
    """The interval a statistical check's verdict came from, or None: a check of another
    metric, one without an interval (``new``, ``incomparable``, an input change under the
    floor), or one with a malformed interval."""
    if check_of(check.metric).kind != "interval":
        return None
    data = check.data
    low: float | None
    high: float | None
    if isinstance(data.get("ci"), list | tuple) and len(data["ci"]) == 2:
        low, high = data["ci"]
    else:
        low, high = data.get("ci_low"), data.get("ci_high")
    ratio, lo, hi = _positive(data.get("ratio")), _positive(low), _positive(high)
    if ratio is None or lo is None or hi is None or lo > hi:
        return None
    confidence = data.get("confidence", DEFAULT_CONFIDENCE)
    if isinstance(confidence, bool) or not isinstance(confidence, int | float) \
            or not 0 < confidence < 1:
        return None
    return Interval(ratio, lo, hi, float(confidence), _degrees_of_freedom(data))


def set_aside(check: CheckResult) -> bool:
    """Whether a timing check's interval was set aside, so that it could not regress
    (measured beside another job, against a noisy baseline, a probe-only verdict)."""
    return any(check.data.get(key) for key in SET_ASIDE_KEYS)


def p_value(iv: Interval) -> float:
    """The one-sided p-value of "no slowdown" (H0: ratio <= 1) recovered from an interval.

    The interval is read as symmetric in log space: the standard error of the log ratio is
    ``se = (ln high - ln low) / (2 q)``, ``q`` the normal quantile of the interval's
    two-sided confidence (Student's t with ``df`` degrees of freedom for an A/B interval
    over process pairs), and ``p = 1 - CDF(ln ratio / se)`` of the same distribution. An
    approximation: a bootstrap interval need not be symmetric, and the bootstrap's own
    distribution is not kept. A zero-width interval (every sample alike): 0 when the ratio
    is above 1, else 1.

    >>> round(p_value(Interval(1.0, 0.9, 1.1)), 3)
    0.5
    >>> round(p_value(Interval(1.1, 1.1 / 1.2, 1.1 * 1.2)), 4)  # ln 1.1 / (ln 1.2 / 1.96)
    0.1528
    >>> p_value(Interval(1.2, 1.2, 1.2)), p_value(Interval(1.0, 1.0, 1.0))
    (0.0, 1.0)
    """
    width = math.log(iv.high) - math.log(iv.low)
    center = math.log(iv.ratio)
    if width <= 0:
        return 0.0 if center > 0 else 1.0
    stats = _scipy_stats()
    level = 0.5 + iv.confidence / 2
    if iv.df is None:
        se = width / (2 * float(stats.norm.ppf(level)))
        return float(stats.norm.sf(center / se))
    se = width / (2 * float(stats.t.ppf(level, iv.df)))
    return float(stats.t.sf(center / se, iv.df))


def q_values(p_values: Sequence[float]) -> tuple[float, ...]:
    """Benjamini-Hochberg q-values (adjusted p-values) of ``p_values``, in their order
    (``scipy.stats.false_discovery_control``); a check whose q-value is at most the rate
    ``alpha`` is a discovery at false-discovery rate ``alpha``."""
    if not p_values:
        return ()
    adjusted = _scipy_stats().false_discovery_control(list(p_values), method="bh")
    return tuple(float(q) for q in adjusted)


def expected_false(rates: Iterable[float]) -> float:
    """The number of false alarms to expect at most, by chance alone, from checks with these
    per-check false-alarm bounds: their sum."""
    return float(sum(rates))


def p_at_least(k: int, rates: Sequence[float]) -> float:
    """The chance, at most, of ``k`` or more false alarms among checks with these per-check
    bounds: the binomial tail ``P(X >= k)``, ``X ~ Binomial(len(rates), max(rates))``
    (``scipy.stats.binom.sf``); with equal rates (every interval at one confidence) this is
    exact for checks at their bound, and with unequal ones the largest rate bounds them
    all."""
    if k <= 0:
        return 1.0
    if not rates or k > len(rates):
        return 0.0
    return float(_scipy_stats().binom.sf(k - 1, len(rates), max(rates)))


def suite_verdict(records: Sequence[Case], *, fdr: float = FDR) -> SuiteVerdict:
    """The session's ``records`` as one verdict (positions in :class:`Tested` refer to
    ``records`` in the order given)."""
    found: list[tuple[int, int, str, str, Interval, bool]] = []
    aside = 0
    other_checks = deterministic_checks = 0
    other: Counter[str] = Counter()
    fixed: Counter[str] = Counter()
    for i, record in enumerate(records):
        for j, check in enumerate(record.checks):
            failed = check.verdict is Verdict.REGRESSION
            iv = interval(check)
            if iv is not None and (failed or not set_aside(check)):
                found.append((i, j, record.nodeid, check.metric, iv, failed))
            elif iv is not None:
                aside += 1
            elif check_of(check.metric).kind != "deterministic":
                other_checks += 1
                other[check.metric] += failed
            else:
                deterministic_checks += 1
                fixed[check.metric] += failed
    ps = [p_value(f[4]) for f in found]
    qs = q_values(ps)
    tested = tuple(Tested(i, j, nodeid, metric, iv, failed, p, q)
                   for (i, j, nodeid, metric, iv, failed), p, q in zip(found, ps, qs,
                                                                       strict=True))
    return SuiteVerdict(
        cases=len(records),
        regressed_cases=sum(1 for r in records
                            if any(c.verdict is Verdict.REGRESSION for c in r.checks)),
        tested=tested,
        set_aside=aside,
        other_timing=Tally(other_checks, _regressions(other)),
        deterministic=Tally(deterministic_checks, _regressions(fixed)),
        fdr=fdr,
    )


def _regressions(counter: Counter[str]) -> tuple[tuple[str, int], ...]:
    return tuple(sorted((metric, n) for metric, n in counter.items() if n))
