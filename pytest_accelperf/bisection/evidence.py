"""What one session says of its commit against GOOD (see :mod:`pytest_accelperf.bisection`):
``bad``, ``good``, or ``skip`` with why, and the evidence in words.

Two kinds of evidence, both read from checks the plugin made in the session:

* **the program** (:func:`judge_program`): the ``program`` check against GOOD's recorded
  baseline (FLOPs, bytes, collectives, host callbacks and syncs, matmul dtypes, graph
  breaks, recompiles: :mod:`pytest_accelperf.records.program`) and the ``memory`` check where both
  peaks are the compiler's plan (``memory_analysis``). Exact: the same on every run of
  unchanged code. A commit is bad when one of the fields that BAD made worse is worse than
  GOOD's in it too (a count at all, an amount past the program or memory tolerance).
* **timing** (:func:`judge_timing`): the ``throughput`` check of A/B mode, the commit's
  working tree against GOOD (:mod:`pytest_accelperf.ab.verdict`): its paired step-time
  ratio and 95 % interval. BAD is judged by A/B mode's own verdict: ``regression`` is bad.
  A commit between is judged against BAD's ratio ``r``: bad when the whole interval lies
  above ``sqrt(r)`` (halfway from GOOD to BAD, in ratio), good when it lies below, and
  skipped when it straddles it, or the measurement was contaminated. (A/B's ``pass`` is
  not enough there: a ratio within a tolerance of half BAD's slowdown, with an interval
  that still reaches BAD's level, says nothing of which side the commit is on; measured
  on this machine, such a ``pass`` was the culprit.)
* **the making of the batch** (:func:`judge_host`): where A/B mode finds BAD's step time no
  worse but BAD's session against GOOD's recording regressed on ``input`` (the CPU time
  making each batch) or ``input_wait`` (the time that thread was blocked: a sleep, a slow
  read), which no A/B step time includes, each commit's session against GOOD's recording,
  with the check's own ratio and interval judged against halfway to BAD's ratio, as timing
  is; a change under the check's floor is at GOOD's level (good), a measurement beside
  another job is skipped.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from pytest_accelperf.bisection.trial import Session
from pytest_accelperf.records.program import describe_changes
from pytest_accelperf.records.verdict import CheckResult, Verdict, count_changes
from pytest_accelperf.report.data import CaseRecord
from pytest_accelperf.report.terminal import fmt_change, fmt_value
from pytest_accelperf.stats.units import (
    fmt_bytes,
    fmt_percent,
    fmt_ratio,
    fmt_signed_percent,
    fmt_tolerance,
)

#: ``good`` and ``bad`` against GOOD; ``same``: BAD's program is GOOD's (timing decides);
#: ``skip``: the session cannot say; ``reference``: GOOD's own session.
Call = Literal["good", "bad", "same", "skip", "reference"]
#: The deterministic regressions a bisection follows: ``(node id, metric)`` -> the fields
#: BAD made worse (``flops``, ``collectives.all-gather.count``, ``memory plan``).
Targets = Mapping[tuple[str, str], frozenset[str]]
#: The field name of a worse memory plan.
MEMORY_PLAN = "memory plan"
#: Program differences shown in a step's evidence.
SHOWN = 3


@dataclass(frozen=True)
class Judgement:
    """A commit against GOOD: the call and its evidence in words. ``levels``: for BAD's
    timing call of bad, the step-time ratio of each case that made it bad."""

    call: Call
    evidence: str
    levels: Mapping[str, float] = field(default_factory=dict)
    #: Timing: every case was faster than GOOD (an ``improvement``).
    faster: bool = False


def _name(nodeid: str, many: bool) -> str:
    return f"{nodeid.rsplit('::', 1)[-1]}: " if many else ""


def _unusable(record: CaseRecord) -> str:
    """Why a case's run says nothing of its program or speed (it did not finish)."""
    outcome = record.run.get("outcome")
    if outcome == "ok":
        return ""
    message = str(record.run.get("message") or record.error or "").strip().splitlines()
    return f"its run ended {outcome}" + (f": {message[0][:160]}" if message else "")


