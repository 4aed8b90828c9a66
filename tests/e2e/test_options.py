"""Options: flags, ini keys, [tool.accelperf], precedence and errors."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import Suite

from pytest_accelperf.gate.options import BY_KEY, OPTIONS, _convert


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


@pytest.mark.parametrize("flag, expected", [
    ("--accelperf-loss-rtol=nan", "a finite number >= 0"),
    ("--accelperf-loss-rtol=inf", "a finite number >= 0"),
    ("--accelperf-timeout=inf", "a finite number >= 0"),
    ("--accelperf-compare-budget=-inf", "a finite number >= 0"),
    ("--accelperf-host-lock-timeout=-1", "a finite number >= 0"),
    # 100000 virtual devices hang XLA's start-up; 32768 abort it after a minute.
    ("--accelperf-cpu-devices=100000", "an integer from 1 to 4096"),
    ("--accelperf-compare-processes=17", "an integer from 0 to 16"),
    ("--accelperf-compare-processes=-1", "an integer from 0 to 16"),
    # 2 rounds of one process pair ended in a ValueError traceback from the interval.
    ("--accelperf-compare-rounds=2", "an integer of at least 3"),
])
def test_non_finite_and_out_of_range_numbers_are_refused(pytester: pytest.Pytester, flag: str,
                                                         expected: str) -> None:
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest(flag)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    name, value = flag.split("=")
    result.stderr.fnmatch_lines([
        f"*command line {name}: invalid value '{value}' for {name}; expected {expected}"])


@pytest.mark.parametrize("toml, expected", [
    ("loss_rtol = true", "invalid value True for --accelperf-loss-rtol; expected a finite "
                         "number >= 0"),
    ("loss_atol = inf", "invalid value inf for --accelperf-loss-atol; expected a finite"),
    ("numerics_rtol = nan", "invalid value nan for --accelperf-numerics-rtol; expected a"),
    ("cpu_devices = 8.9", "invalid value 8.9 for --accelperf-cpu-devices; expected an "
                          "integer from 1 to 4096"),
    ("cpu_devices = true", "invalid value True for --accelperf-cpu-devices; expected an "
                           "integer"),
    ("confirm = 1.5", "invalid value 1.5 for --accelperf-confirm; expected a non-negative "
                      "integer"),
    ("update = 2.5", "invalid value 2.5 for --accelperf-update; expected true or false"),
])
def test_pyproject_numbers_are_typed(pytester: pytest.Pytester, toml: str,
                                     expected: str) -> None:
    """TOML has types: `true` is not 1.0 and 8.9 devices are not 8."""
    pytester.makepyprojecttoml(f"[tool.accelperf]\n{toml}\n")
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    key = toml.split(" =")[0]
    result.stderr.fnmatch_lines([f"*?tool.accelperf? {key}: {expected}*"])


def test_integral_numbers_from_every_source_still_work(pytester: pytest.Pytester) -> None:
    pytester.makepyprojecttoml("[tool.accelperf]\nconfirm = 3\nloss_rtol = 1\n"
                               "host_lock_timeout = 0\n")
    pytester.makeconftest('''
        from pytest_accelperf.plugin import SESSION_KEY

        def pytest_sessionfinish(session):
            s = session.config.stash[SESSION_KEY].settings
            print("SETTINGS", s.confirm, s.tolerances.loss_rtol, s.host_lock_timeout,
                  s.cpu_devices)
    ''')
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest("-s")
    result.stdout.fnmatch_lines(["*SETTINGS 3 1.0 None 8*"])
    # The bound itself is allowed (not run: XLA would start 4096 devices).
    assert _convert(BY_KEY["cpu_devices"], "4096", "command line") == 4096
    assert _convert(BY_KEY["cpu_devices"], 4096, "[tool.accelperf]") == 4096


@pytest.mark.parametrize("source", ["flag", "ini", "pyproject"])
def test_platform_must_be_one_path_component(pytester: pytest.Pytester, source: str) -> None:
    """`--accelperf-platform=../../x` would store baselines outside the store."""
    args: list[str] = []
    if source == "flag":
        args.append("--accelperf-platform=../../x")
        where = "command line --accelperf-platform"
    elif source == "ini":
        pytester.makeini("[pytest]\naccelperf_platform = ../../x\n")
        where = "ini option accelperf_platform"
    else:
        pytester.makepyprojecttoml('[tool.accelperf]\nplatform = "../../x"\n')
        where = "?tool.accelperf? platform"
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest("--accelperf-update", *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*{where}: invalid platform '../../x': a platform key is "
                                 f"one path component*--accelperf-platform*"])


@pytest.mark.parametrize("args, ini, which", [
    (["--accelperf-update", "--accelperf-compare=HEAD"], "", "--accelperf-update"),
    (["--accelperf-add-session"], "accelperf_compare = HEAD", "--accelperf-add-session"),
])
def test_update_and_compare_cannot_be_combined(pytester: pytest.Pytester, args: list[str],
                                               ini: str, which: str) -> None:
    """A/B mode never stores baselines: with --accelperf-update, compare was dropped."""
    if ini:
        pytester.makeini(f"[pytest]\n{ini}\n")
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*{which} and --accelperf-compare cannot be combined: A/B "
                                 f"mode*never stores baselines*without --accelperf-compare*"])


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


@pytest.mark.slow
def test_platform_override(suite: Suite) -> None:
    suite.write()
    suite.run("--accelperf-platform=ci-runner", "--accelperf-update").assert_outcomes(passed=2)
    assert suite.baseline_path(platform="ci-runner").exists()


def test_compare_processes_automatic_and_explicit() -> None:
    """0 (the default): 3 pairs, one per 4 s of the budget when that is more, at most 8."""
    from dataclasses import replace

    from pytest_accelperf.gate.options import Settings
    from pytest_accelperf.records.verdict import Tolerances

    base = Settings(accel="cpu", cpu_devices=8, update=False, baselines=Path("b"), json=None,
                    platform=None, tolerances=Tolerances())
    assert [replace(base, compare_budget=b).compare_pairs for b in (4, 20, 60, 600)] == \
        [3, 5, 8, 8]
    assert replace(base, compare_processes=1, compare_budget=60).compare_pairs == 1
