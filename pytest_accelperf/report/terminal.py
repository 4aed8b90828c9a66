"""The terminal summary: one table row per check, then counts. Lines only; no printing here."""

from __future__ import annotations

from tabulate import tabulate

from pytest_accelperf.checks.base import CheckResult
from pytest_accelperf.report.data import SessionReport
from pytest_accelperf.stats import MIN_SESSIONS
from pytest_accelperf.units import fmt_bytes, fmt_flops

HEADERS = ("case", "metric", "baseline", "now", "change", "verdict")


def fmt_value(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "bytes":
        return fmt_bytes(int(value))
    if unit == "samples/s":
        return f"{value:,.1f}/s"
    if unit == "s":  # a compile time: 18.02 ms, 2.34 s
        return f"{value * 1e3:.2f} ms" if abs(value) < 1 else f"{value:.2f} s"
    if unit == "flop":
        return fmt_flops(value)
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.4g}"


def fmt_change(check: CheckResult) -> str:
    return "-" if check.change is None else f"{check.change * 100:+.1f}%"


#: Marks a throughput change that is not simply now / baseline (see :func:`adjusted`).
ADJUSTED = "*"


def adjusted(check: CheckResult) -> bool:
    """Whether a check's change is the gate's estimate rather than now over the baseline
    column: a throughput change corrected by the drift probe or taken against the mean
    level of the baseline's sessions, or a compile time corrected for the machine's speed
    by the probe."""
    if check.change is None:
        return False
    if check.metric == "compile":
        return str(check.data.get("correction", "")).startswith("corrected")
    if check.metric != "throughput" or check.data.get("mode") == "ab":
        return False
    return bool(check.data.get("drift_corrected")) or check.data.get("session_sd") is not None


#: Most devices listed one row each under a ``memory`` row (seed 002's eight GPU columns).
MAX_DEVICE_ROWS = 8


def device_rows(check: CheckResult) -> list[tuple[str, ...]]:
    """Per-device sub-rows of a ``memory`` check: one per device (or rank) when their peaks
    differ, up to :data:`MAX_DEVICE_ROWS`; none when every device holds the same bytes (the
    check's own row already says it) or when there are more devices than that."""
    per = check.data.get("per_device") or {}
    if check.metric != "memory" or not 1 < len(per) <= MAX_DEVICE_ROWS:
        return []
    rows: list[tuple[str, ...]] = []
    seen: set[tuple[object, object]] = set()
    for label, value in per.items():
        if isinstance(value, dict):
            base, now, ratio = value.get("baseline"), value.get("now"), value.get("ratio")
        else:
            base, now, ratio = None, value, None
        seen.add((base, now))
        change = "-" if not isinstance(ratio, float) else f"{(ratio - 1) * 100:+.1f}%"
        rows.append(("", f"  {label}", fmt_value(base, "bytes"), fmt_value(now, "bytes"),
                     change, ""))
    return rows if len(seen) > 1 else []


def metric_label(check: CheckResult) -> str:
    """The metric column of a check's row: the ``memory`` row names the method that counted
    this run's peak (``memory (mem_tracker)``, ``memory (profiler)``), so a case whose
    counting method changed is never silent about it; the ``input`` row of an input-bound
    case says in how many steps the batch took longer to make than the step
    (``input (bound 38/40)``)."""
    if check.metric == "input":
        bound, steps = check.data.get("input_bound_steps"), check.data.get("steps")
        if isinstance(bound, int) and bound > 0 and isinstance(steps, int):
            return f"input (bound {bound}/{steps})"
        return check.metric
    source = check.data.get("source") if check.metric == "memory" else None
    return f"{check.metric} ({source})" if isinstance(source, str) and source else check.metric


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
            rows.extend(device_rows(check))
    if not rows:
        return []
    lines = tabulate(rows, headers=HEADERS, tablefmt="simple", disable_numparse=True).splitlines()
    if any(adjusted(c) for r in report.records for c in r.checks):
        lines.append(f"{ADJUSTED} the gate's estimate (drift-corrected and/or against the "
                     f"baseline's session mean), not now/baseline: see the check's detail")
    lines.append("")
    lines.append(f"accelperf: {len(report.records)} case(s) on {report.platform}: "
                 f"{count_text(report)}")
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
