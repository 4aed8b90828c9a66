"""Timing per machine, through real sessions (store/machines.py): a machine with no timing
of its own gets ``new for this machine`` for its timing checks and every deterministic
check judged; ``--accelperf-update`` on it writes its timing beside the recorder's and
nothing else; then its timing is judged against its own; one name for two hosts is one
line; ``accelperf baselines show`` lists the machines."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import Suite, verdicts

from pytest_accelperf import cli

TIMING = ("throughput", "compile", "input", "input_wait")
DETERMINISTIC = ("outcome", "loss", "program", "memory", "numerics")

ONE_CASE = '''
from tinytask import make_task
from pytest_accelperf import cases

@cases(backend="jax", batch=[64], steps=12, warmup=1)
def test_one(accelperf):
    accelperf.train(make_task(accelperf.case))
'''


def _checks(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    (case,) = report["cases"]
    return {c["metric"]: c for c in case["checks"]}


@pytest.mark.slow
def test_a_second_machine_is_new_then_recorded_beside_then_judged(
        suite: Suite, capsys: pytest.CaptureFixture[str]) -> None:
    suite.write(ONE_CASE)
    suite.run("--accelperf-update", "--accelperf-machine=first").assert_outcomes(passed=1)
    first = suite.load()
    (block,) = first["cases"].values()
    assert block["machine"] == "first" and "machines" not in block

    # another machine: timing new for it, the rest judged, the test passes, nothing written
    result = suite.run("--accelperf-machine=second", "--accelperf-json=report.json")
    result.assert_outcomes(passed=1)
    checks = _checks(suite.report())
    assert suite.report()["machine"] == "second"
    for metric in TIMING:
        if metric in checks:
            assert checks[metric]["verdict"] == "new", metric
            assert checks[metric]["detail"].startswith("new for this machine (second): ")
    assert "throughput" in checks and "compile" in checks
    for metric in DETERMINISTIC:
        assert checks[metric]["verdict"] == "pass", (metric, checks[metric]["detail"])
    assert suite.load() == first

    # its update writes its timing beside the first's, and nothing else
    result = suite.run("--accelperf-update", "--accelperf-machine=second")
    result.assert_outcomes(passed=1)
    both = suite.load()
    (stored,) = both["cases"].values()
    assert both["schema_version"] == 3
    assert {k: v for k, v in stored.items() if k != "machines"} == block
    assert list(stored["machines"]) == ["second"]
    assert stored["machines"]["second"]["environment"] == "second"  # in the file's table
    assert both["environments"]["second"]["cpu_isa"]
    assert stored["machines"]["second"]["step_time"]["samples"]

    # now its timing is judged against its own, not new, not incomparable
    suite.run("--accelperf-machine=second", "--accelperf-json=report.json").assert_outcomes(
        passed=1)
    checks = _checks(suite.report())
    assert checks["throughput"]["verdict"] in ("pass", "inconclusive", "improvement")
    assert checks["throughput"]["data"]["n"]["baseline"] == len(
        stored["machines"]["second"]["step_time"]["samples"])

    # show lists both
    assert cli.main(["baselines", "show", "--baselines", str(suite.pytester.path / "baselines")
                     ]) == 0
    out = capsys.readouterr().out
    assert "  first: 1 case(s), recorded the shared sections of 1; " in out
    assert "  second: 1 case(s); " in out

    # one name for two hosts: one line naming both, the test fails, nothing written
    def other_host(data: dict[str, Any]) -> None:
        data["environments"]["second"]["cpu_isa"] = "sse2"

    data = suite.load()
    other_host(data)
    suite.baseline_path().write_text(json.dumps(data, indent=2, sort_keys=True))
    result = suite.run("--accelperf-machine=second")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*test_one*: machine 'second' names two hosts with different "
                                 "fingerprints: this one (*) and the one whose timing is "
                                 "stored under that name (cpu_isa 'sse2'*"])


def test_a_machine_name_that_is_not_a_path_component_is_one_line(suite: Suite) -> None:
    suite.write(ONE_CASE)
    result = suite.run("--accelperf-machine=../up")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: command line --accelperf-machine: invalid machine "
                                 "name '../up': a machine is named by one path component*"])
    assert not Path(suite.pytester.path / "baselines").exists()
    assert "Traceback" not in result.stderr.str()


def test_the_verdicts_of_a_default_machine_name_its_host(recorded: Suite) -> None:
    """Without --accelperf-machine the machine is named from the host's fingerprint: the
    recording's own machine finds its timing (the test's baselines were recorded here)."""
    result = recorded.run("--accelperf-json=report.json")
    result.assert_outcomes(passed=2)
    report = recorded.report()
    assert report["machine"].startswith(tuple("abcdefghijklmnopqrstuvwxyz0123456789"))
    for metrics in verdicts(report).values():
        assert metrics["throughput"] != "new"
