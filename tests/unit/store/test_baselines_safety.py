"""The store's safety net: every path it writes is inside it, writers lock each other out
whatever their environment, an interrupted write is cleaned up, files are readable by
others, ``prune`` never drops a case that pytest collects, and ``accept`` stores only what
an update would.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from conftest import Suite
from filelock import FileLock

from pytest_accelperf.checks.summary import summarize
from pytest_accelperf.cli import main
from pytest_accelperf.collect.cases import Case
from pytest_accelperf.store.baselines import (
    LOCK_NAME,
    BaselineError,
    BaselineStore,
    atomic_write,
)
from unit.report.test_reports import PLATFORM, make_run, synthetic_report

BLOCK = summarize(make_run(Case(backend="jax", batch=8), step_time=0.01)).to_json()


def _json_files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*.json"))


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    status = main(list(argv))
    captured = capsys.readouterr()
    return status, captured.out, captured.err


# -- every path inside the store ---------------------------------------------------------------
@pytest.mark.parametrize("platform", ["../x", "/somewhere", "a/b", ".hidden", "", "..", "x y"])
def test_a_platform_must_be_one_safe_path_component(tmp_path: Path, platform: str) -> None:
    with pytest.raises(BaselineError, match=r"invalid platform .*: a platform key is one path "
                                            r"component"):
        BaselineStore(tmp_path / "store", platform).write({"m.py::t[a]": BLOCK})
    assert _json_files(tmp_path) == []


@pytest.mark.parametrize(("nodeid", "why"), [
    ("/somewhere/evil.py::t[a]", "is not a relative path under the rootdir"),
    ("../../x.py::t[a]", "is not a relative path under the rootdir"),
    ("suites/../../x.py::t[a]", "is not a relative path under the rootdir"),
    ("suites//x.py::t[a]", "is not a relative path under the rootdir"),
    ("::test_x[a]", "the test module is outside the pytest rootdir"),
])
def test_node_ids_outside_the_rootdir_are_refused(tmp_path: Path, nodeid: str,
                                                  why: str) -> None:
    store = BaselineStore(tmp_path / "a" / "b" / "store", "cpu-x2")
    with pytest.raises(BaselineError, match=rf"{why}") as exc:
        store.write({nodeid: BLOCK, "suites/ok.py::t[a]": BLOCK})
    assert str(exc.value).startswith(f"{nodeid}: not stored")
    # the good case was written, the bad one nowhere
    assert _json_files(tmp_path) == ["a/b/store/cpu-x2/suites/ok.json"]
    with pytest.raises(BaselineError, match=why):
        store.get(nodeid)


def test_a_link_out_of_the_store_is_refused(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (tmp_path / "store" / "cpu-x2").mkdir(parents=True)
    (tmp_path / "store" / "cpu-x2" / "suites").symlink_to(outside)
    with pytest.raises(BaselineError, match="outside the baseline store"):
        BaselineStore(tmp_path / "store", "cpu-x2").write({"suites/m.py::t[a]": BLOCK})
    assert list(outside.iterdir()) == []


def _report_with(tmp_path: Path, **cases: dict[str, Any]) -> Path:
    """A saved synthetic report whose first cases are edited as ``cases`` says."""
    data = json.loads(json.dumps(synthetic_report().to_json(1), default=str))
    for (_, edit), case in zip(sorted(cases.items()), data["cases"], strict=False):
        case.update(edit)
    path = tmp_path / "r.json"
    path.write_text(json.dumps(data, indent=2))
    return path


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    work = tmp_path / "a" / "b" / "work"
    work.mkdir(parents=True)
    monkeypatch.chdir(work)
    (work / "baselines").mkdir()
    return work


def test_accept_refuses_node_ids_and_platforms_outside_the_store(
        workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    top = workdir.parents[2]
    _report_with(workdir,
                 a={"nodeid": f"{top}/evil.py::t[a]"},
                 b={"nodeid": "../../x.py::t[a]"},
                 c={"platform": f"{top}/somewhere"},
                 d={"platform": "../x"},
                 e={"nodeid": "::t[a]"})
    status, out, err = _run(capsys, "baselines", "accept", "r.json", "--all")
    assert status == 1, out
    lines = err.splitlines()
    assert lines[0].startswith("accelperf: error: r.json:")
    assert any(f"case '{top}/evil.py::t[a]'" in line and "not a relative path under the "
               "rootdir" in line for line in lines)
    assert any("case '../../x.py::t[a]'" in line and "not a relative path" in line
               for line in lines)
    assert any(f"[{top}/somewhere]: invalid platform" in line for line in lines)
    assert any("[../x]: invalid platform" in line for line in lines)
    assert any("case '::t[a]'" in line and "outside the pytest rootdir" in line
               for line in lines)
    assert lines[-1] == "nothing was written to baselines"
    assert _json_files(top) == ["a/b/work/r.json"]


def test_accept_validates_blocks_as_the_plugin_does(
        workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    module = workdir / "baselines" / PLATFORM / "suites" / "test_m.json"
    BaselineStore(workdir / "baselines", PLATFORM).write({"suites/test_m.py::keep": BLOCK})
    before = module.read_text()
    good = dict(BLOCK)
    _report_with(workdir,
                 a={"block": {**good, "outcome": "timeout"}},
                 b={"block": {k: v for k, v in good.items() if k != "environment"}},
                 c={"block": {**good, "loss": {**good["loss"], "final": float("nan")}}},
                 d={"run": {**make_run(Case(backend="jax", batch=8), step_time=0.01).to_json(),
                            "outcome": "nan"}})
    status, _, err = _run(capsys, "baselines", "accept", "r.json", "--all")
    assert status == 1
    assert "not stored as a baseline: invalid block: outcome: Input should be 'ok' or 'oom' " \
           "(found 'timeout')" in err
    assert "invalid block: environment: missing (a required field)" in err
    assert "invalid block: loss.final: Input should be a finite number (found nan)" in err
    assert "never stored as a baseline: the run ended with outcome nan" in err
    assert "nothing was written" in err
    assert module.read_text() == before
    status, out, _ = _run(capsys, "baselines", "show")  # the module file is still readable
    assert status == 0 and "1 case(s) in baselines" in out


def test_accept_refuses_a_failed_reference_check_as_update_does(
        workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A correctness failure is not an intended change: accept refuses it exactly as
    --accelperf-update does (pytest_accelperf.checks.recordable), and writes nothing."""
    data = json.loads(json.dumps(synthetic_report().to_json(1), default=str))
    case = data["cases"][0]
    case["checks"].append({"metric": "reference", "verdict": "regression",
                           "detail": "max |delta| 0.2 differs from the single-device "
                                     "reference", "data": {}})
    (workdir / "r.json").write_text(json.dumps(data, indent=2))
    status, _, err = _run(capsys, "baselines", "accept", "r.json", "--case", case["nodeid"])
    assert status == 1
    assert "never stored as a baseline: the reference check failed: max |delta| 0.2" in err
    assert "nothing was written" in err
    assert _json_files(workdir / "baselines") == []


