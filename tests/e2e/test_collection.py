"""Case grids become items with stable ids; absent frameworks and accelerators skip clearly,
unknown backends and bad tolerances are errors."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import Suite

from pytest_accelperf import Case, cases, grid


def test_ids_are_readable_and_stable() -> None:
    ids = [c.id for c in grid(backend="jax", mesh=[None, (4, 2), (8, 1)], batch=[128, 1024])]
    assert ids == ["jax-nomesh-b128", "jax-nomesh-b1024", "jax-mesh4x2-b128",
                   "jax-mesh4x2-b1024", "jax-mesh8x1-b128", "jax-mesh8x1-b1024"]
    assert Case(backend="jax", batch=4096, label="full").id == "jax-nomesh-b4096-full"
    assert Case(backend="jax", model="charlm", batch=8).id == "jax-charlm-nomesh-b8"


def test_bad_cases_are_rejected() -> None:
    with pytest.raises(ValueError, match="batch must be positive"):
        Case(backend="jax", batch=0)
    with pytest.raises(ValueError, match="unknown tolerance"):
        Case(backend="jax", batch=1, tolerances={"speed": 1.0})
    with pytest.raises(ValueError, match="duplicate case ids"):
        cases(Case(backend="jax", batch=1), Case(backend="jax", batch=1))
    with pytest.raises(ValueError, match="more axes"):
        Case(backend="jax", batch=1, mesh=(2, 2, 2))
    # the grid's keywords are Case's fields, declared there once: a typo or a wrong type
    # is one line naming it, not a TypeError from deep inside
    with pytest.raises(ValueError, match=r"unknown case keyword\(s\) stpes; a case takes: "
                                         r"backend, batch, mesh, model, "):
        cases(backend="jax", batch=[8], stpes=3)
    with pytest.raises(ValueError, match=r"Case.steps must be int, got '3' \(str\)"):
        grid(backend="jax", batch=[8], steps="3")
    with pytest.raises(ValueError, match="cases\\(\\) with grid keywords needs batch"):
        cases(backend="jax", steps=3)


def test_collect_only_shows_grid(suite: Suite) -> None:
    suite.write('''
        from pytest_accelperf import cases

        @cases(backend="jax", mesh=[None, (4, 2), (8, 1)], batch=[128, 1024, 4096])
        def test_mesh_sweep(accelperf):
            pass
    ''')
    result = suite.run("--collect-only", "-q")
    result.stdout.fnmatch_lines([
        "test_suite.py::test_mesh_sweep[jax-nomesh-b128]",
        "test_suite.py::test_mesh_sweep[jax-mesh4x2-b1024]",
        "test_suite.py::test_mesh_sweep[jax-mesh8x1-b4096]",
        "9 tests collected*",
    ])


def test_missing_framework_skips_with_install_hint(suite: Suite) -> None:
    suite.pytester.makeconftest('''
        from pytest_accelperf.backends import BackendSpec

        def pytest_accelperf_backends(config):
            return [BackendSpec("fancy", "fancy_backend", ("fancy_framework_not_installed",),
                                "pip install 'pytest-accelperf[fancy]'")]
    ''')
    suite.write('''
        from pytest_accelperf import cases

        @cases(backend="fancy", batch=[8])
        def test_fancy(accelperf):
            pass
    ''')
    result = suite.run("-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines([
        "*backend 'fancy' needs fancy_framework_not_installed, which is not installed: "
        "pip install 'pytest-accelperf?fancy?'*",
    ])


def test_unknown_backend_is_a_collection_error_listing_the_known_ones(suite: Suite) -> None:
    """A typo in a backend name is an error in the suite, not a skip that exits 0."""
    suite.write('''
        from pytest_accelperf import Case, cases

        @cases(Case(backend="jax", batch=8), Case(backend="jaxx", batch=8))
        def test_typo(accelperf):
            pass

        def test_other():
            pass
    ''')
    result = suite.run()
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines([
        "*ERROR collecting test_suite.py*",
        "test_suite.py::test_typo: unknown backend(s) 'jaxx' in @cases; known: alpa, "
        "deepspeed, external, hf, jax, jax-pipeline, keras, lightning, neuron, torch",
    ])
    assert "Traceback" not in result.stdout.str()


def test_case_for_another_accelerator_skips_naming_the_flag(suite: Suite) -> None:
    suite.write('''
        from pytest_accelperf import cases

        @cases(backend="jax", batch=[8], accels=("tpu",))
        def test_tpu_only(accelperf):
            pass
    ''')
    result = suite.run("-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*runs on tpu, not --accel=cpu; pass --accel=tpu*"])


def test_absent_accelerator_skips_with_reason(suite: Suite) -> None:
    suite.write()
    result = suite.run("--accel=gpu", "-rs", subprocess=True)
    result.assert_outcomes(skipped=2)
    result.stdout.fnmatch_lines(["*--accel=gpu: no GPU is visible to this process; looked "
                                 "for: jax*torch*nvidia-smi*CUDA_VISIBLE_DEVICES*or pass "
                                 "--accel=cpu"])


def test_cases_need_the_fixture(suite: Suite) -> None:
    suite.write('''
        from pytest_accelperf import cases

        @cases(backend="jax", batch=[8])
        def test_no_fixture():
            pass
    ''')
    result = suite.run()
    result.stdout.fnmatch_lines(["*@cases needs the test to use the 'accelperf' fixture*"])
    assert result.ret != 0


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -0.05, True, "lots", None])
def test_case_tolerances_are_checked_like_the_flags(value: object) -> None:
    """A NaN band passes any loss change (every comparison with NaN is false), inf too, and
    a negative one fails every run: a case's tolerances get the flags' check."""
    bad: dict[str, Any] = {"loss_rtol": value}
    with pytest.raises(ValueError, match=r"tolerances\['loss_rtol'\]: expected a finite "
                                         r"number >= 0"):
        Case(backend="jax", batch=1, tolerances=bad)
    with pytest.raises(ValueError, match=r"tolerances\['loss_rtol'\]"):
        cases(backend="jax", batch=[1], tolerances=bad)


def test_grad_clip_refuses_inf_too() -> None:
    with pytest.raises(ValueError, match="grad_clip must be a finite positive number or None"):
        Case(backend="jax", batch=1, grad_clip=float("inf"))
    assert Case(backend="jax", batch=1, grad_clip=1.0).grad_clip == 1.0


def test_tolerances_themselves_refuse_what_the_flags_refuse() -> None:
    from pytest_accelperf.records.verdict import Tolerances

    with pytest.raises(ValueError, match="tolerance loss_rtol: expected a finite number"):
        Tolerances(loss_rtol=float("nan"))
    with pytest.raises(ValueError, match="tolerance memory_tolerance: expected a finite"):
        Tolerances().merged({"memory_tolerance": True})
    text: dict[str, Any] = {"loss_rtol": "0.5"}  # as a case's tolerances may hold it
    assert Tolerances().merged(text).loss_rtol == 0.5
    assert Case(backend="jax", batch=1, tolerances={"loss_rtol": 0.0}).tolerances == {
        "loss_rtol": 0.0}
