"""The baseline store: one human-diffable JSON file per test module per platform.

Layout: ``<store>/<platform>/<module path without .py>.json``, e.g.
``baselines/cpu-x8/suites/jax/test_mesh_sweep.json``::

    {
      "cases": {
        "test_mesh_sweep[jax-mesh4x2-b128]": { ...block from summary.summarize... }
      },
      "environments": { ...the environments of the entries of the blocks' machines... },
      "platform": "cpu-x8",
      "schema_version": 3
    }

Version 2 keeps timing per machine (:mod:`pytest_accelperf.store.machines`: a block's
``machine`` and ``machines``); version 3 writes the environment of each entry of
``machines`` once per file, under ``environments``, the entry naming it by its key
(:func:`pytest_accelperf.store.machines.pack`). A version 1 or 2 file is read as it is
(a version 1 file's timing the recording machine's) and written as version 3 by the next
write (or by ``accelperf baselines rewrite``); in memory a block is the same whatever the
version of its file.

Keys are sorted and indented so a refresh reads as a diff in a pull request; arrays of
numbers (step-time samples, loss checkpoints) and objects of numbers (the ops histogram,
bytes per device) take one line each, and the compact parameter fingerprint a line per 5
leaves (:func:`pytest_accelperf.store.jsonfile.dumps`). A block recorded before the compact form
(a per-leaf fingerprint, 6-digit samples) reads, validates and is checked as it was; the
next ``--accelperf-update`` of its case writes the compact form. What the store promises:

* Every write is atomic (a temporary file in the same directory, then ``os.replace``) and
  leaves the file with the permissions the umask gives; the temporary files of a write that
  was killed are deleted by the next write of that file.
* Writers take one lock inside the store (``<store>/.lock``, ignored by the ``.gitignore``
  the store writes beside it), so every process that writes the same store waits for the
  others, whatever its environment.
* Every path it writes resolves inside the store: the platform must be one safe path
  component (:func:`validate_platform`), a node id must name a module under the rootdir.
* Every block is validated by the schema (:mod:`pytest_accelperf.store.schema`), when it is read
  and before it is written. A file that does not parse (bad JSON, a repeated key, another
  schema version) raises :class:`BaselineError` naming the file and line, and is never
  overwritten: the user fixes or deletes it. A block that does not validate in a file that
  parses raises :class:`InvalidBlockError` naming the file, line, case and field; an update
  replaces that block and keeps everything else in the file as it was.
"""

from __future__ import annotations

import contextlib
import copy
import json
import re
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from pytest_accelperf.errors import UserError
from pytest_accelperf.records.jsonvalue import JSONValue
from pytest_accelperf.store import jsonfile
from pytest_accelperf.store.jsonfile import atomic_write
from pytest_accelperf.store.machines import (
    ENVIRONMENTS_KEY,
    MachineError,
    MachineView,
    merge,
    pack,
    recorder,
    unpack,
    validate_machine,
    view,
)

if TYPE_CHECKING:
    from pytest_accelperf.store.block import Block
    from pytest_accelperf.store.fields import Fields

# The schema (pydantic models of every block section, of reports; the checks' table for
# the sections they add), the numerics check and filelock are imported where they are
# used: `accelperf baselines show` reads blocks through Fields and needs none of them.

__all__ = [
    "LOCK_NAME",
    "READABLE_VERSIONS",
    "SCHEMA_VERSION",
    "BaselineError",
    "BaselineFile",
    "BaselineStore",
    "InvalidBlockError",
    "atomic_write",
    "case_key",
    "check_block",
    "module_key",
    "parse",
    "read",
    "validate_platform",
]

#: The version this one writes.
SCHEMA_VERSION = 3
#: The versions this one reads: 1, before timing was kept per machine (a block of one
#: machine, the one its environment names); 2, each entry of ``machines`` with its
#: environment; and 3, the entries' environments once per file (``environments``).
READABLE_VERSIONS = (1, 2, 3)
#: The keys of a baseline file this version reads; any other is kept as it is.
_HEADER_KEYS = ("schema_version", "platform", "cases", ENVIRONMENTS_KEY)
#: The store's write lock, in its root.
LOCK_NAME = ".lock"
#: Seconds a writer waits for the lock before giving up with an error.
LOCK_TIMEOUT = 120.0
_GITIGNORE = """\
# Written by pytest-accelperf: the baseline store's write lock and the temporary files of
# an interrupted write are not baselines. (This file ignores itself; commit it or not.)
.lock
.*.tmp
.gitignore
"""


