"""--accelperf-add-session end to end: sessions added to a stored baseline widen its throughput
interval."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import Suite, verdicts

# One case of the suite (conftest.SUITE has a second, on a 4x2 mesh): a session is added to
# every case alike, and the mesh case's five compiles and trainings on 8 devices were 40 %
# of this test's CPU time (31.4 s with it, 18.4 s without, run alone at load 5).
ONE_CASE = '''
from tinytask import make_task
from pytest_accelperf import cases

# 256 x 512 x 512 matmuls: ~10 ms a step, long enough for step times to mean something.
@cases(backend="jax", batch=[256], steps=30, warmup=2, params={"dim": 512, "out": 512})
def test_sweep(accelperf):
    accelperf.train(make_task(accelperf.case))
'''


@pytest.mark.slow
@pytest.mark.timing
def test_add_session_end_to_end(suite: Suite) -> None:
    suite.write(ONE_CASE)
    result = suite.run("--accelperf-add-session")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*no session added: there is no baseline to add it to; "
                                 "record one first with --accelperf-update*"])
    assert not suite.baseline_path().exists()

    suite.run("--accelperf-update").assert_outcomes(passed=1)
    first = suite.load()
    second = suite.run("--accelperf-add-session")
    second.assert_outcomes(passed=1)
    second.stdout.fnmatch_lines([
        "accelperf: 1 case(s) now hold 2 baseline sessions; 1 hold fewer than the 3 from "
        "which their spread counts: run --accelperf-add-session again in a new session"])
    third = suite.run("--accelperf-add-session")
    third.assert_outcomes(passed=1)
    third.stdout.fnmatch_lines([
        "accelperf: 1 case(s) now hold 3 baseline sessions; their spread now widens the "
        "throughput interval"])
    data = suite.load()
    assert list(data["cases"]) == ["test_sweep[jax-nomesh-b256]"]
    for case, block in data["cases"].items():
        before = first["cases"][case]
        assert len(block["step_time"]["sessions"]) == 3
        assert block["step_time"]["sessions"][0] == before["step_time"]["sessions"][0]
        # nothing but the sessions changed
        block["step_time"].pop("sessions")
        before["step_time"].pop("sessions")
        assert block == before

    result = suite.run("--accelperf-json=report.json", "--accelperf-throughput-tolerance=0.5")
    result.assert_outcomes(passed=1)
    assert "baseline sessions" not in result.stdout.str()  # nothing written, nothing to say
    checks = {c["nodeid"]: c for c in _throughput(suite.report())}
    assert len(checks) == 1
    for check in checks.values():
        assert check["data"]["sessions"] == 3
        assert "3 baseline sessions, between-session SD" in check["detail"]
    assert set(v["throughput"] for v in verdicts(suite.report()).values()) <= {
        "pass", "inconclusive"}


def _throughput(report: dict[str, Any]) -> list[dict[str, Any]]:
    return [{**check, "nodeid": case["nodeid"]} for case in report["cases"]
            for check in case["checks"] if check["metric"] == "throughput"]
