"""A predicted out-of-memory is an outcome: recorded, compared, and a regression against an ok
baseline."""

from __future__ import annotations

import pytest
from conftest import Suite, verdicts

OOM_SUITE = '''
from tinytask import make_task
from pytest_accelperf import Case, cases

@cases(Case(backend="jax", batch=4096, memory_capacity={capacity}, params={{"dim": 512}}),
       Case(backend="jax", batch=4096, mesh=(8, 1), steps=3, warmup=0,
            memory_capacity={capacity}, params={{"dim": 512}}))
def test_big(accelperf):
    result = accelperf.train(make_task(accelperf.case))
'''


@pytest.mark.slow
def test_predicted_oom_is_recorded_and_compared(suite: Suite) -> None:
    # batch 4096 x dim 512 floats is 8 MiB of input: over 6 MiB on one device, under it on 8.
    suite.write(OOM_SUITE.format(capacity=6 * 2**20))
    result = suite.run("--accelperf-update", "--accelperf-json=report.json")
    result.assert_outcomes(passed=2)
    block = suite.load()["cases"]["test_big[jax-nomesh-b4096]"]
    assert block["outcome"] == "oom"
    assert block["oom"]["required_bytes"] > block["oom"]["capacity_bytes"] == 6 * 2**20
    assert "predicted out of memory" in block["message"]
    assert suite.load()["cases"]["test_big[jax-mesh8x1-b4096]"]["outcome"] == "ok"

    result = suite.run("--accelperf-json=report.json")
    result.assert_outcomes(passed=2)
    v = verdicts(suite.report())
    assert v["test_big[jax-nomesh-b4096]"] == {"outcome": "pass", "memory": "pass"}
    result.stdout.fnmatch_lines(["*test_big?jax-nomesh-b4096?*outcome*pass*"])


@pytest.mark.slow
def test_new_oom_against_an_ok_baseline_is_a_regression(suite: Suite) -> None:
    suite.write(OOM_SUITE.format(capacity=64 * 2**30))
    suite.run("--accelperf-update").assert_outcomes(passed=2)
    suite.write(OOM_SUITE.format(capacity=6 * 2**20))
    result = suite.run()
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*test_big?jax-nomesh-b4096?: 1 regression(s)*",
                                 "*outcome: *out of memory*"])