# -- the program -------------------------------------------------------------------------
def deterministic_checks(record: CaseRecord) -> dict[str, CheckResult]:
    """The checks of a case that read the compiled program: ``program``, and ``memory``
    where this run's peak and the baseline's are both the compiler's plan."""
    out: dict[str, CheckResult] = {}
    for check in record.checks:
        if check.metric == "program":
            out["program"] = check
        elif (check.metric == "memory" and not check.data.get("leak")
              and check.data.get("source") == "memory_analysis"
              and check.data.get("baseline_source") == "memory_analysis"):
            out["memory"] = check
    return out


def worse_fields(check: CheckResult) -> frozenset[str]:
    """The fields a deterministic check found worse than the baseline (GOOD's)."""
    if check.verdict is not Verdict.REGRESSION:
        return frozenset()
    if check.metric == "memory":
        return frozenset({MEMORY_PLAN})
    return frozenset(c["name"] for c in count_changes(check.data)
                     if float(c["now"] or 0.0) > float(c["baseline"] or 0.0))


def _program_words(check: CheckResult, good: Mapping[str, Any] | None) -> str:
    """A deterministic check's finding in words: the program's changes against GOOD's
    (:func:`~pytest_accelperf.records.program.describe_changes`), or the memory plan's."""
    if check.metric == "memory":
        return _memory_words(check)
    now = check.data.get("program")
    if not good or not isinstance(now, Mapping):
        return check.detail
    lines = describe_changes(good, now, float(check.data.get("tolerance", 0.0)))
    if not lines:
        return "same program as GOOD"
    more = f" (+{len(lines) - SHOWN} more)" if len(lines) > SHOWN else ""
    return "; ".join(lines[:SHOWN]) + more


def _memory_words(check: CheckResult) -> str:
    """``memory plan: 74.03 KiB → 230.03 KiB (+210.7%)``, or ``memory plan the same``."""
    if check.baseline is None or check.now is None:
        return f"{MEMORY_PLAN}: {check.detail}"
    if check.baseline == check.now:
        return f"{MEMORY_PLAN} the same"
    change = check.now / check.baseline - 1 if check.baseline else float("inf")
    return (f"{MEMORY_PLAN}: {fmt_bytes(check.baseline)} \u2192 {fmt_bytes(check.now)} "
            f"({fmt_signed_percent(change)})")


def _ordered(checks: Mapping[str, CheckResult]) -> list[tuple[str, CheckResult]]:
    """The program's check before the memory plan's."""
    return sorted(checks.items(), key=lambda item: item[0] != "program")


def program_targets(bad: Session, good_programs: Mapping[str, Mapping[str, Any]]
                    ) -> tuple[Targets, Judgement]:
    """What BAD's session made worse than GOOD in its programs, and BAD's call: ``bad``
    with the changes, else ``same`` (or ``good`` with what got less); ``skip`` when no
    case's program could be compared with GOOD's (each case's reason in the evidence:
    its run did not finish, or its check was ``incomparable``), since "same program" would
    then be said of programs never compared. Either way the search goes on in A/B mode."""
    targets: dict[tuple[str, str], frozenset[str]] = {}
    words: list[str] = []
    #: Why a case's program was not compared with GOOD's (its run did not finish, it has
    #: no program record, or its check could not compare): "same" is said only of
    #: programs that were compared.
    uncompared: list[str] = []
    compared = False
    many = len(bad.cases) > 1
    for nodeid, record in sorted(bad.cases.items()):
        why = _unusable(record)
        if why:
            uncompared.append(_name(nodeid, True) + why)
            continue
        checks = deterministic_checks(record)
        if "program" not in checks:
            uncompared.append(_name(nodeid, True) + "no program check")
        for metric, check in _ordered(checks):
            fields = worse_fields(check)
            if fields:
                targets[(nodeid, metric)] = fields
            if check.verdict in (Verdict.REGRESSION, Verdict.IMPROVEMENT):
                words.append(_name(nodeid, many)
                             + _program_words(check, good_programs.get(nodeid)))
            if check.verdict in (Verdict.PASS, Verdict.REGRESSION, Verdict.IMPROVEMENT):
                compared = True
            else:
                uncompared.append(f"{_name(nodeid, True)}{metric} {check.verdict}: "
                                  f"{check.detail}")
    if targets:
        return targets, Judgement("bad", "; ".join(words))
    if words:
        return targets, Judgement("good", "less than GOOD: " + "; ".join(words))
    if not compared:
        return targets, Judgement("skip", "program not compared with GOOD's: "
                                  + "; ".join(uncompared))
    same = "same program and memory plan as GOOD"
    return targets, Judgement("same", same + (f" (not compared: {'; '.join(uncompared)})"
                                              if uncompared else ""))


