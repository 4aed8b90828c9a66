"""The environment cache (pytest_accelperf.envs.cache): keys, atomic builds under a lock, a
failed build that leaves no entry, one-line errors; uv itself stands in for a fake except
in the tests that build a real tiny environment."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from pytest_accelperf.envs import EnvError, cache
from pytest_accelperf.envs.cache import (
    META,
    OVERLAY_PTH,
    build_env,
    checked_requirements,
    env_from_pins,
    env_key,
)
from pytest_accelperf.envs.uv import UV_ENV, find_uv, said

#: Where a fake environment's packages are (as uv venv makes it on Linux).
SITE = "lib/python3.11/site-packages"


def _installed(site: Path, requirement: str) -> None:
    """A distribution's metadata in ``site``, at the version a requirement pins (else the
    session's)."""
    from importlib import metadata

    from packaging.requirements import Requirement

    req = Requirement(requirement)
    pins = [s.version for s in req.specifier if s.operator == "=="]
    try:
        version = pins[0] if pins else metadata.version(req.name)
    except metadata.PackageNotFoundError:
        version = "1.0"
    info = site / f"{req.name}-{version}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {req.name}\n"
                                   f"Version: {version}\n")


class FakeUv:
    """``run_uv`` as the cache calls it: ``venv`` makes a folder with a ``bin/python``
    link to this interpreter; ``pip install`` writes the requirements' metadata into its
    site-packages, or fails (``fail``) after writing half of them."""

    def __init__(self, fail: str = "", delay: float = 0.0) -> None:
        self.calls: list[list[str]] = []
        self.fail = fail
        self.delay = delay

    def __call__(self, args: Sequence[str], *, what: str, **_: Any) -> str:
        self.calls.append(list(args))
        if args[0] == "venv":
            venv = Path(args[-1])
            (venv / "bin").mkdir(parents=True)
            (venv / "bin" / "python").symlink_to(sys.executable)
            (venv / SITE).mkdir(parents=True)
            return ""
        time.sleep(self.delay)
        python = Path(args[args.index("--python") + 1])
        (python.parent.parent / SITE / "half-installed").write_text("x")
        if self.fail:
            raise EnvError(f"{what}: uv said: {self.fail}")
        rest = args[args.index(str(python)) + 1:]
        for before, requirement in zip(["", *rest], rest, strict=False):
            if not requirement.startswith("-") and before != "--constraint":
                _installed(python.parent.parent / SITE, requirement)
        return ""


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeUv:
    uv = FakeUv()
    monkeypatch.setattr(cache, "run_uv", uv)
    monkeypatch.setattr(cache, "_layer", lambda python, over: None)
    return uv


def test_the_key_is_a_hash_of_the_requirements_in_any_order_the_python_and_what_is_below(
        tmp_path: Path) -> None:
    a = env_key(["jax==0.8.3", "jaxlib==0.8.3"], "/py", [])
    assert a == env_key(["jaxlib==0.8.3", "jax==0.8.3"], "/py", [])
    assert a != env_key(["jax==0.8.2", "jaxlib==0.8.3"], "/py", [])
    assert a != env_key(["jax==0.8.3", "jaxlib==0.8.3"], "/other/py", [])
    below = tmp_path / "site"
    below.mkdir()
    over = env_key(["jax==0.8.3"], "/py", [str(below)])
    assert over != env_key(["jax==0.8.3"], "/py", [])
    # what is installed below is part of the key: a changed session gets a new overlay
    dist = below / "tabulate-0.9.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: tabulate\nVersion: 0.9.0\n")
    assert env_key(["jax==0.8.3"], "/py", [str(below)]) != over


def test_a_build_is_renamed_into_place_once_finished_and_found_warm_after(
        tmp_path: Path, fake: FakeUv) -> None:
    env = build_env(["jax==0.8.3"], over=(), root=tmp_path)
    assert env.built and env.path == tmp_path / env.key
    meta = json.loads((env.path / META).read_text())
    assert meta["requirements"] == ["jax==0.8.3"] and meta["key"] == env.key
    assert env.python.exists()
    assert not list(tmp_path.glob(".tmp-*")), "the temporary folder is gone"
    assert [c[0] for c in fake.calls] == ["venv", "pip"]
    again = build_env(["jax==0.8.3"], over=(), root=tmp_path)
    assert (again.path, again.built) == (env.path, False)
    assert len(fake.calls) == 2, "a warm environment is not built again"
    assert "warm from the cache" in again.describe()
    assert "built cold in" in env.describe()


