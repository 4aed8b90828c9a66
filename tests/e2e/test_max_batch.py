"""The max-batch search end to end through pytest: searched, stored and gated, and grown with the
mesh."""

from __future__ import annotations

import pytest
from conftest import Suite, verdicts

MAXBATCH_SUITE = '''
from tinytask import make_task
from pytest_accelperf import Case, MaxBatchSearch, cases

@cases(Case(backend="jax", batch=64, mesh=MESH, steps=5, warmup=1,
            memory_capacity=CAPACITY, params={"dim": 256, "out": 256}))
def test_fit(accelperf):
    result = accelperf.train(make_task(accelperf.case),
                             max_batch=MaxBatchSearch(make_task, limit=1 << 14))
    found = result.run.max_batch
    print("MAXBATCH", found["value"], len(found["probes"]))
'''


def maxbatch_suite(suite: Suite, capacity: int, mesh: str = "None") -> Suite:
    suite.write(MAXBATCH_SUITE.replace("CAPACITY", str(capacity)).replace("MESH", mesh))
    return suite


@pytest.mark.slow
def test_max_batch_is_searched_stored_and_gated(suite: Suite) -> None:
    maxbatch_suite(suite, 8 << 20)
    result = suite.run("--accelperf-update", "-s")
    result.assert_outcomes(passed=1)
    stored = suite.load()["cases"]["test_fit[jax-nomesh-b64]"]["max_batch"]
    value = stored["value"]
    assert value is not None and 64 <= value < 1 << 14
    fits = {b: ok for b, ok, _ in stored["probes"]}
    assert fits[value] is True and fits.get(value + 1, False) is False
    assert all(ok == (b <= value) for b, ok in fits.items())  # monotone, as searched
    assert all(need <= 8 << 20 for b, ok, need in stored["probes"] if ok)
    assert stored["capacity_bytes"] == 8 << 20

    result = suite.run("--accelperf-json=report.json")
    result.assert_outcomes(passed=1)
    assert verdicts(suite.report())["test_fit[jax-nomesh-b64]"]["max_batch"] == "pass"
    result.stdout.fnmatch_lines(["*max_batch*pass*"])

    # A baseline that fitted more: this run fits fewer, a regression naming both numbers.
    suite.edit(lambda b: b["max_batch"].update(value=value + 100))
    result = suite.run("--accelperf-json=report.json")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        f"*max_batch: the largest batch that fits in 8.00 MiB dropped from {value + 100} to "
        f"{value}*"])


@pytest.mark.slow
def test_max_batch_grows_with_the_mesh(suite: Suite) -> None:
    """Sharding over 8 devices fits a larger global batch in the same per-device memory."""
    maxbatch_suite(suite, 8 << 20, mesh="(8, 1)")
    result = suite.run("--accelperf-update", "-s")
    result.assert_outcomes(passed=1)
    sharded = suite.load()["cases"]["test_fit[jax-mesh8x1-b64]"]["max_batch"]["value"]
    maxbatch_suite(suite, 8 << 20)
    suite.run("--accelperf-update").assert_outcomes(passed=1)
    single = suite.load()["cases"]["test_fit[jax-nomesh-b64]"]["max_batch"]["value"]
    assert sharded > 2 * single
