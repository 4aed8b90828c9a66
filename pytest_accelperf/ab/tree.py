"""The two arms' files for A/B mode (see :mod:`pytest_accelperf.ab`): the commit a ref
names, its files extracted with ``git archive`` (nothing in the repository is checked out
or changed); the working tree's files as git sees them, copied beside them, so that both
arms run from trees of the same layout (:func:`snapshot`); ``sys.path`` moved into them
(the repository's entries, never the environment's: a ``.venv`` inside the repository is
the interpreter's, :func:`environment_dirs`); and where a test lives relative to the
repository root.
"""

from __future__ import annotations

import os
import shutil
import site
import sys
import sysconfig
import tarfile
import tempfile
from pathlib import Path
from typing import Any

import pytest

from pytest_accelperf.ab import CompareError
from pytest_accelperf.errors import UserError
from pytest_accelperf.git import GitError, GitTimeout, git, git_to

#: Seconds a git command that reads the repository (``rev-parse``, ``ls-files``) may take:
#: instant on a healthy checkout; one that does not end is stuck (a network filesystem, a
#: partial clone fetching from a remote that does not answer, an fsmonitor hook).
GIT_TIMEOUT_S = 120.0
#: Seconds ``git archive`` of the base revision may take: it writes every file of it.
ARCHIVE_TIMEOUT_S = 600.0


class RevisionError(UserError):
    """``--accelperf-compare`` names a revision git cannot give (no such ref, no
    repository, git stuck); the message names the option, the ref and the fix."""


def _git(repo: Path, *args: str) -> str:
    """git's output; a :class:`~pytest_accelperf.ab.CompareError` quoting git when it fails
    or does not finish."""
    try:
        return git(repo, *args, timeout=GIT_TIMEOUT_S)
    except GitError as exc:
        raise CompareError(str(exc)) from None


def resolve(rootdir: Path, ref: str) -> tuple[Path, str]:
    """The repository root containing ``rootdir`` and the commit ``ref`` names; a
    :class:`RevisionError` naming ``--accelperf-compare`` where git cannot say."""
    option = f"--accelperf-compare={ref}"
    root = toplevel(rootdir, option)
    try:
        sha = git(root, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}",
                  timeout=GIT_TIMEOUT_S)
    except GitTimeout as exc:
        raise RevisionError(f"{option}: {exc} resolving {ref!r}; is it a partial clone "
                            f"whose remote does not answer?") from None
    except GitError:
        raise RevisionError(
            f"{option}: git cannot resolve {ref!r} to a commit in {root}; pass a branch, "
            f"tag or commit (in a shallow CI clone fetch it first, e.g. "
            f"git fetch origin main && --accelperf-compare=origin/main)") from None
    return root, sha


def toplevel(rootdir: Path, option: str) -> Path:
    """The repository root containing ``rootdir``; a :class:`RevisionError` naming
    ``option`` where there is none (A/B mode copies the working tree's files as git sees
    them)."""
    try:
        return Path(git(rootdir, "rev-parse", "--show-toplevel", timeout=GIT_TIMEOUT_S))
    except GitTimeout as exc:
        raise RevisionError(f"{option}: {exc}; is the repository on a filesystem that "
                            f"hangs?") from None
    except GitError as exc:
        raise RevisionError(f"{option}: {rootdir} is not in a git repository "
                            f"({exc.said}); A/B mode copies the files git sees") from None


def extract(root: Path, sha: str, into: Path) -> Path:
    """The files of commit ``sha`` under ``into`` (``git archive``; the repository is not
    touched)."""
    archive = into / "base.tar"
    try:
        with archive.open("wb") as out:
            git_to(root, out, "archive", "--format=tar", sha, timeout=ARCHIVE_TIMEOUT_S)
    except GitTimeout:
        raise CompareError(f"git archive {sha[:12]} did not finish within "
                           f"{ARCHIVE_TIMEOUT_S:g} s (it was stopped)") from None
    except GitError as exc:
        raise CompareError(str(exc)) from None
    tree = into / "base"
    with tarfile.open(archive) as tar:
        tar.extractall(tree, filter="data")
    archive.unlink()
    return tree


