"""The terminal table: per-device memory rows under a ``memory`` check (seed 002's columns),
and the summary line's counts."""

from __future__ import annotations

from typing import Any

from pytest_accelperf.checks.memory import check_memory
from pytest_accelperf.records.verdict import CheckResult, Tolerances, Verdict
from pytest_accelperf.report.data import CaseRecord, SessionReport
from pytest_accelperf.report.terminal import MAX_DEVICE_ROWS, sub_rows, table_lines


def _block(per_device: dict[str, int]) -> dict[str, Any]:
    return {"memory": {"per_device": per_device, "peak": max(per_device.values()),
                       "source": "MemTracker"}}


def test_ranks_with_different_peaks_get_one_row_each() -> None:
    base = _block({"rank0": 2_000_000, "rank1": 2_100_000})
    now = _block({"rank0": 2_000_000, "rank1": 2_520_000})
    check = check_memory(now, base, Tolerances())
    assert check is not None and check.verdict is Verdict.REGRESSION
    rows = sub_rows(check)
    assert [r[1] for r in rows] == ["  rank0", "  rank1"]
    assert rows[0][4] == "+0.0%" and rows[1][4] == "+20.0%"
    assert rows[1][2] == "2.00 MiB" and rows[1][3] == "2.40 MiB"


def test_a_new_multi_rank_case_lists_its_ranks() -> None:
    check = check_memory(_block({"rank0": 1_000_000, "rank1": 1_500_000}), None, Tolerances())
    assert check is not None and check.verdict is Verdict.NEW
    rows = sub_rows(check)
    assert [(r[1], r[2], r[4]) for r in rows] == [("  rank0", "-", "-"), ("  rank1", "-", "-")]


def test_uniform_or_too_many_devices_stay_one_row() -> None:
    same = {f"cpu:{i}": 3_000_000 for i in range(4)}
    check = check_memory(_block(same), _block(same), Tolerances())
    assert check is not None and sub_rows(check) == []
    many = {f"cpu:{i}": 1_000_000 + i for i in range(MAX_DEVICE_ROWS + 1)}
    check = check_memory(_block(many), _block(many), Tolerances())
    assert check is not None and sub_rows(check) == []


def _errored(name: str) -> CaseRecord:
    return CaseRecord(nodeid=f"test_suite.py::test_x[{name}]", case_id=name, platform="cpu-x8",
                      run={"outcome": "error"}, error="RuntimeError: the batch is broken")


def test_a_session_where_every_case_errored_says_so() -> None:
    """The summary line counted verdicts only, and read `3 case(s) on cpu-x8: ` when no
    case got as far as a check."""
    report = SessionReport(platform="cpu-x8", records=[_errored(n) for n in "abc"])
    lines = table_lines(report)
    assert lines[-1] == "accelperf: 3 case(s) on cpu-x8: 3 errors"
    report.records[1:] = []
    assert table_lines(report)[-1] == "accelperf: 1 case(s) on cpu-x8: 1 error"


def test_errors_are_counted_beside_verdicts() -> None:
    ok = CaseRecord(nodeid="test_suite.py::test_x[ok]", case_id="ok", platform="cpu-x8",
                    run={"outcome": "ok"},
                    checks=[CheckResult("outcome", Verdict.NEW, ""),
                            CheckResult("loss", Verdict.PASS, "")])
    report = SessionReport(platform="cpu-x8", records=[ok, _errored("bad")])
    assert table_lines(report)[-1] == "accelperf: 2 case(s) on cpu-x8: 1 pass, 1 new, 1 error"


def test_the_markdown_headline_counts_errors_too() -> None:
    """The pull-request summary's headline, like the terminal's count line, says that every
    case errored instead of 'checks: none'."""
    from pytest_accelperf.report.markdown import headline

    report = SessionReport(platform="cpu-x8", records=[_errored(n) for n in "abc"])
    text = headline(report)
    assert text.startswith("❌ regression")
    assert text.endswith("checks: **3 errors**")
