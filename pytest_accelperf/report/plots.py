"""The plots of the HTML report, drawn with matplotlib and returned as PNG bytes.

Figures are built with ``matplotlib.figure.Figure`` on an explicit Agg canvas, never through
``pyplot``: nothing global changes (no backend switch, no figure registry to leak), so the
report can be drawn inside a pytest session that uses matplotlib itself. matplotlib is
imported here only; ``report.html`` imports this module lazily.
"""

from __future__ import annotations

import io
import math
from collections.abc import Mapping, Sequence
from typing import Any

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from pytest_accelperf.checks.base import CheckData
from pytest_accelperf.report.data import CaseRecord

NOW_COLOR = "#1f6feb"
BASE_COLOR = "#8b949e"
BAD_COLOR = "#d1242f"
_MIB = 2**20


def _png(fig: Figure) -> bytes:
    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    return buf.getvalue()


def _floats(values: Sequence[Any] | None) -> list[float]:
    """Finite floats of ``values`` (NaN/inf are stored as strings in reports; they drop)."""
    out: list[float] = []
    for v in values or []:
        try:
            f = float(v)
        except (TypeError, ValueError):
            continue
        if math.isfinite(f):
            out.append(f)
    return out


def _check_data(record: CaseRecord, metric: str) -> CheckData:
    for c in record.checks:
        if c.metric == metric:
            return c.data
    return {}


def _loss_panel(ax: Axes, record: CaseRecord) -> bool:
    run = record.run
    losses = run.get("losses") or []
    steps = run.get("loss_steps") or list(range(len(losses)))
    pairs = [(float(s), f) for s, v in zip(steps, losses, strict=False)
             for f in _floats([v])]
    rows = [r for r in _check_data(record, "loss").get("checkpoints") or [] if len(r) >= 2]
    if not pairs and not rows:
        return False
    if pairs:
        ax.plot([p[0] for p in pairs], [p[1] for p in pairs], color=NOW_COLOR, lw=1,
                alpha=0.55, label="this run (per step)")
    if rows and len(rows[0]) >= 4:  # [step, baseline, now, band] against a baseline
        xs = [float(r[0]) for r in rows]
        base = [float(r[1]) for r in rows]
        band = [float(r[3]) for r in rows]
        ax.fill_between(xs, [b - w for b, w in zip(base, band, strict=True)],
                        [b + w for b, w in zip(base, band, strict=True)],
                        color=BASE_COLOR, alpha=0.3, label="baseline ± band")
        ax.plot(xs, base, color=BASE_COLOR, lw=1.5, ls="--", marker="o", ms=3,
                label="baseline checkpoints")
        now = _floats([r[2] for r in rows])
        if len(now) == len(xs):
            ax.plot(xs, now, color=NOW_COLOR, lw=0, marker="o", ms=4,
                    label="this run (checkpoints)")
    ax.set_title("loss")
    ax.set_xlabel("step")
    ax.legend(fontsize=7, loc="upper right")
    return True


def _step_panel(ax: Axes, record: CaseRecord) -> bool:
    now = [t * 1e3 for t in _floats(record.run.get("step_times"))]
    base = [t * 1e3 for t in _floats(((record.baseline or {}).get("step_time") or {})
                                     .get("samples"))]
    if not now and not base:
        return False
    both = now + base
    lo, hi = min(both), max(both)
    if hi <= lo:
        hi = lo + max(abs(lo) * 0.01, 1e-3)
    bins = [lo + (hi - lo) * i / 24 for i in range(25)]
    if base:
        ax.hist(base, bins=bins, color=BASE_COLOR, alpha=0.55, label=f"baseline (n={len(base)})")
        ax.axvline(_median(base), color=BASE_COLOR, ls="--", lw=1.5)
    if now:
        ax.hist(now, bins=bins, color=NOW_COLOR, alpha=0.55, label=f"this run (n={len(now)})")
        ax.axvline(_median(now), color=NOW_COLOR, ls="-", lw=1.5)
    ax.set_title("step time (dashed/solid: medians)")
    ax.set_xlabel("ms per step")
    ax.set_ylabel("steps")
    ax.set_ylim(0, ax.get_ylim()[1] * 1.3)
    ax.legend(fontsize=7, loc="upper right")
    return True


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


