"""The step-metrics check: do the other metrics of the training step (accuracy, gradient
norm, learning rate) follow the baseline's curves?

A training step may return metrics besides its loss (``JaxStep``); the run records each
per step and the baseline block keeps each as a curve of checkpoints, like the loss
(:func:`metric_curves`). Each metric is one check, named after
it, against the band of the loss check,

    |now - baseline| <= loss_rtol * |baseline| + loss_atol * scale

where ``scale`` is the largest magnitude of the metric's baseline checkpoints (so ``atol``
means the same for an accuracy near 1 and a learning rate near 1e-3). A metric has no
better direction (a higher accuracy, a lower gradient norm: either says the training
changed), so a checkpoint or final value outside the band, on either side, is a
``regression``: accept an intended change with ``--accelperf-update``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace

from pytest_accelperf.checks.base import BaseCheck
from pytest_accelperf.checks.convergence import Curve, loss_checkpoints
from pytest_accelperf.checks.outcome import missing_in_baseline, new_result
from pytest_accelperf.checks.protocol import CheckInput
from pytest_accelperf.records.run import Run
from pytest_accelperf.records.verdict import CheckData, CheckResult, Tolerances, Verdict
from pytest_accelperf.stats.units import fmt_num, fmt_tolerance, round_sig
from pytest_accelperf.store.block import Block, BlockLike, Loss, read_block

_REMEDY = "re-record with --accelperf-update"


def _points(curve: Loss | None) -> list[tuple[float, float]]:
    return [(float(s), float(v)) for s, v in (curve.checkpoints if curve else None) or []]


def _step(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else fmt_num(x)


def check_metrics(block: BlockLike, baseline: BlockLike | None,
                  tol: Tolerances) -> list[CheckResult]:
    """One result per step metric of ``block`` or ``baseline``, by name."""
    block, baseline = read_block(block), read_block(baseline)
    now = block.metrics or {}
    base = (baseline.metrics if baseline is not None else None) or {}
    return [check_metric(name, now.get(name), base.get(name), baseline, tol)
            for name in sorted(set(now) | set(base))]


def check_metric(name: str, now: Loss | None, base: Loss | None, baseline: Block | None,
                 tol: Tolerances) -> CheckResult:
    """The curve ``now`` of metric ``name`` against the baseline's ``base``."""
    now_final = now.final if now else None
    if baseline is None:
        return new_result(name, now=now_final,
                          data={"checkpoints": [[s, v] for s, v in _points(now)]})
    if now is None:
        return CheckResult(name, Verdict.INCOMPARABLE,
                           f"the baseline recorded metric {name!r}, which this run's step no "
                           f"longer returns; {_REMEDY}",
                           baseline=base.final if base else None)
    if base is None:
        return missing_in_baseline(name, f"curve of metric {name!r}", baseline, now=now_final)
    base_final = base.final
    change = now_final / base_final - 1 if now_final is not None and base_final else None
    now_points, base_points = _points(now), _points(base)
    scale = max([abs(v) for _, v in base_points] + [abs(base_final or 0.0)])
    atol = tol.loss_atol * scale
    data: CheckData = {"rtol": tol.loss_rtol, "atol": atol, "scale": scale}
    result = CheckResult(name, Verdict.PASS, "", baseline=base_final, now=now_final,
                         change=change, data=data)
    band_text = f"rtol {fmt_tolerance(tol.loss_rtol)}, atol {fmt_num(atol, 3)}"
    if [s for s, _ in now_points] != [s for s, _ in base_points]:
        return replace(result, verdict=Verdict.INCOMPARABLE,
                       detail=(f"{name} has {now.steps} steps, the baseline "
                               f"{base.steps}; {_REMEDY}"))
    rows: list[list[float]] = []
    points = [*now_points, *([(math.inf, now_final)] if now_final is not None
                             and base_final is not None else [])]
    bases = [*base_points, *([(math.inf, base_final)] if now_final is not None
                             and base_final is not None else [])]
    for (step, now_v), (_, base_v) in zip(points, bases, strict=True):
        band = atol + tol.loss_rtol * abs(base_v)
        where = "final value" if math.isinf(step) else f"at step {_step(step)}"
        if math.isfinite(step):
            rows.append([step, base_v, now_v, band])
        if not math.isfinite(now_v) or abs(now_v - base_v) > band:
            side = "above" if now_v > base_v else "below"
            return replace(
                result, verdict=Verdict.REGRESSION,
                detail=(f"{name} {where} is {fmt_num(now_v)}, {side} the baseline's "
                        f"{fmt_num(base_v)} ± {fmt_num(band, 3)} ({band_text}): the "
                        f"training step changed; if intended, {_REMEDY}"),
                data={**data, "checkpoints": rows,
                      "step": None if math.isinf(step) else step})
    return replace(result, detail=f"all {len(rows)} checkpoints within the band ({band_text})",
                   data={**data, "checkpoints": rows})


def metric_curves(run: Run) -> dict[str, Curve]:
    """``{name: {"checkpoints", "final", "steps"}}`` of the step's other metrics, as the
    loss's curve; a metric with a non-finite value is left out (a baseline is strict JSON,
    and a NaN learning rate would have made the loss NaN anyway)."""
    out: dict[str, Curve] = {}
    for name, values in sorted(run.metrics.items()):
        if not values or not all(math.isfinite(v) for v in values):
            continue
        steps = run.loss_steps if len(run.loss_steps) == len(values) else None
        out[name] = {"checkpoints": loss_checkpoints(values, steps),
                     "final": round_sig(values[-1]), "steps": len(values)}
    return out


class MetricsCheck(BaseCheck):
    """One row per metric of the training step, each named after the metric (``accuracy``,
    ``lr``): the results carry those names, not this check's."""

    metric = "metrics"
    tolerances = ("loss_rtol", "loss_atol")
    sections = ("metrics",)

    def check(self, given: CheckInput) -> list[CheckResult]:
        return check_metrics(given.block, given.baseline, given.tol) if given.stepped else []

    def record(self, run: Run) -> Mapping[str, object]:
        """``metrics``: a curve per step metric, where the step returned any."""
        curves = metric_curves(run) if run.outcome == "ok" else {}
        return {"metrics": curves} if curves else {}


CHECK = MetricsCheck()
