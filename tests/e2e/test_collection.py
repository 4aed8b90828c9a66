"""Case grids become items in a session; absent frameworks and accelerators skip clearly,
unknown backends are errors. The cases themselves (ids, bad keywords and tolerances) are
tested in tests/unit/collect/test_cases.py."""

from __future__ import annotations

import pytest
from conftest import Suite


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
