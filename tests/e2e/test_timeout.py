"""--accelperf-timeout end to end: a case past its time limit stops, and the session goes on."""

from __future__ import annotations

import pytest
from conftest import Suite

from e2e.test_confirm import slow_flag, torch_suite


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_timeout_stops_the_case_and_the_session_goes_on(suite: Suite) -> None:
    torch_suite(suite)
    suite.pytester.makepyfile(test_after='''
        from torchtask import make_task
        from pytest_accelperf import cases

        @cases(backend="torch", batch=[16], steps=20, warmup=1, accels=("cpu",))
        def test_next(accelperf):
            accelperf.train(make_task(accelperf.case))
    ''')
    slow_flag(suite, 0.3)  # 21 steps x 0.3 s, against a 2 s timeout
    result = suite.run("--accelperf-json=report.json", "--accelperf-timeout=2",
                       "test_suite.py", "test_after.py")
    # test_after sleeps too (the flag stays): it times out as well, but it ran.
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(["*exceeded the 2 s timeout after * of 21 steps*"])
    report = suite.report()
    outcomes = {c["case_id"]: c["run"]["outcome"] for c in report["cases"]}
    assert outcomes == {"torch-nomesh-b128": "timeout", "torch-nomesh-b16": "timeout"}
    first = next(c for c in report["cases"] if c["case_id"] == "torch-nomesh-b128")
    assert 0 < len(first["run"]["losses"]) < 21
