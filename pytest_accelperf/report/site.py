"""``accelperf history publish``: the run history as a static site, one page per case.

The site is one folder that works opened from disk (``file://``) and served (a CI artifact,
GitHub Pages): ``index.html`` (every case: a sparkline of its step time, its latest verdict
and its machine, filters for machine and branch), ``cases/<case>.html`` (the case over the
sessions: step time with each session's interval as a band, compile time, memory per
device, FLOPs, bytes and host syncs, the final loss; change points, stack changes and
machine changes marked, each with its ``accelperf bisect`` command), and three files every
page shares: ``vega.js`` (the plotting library, :mod:`pytest_accelperf.report.vegajs`),
``accelperf.js`` (:mod:`pytest_accelperf.report.pagejs`) and ``accelperf.css``. A case's
data sits in its page as columns (a repeated value as one run), so that the page opens
from disk, where a script may not fetch a file.

Bad input: a history line that is not JSON or not a history entry of this schema version is
skipped and counted, one line per file naming it and its lines. The output folder is
marked with ``.accelperf-site.json`` (the files the command wrote); a folder that exists
without it, and is not empty, is refused, and no file of the user's is overwritten.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import operator
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from html import escape
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from pytest_accelperf.errors import UserError
from pytest_accelperf.report.changes import ENVIRONMENT, STACK, ChangePoint, find_changes, worse
from pytest_accelperf.report.charts import (
    ALL,
    Spec,
    history_chart,
    memory_history_chart,
    sparkline,
)
from pytest_accelperf.report.history import (
    HISTORY_SCHEMA_VERSION,
    history_files,
    read_bytes,
)
from pytest_accelperf.report.pagejs import PAGE_JS
from pytest_accelperf.report.points import Point, line_stack, point
from pytest_accelperf.store.jsonfile import atomic_write
from pytest_accelperf.store.machines import default_machine
from pytest_accelperf.store.schema import HistoryShown

MARKER = ".accelperf-site.json"
GENERATOR = "accelperf history publish"
#: The most sessions an index sparkline draws (the latest).
SPARK_SESSIONS = 200

CSS = """
body { font: 14px/1.45 -apple-system, "Segoe UI", Helvetica, Arial, sans-serif;
       margin: 0 auto; max-width: 1320px; padding: 20px 28px; color: #1f2328; }
h1 { margin: 0 0 4px; font-size: 24px; } h2 { margin-top: 28px; font-size: 18px; }
.sub { color: #59636e; margin: 0 0 12px; }
table { border-collapse: collapse; margin: 6px 0 10px; }
th, td { border: 1px solid #d0d7de; padding: 3px 8px; text-align: left; vertical-align: middle; }
th { background: #f6f8fa; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
.v { font-weight: 600; border-radius: 4px; padding: 1px 6px; white-space: nowrap; }
.v-regression, .v-error { background: #ffebe9; color: #a40e26; }
.v-improvement { background: #dafbe1; color: #116329; }
.v-inconclusive, .v-new, .v-incomparable { background: #fff8c5; color: #7d4e00; }
.v-pass { background: #eaeef2; color: #24292f; }
.chart { width: 100%; margin: 8px 0 18px; }
.filters { margin: 10px 0; } .filters select { margin-right: 14px; }
code { background: #f6f8fa; padding: 1px 4px; border-radius: 4px; font-size: 12px; }
svg.spark { display: block; }
#accelperf-index td, #accelperf-index th { white-space: nowrap; }
.warn { color: #7d4e00; }
"""


class SiteError(UserError):
    """What ``accelperf history publish`` cannot do; the message names the fix."""


@dataclass
class Skipped:
    """The lines of one history file that were skipped."""

    path: Path
    lines: list[int] = field(default_factory=list)
    reasons: set[str] = field(default_factory=set)

    def line(self) -> str:
        shown = ", ".join(str(n) for n in self.lines[:10])
        more = f" and {len(self.lines) - 10} more" if len(self.lines) > 10 else ""
        return (f"skipped {len(self.lines)} line(s) of {self.path} (line {shown}{more}: "
                f"{', '.join(sorted(self.reasons))})")


class SiteLine(HistoryShown):
    """What the site reads of a history line: :class:`~pytest_accelperf.store.schema.
    HistoryShown` (the numbers change points are found in and the few fields more that
    its pages show), validated from the line's bytes; the rest (the environment, 1 KB of a
    1.4 KB line) is not built (:attr:`History.raws` keeps the bytes)."""

    def get(self, key: str, default: object = None) -> Any:  # noqa: ANN401 (a line's JSON)
        """A field by name, as of the line's dict (None: ``default``)."""
        value = getattr(self, key, None)
        return default if value is None else value

    def __getitem__(self, key: str) -> Any:  # noqa: ANN401
        return getattr(self, key)


@dataclass
class History:
    """The lines read, oldest first, their points (what change points are found in), and
    what was skipped."""

    entries: list[SiteLine]
    points: list[Point]
    skipped: list[Skipped]
    #: Each entry's bytes, for what only its environment says (the accelerator; the machine
    #: of a line written before its hash was kept).
    raws: list[bytes] = field(default_factory=list)


def _files(paths: Sequence[Path]) -> list[Path]:
    out: list[Path] = []
    for path in paths:
        if path.is_dir():
            out += history_files(path)
        elif path.is_file():
            out.append(path)
        else:
            raise SiteError(f"{path}: no history file or directory; write one with pytest "
                            f"--accelperf-history=DIR")
    return list(dict.fromkeys(out))


def _reason(raw: bytes, exc: ValidationError) -> str:
    """Why a line is skipped, in a word or three."""
    if exc.errors(include_url=False)[0]["type"] == "json_invalid":
        return "not JSON"
    try:
        item = json.loads(raw)
    except ValueError:
        return "not JSON"
    version = item.get("schema_version", 1) if isinstance(item, dict) else None
    if version is not None and version != HISTORY_SCHEMA_VERSION:
        return f"schema version {version}, not {HISTORY_SCHEMA_VERSION}"
    return "not a history entry"


def read_lines(paths: Sequence[Path]) -> History:
    """Every history line of ``paths`` (``--accelperf-history`` directories or their
    ``.jsonl`` files), oldest first; a line that is not JSON, not a history entry, or of
    another schema version is skipped and counted. Each line is validated as a
    :class:`SiteLine` from its bytes (50,000 lines of 1.4 KB in about 1.5 s of CPU; the
    whole-line schema took 4 s more, for fields a page does not show)."""
    pairs: list[tuple[SiteLine, Point, bytes]] = []
    skipped: list[Skipped] = []
    validate = SiteLine.model_validate_json
    stacks: dict[str, dict[str, object]] = {}
    for path in _files(paths):
        bad = Skipped(path)
        for n, raw in enumerate(read_bytes(path).splitlines(), start=1):
            if not raw.strip():
                continue
            try:
                e = validate(raw)
            except ValidationError as exc:
                bad.lines.append(n)
                bad.reasons.add(_reason(raw, exc))
                continue
            versions = None
            if e.stack is not None:  # read from the environment once per stack
                versions = stacks.get(e.stack)
                if versions is None:
                    item = json.loads(raw)
                    versions = stacks[e.stack] = line_stack(item)
            pairs.append((e, point(e, versions), raw))
        if bad.lines:
            skipped.append(bad)
    pairs.sort(key=lambda p: (p[1].time, p[1].session))  # stable: a session in file order
    return History([p[0] for p in pairs], [p[1] for p in pairs], skipped,
                   [p[2] for p in pairs])


# -- what a line says --------------------------------------------------------------------------
def _environment(raw: bytes) -> object:
    item = json.loads(raw)
    return item.get("environment") if isinstance(item, dict) else None


#: The derived machine name of each machine hash seen (a hash names one host: the name is
#: read from the environment of its first line only).
_NAMES: dict[str, str] = {}


def machine_name(line: Mapping[str, Any] | SiteLine, raw: bytes | None = None) -> str:
    """The machine a line ran on, as the history gives it: its ``machine_name`` (the
    session's ``--accelperf-machine``, else the name the store derives from the host); for
    a line written before machines were named, that derived name from its environment
    (:func:`pytest_accelperf.store.machines.default_machine`: ``amd-epyc-1f0e9a3c``)."""
    name = line.get("machine_name")
    if isinstance(name, str) and name:
        return name
    key = line.get("machine") or line.get("fingerprint")
    if isinstance(key, str) and key in _NAMES:
        return _NAMES[key]
    env = _environment(raw) if raw is not None else line.get("environment")
    found = (default_machine(env) if isinstance(env, dict)
             else f"host-{str(key or 'unknown')[:8]}")
    if isinstance(key, str):
        _NAMES[key] = found
    return found


def _revision(line: Mapping[str, Any] | SiteLine) -> str:
    commit = line.get("commit")
    return (str(commit)[:9] + ("*" if line.get("dirty") else "")) if commit else "?"


def _num(value: object, scale: float = 1.0) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    v = float(value) * scale
    return float(f"{v:.5g}") if math.isfinite(v) else None


def _nums(values: Iterable[object], scale: float = 1.0, *, digits: int | None = None
          ) -> list[float | None]:
    """Each number of ``values`` times ``scale`` (None for anything else, or not finite),
    rounded to ``digits`` significant digits where given: a measured series (a site of 50
    cases x 1,000 sessions rounds 300,000 of them); an exact one is kept as it is."""
    out: list[float | None] = []
    append = out.append
    isfinite = math.isfinite
    for v in values:
        if v.__class__ is float or v.__class__ is int:
            f = v * scale
            if not isfinite(f):
                append(None)
            elif digits is None:
                append(f)
            else:
                append(float(f"{f:.{digits}g}"))
        else:
            append(None)
    return out


def slug(platform: str, nodeid: str) -> str:
    """A case's page name: readable, and unique by a hash of platform and node id."""
    name = nodeid.split("::", 1)[-1]
    text = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-")[:80] or "case"
    return f"{text}-{hashlib.sha1(f'{platform}:{nodeid}'.encode()).hexdigest()[:8]}"


# -- columns -----------------------------------------------------------------------------------
def _column(values: Sequence[object]) -> object:
    """A column as a list, or as runs ``{"r": [[value, count], ...]}`` where that is
    shorter (the exact series: FLOPs, bytes, syncs, memory repeat)."""
    changes = sum(map(operator.ne, values, itertools.islice(values, 1, None)))
    if (changes + 1) * 3 >= len(values):
        return list(values)
    return {"r": [[v, sum(1 for _ in run)] for v, run in itertools.groupby(values)]}


def _dict_column(values: Sequence[str | None]) -> tuple[list[int | None], list[str]]:
    table: dict[str, int] = {}
    out = [None if v is None else table.setdefault(v, len(table)) for v in values]
    return out, list(table)


@dataclass
class Case:
    """One case of the history (a platform and node id) and its lines, oldest first."""

    platform: str
    nodeid: str
    lines: list[SiteLine]
    order: list[int]  #: each line's session index in the whole history
    changes: list[ChangePoint] = field(default_factory=list)
    #: Each line's machine (:func:`machine_name`) and bytes.
    machines: list[str] = field(default_factory=list)
    raws: list[bytes] = field(default_factory=list)

    @property
    def page(self) -> str:
        return f"cases/{slug(self.platform, self.nodeid)}.html"


def _accel(case: Case) -> str | None:
    """The accelerator of the case's latest line (``--accel`` of its bisect command)."""
    env = _environment(case.raws[-1]) if case.raws else None
    accel = env.get("accel") if isinstance(env, dict) else None
    return accel if isinstance(accel, str) else None


def bisect_command(change: ChangePoint, accel: str | None) -> str:
    """The ``accelperf bisect`` command of a change point's commit range; empty where both
    sides ran the same commit (the machine or the environment changed, not the code)."""
    good, bad = change.last_before.commit, change.first_after.commit
    if not good or not bad or good == bad:
        return ""
    node = change.nodeid.replace("'", "'\\''")
    return (f"accelperf bisect {good[:12]} {bad[:12]} -- '{node}'"
            + (f" --accel={accel}" if accel else ""))


def _mark(change: ChangePoint, case: Case, names: Mapping[str, str],
          branches: Mapping[str, str | None], accel: str | None) -> dict[str, object]:
    first = change.first_after
    if change.metric == ENVIRONMENT:
        kind = "machine"
        label = f"machine: {names.get(first.session, '?')}"
    elif change.metric == STACK:
        kind, label = "stack", ", ".join(change.stack) or "stack changed"
    else:
        w = worse(change)
        kind = "worse" if w else "better" if w is False else "change"
        pct = change.change
        label = (f"{change.metric} {pct * 100:+.1f}%" if pct is not None
                 else f"{change.metric} {change.levels()}")
    return {"x": first.order - 0.5, "kind": kind, "metric": change.metric, "label": label,
            "commits": change.commits, "how": change.sure,
            "levels": change.levels(), "bisect": bisect_command(change, accel) or
            "(same commit on both sides: the machine or environment changed)",
            "machine": names.get(first.session, "?"), "branch": branches.get(first.session)}


def case_data(case: Case) -> Spec:
    """The page data of a case (see :mod:`pytest_accelperf.report.pagejs`)."""
    lines = case.lines
    names = case.machines or [machine_name(e) for e in lines]
    branches = [e.branch for e in lines]
    dicts: dict[str, list[str]] = {}
    cols: dict[str, object] = {"i": case.order}
    for name, values in (("commit", [_revision(e) for e in lines]),
                         ("time", [e.time[:16].replace("T", " ") for e in lines]),
                         ("branch", [b or "?" for b in branches]),
                         ("machine", names),
                         ("verdict", [e.verdict or "-" for e in lines])):
        indices, dicts[name] = _dict_column(values)
        cols[name] = _column(indices)
    band = [e.step_time_interval or (None, None) for e in lines]
    programs: list[Mapping[str, object]] = [e.program or {} for e in lines]
    numbers: dict[str, list[float | None]] = {
        "step": _nums((e.median_step_time for e in lines), 1e3, digits=5),
        "lo": _nums((v[0] for v in band), 1e3, digits=5),
        "hi": _nums((v[1] for v in band), 1e3, digits=5),
        "compile": _nums((e.compile_time for e in lines), digits=4),
        "memory": _nums((e.peak_memory for e in lines), 2**-20),
        "flops": _nums(p.get("flops") for p in programs),
        "bytes": _nums(p.get("bytes_accessed") for p in programs),
        "syncs": _nums(p.get("host_syncs") for p in programs),
        "loss": _nums(e.final_loss for e in lines),
    }
    cols.update({k: _column(v) for k, v in numbers.items()})
    per = [e.memory_per_device or {} for e in lines]
    devices: dict[str, list[float | None]] = {
        str(d): _nums((p.get(d) for p in per), 2**-20)
        for d in dict.fromkeys(d for p in per for d in p)}
    if any(not p for p in per):  # lines without it: their peak
        devices["peak"] = [None if p else m for p, m in zip(per, numbers["memory"],
                                                            strict=True)]
    by_session = {e["session"]: k for k, e in enumerate(lines)}
    session_names = {s: names[k] for s, k in by_session.items()}
    session_branch = {s: branches[k] for s, k in by_session.items()}
    accel = _accel(case)
    marks = [_mark(c, case, session_names, session_branch, accel) for c in case.changes
             if c.significant]
    for k, m in enumerate(marks):  # labels of neighbouring marks on 4 rows
        m["dy"] = 2 + 11 * (k % 4)
    return {"n": len(lines), "dict": dicts, "cols": cols,
            "devices": {d: _column(v) for d, v in devices.items()}, "marks": marks}


#: The plots of a case page: (title, field, axis title, metrics of its marks, interval
#: fields, exact series).
CASE_CHARTS: tuple[tuple[str, str, str, tuple[str, ...], tuple[str, str] | None, bool], ...] = (
    ("median step time (band: each session's 95% interval)", "step", "ms per step",
     ("throughput", "step time"), ("lo", "hi"), False),
    ("compile time", "compile", "s", (), None, False),
    ("FLOPs per step (exact)", "flops", "FLOPs", ("FLOPs", "hardware FLOPs"), None, True),
    ("bytes accessed per step (exact)", "bytes", "bytes", ("bytes accessed",), None, True),
    ("host syncs per step (exact)", "syncs", "syncs", ("host syncs",), None, True),
    ("final loss", "loss", "loss", ("final loss",), None, False),
)


def case_specs(data: Mapping[str, Any]) -> list[Spec]:
    """The Vega-Lite specifications of a case page: the plots of :data:`CASE_CHARTS` that
    have a value, and memory per device."""
    cols = data["cols"]

    def has(name: str) -> bool:
        col = cols[name]
        values = [r[0] for r in col["r"]] if isinstance(col, dict) else col
        return any(v is not None for v in values)

    specs: list[Spec] = []
    for title, name, axis, metrics, interval, exact in CASE_CHARTS:
        if has(name):
            specs.append(history_chart(title, name, axis, metrics=metrics, interval=interval,
                                       exact=exact))
        if name == "compile" and data["devices"]:
            specs.append(memory_history_chart("peak memory per device"))
    return specs


# -- pages -------------------------------------------------------------------------------------
def _badge(verdict: str) -> str:
    text = verdict.upper() if verdict in ("regression", "error") else verdict
    return f'<span class="v v-{escape(verdict)}">{escape(text)}</span>'


def _page(title: str, body: Sequence[str], *, root: str) -> str:
    return ("<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"generator\" content=\"accelperf history publish\">"
            '<link rel="icon" href="data:,">'  # served, no favicon.ico to miss
            f"<title>{escape(title)}</title>"
            f'<link rel="stylesheet" href="{root}accelperf.css"></head>\n<body>\n'
            + "\n".join(body)
            + f'\n<script src="{root}vega.js"></script>'
              f'<script src="{root}accelperf.js"></script>\n</body></html>\n')


def _select(id_: str, label: str, values: Iterable[str]) -> str:
    options = "".join(f'<option value="{escape(v)}">{escape(v)}</option>'
                      for v in sorted(values))
    return (f'<label>{escape(label)} <select id="{id_}"><option value="{ALL}">all</option>'
            f"{options}</select></label>")


def _script_json(id_: str, value: object) -> str:
    text = json.dumps(value, separators=(",", ":"), allow_nan=False).replace("</", "<\\/")
    return f'<script type="application/json" id="{id_}">{text}</script>'


def case_page(case: Case, title: str) -> str:
    data = case_data(case)
    specs = case_specs(data)
    latest = case.lines[-1]
    machines = data["dict"]["machine"]
    rows = ["<tr><th>session</th><th>change</th><th>before → after</th><th>commits</th>"
            "<th>how sure</th><th>bisect</th></tr>"]
    rows += [f"<tr><td class=\"num\">{int(float(str(m['x'])) + 0.5)}</td>"
             f"<td>{escape(str(m['label']))}</td><td>{escape(str(m['levels']))}</td>"
             f"<td><code>{escape(str(m['commits']))}</code></td><td>{escape(str(m['how']))}"
             f"</td><td><code>{escape(str(m['bisect']))}</code></td></tr>"
             for m in data["marks"]]
    body = [f'<p class="sub"><a href="../index.html">← {escape(title)}</a></p>',
            f"<h1>{escape(case.nodeid.split('::', 1)[-1])}</h1>",
            f'<p class="sub"><code>{escape(case.nodeid)}</code> · platform '
            f"{escape(case.platform)} · {len(case.lines)} session(s) on "
            f"{len(machines)} machine(s) · latest {_badge(str(latest.get('verdict') or '-'))}"
            f" on {escape(machine_name(latest))} at {escape(_revision(latest))}</p>",
            '<div class="filters">' + _select("f-machine", "machine", machines)
            + _select("f-branch", "branch", data["dict"]["branch"]) + "</div>",
            *(f'<div class="chart" data-spec="{k}"></div>' for k in range(len(specs))),
            f"<h2>Change points ({len(data['marks'])})</h2>",
            ('<p class="sub">Each one is listed by <code>accelperf history changes</code> '
             "too; the bisect command searches its commit range.</p>"
             + "<table>" + "".join(rows) + "</table>") if data["marks"]
            else '<p class="sub">None.</p>',
            _script_json("accelperf-data", data), _script_json("accelperf-specs", specs)]
    return _page(f"{case.nodeid} · {title}", body, root="../")


def index_page(cases: Sequence[Case], title: str, sessions: int,
               skipped: Sequence[Skipped]) -> str:
    rows = ["<tr><th>platform</th><th>case</th><th>machine</th><th>step time</th>"
            "<th>latest</th><th>median step</th><th>sessions</th><th>change points</th>"
            "</tr>"]
    machines: set[str] = set()
    branches: set[str] = set()
    for case in cases:
        series: dict[str, list[SiteLine]] = {}
        for line, name in zip(case.lines, case.machines or map(machine_name, case.lines),
                              strict=True):
            series.setdefault(name, []).append(line)
        changes = sum(c.significant for c in case.changes)
        for name, lines in sorted(series.items()):
            machines.add(name)
            mine = sorted({str(e.get("branch") or "?") for e in lines})
            branches.update(mine)
            latest = lines[-1]
            verdict = str(latest.get("verdict") or "-")
            steps = [_num(e.get("median_step_time"), 1e3) for e in lines[-SPARK_SESSIONS:]]
            step = _num(latest.get("median_step_time"), 1e3)
            rows.append(
                f'<tr data-machine="{escape(name)}" data-branches="{escape(" ".join(mine))}">'
                f"<td>{escape(case.platform)}</td>"
                f'<td><a href="{escape(case.page)}">{escape(case.nodeid.split("::", 1)[-1])}'
                f"</a></td><td>{escape(name)}</td>"
                f"<td>{sparkline(steps, worse=verdict == 'regression')}</td>"
                f"<td>{_badge(verdict)} <code>{escape(_revision(latest))}</code></td>"
                f'<td class="num">{"-" if step is None else f"{step:.4g} ms"}</td>'
                f'<td class="num">{len(lines)}</td><td class="num">{changes}</td></tr>')
    notes = [f'<p class="warn">{escape(s.line())}</p>' for s in skipped]
    body = [f"<h1>{escape(title)}</h1>",
            f'<p class="sub">{len(cases)} case(s) over {sessions} session(s) on '
            f"{len(machines)} machine(s). Sparklines: median step time over the latest "
            f"{SPARK_SESSIONS} sessions of each machine.</p>", *notes,
            '<div class="filters">' + _select("f-machine", "machine", machines)
            + _select("f-branch", "branch", branches) + "</div>",
            '<table id="accelperf-index">' + "".join(rows) + "</table>"]
    return _page(title, body, root="")


# -- the folder --------------------------------------------------------------------------------
def _check_out(out: Path) -> set[str]:
    """The files a previous publish wrote in ``out`` (empty for a new or empty folder); a
    :class:`SiteError` where ``out`` is something else."""
    if not out.exists():
        return set()
    if not out.is_dir():
        raise SiteError(f"--out {out}: not a directory; give a new or empty directory, or a "
                        f"site {GENERATOR} made")
    marker = out / MARKER
    if not marker.is_file():
        if any(out.iterdir()):
            raise SiteError(f"--out {out}: exists and is not a site {GENERATOR} made (no "
                            f"{MARKER}); give a new or empty directory")
        return set()
    try:
        made = json.loads(marker.read_text(encoding="utf-8"))
        files = made["files"] if made.get("generator") == GENERATOR else None
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        files = None
    if not isinstance(files, list):
        raise SiteError(f"--out {out}: {MARKER} is not {GENERATOR}'s; give a new or empty "
                        f"directory")
    return {str(f) for f in files}


@dataclass
class Published:
    """What :func:`publish` wrote."""

    out: Path
    cases: int
    sessions: int
    machines: int
    files: int
    size: int
    skipped: list[Skipped]


def publish(paths: Sequence[Path], out: Path, *, title: str = "accelperf history"
            ) -> Published:
    """Publish the history of ``paths`` as a site in ``out`` (see the module)."""
    from pytest_accelperf.report.vegajs import vega_js

    before = _check_out(out)
    history = read_lines(paths)
    if not history.entries:
        raise SiteError(f"{', '.join(map(str, paths))}: no history lines"
                        + (f" ({'; '.join(s.line() for s in history.skipped)})"
                           if history.skipped else "")
                        + "; write them with pytest --accelperf-history=DIR")
    orders: dict[str, int] = {}
    cases: dict[tuple[str, str], Case] = {}
    for e, raw in zip(history.entries, history.raws, strict=True):
        i = orders.setdefault(str(e["session"]), len(orders))
        key = (str(e.get("platform") or ""), str(e["nodeid"]))
        case = cases.get(key)
        if case is None:
            case = cases[key] = Case(key[0], key[1], [], [])
        case.lines.append(e)
        case.order.append(i)
        case.machines.append(machine_name(e, raw))
        case.raws.append(raw)
    for change in find_changes(history.points):
        found = cases.get((change.platform, change.nodeid))
        if found is not None:
            found.changes.append(change)
    ordered = sorted(cases.values(), key=lambda c: (c.platform, c.nodeid))
    files: dict[str, str] = {
        "vega.js": vega_js(), "accelperf.js": PAGE_JS, "accelperf.css": CSS,
        "index.html": index_page(ordered, title, len(orders), history.skipped)}
    for case in ordered:
        files[case.page] = case_page(case, title)
    for name in files:
        target = out / name
        if name not in before and (target.exists() or target.is_symlink()):
            raise SiteError(f"--out {out}: {name} exists and is not {GENERATOR}'s; move it "
                            f"or give another directory")
    out.mkdir(parents=True, exist_ok=True)
    (out / "cases").mkdir(exist_ok=True)
    size = 0
    for name, text in files.items():
        atomic_write(out / name, text)
        size += len(text.encode())
    for stale in sorted(before - set(files) - {MARKER}):
        path = out / stale
        if path.is_file() and path.resolve().is_relative_to(out.resolve()):
            path.unlink()
    atomic_write(out / MARKER, json.dumps({"generator": GENERATOR, "files": sorted(files)},
                                          indent=1) + "\n")
    machines = {name for case in ordered for name in case.machines}
    return Published(out, len(ordered), len(orders), len(machines), len(files), size,
                     history.skipped)
