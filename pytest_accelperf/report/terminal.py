"""The terminal summary: one table row per check, then counts. Lines only; no printing here.

What a row shows beyond its numbers is the check's to say (the table of checks,
:mod:`pytest_accelperf.checks.table`): its label, whether its change is the gate's
estimate, and rows under it (:class:`pytest_accelperf.checks.protocol.Check`)."""

from __future__ import annotations

import math

from tabulate import tabulate

from pytest_accelperf.checks.family import SuiteVerdict, Tally
from pytest_accelperf.checks.memory import MAX_DEVICE_ROWS as MAX_DEVICE_ROWS
from pytest_accelperf.checks.table import check_of
from pytest_accelperf.records.verdict import CheckResult
from pytest_accelperf.report.data import SessionReport
from pytest_accelperf.stats.bootstrap import MIN_SESSIONS
from pytest_accelperf.stats.units import fmt_value as fmt_value

HEADERS = ("case", "metric", "baseline", "now", "change", "verdict")


def fmt_change(check: CheckResult) -> str:
    return "-" if check.change is None else f"{check.change * 100:+.1f}%"


#: Marks a throughput change that is not simply now / baseline (see :func:`adjusted`).
ADJUSTED = "*"


def adjusted(check: CheckResult) -> bool:
    """Whether a check's change is the gate's estimate rather than now over the baseline
    column (:meth:`pytest_accelperf.checks.protocol.Check.adjusted`): a throughput change
    corrected by the drift probe or taken against the mean level of the baseline's
    sessions, or a compile time corrected for the machine's speed by the probe."""
    return check.change is not None and check_of(check.metric).adjusted(check)


def sub_rows(check: CheckResult) -> list[tuple[str, ...]]:
    """The rows under a check's own (:meth:`pytest_accelperf.checks.protocol.Check.
    sub_rows`): a ``memory`` check's one per device where their peaks differ, up to
    :data:`MAX_DEVICE_ROWS`; under a compile-only case's ``outcome``, the checks it did not
    run (``not run``, never ``pass``)."""
    return [("", row.label, fmt_value(row.baseline, row.unit), fmt_value(row.now, row.unit),
             "-" if row.change is None else f"{row.change * 100:+.1f}%", row.verdict)
            for row in check_of(check.metric).sub_rows(check)]


def metric_label(check: CheckResult) -> str:
    """The metric column of a check's row (:meth:`pytest_accelperf.checks.protocol.Check.
    label`): the ``memory`` row names the method that counted this run's peak
    (``memory (mem_tracker)``), the ``input`` row of an input-bound case says in how many
    steps the batch took longer to make than the step (``input (bound 38/40)``), a
    compile-only case's ``outcome`` row its target (``outcome (compile-only tpu-v5e:2x4)``)."""
    return check_of(check.metric).label(check)


def table_lines(report: SessionReport) -> list[str]:
    rows: list[tuple[str, ...]] = []
    for record in report.sorted_records():
        name = record.nodeid.split("::", 1)[-1]
        if record.error and not record.checks:
            rows.append((name, "error", "-", "-", "-", record.error.splitlines()[0][:60]))
        for i, check in enumerate(record.checks):
            rows.append((
                name if i == 0 else "",
                metric_label(check),
                fmt_value(check.baseline, check.unit),
                fmt_value(check.now, check.unit),
                fmt_change(check) + (ADJUSTED if adjusted(check) else ""),
                check.verdict.value.upper() if check.failed else check.verdict.value,
            ))
            rows.extend(sub_rows(check))
    if not rows:
        return []
    lines = tabulate(rows, headers=HEADERS, tablefmt="simple", disable_numparse=True).splitlines()
    if any(adjusted(c) for r in report.records for c in r.checks):
        lines.append(f"{ADJUSTED} the gate's estimate (drift-corrected and/or against the "
                     f"baseline's session mean), not now/baseline: see the check's detail")
    lines.append("")
    lines.append(f"accelperf: suite: {suite_text(report.suite())}")
    lines.append(f"accelperf: {len(report.records)} case(s) on {report.platform}: "
                 f"{count_text(report)}")
    lines.extend(f"accelperf: {line}" for line in report.stack_lines())
    for path in report.written:
        lines.append(f"accelperf: baselines written to {path}")
    lines.extend(session_lines(report))
    return lines


def count_text(report: SessionReport) -> str:
    """The verdicts of the session's checks and its errored cases, counted: ``2 pass,
    1 new, 1 error``; what happened when no check ran at all (every case errored)."""
    parts = [f"{n} {v}" for v, n in report.counts().items() if n]
    errors = sum(1 for r in report.records if r.error)
    if errors:
        parts.append(f"{errors} error" + ("s" if errors > 1 else ""))
    return ", ".join(parts) or "no checks ran"


