"""Issue 15, part 8: every failure names the fix that works.

Seen: a failing reference check said ``1 regression(s) against the cpu-x8 baseline`` and
offered ``--accelperf-update`` and ``accelperf baselines accept``; accept printed
``accepted 1 case(s)``, exit 0, and the next run failed the same way. Each symptom is
reproduced here on a real scratch suite, and the fix checked: a failure no baseline clears
(a reference check, a leak, an A/B comparison) says what does, and neither the failure
message, the Markdown summary nor ``accelperf baselines accept`` offers to accept it.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import Suite, recorded_once

from e2e.test_update import REFERENCE_SUITE
from pytest_accelperf.checks.recordable import clearable, not_cleared_by_a_baseline
from pytest_accelperf.checks.summary import summarize
from pytest_accelperf.checks.throughput import check_throughput
from pytest_accelperf.cli import main
from pytest_accelperf.records.run import Run
from pytest_accelperf.records.verdict import CheckResult, Tolerances, Verdict
from pytest_accelperf.report.data import SessionReport

# A step that keeps a fresh 132 KB device array alive each step (a leaking data pipeline),
# eight times the default --accelperf-leak-bytes-per-step; with LEAK unset it does not.
LEAK_SUITE = '''
import dataclasses
import os

import jax.numpy as jnp
from tinytask import make_task
from pytest_accelperf import cases

KEPT = []

@cases(backend="jax", batch=[16], steps=6, warmup=1)
def test_leaky(accelperf):
    task = make_task(accelperf.case)
    inner = task.make_batch

    def make_batch(step):
        if os.environ.get("LEAK"):
            KEPT.append(jnp.ones(33_000, jnp.float32))
        return inner(step)

    accelperf.train(dataclasses.replace(task, make_batch=make_batch))
'''


@pytest.fixture(scope="module")
def leak_recording(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the leak suite's baselines (recorded without LEAK) are kept once recorded."""
    return tmp_path_factory.mktemp("leak-recording") / "baselines"


@pytest.fixture
def leak_recorded(suite: Suite, leak_recording: Path) -> Suite:
    """The leak suite, its baselines recorded without LEAK once for the module's tests
    (:func:`conftest.recorded_once`)."""
    suite.write(LEAK_SUITE)
    return recorded_once(suite, leak_recording, passed=1)


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    status = main(list(argv))
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_a_reference_failure_is_never_offered_for_acceptance_and_accept_refuses_it(
        suite: Suite, capsys: pytest.CaptureFixture[str]) -> None:
    suite.write(REFERENCE_SUITE)
    result = suite.run("--accelperf-json=report.json", "-k", "sharded")
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert "regression(s) against" not in out and "accept it" not in out
    # the Markdown summary of that report offers no accept command either
    status, md, _ = cli(capsys, "report", "report.json", "--markdown", "-")
    assert status == 0 and "### ❌ Regressions" in md
    assert "accelperf baselines accept" not in md
    # and accept refuses it, writing nothing (it used to print "accepted 1 case(s)", exit 0)
    store = suite.pytester.path / "baselines"
    store.mkdir()
    status, out, err = cli(capsys, "baselines", "accept", "report.json", "--all")
    assert status == 1, out
    assert "never stored as a baseline: the reference check failed" in err
    assert "nothing was written" in err
    assert not any(store.iterdir())


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_a_leak_is_no_baseline_matter(leak_recorded: Suite, capsys: pytest.CaptureFixture[str],
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    suite = leak_recorded
    monkeypatch.setenv("LEAK", "1")
    result = suite.run("--accelperf-json=report.json", "--accelperf-markdown=report.md")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*test_leaky?jax-nomesh-b16?: 1 failure(s) that no baseline clears:",
        "  memory: live memory grew * per step *: a leak *",
        "  -> live memory grows with every step, a leak judged against "
        "--accelperf-leak-bytes-per-step whatever the baseline: fix the step*"])
    out = result.stdout.str()
    assert "regression(s) against" not in out and "accept it" not in out
    assert "accelperf baselines accept" not in (suite.pytester.path / "report.md").read_text()
    report = json.loads((suite.pytester.path / "report.json").read_text())
    assert SessionReport.from_json(report).acceptable == []
    before = suite.baseline_path().read_text()
    status, _, err = cli(capsys, "baselines", "accept", "report.json", "--all")
    assert status == 1
    assert "no baseline clears its failure(s), so accepting it would change nothing: memory: " \
           "live memory grows with every step" in err
    assert suite.baseline_path().read_text() == before  # nothing written
    # accepting it anyway (re-recording) does not clear it: the next run fails the same way
    suite.run("--accelperf-update").assert_outcomes(passed=1)
    suite.run().assert_outcomes(failed=1)