@pytest.mark.parametrize(("damage", "why"), [
    (lambda env: (env.path / "bin" / "python").unlink(),
     r"its interpreter \S+/bin/python does not run: No such file or directory"),
    (lambda env: shutil.rmtree(env.path / SITE / "jax-0.8.3.dist-info"), r"it lacks jax==0.8.3"),
    (lambda env: (env.path / META).write_text(json.dumps(
        {**json.loads((env.path / META).read_text()), "python_version": "3.10.0 (main)"})),
     r"its interpreter is Python 3\.\d+\.\d+\S*, built with 3\.10\.0"),
])
def test_a_broken_entry_is_rebuilt_and_says_so_in_one_line(
        tmp_path: Path, fake: FakeUv, damage: Any, why: str) -> None:
    """The issue's input: the base's environment built into the cache, then its
    bin/python removed (as an upgrade of the Python a uv venv links to does): the next
    session crashed at the worker's start (FileNotFoundError). The entry is checked before
    use, and rebuilt."""
    env = build_env(["jax==0.8.3"], over=(), root=tmp_path)
    assert build_env(["jax==0.8.3"], over=(), root=tmp_path).rebuilt == ""
    damage(env)
    again = build_env(["jax==0.8.3"], over=(), root=tmp_path)
    assert again.built and again.key == env.key and again.python.exists()
    assert [c[0] for c in fake.calls] == ["venv", "pip", "venv", "pip"]
    line = again.describe()
    assert "\n" not in line
    assert re.fullmatch(rf"environment {env.key} \(jax==0\.8\.3\), rebuilt in \d+\.\d s: the "
                        rf"cached one was broken \({why}\)", line), line
    assert not list(tmp_path.glob(".tmp-*")), "the broken entry is gone"
    assert build_env(["jax==0.8.3"], over=(), root=tmp_path).built is False