def judge_program(session: Session, targets: Targets,
                  good_programs: Mapping[str, Mapping[str, Any]]) -> Judgement:
    """A commit's call on the fields BAD made worse (``targets``): ``bad`` when one of
    them is worse than GOOD's here too, ``good`` when none is, ``skip`` when a case did
    not run or its program cannot be compared."""
    if session.why:
        return Judgement("skip", session.why)
    many = len({nodeid for nodeid, _ in targets}) > 1
    bad_words: list[str] = []
    good_words: list[str] = []
    for (nodeid, metric), fields in sorted(targets.items(),
                                           key=lambda t: (t[0][0], t[0][1] != "program")):
        record = session.cases.get(nodeid)
        if record is None:
            return Judgement("skip", f"{_name(nodeid, True)}not collected at this commit")
        why = _unusable(record)
        check = deterministic_checks(record).get(metric)
        if why or check is None:
            return Judgement("skip", _name(nodeid, many) + (why or f"no {metric} record"))
        if check.verdict is Verdict.INCOMPARABLE:
            return Judgement("skip", _name(nodeid, many) + check.detail)
        text = _name(nodeid, many) + _program_words(check, good_programs.get(nodeid))
        (bad_words if worse_fields(check) & fields else good_words).append(text)
    if bad_words:
        return Judgement("bad", "; ".join(bad_words))
    return Judgement("good", "; ".join(good_words))


def _levels(check: CheckResult) -> str:
    """``input 0.30 ms → 5.45 ms``: a check's metric, its baseline and its value now."""
    return (f"{check.metric} {fmt_value(check.baseline, check.unit)} \u2192 "
            f"{fmt_value(check.now, check.unit)}")


def unsearched_regressions(session: Session) -> list[tuple[str, str]]:
    """The regressions of a session against GOOD's recording that the bisection does not
    search on: not the program or the compiler's memory plan (the search on the record),
    nor the stored-baseline throughput (A/B mode measures the step time afresh), but, e.g.,
    ``input``, the making of the batch, which is timed apart from the step and so is in no
    A/B step time, or memory that torch counted. Each as its metric and in words:
    ``("input", "input 0.30 ms → 5.45 ms (+1706.8%)")``."""
    many = len(session.cases) > 1
    out: list[tuple[str, str]] = []
    for nodeid, record in sorted(session.cases.items()):
        if _unusable(record):
            continue
        searched = deterministic_checks(record)
        for check in record.checks:
            if (check.verdict is Verdict.REGRESSION and check.metric != "throughput"
                    and searched.get(check.metric) is not check):
                if check.baseline is None or check.now is None:
                    # No figure to show (the parameter fingerprint): the check's own words.
                    words = f"{check.metric} ({check.detail})"
                else:  # no change where the baseline was nothing (0 ms blocked)
                    words = _levels(check) + (f" ({fmt_change(check)})"
                                              if check.change is not None else "")
                out.append((check.metric, _name(nodeid, many) + words))
    return out


# -- the making of the batch -------------------------------------------------------------
#: The checks of the making of the batch, timed apart from the step (no A/B step time
#: includes them): a bisection follows their interval in sessions against GOOD's recording.
HOST_METRICS = ("input", "input_wait")


def host_targets(bad: Session) -> dict[tuple[str, str], float]:
    """``{(node id, metric): BAD's ratio to GOOD}`` of the :data:`HOST_METRICS` checks that
    BAD's session against GOOD's recording found a ``regression``."""
    out: dict[tuple[str, str], float] = {}
    for nodeid, record in sorted(bad.cases.items()):
        if _unusable(record):
            continue
        for check in record.checks:
            ratio = check.data.get("ratio")
            if (check.metric in HOST_METRICS and check.verdict is Verdict.REGRESSION
                    and isinstance(ratio, int | float)):
                out[(nodeid, check.metric)] = float(ratio)
    return out


