"""--accelperf-update records intended changes only: a run that fails a correctness check
(the single-device reference) or goes NaN never becomes a baseline, and its test fails."""

from __future__ import annotations

from conftest import Suite

# A sharded case with a single-device reference whose data differ from the sharded run's:
# the reference check fails, as it would for a sharding bug. After the measured run, the
# reference trains the single-device program and the sharded one again (reference_steps);
# every batch made then is scaled by another factor, so the two see different data.
REFERENCE_SUITE = '''
import dataclasses
from tinytask import make_task
from pytest_accelperf import cases

@cases(backend="jax", mesh=[(4, 2)], batch=[16], steps=6, warmup=1, reference=True)
def test_sharded(accelperf):
    task = make_task(accelperf.case)
    inner, last = task.make_batch, accelperf.case.warmup + accelperf.case.steps - 1
    seen_last, after = [], []

    def make_batch(step):
        batch = inner(step)
        if seen_last:  # the reference's runs, after the measured one: other data each call
            after.append(step)
            batch["x"] = batch["x"] * (2 + len(after))
        if step == last:
            seen_last.append(step)
        return batch

    accelperf.train(dataclasses.replace(task, make_batch=make_batch))

@cases(backend="jax", batch=[16], steps=6, warmup=1, label="fine")
def test_fine(accelperf):
    accelperf.train(make_task(accelperf.case))
'''

NAN_SUITE = '''
from tinytask import make_task
from pytest_accelperf import cases

@cases(backend="jax", batch=[16], steps=6, warmup=1)
def test_nan(accelperf):
    accelperf.train(make_task(accelperf.case, nan_at=3))
'''


def test_failed_reference_is_not_recorded_and_fails(suite: Suite) -> None:
    suite.write(REFERENCE_SUITE)
    result = suite.run("--accelperf-update", "--accelperf-json=report.json")
    result.assert_outcomes(failed=1, passed=1)
    result.stdout.fnmatch_lines([
        "*test_sharded?jax-mesh4x2-b16?: not recorded as a baseline: the reference check "
        "failed: * differs from the single-device reference*A correctness failure is not "
        "an intended change*"])
    stored = suite.load()["cases"]
    assert list(stored) == ["test_fine[jax-nomesh-b16-fine]"]  # the other case is recorded
    case = next(c for c in suite.report()["cases"] if c["case_id"] == "jax-mesh4x2-b16")
    assert case["block"] is None
    assert {c["metric"]: c["verdict"] for c in case["checks"]}["reference"] == "regression"


def test_nan_is_not_recorded_and_fails(suite: Suite) -> None:
    suite.write(NAN_SUITE)
    result = suite.run("--accelperf-update")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        ["*not recorded as a baseline: the run ended with outcome nan (*nan*step 3*"])
    assert not suite.baseline_path().exists()


def test_a_failure_that_cannot_be_stored_does_not_offer_to_accept_it(suite: Suite) -> None:
    """A failing reference check is not a change to accept: the message says to fix it
    instead of naming --accelperf-update or accelperf baselines accept, which would refuse."""
    suite.write(REFERENCE_SUITE)
    result = suite.run("--accelperf-json=report.json", "-k", "sharded")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*test_sharded?jax-mesh4x2-b16?: the run disagrees with its single-device reference, "
        "a correctness bug in the parallel code (*), not a change of baseline:",
        "*reference: *",
        "This run cannot become a baseline: fix the failure*"])
    assert "regression(s) against" not in result.stdout.str()
    assert "If this change is intended" not in result.stdout.str()
    assert "accelperf baselines accept report.json" not in result.stdout.str()
