"""``accelperf bisect --package NAME LOW HIGH`` (issue 37, item 3): the releases of a fake
index (``$ACCELPERF_INDEX_JSON`` at a ``file://`` folder), each one's pins (jaxlib follows
jax), the commits' search run over them with sessions made up from a program per release,
and every mistake one line. No network, no real environment but the one test that builds
a failing one (uv itself, told to fail halfway)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from pytest_accelperf import cli
from pytest_accelperf.bisection.commits import Commit
from pytest_accelperf.bisection.driver import Settings, Status, Step, bisect
from pytest_accelperf.bisection.releases import Releases, release_pins, release_range
from pytest_accelperf.bisection.show import render, start_line
from pytest_accelperf.bisection.trial import Session
from pytest_accelperf.envs import EnvError
from pytest_accelperf.envs.cache import Env
from pytest_accelperf.envs.releases import INDEX_JSON_ENV
from pytest_accelperf.envs.uv import find_uv
from pytest_accelperf.records.verdict import CheckResult, Verdict
from pytest_accelperf.report.data import CaseRecord

JAX = ["0.8.3", "0.9.0", "0.9.0.1", "0.9.1", "0.9.2", "0.10.0", "0.10.1", "0.10.2", "0.11.0rc1"]
NODEID = "test_mlp.py::test_step[jax-b64]"


@pytest.fixture
def index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """jax's releases (0.10.1 yanked), and jaxlib's, which has no 0.9.0.1."""
    for name, versions in (("jax", JAX), ("jaxlib", [v for v in JAX if v != "0.9.0.1"])):
        releases = {v: [{"yanked": v == "0.10.1"}] for v in versions}
        (tmp_path / "index" / name).mkdir(parents=True)
        (tmp_path / "index" / name / "json").write_text(json.dumps({"releases": releases}))
    monkeypatch.setenv(INDEX_JSON_ENV, f"file://{tmp_path}/index/{{name}}/json")
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)  # A/B mode needs one
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_the_range_is_the_releases_with_jaxlib_pinned_where_it_has_the_version(
        index: Path) -> None:
    rng, pins = release_range(index, "jax", "0.8.3", "0.10.2")
    assert rng.package == "jax" and rng.unit == "release"
    assert rng.good.sha == "0.8.3" and rng.bad.sha == "0.10.2"
    assert [c.sha for c in rng.commits] == ["0.9.0", "0.9.0.1", "0.9.1", "0.9.2", "0.10.0",
                                            "0.10.2"]  # 0.10.1 yanked, no pre-release
    assert pins["0.9.1"] == ("jax==0.9.1", "jaxlib==0.9.1")
    assert pins["0.9.0.1"] == ("jax==0.9.0.1",)  # jaxlib as jax 0.9.0.1 requires
    assert rng.commits[1].subject == "jax 0.9.0.1, jaxlib as it requires"
    assert start_line(rng, ("t.py",)).startswith(
        "accelperf bisect: 6 release(s) of jax after 0.8.3 up to 0.10.2 (0.8.3, 0.9.0, ")


def test_torch_has_no_companion_pin() -> None:
    """torch's triton and CUDA libraries are its wheel's own dependencies: uv installs the
    versions that release asks for."""
    assert release_pins("torch", "2.5.1", {}) == (("torch==2.5.1",), "torch 2.5.1")


# -- the search over releases, sessions made up --------------------------------------------
def _program(flops: float, fusions: int) -> dict[str, Any]:
    return {"flops": flops, "ops": {"fusion": fusions, "dot": 2}, "source": "xla"}


#: The program each release compiles: 0.9.1 does 20 % more FLOPs; 0.9.0.1 fuses differently
#: (no regression: the search is on the fields HIGH made worse).
PROGRAMS = {"0.8.3": _program(1e6, 8), "0.9.0": _program(1e6, 8),
            "0.9.0.1": _program(1e6, 9), "0.9.1": _program(1.2e6, 11),
            "0.9.2": _program(1.2e6, 11), "0.10.0": _program(1.2e6, 11),
            "0.10.2": _program(1.2e6, 11)}


class MadeUp(Releases):
    """Releases whose sessions are made up from :data:`PROGRAMS`, checked against LOW's."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.ran: list[tuple[str, tuple[str, ...]]] = []

    def session(self, point: Commit, extra: Sequence[str], scratch: Path) -> Session:
        self.ran.append((point.sha, tuple(extra)))
        try:
            python = str(self.env(point).python)
        except EnvError as exc:
            return Session(point, (), scratch, -1, 0.0, why=f"no environment: {exc}")
        now, low = PROGRAMS[point.sha], PROGRAMS[self.rng.good.sha]
        checks = []
        if "--accelperf-update" not in extra:
            worse = now["flops"] > low["flops"]
            changes = ([{"name": "flops", "now": now["flops"], "baseline": low["flops"]}]
                       if worse else [])
            checks.append(CheckResult("program", Verdict.REGRESSION if worse else Verdict.PASS,
                                      "made up", data={"changes": changes, "program": now,
                                                       "tolerance": 0.0}))
        record = CaseRecord(NODEID, "jax-b64", "cpu-x1", {"outcome": "ok", "program": now},
                            checks, block={"program": now} if not checks else None)
        return Session(point, (python, "-m", "pytest", *extra), scratch, 0, 1.0,
                       {NODEID: record})


