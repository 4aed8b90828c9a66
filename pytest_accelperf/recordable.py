"""What may become a baseline: one rule for ``--accelperf-update`` and ``accelperf baselines
accept``.

A baseline records an intended change. A run that did not finish (``nan``, ``error``,
``timeout``), a failed correctness check (the single-device reference), or a non-finite
loss or parameter is a failure, and storing it would make the next run compare against a
broken expectation; so the plugin and the CLI refuse it alike, and say why.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from pytest_accelperf.checks.base import CheckResult
from pytest_accelperf.checks.numerics import REFERENCE_METRIC
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
            return f"parameter {path} is not finite after training"
    return None
