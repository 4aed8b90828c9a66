"""The two arms' files for A/B mode (see :mod:`pytest_accelperf.ab`): the commit a ref
names, its files extracted with ``git archive`` (nothing in the repository is checked out
or changed); the working tree's files as git sees them, copied beside them, so that both
arms run from trees of the same layout (:func:`snapshot`); ``sys.path`` moved into them;
and where a test lives relative to the repository root.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest

from pytest_accelperf.ab import CompareError


def _git(repo: Path, *args: str) -> str:
    proc = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                          check=False)
    if proc.returncode:
        raise CompareError(proc.stderr.strip() or f"git {' '.join(args)} failed")
    return proc.stdout.strip()


def resolve(rootdir: Path, ref: str) -> tuple[Path, str]:
    """The repository root containing ``rootdir`` and the commit ``ref`` names."""
    try:
        root = Path(_git(rootdir, "rev-parse", "--show-toplevel"))
    except (CompareError, FileNotFoundError) as exc:
        raise pytest.UsageError(f"--accelperf-compare={ref}: {rootdir} is not in a git "
                                f"repository ({exc})") from None
    try:
        sha = _git(root, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
    except CompareError:
        raise pytest.UsageError(
            f"--accelperf-compare={ref}: git cannot resolve {ref!r} to a commit in {root}; "
            f"pass a branch, tag or commit (in a shallow CI clone fetch it first, e.g. "
            f"git fetch origin main && --accelperf-compare=origin/main)") from None
    return root, sha


def extract(root: Path, sha: str, into: Path) -> Path:
    """The files of commit ``sha`` under ``into`` (``git archive``; the repository is not
    touched)."""
    archive = into / "base.tar"
    with archive.open("wb") as out:
        proc = subprocess.run(["git", "-C", str(root), "archive", "--format=tar", sha],
                              stdout=out, stderr=subprocess.PIPE, check=False)
    if proc.returncode:
        raise CompareError(f"git archive {sha[:12]} failed: {proc.stderr.decode().strip()}")
    tree = into / "base"
    with tarfile.open(archive) as tar:
        tar.extractall(tree, filter="data")
    archive.unlink()
    return tree


def snapshot(root: Path, into: Path) -> Path:
    """The working tree's files under ``into / "head"``: every file git sees (tracked, and
    untracked but not ignored), as they are now, with the base revision's beside it in
    ``into / "base"`` (:func:`extract`).

    The two arms then differ only in their files' contents: the same path layout under
    the same temporary directory, the same ``sys.path`` shape, the same working directory
    kind, and the same rule for what is there (what git does not see is in neither tree;
    the base's ``git archive`` could not have it). An arm run from the repository itself
    would import from a different place than the other, and could see files the other
    cannot.
    """
    listed = _git(root, "ls-files", "-z", "--cached", "--others", "--exclude-standard")
    tree = into / "head"
    tree.mkdir(parents=True, exist_ok=True)
    for rel in filter(None, listed.split("\0")):
        src = root / rel
        if not (src.is_file() or src.is_symlink()):
            continue  # a tracked file deleted in the working tree, a submodule
        dst = tree / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst, follow_symlinks=False)
    return tree


def moved_path(entries: list[str], head_root: Path, tree: Path) -> list[str]:
    """``sys.path`` with every entry inside ``head_root`` moved to ``tree``.

    >>> moved_path(["/r/suites/jax", "/usr/lib/python3", ""], Path("/r"), Path("/t"))[:2]
    ['/t/suites/jax', '/usr/lib/python3']
    """
    out = []
    for entry in entries:
        path = Path(entry or os.getcwd()).resolve()
        out.append(str(tree / path.relative_to(head_root))
                   if path.is_relative_to(head_root) else entry)
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
