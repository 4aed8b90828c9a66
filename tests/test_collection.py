"""Case grids become items with stable ids; absent backends and accelerators skip clearly."""

from __future__ import annotations

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


def test_missing_framework_skips_with_install_hint(suite: Suite,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_accelperf.backends import base

    monkeypatch.setitem(base.BACKENDS, "fancy", base._LazyBackend(
        "fancy", "fancy_backend", ("fancy_framework_not_installed",),
        "pip install 'pytest-accelperf[fancy]'"))
    suite.write('''
        from pytest_accelperf import cases

        @cases(backend="fancy", batch=[8])
        def test_fancy(accelperf):
            pass

        @cases(backend="nosuch", batch=[8])
        def test_unknown(accelperf):
            pass
    ''')
    result = suite.run("-rs")
    result.assert_outcomes(skipped=2)
    result.stdout.fnmatch_lines([
        "*backend 'fancy' needs fancy_framework_not_installed, which is not installed: "
        "pip install 'pytest-accelperf?fancy?'*",
        "*unknown backend 'nosuch'; available: *jax*",
    ])


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
    result.stdout.fnmatch_lines(["*--accel=gpu: jax sees no gpu devices*or pass --accel=cpu*"])


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
