"""A/B mode across environments (issue 37, part 2): the base arm's worker runs under
another Python environment (``--accelperf-compare-python``, or an environment the cache
built for ``--accelperf-compare=REF`` whose dependency files differ), and the verdict names
both stacks. The environments are overlays built by the cache (pytest_accelperf.envs) in
the test's own folder: ``uv venv`` over this session's packages, no network, except in the
test marked ``network`` (one small package from the index)."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from conftest import Suite

from e2e.test_ab_mode import _git, committed
from pytest_accelperf.ab.rounds import environment_entries
from pytest_accelperf.envs import EnvError
from pytest_accelperf.envs.cache import build_env, session_site
from pytest_accelperf.envs.uv import find_uv

pytest.importorskip("jax")

MODEL = '''
import numpy as np
import optax
from jax.sharding import PartitionSpec as P

from pytest_accelperf.jax import JaxTask


def make_task(case):
    dim = 128

    def init_params(key):
        import jax
        return {"w": jax.random.normal(key, (dim, 8)) * 0.05}

    def loss_fn(params, batch):
        import jax.numpy as jnp
        return jnp.mean((jnp.tanh(batch["x"] @ params["w"]) - batch["y"]) ** 2)

    def make_batch(step):
        x = np.random.default_rng(step).normal(size=(case.batch, dim)).astype(np.float32)
        return {"x": x, "y": x[:, :8]}

    return JaxTask(init_params=init_params, loss_fn=loss_fn, make_batch=make_batch,
                   optimizer=optax.sgd(0.01), param_specs=lambda p: {"w": P()})
'''

#: The test function notes the environment it runs in (the session's, or a worker's).
SUITE = '''
import os
import sys

from model import make_task
from pytest_accelperf import cases

@cases(backend="jax", batch=[64], steps=6, warmup=2)
def test_step(accelperf):
    with open(os.environ["PREFIXES"], "a") as out:
        out.write(sys.prefix + "\\n")
    accelperf.train(make_task(accelperf.case))
'''

#: A short comparison. These tests are about where the arms run and what the verdict names,
#: not its statistic: one process pair's rounds on a loaded machine can be told apart by the
#: pair's own offset (an A/A "regression" of a few percent once failed the first test here,
#: beside another test at load 13), so no tolerance that a false alarm could pass.
FAST = ("--accel=cpu", "--accelperf-cpu-devices=1", "--accelperf-compare-rounds=4",
        "--accelperf-compare-processes=1", "--accelperf-compare-budget=1",
        "--accelperf-compare-tolerance=10", "--accelperf-max-foreign-load=64",
        "--accelperf-json=report.json")


@pytest.fixture
def repo(suite: Suite) -> Suite:
    return committed(suite, MODEL, SUITE)


def _uv_or_skip() -> None:
    try:
        find_uv()
    except EnvError as exc:
        pytest.skip(str(exc))


def _throughput(suite: Suite) -> dict[str, object]:
    case = suite.report()["cases"][0]
    check: dict[str, object] = next(c for c in case["checks"] if c["metric"] == "throughput")
    return check


def _fake_release(env_path: Path, name: str, version: str) -> None:
    """A distribution's metadata in the overlay, shadowing the session's: the stack the
    worker reads there says ``version`` (the package itself is still imported from below)."""
    site = next(env_path.rglob("site-packages"))
    dist = site / f"{name}-{version}.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


@pytest.mark.slow
def test_the_working_tree_under_another_python_gets_a_verdict_naming_both_stacks(
        repo: Suite, tmp_path_factory: pytest.TempPathFactory,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """--accelperf-compare-python alone: the same files in both arms, the base arm's worker
    under the other interpreter (its own site-packages on its path, the plugin from here),
    and the two stacks in the verdict."""
    _uv_or_skip()
    env = build_env([], over=session_site(), root=tmp_path_factory.mktemp("envs"))
    _fake_release(env.path, "optax", "0.0.1")
    prefixes = repo.pytester.path / "prefixes.txt"
    monkeypatch.setenv("PREFIXES", str(prefixes))
    result = repo.run(*FAST, f"--accelperf-compare-python={env.python}", subprocess=True)
    result.assert_outcomes(passed=1)
    check = _throughput(repo)
    detail = str(check["detail"])
    assert detail.startswith("A/B ") and f"the working tree under {env.python}" in detail
    assert check["verdict"] in ("pass", "inconclusive")
    assert f"stack: optax 0.0.1 → {metadata.version('optax')}" in detail, detail
    data = check["data"]
    assert isinstance(data, dict) and data["stack"]["base"]["optax"] == "0.0.1"
    assert data["ci"][0] <= data["ratio"] <= data["ci"][1]
    seen = set(prefixes.read_text().split())
    assert str(env.path) in seen, seen  # the base worker ran in the other environment
    assert sys.prefix in seen  # the session's run and the head worker in this one
    # the numerics against the base arm's own run (issue 37): across two stacks at the
    # cross-environment tolerance, judged, and naming the stacks
    case = repo.report()["cases"][0]
    numerics = next(c for c in case["checks"] if c["metric"] == "numerics")
    assert numerics["verdict"] == "pass" and numerics["data"]["mode"] == "ab", numerics
    assert numerics["data"]["stack"] == [f"optax 0.0.1 → {metadata.version('optax')}"]
    assert "the cross-environment tolerance" in numerics["detail"], numerics["detail"]
    assert numerics["detail"].endswith(f"; stack: optax 0.0.1 → {metadata.version('optax')}")


def test_a_python_that_lacks_the_plugins_dependencies_stops_the_session_in_one_line(
        repo: Suite, tmp_path: Path) -> None:
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    python = bare / "bin" / "python"
    result = repo.run("--accel=cpu", f"--accelperf-compare-python={python}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: --accelperf-compare-python={python}: lacks the "
                                 f"plugin's dependencies (*): install the plugin into it, "
                                 f"e.g. {python} -m pip install -e *"])


@pytest.mark.parametrize("value, said", [
    ("no/such/python", "no executable file at *no/such/python; give the interpreter*"),
    ("no-such-python-command", "no such command on PATH; give the interpreter's path*"),
])
def test_a_python_that_is_not_there_is_one_line(repo: Suite, value: str, said: str) -> None:
    result = repo.run("--accel=cpu", f"--accelperf-compare-python={value}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: --accelperf-compare-python={value}: {said}"])


def test_another_python_and_update_cannot_be_combined(repo: Suite) -> None:
    result = repo.run("--accel=cpu", "--accelperf-update",
                      f"--accelperf-compare-python={sys.executable}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--accelperf-update and --accelperf-compare-python cannot be "
                                 "combined*"])


def test_the_environment_entries_of_the_path_are_this_interpreters() -> None:
    entries = environment_entries([*sys.path, "/somewhere/else"], Path.cwd())
    assert all(s in entries for s in session_site())
    assert "/somewhere/else" not in entries


@pytest.mark.slow
@pytest.mark.network
def test_a_revision_with_other_pins_runs_in_an_environment_built_for_it(
        repo: Suite, tmp_path_factory: pytest.TempPathFactory,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """--accelperf-compare=HEAD where HEAD pins another release of a small package than the
    working tree: the cache builds HEAD's environment (that release over this session's),
    the output says so, and the verdict names the two releases."""
    _uv_or_skip()
    monkeypatch.setenv("ACCELPERF_ENV_CACHE", str(tmp_path_factory.mktemp("envs")))
    path = repo.pytester.path
    now = metadata.version("tabulate")
    old = "0.9.0" if now != "0.9.0" else "0.8.10"
    (path / "requirements.txt").write_text(f"tabulate=={old}\n")
    _git(path, "add", "-A")
    _git(path, "commit", "-qm", "pins")
    (path / "requirements.txt").write_text(f"tabulate=={now}\n")
    monkeypatch.setenv("PREFIXES", str(path / "prefixes.txt"))
    result = repo.run(*FAST, "--accelperf-compare=HEAD", subprocess=True)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([f"accelperf: A/B: HEAD's dependency files differ "
                                 f"(requirements.txt): its arm runs in environment * "
                                 f"(tabulate=={old} over *), built cold in *"])
    detail = str(_throughput(repo)["detail"])
    assert f"stack: tabulate {old} → {now}" in detail, detail


@pytest.mark.slow
def test_an_environment_that_cannot_be_built_fails_the_comparison_in_one_line(
        repo: Suite, tmp_path_factory: pytest.TempPathFactory,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """HEAD pins a release uv cannot have (here: without a network, UV_OFFLINE): the case's
    comparison fails with uv's words in one line, and the cache keeps no entry."""
    _uv_or_skip()
    cache = tmp_path_factory.mktemp("envs")
    monkeypatch.setenv("ACCELPERF_ENV_CACHE", str(cache))
    monkeypatch.setenv("UV_OFFLINE", "1")
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path_factory.mktemp("uv-cache")))
    monkeypatch.setenv("PREFIXES", str(repo.pytester.path / "prefixes.txt"))
    path = repo.pytester.path
    (path / "requirements.txt").write_text("tabulate==0.0.99\n")
    _git(path, "add", "-A")
    _git(path, "commit", "-qm", "pins")
    (path / "requirements.txt").write_text(f"tabulate=={metadata.version('tabulate')}\n")
    result = repo.run(*FAST, "--accelperf-compare=HEAD", subprocess=True)
    result.assert_outcomes(failed=1)
    # The failure's own line; pytest's short summary repeats it after "FAILED " where the
    # terminal is wide enough (CI's is), so that copy is not counted.
    lines = [line for line in result.outlines
             if "A/B comparison with HEAD" in line and not line.startswith("FAILED ")]
    assert len(lines) == 1, result.outlines
    assert ": failed: building an environment with tabulate==0.0.99: uv said: " in \
        lines[0].replace(") failed:", ": failed:"), lines[0]
    assert "network was disabled" in lines[0]
    assert "During handling" not in result.stdout.str()
    assert [p.name for p in cache.iterdir() if not p.name.endswith(".lock")] == []


