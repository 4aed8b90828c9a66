"""A predicted out-of-memory is an outcome; xdist gives the same verdicts as one process."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import Suite, verdicts


def _verdicts_without_throughput(report: dict[str, Any]) -> dict[str, dict[str, str]]:
    # Throughput verdicts depend on the machine's load at the moment; the rest must not.
    return {case: {m: v for m, v in checks.items() if m != "throughput"}
            for case, checks in verdicts(report).items()}


#: Three cases, one a mesh kind: what is asserted (both workers used, one write on the
#: controller, the same verdicts in every mode) is the same with three as with the six of
#: a batch sweep, which had each of the module's five sessions train twice as many cases
#: (77 s of CI for the module's two tests).
XDIST_SUITE = '''
from tinytask import make_task
from pytest_accelperf import cases

@cases(backend="jax", mesh=[None, (4, 2), (8, 1)], batch=[32], steps=6, warmup=1)
def test_sweep(accelperf):
    accelperf.train(make_task(accelperf.case))
'''


@dataclass
class Recording:
    """The module's one recording of :data:`XDIST_SUITE` under ``-n 2``: its session's
    result, and a copy of the baselines and report it wrote."""

    result: pytest.RunResult
    kept: Path


@pytest.fixture(scope="module")
def recordings() -> dict[str, Recording]:
    """The module's recording, once made (:func:`recorded`)."""
    return {}


@pytest.fixture
def recorded(suite: Suite, recordings: dict[str, Recording],
             tmp_path_factory: pytest.TempPathFactory) -> tuple[Suite, pytest.RunResult]:
    """:data:`XDIST_SUITE` written and recorded by ``--accelperf-update -n 2``: by
    whichever test of the module asks first, and for the other a copy of its baselines and
    report as they were then (each test's own to edit). Shared: the two tests each recorded
    the same cases (about a fifth of the module's CPU); one asserts on how the
    recording was written, the other only compares sessions against it."""
    suite.write(XDIST_SUITE)
    path = suite.pytester.path
    if "n2" not in recordings:
        result = suite.run("-n", "2", "--accelperf-update", "--accelperf-json=report.json")
        kept = tmp_path_factory.mktemp("xdist-recording")
        shutil.copytree(path / "baselines", kept / "baselines")
        shutil.copy(path / "report.json", kept / "report.json")
        recordings["n2"] = Recording(result, kept)
    else:
        kept = recordings["n2"].kept
        shutil.copytree(kept / "baselines", path / "baselines")
        shutil.copy(kept / "report.json", path / "report.json")
    return suite, recordings["n2"].result


@pytest.mark.slow
def test_xdist_update_writes_once_on_the_controller(
        recorded: tuple[Suite, pytest.RunResult]) -> None:
    suite, result = recorded
    result.assert_outcomes(passed=3)
    data = suite.load()
    assert len(data["cases"]) == 3
    report = suite.report()
    assert {c["worker"] for c in report["cases"]} == {"gw0", "gw1"}
    assert report["baselines_written"] == ["baselines/cpu-x8/test_suite.json"]
    result.stdout.fnmatch_lines(["*accelperf: 3 case(s) on cpu-x8*",
                                 "*baselines written to baselines/cpu-x8/test_suite.json*"])


@pytest.mark.slow
def test_same_verdicts_with_and_without_xdist(
        recorded: tuple[Suite, pytest.RunResult]) -> None:
    """One recording (the module's, :func:`recorded`) and one plain session, then the same
    session under ``-n 2``, with xdist disabled and with ``-n 0``: the same verdicts each
    time (one test, not three parametrized ones: each recorded and ran the plain session
    again, 330 s of a CI worker)."""
    suite, recording = recorded
    recording.assert_outcomes(passed=3)
    # Make one case regress in memory, so the comparison covers a failing verdict too.
    data = suite.load()
    mem = data["cases"]["test_sweep[jax-mesh4x2-b32]"]["memory"]
    mem["per_device"] = {k: v // 4 for k, v in mem["per_device"].items()}
    suite.baseline_path().write_text(json.dumps(data, indent=2, sort_keys=True))

    base = suite.run("--accelperf-json=plain.json")
    base.assert_outcomes(passed=2, failed=1)
    for mode in (["-n", "2"], ["-p", "no:xdist"], ["-n", "0"]):
        other = suite.run(*mode, "--accelperf-json=other.json")
        other.assert_outcomes(passed=2, failed=1)
        assert other.ret == base.ret == 1, mode
        assert (_verdicts_without_throughput(suite.report("other.json"))
                == _verdicts_without_throughput(suite.report("plain.json"))), mode
        assert (verdicts(suite.report("other.json"))["test_sweep[jax-mesh4x2-b32]"]["memory"]
                == "regression"), mode
