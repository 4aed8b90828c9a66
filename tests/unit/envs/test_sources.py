"""What the environment cache is told to build: a revision's dependency files against the
working tree's (pytest_accelperf.envs.depfiles), a package's releases in a range
(envs.releases), an interpreter's stack and the check of a given one (envs.stack)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_accelperf.envs import EnvError
from pytest_accelperf.envs.depfiles import dependency_change, files_at, files_here
from pytest_accelperf.envs.releases import INDEX_JSON_ENV, list_releases
from pytest_accelperf.envs.stack import check_python, stack_versions

SESSION = {"jax": "0.10.2", "jaxlib": "0.10.2", "flax": "0.12.8", "numpy": "2.4.6"}


def have(name: str) -> str | None:
    return SESSION.get(name)


def test_a_pinned_requirement_the_session_does_not_meet_is_installed() -> None:
    base = {"requirements.txt": b"jax==0.8.3\njaxlib==0.8.3  # cpu\n-r more.txt\nnumpy>=1.26\n"}
    head = {"requirements.txt": b"jax==0.10.2\njaxlib==0.10.2\nnumpy>=1.26\n"}
    change = dependency_change(base, head, have)
    assert change.files == ["requirements.txt"]
    assert change.requirements == ["jax==0.8.3", "jaxlib==0.8.3"]


def test_a_requirement_the_session_meets_already_needs_nothing() -> None:
    base = {"pyproject.toml": b'[project]\nname = "x"\ndependencies = ["jax>=0.6"]\n'}
    head = {"pyproject.toml": b'[project]\nname = "x"\ndependencies = ["jax>=0.8"]\n'}
    change = dependency_change(base, head, have)
    assert change.files == ["pyproject.toml"] and change.requirements == []


def test_an_extra_counts_only_where_its_package_is_installed() -> None:
    base = {"pyproject.toml": b'[project]\nname = "x"\ndependencies = []\n'
                              b'[project.optional-dependencies]\n'
                              b'jax = ["flax==0.11.2"]\ntorch = ["torch==2.4.0"]\n'}
    head = {"pyproject.toml": b'[project]\nname = "x"\ndependencies = []\n'
                              b'[project.optional-dependencies]\n'
                              b'jax = ["flax==0.12.8"]\ntorch = ["torch==2.5.0"]\n'}
    assert dependency_change(base, head, have).requirements == ["flax==0.11.2"]


def test_a_lock_gives_its_pinned_versions_and_a_setup_py_is_named_only() -> None:
    lock = ('version = 1\n[[package]]\nname = "x"\nversion = "0.1.0"\nsource = {{ editable = '
            '"." }}\n[[package]]\nname = "jax"\nversion = "{v}"\n[[package]]\nname = "pywin32"\n'
            'version = "{v}"\n')
    base = {"uv.lock": lock.format(v="0.8.3").encode(), "setup.py": b"setup()\n"}
    head = {"uv.lock": lock.format(v="0.10.2").encode(), "setup.py": b"setup(name='x')\n"}
    change = dependency_change(base, head, have)
    assert change.files == ["setup.py", "uv.lock"]
    assert change.requirements == ["jax==0.8.3"]  # not the project, not what is absent here
    assert change.notes == ["setup.py differs; its requirements are not read"]


def test_the_same_files_are_no_change() -> None:
    files = {"requirements.txt": b"jax==0.8.3\n"}
    change = dependency_change(files, dict(files), have)
    assert (change.files, change.requirements) == ([], [])


def test_a_revisions_dependency_files_are_read_from_git(tmp_path: Path) -> None:
    def git(*args: str) -> str:
        return subprocess.run(["git", "-c", "user.email=a@b", "-c", "user.name=a", *args],
                              cwd=tmp_path, check=True, capture_output=True,
                              text=True).stdout.strip()

    git("init", "-q")
    (tmp_path / "requirements").mkdir()
    (tmp_path / "requirements" / "gpu.txt").write_text("jax==0.8.3\n")
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\n')
    (tmp_path / "model.py").write_text("")
    git("add", "-A")
    git("commit", "-qm", "base")
    (tmp_path / "requirements" / "gpu.txt").write_text("jax==0.10.2\n")
    at = files_at(tmp_path, git("rev-parse", "HEAD"))
    assert sorted(at) == ["pyproject.toml", "requirements/gpu.txt"]
    change = dependency_change(at, files_here(tmp_path), have)
    assert change.files == ["requirements/gpu.txt"] and change.requirements == ["jax==0.8.3"]


@pytest.fixture
def index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A stand-in for the index's JSON API: ``file://`` folders of ``<name>/json``."""
    releases = {v: [{"yanked": False}] for v in
                ("0.8.2", "0.8.3", "0.9.0", "0.9.1rc1", "0.10.0", "0.10.1", "0.10.2", "0.11.0")}
    releases["0.10.1"] = [{"yanked": True}]
    releases["0.9.5"] = []
    (tmp_path / "jax").mkdir()
    (tmp_path / "jax" / "json").write_text(json.dumps({"releases": releases}))
    monkeypatch.setenv(INDEX_JSON_ENV, f"file://{tmp_path}/{{name}}/json")
    return tmp_path


