"""The terminal table: per-device memory rows under a ``memory`` check (seed 002's columns)."""

from __future__ import annotations

from typing import Any

from pytest_accelperf.checks.base import Tolerances, Verdict
from pytest_accelperf.checks.memory import check_memory
from pytest_accelperf.report.terminal import MAX_DEVICE_ROWS, device_rows


def _block(per_device: dict[str, int]) -> dict[str, Any]:
    return {"memory": {"per_device": per_device, "peak": max(per_device.values()),
                       "source": "MemTracker"}}


def test_ranks_with_different_peaks_get_one_row_each() -> None:
    base = _block({"rank0": 2_000_000, "rank1": 2_100_000})
    now = _block({"rank0": 2_000_000, "rank1": 2_520_000})
    check = check_memory(now, base, Tolerances())
    assert check is not None and check.verdict is Verdict.REGRESSION
    rows = device_rows(check)
    assert [r[1] for r in rows] == ["  rank0", "  rank1"]
    assert rows[0][4] == "+0.0%" and rows[1][4] == "+20.0%"
    assert rows[1][2] == "2.00 MiB" and rows[1][3] == "2.40 MiB"


def test_a_new_multi_rank_case_lists_its_ranks() -> None:
    check = check_memory(_block({"rank0": 1_000_000, "rank1": 1_500_000}), None, Tolerances())
    assert check is not None and check.verdict is Verdict.NEW
    rows = device_rows(check)
    assert [(r[1], r[2], r[4]) for r in rows] == [("  rank0", "-", "-"), ("  rank1", "-", "-")]


def test_uniform_or_too_many_devices_stay_one_row() -> None:
    same = {f"cpu:{i}": 3_000_000 for i in range(4)}
    check = check_memory(_block(same), _block(same), Tolerances())
    assert check is not None and device_rows(check) == []
    many = {f"cpu:{i}": 1_000_000 + i for i in range(MAX_DEVICE_ROWS + 1)}
    check = check_memory(_block(many), _block(many), Tolerances())
    assert check is not None and device_rows(check) == []
