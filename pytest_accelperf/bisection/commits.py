"""The commits a bisection runs over, and git worktrees of them (see
:mod:`pytest_accelperf.bisection`): ``GOOD..BAD`` on BAD's first-parent line, oldest first,
and a detached worktree per commit under one temporary directory, every one removed at the
end. Nothing here changes the repository's working tree, index or branches; git is run
without a prompt, without hooks and with a timeout.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from pytest_accelperf.bisection import BisectError
from pytest_accelperf.git import GitError as GitFailed
from pytest_accelperf.git import git as run_git
from pytest_accelperf.git import git_test

#: Seconds a git command that reads the repository may take.
GIT_TIMEOUT_S = 120.0
#: Seconds ``git worktree add`` may take: it writes every file of the commit.
CHECKOUT_TIMEOUT_S = 600.0


class GitError(BisectError):
    """A git command that failed or did not finish; the message quotes git."""


@dataclass(frozen=True)
class Commit:
    """A commit: its full sha and the first line of its message."""

    sha: str
    subject: str

    @property
    def short(self) -> str:
        return self.sha[:10]


@dataclass(frozen=True)
class CommitRange:
    """What is bisected: the repository, the two ends and the commits of ``GOOD..BAD``
    on BAD's first-parent line, oldest first (the last is BAD)."""

    root: Path
    good: Commit
    bad: Commit
    commits: tuple[Commit, ...]
    #: The working directory's place in the repository (``.`` at its top): a session at a
    #: commit runs in the same place of that commit's worktree, so that the node ids mean
    #: the same.
    subdir: Path = Path()
    #: The refs as the user wrote them.
    good_ref: str = ""
    bad_ref: str = ""
    #: Set for a range of a package's releases (:mod:`.releases`), not of commits: each
    #: "commit" is then a release, its ``sha`` the version and its ``subject`` what is
    #: installed (``jax 0.9.1, jaxlib 0.9.1``).
    package: str = ""

    @property
    def unit(self) -> str:
        """What the range is of, in words: ``commit`` or ``release``."""
        return "release" if self.package else "commit"

    def position(self, commit: Commit) -> int:
        """1 for the oldest commit of the range, len(commits) for BAD, 0 for GOOD."""
        return 0 if commit == self.good else self.commits.index(commit) + 1


def git(repo: Path, *args: str, timeout: float = GIT_TIMEOUT_S) -> str:
    """``git -C repo ARGS``'s output; a :class:`GitError` quoting git when it fails."""
    try:
        return run_git(repo, *args, timeout=timeout)
    except GitFailed as exc:
        raise GitError(str(exc)) from None