def _interval(ratio: float, low: float, high: float) -> str:
    """A host check's ratio to GOOD with its interval: ``3.85x, 95% CI 0.91-9.70``."""
    return f"{fmt_ratio(ratio)}x, 95% CI {fmt_ratio(low)}\u2013{fmt_ratio(high)}"


def unjudged_host(bad: Session) -> list[str]:
    """The :data:`HOST_METRICS` checks of BAD's session against GOOD's recording that
    measured a slowdown but did not judge it a ``regression``, in words: measured beside
    another job (``input_wait``'s guard), ``input_wait 0.06 ms → 8.08 ms (other processes
    used ...)``; or too noisy to resolve (``inconclusive`` with its ratio above 1),
    ``input_wait 2.10 ms → 8.08 ms (3.85x, 95% CI 0.91-9.70: too noisy to judge)``."""
    many = len(bad.cases) > 1
    out: list[str] = []
    for nodeid, record in sorted(bad.cases.items()):
        for check in record.checks:
            if check.metric not in HOST_METRICS:
                continue
            data = check.data
            loaded, ratio = data.get("contaminated"), data.get("ratio")
            low, high = data.get("ci_low"), data.get("ci_high")
            if loaded and data.get("measured_verdict") == Verdict.REGRESSION.value:
                out.append(f"{_name(nodeid, many)}{_levels(check)} ({loaded})")
            elif (check.verdict is Verdict.INCONCLUSIVE and not loaded
                  and isinstance(ratio, int | float) and ratio > 1
                  and isinstance(low, int | float) and isinstance(high, int | float)):
                out.append(f"{_name(nodeid, many)}{_levels(check)} "
                           f"({_interval(ratio, low, high)}: too noisy to judge)")
    return out


def judge_host(session: Session, levels: Mapping[tuple[str, str], float]) -> Judgement:
    """A commit between, from its session against GOOD's recording: for each ``(node id,
    metric)`` BAD regressed (``levels``: BAD's ratio), ``bad`` when the check's interval
    lies above the halfway ratio, ``good`` when every one lies below it or the change is
    under the check's floor (not judged: at GOOD's level), else ``skip`` (it straddles it,
    or was measured beside another job)."""
    if session.why:
        return Judgement("skip", session.why)
    many = len({nodeid for nodeid, _ in levels}) > 1
    calls: list[Call] = []
    words: list[str] = []
    for (nodeid, metric), level in sorted(levels.items()):
        record = session.cases.get(nodeid)
        if record is None:
            return Judgement("skip", f"{_name(nodeid, True)}not collected at this commit")
        check = next((c for c in record.checks if c.metric == metric), None)
        why = _unusable(record) or ("" if check is not None else f"no {metric} check")
        if why or check is None:
            return Judgement("skip", _name(nodeid, many) + why)
        data, mid = check.data, halfway(level)
        shown = _levels(check)
        low, high = data.get("ci_low"), data.get("ci_high")
        if data.get("contaminated"):
            calls.append("skip")
            words.append(f"{_name(nodeid, many)}{shown}: measured beside another job")
        elif isinstance(low, int | float) and isinstance(high, int | float):
            where = "above" if low > mid else "below" if high < mid else "straddles"
            calls.append("bad" if where == "above" else "good" if where == "below"
                         else "skip")
            words.append(f"{_name(nodeid, many)}{shown} "
                         f"({_interval(float(data['ratio']), low, high)}): {where} "
                         f"{fmt_ratio(mid)}, halfway to BAD's {fmt_ratio(level)}")
        elif check.verdict is Verdict.PASS:  # under the floor from which it is judged
            calls.append("good")
            words.append(f"{_name(nodeid, many)}{shown}: under the floor from which it is "
                         f"judged, at GOOD's level")
        else:
            calls.append("skip")
            words.append(f"{_name(nodeid, many)}{shown}: {check.verdict.value}")
    call: Call = ("bad" if "bad" in calls else "good" if all(c == "good" for c in calls)
                  else "skip")
    return Judgement(call, "; ".join(words))


# -- timing ------------------------------------------------------------------------------
def ab_check(record: CaseRecord) -> CheckResult | None:
    """The case's A/B throughput check, if it was compared."""
    return next((c for c in record.checks
                 if c.metric == "throughput" and c.data.get("mode") == "ab"), None)