class BaselineError(UserError):
    """A baseline that cannot be used. The message names the file, the line and the fix.

    ``replaceable`` is True when only a block is invalid and the file around it parsed:
    ``--accelperf-update`` may store a new block over it. ``written`` lists the files a
    :meth:`BaselineStore.write` wrote before raising (for the other cases).
    """

    replaceable = False

    def __init__(self, message: str, written: list[Path] | None = None) -> None:
        super().__init__(message)
        self.written = written or []


class InvalidBlockError(BaselineError):
    """A case's block does not validate; the file around it parsed."""

    replaceable = True


_PLATFORM_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,99}")


def validate_platform(name: str) -> str:
    """``name`` if it can be a platform key: one safe path component (letters, digits,
    ``.``, ``_``, ``+``, ``-``; not starting with a dot; no ``..``), else BaselineError.

    The platform is a directory of the store, so ``../x`` or ``/x`` would write outside it.
    """
    if not _PLATFORM_RE.fullmatch(name) or ".." in name:
        raise BaselineError(
            f"invalid platform {name!r}: a platform key is one path component of letters, "
            f"digits, '.', '_', '+' and '-' (e.g. cpu-x8, gpu-h100-80gb-x8), not starting with "
            f"a dot and without '..'; pass such a name to --accelperf-platform")
    return name


def module_key(nodeid: str) -> str:
    """``suites/jax/test_x.py::test_x[jax-nomesh-b128]`` -> ``suites/jax/test_x``."""
    path = nodeid.split("::", 1)[0]
    return path[:-3] if path.endswith(".py") else path


def case_key(nodeid: str) -> str:
    """The key of a case inside its module file: the nodeid past the module path."""
    return nodeid.split("::", 1)[1] if "::" in nodeid else nodeid


def _check_module(nodeid: str) -> str:
    """The module key of ``nodeid`` if it is a relative path under the rootdir."""
    module = module_key(nodeid)
    if not module:
        raise BaselineError(
            f"{nodeid}: not stored: the test module is outside the pytest rootdir (pytest "
            f"names its tests '::name', without a module path), and its baseline would go to "
            f"a file shared by every such module. Move the module under the rootdir, or run "
            f"pytest with --rootdir set to a directory that contains it")
    parts = module.split("/")
    if module.startswith("/") or any(p in ("", ".", "..") for p in parts) \
            or "\\" in module or "\0" in module:
        raise BaselineError(
            f"{nodeid}: not stored: the module path {module!r} is not a relative path under "
            f"the rootdir (it is absolute, or has '..', '.' or an empty component), so its "
            f"baseline would be written outside the store. Run the tests with a rootdir that "
            f"contains their modules; a report edited by hand cannot be accepted")
    return module


# -- one baseline file -------------------------------------------------------------------------
_UNTOUCHED = "It was left untouched"


@dataclass
class InvalidBlock:
    """A block that did not validate: kept as it was, with the error that names it."""

    raw: Any
    message: str


@dataclass
class BaselineFile:
    path: Path
    platform: str
    cases: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: Blocks that did not validate, kept as they were until replaced.
    invalid: dict[str, InvalidBlock] = field(default_factory=dict)
    #: Top-level keys this version does not know (a newer one wrote them): kept.
    extra: dict[str, JSONValue] = field(default_factory=dict)
    #: The :class:`~pytest_accelperf.store.fields.Fields` its blocks were read for (each
    #: block only those fields, validated), or None: whole blocks, validated whole. A file
    #: read for some fields is never written back (:meth:`to_text`).
    fields: Fields | None = None

    def to_text(self) -> str:
        if self.fields is not None:
            raise ValueError(f"{self.path}: read for the fields {self.fields.paths}, not "
                             f"whole: it cannot be written back")
        cases: dict[str, Any] = {k: v.raw for k, v in self.invalid.items()}
        # The entries of machines name their environment in the file's table (schema 3).
        packed, environments = pack(self.cases)
        cases.update(packed)
        data = {**self.extra, "schema_version": SCHEMA_VERSION, "platform": self.platform,
                "cases": cases}
        if environments:
            data[ENVIRONMENTS_KEY] = environments
        # Valid blocks hold finite numbers only (the schema); an invalid block is written
        # back exactly as it was read, NaN included. Sorted keys, an indent of 2, plain
        # arrays and objects of numbers on one line, a compact fingerprint 5 leaves a line
        # (jsonfile.dumps).
        return jsonfile.dumps(data) + "\n"


