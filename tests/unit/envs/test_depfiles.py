"""A base revision's dependency files that cannot be read (envs.depfiles): every file, one
rule. A line or a file that cannot be read is named, with its line and the revision, in
one line each, and the session goes on in its own environment for it (as A/B mode says);
nothing of it is installed, and it is never dropped in silence."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from pytest_accelperf.ab.rounds import Comparison
from pytest_accelperf.envs.depfiles import Unreadable, dependency_change, read_requirements


def have(name: str) -> str | None:
    return {"jax": "0.10.2", "numpy": "2.4.6"}.get(name)


@pytest.mark.parametrize(("rel", "content", "line", "text"), [
    ("requirements.txt", b"numpy\njax=>>0.8\n", 2, "jax=>>0.8"),
    ("requirements/gpu.txt", b"jax[cuda]==0.8.3; python_version >< '3'\n", 1,
     "jax[cuda]==0.8.3; python_version >< '3'"),
    ("constraints.txt", b"# pins\njax = 0.8.3\n", 2, "jax = 0.8.3"),
    ("pyproject.toml", b'[project]\nname = "x"\ndependencies = [\n  "jax=>>0.8",\n]\n', 4,
     "jax=>>0.8"),
    ("pyproject.toml", b'[project]\nname = "x"\ndependencies = "jax"\n', 3,
     "project.dependencies"),
    ("pyproject.toml", b'[project\nname = "x"\n', 1, ""),
    ("uv.lock", b'version = 1\n[[package]\n', 2, ""),
    ("Pipfile.lock", b'{"default": \n', 2, ""),
])
def test_each_file_names_what_it_cannot_read_and_where(rel: str, content: bytes, line: int,
                                                       text: str) -> None:
    found = read_requirements(rel, content)
    assert len(found.unreadable) == 1, found
    assert (found.unreadable[0].line, found.unreadable[0].text) == (line, text)
    assert found.unreadable[0].why


def test_what_pip_reads_as_no_requirement_is_not_unreadable() -> None:
    """Options, a requirement's own options, continued lines, paths and URLs, comments."""
    text = (b"-r more.txt\n--index-url https://x.example/simple\n-e .\n./vendored\n"
            b"https://x.example/a-1.0-py3-none-any.whl\n"
            b"jax==0.8.3 \\\n    --hash=sha256:00\nnumpy>=1.26  # the floor\n\n# done\n")
    found = read_requirements("requirements.txt", text)
    assert found.unreadable == ()
    assert found.always == {"jax==0.8.3", "numpy>=1.26"}


def test_the_issues_requirements_line_is_named_not_dropped() -> None:
    """The base's ``jax=>>0.8`` against the working tree's ``jax``: before, nothing said."""
    change = dependency_change({"requirements.txt": b"jax=>>0.8\n"},
                               {"requirements.txt": b"jax\n"}, have)
    assert change.requirements == []
    assert change.unreadable == ["requirements.txt line 1 ('jax=>>0.8': Expected semicolon "
                                 "(after name with no version specifier) or end)"]
    assert Unreadable(None, "", "not TOML").describe("uv.lock") == "uv.lock (not TOML)"


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.email=a@b", "-c", "user.name=a", *args],
                          cwd=root, check=True, capture_output=True, text=True).stdout.strip()


@pytest.mark.parametrize(("name", "base", "said"), [
    ("requirements.txt", "jax=>>0.8\n",
     "requirements.txt line 1 ('jax=>>0.8': Expected semicolon (after name with no version "
     "specifier) or end)"),
    ("pyproject.toml", "[project\n",
     "pyproject.toml line 1 (Expected ']' at the end of a table declaration (at line 1, "
     "column 9))"),
])
def test_ab_mode_says_the_file_the_line_and_the_revision_and_goes_on(
        tmp_path: Path, name: str, base: str, said: str) -> None:
    _git(tmp_path, "init", "-q")
    (tmp_path / name).write_text(base)
    _git(tmp_path, "add", "-A")
    _git(tmp_path, "commit", "-qm", "base")
    (tmp_path / name).write_text('[project]\nname = "x"\n' if name.endswith(".toml")
                                 else "jax\n")
    lines: list[str] = []
    comparison = Comparison("HEAD", tmp_path, "cpu", 1, None, notify=lines.append)
    assert comparison._base_interpreter() is None  # the session's environment
    sha = _git(tmp_path, "rev-parse", "HEAD")[:10]
    assert lines[0] == (f"accelperf: A/B: HEAD ({sha})'s {said} cannot be read: nothing of "
                        f"it is installed, the base arm goes on without it in this session's "
                        f"environment"), lines
    assert lines[1].startswith(f"accelperf: A/B: HEAD's dependency files differ ({name}), but "
                               f"in no requirement this environment lacks")
