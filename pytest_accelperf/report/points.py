"""The points of a run history: of each line of ``--accelperf-history`` (one case, one
session), the numbers change points are found in (:mod:`pytest_accelperf.report.changes`),
validated by the schema; and a cache of them beside each file, so that a history, which is
only ever appended to, is validated once.

Every line is validated as :class:`~pytest_accelperf.store.schema.HistoryNumbers` (a
:class:`~pytest_accelperf.report.history.HistoryError` names the file, line and field of
the first that is not a history entry). Validating 100,000 lines of 1.8 KB (1,000 cases x
100 sessions) takes 1.2 s on a 2-core machine; reading their points back from the cache
0.15 s (``benchmarks/changes.py scale``).

The cache of ``DIR/<platform>.jsonl`` is ``DIR/.accelperf-cache/<platform>.jsonl.points.json``
(JSON, validated as :class:`PointsCache` when read). It holds the points of the file's
lines up to its last newline, the size and CRC-32 of those bytes, and what ``stat`` said of
the file before they were read. It is used:

- where the file's size, inode, device, modification and change times are as recorded: the
  file is as it was read (any write changes the change time, which no one can set), and
  only the bytes after the cached ones are read;
- else where the file's first bytes still have the recorded size and CRC-32 (the file was
  appended to; the bytes are mapped, not read, and checked in 0.04 s for 177 MB): the
  lines after them are read and validated. The cache is rewritten to hold them where they
  are more than :data:`REWRITE_SHARE` of the lines it holds: a session appended to a long
  history is validated again by the next read (1,000 lines, 15 ms), rather than the whole
  cache rewritten for it (0.15 s for 100,000 lines).

Anything else (a file truncated, edited or replaced, a cache written by another version of
this code, or one that is not valid) is ignored: the whole file is validated again and the
cache rewritten. A cache that cannot be written (a read-only directory) is left unwritten;
deleting it is always safe.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import itertools
import json
import mmap
import operator
import os
import zlib
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, NamedTuple, cast

import pydantic_core
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from pytest_accelperf.provision.describe import case_stack
from pytest_accelperf.report.history import history_files, invalid_line, read_bytes
from pytest_accelperf.store.jsonfile import atomic_write, gc_paused
from pytest_accelperf.store.schema import HistoryNumbers, ProgramRecord

#: The directory of the caches, in the history directory.
CACHE_DIR = ".accelperf-cache"
#: The version of the cache's layout; with the schema of the points, it decides whether a
#: cache was written by this code.
CACHE_VERSION = 2
#: The fields of :class:`Point` the cache keeps in one column (``environment``).
_ENVIRONMENT = ("fingerprint", "machine", "stack", "versions")
#: The cache is rewritten where the lines after it are more than this share of those it
#: holds (or where it holds none).
REWRITE_SHARE = 0.1


class Point(NamedTuple):
    """What change points are found in of one history line (one case, one session): a
    tuple, whose fields a case's series reads as columns in one pass."""

    time: str
    session: str
    platform: str
    nodeid: str
    commit: str | None
    dirty: bool | None
    fingerprint: str | None
    throughput: float | None
    step_time: float | None
    memory: float | None
    loss: float | None
    #: The program record, as a dict (compared whole, in C, from session to session; its
    #: fields read only where two sessions' records differ); None: not recorded.
    program: ProgramRecord | None
    #: Hashes of the machine and of the case's stack; None in lines written before they
    #: were (their ``fingerprint`` splits the series, as it did).
    machine: str | None = None
    stack: str | None = None
    #: The case's stack (:func:`pytest_accelperf.provision.describe.case_stack`: python,
    #: packages,
    #: libraries) that ``stack`` is the hash of, read from the line's environment once per
    #: hash, one object for the lines of a hash; None without a ``stack``.
    versions: Mapping[str, object] | None = None


def point(e: HistoryNumbers, versions: Mapping[str, object] | None = None) -> Point:
    return Point(e.time, e.session, e.platform or "", e.nodeid, e.commit, e.dirty,
                 e.fingerprint, e.samples_per_second, e.median_step_time, e.peak_memory,
                 e.final_loss, e.program, e.machine, e.stack, versions)