def _built(pins: Sequence[str]) -> Env:
    version = pins[0].split("==")[1]
    if version == "0.9.2":
        raise EnvError(f"building an environment with {' '.join(pins)}: uv said: made up")
    return Env(Path(f"/cache/{version}"), version, tuple(pins), ("/site",), True, 1.5)


def test_the_first_bad_release_is_named_with_its_program_against_the_release_before(
        index: Path) -> None:
    rng, pins = release_range(index, "jax", "0.8.3", "0.10.2")
    settings = Settings((NODEID, "--accel=cpu"))
    announced: list[str] = []
    steps: list[Step] = []
    points = MadeUp(rng, pins, settings, announced.append, build=_built)
    result = bisect(rng, settings, steps.append, points)
    assert result.status is Status.FOUND and result.basis == "program"
    assert result.first_bad is not None and result.first_bad.sha == "0.9.1"
    assert result.message == "first bad release: jax 0.9.1 (after 0.9.0.1)"
    # LOW records and HIGH is checked under their own interpreters; then the search
    assert points.ran[0] == ("0.8.3", ("--accelperf-update", points.ran[0][1][1]))
    assert [sha for sha, _ in points.ran] == ["0.8.3", "0.10.2", "0.9.1", "0.9.0", "0.9.0.1"]
    assert [(s.commit.sha, s.call) for s in steps] == [
        ("0.8.3", "reference"), ("0.10.2", "bad"), ("0.9.1", "bad"), ("0.9.0", "good"),
        ("0.9.0.1", "good")]
    # the diff is against the release before (0.9.0.1), not LOW: fusion 9 -> 11
    assert result.diff and "FLOPs" in result.diff[0] and "fusion 9 \u2192 11" in \
        result.diff[0], result.diff
    text = render(result)
    assert text.startswith("first bad release: jax 0.9.1 (after 0.9.0.1)\n(release 3 of 6 "
                           "in 0.8.3..0.10.2, found on the program record in 4 comparisons "
                           "with LOW"), text
    assert "its program against jax 0.9.0.1's:\n  " in text
    assert "/cache/0.9.1/bin/python -m pytest_accelperf.cli bisect GOOD BAD -- " in text
    assert "out of accelperf's scope" in text
    assert "jax 0.9.1: environment 0.9.1 (jax==0.9.1, jaxlib==0.9.1 over /site), built " \
           "cold in 1.5 s" in text
    assert any(line.startswith("[env] jax 0.8.3, jaxlib 0.8.3: environment 0.8.3")
               for line in announced)
    out = result.to_json()
    assert out["package"] == "jax" and out["first_bad"]["sha"] == "0.9.1"
    assert len(out["environments"]) == 5 and out["advice"]


def test_a_release_whose_environment_cannot_be_built_is_skipped(index: Path) -> None:
    """0.9.2's build fails: skipped as a commit that does not import is, and named."""
    rng, pins = release_range(index, "jax", "0.9.0", "0.10.2")
    settings = Settings((NODEID,))
    programs = dict(PROGRAMS)
    PROGRAMS.update({v: _program(1e6, 8) for v in ("0.9.1", "0.10.0")})
    try:
        points = MadeUp(rng, pins, settings, build=_built)
        result = bisect(rng, settings, lambda step: None, points)
    finally:
        PROGRAMS.clear()
        PROGRAMS.update(programs)
    # 0.9.0.1, 0.9.1 good; 0.9.2 skipped; 0.10.0 good: 0.10.2 is the first bad one
    assert result.first_bad is not None and result.first_bad.sha == "0.10.2"
    skipped = [s for s in result.steps if s.call == "skip"]
    assert [s.commit.sha for s in skipped] == ["0.9.2"]
    assert skipped[0].evidence == ("no environment: building an environment with "
                                   "jax==0.9.2 jaxlib==0.9.2: uv said: made up")
    assert "jax 0.9.2: building an environment with" in "\n".join(result.environments)


