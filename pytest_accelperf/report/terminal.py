"""The terminal summary: one table row per check, then counts. Lines only; no printing here."""

from __future__ import annotations

from tabulate import tabulate

from pytest_accelperf.checks.base import CheckResult
from pytest_accelperf.report.data import SessionReport
from pytest_accelperf.units import fmt_bytes

HEADERS = ("case", "metric", "baseline", "now", "change", "verdict")


def fmt_value(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "bytes":
        return fmt_bytes(int(value))
    if unit == "samples/s":
        return f"{value:,.1f}/s"
    if unit == "s":
        return f"{value * 1e3:.2f} ms"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.4g}"


def fmt_change(check: CheckResult) -> str:
    return "-" if check.change is None else f"{check.change * 100:+.1f}%"


def table_lines(report: SessionReport) -> list[str]:
    rows: list[tuple[str, ...]] = []
    for record in report.sorted_records():
        name = record.nodeid.split("::", 1)[-1]
        if record.error and not record.checks:
            rows.append((name, "error", "-", "-", "-", record.error.splitlines()[0][:60]))
        for i, check in enumerate(record.checks):
            rows.append((
                name if i == 0 else "",
                check.metric,
                fmt_value(check.baseline, check.unit),
                fmt_value(check.now, check.unit),
                fmt_change(check),
                check.verdict.value.upper() if check.failed else check.verdict.value,
            ))
    if not rows:
        return []
    lines = tabulate(rows, headers=HEADERS, tablefmt="simple", disable_numparse=True).splitlines()
    counts = ", ".join(f"{n} {v}" for v, n in report.counts().items() if n)
    lines.append("")
    lines.append(f"accelperf: {len(report.records)} case(s) on {report.platform}: {counts}")
    for path in report.written:
        lines.append(f"accelperf: baselines written to {path}")
    return lines