def _field_errors(exc: ValidationError, text: str, path: list[str | int],
                  start: int | None = None) -> tuple[int, str]:
    """``(position of the first error's field, "field: what is wrong; ...")``; ``path``
    leads to the validated value (from ``start``, its position, when given)."""
    from pytest_accelperf.store.schema import error_lines

    lines = error_lines(exc)
    first = lines[0][0] if lines else ()
    pos = jsonfile.position(text, [*path, *first], start=start)
    return pos, _shown(lines)


def _missing_environment(text: str, key: str, start: int | None, machine: str,
                         name: str) -> tuple[int, str]:
    """``(position, what is wrong)`` of an entry of ``machines`` naming an environment the
    file's ``environments`` lacks."""
    path: list[str | int] = ["machines", machine, "environment"]
    pos = jsonfile.position(text, path if start is not None else ["cases", key, *path],
                            start=start)
    return pos, (f"machines.{machine}.environment: {name!r} is not a key of the file's "
                 f"environments (a schema 3 file names each entry's environment there)")


def _shown(lines: list[tuple[tuple[str | int, ...], str]]) -> str:
    return "; ".join(f"{jsonfile.field_path(loc) or 'the block'}: {msg}" if loc else msg
                     for loc, msg in lines)


def parse(path: Path, text: str, fields: Fields | None = None) -> BaselineFile:
    """Parse and validate the text of a baseline file: whole blocks, or with ``fields``,
    only those fields of each block (:class:`~pytest_accelperf.store.fields.Fields`;
    the file itself, its JSON, its header and its keys, is checked as for whole blocks).

    A file that does not parse raises :class:`BaselineError`; blocks that do not validate
    are kept in :attr:`BaselineFile.invalid` with their error (raised when the case is read).

    Linear in the size of the file: one JSON parse, one schema validation of every block
    (:func:`pytest_accelperf.store.schema.invalid_blocks`); a line number is only computed for
    an error, by one more pass over the text.
    """
    with jsonfile.gc_paused():
        return _parse(path, text, fields)


def _parse(path: Path, text: str, fields: Fields | None = None) -> BaselineFile:
    from pytest_accelperf.store.schema import BaselineHeader, invalid_blocks

    try:
        data = jsonfile.loads(text)
    except jsonfile.JsonFileError as exc:
        raise BaselineError(
            f"{path}:{exc.line}:{exc.column}: corrupt baseline file: {exc.msg}. "
            f"{_UNTOUCHED}: fix it, restore it (git checkout -- {path}), or delete it "
            f"and re-record with --accelperf-update"
        ) from None
    if not isinstance(data, dict):
        raise BaselineError(f"{path}:1: baseline file must hold a JSON object; {_UNTOUCHED}: "
                            f"restore it (git checkout -- {path}) or delete it and re-record "
                            f"with --accelperf-update")
    version = data.get("schema_version")
    if version not in READABLE_VERSIONS or type(version) is not int:
        line = jsonfile.locate(text, ["schema_version"])
        readable = (", ".join(map(str, READABLE_VERSIONS[:-1]))
                    + f" and {READABLE_VERSIONS[-1]}")
        raise BaselineError(
            f"{path}:{line}: schema_version is {version!r}, this "
            f"pytest-accelperf reads {readable}: re-record with --accelperf-update after "
            f"moving the file away, or upgrade pytest-accelperf"
        )
    try:
        header = BaselineHeader.model_validate(data)
    except ValidationError as exc:
        pos, shown = _field_errors(exc, text, [])
        line = jsonfile.line_column(text, pos)[0]
        raise BaselineError(f"{path}:{line}: not a baseline file: {shown}. {_UNTOUCHED}: "
                            f"restore it (git checkout -- {path}) or fix it") from None
    raw_cases: dict[str, Any] = data["cases"]
    filed = version >= 3  # the entries of machines name their environment (machines.pack)
    if fields is not None:
        bad = fields.invalid(raw_cases)
    else:
        bad = invalid_blocks(raw_cases, filed=filed)
    # An invalid block is kept as it was read (its entries naming their environments).
    raw = {k: copy.deepcopy(raw_cases[k]) for k in bad} if bad and filed else raw_cases
    missing = unpack(raw_cases, data.get(ENVIRONMENTS_KEY) or {}) if filed else {}
    cases: dict[str, dict[str, Any]] = (
        {k: v for k, v in raw_cases.items() if k not in bad and k not in missing}
        if bad or missing else raw_cases)
    invalid: dict[str, InvalidBlock] = {}
    if bad or missing:  # lines are only computed for errors, in one pass over the file
        starts = jsonfile.members(text, ["cases"])
        located = [(key, *_field_errors(exc, text, [] if key in starts else ["cases", key],
                                        starts.get(key)))
                   for key, exc in bad.items()]
        located += [(key, *_missing_environment(text, key, starts.get(key), *where))
                    for key, where in missing.items() if key not in bad]
        lines = jsonfile.lines_of(text, (pos for _, pos, _ in located))
        for key, pos, shown in located:
            invalid[key] = InvalidBlock(raw[key], (
                f"{path}:{lines[pos]}: case {key!r}: invalid baseline block: {shown}. Fix the "
                f"block, or re-record the case with --accelperf-update (which replaces an "
                f"invalid block and keeps the file's other cases)"))
    extra = {k: v for k, v in data.items() if k not in _HEADER_KEYS}
    return BaselineFile(path=path, platform=header.platform, cases=cases, invalid=invalid,
                        extra=extra, fields=fields)