def test_the_ab_arm_of_low_is_lows_interpreter(index: Path) -> None:
    rng, pins = release_range(index, "jax", "0.8.3", "0.9.0")
    with MadeUp(rng, pins, Settings((NODEID,)), build=_built) as points:
        assert points.compare_with_good() == ["--accelperf-compare-python=/cache/0.8.3/bin/python"]


def test_only_skipped_releases_left_offers_the_narrowed_bisection(index: Path) -> None:
    from pytest_accelperf.bisection.driver import narrowed

    rng, _ = release_range(index, "jax", "0.8.3", "0.10.2")
    words = narrowed(rng, Settings((NODEID,)), rng.commits[3:], "program")
    assert words.endswith(f"accelperf bisect --tolerance 0.01 --package jax 0.9.1 0.10.2 "
                          f"-- '{NODEID}'"), words


# -- mistakes: one line each, nothing built -------------------------------------------------
def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    status = cli.main(["bisect", "--package", *argv, "--", NODEID])
    err = capsys.readouterr().err
    return status, err


@pytest.mark.parametrize(("argv", "said"), [
    (("jax", "0.8.4", "0.10.2"), "accelperf: error: jax 0.8.4 was never released (or was "
                                 "yanked, or has no file for Python "),
    (("jax", "0.10.2", "0.8.3"), "accelperf: error: jax 0.10.2..0.8.3: the range is backwards "
                                 "(the older release first: 0.8.3 0.10.2)\n"),
    (("jax", "0.9.1", "0.9.1"), "accelperf: error: jax 0.9.1 and 0.9.1 are the same release: "
                                "nothing to bisect; pass two releases, the older (good) one "
                                "first\n"),
    (("nosuch", "1.0", "2.0"), "accelperf: error: nosuch: no such package on the index"),
])
def test_a_wrong_release_or_range_is_one_line(index: Path, capsys: pytest.CaptureFixture[str],
                                              argv: tuple[str, ...], said: str) -> None:
    status, err = _cli(capsys, *argv)
    assert status == 1 and err.startswith(said) and err.count("\n") == 1, err
    if "never released" in said:  # the index asked is named, then the nearest releases
        assert err.endswith("/{name}/json ($ACCELPERF_INDEX_JSON); nearest: 0.8.3, 0.9.0, "
                            "0.9.0.1\n"), err


def test_a_directory_outside_git_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    status, err = _cli(capsys, "jax", "0.8.3", "0.10.2")
    assert status == 1 and err.count("\n") == 1, err
    assert err.startswith(f"accelperf: error: {tmp_path} is not in a git repository"), err


def test_no_network_is_one_line(monkeypatch: pytest.MonkeyPatch,
                                capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv(INDEX_JSON_ENV, "http://127.0.0.1:9/{name}/json")  # nothing listens
    status, err = _cli(capsys, "jax", "0.8.3", "0.10.2")
    assert status == 1 and err.count("\n") == 1, err
    assert err.startswith("accelperf: error: jax: cannot reach the index "), err
    assert "is there a network?" in err


def test_an_environment_build_that_fails_halfway_is_one_line_and_leaves_no_entry(
        index: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """uv makes the virtual environment, then its install fails (as it does when the
    network goes mid-build): one line with uv's words, no entry in the cache, nothing of
    this environment changed."""
    real = find_uv()
    fake = index / "uv"
    fake.write_text(f"#!/bin/sh\nif [ \"$1\" = pip ]; then\n  echo 'error: Failed to fetch: "
                    f"`https://pypi.org/simple/jaxlib/`' >&2\n  echo '  Caused by: dns error' "
                    f">&2\n  exit 2\nfi\nexec {real} \"$@\"\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    cache = index / "cache"
    monkeypatch.setenv("ACCELPERF_UV", str(fake))
    monkeypatch.setenv("ACCELPERF_ENV_CACHE", str(cache))
    before = sorted(os.listdir(Path(sys.prefix) / "lib"))
    status, err = _cli(capsys, "jax", "0.8.3", "0.9.0")
    assert status == 1 and err.count("\n") == 1, err
    assert err.startswith("accelperf: error: building an environment with jax==0.8.3 "
                          "jaxlib==0.8.3: uv said: Failed to fetch: "), err
    assert "dns error" in err
    assert [p.name for p in cache.iterdir() if not p.name.endswith(".lock")] == []
    assert sorted(os.listdir(Path(sys.prefix) / "lib")) == before


def test_help_names_the_package_option(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["bisect", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--package NAME" in text and "jaxlib follows jax" in text
