"""The convergence check: does the loss curve stay within a band around the baseline's?

The curve is compared at the baseline block's checkpoints (the mean loss of each window of
steps, see :func:`loss_checkpoints`) and at the final loss. At
each point the band is

    |now - baseline| <= loss_atol + loss_rtol * |baseline|

A point *above* the band (higher loss) is a regression, reported at the first checkpoint
where it happens; a final loss *below* the band is an improvement; anything else passes.
A lower loss part-way that ends within the band is still a pass: only the end result
counts in the run's favour, any step counts against it.

With ``either_way`` (``--accelperf-loss-either-way``, what a CI gate should use) a curve
outside the band in *either* direction is a regression: a loss far below the baseline's
means the training changed (a learning rate ten times larger took a ResNet's final loss
from 1.178 to 0.235), and PyTorch's CI fails on unexpected wins too. The other metrics of
the step (:mod:`.metrics`) are always judged both ways.

A loss that is not finite never passes: a run whose outcome is ``nan`` is a regression
that names the step, with or without a baseline.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from typing import TypedDict

from pytest_accelperf.checks.base import BaseCheck
from pytest_accelperf.checks.outcome import missing_in_baseline, new_result
from pytest_accelperf.checks.protocol import CheckInput, one, stepped
from pytest_accelperf.records.run import Run
from pytest_accelperf.records.verdict import CheckData, CheckResult, Tolerances, Verdict
from pytest_accelperf.stats.units import fmt_num, fmt_signed_percent, fmt_tolerance, round_sig
from pytest_accelperf.store.block import BlockLike, Loss, read_block

METRIC = "loss"
UNIT = "loss"
#: Loss checkpoints kept per case (the seed logs every 20 steps of ~400).
N_CHECKPOINTS = 10
_REMEDY = "re-record with --accelperf-update"


def band(base: float, tol: Tolerances) -> float:
    """The allowed absolute deviation from a baseline loss."""
    return tol.loss_atol + tol.loss_rtol * abs(base)


def _band_text(tol: Tolerances) -> str:
    return f"rtol {fmt_tolerance(tol.loss_rtol)}, atol {fmt_num(tol.loss_atol)}"


def _step(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else fmt_num(x)


def nan_result(run: Run, baseline: BlockLike | None) -> CheckResult:
    """The regression for a run whose loss became non-finite, naming the step."""
    value = math.nan
    step = run.nan_step
    if step is not None and step in run.loss_steps:
        recorded = run.losses[run.loss_steps.index(step)]
        value = recorded if not math.isfinite(recorded) else math.nan  # inf stays inf
    elif step is None:
        for i, loss in enumerate(run.losses):
            if not math.isfinite(loss):
                value = loss
                step = run.loss_steps[i] if i < len(run.loss_steps) else i
                break
    shown = "nan" if math.isnan(value) else fmt_num(value)
    detail = f"loss is {shown} at step {step}" if step is not None else f"loss is {shown}"
    stored = read_block(baseline)
    base_final = stored.loss.final if stored is not None and stored.loss else None
    return CheckResult(METRIC, Verdict.REGRESSION, detail, baseline=base_final, now=value,
                       unit=UNIT, data={"nan_step": step})


def _points(loss: Loss | None) -> list[tuple[float, float]]:
    return [(float(s), float(v)) for s, v in (loss.checkpoints if loss else None) or []]


def _steps(loss: Loss | None, default: int) -> int:
    """The step count of ``loss``, ``default`` where it has none."""
    return loss.steps if loss is not None and loss.steps is not None else default


def check_convergence(run: Run, block: BlockLike, baseline: BlockLike | None,
                      tol: Tolerances, *, either_way: bool = False) -> CheckResult | None:
    """The loss curve of ``block`` against ``baseline``'s; None with no curve on either side.
    ``either_way``: below the band is a regression too."""
    if run.outcome == "nan":
        return nan_result(run, baseline)
    now, stored = read_block(block), read_block(baseline)
    now_loss = now.loss
    now_points = _points(now_loss)
    now_final = now_loss.final if now_loss else None
    base_loss = stored.loss if stored is not None else None
    base_points = _points(base_loss)
    if not now_points and not base_points:
        return None
    if stored is None:
        return new_result(METRIC, now=now_final, unit=UNIT,
                          data={"checkpoints": [[s, v] for s, v in now_points]})
    if not base_points:
        return missing_in_baseline(METRIC, "loss curve", stored, now=now_final, unit=UNIT)
    base_final = base_loss.final if base_loss else None

    change = now_final / base_final - 1 if now_final is not None and base_final else None
    result = CheckResult(METRIC, Verdict.PASS, "", baseline=base_final, now=now_final,
                         unit=UNIT, change=change)
    data: CheckData = {"rtol": tol.loss_rtol, "atol": tol.loss_atol}

    now_steps = [s for s, _ in now_points]
    base_steps = [s for s, _ in base_points]
    if now_steps != base_steps:
        n, m = _steps(now_loss, len(now_points)), _steps(base_loss, len(base_points))
        if n != m:
            detail = f"loss curve has {n} steps, baseline {m}; {_REMEDY}"
        else:
            detail = (f"loss checkpoints at steps {[_step(s) for s in now_steps]} differ "
                      f"from the baseline's {[_step(s) for s in base_steps]}; {_REMEDY}")
        return replace(result, verdict=Verdict.INCOMPARABLE, detail=detail,
                       data={**data, "steps": n, "baseline_steps": m})

    rows: list[list[float]] = []
    worst: tuple[float, float] | None = None  # (relative deviation, step)
    for (step, now_v), (_, base_v) in zip(now_points, base_points, strict=True):
        b = band(base_v, tol)
        rows.append([step, base_v, now_v, b])
        if not math.isfinite(base_v):
            return replace(result, verdict=Verdict.INCOMPARABLE,
                           detail=(f"the baseline's loss at step {_step(step)} is {base_v}; "
                                   f"{_REMEDY}"),
                           data={**data, "checkpoints": rows})
        if not math.isfinite(now_v) or now_v - base_v > b:
            return replace(result, verdict=Verdict.REGRESSION,
                           detail=(f"loss at step {_step(step)} is {fmt_num(now_v)}, above "
                                   f"the baseline's {fmt_num(base_v)} ± {fmt_num(b, 3)} "
                                   f"({_band_text(tol)})"),
                           data={**data, "checkpoints": rows, "step": step})
        if either_way and base_v - now_v > b:
            return replace(result, verdict=Verdict.REGRESSION,
                           detail=(f"loss at step {_step(step)} is {fmt_num(now_v)}, below "
                                   f"the baseline's {fmt_num(base_v)} ± {fmt_num(b, 3)} "
                                   f"({_band_text(tol)}): the training changed "
                                   f"(--accelperf-loss-either-way); if intended, {_REMEDY}"),
                           data={**data, "checkpoints": rows, "step": step,
                                 "either_way": True})
        dev = (now_v - base_v) / base_v if base_v else now_v - base_v
        if worst is None or abs(dev) > abs(worst[0]):
            worst = (dev, step)
    data["checkpoints"] = rows

    if now_final is not None and base_final is not None:
        b = band(base_final, tol)
        data["final"] = {"baseline": base_final, "now": now_final, "band": b}
        if not math.isfinite(now_final) or now_final - base_final > b:
            return replace(result, verdict=Verdict.REGRESSION, data=data, detail=(
                f"final loss is {fmt_num(now_final)}, above the baseline's "
                f"{fmt_num(base_final)} ± {fmt_num(b, 3)} ({_band_text(tol)})"))
        if base_final - now_final > b and either_way:
            return replace(result, verdict=Verdict.REGRESSION,
                           data={**data, "either_way": True}, detail=(
                               f"final loss is {fmt_num(now_final)}, below the baseline's "
                               f"{fmt_num(base_final)} ± {fmt_num(b, 3)} "
                               f"({_band_text(tol)}): the training changed "
                               f"(--accelperf-loss-either-way); if intended, {_REMEDY}"))
        if base_final - now_final > b:
            return replace(result, verdict=Verdict.IMPROVEMENT, data=data, detail=(
                f"final loss is {fmt_num(now_final)}, below the baseline's "
                f"{fmt_num(base_final)} ± {fmt_num(b, 3)} ({_band_text(tol)}); "
                f"run with --accelperf-update to record the new baseline"))

    detail = f"all {len(rows)} checkpoints within the band ({_band_text(tol)})"
    if worst is not None:
        detail += (f"; largest deviation {fmt_signed_percent(worst[0])} at step "
                   f"{_step(worst[1])}")
    return replace(result, detail=detail, data=data)


class Curve(TypedDict):
    """A curve as the baseline block stores it (the ``loss`` section, each of
    ``metrics``): ``[step, mean]`` checkpoints, the final value, the step count."""

    checkpoints: list[list[float]]
    final: float | None
    steps: int


def loss_checkpoints(losses: list[float], steps: list[int] | None = None,
                     n: int = N_CHECKPOINTS) -> list[list[float]]:
    """``[[step, mean loss of the window ending at step], ...]`` at ``n`` even checkpoints.

    The mean over each window smooths the step-to-step noise of small batches, so the band
    compares the trend rather than one lucky batch. Non-finite losses propagate (a NaN
    anywhere in a window makes that checkpoint NaN), so they cannot hide in an average.
    """
    if not losses:
        return []
    steps = list(steps) if steps else list(range(len(losses)))  # none given: 0, 1, ...
    k = min(n, len(losses))
    bounds = [round((i + 1) * len(losses) / k) for i in range(k)]
    out: list[list[float]] = []
    start = 0
    for end in bounds:
        window = losses[start:end]
        out.append([float(steps[end - 1]), round_sig(math.fsum(window) / len(window))])
        start = end
    return out


class LossCheck(BaseCheck):
    """The ``loss`` row: the curve of a finished run, or the step where it became NaN."""

    metric = METRIC
    tolerances = ("loss_rtol", "loss_atol")
    sections = ("loss",)

    def check(self, given: CheckInput) -> tuple[CheckResult, ...]:
        if given.stepped:
            return one(check_convergence(given.run, given.block, given.baseline, given.tol,
                                         either_way=given.loss_either_way))
        if given.run.outcome == "nan":
            return (nan_result(given.run, given.baseline),)
        return ()

    def record(self, run: Run) -> Mapping[str, object]:
        """``loss``: the curve's checkpoints, the final loss and the step count (none for
        a compile-only run, which has no steps)."""
        if not stepped(run):
            return {}
        loss: Curve = {
            "checkpoints": loss_checkpoints(run.losses, run.loss_steps),
            "final": round_sig(run.losses[-1]) if run.losses else None,
            "steps": len(run.losses),
        }
        return {"loss": loss}


CHECK = LossCheck()
