"""One self-contained HTML file: the session's verdicts with plots embedded as base64 PNG.

No scripts, no fonts, no links to fetch: the file opens from a CI artifact, an e-mail or a
disk with no network. Sections: the verdict counts; one row per case; throughput across
batch sizes and meshes per test; the trend over the stored history with its change points;
then each case (regressions first) with its checks and its loss, step-time and memory plots.
"""

from __future__ import annotations

import base64
import datetime as _dt
import importlib.util
from collections.abc import Mapping, Sequence
from html import escape
from pathlib import Path

from pytest_accelperf.checks.base import Verdict
from pytest_accelperf.errors import UserError
from pytest_accelperf.provision.fingerprint import stack_words
from pytest_accelperf.report.changes import STACK, ChangePoint, find_changes, worse
from pytest_accelperf.report.data import CaseRecord, SessionReport
from pytest_accelperf.report.markdown import case_name, explanation, program_diff
from pytest_accelperf.report.points import points_of
from pytest_accelperf.report.terminal import fmt_change, fmt_value

INSTALL = "pip install 'pytest-accelperf[report]'"

_ORDER = (Verdict.REGRESSION, Verdict.IMPROVEMENT, Verdict.INCONCLUSIVE, Verdict.NEW,
          Verdict.INCOMPARABLE, Verdict.PASS)

_CSS = """
body { font: 14px/1.45 -apple-system, "Segoe UI", Helvetica, Arial, sans-serif;
       margin: 0 auto; max-width: 1320px; padding: 20px 28px; color: #1f2328; }
h1 { margin: 0 0 4px; font-size: 26px; }
h2 { margin-top: 34px; border-bottom: 1px solid #d0d7de; padding-bottom: 4px; }
h3 { margin: 26px 0 8px; font-size: 16px; }
.sub { color: #59636e; margin: 0 0 12px; }
.counts span { display: inline-block; margin: 0 6px 6px 0; padding: 3px 10px;
               border-radius: 12px; font-weight: 600; }
table { border-collapse: collapse; margin: 6px 0 10px; }
th, td { border: 1px solid #d0d7de; padding: 4px 8px; text-align: left; vertical-align: top; }
th { background: #f6f8fa; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
td.detail { max-width: 560px; color: #59636e; font-size: 12px; }
.v { font-weight: 600; border-radius: 4px; padding: 1px 6px; white-space: nowrap; }
.v-regression { background: #ffebe9; color: #a40e26; }
.v-improvement { background: #dafbe1; color: #116329; }
.v-inconclusive, .v-new, .v-incomparable { background: #fff8c5; color: #7d4e00; }
.v-pass { background: #eaeef2; color: #24292f; }
.v-error { background: #ffebe9; color: #a40e26; }
img { max-width: 100%; display: block; margin: 6px 0; border: 1px solid #eaeef2; }
.error { color: #a40e26; }
code { background: #f6f8fa; padding: 1px 4px; border-radius: 4px; }
"""


class ReportDependencyError(UserError, RuntimeError):
    """matplotlib is missing; the message says what to install."""


def require_matplotlib() -> None:
    if importlib.util.find_spec("matplotlib") is None:
        raise ReportDependencyError(f"the HTML report draws its plots with matplotlib, which "
                                    f"is not installed: {INSTALL}")


def _img(png: bytes, alt: str) -> str:
    data = base64.b64encode(png).decode("ascii")
    return f'<img alt="{escape(alt)}" src="data:image/png;base64,{data}">'


def _badge(verdict: str) -> str:
    text = verdict.upper() if verdict in ("regression", "error") else verdict
    return f'<span class="v v-{escape(verdict)}">{escape(text)}</span>'


def _anchor(record: CaseRecord) -> str:
    return "case-" + "".join(ch if ch.isalnum() else "-" for ch in record.nodeid)


def _record_verdict(record: CaseRecord) -> str:
    return "error" if record.error and not record.checks else record.verdict.value


def _sort_key(record: CaseRecord) -> tuple[int, str]:
    v = _record_verdict(record)
    rank = 0 if v == "error" else 1 + _ORDER.index(Verdict(v))
    return rank, record.nodeid


def _derived(record: CaseRecord, key: str) -> float | None:
    value = (record.run.get("derived") or {}).get(key)
    return float(value) if isinstance(value, (int, float)) else None