def _memory_panel(ax: Axes, record: CaseRecord) -> bool:
    now: Mapping[str, float] = record.run.get("memory_per_device") or {}
    base: Mapping[str, float] = (((record.baseline or {}).get("memory") or {})
                                 .get("per_device") or {})
    labels = sorted(set(now) | set(base), key=_device_order)
    if not labels:
        return False
    xs = list(range(len(labels)))
    width = 0.4 if base and now else 0.8
    if base:
        ax.bar([x - width / 2 if now else x for x in xs],
               [float(base.get(k, 0)) / _MIB for k in labels], width, color=BASE_COLOR,
               label="baseline")
    if now:
        ax.bar([x + width / 2 if base else x for x in xs],
               [float(now.get(k, 0)) / _MIB for k in labels], width, color=NOW_COLOR,
               label="this run")
    oom = record.run.get("oom") or {}
    if oom.get("capacity_bytes"):
        ax.axhline(float(oom["capacity_bytes"]) / _MIB, color=BAD_COLOR, ls=":",
                   label="capacity")
    ax.set_xticks(xs, [_short_label(k) for k in labels], rotation=45 if len(labels) > 4 else 0,
                  fontsize=7)
    ax.set_title(f"peak memory per device ({record.run.get('memory_source') or 'MiB'})")
    ax.set_ylabel("MiB")
    ax.set_ylim(0, ax.get_ylim()[1] * 1.3)  # headroom: the legend sits above the bars
    ax.legend(fontsize=7, loc="upper right", ncols=3)
    return True


def _device_order(label: str) -> tuple[str, int]:
    head = label.rstrip("0123456789")
    tail = label[len(head):]
    return head, int(tail) if tail else -1


def _short_label(label: str) -> str:
    return label if len(label) <= 10 else label[:9] + "…"


def case_figure(record: CaseRecord) -> bytes | None:
    """Loss against the baseline's band, step-time distributions, memory per device: the
    panels that have data, side by side; None when none has."""
    fig = Figure(figsize=(13, 3.4), layout="constrained")
    panels = (_loss_panel, _step_panel, _memory_panel)
    axes = fig.subplots(1, len(panels))
    drawn = 0
    for ax, panel in zip(axes, panels, strict=True):
        if panel(ax, record):
            drawn += 1
        else:
            ax.set_axis_off()
            ax.text(0.5, 0.5, f"no {panel.__name__.strip('_').replace('_panel', '')} data",
                    ha="center", va="center", color=BASE_COLOR, transform=ax.transAxes)
    return _png(fig) if drawn else None


def _mesh_label(case: Mapping[str, object]) -> str:
    mesh = case.get("mesh")
    return ("mesh" + "x".join(str(n) for n in mesh) if mesh and isinstance(mesh, list | tuple)
            else "no mesh")


def _sps(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and value > 0 else None


def throughput_figure(title: str, records: list[CaseRecord]) -> bytes | None:
    """Samples/s of one test's cases across batch sizes (x, log scale) and meshes (one line
    each): this run solid, the baselines dashed. None with fewer than two points."""
    series: dict[str, list[tuple[int, float | None, float | None]]] = {}
    for r in records:
        batch = r.case.get("batch")
        now = _sps((r.run.get("derived") or {}).get("samples_per_second"))
        base = _sps((r.baseline or {}).get("samples_per_second"))
        if isinstance(batch, int) and (now or base):
            series.setdefault(_mesh_label(r.case), []).append((batch, now, base))
    if sum(len(v) for v in series.values()) < 2:
        return None
    fig = Figure(figsize=(8, 3.8), layout="constrained")
    ax = fig.subplots()
    if len({p[0] for points in series.values() for p in points}) == 1:
        return _mesh_bars(fig, ax, title, series)
    palette = ["#1f6feb", "#bf3989", "#1a7f37", "#9a6700", "#8250df", "#cf222e"]
    batches: set[int] = set()
    for i, (label, points) in enumerate(sorted(series.items())):
        points.sort()
        color = palette[i % len(palette)]
        xs = [p[0] for p in points]
        batches.update(xs)
        now_pts = [(p[0], p[1]) for p in points if p[1] is not None]
        base_pts = [(p[0], p[2]) for p in points if p[2] is not None]
        if now_pts:
            ax.plot([p[0] for p in now_pts], [p[1] for p in now_pts], color=color, marker="o",
                    label=f"{label} (this run)")
        if base_pts:
            ax.plot([p[0] for p in base_pts], [p[1] for p in base_pts], color=color, ls="--",
                    marker="o", mfc="none", alpha=0.7, label=f"{label} (baseline)")
    if len(batches) > 1:
        ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(batches), [str(b) for b in sorted(batches)])
    ax.set_xlabel("global batch")
    ax.set_ylabel("samples / s")
    ax.set_title(title)
    ax.legend(fontsize=7, ncols=2)
    return _png(fig)


