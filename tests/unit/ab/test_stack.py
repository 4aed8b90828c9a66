"""A/B's stack line (issue 44, item 5): across environments it names only the packages
the case's backend declares (plus the accelerator's libraries, what the base's
environment installed and the hook's packages), in the words stored mode uses, and names
the base arm it was judged against, not "baselines". The arms' stacks are set as their
workers report them: no worker starts."""

from __future__ import annotations

import subprocess
from pathlib import Path

from pytest_accelperf.ab.rounds import Comparison
from pytest_accelperf.backends.registry import BACKENDS
from pytest_accelperf.records.verdict import CheckResult, Verdict
from pytest_accelperf.report.data import CaseRecord, SessionReport

#: The issue's input: a JAX case's arms, the base in an environment of jax 0.8.3 without
#: torch, deepspeed or ray.
BASE = {"python": "3.11.7", "jax": "0.8.3", "jaxlib": "0.8.3", "flax": "0.12.6",
        "optax": "0.2.6", "numpy": "2.4.6"}
HEAD = {**BASE, "jax": "0.10.2", "jaxlib": "0.10.2", "flax": "0.12.8", "torch": "2.13.0+cpu",
        "deepspeed": "0.19.8", "ray": "2.60.0", "triton": "3.5.0", "libcustom": "1.2"}


def _comparison(tmp_path: Path, hook: tuple[str, ...] = ()) -> Comparison:
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    comparison = Comparison(None, tmp_path, "cpu", 1, None, python="/other/python",
                            hook_packages=hook)
    comparison.stacks = {"base": dict(BASE), "head": dict(HEAD)}
    return comparison


def test_a_jax_cases_stack_names_only_what_its_backend_declares(tmp_path: Path) -> None:
    comparison = _comparison(tmp_path)
    assert comparison.stack_changes(BACKENDS["jax"]) == [
        "flax 0.12.6 → 0.12.8", "jax 0.8.3 → 0.10.2", "jaxlib 0.8.3 → 0.10.2",
        "triton absent → 3.5.0"]  # triton: an accelerator library, as in stored mode
    assert comparison.stack_changes(BACKENDS["torch"]) == ["torch absent → 2.13.0+cpu",
                                                           "triton absent → 3.5.0"]
    assert comparison.stack_change(BACKENDS["jax"]).startswith("stack: flax 0.12.6 → 0.12.8, ")


def test_the_hooks_packages_and_what_the_base_installed_always_count(tmp_path: Path) -> None:
    comparison = _comparison(tmp_path, hook=("libcustom",))
    comparison._installed = ["ray"]
    changes = comparison.stack_changes(BACKENDS["jax"])
    assert "libcustom absent → 1.2" in changes and "ray absent → 2.60.0" in changes
    assert not any(c.startswith(("torch ", "deepspeed ")) for c in changes)


def _record(name: str, data: dict[str, object]) -> CaseRecord:
    check = CheckResult("memory", Verdict.PASS, "same memory", data=data)
    return CaseRecord(nodeid=f"t.py::t[{name}]", case_id=name, platform="cpu-x1", run={},
                      checks=[check])


def test_the_line_names_the_base_arm_in_ab_mode_and_the_baselines_otherwise() -> None:
    stack = ["jax 0.8.3 → 0.10.2", "jaxlib 0.8.3 → 0.10.2"]
    report = SessionReport(platform="cpu-x1", records=[
        _record("a", {"stack": stack, "mode": "ab", "against": "HEAD (0123456789)"}),
        _record("b", {"stack": stack})])
    assert report.stack_lines() == [
        "stack: jax 0.8.3 → 0.10.2, jaxlib 0.8.3 → 0.10.2 (against the base arm, HEAD "
        "(0123456789), in 1 case; judged, not incomparable)",
        "stack: jax 0.8.3 → 0.10.2, jaxlib 0.8.3 → 0.10.2 (against the baselines of 1 case; "
        "judged, not incomparable)"]
    assert report.stacks() == [(tuple(stack), 2)]
