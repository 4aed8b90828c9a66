"""The max-batch check on its own (pytest_accelperf/checks/max_batch.py)."""

from __future__ import annotations

from typing import Any

import pytest

from pytest_accelperf.checks.max_batch import check_max_batch
from pytest_accelperf.records.verdict import Verdict


def block(value: int | None, capacity: int = 1 << 30, probes: Any = ()) -> dict[str, Any]:
    return {"max_batch": {"value": value, "capacity_bytes": capacity, "multiple_of": 1,
                          "probes": [list(p) for p in probes]}}


@pytest.mark.parametrize("now, base, verdict", [
    (48, 48, Verdict.PASS), (40, 48, Verdict.REGRESSION), (64, 48, Verdict.IMPROVEMENT),
    (None, 8, Verdict.REGRESSION)])
def test_max_batch_check(now: int | None, base: int, verdict: Verdict) -> None:
    result = check_max_batch(block(now, probes=[(64, False, 2**31)]), block(base))
    assert result is not None and result.verdict is verdict
    if verdict is Verdict.REGRESSION:
        assert f"dropped from {base} to {now or 0}" in result.detail
        assert "batch 64 does not fit" in result.detail


def test_max_batch_check_other_capacity_is_incomparable() -> None:
    result = check_max_batch(block(48, capacity=1 << 30), block(48, capacity=1 << 31))
    assert result is not None and result.verdict is Verdict.INCOMPARABLE
    assert "1.00 GiB" in result.detail and "2.00 GiB" in result.detail
    assert check_max_batch({}, block(48)) is None
    new = check_max_batch(block(48), None)
    assert new is not None and new.verdict is Verdict.NEW
