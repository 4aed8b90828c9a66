"""Options: flags, ini keys, [tool.accelperf], precedence and errors."""

from __future__ import annotations

import pytest
from conftest import Suite

from pytest_accelperf.options import OPTIONS


def test_help_lists_every_option(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--help")
    result.stdout.fnmatch_lines(["*pytest-accelperf: performance regression gate*"])
    out = result.stdout.str()
    for opt in OPTIONS:
        assert opt.flag in out, opt.flag
        assert opt.ini in out, opt.ini
    result.stdout.fnmatch_lines(["*--accel=ACCEL*accelerator to run cases on: cpu*"])


def test_unknown_accel_is_a_usage_error_listing_valid_ones(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest("--accel=fpga")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([
        "*invalid value 'fpga' for --accel; expected one of: cpu, gpu, tpu, neuron, auto*"
    ])


@pytest.mark.parametrize("flag", ["--accelperf-cpu-devices=0", "--accelperf-cpu-devices=many",
                                  "--accelperf-throughput-tolerance=-1"])
def test_bad_numbers_are_usage_errors(pytester: pytest.Pytester, flag: str) -> None:
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest(flag)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*command line --accelperf-*: invalid value*"])


def test_bad_ini_value_names_its_source(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\naccelperf_accel = quantum\n")
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*ini option accelperf_accel: invalid value 'quantum'*"])


def test_unknown_tool_accelperf_key(pytester: pytest.Pytester) -> None:
    pytester.makepyprojecttoml("[tool.accelperf]\nthroughput_tol = 0.2\n")
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*unknown key(s) throughput_tol in ?tool.accelperf?; valid:*"])


def test_precedence_flag_over_ini_over_pyproject(suite: Suite) -> None:
    pytester = suite.pytester
    pytester.makepyprojecttoml(
        '[tool.accelperf]\nbaselines = "from_pyproject"\nthroughput_tolerance = 0.3\n'
        'memory_tolerance = 0.25\n'
        '[tool.pytest.ini_options]\naccelperf_baselines = "from_ini"\n'
        'accelperf_throughput_tolerance = "0.4"\n'
    )
    pytester.makeconftest('''
        from pytest_accelperf.plugin import SESSION_KEY

        def pytest_sessionfinish(session):
            s = session.config.stash[SESSION_KEY].settings
            print("SETTINGS", s.baselines.name, s.tolerances.throughput_tolerance,
                  s.tolerances.memory_tolerance, s.update)
    ''')
    pytester.makepyfile("def test_x(): pass")
    suite.run("-s").stdout.fnmatch_lines(["*SETTINGS from_ini 0.4 0.25 False*"])
    suite.run("-s", "--accelperf-baselines=from_flag", "--accelperf-update").stdout.fnmatch_lines(
        ["*SETTINGS from_flag 0.4 0.25 True*"])


def test_per_case_tolerance_override(suite: Suite) -> None:
    suite.write('''
        from tinytask import make_task
        from pytest_accelperf import cases

        # The case's own tolerance wins over the command line's: 1000x passes anything
        # this machine does (a 0.01 % one would fail on the 20-50 % between sessions).
        @cases(backend="jax", batch=[16], steps=12, warmup=1,
               tolerances={"throughput_tolerance": 1000.0})
        def test_loose(accelperf):
            r = accelperf.train(make_task(accelperf.case))
            if r.check("throughput").verdict.value != "new":
                assert r.check("throughput").data["tolerance"] == 1000.0
                assert r.check("throughput").verdict.value == "pass"
    ''')
    suite.run("--accelperf-update").assert_outcomes(passed=1)
    suite.run("--accelperf-throughput-tolerance=0.0001").assert_outcomes(passed=1)


def test_cpu_devices_option(suite: Suite) -> None:
    suite.write('''
        from tinytask import make_task
        from pytest_accelperf import cases

        def test_devices(accelerator):
            assert accelerator.device_count == 4
            assert accelerator.platform == "cpu-x4"

        @cases(backend="jax", mesh=[(2, 2)], batch=[8], steps=4, warmup=0)
        def test_small(accelperf):
            accelperf.train(make_task(accelperf.case))
    ''')
    result = suite.run("--accelperf-cpu-devices=4", "--accelperf-update", subprocess=True)
    result.assert_outcomes(passed=2)
    assert suite.baseline_path(platform="cpu-x4").exists()


def test_platform_override(suite: Suite) -> None:
    suite.write()
    suite.run("--accelperf-platform=ci-runner", "--accelperf-update").assert_outcomes(passed=2)
    assert suite.baseline_path(platform="ci-runner").exists()