def read(path: Path, platform: str = "", fields: Fields | None = None) -> BaselineFile:
    """The baseline file at ``path`` (an empty one if there is none). A file that cannot be
    read or does not parse is a :class:`BaselineError` naming it.

    With ``fields``, each block holds only those fields, validated
    (:class:`~pytest_accelperf.store.fields.Fields`): the file is read by one pydantic call
    over its bytes when it is clean (:meth:`~pytest_accelperf.store.fields.Fields.read`),
    else as :func:`parse` reads it, which names what is wrong."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return BaselineFile(path=path, platform=platform)
    except IsADirectoryError:
        raise BaselineError(f"{path}: a directory where the baseline file should be; move "
                            f"it away (the store writes this file for a test module)") from None
    except OSError as exc:
        raise BaselineError(f"{path}: cannot read the baseline file: {exc.strerror or exc}; "
                            f"{_UNTOUCHED}") from None
    if fields is not None:
        found = fields.read(data)
        if found is not None:
            return BaselineFile(path=path, platform=platform, cases=found, fields=fields)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise BaselineError(
            f"{path}:{line}: corrupt baseline file: not UTF-8 (byte 0x{data[exc.start]:02x} "
            f"at offset {exc.start}). {_UNTOUCHED}: restore it (git checkout -- {path}), or "
            f"delete it and re-record with --accelperf-update") from None
    return parse(path, text, fields)


def check_block(nodeid: str, block: Mapping[str, Any]) -> dict[str, JSONValue]:
    """``block`` as the store writes it (its JSON form), validated by the schema exactly as
    a block read back; a :class:`BaselineError` naming the case and the field if it is not
    a baseline. Used by every write (``--accelperf-update`` and ``accelperf baselines
    accept``).

    A run's per-leaf parameter fingerprint (with a sketch per leaf) is stored in its
    compact form (:func:`pytest_accelperf.records.fingerprint.compact`: one number per leaf, a
    structure hash and tags); a block recorded before keeps the form it has."""
    from pytest_accelperf.records.fingerprint import compact, compactable
    from pytest_accelperf.store.schema import error_lines, validate_block

    if isinstance(block, Mapping) and compactable(block.get("numerics")):
        block = {**block, "numerics": compact(block["numerics"])}
    try:
        text = json.dumps(block, sort_keys=True)
    except (TypeError, ValueError) as exc:
        raise BaselineError(f"{nodeid}: not stored: the block is not JSON ({exc})") from None
    clean: dict[str, JSONValue] = json.loads(text)
    try:
        validate_block(clean)
    except ValidationError as exc:
        raise BaselineError(f"{nodeid}: not stored as a baseline: invalid block: "
                            f"{_shown(error_lines(exc))}. A baseline records a finished run "
                            f"(outcome ok or oom) with finite numbers: fix the run and "
                            f"record it again") from None
    return clean


# -- the store ---------------------------------------------------------------------------------
class BaselineStore:
    """Reads are cached per file; writes merge into whatever is on disk at write time."""

    def __init__(self, root: Path, platform: str) -> None:
        self.root = root
        self.platform = validate_platform(platform)
        self._cache: dict[Path, BaselineFile | BaselineError] = {}
        #: ``{module key: its file}`` of the modules read so far (:meth:`get`).
        self._paths: dict[str, Path] = {}

    def path_for(self, nodeid: str) -> Path:
        """The file of ``nodeid``'s module; a :class:`BaselineError` if it would not be
        inside the store."""
        module = _check_module(nodeid)
        path = self.root / self.platform / f"{module}.json"
        root = self.root.resolve()
        resolved = path.resolve()
        if resolved == root or not resolved.is_relative_to(root):
            raise BaselineError(
                f"{nodeid}: not stored: {path} resolves to {resolved}, outside the baseline "
                f"store {root} (a symbolic link in the store points out of it); replace the "
                f"link with a directory")
        return path

    def _load(self, path: Path) -> BaselineFile:
        if path not in self._cache:
            try:
                self._cache[path] = read(path, self.platform)
            except BaselineError as exc:
                self._cache[path] = exc
        entry = self._cache[path]
        if isinstance(entry, BaselineError):
            raise entry
        return entry

    def get(self, nodeid: str) -> Block | None:
        """The stored block of a case, typed (:func:`~pytest_accelperf.store.block.read_block`
        of a block the store validated; its ``to_json()`` is the block as stored), None if
        there is none; :class:`BaselineError` if its file is unreadable,
        :class:`InvalidBlockError` if its block is invalid."""
        module = module_key(nodeid)
        path = self._paths.get(module)
        if path is None:  # resolving costs system calls: once per module read
            path = self._paths[module] = self.path_for(nodeid)
        loaded = self._load(path)
        key = case_key(nodeid)
        if key in loaded.invalid:
            raise InvalidBlockError(loaded.invalid[key].message)
        found = loaded.cases.get(key)
        if found is None:
            return None
        from pytest_accelperf.store.block import read_block
        from pytest_accelperf.store.schema import block_model

        return read_block(found, block_model())

    def get_view(self, nodeid: str, machine: str) -> MachineView | None:
        """The stored block of a case as ``machine`` reads it
        (:func:`pytest_accelperf.store.machines.view`: the shared sections and this
        machine's timing, as JSON the store validated), None if there is none; the errors
        of :meth:`get`."""
        module = module_key(nodeid)
        path = self._paths.get(module)
        if path is None:
            path = self._paths[module] = self.path_for(nodeid)
        loaded = self._load(path)
        key = case_key(nodeid)
        if key in loaded.invalid:
            raise InvalidBlockError(loaded.invalid[key].message)
        found = loaded.cases.get(key)
        return None if found is None else view(found, machine)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """The store's write lock (``<store>/.lock``), with the ``.gitignore`` that keeps it
        out of ``git status``."""
        from filelock import FileLock, Timeout

        try:
            self.root.mkdir(parents=True, exist_ok=True)
            ignore = self.root / ".gitignore"
            if not ignore.exists():
                atomic_write(ignore, _GITIGNORE)
        except OSError as exc:
            raise BaselineError(f"cannot create the baseline store {self.root}: {exc}") \
                from None
        lock = FileLock(str(self.root / LOCK_NAME), timeout=LOCK_TIMEOUT)
        try:
            lock.acquire()
        except Timeout:
            raise BaselineError(
                f"{self.root / LOCK_NAME}: another session or accelperf command has been "
                f"writing this baseline store for {LOCK_TIMEOUT:.0f} s; nothing was written. "
                f"Retry when it is done") from None
        try:
            yield
        finally:
            lock.release()

    def write(self, blocks: Mapping[str, Mapping[str, Any]], *, machine: str | None = None,
              timing_only: Collection[str] = ()) -> list[Path]:
        """Merge ``{nodeid: block}`` into the store, one atomic write per module file.

        Every block is validated first (:func:`check_block`). Invalid blocks, node ids
        outside the store and files that do not parse are not written; their errors are
        raised after the others were written, so nothing else is lost.

        Each block is ``machine``'s (default: the machine its environment names), merged
        into the stored block by :func:`pytest_accelperf.store.machines.merge`: every other
        machine's timing is kept; for the node ids of ``timing_only`` (their shared
        sections judged unchanged), a block another machine recorded gets this machine's
        timing and nothing else.
        """
        by_path: dict[Path, dict[str, tuple[dict[str, JSONValue], str, bool]]] = {}
        errors: list[BaselineError] = []
        for nodeid, block in blocks.items():
            try:
                path = self.path_for(nodeid)
                clean = check_block(nodeid, block)
                name = validate_machine(machine) if machine else recorder(clean)
                by_path.setdefault(path, {})[case_key(nodeid)] = (
                    clean, name, nodeid in timing_only)
            except BaselineError as exc:
                errors.append(exc)
            except MachineError as exc:
                errors.append(BaselineError(str(exc)))
        written: list[Path] = []
        if by_path:
            with self._locked():
                for path, new_cases in sorted(by_path.items()):
                    try:
                        self._write_one(path, new_cases)
                        written.append(path)
                    except BaselineError as exc:
                        errors.append(exc)
        if errors:
            raise BaselineError("\n".join(str(e) for e in errors), written=written)
        return written

    def remove(self, nodeids: list[str]) -> list[Path]:
        """Drop the blocks of ``nodeids`` (``accelperf baselines prune``), one atomic write
        per module file; a file left with no case is deleted. The files changed."""
        by_path: dict[Path, set[str]] = {}
        for nodeid in nodeids:
            by_path.setdefault(self.path_for(nodeid), set()).add(case_key(nodeid))
        changed: list[Path] = []
        if not by_path:
            return changed
        with self._locked():
            for path, keys in sorted(by_path.items()):
                jsonfile.remove_leftovers(path)
                self._cache.pop(path, None)
                current = self._load(path)
                kept = {k: v for k, v in current.cases.items() if k not in keys}
                invalid = {k: v for k, v in current.invalid.items() if k not in keys}
                if len(kept) + len(invalid) == len(current.cases) + len(current.invalid):
                    continue
                if kept or invalid:
                    updated = BaselineFile(path, self.platform, kept, invalid, current.extra)
                    atomic_write(path, updated.to_text())
                else:
                    path.unlink()
                self._cache.pop(path, None)
                changed.append(path)
        return changed

    def rewrite(self, paths: list[Path], *, dry_run: bool = False) -> list[Path]:
        """Write each of ``paths`` (files of this store) in this version's format, its
        blocks unchanged (``accelperf baselines rewrite``): a file of an earlier schema
        (:data:`READABLE_VERSIONS`), or one not laid out as the store writes it; an invalid
        block is kept as it was read. The files rewritten (with ``dry_run``, that would
        be); a file that does not parse is left untouched, its error raised after the
        others were written."""
        changed: list[Path] = []
        errors: list[str] = []
        with self._locked():
            for path in paths:
                if not dry_run:
                    jsonfile.remove_leftovers(path)
                self._cache.pop(path, None)
                try:
                    current = self._load(path)
                    text = path.read_text(encoding="utf-8")
                except BaselineError as exc:
                    errors.append(str(exc))
                    continue
                except OSError as exc:
                    errors.append(f"{path}: cannot read the baseline file: {exc}")
                    continue
                new = current.to_text()
                if new == text:
                    continue
                if not dry_run:
                    try:
                        atomic_write(path, new)
                    except OSError as exc:
                        errors.append(f"{path}: cannot write the baseline file: {exc}")
                        continue
                changed.append(path)
        if errors:
            raise BaselineError("\n".join(errors), written=[] if dry_run else changed)
        return changed

    def _write_one(self, path: Path,
                   new_cases: dict[str, tuple[dict[str, JSONValue], str, bool]]) -> None:
        """Under the lock: merge into what is on disk now (another session may have
        written), after deleting what an interrupted write of this file left."""
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise BaselineError(f"{path}: cannot create its directory: {exc}") from None
        jsonfile.remove_leftovers(path)
        self._cache.pop(path, None)
        current = self._load(path)  # a file that does not parse raises: never overwritten
        invalid = {k: v for k, v in current.invalid.items() if k not in new_cases}
        cases = dict(current.cases)
        for key, (block, machine, timing_only) in new_cases.items():
            found = merge(cases.get(key), block, machine, timing_only=timing_only)
            if found is not None:
                cases[key] = found
        merged = BaselineFile(path=path, platform=self.platform, cases=cases, invalid=invalid,
                              extra=current.extra)
        try:
            atomic_write(path, merged.to_text())
        except OSError as exc:
            raise BaselineError(f"{path}: cannot write the baseline file: {exc}") from None
        self._cache[path] = merged