def halfway(level: float) -> float:
    """The ratio halfway from GOOD (1) to BAD's ``level``, in log-ratio (A/B mode
    averages log-ratios): a commit between is bad above it, good below.

    >>> round(halfway(1.21), 3)
    1.1
    """
    return math.sqrt(level)


def timing_words(check: CheckResult, level: float | None = None) -> str:
    """``step time +20.3% (95% CI 1.18-1.23, 40 rounds)``, with the tolerance (BAD) or
    where the interval lies against the halfway ratio (a commit between)."""
    data = check.data
    low, high = (float(x) for x in data.get("ci") or (math.nan, math.nan))
    text = (f"step time {fmt_signed_percent(float(data['ratio']) - 1)} (95% CI "
            f"{fmt_ratio(low)}\u2013{fmt_ratio(high)}, {data.get('rounds')} rounds")
    if data.get("contaminated"):
        return text + "): contaminated (other processes used the CPU during the rounds)"
    if level is None:
        text += f", tolerance {fmt_tolerance(float(data['tolerance']))})"
        if check.verdict is Verdict.INCONCLUSIVE:
            text += f": inconclusive, smallest detectable change ±{fmt_percent(data['mdc'])}"
        return text
    mid = halfway(level)
    where = "above" if low > mid else "below" if high < mid else "straddles"
    return (f"{text}): {where} {fmt_ratio(mid)}, halfway to BAD's {fmt_ratio(level)}")


def _call(check: CheckResult, level: float) -> Call:
    """A commit between GOOD and BAD, from its A/B interval against the halfway ratio."""
    if check.data.get("contaminated"):
        return "skip"
    low, high = (float(x) for x in check.data.get("ci") or (math.nan, math.nan))
    mid = halfway(level)
    return "bad" if low > mid else "good" if high < mid else "skip"


def judge_timing(session: Session, levels: Mapping[str, float] | Collection[str]
                 ) -> Judgement:
    """A commit's call from its A/B comparison with GOOD. BAD's (``levels`` the node ids
    to compare): ``bad`` when a case is a ``regression`` (the levels: their ratios),
    ``good`` when every one is ``pass`` or ``improvement`` (``faster`` when every one is
    an improvement), else ``skip``. A commit between (``levels``: BAD's ratio of each case
    it regressed): ``bad`` when a case's interval lies above the halfway ratio, ``good``
    when every one lies below, else ``skip``."""
    if session.why:
        return Judgement("skip", session.why)
    between = isinstance(levels, Mapping)
    many = len(levels) > 1
    words: list[str] = []
    calls: list[Call] = []
    verdicts: list[Verdict] = []
    bad_levels: dict[str, float] = {}
    for nodeid in sorted(levels):
        record = session.cases.get(nodeid)
        if record is None:
            return Judgement("skip", f"{_name(nodeid, True)}not collected at this commit")
        why = _unusable(record)
        check = ab_check(record)
        if why or check is None:
            stored = next((c for c in record.checks if c.metric == "throughput"), None)
            note = stored.data.get("ab") if stored else None
            skipped = note["skipped"] if note else None
            return Judgement("skip", _name(nodeid, many)
                             + (why or f"not compared in A/B mode: {skipped or 'no check'}"))
        if isinstance(levels, Mapping):
            level = float(levels[nodeid])
            calls.append(_call(check, level))
            words.append(_name(nodeid, many) + timing_words(check, level))
            continue
        verdicts.append(check.verdict)
        words.append(_name(nodeid, many) + timing_words(check))
        if check.verdict is Verdict.REGRESSION:
            bad_levels[nodeid] = float(check.data["ratio"])
    text = "; ".join(words)
    if between:
        call: Call = ("bad" if "bad" in calls else "good" if all(c == "good" for c in calls)
                      else "skip")
        return Judgement(call, text)
    if bad_levels:
        return Judgement("bad", text, levels=bad_levels)
    if all(v in (Verdict.PASS, Verdict.IMPROVEMENT) for v in verdicts):
        return Judgement("good", text, faster=all(v is Verdict.IMPROVEMENT for v in verdicts))
    return Judgement("skip", text)
