"""--accelperf-add-session end to end: sessions added to a stored baseline widen its throughput
interval."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import Suite, verdicts


@pytest.mark.slow
def test_add_session_end_to_end(suite: Suite) -> None:
    suite.write()
    result = suite.run("--accelperf-add-session")
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(["*no session added: there is no baseline to add it to; "
                                 "record one first with --accelperf-update*"])
    assert not suite.baseline_path().exists()

    suite.run("--accelperf-update").assert_outcomes(passed=2)
    first = suite.load()
    second = suite.run("--accelperf-add-session")
    second.assert_outcomes(passed=2)
    second.stdout.fnmatch_lines([
        "accelperf: 2 case(s) now hold 2 baseline sessions; 2 hold fewer than the 3 from "
        "which their spread counts: run --accelperf-add-session again in a new session"])
    third = suite.run("--accelperf-add-session")
    third.assert_outcomes(passed=2)
    third.stdout.fnmatch_lines([
        "accelperf: 2 case(s) now hold 3 baseline sessions; their spread now widens the "
        "throughput interval"])
    data = suite.load()
    for case, block in data["cases"].items():
        before = first["cases"][case]
        assert len(block["step_time"]["sessions"]) == 3
        assert block["step_time"]["sessions"][0] == before["step_time"]["sessions"][0]
        # nothing but the sessions changed
        block["step_time"].pop("sessions")
        before["step_time"].pop("sessions")
        assert block == before

    result = suite.run("--accelperf-json=report.json", "--accelperf-throughput-tolerance=0.5")
    result.assert_outcomes(passed=2)
    assert "baseline sessions" not in result.stdout.str()  # nothing written, nothing to say
    checks = {c["nodeid"]: c for c in _throughput(suite.report())}
    assert len(checks) == 2
    for check in checks.values():
        assert check["data"]["sessions"] == 3
        assert "3 baseline sessions, between-session SD" in check["detail"]
    assert set(v["throughput"] for v in verdicts(suite.report()).values()) <= {
        "pass", "inconclusive"}


def _throughput(report: dict[str, Any]) -> list[dict[str, Any]]:
    return [{**check, "nodeid": case["nodeid"]} for case in report["cases"]
            for check in case["checks"] if check["metric"] == "throughput"]
