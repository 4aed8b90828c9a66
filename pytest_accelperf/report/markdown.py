"""The Markdown summary for a pull-request comment and the CI job summary.

Ordered by what a reviewer must act on: under the headline, one line for the whole suite
(how many cases regressed, and whether the timing regressions are more than chance would
give: :mod:`pytest_accelperf.checks.family`); then regressions (and errors), then improvements
(which ask for a baseline refresh), then checks that could not decide (inconclusive, new,
incomparable), then a folded ``<details>`` list of the cases that passed. Text only; the
plugin and ``accelperf report`` decide where it goes.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import cast

from pytest_accelperf.records.run import EXPLAIN_KEY, Explained
from pytest_accelperf.records.verdict import CheckResult, Verdict, count_changes
from pytest_accelperf.report.data import CaseRecord, SessionReport
from pytest_accelperf.report.terminal import fmt_change, fmt_value, suite_text
from pytest_accelperf.stats.units import fmt_bytes

#: Longest detail shown in a table cell; the JSON report has the rest.
MAX_DETAIL = 240

_CHECK_HEADERS = ("case", "metric", "baseline", "now", "change", "detail")


def cell(text: str) -> str:
    """``text`` made safe for one Markdown table cell (pipes escaped, one line)."""
    return " ".join(text.replace("|", "\\|").split())


def _short(text: str, limit: int = MAX_DETAIL) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def case_name(record: CaseRecord) -> str:
    """The test name with its case id, without the module path (``test_x[jax-nomesh-b8]``)."""
    return record.nodeid.split("::", 1)[-1]


def _table(headers: Iterable[str], rows: list[list[str]]) -> list[str]:
    headers = list(headers)
    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return out


def _check_row(record: CaseRecord, check: CheckResult) -> list[str]:
    return [f"`{case_name(record)}`", check.metric, fmt_value(check.baseline, check.unit),
            fmt_value(check.now, check.unit), fmt_change(check), _short(check.detail)]


def _checks_with(report: SessionReport, verdicts: tuple[Verdict, ...]) -> list[list[str]]:
    rows: list[list[str]] = []
    for record in report.sorted_records():
        rows += [_check_row(record, c) for c in record.checks if c.verdict in verdicts]
    return rows


def _metric(record: CaseRecord, key: str) -> float | None:
    derived = record.run.get("derived") or {}
    value = derived.get(key)
    return float(value) if isinstance(value, (int, float)) else None


def _pass_row(record: CaseRecord) -> list[str]:
    sps = _metric(record, "samples_per_second")
    peak = _metric(record, "peak_memory")
    losses = [x for x in record.run.get("losses") or [] if isinstance(x, (int, float))]
    target = (record.run.get("extra") or {}).get("compile_only")
    if target:  # no step executed: what steps measure was not run, never a pass
        return [f"`{case_name(record)}`", f"{record.run.get('outcome', '-')}, compile-only "
                f"({target})", "not run", "not run",
                fmt_bytes(int(peak)) if peak is not None else "-",
                ", ".join(c.metric for c in record.checks)]
    return [f"`{case_name(record)}`", str(record.run.get("outcome", "-")),
            f"{sps:,.1f}/s" if sps is not None else "-",
            f"{losses[-1]:.4g}" if losses else "-",
            fmt_bytes(int(peak)) if peak is not None else "-",
            ", ".join(c.metric for c in record.checks)]


def explanation(record: CaseRecord) -> Explained | None:
    """The profiler trace attached to a regressed case (:mod:`pytest_accelperf.gate.explain`),
    as the report's run holds it (the JSON of ``Run.explain``)."""
    found = (record.run.get("extra") or {}).get(EXPLAIN_KEY)
    return cast(Explained, found) if isinstance(found, dict) else None


def _kind(name: str) -> str:
    if name.startswith("collectives."):
        return "collective"
    if name == "matmul_dtypes":
        return "dtype"
    return "program"


def program_diff(record: CaseRecord) -> list[tuple[str, str, str, str]]:
    """The program changes of a case as ``(kind, what, baseline, now)``: the program check's
    gated quantities (FLOPs, collectives, matmul dtypes, counts), then the op histogram's
    largest moves (XLA's ops, torch's ops by dtype); in A/B mode, the two revisions'
    program diff as the throughput check words it (base against head)."""
    rows: list[tuple[str, str, str, str]] = []
    for check in record.checks:
        if check.metric == "program":
            for c in count_changes(check.data):
                rows.append((_kind(str(c["name"])), str(c["name"]), f"{c['baseline']:g}",
                             f"{c['now']:g}"))
            for c in check.data.get("op_changes") or []:
                rows.append(("op", str(c["name"]), f"{c['baseline']:g}", f"{c['now']:g}"))
        elif check.data.get("mode") == "ab":
            rows += [("A/B", str(line), "base", "head")
                     for line in check.data.get("program_diff") or []]
    return rows


