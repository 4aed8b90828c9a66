"""Issue 37: an upgrade is a change the gate judges and names. A baseline recorded under
another jax release on this machine (its stored environment says jax 0.8.3, as one
recorded there does) is compared by every check, never ``incomparable``, and every verdict,
the terminal, the Markdown and the JSON report name the stack's difference."""

from __future__ import annotations

from importlib import metadata
from typing import Any

import pytest
from conftest import Suite

SMALL = '''
from tinytask import make_task
from pytest_accelperf import cases

@cases(backend="jax", batch=[16], steps=4, warmup=1)
def test_small(accelperf):
    accelperf.train(make_task(accelperf.case))
'''

JAX, JAXLIB = metadata.version("jax"), metadata.version("jaxlib")
STACK = f"stack: jax 0.8.3 → {JAX}, jaxlib 0.8.3 → {JAXLIB}"


def recorded_under_jax_0_8_3(block: dict[str, Any]) -> None:
    block["environment"]["packages"].update(jax="0.8.3", jaxlib="0.8.3")


def _checks(suite: Suite) -> dict[str, dict[str, Any]]:
    return {c["metric"]: c for c in suite.report()["cases"][0]["checks"]}


@pytest.mark.slow
def test_a_baseline_from_another_jax_release_is_judged_and_names_both(suite: Suite) -> None:
    suite.write(SMALL)
    suite.run("--accelperf-update").assert_outcomes(passed=1)
    suite.edit(recorded_under_jax_0_8_3)
    result = suite.run("--accelperf-json=report.json", "--accelperf-markdown=summary.md")
    result.assert_outcomes(passed=1)
    checks = _checks(suite)
    # Before: throughput, compile, input and program were `incomparable` and the session
    # passed having judged none of them.
    assert not [m for m, c in checks.items() if c["verdict"] == "incomparable"], checks
    for metric in ("throughput", "compile", "program", "loss", "numerics"):
        assert STACK in checks[metric]["detail"], (metric, checks[metric]["detail"])
        assert checks[metric]["data"]["stack"] == [f"jax 0.8.3 → {JAX}",
                                                   f"jaxlib 0.8.3 → {JAXLIB}"]
    # The jax probe runs on the stack under test: it corrects nothing across it.
    assert "drift correction off: the jax-cpu-matmul" in checks["throughput"]["detail"]
    # Other kernels round otherwise: numerics at the cross-environment tolerance.
    assert "cross-environment tolerance" in checks["numerics"]["detail"]
    result.stdout.fnmatch_lines([f"accelperf: {STACK} (against the baselines of 1 case; "
                                 f"judged, not incomparable)"])
    assert f"**{STACK} (against the baselines of 1 case" in (
        suite.pytester.path / "summary.md").read_text()


def halve_the_flops_under_jax_0_8_3(block: dict[str, Any]) -> None:
    recorded_under_jax_0_8_3(block)
    block["program"]["flops"] = block["program"]["flops"] / 2


@pytest.mark.slow
def test_a_program_that_changed_with_an_upgrade_is_a_verdict_with_its_accept_command(
        suite: Suite) -> None:
    suite.write(SMALL)
    suite.run("--accelperf-update").assert_outcomes(passed=1)
    suite.edit(halve_the_flops_under_jax_0_8_3)
    result = suite.run("--accelperf-json=report.json", "--accelperf-explain=off")
    result.assert_outcomes(failed=1)
    program = _checks(suite)["program"]
    assert program["verdict"] == "regression"
    assert program["detail"].endswith(STACK)
    result.stdout.fnmatch_lines(["*program: *FLOPs*" + STACK + "*",
                                 "*If this change is intended, accept it with:*"])
