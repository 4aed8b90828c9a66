"""The scaling check: throughput across a series (batch sizes, mesh sizes) has the shape the
suite declared, and a verdict where the curve bends.

A series is a few runs of one model that differ in one number ``x`` (the batch, or the
number of devices). The suite declares the expected shape as :class:`Scaling`: throughput
proportional to ``x ** exponent`` (``1`` linear: twice the batch, twice the samples/s;
``0`` flat), each point reaching at least ``min_efficiency`` of what the smallest point
predicts::

    efficiency_i = throughput_i / (throughput_0 * (x_i / x_0) ** exponent)

Verdicts: ``pass`` when every point is at or above ``min_efficiency``; ``regression`` ("the
curve bends") at the first point below it by more than the points' own noise (the
interquartile spread of each run's step times, relative to their median, summed for the
point and the first); ``inconclusive`` when a point is below it only within that noise.
The detail names where the curve bends and what the last step gave, e.g. seed 003's
Cerebras BERT-large: ``batch 2048: 6,756/s is 2.31x batch 512's 2,926/s for 4x the batch
(efficiency 58% < 80%)``.

In a suite, :meth:`pytest_accelperf.CaseRunner.scaling` collects the points of a group
across cases and checks the group when its last point arrives (see the README).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from pytest_accelperf.checks.base import BaseCheck
from pytest_accelperf.checks.throughput import spread
from pytest_accelperf.errors import ConfigError
from pytest_accelperf.records.run import Run
from pytest_accelperf.records.verdict import CheckData, CheckResult, ScalingRow, Verdict
from pytest_accelperf.stats.units import fmt_num, fmt_percent

METRIC = "scaling"
UNIT = "efficiency"


@dataclass(frozen=True)
class Scaling:
    """The expected shape of a series: throughput ~ ``x ** exponent``, every point at least
    ``min_efficiency`` of it. ``axis`` names ``x`` in messages (``batch``, ``devices``)."""

    exponent: float = 1.0
    min_efficiency: float = 0.8
    axis: str = "batch"

    def __post_init__(self) -> None:
        if not 0 < self.min_efficiency <= 1:
            raise ConfigError(f"min_efficiency must be in (0, 1], got {self.min_efficiency}")


@dataclass(frozen=True)
class ScalingPoint:
    """One point of a series: ``x``, the measured samples/s, and its relative noise."""

    x: float
    throughput: float
    label: str = ""
    noise: float = 0.0

    @classmethod
    def from_run(cls, x: float, run: Run, label: str = "") -> ScalingPoint:
        sps = run.samples_per_second
        if sps is None or run.outcome != "ok":
            raise ConfigError(f"{label or run.case_id}: a run with outcome {run.outcome!r} and "
                             f"no throughput cannot be a point of a scaling series")
        return cls(float(x), sps, label or run.case_id, spread(list(run.step_times)))


def _x(x: float) -> str:
    return fmt_num(x, 6)


def _rate(t: float) -> str:
    return f"{t:,.0f}/s" if t >= 100 else f"{t:.3g}/s"


def check_scaling(points: Sequence[ScalingPoint], expect: Scaling,
                  group: str = "") -> CheckResult:
    """Check a series against its expected shape (see the module docstring)."""
    name = f"{group}: " if group else ""
    if len(points) < 2:
        raise ConfigError(f"{name}a scaling series needs at least 2 points, got {len(points)}")
    xs = [p.x for p in points]
    if len(set(xs)) != len(xs):
        raise ConfigError(f"{name}two points of the series share {expect.axis} "
                         f"{sorted(x for x in xs if xs.count(x) > 1)[0]:g}")
    pts = sorted(points, key=lambda p: p.x)
    base = pts[0]
    rows: list[ScalingRow] = []
    for p in pts:
        expected = base.throughput * (p.x / base.x) ** expect.exponent
        rows.append({"x": p.x, "throughput": p.throughput, "label": p.label,
                     "efficiency": p.throughput / expected, "noise": p.noise + base.noise})
    low = [r for r in rows[1:] if r["efficiency"] < expect.min_efficiency]
    worst = min(r["efficiency"] for r in rows[1:])
    shape = ("linear" if expect.exponent == 1 else "flat" if expect.exponent == 0
             else f"~{expect.axis}^{fmt_num(expect.exponent)}")
    data: CheckData = {"group": group, "exponent": expect.exponent,
                            "min_efficiency": expect.min_efficiency, "axis": expect.axis,
                            "points": rows}
    curve = ", ".join(f"{expect.axis} {_x(r['x'])}: {_rate(r['throughput'])}" for r in rows)
    if not low:
        return CheckResult(METRIC, Verdict.PASS, (
            f"{name}throughput scales {shape} within {fmt_percent(1 - worst, 0)} "
            f"(worst efficiency {fmt_percent(worst, 0)} >= "
            f"{fmt_percent(expect.min_efficiency, 0)}): {curve}"), now=worst, unit=UNIT,
            data=data)
    first = low[0]
    i = rows.index(first)
    prev = rows[i - 1]
    gain = first["throughput"] / base.throughput
    step_gain = first["throughput"] / prev["throughput"]
    where = (f"{expect.axis} {_x(first['x'])}: {_rate(first['throughput'])} is "
             f"{gain:.2f}x {expect.axis} {_x(base.x)}'s {_rate(base.throughput)} for "
             f"{first['x'] / base.x:g}x the {expect.axis} (efficiency "
             f"{fmt_percent(first['efficiency'], 0)} < {fmt_percent(expect.min_efficiency, 0)}"
             f"); from {expect.axis} {_x(prev['x'])} it gained {step_gain:.2f}x for "
             f"{first['x'] / prev['x']:g}x")
    data["bend_at"] = first["x"]
    if first["efficiency"] + first["noise"] < expect.min_efficiency:
        verdict = Verdict.REGRESSION
        detail = f"{name}the {shape} scaling curve bends at {where}. Curve: {curve}"
    else:
        verdict = Verdict.INCONCLUSIVE
        detail = (f"{name}below the expected {shape} scaling only within the runs' "
                  f"noise ({fmt_percent(first['noise'], 0)}) at {where}. Curve: {curve}")
    return CheckResult(METRIC, verdict, detail, now=worst, unit=UNIT, data=data)


@dataclass
class _Group:
    expect: Scaling
    size: int
    points: list[ScalingPoint] = field(default_factory=list)
    result: CheckResult | None = None


@dataclass
class ScalingCollector:
    """Points of named scaling groups, gathered across cases of one session (process).

    :meth:`add` returns the group's :class:`CheckResult` when its ``size``-th point
    arrives, else None. All cases of a group must run in one process: under xdist mark
    them ``@pytest.mark.xdist_group(...)`` and pass ``--dist loadgroup``;
    :meth:`incomplete` lists the groups that never got all their points.
    """

    groups: dict[str, _Group] = field(default_factory=dict)

    def add(self, group: str, point: ScalingPoint, expect: Scaling, size: int) -> \
            CheckResult | None:
        if size < 2:
            raise ConfigError(f"scaling group {group!r}: size must be >= 2, got {size}")
        g = self.groups.setdefault(group, _Group(expect, size))
        if (g.expect, g.size) != (expect, size):
            raise ConfigError(f"scaling group {group!r} was declared with {g.expect} and "
                             f"{g.size} points, now with {expect} and {size}: declare it once")
        if any(p.x == point.x for p in g.points):
            raise ConfigError(f"scaling group {group!r} already has a point at "
                             f"{expect.axis} {point.x:g}")
        if len(g.points) >= size:
            raise ConfigError(f"scaling group {group!r} already has its {size} points")
        g.points.append(point)
        if len(g.points) == size:
            g.result = check_scaling(g.points, expect, group)
            return g.result
        return None

    def incomplete(self) -> list[str]:
        return [f"{name} ({len(g.points)} of {g.size} points)"
                for name, g in sorted(self.groups.items()) if len(g.points) < g.size]


class ScalingCheck(BaseCheck):
    """The ``scaling`` row: judged across the cases of a group by :class:`ScalingCollector`
    when the group's last point arrives (:meth:`pytest_accelperf.CaseRunner.scaling`), not
    per run, so :meth:`check` gives nothing. The curve is judged against its expected
    shape, not a baseline."""

    metric = METRIC
    kind = "timing"
    cleared_by_a_baseline = False
    uncleared = ("the scaling curve is judged against its expected shape, not a baseline: "
                 "fix the scaling, or change the test's expect=")


CHECK = ScalingCheck()