def _resolve(root: Path, ref: str, which: str) -> Commit:
    try:
        sha = git(root, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
    except GitError:
        raise BisectError(f"{which} {ref!r}: git cannot resolve it to a commit in {root}; "
                          f"pass a branch, tag or commit (git log --oneline lists them)"
                          ) from None
    return Commit(sha, git(root, "log", "-1", "--format=%s", sha))


def _is_ancestor(root: Path, older: str, newer: str) -> bool:
    try:
        return git_test(root, "merge-base", "--is-ancestor", older, newer,
                        timeout=GIT_TIMEOUT_S)
    except GitFailed as exc:
        raise GitError(str(exc)) from None


def commit_range(cwd: Path, good: str, bad: str) -> CommitRange:
    """The commits of ``good..bad`` on ``bad``'s first-parent line, for a bisection run
    from ``cwd``; a :class:`BisectError` naming the ref and the fix when a ref is unknown,
    the two are the same commit, ``good`` is not an ancestor of ``bad`` or is not on its
    first-parent line."""
    try:
        root = Path(git(cwd, "rev-parse", "--show-toplevel")).resolve()
    except GitError as exc:
        raise BisectError(f"{cwd} is not in a git repository ({exc}); run accelperf bisect "
                          f"in the repository whose history has GOOD and BAD") from None
    good_c, bad_c = _resolve(root, good, "GOOD"), _resolve(root, bad, "BAD")
    if good_c.sha == bad_c.sha:
        raise BisectError(f"GOOD {good!r} and BAD {bad!r} are the same commit "
                          f"({good_c.short}): nothing to bisect")
    if not _is_ancestor(root, good_c.sha, bad_c.sha):
        hint = ("they look swapped: pass the older, good commit first"
                if _is_ancestor(root, bad_c.sha, good_c.sha) else
                f"pass a GOOD from BAD's history (git log --first-parent --oneline {bad})")
        raise BisectError(f"GOOD {good!r} ({good_c.short}) is not an ancestor of BAD {bad!r} "
                          f"({bad_c.short}); {hint}")
    listed = git(root, "log", "--first-parent", "--reverse", "--format=%H%x00%s",
                 f"{good_c.sha}..{bad_c.sha}")
    commits = tuple(Commit(*line.split("\0", 1)) for line in listed.splitlines())
    if git(root, "rev-parse", f"{commits[0].sha}^1") != good_c.sha:
        raise BisectError(f"GOOD {good!r} ({good_c.short}) is an ancestor of BAD {bad!r} but "
                          f"not on its first-parent line (it came in through a merge); pass "
                          f"a commit that git log --first-parent --oneline {bad} lists")
    subdir = Path(cwd).resolve().relative_to(root)
    return CommitRange(root, good_c, bad_c, commits, subdir, good, bad)


class Worktrees:
    """Detached git worktrees of commits, under one temporary directory; :meth:`close`
    (or leaving the ``with`` block, also on an exception or Ctrl-C) removes every one that
    is left, the directory, and git's record of each. No branch is made, and no hook of
    the repository runs (``core.hooksPath=/dev/null``)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        #: Where git keeps the worktrees' administrative directories.
        self._admin = (root / git(root, "rev-parse", "--git-common-dir")) / "worktrees"
        self.dir = Path(tempfile.mkdtemp(prefix="accelperf-bisect-"))
        #: worktree path -> git's administrative directory of it (``.git/worktrees/X``).
        self._made: dict[Path, Path] = {}
        self._count = 0

    def add(self, commit: Commit) -> Path:
        """A fresh worktree of ``commit``; one whose checkout fails or is interrupted is
        removed before the error goes on."""
        path = self.dir / f"{commit.short}-{self._count}"
        self._count += 1
        try:
            git(self.root, "-c", "core.hooksPath=/dev/null", "worktree", "add", "--detach",
                "--quiet", str(path), commit.sha, timeout=CHECKOUT_TIMEOUT_S)
            self._made[path] = Path(git(path, "rev-parse", "--absolute-git-dir"))
        except BaseException:
            self._made.pop(path, None)
            shutil.rmtree(path, ignore_errors=True)
            self._forget(path)
            raise
        return path

    def _forget(self, path: Path) -> None:
        """Remove git's record of a worktree of ours that was cut short (the one whose
        ``gitdir`` names ``path``), and only that."""
        if not self._admin.is_dir():
            return
        for admin in self._admin.iterdir():
            try:
                named = Path((admin / "gitdir").read_text().strip())
            except OSError:
                continue
            if named == path / ".git":
                shutil.rmtree(admin, ignore_errors=True)

    def remove(self, path: Path) -> None:
        """Remove a worktree :meth:`add` made: its files and git's record of it (never
        another worktree's: no ``git worktree prune``)."""
        admin = self._made.pop(path, None)
        try:
            git(self.root, "worktree", "remove", "--force", "--force", str(path))
        except GitError:
            shutil.rmtree(path, ignore_errors=True)
            if admin is not None:
                shutil.rmtree(admin, ignore_errors=True)

    def close(self) -> None:
        for path in list(self._made):
            self.remove(path)
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> Worktrees:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
