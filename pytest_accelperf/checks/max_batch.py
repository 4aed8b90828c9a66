"""The max-batch check: does the largest batch that fits still fit?

Seed 002 reports, per ZeRO stage, the largest global batch that trains without running out
of memory; a change that costs memory shows up there first. The search
(:mod:`pytest_accelperf.maxbatch`) stores ``{"value", "capacity_bytes", "probes"}`` in the
block; this check compares ``value`` with the baseline's:

* lower: ``regression`` (the case fits fewer samples than it did);
* higher: ``improvement``;
* equal: ``pass``;
* searched against a different capacity, or with a different step between candidate
  batches: ``incomparable`` (re-record).

A search that found no batch that fits has ``value`` None, which is below any number.
"""

from __future__ import annotations

from typing import Any

from pytest_accelperf.checks.base import CheckResult, Verdict
from pytest_accelperf.checks.outcome import missing_in_baseline, new_result
from pytest_accelperf.checks.protocol import BaseCheck, CheckInput, one
from pytest_accelperf.run import Run
from pytest_accelperf.units import fmt_bytes

METRIC = "max_batch"
UNIT = "samples"


def _cap(n: Any) -> str:
    return fmt_bytes(n) if n is not None else "the device's capacity"


def _value(search: dict[str, Any]) -> int:
    value = search.get("value")
    return int(value) if value is not None else 0


def check_max_batch(block: dict[str, Any], baseline: dict[str, Any] | None) -> CheckResult | None:
    """The block's max-batch search against the baseline's; None when the case has none."""
    now: dict[str, Any] | None = block.get("max_batch")
    if now is None:
        return None
    now_value = _value(now)
    shown_now = float(now_value) if now.get("value") is not None else None
    if baseline is None:
        return new_result(METRIC, now=shown_now, unit=UNIT)
    base: dict[str, Any] | None = baseline.get("max_batch")
    if base is None:
        return missing_in_baseline(METRIC, "max-batch search", baseline, now=shown_now,
                                   unit=UNIT)
    base_value = _value(base)
    change = now_value / base_value - 1 if base_value else None
    if (now.get("capacity_bytes") != base.get("capacity_bytes")
            or now.get("multiple_of", 1) != base.get("multiple_of", 1)):
        verdict = Verdict.INCOMPARABLE
        detail = (f"searched against {_cap(now.get('capacity_bytes'))} in steps of "
                  f"{now.get('multiple_of', 1)}, the baseline against "
                  f"{_cap(base.get('capacity_bytes'))} in steps of "
                  f"{base.get('multiple_of', 1)}; re-record with --accelperf-update")
    elif now_value < base_value:
        cap = _cap(now.get("capacity_bytes"))
        verdict = Verdict.REGRESSION
        first_fail = min((int(b) for b, ok, _ in now.get("probes", []) if not ok), default=None)
        why = (f"; batch {first_fail} does not fit" if first_fail is not None else "")
        detail = (f"the largest batch that fits in {cap} dropped from {base_value} to "
                  f"{now_value}{why}")
    elif now_value > base_value:
        cap = _cap(now.get("capacity_bytes"))
        verdict = Verdict.IMPROVEMENT
        detail = (f"the largest batch that fits in {cap} grew from {base_value} to "
                  f"{now_value}; run with --accelperf-update to record it")
    else:
        cap = _cap(now.get("capacity_bytes"))
        verdict = Verdict.PASS
        detail = f"the largest batch that fits in {cap} is still {now_value}"
    return CheckResult(METRIC, verdict, detail, baseline=float(base_value), now=shown_now,
                       unit=UNIT, change=change, data={"now": now, "baseline": base})


class MaxBatchCheck(BaseCheck):
    """The ``max_batch`` row, when the test searched for the largest batch, whatever the
    run's outcome."""

    metric = METRIC
    sections = ("max_batch",)

    def check(self, given: CheckInput) -> tuple[CheckResult, ...]:
        return one(check_max_batch(given.block, given.baseline))

    def record(self, run: Run) -> dict[str, Any]:
        """``max_batch``: the search (:mod:`pytest_accelperf.maxbatch`)."""
        return {"max_batch": run.max_batch} if run.max_batch is not None else {}


CHECK = MaxBatchCheck()