def test_accept_refuses_a_block_that_is_not_an_object(
        workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _report_with(workdir, a={"block": [1, 2]})
    status, _, err = _run(capsys, "baselines", "accept", "r.json", "--all")
    assert status == 1
    assert "r.json:" in err and ": block: should be a JSON object (found [1, 2])" in err
    assert _json_files(workdir / "baselines") == []


@pytest.mark.slow
def test_a_module_outside_the_rootdir_is_refused(suite: Suite) -> None:
    suite.write('''
        from tinytask import make_task
        from pytest_accelperf import cases

        @cases(backend="jax", batch=[8], steps=3, warmup=1)
        def test_out(accelperf):
            accelperf.train(make_task(accelperf.case))
    ''')
    (suite.pytester.path / "proj").mkdir()
    result = suite.run("--rootdir=proj", "--accelperf-update", "test_suite.py")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*::test_out?jax-nomesh-b8?: not stored: the test module is "
                                 "outside the pytest rootdir*"])
    assert _json_files(suite.pytester.path) == []


# -- one lock for every writer -----------------------------------------------------------------
_WRITE = """
import sys
from pathlib import Path
from pytest_accelperf.store import baselines

baselines.LOCK_TIMEOUT = float(sys.argv[3])
block = {"outcome": "ok", "environment": {}}
for i in range(int(sys.argv[4])):
    store = baselines.BaselineStore(Path(sys.argv[1]), "cpu-x2")
    store.write({f"suites/test_m.py::t[{sys.argv[2]}-{i}]": block})
"""


