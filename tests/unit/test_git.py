"""pytest_accelperf.git: the one place git is run (A/B mode, accelperf bisect, the history)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from pytest_accelperf.git import GitError, GitTimeout, git, git_or_none, git_test, git_to


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    def run(*args: str) -> None:
        subprocess.run(["git", "-c", "user.email=ci@example.com", "-c", "user.name=ci",
                        *args], cwd=tmp_path, check=True, capture_output=True)
    run("init", "-q")
    (tmp_path / "a.txt").write_text("one\n")
    run("add", "a.txt")
    run("commit", "-qm", "first")
    (tmp_path / "a.txt").write_text("two\n")
    run("commit", "-qam", "second")
    return tmp_path


def test_output_is_stripped_and_a_failure_quotes_git(repo: Path) -> None:
    assert git(repo, "log", "-1", "--format=%s") == "second"
    with pytest.raises(GitError, match=r"git rev-parse --verify nosuchref failed: fatal: "):
        git(repo, "rev-parse", "--verify", "nosuchref")


def test_a_yes_no_command_answers_by_its_status(repo: Path) -> None:
    first = git(repo, "rev-parse", "HEAD~1")
    assert git_test(repo, "merge-base", "--is-ancestor", first, "HEAD")
    assert not git_test(repo, "merge-base", "--is-ancestor", "HEAD", first)
    with pytest.raises(GitError, match="merge-base"):
        git_test(repo, "merge-base", "--is-ancestor", "nosuchref", "HEAD")


def test_output_to_a_file(repo: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    out = tmp_path_factory.mktemp("archive") / "a.tar"
    with out.open("wb") as f:
        git_to(repo, f, "archive", "--format=tar", "HEAD", timeout=60)
    assert out.stat().st_size > 0


def test_a_command_that_does_not_finish_is_stopped(repo: Path) -> None:
    with pytest.raises(GitTimeout, match=r"git log in .* did not finish within 1e-06 s"):
        git(repo, "log", timeout=1e-6)


def test_no_git_and_no_repository(repo: Path, tmp_path_factory: pytest.TempPathFactory,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    assert git_or_none(tmp_path_factory.mktemp("norepo"), "rev-parse", "HEAD") is None
    monkeypatch.setenv("PATH", "")
    with pytest.raises(GitError, match="git is not installed"):
        git(repo, "log")
    assert git_or_none(repo, "rev-parse", "HEAD") is None