def line_stack(entry: Mapping[str, object]) -> dict[str, object]:
    """The case's stack of a history line (a dict), from its environment and its case's
    backend (:func:`pytest_accelperf.provision.describe.case_stack`); empty without either."""
    env, case = entry.get("environment"), entry.get("case")
    backend = case.get("backend") if isinstance(case, dict) else None
    if not isinstance(env, dict):
        return {}
    return case_stack(env, backend if isinstance(backend, str) else None)


def points_of(entries: Iterable[Mapping[str, object]]) -> list[Point]:
    """The points of entries :func:`~pytest_accelperf.report.history.read_history` read
    (validated as history lines already)."""
    out: list[Point] = []
    stacks: dict[str, dict[str, object]] = {}
    for item in entries:
        e = HistoryNumbers.model_validate(item)
        versions = None
        if e.stack is not None:
            versions = stacks.get(e.stack)
            if versions is None:
                versions = stacks[e.stack] = line_stack(item)
        out.append(point(e, versions))
    return out


def load_points(directory: Path, platform: str | None = None, *, cache: bool = True
                ) -> list[Point]:
    """The points of every line of the history under ``directory`` (of one platform, if
    given), oldest first (by time, then session; lines of one session in file order).
    ``cache``: read and write the cache of each file (see the module)."""
    out: list[Point] = []
    with gc_paused():  # a history has no cycles to collect (see gc_paused)
        for path in history_files(directory, platform):
            out.extend(file_points(path, cache=cache))
        out.sort(key=lambda p: (p.time, p.session))  # stable: equal keys keep file order
    return out


def parse_points(path: Path, data: bytes, first: int = 1) -> list[Point]:
    """The points of the non-blank lines of ``data``, the bytes of ``path`` from the start
    of its line ``first``; each line validated."""
    validate = HistoryNumbers.model_validate_json
    out: list[Point] = []
    append = out.append
    last: dict[str, ProgramRecord] = {}  # each case's last program record
    stacks: dict[str, dict[str, object]] = {}  # the versions of each stack hash
    for n, raw in enumerate(data.splitlines(), start=first):
        if not raw or raw.isspace():
            continue
        try:
            e = validate(raw)
        except ValidationError as exc:
            raise invalid_line(path, n, raw, exc) from None
        program = e.program
        if program is not None:  # one object for a case's equal records, as in the cache
            if last.get(e.nodeid) == program:
                program = last[e.nodeid]
            else:
                last[e.nodeid] = program
        versions = None
        if (h := e.stack) is not None:  # read from the environment once per stack
            versions = stacks.get(h)
            if versions is None:
                versions = stacks[h] = _line_stack(raw)
        append(Point(e.time, e.session, e.platform or "", e.nodeid, e.commit, e.dirty,
                     e.fingerprint, e.samples_per_second, e.median_step_time, e.peak_memory,
                     e.final_loss, program, e.machine, h, versions))
    return out


def _line_stack(raw: bytes) -> dict[str, object]:
    """:func:`line_stack` of a line's bytes (a valid history line: they parse)."""
    item = json.loads(raw)
    return line_stack(item) if isinstance(item, dict) else {}


# -- the cache ---------------------------------------------------------------------------------
Index = Annotated[int, Field(ge=0)]
#: What ``stat`` says of a file: size, inode, device, modification and change time (ns).
Stat = tuple[int, int, int, int, int]


