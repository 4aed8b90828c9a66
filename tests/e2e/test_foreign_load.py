"""Another job's load beside a whole session (issue 15, part 1): a stored baseline beside a steady
competitor is not a failure."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import Suite

# -- end to end ------------------------------------------------------------------------------
ONE_CASE = '''
from tinytask import make_task
from pytest_accelperf import cases

@cases(backend="jax", batch=[256], steps=30, warmup=2, params={"dim": 512, "out": 512})
def test_one(accelperf):
    accelperf.train(make_task(accelperf.case))
'''


def _throughput(suite: Suite) -> dict[str, Any]:
    check: dict[str, Any] = next(c for c in suite.report()["cases"][0]["checks"]
                                 if c["metric"] == "throughput")
    return check


@pytest.mark.slow
def test_a_stored_baseline_beside_a_steady_competitor_is_not_a_failure(suite: Suite,
                                                                      competitor: int) -> None:
    """The symptom: a steady competitor, a slower step, nothing else amiss. The baseline is
    made 1000x faster than anything this machine does, so every measurement is a
    'regression' by its ratio: beside the competitor it is not judged, and the
    confirmation backs off, re-measures, and says what it saw. At the default bound: the
    spinner took 0.496 cores beside this case's threads (and the other xdist worker's)."""
    suite.write(ONE_CASE)
    suite.run("--accelperf-update").assert_outcomes(passed=1)
    suite.edit(lambda b: b["step_time"].update(
        samples=[t / 1000 for t in b["step_time"]["samples"]]))
    result = suite.run("--accelperf-max-foreign-load=0.25", "--accelperf-confirm=1",
                       "--accelperf-throughput-tolerance=0.1", "--accelperf-json=report.json")
    result.assert_outcomes(passed=1)
    check = _throughput(suite)
    assert check["verdict"] == "inconclusive", check["detail"]
    assert check["data"]["load"]["foreign_cores"] > 0.25
    assert check["data"]["measured_verdict"] == "regression"
    detail = str(check["detail"])
    assert detail.startswith("not judged, this run's measurement is contaminated: other "
                             "processes used ")
    assert "(bound 0.25, --accelperf-max-foreign-load)" in detail
    assert "(re-measured 1 time(s), contaminated each time: " in detail
    assert "waited 5 s for a quieter machine before re-measuring" in detail