def session_lines(report: SessionReport) -> list[str]:
    """After ``--accelperf-add-session``: how many sessions the written baselines now hold,
    and whether that is enough for the between-session spread to count (3)."""
    counts = sorted(len(sessions) for r in report.records if r.block is not None
                    for sessions in [(r.block.get("step_time") or {}).get("sessions") or []]
                    if len(sessions) > 1)
    if not counts:
        return []
    held = str(counts[0]) if counts[0] == counts[-1] else f"{counts[0]}-{counts[-1]}"
    line = f"accelperf: {len(counts)} case(s) now hold {held} baseline sessions"
    short = sum(1 for n in counts if n < MIN_SESSIONS)
    if short:
        line += (f"; {short} hold fewer than the {MIN_SESSIONS} from which their spread "
                 f"counts: run --accelperf-add-session again in a new session")
    else:
        line += "; their spread now widens the throughput interval"
    return [line]


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def _qs(values: list[float], *, bound: str) -> str:
    """q-values in words: each of up to three; past that, the bound (``<=`` the largest or
    ``>=`` the smallest)."""
    if len(values) <= 3:
        return "q = " + ", ".join(f"{q:.2g}" for q in values)
    return f"q <= {max(values):.2g}" if bound == "max" else f"q >= {min(values):.2g}"


def _metrics(tally: Tally) -> str:
    return ", ".join(m if n == 1 else f"{m} x{n}" for m, n in tally.by_metric)


def _up(x: float, digits: int = 2) -> str:
    """``x`` >= 0 rounded *up* to ``digits`` significant digits (a bound stays a bound)."""
    if x <= 0:
        return "0"
    scale = 10.0 ** (math.floor(math.log10(x)) - digits + 1)
    value = math.ceil(x / scale * (1 - 1e-12)) * scale
    return f"{value:.0f}" if value >= 10 ** digits else f"{value:.{digits}g}"


def _percent(p: float) -> str:
    """A bound on a chance as a percentage, rounded up: whole percents, two significant
    digits below 1 %."""
    percent = p * 100
    if percent >= 1:
        return f"{math.ceil(percent * (1 - 1e-12))}%"
    return f"{_up(percent)}%"


def suite_text(suite: SuiteVerdict) -> str:
    """The session as one verdict, in one line (:mod:`pytest_accelperf.checks.family`): how many
    cases regressed; how many timing checks gave a verdict from an interval, how many false
    alarms chance would give them at most, and whether the timing regressions hold at the
    suite's false-discovery rate; the regressions of the other checks, counted.

    ``1 of 12 cases regressed; 24 timing checks with an interval (at most 0.6 false alarms
    expected by chance, P(>=1) <= 46%): 1 regression, which holds at a 5% false discovery
    rate (q = 0.0004); 36 deterministic checks: 1 regression (program)``

    The expected false alarms and the chance are bounds, and are rounded up (two
    significant digits; whole percents from 1 %)."""
    parts = [f"{suite.regressed_cases} of {_plural(suite.cases, 'case')} regressed"]
    m, k = len(suite.tested), len(suite.regressions)
    if not m:
        parts.append("no timing check with an interval")
    else:
        chance = (f"at most {_up(suite.expected_false)} false alarms expected by chance, "
                  f"P(>={suite.at_least}) <= {_percent(suite.p_at_least)}")
        fdr = f"{suite.fdr:.0%} false discovery rate"
        held = [t.q_value for t in suite.held]
        not_held = [t.q_value for t in suite.not_held]
        if not k:
            verdict = "no regression"
        elif not not_held:
            which = "which holds" if k == 1 else "all of which hold"
            verdict = (f"{_plural(k, 'regression')}, {which} at a {fdr} "
                       f"({_qs(held, bound='max')})")
        elif not held:
            which = "which does not hold" if k == 1 else "none of which holds"
            verdict = (f"{_plural(k, 'regression')}, {which} at a {fdr} "
                       f"({_qs(not_held, bound='min')})")
        else:
            verdict = (f"{_plural(k, 'regression')}: {len(held)} "
                       f"{'holds' if len(held) == 1 else 'hold'} at a {fdr} "
                       f"({_qs(held, bound='max')}), {len(not_held)} "
                       f"{'does' if len(not_held) == 1 else 'do'} not "
                       f"({_qs(not_held, bound='min')})")
        parts.append(f"{_plural(m, 'timing check')} with an interval ({chance}): {verdict}")
    if suite.set_aside:
        parts.append(f"{_plural(suite.set_aside, 'timing check')} set aside, which cannot "
                     f"regress (measured beside another job, or against a noisy baseline)")
    other = suite.other_timing
    if other.regressions:
        parts.append(f"{_plural(other.regressions, 'timing regression')} without an interval "
                     f"({_metrics(other)})")
    fixed = suite.deterministic
    parts.append(f"{_plural(fixed.checks, 'deterministic check')}: " + (
        f"{_plural(fixed.regressions, 'regression')} ({_metrics(fixed)})" if fixed.regressions
        else "no regression"))
    return "; ".join(parts)
