"""The max-batch check: does the largest batch that fits still fit?

Seed 002 reports, per ZeRO stage, the largest global batch that trains without running out
of memory; a change that costs memory shows up there first. The search
(:mod:`pytest_accelperf.gate.maxbatch`) stores ``{"value", "capacity_bytes", "probes"}`` in the
block; this check compares ``value`` with the baseline's:

* lower: ``regression`` (the case fits fewer samples than it did);
* higher: ``improvement``;
* equal: ``pass``;
* searched against a different capacity, or with a different step between candidate
  batches: ``incomparable`` (re-record).

A search that found no batch that fits has ``value`` None, which is below any number.
"""

from __future__ import annotations

from collections.abc import Mapping

from pytest_accelperf.checks.base import BaseCheck
from pytest_accelperf.checks.outcome import missing_in_baseline, new_result
from pytest_accelperf.checks.protocol import CheckInput, one
from pytest_accelperf.records.run import Run
from pytest_accelperf.records.verdict import CheckResult, Verdict
from pytest_accelperf.stats.units import fmt_bytes
from pytest_accelperf.store.block import BlockLike, MaxBatch, read_block

METRIC = "max_batch"
UNIT = "samples"


def _cap(n: float | None) -> str:
    return fmt_bytes(n) if n is not None else "the device's capacity"


def _value(search: MaxBatch) -> int:
    return int(search.value) if search.value is not None else 0


def check_max_batch(block: BlockLike, baseline: BlockLike | None) -> CheckResult | None:
    """The block's max-batch search against the baseline's; None when the case has none."""
    block, baseline = read_block(block), read_block(baseline)
    now = block.max_batch
    if now is None:
        return None
    now_value = _value(now)
    shown_now = float(now_value) if now.value is not None else None
    if baseline is None:
        return new_result(METRIC, now=shown_now, unit=UNIT)
    base = baseline.max_batch
    if base is None:
        return missing_in_baseline(METRIC, "max-batch search", baseline, now=shown_now,
                                   unit=UNIT)
    base_value = _value(base)
    change = now_value / base_value - 1 if base_value else None
    cap = _cap(now.capacity_bytes)
    if now.capacity_bytes != base.capacity_bytes or now.multiple_of != base.multiple_of:
        verdict = Verdict.INCOMPARABLE
        detail = (f"searched against {cap} in steps of {now.multiple_of}, the baseline "
                  f"against {_cap(base.capacity_bytes)} in steps of {base.multiple_of}; "
                  f"re-record with --accelperf-update")
    elif now_value < base_value:
        verdict = Verdict.REGRESSION
        first_fail = min((int(b) for b, ok, _ in now.probes if not ok), default=None)
        why = (f"; batch {first_fail} does not fit" if first_fail is not None else "")
        detail = (f"the largest batch that fits in {cap} dropped from {base_value} to "
                  f"{now_value}{why}")
    elif now_value > base_value:
        verdict = Verdict.IMPROVEMENT
        detail = (f"the largest batch that fits in {cap} grew from {base_value} to "
                  f"{now_value}; run with --accelperf-update to record it")
    else:
        verdict = Verdict.PASS
        detail = f"the largest batch that fits in {cap} is still {now_value}"
    return CheckResult(METRIC, verdict, detail, baseline=float(base_value), now=shown_now,
                       unit=UNIT, change=change,
                       data={"now": now.to_json(), "baseline": base.to_json()})


class MaxBatchCheck(BaseCheck):
    """The ``max_batch`` row, when the test searched for the largest batch, whatever the
    run's outcome."""

    metric = METRIC
    sections = ("max_batch",)

    def check(self, given: CheckInput) -> tuple[CheckResult, ...]:
        return one(check_max_batch(given.block, given.baseline))

    def record(self, run: Run) -> Mapping[str, object]:
        """``max_batch``: the search (:mod:`pytest_accelperf.gate.maxbatch`)."""
        return {"max_batch": run.max_batch} if run.max_batch is not None else {}


CHECK = MaxBatchCheck()