def _writer(store: Path, tag: str, tmpdir: Path, timeout: float, n: int = 1
            ) -> subprocess.Popen[str]:
    tmpdir.mkdir(exist_ok=True)
    env = {**os.environ, "TMPDIR": str(tmpdir)}
    return subprocess.Popen([sys.executable, "-c", _WRITE, str(store), tag, str(timeout),
                             str(n)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def test_writers_with_another_tmpdir_wait_for_the_lock(tmp_path: Path) -> None:
    store = tmp_path / "store"
    BaselineStore(store, "cpu-x2").write({"suites/test_m.py::first": BLOCK})
    with FileLock(str(store / LOCK_NAME)):
        proc = _writer(store, "b", tmp_path / "tmp-b", timeout=1.0)
        out, _ = proc.communicate(timeout=120)
    assert proc.returncode != 0
    assert "another session or accelperf command has been writing this baseline store" in out
    cases = json.loads((store / "cpu-x2" / "suites" / "test_m.json").read_text())["cases"]
    assert sorted(cases) == ["first"]


def test_concurrent_updates_with_different_tmpdirs_lose_nothing(tmp_path: Path) -> None:
    store = tmp_path / "store"
    procs = [_writer(store, tag, tmp_path / f"tmp-{tag}", timeout=120.0, n=25)
             for tag in ("a", "b")]
    for proc in procs:
        out, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0, out
    cases = json.loads((store / "cpu-x2" / "suites" / "test_m.json").read_text())["cases"]
    assert sorted(cases) == sorted(f"t[{t}-{i}]" for t in "ab" for i in range(25))


def test_the_lock_stays_out_of_git_status_and_show(
        workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    subprocess.run(["git", "init", "-q", str(workdir)], check=True)
    BaselineStore(workdir / "baselines", "cpu-x2").write({"suites/test_m.py::t[a]": BLOCK})
    assert (workdir / "baselines" / LOCK_NAME).exists()
    status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"],
                            cwd=workdir, capture_output=True, text=True, check=True).stdout
    assert status.splitlines() == ["?? baselines/cpu-x2/suites/test_m.json"]
    code, out, _ = _run(capsys, "baselines", "show")
    assert code == 0 and out.rstrip().endswith("1 case(s) in baselines")
    assert "lock" not in out


# -- interrupted writes, permissions -----------------------------------------------------------
_KILLED = """
import os, signal, sys
from pathlib import Path
from pytest_accelperf.store.baselines import BaselineStore
os.replace = lambda *a: os.kill(os.getpid(), signal.SIGKILL)  # killed mid-write
BaselineStore(Path(sys.argv[1]), "cpu-x2").write(
    {"m.py::t[b]": {"outcome": "ok", "environment": {}}})
"""


def test_a_killed_write_leaves_a_temporary_file_that_the_next_write_removes(
        tmp_path: Path) -> None:
    store = tmp_path / "store"
    BaselineStore(store, "cpu-x2").write({"m.py::t[a]": BLOCK})
    done = subprocess.run([sys.executable, "-c", _KILLED, str(store)], check=False)
    assert done.returncode == -signal.SIGKILL
    directory = store / "cpu-x2"
    left = [p.name for p in directory.iterdir() if p.name.endswith(".tmp")]
    assert len(left) == 1 and left[0].startswith(".m.json.")
    unrelated = [".other.json.abcd1234.tmp", "m.json.bak", ".m.json.tmp", ".m.json.ab.tmp"]
    for name in unrelated:
        (directory / name).write_text("keep me")
    BaselineStore(store, "cpu-x2").write({"m.py::t[c]": BLOCK})
    assert sorted(p.name for p in directory.iterdir()) == sorted(["m.json", *unrelated])
    assert sorted(json.loads((directory / "m.json").read_text())["cases"]) == ["t[a]", "t[c]"]


@pytest.mark.parametrize(("umask", "mode"), [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_files_get_the_permissions_of_the_umask(tmp_path: Path, umask: int, mode: int) -> None:
    old = os.umask(umask)
    try:
        BaselineStore(tmp_path / "store", "cpu-x2").write({"m.py::t[a]": BLOCK})
        atomic_write(tmp_path / "report.json", "{}\n")
    finally:
        os.umask(old)
    assert (tmp_path / "store" / "cpu-x2" / "m.json").stat().st_mode & 0o777 == mode
    assert (tmp_path / "report.json").stat().st_mode & 0o777 == mode


# -- prune: only what pytest no longer collects ------------------------------------------------
PARAMS = "import pytest\n\n@pytest.mark.parametrize('n', {})\ndef test_p(n):\n    pass\n"


def _project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cwd: str = ".") -> Path:
    """A rootdir (its pyproject.toml says so) with test_p.py (cases 'a b' and 'c'),
    test_b.py, and a store holding them and a stale case of each module."""
    root = tmp_path / "project"
    (root / "sub").mkdir(parents=True)
    (root / "pyproject.toml").write_text("[tool.pytest.ini_options]\n")
    (root / "test_p.py").write_text(PARAMS.format("['a b', 'c']"))
    (root / "test_b.py").write_text("def test_b():\n    pass\n")
    BaselineStore(root / "baselines", "cpu-x2").write(
        {f"test_p.py::test_p[{n}]": BLOCK for n in ("a b", "c", "stale")}
        | {"test_b.py::test_b": BLOCK, "test_b.py::test_gone": BLOCK})
    monkeypatch.chdir(root / cwd)
    return root


def _stored(root: Path) -> list[str]:
    out = []
    for path in sorted((root / "baselines" / "cpu-x2").rglob("*.json")):
        out += [f"{path.stem}.py::{k}" for k in json.loads(path.read_text())["cases"]]
    return sorted(out)


@pytest.mark.slow
def test_prune_from_a_subdirectory_keeps_live_baselines(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    root = _project(tmp_path, monkeypatch, cwd="sub")
    status, out, err = _run(capsys, "baselines", "prune", "--baselines", "../baselines",
                            "../test_p.py")
    assert status == 0, err
    assert "left alone (not collected here): test_b.py" in out
    assert "drop test_p.py::test_p[stale] [cpu-x2]" in out
    assert _stored(root) == ["test_b.py::test_b", "test_b.py::test_gone",
                             "test_p.py::test_p[a b]", "test_p.py::test_p[c]"]


def test_prune_keeps_case_ids_with_spaces_and_deselected_cases(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    root = _project(tmp_path, monkeypatch)
    status, out, err = _run(capsys, "baselines", "prune", "--", "test_p.py", "-k", "c")
    assert status == 0, err
    assert "would drop" not in out and out.count("drop ") == 1
    assert "drop test_p.py::test_p[stale] [cpu-x2]" in out
    assert "dropped 1 case(s) no longer collected; 2 collected" in out
    assert "test_p.py::test_p[a b]" in _stored(root)


def test_prune_with_a_node_id_file_keeps_ids_with_spaces(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    root = _project(tmp_path, monkeypatch)
    listing = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p",
                              "no:cacheprovider", "-W", "always", "test_p.py", "test_b.py"],
                             capture_output=True, text=True, check=True).stdout
    assert "test_p.py::test_p[a b]" in listing
    (root / "ids.txt").write_text(listing + textwrap.dedent("""
        ========================= warnings summary =========================
        test_p.py::test_p[c]
          /somewhere/x.py:1: UserWarning: test_p.py::test_p[stale] is mentioned here
    """))
    status, out, err = _run(capsys, "baselines", "prune", "--nodeids", "ids.txt")
    assert status == 0, err
    assert sorted(line for line in out.splitlines() if line.startswith("drop ")) == [
        "drop test_b.py::test_gone [cpu-x2]", "drop test_p.py::test_p[stale] [cpu-x2]"]
    assert _stored(root) == ["test_b.py::test_b", "test_p.py::test_p[a b]",
                             "test_p.py::test_p[c]"]


def test_prune_drops_the_cases_of_a_deleted_module_only_when_it_collected(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    root = _project(tmp_path, monkeypatch, cwd="sub")
    (root / "test_b.py").unlink()
    (root / "ids.txt").write_text("test_p.py::test_p[a b]\ntest_p.py::test_p[c]\n")
    # a node id list says nothing of the rootdir: the deleted module is left alone
    status, out, _ = _run(capsys, "baselines", "prune", "--baselines", "../baselines",
                          "--nodeids", "../ids.txt")
    assert status == 0 and "left alone (not collected here): test_b.py" in out
    assert "test_b.py::test_b" in _stored(root)
    # a collection knows it: test_b.py is gone from the rootdir, wherever prune runs
    status, out, _ = _run(capsys, "baselines", "prune", "--baselines", "../baselines",
                          "../test_p.py")
    assert status == 0
    assert "drop test_b.py::test_b [cpu-x2]" in out
    assert _stored(root) == ["test_p.py::test_p[a b]", "test_p.py::test_p[c]"]
