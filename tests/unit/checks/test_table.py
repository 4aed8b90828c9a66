"""The table of checks (:mod:`pytest_accelperf.checks.table`) and the protocol each check
follows (:mod:`pytest_accelperf.checks.protocol`): what loops over the table, and a check
added from a test-only module, with no other file touched, that runs, shows in the terminal
table, is recorded in the report and the baseline, and is validated by the schema."""

from __future__ import annotations

import json
import math
import textwrap
from dataclasses import fields, replace
from typing import Any

import pytest
from conftest import Suite, verdicts

from pytest_accelperf.checks import BaseCheck, CheckInput, CheckResult, Verdict, run_checks
from pytest_accelperf.checks.summary import summarize
from pytest_accelperf.checks.table import BUILTIN, DEFAULT, check_of, checks, registered
from pytest_accelperf.records.environment import Environment
from pytest_accelperf.records.run import InputSeries, Run
from pytest_accelperf.records.verdict import Tolerances
from pytest_accelperf.store.schema import Block, block_model, validate_block

FULL = Run(
    case_id="jax-mesh2x1-b32", samples_per_step=32, n_devices=2,
    step_times=[0.010 + 0.0001 * (i % 7) for i in range(30)], compile_time=0.5,
    losses=[2.0 * 0.98**i for i in range(100)], loss_steps=list(range(100)),
    metrics={"accuracy": [i / 100 for i in range(100)]},
    memory_per_device={"cpu:0": 100 << 20, "cpu:1": 120 << 20}, memory_source="memory_analysis",
    memory_growth={"bytes_per_step": 0.0, "steps": 30, "after_warmup": 1.0, "after_steps": 1.0,
                   "source": "live_arrays"},
    params_fingerprint={"params/w": {"shape": [4], "dtype": "float32", "rms": 0.5,
                                     "sample": [0.1, -0.2], "sketch": 0.3}},
    probe_times=[0.002] * 30, probe_kind="matmul",
    inputs=InputSeries(times=[0.001] * 30, wall_times=[0.0012] * 30),
    program={"source": "xla", "flops": 1e6},
    max_batch={"value": 64, "probes": []}, replay={"steps": 30, "spread": 1e-6, "leaf": "params/w",
                                                       "leaves": {"params/w": 1e-6}},
    environment=Environment.from_json({"host_cpu": "Test CPU"}))


def test_every_tolerance_is_read_by_a_check_and_every_name_is_a_tolerance() -> None:
    named = [name for check in BUILTIN for name in check.tolerances]
    assert set(named) == {f.name for f in fields(Tolerances)}


def test_a_check_records_only_its_own_sections_and_they_are_the_schemas() -> None:
    block = summarize(FULL).to_json()
    declared = set(Block.model_fields)
    recorded: set[str] = set()
    for check in BUILTIN:
        assert set(check.sections) <= declared | set(check.section_models), check
        own = set(check.record(FULL))
        assert own <= set(check.sections), (check, own)
        assert not own & recorded, (check, own & recorded)  # one owner per section
        recorded |= own
    # every section of the block is a check's, but what every run records
    assert set(block) - recorded == {"outcome", "environment", "samples_per_step",
                                     "n_devices", "recorded_at"}
    validate_block(json.loads(json.dumps(block)))


def test_run_checks_is_the_table_in_its_order() -> None:
    baseline = json.loads(json.dumps(summarize(FULL).to_json()))
    results = run_checks(FULL, None, baseline, Tolerances(), reference_params={"w": [0.1]},
                         params={"w": [0.1]})
    metrics = [r.metric for r in results]
    assert metrics == ["outcome", "throughput", "loss", "accuracy", "input", "compile",
                       "program", "memory", "numerics", "reference", "max_batch"]
    owners = [check_of(m) for m in metrics]
    positions = [BUILTIN.index(o) for o in owners if o in BUILTIN]
    assert positions == sorted(positions)
    assert check_of("accuracy") is DEFAULT  # a step metric: the defaults
    nan = Run(case_id="c", outcome="nan", nan_step=3, losses=[1.0, math.nan],
              loss_steps=[2, 3], memory_per_device={"cpu:0": 1 << 20})
    assert [r.metric for r in run_checks(nan, None, baseline, Tolerances())] == [
        "outcome", "loss", "memory"]


class _Twice(BaseCheck):
    metric = "throughput"


def test_a_metric_that_a_check_has_is_refused_and_nothing_registered() -> None:
    with pytest.raises(ValueError, match="metric 'throughput' is taken by another check"), \
            registered(_Twice()):
        pass
    assert checks() == BUILTIN


# -- a check added in a test-only module -------------------------------------------------------
#: The whole of the added check: its module, and the conftest line that puts it in the
#: table for the session. Nothing of pytest_accelperf is edited.
STEPCOUNT = '''
from pydantic import BaseModel, ConfigDict, Field

from pytest_accelperf.checks import BaseCheck, CheckResult, Verdict


class Steps(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    measured: int = Field(ge=0)


class StepCount(BaseCheck):
    """How many steps were measured: the same as the baseline's, or a regression."""

    metric = "step_count"
    sections = ("step_count",)
    section_models = {"step_count": Steps}

    def record(self, run):
        return {"step_count": {"measured": len(run.step_times)}} if run.step_times else {}

    def check(self, given):
        # the blocks are read typed: this check's section as its model, Steps
        now = given.block.step_count.measured if given.block.step_count else None
        if now is None:
            return ()
        if given.baseline is None or given.baseline.step_count is None:
            return (CheckResult(self.metric, Verdict.NEW, "no baseline", now=now),)
        base = given.baseline.step_count.measured
        verdict = Verdict.PASS if now == base else Verdict.REGRESSION
        return (CheckResult(self.metric, verdict, f"{now} measured steps, baseline {base}",
                            baseline=base, now=now),)

    def label(self, result):
        return "step_count (measured)"


CHECK = StepCount()
'''