def _summary_table(records: list[CaseRecord]) -> list[str]:
    out = ["<table><tr><th>case</th><th>verdict</th><th>outcome</th><th>throughput</th>"
           "<th>median step</th><th>peak memory</th><th>checks</th></tr>"]
    for r in records:
        checks = ", ".join(f"{c.metric}: {c.verdict.value}" for c in r.checks) or "-"
        out.append(
            f'<tr><td><a href="#{_anchor(r)}">{escape(case_name(r))}</a></td>'
            f"<td>{_badge(_record_verdict(r))}</td>"
            f"<td>{escape(str(r.run.get('outcome', '-')))}</td>"
            f'<td class="num">{fmt_value(_derived(r, "samples_per_second"), "samples/s")}</td>'
            f'<td class="num">{fmt_value(_derived(r, "median_step_time"), "s")}</td>'
            f'<td class="num">{fmt_value(_derived(r, "peak_memory"), "bytes")}</td>'
            f'<td class="detail">{escape(checks)}</td></tr>')
    out.append("</table>")
    return out


def _explained(record: CaseRecord) -> list[str]:
    """A regressed case's profiler trace (a link) and program diff (a table)."""
    out: list[str] = []
    found = explanation(record)
    if found is not None:
        path = found.get("path")
        link = (f'<a href="{escape(Path(path).as_uri())}">{escape(path)}</a> · '
                if path else "")
        out.append(f'<p class="sub">Profiler trace: {link}{escape(str(found.get("note")))}'
                   f"</p>")
    regressed = any(c.verdict is Verdict.REGRESSION for c in record.checks)
    diff = program_diff(record) if regressed else []
    if diff:
        out.append("<table><tr><th>kind</th><th>program diff</th><th>baseline</th>"
                   "<th>now</th></tr>")
        out += [f'<tr><td>{escape(kind)}</td><td><code>{escape(what)}</code></td>'
                f'<td class="num">{escape(b)}</td><td class="num">{escape(n)}</td></tr>'
                for kind, what, b, n in diff]
        out.append("</table>")
    return out


def _case_section(record: CaseRecord) -> list[str]:
    from pytest_accelperf.report.plots import case_figure

    out = [f'<h3 id="{_anchor(record)}">{escape(case_name(record))} '
           f"{_badge(_record_verdict(record))}</h3>",
           f'<p class="sub"><code>{escape(record.nodeid)}</code> · platform '
           f"{escape(record.platform)} · worker {escape(record.worker)}</p>"]
    if record.error:
        out.append(f'<p class="error">{escape(record.error)}</p>')
    if record.checks:
        out.append("<table><tr><th>metric</th><th>baseline</th><th>now</th><th>change</th>"
                   "<th>verdict</th><th>detail</th></tr>")
        for c in record.checks:
            out.append(
                f"<tr><td>{escape(c.metric)}</td>"
                f'<td class="num">{escape(fmt_value(c.baseline, c.unit))}</td>'
                f'<td class="num">{escape(fmt_value(c.now, c.unit))}</td>'
                f'<td class="num">{escape(fmt_change(c))}</td>'
                f"<td>{_badge(c.verdict.value)}</td>"
                f'<td class="detail">{escape(c.detail)}</td></tr>')
        out.append("</table>")
    out += _explained(record)
    png = case_figure(record)
    if png:
        out.append(_img(png, f"loss, step time and memory of {case_name(record)}"))
    return out


def _throughput_section(records: list[CaseRecord]) -> list[str]:
    from pytest_accelperf.report.plots import throughput_figure

    groups: dict[str, list[CaseRecord]] = {}
    for r in records:
        groups.setdefault(r.nodeid.split("[", 1)[0], []).append(r)
    out: list[str] = []
    for test, members in sorted(groups.items()):
        png = throughput_figure(test.split("::", 1)[-1], members)
        if png:
            out.append(_img(png, f"throughput of {test} across batch sizes and meshes"))
    if not out:
        return []
    return ["<h2>Throughput across batch sizes and meshes</h2>",
            '<p class="sub">This run against the stored baseline (grey bars; dashed lines '
            "with hollow markers).</p>", *out]


def _history_section(records: list[CaseRecord], history: Sequence[Mapping[str, object]]
                     ) -> list[str]:
    from pytest_accelperf.report.plots import trend_figure

    if not history:
        return []
    out = ["<h2>History</h2>",
           f'<p class="sub">{len(history)} entries over '
           f"{len({e.get('session') for e in history})} session(s).</p>"]
    ours = {r.nodeid for r in records}
    changes = find_changes(points_of(e for e in history if e.get("nodeid") in ours))
    groups: dict[str, list[str]] = {}
    for r in records:
        groups.setdefault(r.nodeid.split("[", 1)[0], []).append(r.nodeid)
    for test, nodeids in sorted(groups.items()):
        platform_entries = [e for e in history if e.get("nodeid") in set(nodeids)]
        several = len(nodeids) > 1
        marks = [(c.first_after.session, _mark_label(c, several), worse(c))
                 for c in changes if c.nodeid in set(nodeids)]
        png = trend_figure(f"{test.split('::', 1)[-1]}: samples/s over sessions",
                           platform_entries, sorted(nodeids), marks=marks)
        if png:
            out.append(_img(png, f"throughput trend of {test}"))
    out += _changes_table(changes)
    return out


