"""The baseline store: one human-diffable JSON file per test module per platform.

Layout: ``<store>/<platform>/<module path without .py>.json``, e.g.
``baselines/cpu-x8/suites/jax/test_mesh_sweep.json``::

    {
      "cases": {
        "test_mesh_sweep[jax-mesh4x2-b128]": { ...block from summary.summarize... }
      },
      "platform": "cpu-x8",
      "schema_version": 1
    }

Keys are sorted and indented so a refresh reads as a diff in a pull request. Writes are
atomic (a temporary file in the same directory, then ``os.replace``) under a file lock, so
two sessions never interleave. A file that does not parse, or whose schema is wrong, raises
:class:`BaselineError` naming the file and line; it is never overwritten by an update: the
user fixes or deletes it.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from filelock import FileLock

SCHEMA_VERSION = 1
_REQUIRED_BLOCK_KEYS = ("outcome", "environment")


class BaselineError(Exception):
    """A baseline file that cannot be used. The message names the file, the line and the fix."""


def module_key(nodeid: str) -> str:
    """``suites/jax/test_x.py::test_x[jax-nomesh-b128]`` -> ``suites/jax/test_x``."""
    path = nodeid.split("::", 1)[0]
    return path[:-3] if path.endswith(".py") else path


def case_key(nodeid: str) -> str:
    """The key of a case inside its module file: the nodeid past the module path."""
    return nodeid.split("::", 1)[1] if "::" in nodeid else nodeid


def _line_of(text: str, needle: str) -> int:
    """1-based line of the first occurrence of ``needle`` in ``text`` (1 if absent)."""
    index = text.find(needle)
    return text.count("\n", 0, index) + 1 if index >= 0 else 1


@dataclass
class BaselineFile:
    path: Path
    platform: str
    cases: dict[str, dict[str, Any]] = field(default_factory=dict)

    def to_text(self) -> str:
        data = {"schema_version": SCHEMA_VERSION, "platform": self.platform, "cases": self.cases}
        return json.dumps(data, indent=2, sort_keys=True, allow_nan=False) + "\n"


def parse(path: Path, text: str) -> BaselineFile:
    """Parse and validate the text of a baseline file."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BaselineError(
            f"{path}:{exc.lineno}:{exc.colno}: corrupt baseline file: {exc.msg}. "
            f"It was left untouched: fix it, restore it (git checkout -- {path}), or delete it "
            f"and re-record with --accelperf-update"
        ) from None
    if not isinstance(data, dict):
        raise BaselineError(f"{path}:1: baseline file must hold a JSON object")
    version = data.get("schema_version")
    if version != SCHEMA_VERSION:
        line = _line_of(text, '"schema_version"')
        raise BaselineError(
            f"{path}:{line}: schema_version is {version!r}, this "
            f"pytest-accelperf reads {SCHEMA_VERSION}: re-record with --accelperf-update after "
            f"moving the file away, or upgrade pytest-accelperf"
        )
    cases = data.get("cases")
    if not isinstance(cases, dict):
        line = _line_of(text, '"cases"')
        raise BaselineError(f"{path}:{line}: 'cases' must be an object of case blocks")
    for key, block in cases.items():
        line = _line_of(text, json.dumps(key))
        if not isinstance(block, dict):
            raise BaselineError(f"{path}:{line}: case {key!r} must be an object")
        missing = [k for k in _REQUIRED_BLOCK_KEYS if k not in block]
        if missing:
            raise BaselineError(
                f"{path}:{line}: case {key!r} lacks {', '.join(missing)}; re-record it with "
                f"--accelperf-update"
            )
    return BaselineFile(path=path, platform=str(data.get("platform", "")), cases=cases)


class BaselineStore:
    """Reads are cached per file; writes merge into whatever is on disk at write time."""

    def __init__(self, root: Path, platform: str) -> None:
        self.root = root
        self.platform = platform
        self._cache: dict[Path, BaselineFile | BaselineError] = {}

    def path_for(self, nodeid: str) -> Path:
        return self.root / self.platform / f"{module_key(nodeid)}.json"

    def _load(self, path: Path) -> BaselineFile:
        if path not in self._cache:
            try:
                text = path.read_text(encoding="utf-8")
            except FileNotFoundError:
                self._cache[path] = BaselineFile(path=path, platform=self.platform)
            else:
                try:
                    self._cache[path] = parse(path, text)
                except BaselineError as exc:
                    self._cache[path] = exc
        entry = self._cache[path]
        if isinstance(entry, BaselineError):
            raise entry
        return entry

    def get(self, nodeid: str) -> dict[str, Any] | None:
        """The stored block of a case, None if there is none; BaselineError if unreadable."""
        return self._load(self.path_for(nodeid)).cases.get(case_key(nodeid))

    def write(self, blocks: Mapping[str, dict[str, Any]]) -> list[Path]:
        """Merge ``{nodeid: block}`` into the store, one atomic write per module file.

        Files that are corrupt are not touched; their errors are raised after the others
        were written, so nothing else is lost.
        """
        by_path: dict[Path, dict[str, dict[str, Any]]] = {}
        for nodeid, block in blocks.items():
            by_path.setdefault(self.path_for(nodeid), {})[case_key(nodeid)] = block
        written: list[Path] = []
        errors: list[BaselineError] = []
        for path, new_cases in sorted(by_path.items()):
            try:
                self._write_one(path, new_cases)
                written.append(path)
            except BaselineError as exc:
                errors.append(exc)
        if errors:
            raise BaselineError("\n".join(str(e) for e in errors))
        return written

    def remove(self, nodeids: list[str]) -> list[Path]:
        """Drop the blocks of ``nodeids`` (``accelperf baselines prune``), one atomic write
        per module file; a file left with no case is deleted. The files changed."""
        by_path: dict[Path, set[str]] = {}
        for nodeid in nodeids:
            by_path.setdefault(self.path_for(nodeid), set()).add(case_key(nodeid))
        changed: list[Path] = []
        for path, keys in sorted(by_path.items()):
            with FileLock(_lock_path(path), timeout=60):
                self._cache.pop(path, None)
                current = self._load(path)
                kept = {k: v for k, v in current.cases.items() if k not in keys}
                if len(kept) == len(current.cases):
                    continue
                if kept:
                    atomic_write(path, BaselineFile(path, self.platform, kept).to_text())
                else:
                    path.unlink()
                self._cache.pop(path, None)
                changed.append(path)
        return changed

    def _write_one(self, path: Path, new_cases: dict[str, dict[str, Any]]) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(_lock_path(path), timeout=60):
            self._cache.pop(path, None)
            current = self._load(path)  # re-read under the lock: another session may have written
            merged = BaselineFile(path=path, platform=self.platform,
                                  cases={**current.cases, **new_cases})
            atomic_write(path, merged.to_text())
            self._cache[path] = merged


def _lock_path(path: Path) -> str:
    """A lock beside the temp dir, not the store, so no lock file shows up in git status."""
    digest = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:16]
    return os.path.join(tempfile.gettempdir(), f"accelperf-{digest}.lock")


def atomic_write(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so that readers see the old file or the new one, never half."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
