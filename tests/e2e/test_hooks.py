"""The extension hooks, each used from a conftest as its docstring shows."""

from __future__ import annotations

import pytest
from conftest import Suite, verdicts


@pytest.mark.slow
def test_platform_environment_and_extra_check_hooks(suite: Suite) -> None:
    suite.pytester.makeconftest('''
        from pytest_accelperf import CheckResult, Verdict
        from pytest_accelperf.store.block import Block

        def pytest_accelperf_platform(config, accelerator):
            return f"lab-{accelerator.device_count}"

        def pytest_accelperf_environment(config, accelerator):
            return {"packages": {"libfoo": "1.2"}, "driver": "550"}

        def pytest_accelperf_extra_checks(run, block, baseline, tolerances):
            # the block to store and the stored one are typed, as a Check reads them
            assert isinstance(block, Block) and block.compile_time is not None
            assert baseline is None or (isinstance(baseline, Block)
                                        and baseline.environment.packages["libfoo"] == "1.2")
            verdict = Verdict.REGRESSION if run.compile_time > 1e-9 else Verdict.PASS
            return [CheckResult("compile_budget", verdict, "compile over budget",
                                now=run.compile_time, unit="s")]
    ''')
    suite.write('''
        from tinytask import make_task
        from pytest_accelperf import cases

        @cases(backend="jax", batch=[16], steps=4, warmup=0)
        def test_one(accelperf):
            accelperf.train(make_task(accelperf.case))
    ''')
    result = suite.run("--accelperf-update", "--accelperf-json=report.json")
    result.assert_outcomes(passed=1)
    block = suite.load(platform="lab-8")["cases"]["test_one[jax-nomesh-b16]"]
    assert block["environment"]["packages"]["libfoo"] == "1.2"
    assert block["environment"]["driver"] == "550"
    result = suite.run("--accelperf-json=report.json")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*compile_budget: compile over budget*"])
    assert verdicts(suite.report())["test_one[jax-nomesh-b16]"]["compile_budget"] == "regression"


def test_accel_auto_falls_back_to_cpu(suite: Suite) -> None:
    suite.write('''
        def test_auto(accelerator):
            assert accelerator.name == "cpu"
            assert accelerator.platform == "cpu-x8"
    ''')
    suite.run("--accel=auto", subprocess=True).assert_outcomes(passed=1)