def _explained_lines(report: SessionReport) -> list[str]:
    """Per regressed case: where its profiler trace is, and its program diff."""
    regressed = [r for r in report.sorted_records()
                 if any(c.verdict is Verdict.REGRESSION for c in r.checks)]
    traces = [[f"`{case_name(r)}`", f"`{found['path']}`" if found.get("path") else "-",
               (f"{found.get('steps')} step(s), {fmt_bytes(int(found.get('size') or 0))}"
                if found.get("path") else _short(str(found.get("note", ""))))]
              for r in regressed if (found := explanation(r)) is not None]
    diffs = [[f"`{case_name(r)}`", kind, f"`{what}`", b, n]
             for r in regressed for kind, what, b, n in program_diff(r)]
    lines: list[str] = []
    if traces:
        lines += ["### 🔎 Profiler traces of the regressions", "",
                  *_table(("case", "trace", "note"), traces), ""]
    if diffs:
        lines += ["### 🔎 Program diff of the regressions", "",
                  *_table(("case", "kind", "what", "baseline", "now"), diffs), ""]
    return lines


def headline(report: SessionReport) -> str:
    """One line: how many cases, on what, and the counts of check verdicts."""
    counts = report.counts()
    regressions = len(report.regressions) + len(report.errors) + sum(
        1 for r in report.records if r.error and not r.checks)
    status = ("❌ regression" if regressions else "✅ no regression")
    parts = [f"**{n} {v}**" if v == "regression" else f"{n} {v}"
             for v, n in counts.items() if n]
    errored = sum(1 for r in report.records if r.error)
    if errored:  # as the terminal's count line: a session of errors says so
        parts.append(f"**{errored} error{'s' if errored > 1 else ''}**")
    return (f"{status} · {len(report.records)} case(s) on `{report.platform or '?'}` · "
            f"checks: {', '.join(parts) or 'none ran'}")


def markdown(report: SessionReport, *, title: str = "accelperf",
             accept_hint: str | None = None) -> str:
    """The whole summary as Markdown text (ends with a newline).

    ``accept_hint`` is the command that accepts a regression (shown under the regressions),
    e.g. ``accelperf baselines accept accelperf.json --case PATTERN``.
    """
    lines = [f"## {title}", "", headline(report), ""]
    lines += [*(f"**{line}**" for line in report.stack_lines()),
              ""] if report.stacks() else []
    if report.records:
        lines += [f"Suite: {suite_text(report.suite())}", ""]
    regression_rows = _checks_with(report, (Verdict.REGRESSION,))
    errors = [r for r in report.sorted_records() if r.error and not r.checks]
    if regression_rows or errors or report.errors:
        lines += ["### ❌ Regressions", ""]
        rows = regression_rows + [
            [f"`{case_name(r)}`", "error", "-", "-", "-", _short(r.error or "")] for r in errors]
        if rows:
            lines += [*_table(_CHECK_HEADERS, rows), ""]
        lines += [f"- session error: {_short(e)}" for e in report.errors]
        if report.errors:
            lines.append("")
        if accept_hint and regression_rows:
            lines += [f"If a change is intended, accept it: `{accept_hint}`", ""]
        lines += _explained_lines(report)
    noisy = report.recorded_noisy
    if noisy:
        lines += ["### ⚠️ Recorded noisy", "",
                  "Too dispersed to be a level, and still so when re-measured "
                  "(`--accelperf-confirm` times): stored marked noisy, their throughput is "
                  "inconclusive until re-recorded with `--accelperf-update` on a quiet "
                  "machine.", "",
                  *_table(("case", "why"), [[f"`{case_name(r)}`", _short(r.recorded_noisy)]
                                            for r in noisy]), ""]
    sections = (
        ("### 🚀 Improvements", (Verdict.IMPROVEMENT,),
         "Faster or leaner than the baseline: refresh the baseline to lock the gain in."),
        ("### ❔ Inconclusive", (Verdict.INCONCLUSIVE,),
         "The noise was larger than the tolerance can resolve; nothing failed."),
        ("### 🆕 Not compared", (Verdict.NEW, Verdict.INCOMPARABLE),
         "No baseline yet, or one recorded in another environment."),
    )
    for heading, verdicts, note in sections:
        rows = _checks_with(report, verdicts)
        if rows:
            lines += [heading, "", note, "", *_table(_CHECK_HEADERS, rows), ""]
    passed = [r for r in report.sorted_records() if r.checks and r.verdict is Verdict.PASS]
    if passed:
        lines += [f"<details><summary>✅ {len(passed)} case(s) passed every check</summary>",
                  "",
                  *_table(("case", "outcome", "throughput", "final loss", "peak memory",
                           "checks"), [_pass_row(r) for r in passed]),
                  "", "</details>", ""]
    return "\n".join(lines).rstrip("\n") + "\n"