class PointsCache(BaseModel):
    """The cache of one history file's points: the points of its first ``covered`` bytes
    (``lines`` lines, ending in a newline), as columns (strings, program records and
    environments stored once each, referred to by index)."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    version: str  #: :func:`cache_version`
    stat: Stat  #: the file's, before it was read
    covered: Index
    lines: Index
    crc32: int  #: ``zlib.crc32`` of the covered bytes
    strings: list[str]
    programs: list[ProgramRecord]
    time: list[Index]
    session: list[Index]
    platform: list[Index]
    nodeid: list[Index]
    commit: list[Index | None]
    dirty: list[bool | None]
    #: Each line's environment: an index into ``environments``.
    environment: list[Index]
    throughput: list[float | None]
    step_time: list[float | None]
    memory: list[float | None]
    loss: list[float | None]
    program: list[Index | None]
    #: ``(fingerprint, machine, stack)`` of each environment the lines ran in (one column
    #: for the three: they change together, rarely).
    environments: list[tuple[str | None, str | None, str | None]]
    #: ``{stack hash: versions}`` of the stacks of ``environments``.
    stacks: dict[str, dict[str, Any]]

    @model_validator(mode="after")
    def _consistent(self) -> PointsCache:
        rows = len(self.time)
        columns = [getattr(self, name) for name in Point._fields if name not in _ENVIRONMENT]
        columns.append(self.environment)
        if any(len(c) != rows for c in columns):
            raise ValueError("columns of different lengths")
        for column, table in ((self.time, self.strings), (self.session, self.strings),
                              (self.platform, self.strings), (self.nodeid, self.strings),
                              (self.commit, self.strings), (self.program, self.programs),
                              (self.environment, self.environments)):
            if max([i for i in column if i is not None], default=-1) >= len(table):
                raise ValueError("an index past its table")
        return self

    def points(self) -> list[Point]:
        # each column looked up in C (map over a dict's __getitem__), None kept as None
        strings: dict[int | None, str | None] = dict(enumerate(self.strings))
        strings[None] = None
        programs: dict[int | None, ProgramRecord | None] = dict(enumerate(self.programs))
        programs[None] = None
        environments = [(*e, None if e[2] is None else self.stacks.get(e[2]))
                        for e in self.environments]
        # (fingerprint, machine, stack, versions) of each line, as four columns
        envs: Iterable[Iterable[Any]]
        if len(environments) == 1:  # one environment throughout: no column to build
            envs = (itertools.repeat(v, len(self.environment)) for v in environments[0])
        else:
            envs = (zip(*map(environments.__getitem__, self.environment), strict=True)
                    if self.environment else iter(((),) * 4))

        def text(column: list[int]) -> list[str]:
            return cast(list[str], list(map(strings.__getitem__, column)))

        def maybe(column: list[int | None]) -> list[str | None]:
            return list(map(strings.__getitem__, column))

        fingerprint, machine, stack, versions = envs
        rows = zip(text(self.time), text(self.session), text(self.platform),
                   text(self.nodeid), maybe(self.commit), self.dirty, fingerprint,
                   self.throughput, self.step_time, self.memory, self.loss,
                   map(programs.__getitem__, self.program), machine, stack, versions,
                   strict=True)
        return list(map(Point._make, rows))


@functools.cache
def cache_version() -> str:
    """:data:`CACHE_VERSION` and a hash of the schema of the points: a cache written where
    either differed is not read."""
    schema = json.dumps([CACHE_VERSION, Point._fields, HistoryNumbers.model_json_schema(),
                         PointsCache.model_json_schema()], sort_keys=True)
    return f"{CACHE_VERSION}-{hashlib.sha256(schema.encode()).hexdigest()[:16]}"


def cache_path(path: Path) -> Path:
    """Where the cache of the history file ``path`` is."""
    return path.parent / CACHE_DIR / f"{path.name}.points.json"


def _stat(path: Path) -> Stat | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_size, st.st_ino, st.st_dev, st.st_mtime_ns, st.st_ctime_ns)


def _read_cache(path: Path) -> PointsCache | None:
    """The cache of ``path`` where there is one, written by this code, and valid."""
    try:
        text = cache_path(path).read_bytes()
    except OSError:
        return None
    try:
        cache = PointsCache.model_validate_json(text)
    except ValidationError:
        return None
    return cache if cache.version == cache_version() else None


def _prefix_crc(path: Path, covered: int) -> int | None:
    """``zlib.crc32`` of the first ``covered`` bytes of ``path`` (mapped, not read), or None
    where it has fewer (truncated) or cannot be mapped."""
    try:
        with path.open("rb") as f, contextlib.ExitStack() as stack:
            size = os.fstat(f.fileno()).st_size
            if size < covered:
                return None
            if not covered:
                return zlib.crc32(b"")
            mapped = stack.enter_context(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))
            with memoryview(mapped) as view, view[:covered] as prefix:
                return zlib.crc32(prefix)
    except (OSError, ValueError):
        return None


def file_points(path: Path, *, cache: bool = True) -> list[Point]:
    """The points of every line of the history file ``path``, in file order: those the
    cache holds of its first bytes, where they are as cached (see the module), and the
    lines after them validated (the cache then rewritten to hold them too, where they are
    many)."""
    stat = _stat(path)
    kept = _read_cache(path) if cache and stat is not None else None
    if kept is not None and kept.stat == stat:
        rest = read_bytes(path, start=kept.covered)
        return kept.points() + parse_points(path, rest, kept.lines + 1)
    if kept is not None and _prefix_crc(path, kept.covered) != kept.crc32:
        kept = None  # not only appended to: read again in full
    start = kept.covered if kept is not None else 0
    lines = kept.lines if kept is not None else 0
    data = read_bytes(path, start=start)
    end = data.rfind(b"\n") + 1  # the complete lines: a line being appended is not cached
    new = parse_points(path, data[:end] if end != len(data) else data, lines + 1)
    points = kept.points() + new if kept is not None else new
    added = data.count(b"\n", 0, end)
    if (cache and stat is not None and end
            and (kept is None or added > REWRITE_SHARE * max(lines, 1))):
        crc = zlib.crc32(memoryview(data)[:end], kept.crc32 if kept is not None else 0)
        _write_cache(path, points, stat=stat, covered=start + end, lines=lines + added,
                     crc32=crc)
    if end < len(data):  # a last line without its newline
        points += parse_points(path, data[end:], lines + added + 1)
    return points


def _write_cache(path: Path, points: Sequence[Point], *, stat: Stat, covered: int,
                 lines: int, crc32: int) -> None:
    """Write the cache of ``path`` (atomically); where it cannot be written, nothing."""
    strings: dict[str | None, int | None] = {None: None}  # None stays None
    programs: dict[bytes, int] = {}
    by_id: dict[int, int | None] = {id(None): None}  # records read from a cache are shared
    records: list[ProgramRecord] = []

    def index(column: Sequence[str | None]) -> list[int | None]:
        for s in dict.fromkeys(column):  # each string once, in C
            strings.setdefault(s, len(strings) - 1)
        return list(map(strings.__getitem__, column))

    def program(record: ProgramRecord | None) -> int | None:
        if id(record) in by_id:
            return by_id[id(record)]
        key = pydantic_core.to_json(record)
        i = programs.get(key)
        if i is None:
            i = programs[key] = len(records)
            records.append(cast(ProgramRecord, record))
        by_id[id(record)] = i
        return i

    columns = {name: list(map(operator.itemgetter(i), points))
               for i, name in enumerate(Point._fields)}
    body: dict[str, Any] = {name: index(columns[name]) for name in
                            ("time", "session", "platform", "nodeid", "commit")}
    envs = list(zip(columns["fingerprint"], columns["machine"], columns["stack"],
                    strict=True))
    table = {e: i for i, e in enumerate(dict.fromkeys(envs))}  # each once, in C
    stacks = dict(zip(columns["stack"], columns["versions"], strict=True))  # in C
    stacks.pop(None, None)
    body.update(
        version=cache_version(), stat=stat, covered=covered, lines=lines, crc32=crc32,
        dirty=columns["dirty"], throughput=columns["throughput"],
        step_time=columns["step_time"], memory=columns["memory"], loss=columns["loss"],
        program=list(map(program, columns["program"])),
        environment=list(map(table.__getitem__, envs)), environments=list(table),
        strings=list(strings)[1:], programs=records,
        stacks={h: dict(v) for h, v in stacks.items() if v is not None})
    where = cache_path(path)
    try:
        where.parent.mkdir(exist_ok=True)
        atomic_write(where, pydantic_core.to_json(body).decode())
    except OSError:  # a read-only history: read again in full next time
        return