def snapshot(root: Path, into: Path, name: str = "head") -> Path:
    """The working tree's files under ``into / name``: every file git sees (tracked, and
    untracked but not ignored), as they are now, with the base revision's beside it in
    ``into / "base"`` (:func:`extract`; or a second snapshot, named ``base``, where the
    arms differ in their environment only).

    The two arms then differ only in their files' contents: the same path layout under
    the same temporary directory, the same ``sys.path`` shape, the same working directory
    kind, and the same rule for what is there (what git does not see is in neither tree;
    the base's ``git archive`` could not have it). An arm run from the repository itself
    would import from a different place than the other, and could see files the other
    cannot.
    """
    listed = _git(root, "ls-files", "-z", "--cached", "--others", "--exclude-standard")
    tree = into / name
    tree.mkdir(parents=True, exist_ok=True)
    for rel in filter(None, listed.split("\0")):
        src = root / rel
        if not (src.is_file() or src.is_symlink()):
            continue  # a tracked file deleted in the working tree, a submodule
        dst = tree / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst, follow_symlinks=False)
    return tree


def environment_dirs(repo: Path) -> list[Path]:
    """The directories of this interpreter's environment, which are never code under test:
    its standard library and site-packages wherever they are (a virtual environment inside
    the repository, uv's and poetry's ``.venv``, is the interpreter's, not the revision's),
    and its prefixes, but for a prefix that holds the repository itself (a system Python's
    ``/usr`` and a repository in ``/usr/src/app``)."""
    root = repo.resolve()
    dirs: set[Path] = set()
    bases = {"base": sys.base_prefix, "platbase": sys.base_exec_prefix}
    for scheme_vars in (None, bases):
        paths = sysconfig.get_paths(vars=scheme_vars)
        dirs.update(Path(paths[key]).resolve()
                    for key in ("stdlib", "platstdlib", "purelib", "platlib") if key in paths)
    dirs.update(Path(p).resolve() for p in site.getsitepackages())
    if site.ENABLE_USER_SITE:
        dirs.add(Path(site.getusersitepackages()).resolve())
    for prefix in {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}:
        path = Path(prefix).resolve()
        if not root.is_relative_to(path):
            dirs.add(path)
    return sorted(dirs)


def in_dirs(path: Path, dirs: list[Path]) -> bool:
    """Whether ``path`` (resolved) is one of ``dirs`` or inside one."""
    return any(path.is_relative_to(d) for d in dirs)


def moved_path(entries: list[str], head_root: Path, tree: Path) -> list[str]:
    """``sys.path`` with every entry inside ``head_root`` moved to ``tree``, but for this
    interpreter's environment (:func:`environment_dirs`: a ``.venv`` inside the repository
    stays where it is, as it is not in the tree).

    >>> moved_path(["/r/suites/jax", "/usr/lib/python3", ""], Path("/r"), Path("/t"))[:2]
    ['/t/suites/jax', '/usr/lib/python3']
    """
    keep = environment_dirs(head_root)
    out = []
    for entry in entries:
        path = Path(entry or os.getcwd()).resolve()
        out.append(str(tree / path.relative_to(head_root))
                   if path.is_relative_to(head_root) and not in_dirs(path, keep) else entry)
    return out


def node_location(item: pytest.Item, root: Path) -> tuple[str, str]:
    """The test's file relative to the repository root, and its qualified name
    (``TestClass.test_x`` or ``test_x``)."""
    rel = str(Path(str(item.path)).resolve().relative_to(root))
    names: list[str] = []
    node: Any = item
    while node is not None and not isinstance(node, pytest.Module):
        if isinstance(node, pytest.Class):
            names.append(node.name)
        node = node.parent
    function = getattr(item, "originalname", None) or item.name.split("[", 1)[0]
    return rel, ".".join([*reversed(names), function])


#: The longest path an AF_UNIX socket may have (108 bytes on Linux, with its NUL).
SOCKET_PATH_MAX = 107


def socket_dir(prefix: str, socket: str) -> Path:
    """A new temporary directory for the comparison's files and its socket ``socket``:
    under ``$TMPDIR``, or under ``/tmp`` where ``$TMPDIR`` is too deep for the socket's
    path (``OSError: AF_UNIX path too long``; seen under pytest-xdist's temporary
    directories). The caller removes it."""
    base = tempfile.gettempdir()
    longest = os.path.join(base, prefix + "x" * 8, socket)  # mkdtemp adds 8 characters
    short = len(longest.encode()) <= SOCKET_PATH_MAX or not os.access("/tmp", os.W_OK)
    return Path(tempfile.mkdtemp(prefix=prefix, dir=None if short else "/tmp"))
