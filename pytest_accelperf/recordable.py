"""What may become a baseline, and what a baseline can clear: one rule for
``--accelperf-update``, ``accelperf baselines accept`` and the messages that offer them.

A baseline records an intended change. A run that did not finish (``nan``, ``error``,
``timeout``), a failed correctness check (the single-device reference), or a non-finite
loss or parameter is a failure, and storing it would make the next run compare against a
broken expectation; so the plugin and the CLI refuse it alike, and say why
(:func:`unrecordable`).

Some failures are no baseline matter at all (:func:`not_cleared_by_a_baseline`): the
reference check (a correctness bug), an A/B comparison (the base revision decides it), a
leak (judged against ``--accelperf-leak-bytes-per-step``, baseline or not) and a scaling
curve (judged against its expected shape). Accepting a run cannot clear them, so no
failure message offers it for them and ``accelperf baselines accept`` refuses a case that
has no other failure.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from pytest_accelperf.checks.base import CheckResult
from pytest_accelperf.checks.memory import METRIC as MEMORY_METRIC
from pytest_accelperf.checks.numerics import REFERENCE_METRIC
from pytest_accelperf.checks.scaling import METRIC as SCALING_METRIC
from pytest_accelperf.run import Run

#: Outcomes never stored as a baseline: they are failures, not expectations.
UNRECORDABLE: tuple[str, ...] = ("nan", "error", "timeout")


def unrecordable(run: Run, checks: Sequence[CheckResult],
                 block: Mapping[str, Any] | None = None) -> str | None:
    """Why ``run`` must not become a baseline, None when it may. ``block`` is the run's
    baseline block (its numerics fingerprint is checked for non-finite parameters)."""
    if run.outcome in UNRECORDABLE:
        why = f" ({run.message})" if run.message else ""
        return f"the run ended with outcome {run.outcome}{why}"
    for check in checks:
        if check.metric == REFERENCE_METRIC and check.failed:
            return (f"the reference check failed: {check.detail}. A correctness failure is "
                    f"not an intended change")
    for step, loss in zip(run.loss_steps or range(len(run.losses)), run.losses, strict=False):
        if not math.isfinite(loss):
            return f"loss is {loss} at step {step}"
    for path, leaf in ((block or {}).get("numerics") or {}).items():
        values = [leaf.get("rms"), *(leaf.get("sample") or [])]
        if any(isinstance(v, float) and not math.isfinite(v) for v in values):
            what = "state leaf" if leaf.get("state") is True else "parameter"
            return f"{what} {path} is not finite after training"
    return None


def not_cleared_by_a_baseline(check: CheckResult) -> str | None:
    """What clears a failed ``check`` when storing a new baseline does not, in words (a
    sentence that names the fix), or None: the check is not failed, or a baseline clears
    it."""
    if not check.failed:
        return None
    if check.metric == REFERENCE_METRIC:
        return ("the run disagrees with its single-device reference, a correctness bug in "
                "the parallel code (a partition spec, a missing gradient reduction): fix it")
    if check.data.get("mode") == "ab":
        return ("A/B verdicts are not stored: the base revision is what changes them, if the "
                "slowdown is intended")
    if check.metric == MEMORY_METRIC and check.data.get("leak"):
        return ("live memory grows with every step, a leak judged against "
                "--accelperf-leak-bytes-per-step whatever the baseline: fix the step (or "
                "raise the bound if the growth is intended)")
    if check.metric == SCALING_METRIC:
        return ("the scaling curve is judged against its expected shape, not a baseline: "
                "fix the scaling, or change the test's expect=")
    return None


def clearable(checks: Sequence[CheckResult]) -> list[CheckResult]:
    """The failed checks of ``checks`` that storing the run as a baseline would clear."""
    return [c for c in checks if c.failed and not_cleared_by_a_baseline(c) is None]
