"""Issue 30, part 5: a mistake in the user's input reads as one line naming their file.

Every error the user's input causes is a :class:`~pytest_accelperf.errors.UserError`,
wherever it is raised: a ``Case`` field at collection, a mesh larger than the devices, a
``TorchStep`` given something that is not a module, a log that cannot be read, the
``accelperf`` command. Each is shown as one line (or a short block) that names the user's
file or option; no frame of ``pytest_accelperf`` is printed. Before, the first three came
wrapped in 20-60 lines of the plugin's own stack.
"""

from __future__ import annotations

import pytest
from conftest import Suite

from pytest_accelperf.cli import main
from pytest_accelperf.errors import ConfigError, UserError, render, user_frame


def no_plugin_frames(out: str) -> None:
    assert "pytest_accelperf/" not in out, out
    assert "Traceback" not in out, out


def fails_in_one_line(suite: Suite, lines: list[str]) -> None:
    """The suite written last fails its one test with ``lines``, and no frame of ours."""
    result = suite.run()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(lines)
    no_plugin_frames(result.stdout.str())


def test_a_bad_case_field_is_a_collection_error_of_one_line_naming_the_users_line(
        suite: Suite) -> None:
    suite.write('''
        from pytest_accelperf import Case, cases

        @cases(Case(backend="jax", batch=0))
        def test_bad(accelperf):
            pass
    ''', name="test_bad_case")
    result = suite.run()
    assert result.ret == pytest.ExitCode.INTERRUPTED  # a collection error stops the session
    out = result.stdout.str()
    result.stdout.fnmatch_lines(["*batch must be positive, got 0*",
                                 "*(at test_bad_case.py:3 (in <module>))*"])
    no_plugin_frames(out)


@pytest.mark.parametrize(("keywords", "line"), [
    ("batch=64", "batch=64: the grid takes a list of batch sizes, one case each: batch=[64]"),
    ("batch=[64], mesh=(4, 2)", "mesh=(4, 2) is one mesh: the grid takes a list of meshes, one "
                                "case each: mesh=[(4, 2)]")])
def test_a_grid_axis_given_one_value_is_one_line(suite: Suite, keywords: str, line: str) -> None:
    """``@cases(backend="jax", batch=64)``: a raw ``TypeError: 'int' object is not iterable``
    from the plugin's frames before."""
    suite.write(f'''
        from pytest_accelperf import cases

        @cases(backend="jax", {keywords})
        def test_grid(accelperf):
            pass
    ''', name="test_grid_axis")
    result = suite.run()
    assert result.ret == pytest.ExitCode.INTERRUPTED
    assert f"test_grid_axis.py: {line}\n" in result.stdout.str(), result.stdout.str()
    result.stdout.fnmatch_lines(["*(at test_grid_axis.py:3 (in <module>))*"])
    no_plugin_frames(result.stdout.str())


def test_a_mesh_larger_than_the_devices_fails_the_case_in_one_line(suite: Suite) -> None:
    suite.write('''
        from tinytask import make_task
        from pytest_accelperf import cases

        @cases(backend="jax", mesh=[(16, 2)], batch=[32], steps=2, warmup=1)
        def test_big(accelperf):
            accelperf.train(make_task(accelperf.case))
    ''', name="test_big_mesh")
    fails_in_one_line(suite, ["*mesh (16, 2) needs 32 devices but cpu-x8 has 8*"])


def test_a_mesh_asked_for_in_the_test_body_names_the_users_line(suite: Suite) -> None:
    suite.write('''
        from pytest_accelperf import cases

        @cases(backend="jax", batch=[32], steps=2, warmup=1)
        def test_body(accelperf):
            accelperf.accelerator.mesh((4, 4))
    ''', name="test_body_mesh")
    fails_in_one_line(suite, ["*mesh (4, 4) needs 16 devices*",
                                 "*(at test_body_mesh.py:5 (in test_body))*"])


def test_a_torch_step_model_that_is_not_a_module_is_one_line(suite: Suite) -> None:
    pytest.importorskip("torch")
    suite.write('''
        import torch
        from pytest_accelperf import cases
        from pytest_accelperf.torch import TorchStep

        @cases(backend="torch", batch=[4], steps=2, warmup=1)
        def test_step(accelperf):
            def step(batch):
                return torch.zeros(())
            accelperf.train(TorchStep(step, lambda i: torch.zeros(4, 2), model="not a module"))
    ''', name="test_not_module")
    fails_in_one_line(suite, ["*TorchStep.model*must be the nn.Module*"])


def test_a_log_that_cannot_be_read_in_the_test_body_names_the_file_and_the_users_line(
        suite: Suite) -> None:
    suite.write('''
        from pytest_accelperf.ingest import parse_file

        def test_ingest():
            parse_file("missing.log", "neuron")
    ''', name="test_read_log")
    fails_in_one_line(suite, ["*missing.log: cannot read: No such file or directory*",
                                 "*(at test_read_log.py:4 (in test_ingest))*"])


def test_the_cli_prints_a_user_error_as_one_line(capsys: pytest.CaptureFixture[str],
                                                 tmp_path: object) -> None:
    status = main(["report", "no-such-report.json", "--markdown", "-"])
    err = capsys.readouterr().err
    assert status == 1
    assert err.startswith("accelperf: error: ") and "no-such-report.json" in err
    assert len(err.strip().splitlines()) == 1, err


def test_render_names_where_once() -> None:
    assert render(UserError("cannot write x", where="--accelperf-json")) == \
        "--accelperf-json: cannot write x"
    assert render(UserError("--accelperf-json: cannot write x", where="--accelperf-json")) \
        == "--accelperf-json: cannot write x"
    try:
        raise ConfigError("bad value")
    except ConfigError as exc:
        # raised in this file: the test's own frame is the user's
        assert user_frame(exc) is not None and "test_user_errors.py" in str(user_frame(exc))
        assert render(exc).startswith("bad value\n  (at ")
        assert isinstance(exc, ValueError)  # callers that caught ValueError still do
