"""A predicted out-of-memory is an outcome; xdist gives the same verdicts as one process."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import Suite, verdicts


def _verdicts_without_throughput(report: dict[str, Any]) -> dict[str, dict[str, str]]:
    # Throughput verdicts depend on the machine's load at the moment; the rest must not.
    return {case: {m: v for m, v in checks.items() if m != "throughput"}
            for case, checks in verdicts(report).items()}


XDIST_SUITE = '''
from tinytask import make_task
from pytest_accelperf import cases

@cases(backend="jax", mesh=[None, (4, 2), (8, 1)], batch=[16, 32], steps=6, warmup=1)
def test_sweep(accelperf):
    accelperf.train(make_task(accelperf.case))
'''


@pytest.mark.slow
def test_xdist_update_writes_once_on_the_controller(suite: Suite) -> None:
    suite.write(XDIST_SUITE)
    result = suite.run("-n", "2", "--accelperf-update", "--accelperf-json=report.json")
    result.assert_outcomes(passed=6)
    data = suite.load()
    assert len(data["cases"]) == 6
    report = suite.report()
    assert {c["worker"] for c in report["cases"]} == {"gw0", "gw1"}
    assert report["baselines_written"] == ["baselines/cpu-x8/test_suite.json"]
    result.stdout.fnmatch_lines(["*accelperf: 6 case(s) on cpu-x8*",
                                 "*baselines written to baselines/cpu-x8/test_suite.json*"])


@pytest.mark.slow
def test_same_verdicts_with_and_without_xdist(suite: Suite) -> None:
    """One recording and one plain session, then the same session under ``-n 2``, with
    xdist disabled and with ``-n 0``: the same verdicts each time (one test, not three
    parametrized ones: each recorded and ran the plain session again, 330 s of a CI
    worker)."""
    suite.write(XDIST_SUITE)
    suite.run("--accelperf-update").assert_outcomes(passed=6)
    # Make one case regress in memory, so the comparison covers a failing verdict too.
    data = suite.load()
    mem = data["cases"]["test_sweep[jax-mesh4x2-b32]"]["memory"]
    mem["per_device"] = {k: v // 4 for k, v in mem["per_device"].items()}
    import json
    suite.baseline_path().write_text(json.dumps(data, indent=2, sort_keys=True))

    base = suite.run("--accelperf-json=plain.json")
    base.assert_outcomes(passed=5, failed=1)
    for mode in (["-n", "2"], ["-p", "no:xdist"], ["-n", "0"]):
        other = suite.run(*mode, "--accelperf-json=other.json")
        other.assert_outcomes(passed=5, failed=1)
        assert other.ret == base.ret == 1, mode
        assert (_verdicts_without_throughput(suite.report("other.json"))
                == _verdicts_without_throughput(suite.report("plain.json"))), mode
        assert (verdicts(suite.report("other.json"))["test_sweep[jax-mesh4x2-b32]"]["memory"]
                == "regression"), mode