def _mark_label(change: ChangePoint, case: bool) -> str:
    """A change point's label on a trend plot: metric and change (and its case's id when
    the plot has several)."""
    pct, before, after = change.change, change.before, change.after
    text = change.metric
    if change.metric == STACK:  # the versions: stack: jax 0.8.3 → 0.10.2, ...
        text = stack_words(change.stack) or change.metric
    elif not change.significant:  # measured across a stack change, and not changed
        text += " no change"
    elif pct is not None:
        text += f" {pct * 100:+.0f}%"
    elif before is not None and after is not None:
        text += f" {before:g} → {after:g}"
    if case:
        name = change.nodeid.split("::", 1)[-1]
        text += f" [{name[name.find('[') + 1:-1] if name.endswith(']') else name}]"
    return text


def _changes_table(changes: list[ChangePoint]) -> list[str]:
    if not changes:
        return ['<p class="sub">No change point in the history of these cases '
                "(<code>accelperf history changes</code>).</p>"]
    out = [f"<h3>Change points ({len(changes)}; the last 50)</h3>" if len(changes) > 50
           else f"<h3>Change points ({len(changes)})</h3>",
           '<p class="sub">Deterministic fields (program, memory and loss that repeat) '
           "exactly; throughput where a new level held 3 sessions or more and the "
           "Mann-Whitney U test gives p at most 0.001. A change of the stack on the same "
           "machine (an upgrade) is listed with its versions, the throughput and step time "
           "measured across it (p above 0.001: no change). <code>accelperf history changes"
           "</code> lists the same.</p>",
           "<table><tr><th>case</th><th>metric</th><th>before → after</th><th>change</th>"
           "<th>commits</th><th>how sure</th></tr>"]
    for c in changes[-50:]:
        pct = c.change
        out.append(
            f"<tr><td>{escape(c.nodeid.split('::', 1)[-1])}</td><td>{escape(c.metric)}</td>"
            f'<td class="num">{escape(c.levels())}</td>'
            f'<td class="num">{"" if pct is None else f"{pct * 100:+.1f}%"}</td>'
            f"<td><code>{escape(c.commits)}</code></td><td>{escape(c.sure)}</td></tr>")
    out.append("</table>")
    return out
    return out


def html_report(report: SessionReport, *,
                history: Sequence[Mapping[str, object]] | None = None,
                title: str = "accelperf report",
                generated: _dt.datetime | None = None) -> str:
    """The whole report as one HTML document. ``history`` (entries of
    :func:`~pytest_accelperf.report.history.read_history`) adds the trend section with
    its change points (:mod:`pytest_accelperf.report.changes`)."""
    require_matplotlib()
    moment = (generated or _dt.datetime.now(_dt.timezone.utc)).replace(microsecond=0)
    records = sorted(report.records, key=_sort_key)
    counts = report.counts()
    env = report.environment.to_json()
    packages = ", ".join(f"{k} {v}" for k, v in sorted((env.get("packages") or {}).items()))
    body = [
        f"<h1>{escape(title)}</h1>",
        f'<p class="sub">{len(records)} case(s) on <b>{escape(report.platform or "?")}</b> '
        f"({escape(str(env.get('device_kind', report.accel or '?')))}"
        f"{', ' + escape(packages) if packages else ''}) · generated "
        f"{escape(moment.isoformat())}{' · baselines updated' if report.update else ''}</p>",
        '<div class="counts">' + "".join(
            f'<span class="v-{escape(v)}">{n} {escape(v)}</span>'
            for v, n in counts.items() if n) + "</div>",
    ]
    body += [f'<p class="sub"><b>{escape(line)}</b></p>' for line in report.stack_lines()]
    body += [f'<p class="error">session error: {escape(e)}</p>' for e in report.errors]
    body += [f'<p class="error">recorded noisy: <code>{escape(case_name(r))}</code>: '
             f"{escape(r.recorded_noisy)}; stored marked noisy, its throughput inconclusive "
             f"until re-recorded with <code>--accelperf-update</code> on a quiet machine</p>"
             for r in report.recorded_noisy]
    body += ["<h2>Cases</h2>", *_summary_table(records)]
    body += _throughput_section(records)
    body += _history_section(records, history or [])
    body.append("<h2>Each case</h2>")
    for r in records:
        body += _case_section(r)
    return ("<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{escape(title)}</title><style>{_CSS}</style></head>\n<body>\n"
            + "\n".join(body) + "\n</body></html>\n")