def test_releases_in_a_range_leave_out_yanked_empty_and_pre_releases(index: Path) -> None:
    assert list_releases("jax", "0.8.3", "0.10.2") == ["0.8.3", "0.9.0", "0.10.0", "0.10.2"]
    assert list_releases("JAX", "0.9.0", "0.9.0") == ["0.9.0"]
    assert list_releases("jax", "0.9.0", "0.9.1rc1") == ["0.9.0", "0.9.1rc1"]


@pytest.mark.parametrize("answer", ['{"releases": [1, 2]}', '{"releases": {"1.0": 3}}',
                                    'not json'])
def test_an_index_answer_of_another_shape_is_one_line(index: Path, answer: str) -> None:
    """The index's answer is validated where it is read (a mirror or a proxy may answer
    with anything): one line naming the package and the address, never a crash inside."""
    (index / "jax" / "json").write_text(answer)
    with pytest.raises(EnvError, match=r"^jax: cannot read the index's answer \(file://"):
        list_releases("jax", "0.8.3", "0.10.2")


def test_a_backwards_range_an_unknown_release_or_package_is_one_line(index: Path) -> None:
    with pytest.raises(EnvError, match=r"^jax 0.10.2..0.8.3: the range is backwards"):
        list_releases("jax", "0.10.2", "0.8.3")
    with pytest.raises(EnvError, match=r"^jax 0.8.4 was never released \(or was yanked, or "
                                       r"has no file for Python .* on this platform\) on file:"
                                       r".*\(\$ACCELPERF_INDEX_JSON\); nearest: 0.8.2, 0.8.3, "
                                       r"0.9.0$"):
        list_releases("jax", "0.8.3", "0.8.4")
    with pytest.raises(EnvError, match=r"^jax 'banana' is not a version"):
        list_releases("jax", "banana", "0.8.4")
    with pytest.raises(EnvError, match=r"^nosuch: no such package on the index"):
        list_releases("nosuch", "1", "2")


def test_an_index_that_cannot_be_reached_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(INDEX_JSON_ENV, "http://127.0.0.1:9/{name}/json")  # nothing listens
    with pytest.raises(EnvError, match=r"^jax: cannot reach the index .*is there a network"):
        list_releases("jax", "0.8.3", "0.10.2")


def test_an_environments_stack_has_python_and_what_is_installed() -> None:
    assert stack_versions(["pytest", "no-such-dist"])["pytest"] == pytest.__version__
    assert "no-such-dist" not in stack_versions(["no-such-dist"])


def test_the_sessions_own_python_passes_the_check() -> None:
    stack = check_python(sys.executable, "/plugin", ["jax", "optax"], "jax")
    assert stack["jax"] and stack["python"] == ".".join(map(str, sys.version_info[:3]))


def test_a_python_without_the_plugins_dependencies_is_one_line_naming_it(
        tmp_path: Path) -> None:
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    python = str(bare / "bin" / "python")
    with pytest.raises(EnvError) as info:
        check_python(python, "/src/plugin")
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"--accelperf-compare-python={python}: lacks the plugin's "
                              f"dependencies (pytest, numpy"), message
    assert message.endswith(f"e.g. {python} -m pip install -e /src/plugin"), message


def test_a_python_without_the_cases_framework_is_one_line_naming_it() -> None:
    with pytest.raises(EnvError, match=r"^--accelperf-compare-python=\S+: lacks no_such_fw, "
                                       r"which the jax cases import: .* -m pip install "
                                       r"no_such_fw$"):
        check_python(sys.executable, "/plugin", ["jax", "no_such_fw"], "jax")


def test_something_that_is_not_python_is_one_line_naming_it() -> None:
    with pytest.raises(EnvError, match=r"^--accelperf-compare-python=/bin/false: it does not "
                                       r"run Python"):
        check_python("/bin/false", "/plugin")