CONFTEST = '''
from stepcount import CHECK


def pytest_accelperf_checks(config):
    return [CHECK]
'''

CASE = '''
from tinytask import make_task
from pytest_accelperf import cases

@cases(backend="jax", batch=[16], steps=3, warmup=1)
def test_counted(accelperf):
    accelperf.train(make_task(accelperf.case))
'''

KEY = "test_counted[jax-nomesh-b16]"
#: ``KEY`` as an fnmatch pattern (where ``[...]`` is a set of characters).
KEY_PATTERN = "test_counted?jax-nomesh-b16?"


def _row(stdout: str, label: str) -> list[str]:
    return next(line.split() for line in stdout.splitlines() if label in line)


@pytest.mark.slow  # a pytest session that trains (5.5 s): not in the quick loop
@pytest.mark.usefixtures("host_lock_of_its_own")  # its check counts steps: no timing
def test_a_check_added_in_its_own_module_runs_shows_and_is_recorded(suite: Suite) -> None:
    suite.pytester.makepyfile(stepcount=textwrap.dedent(STEPCOUNT))
    suite.pytester.makeconftest(textwrap.dedent(CONFTEST))
    suite.write(CASE)

    result = suite.run("--accelperf-update", "--accelperf-json=report.json")
    result.assert_outcomes(passed=1)
    measured = len(suite.report()["cases"][0]["run"]["step_times"])
    assert measured == 3
    # run, and its verdict in the report and the terminal table, under its own label
    assert verdicts(suite.report())[KEY]["step_count"] == "new"
    assert _row(result.stdout.str(), "step_count (measured)")[-3:] == ["3", "-", "new"]
    # recorded: its section is stored in the baseline block beside the built-in ones
    block = suite.load()["cases"][KEY]
    assert block["step_count"] == {"measured": 3}
    assert "step_time" in block and "loss" in block

    def five(block: dict[str, Any]) -> None:
        block["step_count"] = {"measured": 5}

    suite.edit(five)
    result = suite.run("--accelperf-json=report.json")
    result.assert_outcomes(failed=1)
    assert verdicts(suite.report())[KEY]["step_count"] == "regression"
    assert _row(result.stdout.str(), "step_count (measured)")[-4:] == [
        "5", "3", "-", "REGRESSION"]
    result.stdout.fnmatch_lines([
        f"*{KEY_PATTERN}: 1 regression?s? against the cpu-x8 baseline:",
        "*  step_count: 3 measured steps, baseline 5",
        "If this change is intended, accept it with:",  # a baseline clears it, by default
    ])
    # the suite's verdict counts it as a check of its kind (deterministic, by default)
    result.stdout.fnmatch_lines(["accelperf: suite: 1 of 1 case regressed; * deterministic "
                                 "checks: 1 regression (step_count)"])

    def wrong(block: dict[str, Any]) -> None:
        block["step_count"] = {"measured": "three"}

    suite.edit(wrong)
    result = suite.run()
    result.assert_outcomes(failed=1)
    # the schema validates the section with the check's model: one line naming the field
    result.stdout.fnmatch_lines([f"*test_suite.json:*: case '{KEY_PATTERN}': invalid baseline "
                                 f"block: step_count.measured: Input should be a valid "
                                 f"integer*"])
    assert "Traceback" not in result.stdout.str()
    assert checks() == BUILTIN  # the session's check is gone with the session
    assert block_model() is Block


def test_a_registered_check_runs_in_run_checks_and_its_section_is_validated() -> None:
    class Loss2(BaseCheck):
        """The loss check again, re-added under another metric from this module."""

        metric = "loss_again"
        tolerances = ("loss_rtol", "loss_atol")
        sections = ("loss",)

        def check(self, given: CheckInput) -> tuple[CheckResult, ...]:
            return tuple(CheckResult(self.metric, r.verdict, r.detail, r.baseline, r.now,
                                     r.unit, r.change, r.data)
                         for r in check_of("loss").check(given))

    slower = replace(FULL, losses=[2.5 * 0.98**i for i in range(100)])
    baseline = json.loads(json.dumps(summarize(FULL).to_json()))
    with registered(Loss2()):
        results = {r.metric: r for r in run_checks(slower, None, baseline, Tolerances())}
        assert list(results)[-1] == "loss_again"
    assert results["loss_again"].verdict is Verdict.REGRESSION
    assert results["loss_again"].detail == results["loss"].detail
    assert "loss_again" not in {r.metric for r in run_checks(slower, None, baseline,
                                                             Tolerances())}


def test_the_step_metrics_reserved_are_the_tables_metrics() -> None:
    """A step metric may not take a check's name: the list the step APIs read is the
    table's, written out (a new check that is not added there would let a step's metric
    shadow it)."""
    from pytest_accelperf.backends.measure.common import RESERVED_METRICS
    from pytest_accelperf.checks.table import BUILTIN

    assert {c.metric for c in BUILTIN} == RESERVED_METRICS