def test_the_key_holds_the_base_interpreters_version(tmp_path: Path, fake: FakeUv,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """An upgraded Python at the same path gets an entry of its own."""
    with pytest.raises(EnvError, match=r"^the interpreter /nonexistent/python does not run"):
        cache.interpreter_version("/nonexistent/python")
    assert cache.interpreter_identity("/py", "3.11.7") == "/py 3.11.7"
    first = build_env(["jax==0.8.3"], over=(), root=tmp_path)
    monkeypatch.setattr(cache, "interpreter_version", lambda python: "3.11.99 (upgraded)")
    assert build_env(["jax==0.8.3"], over=(), root=tmp_path).key != first.key


def test_a_standalone_environment_gets_the_plugins_dependencies(tmp_path: Path,
                                                                 fake: FakeUv) -> None:
    env = build_env(["jax==0.8.3"], root=tmp_path)
    installed = fake.calls[1]
    assert "jax==0.8.3" in installed
    assert any(a.startswith("pydantic") for a in installed), installed
    assert env.requirements[-1] == "jax==0.8.3"


def test_a_build_that_fails_halfway_leaves_no_entry(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    uv = FakeUv(fail="No solution found: Because there is no version of jax==0.0.99")
    monkeypatch.setattr(cache, "run_uv", uv)
    with pytest.raises(EnvError) as info:
        build_env(["jax==0.0.99"], over=(), root=tmp_path)
    message = str(info.value)
    assert "\n" not in message and "jax==0.0.99" in message and "uv said" in message
    assert [p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")] == []


def test_a_build_that_was_killed_is_cleared_by_the_next_build_of_its_key(
        tmp_path: Path, fake: FakeUv) -> None:
    key = env_key(["jax==0.8.3"], cache.interpreter_identity(cache._interpreter(None)), ())
    stale = tmp_path / f".tmp-{key}-abcdefgh"
    (stale / "env").mkdir(parents=True)
    env = build_env(["jax==0.8.3"], over=(), root=tmp_path)
    assert env.key == key and not stale.exists()


def test_two_sessions_that_want_one_key_build_it_once(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    uv = FakeUv(delay=0.5)
    monkeypatch.setattr(cache, "run_uv", uv)
    monkeypatch.setattr(cache, "_layer", lambda python, over: None)
    results: list[cache.Env] = []
    threads = [threading.Thread(target=lambda: results.append(
        build_env(["jax==0.8.3"], over=(), root=tmp_path))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(r.built for r in results) == [False, True]
    assert [c[0] for c in uv.calls] == ["venv", "pip"]


def test_bad_requirements_and_pins_are_one_line_naming_them() -> None:
    with pytest.raises(EnvError, match=r"^'jax===' is not a requirement"):
        checked_requirements(["jax==="])
    with pytest.raises(EnvError, match=r"^'jax>=0.8' is not a pin: give name==version"):
        env_from_pins(["jax>=0.8"])
    assert checked_requirements(["jax == 0.8.3"]) == ("jax==0.8.3",)


def test_an_unwritable_cache_is_one_line_naming_it(tmp_path: Path, fake: FakeUv) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(EnvError, match=r"cannot create the cache folder .*ACCELPERF_ENV_CACHE"):
        build_env(["jax==0.8.3"], over=(), root=blocker / "envs")


def test_the_cache_root_follows_its_variable_and_xdg(monkeypatch: pytest.MonkeyPatch,
                                                      tmp_path: Path) -> None:
    monkeypatch.delenv("ACCELPERF_ENV_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache.cache_root() == tmp_path / "accelperf" / "envs"
    monkeypatch.setenv("ACCELPERF_ENV_CACHE", str(tmp_path / "x"))
    assert cache.cache_root() == tmp_path / "x"


def test_uvs_words_are_one_line() -> None:
    text = ("  \u00d7 No solution found when resolving dependencies:\n"
            "  ╰─▶ Because there is no version of jax==0.0.99 and you require jax==0.0.99,\n"
            "      we can conclude that your requirements are unsatisfiable.\n\n"
            "      hint: Packages were unavailable because the network was disabled.\n")
    line = said(text)
    assert "\n" not in line and line.startswith("No solution found")
    assert "jax==0.0.99" in line and "hint: Packages were unavailable" in line


def test_a_uv_that_is_not_there_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(UV_ENV, "/nonexistent/uv")
    with pytest.raises(EnvError, match=r"^ACCELPERF_UV=/nonexistent/uv: no such executable$"):
        find_uv()


def _uv_or_skip() -> None:
    try:
        find_uv()
    except EnvError as exc:
        pytest.skip(str(exc))


def test_offline_a_release_not_in_uvs_cache_is_one_line_and_leaves_no_entry(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No network: uv is told so, and says which package it could not have."""
    _uv_or_skip()
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))  # empty: nothing cached
    root = tmp_path / "envs"
    with pytest.raises(EnvError) as info:
        build_env(["iniconfig==1.1.1"], over=(), root=root, offline=True)
    message = str(info.value)
    assert "\n" not in message and "iniconfig==1.1.1" in message, message
    assert "network was disabled" in message, message
    assert [p.name for p in root.iterdir() if not p.name.endswith(".lock")] == []


@pytest.mark.network
def test_a_real_tiny_environment_is_built_cold_then_found_warm(tmp_path: Path) -> None:
    """uv venv and one small pure-Python package from the index (a few kB)."""
    _uv_or_skip()
    root = tmp_path / "envs"
    env = build_env(["iniconfig==2.0.0"], over=(), root=root)
    assert env.built
    out = subprocess.run([str(env.python), "-c", "import importlib.metadata as m, sys; "
                          "print(m.version('iniconfig'), sys.prefix)"],
                         capture_output=True, text=True, check=True).stdout.split()
    assert out[0] == "2.0.0" and Path(out[1]) == env.path
    assert build_env(["iniconfig==2.0.0"], over=(), root=root).built is False
    with pytest.raises(EnvError) as info:
        build_env(["iniconfig==0.0.77"], over=(), root=root)
    assert "\n" not in str(info.value) and "iniconfig==0.0.77" in str(info.value)
    assert sorted(p.name for p in root.iterdir() if not p.name.endswith(".lock")) == [env.key]


@pytest.mark.network
def test_an_overlay_shadows_one_package_of_the_session_and_keeps_the_rest(
        tmp_path: Path) -> None:
    """Layered over a folder of the session's packages, the overlay's own release comes
    first and the rest is imported from below."""
    _uv_or_skip()
    below = tmp_path / "below"
    below.mkdir()
    for name in ("iniconfig", "pluggy"):  # a folder standing for the session's
        shutil.copytree(Path(__import__(name).__file__).parent, below / name)
    env = build_env(["iniconfig==1.1.1"], over=[str(below)], root=tmp_path / "envs")
    pth = next(env.path.rglob(OVERLAY_PTH))
    assert str(below) in pth.read_text()
    out = subprocess.run([str(env.python), "-c", "import iniconfig, pluggy; "
                          "print(iniconfig.__file__); print(pluggy.__file__)"],
                         capture_output=True, text=True, check=True).stdout.split()
    assert Path(out[0]).is_relative_to(env.path) and Path(out[1]).is_relative_to(below)


def test_an_overlay_holds_what_is_below_at_its_versions() -> None:
    """deepspeed==0.18.9 over this session once resolved torch afresh: the newest, a 5 GB
    CUDA build, in place of the session's CPU torch. What is below is now held at its
    versions, except what the requirements name."""
    from importlib import metadata

    from pytest_accelperf.envs.cache import below_constraints, session_site

    held = below_constraints(session_site(), ["pytest==8.0.0"])
    assert f"numpy=={metadata.version('numpy')}" in held
    assert not any(c.lower().startswith("pytest==") for c in held)
    assert all(c.count("==") == 1 for c in held)
