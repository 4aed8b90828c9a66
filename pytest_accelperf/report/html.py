"""One self-contained HTML file: the session's verdicts, with interactive plots.

Nothing to fetch: the file opens from a CI artifact, an e-mail or a disk with no network.
The plots are Vega-Lite specifications (:mod:`pytest_accelperf.report.charts`, the module
the published history's plots come from too), drawn in the browser by the library's
JavaScript (:mod:`pytest_accelperf.report.vegajs`), which the file carries once, gzipped
(0.3 MB of its 0.9 MB; the browser's DecompressionStream unpacks it). Sections: the verdict
counts; one row per case; samples/s per test across batch sizes and meshes, each bar with
the interval of its median step time; the trend over the stored history with its change
points; then each case (regressions first) with its checks, its loss within the baseline's
band, its step times and its memory per device and rank. Hovering a point or a bar shows
its numbers.
"""

from __future__ import annotations

import base64
import datetime as _dt
import gzip
import json
import math
import re
from collections.abc import Mapping, Sequence
from html import escape
from pathlib import Path
from typing import Any

from pytest_accelperf.provision.describe import stack_words
from pytest_accelperf.records.verdict import Verdict
from pytest_accelperf.report import charts
from pytest_accelperf.report.changes import STACK, ChangePoint, find_changes, worse
from pytest_accelperf.report.charts import Spec
from pytest_accelperf.report.data import CaseRecord, SessionReport
from pytest_accelperf.report.markdown import case_name, explanation, program_diff
from pytest_accelperf.report.pagejs import PAGE_JS
from pytest_accelperf.report.points import points_of
from pytest_accelperf.report.site import machine_name
from pytest_accelperf.report.terminal import fmt_change, fmt_value
from pytest_accelperf.report.vegajs import INSTALL as INSTALL
from pytest_accelperf.report.vegajs import ReportDependencyError as ReportDependencyError
from pytest_accelperf.report.vegajs import require_vega as require_vega
from pytest_accelperf.report.vegajs import vega_js
from pytest_accelperf.stats.median import median_interval

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
.chart { width: 100%; margin: 6px 0 14px; }
.row3 { display: grid; grid-template-columns: repeat(3, minmax(0, 1fr)); gap: 14px; }
.error { color: #a40e26; }
code { background: #f6f8fa; padding: 1px 4px; border-radius: 4px; }
"""


class _Specs:
    """The report's plots: each one's specification, and the element it is drawn into."""

    def __init__(self) -> None:
        self.specs: list[Spec] = []

    def div(self, spec: Spec | None, cls: str = "chart") -> str:
        if spec is None:
            return ""
        self.specs.append(spec)
        return f'<div class="{cls}" data-spec="{len(self.specs) - 1}"></div>'


def _round(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    v = float(value)
    return float(f"{v:.5g}") if math.isfinite(v) else None


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


def _floats(values: object) -> list[float]:
    """Finite floats of a list (NaN/inf are stored as strings in reports; they drop)."""
    out: list[float] = []
    for v in values if isinstance(values, list) else []:
        f = _round(v)
        if f is not None:
            out.append(f)
    return out


def _check_data(record: CaseRecord, metric: str) -> Mapping[str, Any]:
    for c in record.checks:
        if c.metric == metric:
            return c.data
    return {}


def loss_rows(record: CaseRecord) -> tuple[list[dict[str, object]], list[dict[str, object]]]:
    """This run's loss at each step, and the baseline's checkpoints with their band."""
    losses = record.run.get("losses") or []
    steps = record.run.get("loss_steps") or list(range(len(losses)))
    per_step: list[dict[str, object]] = [
        {"step": s, "loss": v} for s, raw in zip(steps, losses, strict=False)
        if (v := _round(raw)) is not None]
    band: list[dict[str, object]] = []
    for row in _check_data(record, "loss").get("checkpoints") or []:
        if len(row) >= 4 and all(_round(x) is not None for x in (row[0], row[1], row[3])):
            base, width = float(row[1]), float(row[3])
            band.append({"step": row[0], "baseline": _round(base), "band": _round(width),
                         "low": _round(base - width), "high": _round(base + width),
                         "now": _round(row[2])})
    return per_step, band


def _step_rows(record: CaseRecord) -> list[dict[str, object]]:
    base = ((record.baseline or {}).get("step_time") or {}).get("samples")
    rows: list[dict[str, object]] = []
    for which, values in (("baseline", base), ("this run", record.run.get("step_times"))):
        rows += [{"which": which, "ms": _round(t * 1e3)} for t in _floats(values)]
    return rows


def _device_order(label: str) -> tuple[str, int]:
    head = label.rstrip("0123456789")
    tail = label[len(head):]
    return head, int(tail) if tail else -1


def _memory_rows(record: CaseRecord) -> list[dict[str, object]]:
    now: Mapping[str, object] = record.run.get("memory_per_device") or {}
    base: Mapping[str, object] = (((record.baseline or {}).get("memory") or {})
                                  .get("per_device") or {})
    rows: list[dict[str, object]] = []
    for device in sorted(set(now) | set(base), key=_device_order):
        for which, source in (("baseline", base), ("this run", now)):
            value = _round(source.get(device))
            if value is not None:
                rows.append({"device": device, "which": which, "mib": _round(value / 2**20)})
    return rows


def _case_section(record: CaseRecord, specs: _Specs) -> list[str]:
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
    source = record.run.get("memory_source")
    plots = [specs.div(charts.loss_chart(*loss_rows(record)), "chart"),
             specs.div(charts.step_chart(_step_rows(record)), "chart"),
             specs.div(charts.memory_chart(
                 _memory_rows(record),
                 "peak memory per device and rank" + (f" ({source})" if source else "")),
                 "chart")]
    if any(plots):
        out.append('<div class="row3">' + "".join(p or "<div></div>" for p in plots)
                   + "</div>")
    return out


def _mesh_label(case: Mapping[str, object]) -> str:
    mesh = case.get("mesh")
    return ("mesh" + "x".join(str(n) for n in mesh) if mesh and isinstance(mesh, list | tuple)
            else "no mesh")


def _sps_interval(sps: float | None, step: object, samples: object
                  ) -> tuple[float | None, float | None]:
    """The samples/s interval of a median step time's interval: ``sps`` scaled by the
    median over each end."""
    median = _round(step)
    found = median_interval(_floats(samples))
    if sps is None or not median or found is None or found[0] <= 0:
        return None, None
    return _round(sps * median / found[1]), _round(sps * median / found[0])


def throughput_rows(records: Sequence[CaseRecord]) -> list[dict[str, object]]:
    """One test's samples/s of each case, the baseline's and this run's, each with the
    interval of its median step time."""
    rows: list[dict[str, object]] = []
    ordered = sorted(records, key=lambda r: (_mesh_label(r.case), str(r.case.get("batch"))))
    for r in ordered:
        label = f"{_mesh_label(r.case)} · b{r.case.get('batch', '?')}"
        base_block = r.baseline or {}
        step_block = base_block.get("step_time") or {}
        derived = r.run.get("derived") or {}
        for which, sps, step, samples in (
                ("baseline", _round(base_block.get("samples_per_second")),
                 step_block.get("median"), step_block.get("samples")),
                ("this run", _round(derived.get("samples_per_second")),
                 derived.get("median_step_time"), r.run.get("step_times"))):
            if not sps:
                continue
            if which == "baseline" and not step:
                samples_f = _floats(samples)
                step = sorted(samples_f)[len(samples_f) // 2] if samples_f else None
            lo, hi = _sps_interval(sps, step, samples)
            rows.append({"case": label, "which": which, "sps": sps, "lo": lo, "hi": hi,
                         "interval": "none" if lo is None else f"{lo:,.1f} to {hi:,.1f}/s"})
    return rows


def _throughput_section(records: list[CaseRecord], specs: _Specs) -> list[str]:
    groups: dict[str, list[CaseRecord]] = {}
    for r in records:
        groups.setdefault(r.nodeid.split("[", 1)[0], []).append(r)
    out: list[str] = []
    for test, members in sorted(groups.items()):
        out.append(specs.div(charts.throughput_chart(f"{test.split('::', 1)[-1]}: samples/s",
                                                     throughput_rows(members))))
    out = [o for o in out if o]
    if not out:
        return []
    return ["<h2>Throughput across batch sizes and meshes</h2>",
            '<p class="sub">This run against the stored baseline (grey); each bar\'s line is '
            "the 95% interval of its median step time.</p>", *out]


def _history_rows(entries: Sequence[Mapping[str, object]], orders: Mapping[str, int]
                  ) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for e in entries:
        interval = e.get("step_time_interval")
        lo = hi = None
        if isinstance(interval, list) and len(interval) == 2:
            lo, hi = _round(float(interval[0]) * 1e3), _round(float(interval[1]) * 1e3)
        step = _round(e.get("median_step_time"))
        commit = e.get("commit")
        name = str(e.get("nodeid", "")).split("::", 1)[-1]
        rows.append({"i": orders[str(e.get("session"))],
                     "case": name[name.find("[") + 1:-1] if name.endswith("]") else name,
                     "commit": (str(commit)[:9] + ("*" if e.get("dirty") else "")) if commit
                     else "?", "time": str(e.get("time", ""))[:16].replace("T", " "),
                     "branch": str(e.get("branch") or "?"), "machine": machine_name(e),
                     "verdict": str(e.get("verdict") or "-"),
                     "step": None if step is None else _round(step * 1e3), "lo": lo, "hi": hi})
    return rows


_KIND = {True: "worse", False: "better", None: "change"}


def _history_section(records: list[CaseRecord], history: Sequence[Mapping[str, object]],
                     specs: _Specs) -> list[str]:
    if not history:
        return []
    out = ["<h2>History</h2>",
           f'<p class="sub">{len(history)} entries over '
           f"{len({e.get('session') for e in history})} session(s); the step time of each "
           "session with its 95% interval as a band, the change points as dashed lines "
           "(<code>accelperf history publish</code> draws every case's history).</p>"]
    orders: dict[str, int] = {}
    for e in history:
        orders.setdefault(str(e.get("session")), len(orders))
    ours = {r.nodeid for r in records}
    changes = find_changes(points_of(e for e in history if e.get("nodeid") in ours))
    groups: dict[str, list[str]] = {}
    for r in records:
        groups.setdefault(r.nodeid.split("[", 1)[0], []).append(r.nodeid)
    for test, nodeids in sorted(groups.items()):
        members = set(nodeids)
        entries = [e for e in history if e.get("nodeid") in members]
        if len({e.get("session") for e in entries}) < 2:
            continue
        several = len(nodeids) > 1
        marks = [{"x": c.first_after.order - 0.5, "label": _mark_label(c, several),
                  "kind": "stack" if c.metric == STACK else "machine" if c.metric ==
                  "environment" else _KIND[worse(c)],
                  "metric": c.metric, "commits": c.commits, "how": c.sure, "bisect": "",
                  "machine": "?", "branch": "?", "dy": 2 + 11 * (k % 4)}
                 for k, c in enumerate(c for c in changes if c.nodeid in members)]
        spec = charts.history_chart(f"{test.split('::', 1)[-1]}: median step time over "
                                    f"sessions", "step", "ms per step",
                                    metrics=("throughput", "step time"),
                                    interval=("lo", "hi"), color="case")
        for m in marks:  # no filters in the report: every mark shown
            m["machine"] = m["branch"] = charts.ALL
        spec["datasets"] = {"sessions": _history_rows(entries, orders), "marks": marks}
        out.append(specs.div(spec))
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
    require_vega()
    specs = _Specs()
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
    body += _throughput_section(records, specs)
    body += _history_section(records, history or [], specs)
    body.append("<h2>Each case</h2>")
    for r in records:
        body += _case_section(r, specs)
    body += _scripts(specs.specs)
    return ("<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            '<link rel="icon" href="data:,">'  # served, no favicon.ico to miss
            f"<title>{escape(title)}</title><style>{_CSS}</style></head>\n<body>\n"
            + "\n".join(body) + "\n</body></html>\n")


def _scripts(specs: list[Spec]) -> list[str]:
    """The plots' specifications, the plotting library (gzipped, base64) and the page's
    script; nothing where there is no plot."""
    if not specs:
        return []
    text = json.dumps(specs, separators=(",", ":"), allow_nan=False)
    return [f'<script type="text/plain" id="accelperf-specs-gz">{_packed(text)}</script>',
            f'<script type="text/plain" id="accelperf-vega-gz">{_packed(vega_js())}</script>',
            f"<script>{PAGE_JS}</script>"]


def _packed(text: str) -> str:
    """``text`` gzipped and base64-encoded (the page unpacks it: :mod:`.pagejs`)."""
    return base64.b64encode(gzip.compress(text.encode(), 9, mtime=0)).decode()


def report_specs(page: str) -> list[Spec]:
    """The plots' specifications of a report :func:`html_report` wrote (for tests and
    tools that read a report's plots)."""
    found = re.search(r'id="accelperf-specs-gz">([A-Za-z0-9+/=]*)</script>', page)
    if found is None:
        return []
    specs: list[Spec] = json.loads(gzip.decompress(base64.b64decode(found.group(1))))
    return specs