def triple_the_loss(block: dict[str, object]) -> None:
    """A stored block whose loss curve is 3x what the case trains to."""
    loss = block["loss"]
    assert isinstance(loss, dict)
    loss["checkpoints"] = [[s, v * 3] for s, v in loss["checkpoints"]]
    loss["final"] = loss["final"] * 3


@pytest.mark.slow
def test_a_leak_beside_a_baseline_failure_is_named_in_the_accept_offer(
        leak_recorded: Suite, monkeypatch: pytest.MonkeyPatch) -> None:
    suite = leak_recorded

    suite.edit(triple_the_loss)  # the baseline's loss is 3x this run's: a stored-baseline failure
    monkeypatch.setenv("LEAK", "1")
    result = suite.run("--accelperf-loss-either-way")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*test_leaky?jax-nomesh-b16?: 1 regression(s) against the cpu-x8 baseline:",
        "  loss: *",
        "*1 failure(s) that no baseline clears:",
        "  memory: *a leak*",
        "*If this change is intended, accept it (this clears the stored-baseline failures "
        "above, not the memory one) with:"])


def test_what_a_baseline_clears() -> None:
    def failed(metric: str, **data: object) -> CheckResult:
        return CheckResult(metric, Verdict.REGRESSION, "x", data=dict(data))

    stored = [failed("throughput"), failed("loss"), failed("memory"), failed("numerics")]
    assert clearable(stored) == stored
    for check in (failed("reference"), failed("throughput", mode="ab"),
                  failed("memory", leak=True), failed("scaling")):
        assert not_cleared_by_a_baseline(check), check
        assert clearable([check]) == []
    passing = CheckResult("reference", Verdict.PASS, "x")
    assert not_cleared_by_a_baseline(passing) is None


def test_an_unsteady_baseline_probe_says_it_is_the_baselines() -> None:
    """Seen: "the probe was too unsteady" did not say it was the baseline's probe, which
    turns drift correction off for that case until it is re-recorded."""

    def run(step: float, probe_noise: float, seed: int) -> Run:
        r = np.random.default_rng(seed)
        return Run(case_id="c", samples_per_step=8, n_devices=1,
                   step_times=[float(x) for x in step * (1 + 0.01 * r.standard_normal(30))],
                   probe_times=[float(x) for x in 0.004 * (1 + probe_noise
                                                          * r.standard_normal(30)) if x > 0],
                   probe_kind="numpy-matmul")

    base = summarize(run(0.010, 0.3, 0)).to_json()  # IQR ~0.4: past 0.25
    now = run(0.010, 0.01, 1)
    r = check_throughput(now, summarize(now), base, Tolerances())
    assert r is not None and r.data["drift_corrected"] is False
    assert ("[drift correction off: the baseline's numpy-matmul probe varied by IQR "
            in r.detail)
    assert "raw step times compared, and will be for this case until it is re-recorded]" \
        in r.detail


@pytest.mark.slow
def test_the_ci_recipe_fails_a_loss_far_below_its_baseline(leak_recorded: Suite,
                                                           tmp_path: Path) -> None:
    """A loss far from the baseline in either direction fails under
    --accelperf-loss-either-way (the README's CI recipe passes it); by default a lower loss
    is an improvement and passes."""
    suite = leak_recorded

    suite.edit(triple_the_loss)  # this run's loss is a third of the baseline's
    suite.run().assert_outcomes(passed=1)
    result = suite.run("--accelperf-loss-either-way")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*loss: *--accelperf-loss-either-way*"])
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    assert "--accelperf-loss-either-way --accelperf-json=accelperf.json" in readme