def _mesh_bars(fig: Figure, ax: Axes, title: str,
               series: dict[str, list[tuple[int, float | None, float | None]]]) -> bytes:
    """One batch size: samples/s per mesh as bars, the baseline beside this run."""
    labels = sorted(series)
    xs = list(range(len(labels)))
    base = [series[k][0][2] or 0.0 for k in labels]
    now = [series[k][0][1] or 0.0 for k in labels]
    ax.bar([x - 0.2 for x in xs], base, 0.4, color=BASE_COLOR, label="baseline")
    ax.bar([x + 0.2 for x in xs], now, 0.4, color=NOW_COLOR, label="this run")
    ax.set_xticks(xs, labels)
    ax.set_xlabel(f"mesh (global batch {series[labels[0]][0][0]})")
    ax.set_ylabel("samples / s")
    ax.set_ylim(0, ax.get_ylim()[1] * 1.15)
    ax.set_title(title)
    ax.legend(fontsize=7, loc="upper right", ncols=2)
    return _png(fig)


GOOD_COLOR = "#1a7f37"


def trend_figure(title: str, entries: Sequence[Mapping[str, object]], nodeids: list[str],
                 max_sessions: int = 30,
                 marks: Sequence[tuple[str, str, bool | None]] = ()) -> bytes | None:
    """Samples/s of ``nodeids`` over the last ``max_sessions`` sessions of the history, one
    line per case, x labelled by commit; regressions marked. ``marks`` are change points,
    ``(first session after, label, worse)``: a vertical line before that session (red
    where worse, green where better, grey where neither), labelled. None with under two
    sessions."""
    sessions: list[str] = []
    labels: dict[str, str] = {}
    for e in entries:
        s = str(e.get("session"))
        if s not in labels:
            sessions.append(s)
            commit, time = e.get("commit"), str(e.get("time", ""))
            mark = "*" if e.get("dirty") else ""
            labels[s] = (f"{str(commit)[:7]}{mark}\n" if commit else "") + time[5:16].replace(
                "T", " ")
    sessions = sessions[-max_sessions:]
    if len(sessions) < 2:
        return None
    index = {s: i for i, s in enumerate(sessions)}
    fig = Figure(figsize=(10, 3.8), layout="constrained")
    ax = fig.subplots()
    drawn = False
    for nodeid in nodeids:
        points = [(index[str(e["session"])], float(sps), e.get("verdict") == "regression")
                  for e in entries
                  if e.get("nodeid") == nodeid and str(e.get("session")) in index
                  and isinstance(sps := e.get("samples_per_second"), (int, float))]
        if not points:
            continue
        drawn = True
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", ms=3,
                label=nodeid.split("::", 1)[-1])
        bad = [p for p in points if p[2]]
        if bad:
            ax.plot([p[0] for p in bad], [p[1] for p in bad], lw=0, marker="x", ms=9,
                    mew=2, color=BAD_COLOR)
    if not drawn:
        return None
    _mark_changes(ax, index, marks)
    ax.set_xticks(range(len(sessions)), [labels[s] for s in sessions],
                  rotation=0 if len(sessions) <= 8 else 60, fontsize=7)
    ax.set_xlabel("session (commit, * uncommitted changes; date time UTC); red x: a "
                  "regression verdict; vertical lines: change points")
    ax.set_ylabel("samples / s")
    ax.set_title(title)
    ax.legend(fontsize=7, ncols=2)
    return _png(fig)


def _mark_changes(ax: Axes, index: dict[str, int],
                  marks: Sequence[tuple[str, str, bool | None]]) -> None:
    """A vertical line before each marked session of the plot, its labels beside it."""
    at: dict[int, list[tuple[str, bool | None]]] = {}
    for session, label, worse in marks:
        if session in index and index[session] > 0:
            at.setdefault(index[session], []).append((label, worse))
    for x, items in sorted(at.items()):
        verdicts = {w for _, w in items}
        color = (BAD_COLOR if True in verdicts else GOOD_COLOR if False in verdicts
                 else BASE_COLOR)
        ax.axvline(x - 0.5, color=color, ls="--", lw=1.2)
        text = "\n".join(label for label, _ in items[:4])
        if len(items) > 4:
            text += f"\n+{len(items) - 4} more"
        ax.annotate(text, (x - 0.5, 1), xycoords=("data", "axes fraction"),
                    xytext=(3, -3), textcoords="offset points", ha="left", va="top",
                    fontsize=6.5, color=color)