@pytest.mark.parametrize("other, said", [
    ("--accelperf-target=tpu-v5e:2x4", "--accelperf-target and --accelperf-compare-python "
                                       "cannot be combined: A/B mode times two environments*"),
    ("--accelperf-cluster=local", "--accelperf-compare-python and --accelperf-cluster cannot "
                                  "be combined*"),
])
def test_another_python_and_what_runs_no_ab_step_here_cannot_be_combined(
        repo: Suite, other: str, said: str) -> None:
    result = repo.run("--accel=cpu", other, f"--accelperf-compare-python={sys.executable}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: {said}"])


@pytest.mark.slow
def test_a_virtual_environment_inside_the_repository_is_the_environment_not_the_tree(
        suite: Suite) -> None:
    """A ``.venv`` at the repository's root (uv's and poetry's default) is the interpreter's
    environment, not code under test: the base arm imports from it where it is (before,
    its site-packages were moved into the base tree, where a git-ignored folder is not,
    and the worker could not import jax), and its modules are not taken for the working
    tree's (which refused every comparison under ``--accelperf-compare-python``). Found
    trying Flax's seq2seq example with its ``.venv`` in the repository."""
    _uv_or_skip()
    path = suite.pytester.path
    (path / ".gitignore").write_text(".venv/\n")
    model = MODEL.replace("    dim = 128\n", "    from inrepo_dep import DIM as dim\n")
    committed(suite, model, SUITE.replace(
        '    with open(os.environ["PREFIXES"], "a") as out:\n'
        '        out.write(sys.prefix + "\\n")\n', ""))
    env = build_env([], over=session_site(), root=path / ".venv")
    site_dir = next(env.path.rglob("site-packages"))
    (site_dir / "inrepo_dep.py").write_text("DIM = 128\n")  # only in the in-repo venv
    for other in ([], [f"--accelperf-compare-python={env.python}"]):
        done = subprocess.run([str(env.python), "-m", "pytest", "-p", "no:cacheprovider",
                               *FAST, "--accelperf-compare=HEAD", *other], cwd=path,
                              capture_output=True, text=True, timeout=600, check=False)
        assert done.returncode == 0, (other, done.stdout[-3000:], done.stderr[-2000:])
        check = _throughput(suite)
        assert check["data"]["mode"] == "ab", check["detail"]  # type: ignore[index]
        assert str(check["detail"]).startswith("A/B "), check["detail"]
