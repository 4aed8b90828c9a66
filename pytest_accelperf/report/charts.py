"""The plots of the HTML report and of the published history, as Vega-Lite specifications.

One module for both (:mod:`pytest_accelperf.report.html`, :mod:`pytest_accelperf.report.site`):
each function returns a specification (plain JSON data); the browser draws it with the
JavaScript of :mod:`pytest_accelperf.report.vegajs`. Nothing is imported to build one, so a
site of 50 cases and 7 plots each is specified in milliseconds.

Every plot's points carry a tooltip (what hovering shows: the commit, the value and its
interval in the history; the case, the value and its interval in the report). The history's
plots read two named data sets, ``sessions`` (one row per session of a case) and ``marks``
(the change points, stack changes and machine changes drawn as vertical rules), and two
variables, ``machine`` and ``branch`` (``*``: all), which the page's filters set.
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from typing import Any

Spec = dict[str, Any]

NOW_COLOR = "#1f6feb"
BASE_COLOR = "#8b949e"
BAD_COLOR = "#d1242f"
GOOD_COLOR = "#1a7f37"
#: The colour of each kind of mark on the history's plots.
MARK_COLORS = {"worse": BAD_COLOR, "better": GOOD_COLOR, "change": "#57606a",
               "stack": "#8250df", "machine": "#bc4c00"}
#: Every filter's value meaning "all".
ALL = "*"

_FILTER = (f"(machine == '{ALL}' || datum.machine == machine) && "
           f"(branch == '{ALL}' || datum.branch == branch)")
_PARAMS = [{"name": "machine", "value": ALL}, {"name": "branch", "value": ALL}]
_X = {"field": "i", "type": "quantitative", "title": "session (oldest first)",
      "axis": {"format": "d", "tickMinStep": 1,
               "labelExpr": "datum.value % 1 ? '' : datum.label"},  # sessions are whole
      "scale": {"zero": False, "nice": False}}
_CONFIG = {"view": {"stroke": "#d0d7de"}, "axis": {"labelFontSize": 10, "titleFontSize": 11},
           "title": {"fontSize": 13, "anchor": "start"}, "legend": {"labelLimit": 220}}


def _session_tooltip(field: str, title: str, fmt: str, interval: bool) -> list[Spec]:
    out: list[Spec] = [{"field": "commit", "title": "commit"},
                       {"field": "time", "title": "time (UTC)"},
                       {"field": "branch", "title": "branch"},
                       {"field": "machine", "title": "machine"},
                       {"field": field, "title": title, "format": fmt}]
    if interval:
        out.append({"field": "interval", "title": "95% interval"})
    out.append({"field": "verdict", "title": "verdict"})
    return out


def history_chart(title: str, field: str, axis: str, *, metrics: Sequence[str] = (),
                  interval: tuple[str, str] | None = None, exact: bool = False,
                  color: str = "machine", fmt: str = ".4~r", height: int = 200) -> Spec:
    """A series of the history over the sessions: ``field`` of the ``sessions`` rows, one
    line a ``color`` (machine, or case), each session's ``interval`` (two fields) drawn as a
    band, an ``exact`` series as steps; the ``marks`` of ``metrics`` (and every stack and
    machine change) as labelled vertical rules."""
    keep: list[Spec] = [{"filter": _FILTER}, {"filter": f"isValid(datum['{field}'])"}]
    colors = {"field": color, "type": "nominal", "title": color,
              "legend": {"orient": "bottom", "direction": "horizontal"}}
    quiet = {**colors, "legend": None}  # one legend a plot: the points'
    x, y = dict(_X), {"field": field, "type": "quantitative", "title": axis,
                      "scale": {"zero": exact}}
    layers: list[Spec] = []
    if interval is not None:
        lo, hi = interval
        layers.append({
            "transform": [*keep, {"filter": f"isValid(datum['{lo}'])"}],
            "mark": {"type": "area", "opacity": 0.22},
            "encoding": {"x": x, "y": {"field": lo, "type": "quantitative"},
                         "y2": {"field": hi}, "color": quiet}})
    tooltip = _session_tooltip(field, axis, fmt, interval is not None)
    if interval is not None:
        keep = [*keep, {"calculate": (f"isValid(datum['{interval[0]}']) ? format(datum['"
                                      f"{interval[0]}'], '{fmt}') + ' to ' + format(datum['"
                                      f"{interval[1]}'], '{fmt}') : 'none'"),
                        "as": "interval"}]
    layers.append({"transform": keep,
                   "mark": {"type": "line", "strokeWidth": 1.3,
                            "interpolate": "step-after" if exact else "linear"},
                   "encoding": {"x": x, "y": y, "color": quiet}})
    layers.append({"transform": keep,
                   "mark": {"type": "point", "filled": True, "size": 22},
                   "encoding": {"x": x, "y": y, "color": colors, "tooltip": tooltip,
                                "shape": {"condition": {"test": "datum.verdict === "
                                                                "'regression'",
                                                        "value": "cross"},
                                          "value": "circle"}}})
    layers += _mark_layers(metrics)
    return {"title": title, "width": "container", "height": height, "params": _PARAMS,
            "data": {"name": "sessions"}, "layer": layers,
            "resolve": {"scale": {"color": "independent"}}, "config": _CONFIG}


def _mark_layers(metrics: Sequence[str]) -> list[Spec]:
    """The vertical rules and labels of the ``marks`` rows of ``metrics``, stack and machine
    changes (a mark row: ``x``, ``kind``, ``metric``, ``label``, ``commits``, ``bisect``,
    ``machine``, ``branch``, and ``dy``, the label's offset from the top in pixels: labels
    of nearby marks are staggered)."""
    keep = [{"filter": _FILTER},
            {"filter": {"field": "metric", "oneOf": [*metrics, "stack", "environment"]}}]
    hue = {"field": "kind", "type": "nominal", "legend": None,
           "scale": {"domain": list(MARK_COLORS), "range": list(MARK_COLORS.values())}}
    x = {"field": "x", "type": "quantitative"}
    tooltip = [{"field": "label", "title": "change"}, {"field": "commits", "title": "commits"},
               {"field": "how", "title": "how sure"}, {"field": "bisect", "title": "bisect"}]
    return [
        {"data": {"name": "marks"}, "transform": keep,
         "mark": {"type": "rule", "strokeDash": [4, 3], "strokeWidth": 1.4},
         "encoding": {"x": x, "color": hue, "tooltip": tooltip}},
        {"data": {"name": "marks"}, "transform": keep,
         "mark": {"type": "text", "align": "left", "baseline": "top", "dx": 3, "fontSize": 9,
                  "limit": 260},
         "encoding": {"x": x, "y": {"field": "dy", "type": "quantitative", "scale": None},
                      "text": {"field": "label"}, "color": hue,
                      "tooltip": tooltip}},
    ]


def memory_history_chart(title: str, *, height: int = 200) -> Spec:
    """Peak memory of each device over the sessions (the ``memory`` rows: ``i``,
    ``device``, ``mib`` and the session's fields), one line a device."""
    keep = [{"filter": _FILTER}]
    x = dict(_X)
    y = {"field": "mib", "type": "quantitative", "title": "peak MiB", "scale": {"zero": False}}
    colors = {"field": "device", "type": "nominal", "title": "device",
              "legend": {"orient": "bottom", "direction": "horizontal", "columns": 8}}
    tooltip = [{"field": "commit"}, {"field": "time", "title": "time (UTC)"},
               {"field": "machine"}, {"field": "branch"}, {"field": "device"},
               {"field": "mib", "title": "peak MiB", "format": ".4~r"}]
    return {"title": title, "width": "container", "height": height, "params": _PARAMS,
            "layer": [
                {"data": {"name": "memory"}, "transform": keep,
                 "mark": {"type": "line", "interpolate": "step-after", "strokeWidth": 1.3},
                 "encoding": {"x": x, "y": y, "color": {**colors, "legend": None},
                              "detail": {"field": "machine"}}},
                {"data": {"name": "memory"}, "transform": keep,
                 "mark": {"type": "point", "filled": True, "size": 16},
                 "encoding": {"x": x, "y": y, "color": colors, "tooltip": tooltip}},
                *_mark_layers(["peak memory"])],
            "resolve": {"scale": {"color": "independent"}}, "config": _CONFIG}


# -- the session's report ----------------------------------------------------------------------
def _values(spec: Spec, rows: Sequence[Mapping[str, object]]) -> Spec:
    spec["data"] = {"values": list(rows)}
    return spec


def throughput_chart(title: str, rows: Sequence[Mapping[str, object]]) -> Spec | None:
    """Samples/s of one test's cases, this run beside the baseline, each bar with the
    interval of its median step time as an error bar (rows: ``case``, ``which``, ``sps``,
    ``lo``, ``hi``, ``interval``). None without a row."""
    if not rows:
        return None
    x = {"field": "case", "type": "nominal", "title": None, "sort": None,
         "axis": {"labelAngle": -30, "labelLimit": 160}}
    offset = {"field": "which", "type": "nominal", "sort": ["baseline", "this run"]}
    colors = {"field": "which", "type": "nominal", "title": None,
              "scale": {"domain": ["baseline", "this run"], "range": [BASE_COLOR, NOW_COLOR]},
              "legend": {"orient": "top"}}
    tooltip = [{"field": "case"}, {"field": "which"},
               {"field": "sps", "title": "samples/s", "format": ",.1f"},
               {"field": "interval", "title": "95% interval"}]
    return _values({
        "title": title, "width": "container", "height": 220,
        "layer": [
            {"mark": {"type": "bar"},
             "encoding": {"x": x, "xOffset": offset, "color": colors,
                          "y": {"field": "sps", "type": "quantitative",
                                "title": "samples / s"},
                          "tooltip": tooltip}},
            {"transform": [{"filter": "isValid(datum.lo)"}],
             "mark": {"type": "rule", "color": "#24292f", "strokeWidth": 1.5},
             "encoding": {"x": x, "xOffset": offset, "y": {"field": "lo",
                                                            "type": "quantitative"},
                          "y2": {"field": "hi"}, "tooltip": tooltip}}],
        "config": _CONFIG}, rows)


def loss_chart(steps: Sequence[Mapping[str, object]], band: Sequence[Mapping[str, object]]
               ) -> Spec | None:
    """This run's loss at each step (``steps``: ``step``, ``loss``) within the baseline's
    band (``band``: ``step``, ``baseline``, ``low``, ``high``, ``now``). None without
    either."""
    if not steps and not band:
        return None
    x = {"field": "step", "type": "quantitative", "title": "step"}
    layers: list[Spec] = []
    if band:
        tip = [{"field": "step"}, {"field": "baseline", "format": ".5~r"},
               {"field": "band", "title": "band", "format": ".3~r"},
               {"field": "now", "title": "this run", "format": ".5~r"}]
        layers += [
            {"data": {"values": list(band)}, "mark": {"type": "area", "opacity": 0.25,
                                                      "color": BASE_COLOR},
             "encoding": {"x": x, "y": {"field": "low", "type": "quantitative",
                                        "title": "loss", "scale": {"zero": False}},
                          "y2": {"field": "high"}}},
            {"data": {"values": list(band)},
             "mark": {"type": "line", "color": BASE_COLOR, "strokeDash": [4, 3],
                      "point": {"filled": False, "color": BASE_COLOR}},
             "encoding": {"x": x, "y": {"field": "baseline", "type": "quantitative"},
                          "tooltip": tip}}]
    if steps:
        layers.append({"data": {"values": list(steps)},
                       "mark": {"type": "line", "color": NOW_COLOR, "strokeWidth": 1.2,
                                "point": {"filled": True, "size": 12, "color": NOW_COLOR}},
                       "encoding": {"x": x, "y": {"field": "loss", "type": "quantitative",
                                                  "title": "loss",
                                                  "scale": {"zero": False}},
                                    "tooltip": [{"field": "step"},
                                                {"field": "loss", "title": "this run",
                                                 "format": ".5~r"}]}})
    return {"title": "loss (this run; grey: the baseline ± its band)", "width": "container",
            "height": 180, "layer": layers, "config": _CONFIG}


def memory_chart(rows: Sequence[Mapping[str, object]], title: str) -> Spec | None:
    """Peak memory of each device or rank, this run beside the baseline (rows: ``device``,
    ``which``, ``mib``). None without a row."""
    if not rows:
        return None
    return _values({
        "title": title, "width": "container", "height": 180,
        "mark": {"type": "bar"},
        "encoding": {
            "x": {"field": "device", "type": "nominal", "title": None, "sort": None},
            "xOffset": {"field": "which", "type": "nominal"},
            "y": {"field": "mib", "type": "quantitative", "title": "MiB"},
            "color": {"field": "which", "type": "nominal", "title": None,
                      "scale": {"domain": ["baseline", "this run"],
                                "range": [BASE_COLOR, NOW_COLOR]},
                      "legend": {"orient": "top"}},
            "tooltip": [{"field": "device"}, {"field": "which"},
                        {"field": "mib", "title": "peak MiB", "format": ".4~r"}]},
        "config": _CONFIG}, rows)


def step_chart(rows: Sequence[Mapping[str, object]]) -> Spec | None:
    """The distribution of step times, this run's over the baseline's (rows: ``which``,
    ``ms``). None without a row."""
    if not rows:
        return None
    return _values({
        "title": "step time", "width": "container", "height": 180,
        "mark": {"type": "bar", "opacity": 0.6, "binSpacing": 0},
        "encoding": {
            "x": {"field": "ms", "type": "quantitative", "bin": {"maxbins": 30},
                  "title": "ms per step"},
            "y": {"aggregate": "count", "type": "quantitative", "stack": None,
                  "title": "steps"},
            "color": {"field": "which", "type": "nominal", "title": None,
                      "scale": {"domain": ["baseline", "this run"],
                                "range": [BASE_COLOR, NOW_COLOR]},
                      "legend": {"orient": "top"}},
            "tooltip": [{"field": "which"}, {"aggregate": "count", "title": "steps"},
                        {"field": "ms", "bin": {"maxbins": 30}, "title": "ms"}]},
        "config": _CONFIG}, rows)


# -- sparklines --------------------------------------------------------------------------------
def sparkline(values: Sequence[float | None], *, width: int = 160, height: int = 28,
              worse: bool = False) -> str:
    """A small inline SVG of a series (the index's sparklines: drawn with no script, so an
    index of hundreds of cases opens at once); None values are gaps."""
    known = [v for v in values if v is not None and math.isfinite(v)]
    if len(known) < 2:
        return '<svg class="spark" width="0" height="0"></svg>'
    lo, hi = min(known), max(known)
    span = (hi - lo) or abs(hi) or 1.0
    n = len(values)
    paths: list[str] = []
    run: list[str] = []
    for k, v in enumerate(values):
        if v is None or not math.isfinite(v):
            if len(run) > 1:
                paths.append(" ".join(run))
            run = []
            continue
        x = 1 + (width - 2) * k / max(n - 1, 1)
        y = height - 2 - (height - 4) * (v - lo) / span
        run.append(f"{'M' if not run else 'L'}{x:.1f},{y:.1f}")
    if len(run) > 1:
        paths.append(" ".join(run))
    color = BAD_COLOR if worse else NOW_COLOR
    label = html.escape(f"{len(known)} sessions, {lo:.4g} to {hi:.4g}")
    return (f'<svg class="spark" width="{width}" height="{height}" role="img" '
            f'aria-label="{label}"><title>{label}</title>'
            + "".join(f'<path d="{d}" fill="none" stroke="{color}" stroke-width="1.2"/>'
                      for d in paths) + "</svg>")
