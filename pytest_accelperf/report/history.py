"""The run history: one JSON line per case per session, appended, never rewritten.

``--accelperf-history=DIR`` appends the session's runs to ``DIR/<platform>.jsonl``. Each
line carries the git commit the session ran on, the environment (and hashes of it: the
whole ``fingerprint``, the ``machine`` and the case's ``stack``,
:mod:`pytest_accelperf.provision.describe`), the headline numbers, the gated fields of the
program
record and the verdicts, so trends and change points can be plotted (the HTML report) and
listed (``accelperf history changes``, :mod:`pytest_accelperf.report.changes`) over
commits, and read by anything that reads JSON lines::

    {"commit": "3d153e9...", "dirty": false, "fingerprint": "5f0c...",
     "machine": "0b1e...", "stack": "9a3d...", "environment": {...}, "nodeid": "...",
     "samples_per_second": 1020.2, "median_step_time": 0.0627, "final_loss": 2.404,
     "peak_memory": 7539712, "program": {"source": "xla", "flops": 2.1e9, ...},
     "verdict": "regression", "checks": {"throughput": ...}, ...}

Every line read is validated by the schema (:class:`pytest_accelperf.store.schema.HistoryLine`;
:class:`~pytest_accelperf.store.schema.HistoryNumbers` where only the numbers are read,
:mod:`pytest_accelperf.report.points`): a line that is not one is an error naming the file,
the line and the field (:func:`invalid_line`).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import tempfile
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path

from filelock import FileLock
from pydantic import ValidationError

from pytest_accelperf.errors import UserError
from pytest_accelperf.git import git_or_none
from pytest_accelperf.provision.describe import case_stack, machine
from pytest_accelperf.records.jsonvalue import JSONValue
from pytest_accelperf.records.program import AMOUNTS, COUNTS
from pytest_accelperf.report.data import CaseRecord, SessionReport
from pytest_accelperf.report.writing import OutputError, append_output, describe
from pytest_accelperf.stats.median import median_interval
from pytest_accelperf.store.jsonfile import field_path
from pytest_accelperf.store.machines import default_machine
from pytest_accelperf.store.schema import HistoryLine, error_lines

HISTORY_SCHEMA_VERSION = 1

#: Environment variables CI systems set to the commit under test, tried when git cannot say.
_COMMIT_VARS = ("GITHUB_SHA", "CI_COMMIT_SHA", "BUILDKITE_COMMIT", "GIT_COMMIT")
#: Likewise for the branch (a pull request's head branch first: a CI checkout is detached).
_BRANCH_VARS = ("GITHUB_HEAD_REF", "GITHUB_REF_NAME", "CI_COMMIT_REF_NAME", "BUILDKITE_BRANCH",
                "GIT_BRANCH")


class HistoryError(UserError):
    """A history file that cannot be read; the message names the file, line and fix."""


def git_state(cwd: Path) -> tuple[str | None, bool | None]:
    """``(commit, dirty)`` of the git checkout at ``cwd``; the CI's commit variable, or
    ``(None, None)``, where there is no git or no repository."""
    head = git_or_none(cwd, "rev-parse", "HEAD")
    if head:
        status = git_or_none(cwd, "status", "--porcelain", "--untracked-files=no")
        return head.strip(), (bool(status.strip()) if status is not None else None)
    for var in _COMMIT_VARS:
        if os.environ.get(var):
            return os.environ[var], None
    return None, None


def git_branch(cwd: Path) -> str | None:
    """The branch checked out at ``cwd``; where git says none (a detached checkout, as CI
    makes) or there is no repository, the CI's branch variable, else None."""
    head = git_or_none(cwd, "rev-parse", "--abbrev-ref", "HEAD")
    if head and head.strip() and head.strip() != "HEAD":
        return head.strip()
    for var in _BRANCH_VARS:
        if os.environ.get(var):
            return os.environ[var]
    return None


def fingerprint_hash(environment: Mapping[str, object]) -> str:
    """A short stable hash of an environment fingerprint (equal environments, equal hash)."""
    text = json.dumps(environment, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) else None


#: The fields of a program record a history line keeps: those the ``program`` check gates
#: (:mod:`pytest_accelperf.records.program`), not the op histogram or the reasons and sites shown
#: beside a change (kilobytes a line).
PROGRAM_FIELDS = ("source", "global_flops", "loops", *AMOUNTS, "collectives", *COUNTS)


def program_fields(program: object) -> dict[str, object] | None:
    """The gated fields of a run's program record (:data:`PROGRAM_FIELDS`), or None."""
    if not isinstance(program, dict) or not isinstance(program.get("source"), str):
        return None
    return {k: program[k] for k in PROGRAM_FIELDS if program.get(k) is not None}


def _interval(step_times: object) -> list[float] | None:
    if not isinstance(step_times, list):
        return None
    found = median_interval([float(t) for t in step_times if isinstance(t, (int, float))])
    return list(found) if found is not None else None


def _per_device(memory: object) -> dict[str, float] | None:
    if not isinstance(memory, dict):
        return None
    return {str(k): float(v) for k, v in memory.items() if isinstance(v, (int, float))} or None


def entry(record: CaseRecord, *, session: str, time: str, commit: str | None,
          dirty: bool | None, update: bool, branch: str | None = None,
          machine_name: str | None = None) -> dict[str, object]:
    """The history line of one case, to write as JSON: a key for every field of
    :class:`~pytest_accelperf.store.schema.HistoryLine`, which declares them (a test holds
    the two equal). Not validated here: a case's parameter that is not JSON by nature is
    written as its ``str`` (``default=str``), as the report writes it."""
    run = record.run
    derived = run.get("derived") or {}
    losses = [x for x in run.get("losses") or [] if isinstance(x, (int, float))]
    environment: dict[str, JSONValue] = dict(run.get("environment") or {})
    backend = (record.case or {}).get("backend")
    backend = backend if isinstance(backend, str) else None
    return {
        "schema_version": HISTORY_SCHEMA_VERSION,
        "session": session,
        "time": time,
        "commit": commit,
        "dirty": dirty,
        "update": update,
        "platform": record.platform,
        "nodeid": record.nodeid,
        "case_id": record.case_id,
        "case": record.case,
        "outcome": run.get("outcome"),
        "verdict": record.verdict.value,
        "checks": {c.metric: c.verdict.value for c in record.checks},
        "samples_per_second": _number(derived.get("samples_per_second")),
        "median_step_time": _number(derived.get("median_step_time")),
        "peak_memory": _number(derived.get("peak_memory")),
        "mfu": _number(derived.get("mfu")),
        "compile_time": _number(run.get("compile_time")),
        "final_loss": float(losses[-1]) if losses else None,
        "fingerprint": fingerprint_hash(environment),
        "machine": fingerprint_hash(machine(environment)),
        "machine_name": machine_name or default_machine(environment),
        "stack": fingerprint_hash(case_stack(environment, backend)),
        "environment": environment,
        "program": program_fields(run.get("program")),
        "branch": branch,
        "step_time_interval": _interval(run.get("step_times")),
        "memory_per_device": _per_device(run.get("memory_per_device")),
    }


def append_history(directory: Path, report: SessionReport, *, cwd: Path,
                   now: _dt.datetime | None = None) -> list[Path]:
    """Append one line per case of ``report`` to ``directory/<platform>.jsonl``; the files
    written. Appends happen under a file lock, one write per file, so sessions running at
    once never interleave half lines. A file that cannot be written is an
    :class:`~pytest_accelperf.report.writing.OutputError` naming ``--accelperf-history``;
    the files of the platforms before it were appended to."""
    option = "--accelperf-history"
    moment = (now or _dt.datetime.now(_dt.timezone.utc)).replace(microsecond=0)
    time = moment.isoformat()
    commit, dirty = git_state(cwd)
    branch = git_branch(cwd)
    session = f"{moment.strftime('%Y%m%dT%H%M%SZ')}-{uuid.uuid4().hex[:8]}"
    by_platform: dict[str, list[str]] = {}
    for record in report.sorted_records():
        line = entry(record, session=session, time=time, commit=commit, dirty=dirty,
                     update=report.update, branch=branch, machine_name=report.machine or None)
        by_platform.setdefault(record.platform or "unknown", []).append(
            json.dumps(line, sort_keys=True, allow_nan=False, default=str))
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"cannot write {directory}: {describe(exc)}", where=option,
                          path=directory) from exc
    written: list[Path] = []
    for platform, lines in sorted(by_platform.items()):
        path = directory / f"{platform}.jsonl"
        try:
            with FileLock(_lock_path(path), timeout=60):
                append_output(path, "\n".join(lines) + "\n", option=option)
        except OSError as exc:  # the lock: filelock.Timeout, or its file in the temp dir
            raise OutputError(f"cannot write {path}: {describe(exc)}", where=option,
                              path=path) from exc
        written.append(path)
    return written


def _lock_path(path: Path) -> str:
    """A lock in the temp dir, so the history directory holds only its ``.jsonl`` files."""
    digest = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:16]
    return os.path.join(tempfile.gettempdir(), f"accelperf-history-{digest}.lock")


def history_files(directory: Path, platform: str | None = None) -> list[Path]:
    """The ``.jsonl`` files of a history directory (of one platform, if given)."""
    if not directory.is_dir():
        raise HistoryError(f"{directory}: no history directory; write one with "
                           f"--accelperf-history={directory}")
    paths = ([directory / f"{platform}.jsonl"] if platform
             else sorted(directory.glob("*.jsonl")))
    return [p for p in paths if p.is_file()]


def read_bytes(path: Path, start: int = 0) -> bytes:
    """The bytes of a history file, from byte ``start``; a :class:`HistoryError` naming the
    file where it cannot be read."""
    try:
        if not start:
            return path.read_bytes()
        with path.open("rb") as f:
            f.seek(start)
            return f.read()
    except OSError as exc:
        raise HistoryError(f"{path}: cannot read the history: {describe(exc)}") from None


def _lines(directory: Path, platform: str | None) -> Iterator[tuple[Path, int, bytes]]:
    """``(file, line number, line)`` of every non-blank line of the history files."""
    for path in history_files(directory, platform):
        for n, raw in enumerate(read_bytes(path).splitlines(), start=1):
            if raw.strip():
                yield path, n, raw


def invalid_line(path: Path, n: int, raw: bytes, exc: ValidationError) -> HistoryError:
    """The error of line ``n`` of ``path``, ``raw``, which ``exc`` says is not a history
    entry: file, line, field, fix."""
    first = exc.errors(include_url=False)[0]
    if first["type"] == "json_invalid":
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError as bad:
            return _not_utf8(path, n, raw, bad)
        msg = "not JSON: " + first["msg"].removeprefix("Invalid JSON: ").replace(
            "at line 1 column", "at column")
    else:
        loc, msg = error_lines(exc, limit=1)[0]
        msg = f"{field_path(loc)}: {msg}" if loc else msg
    return HistoryError(f"{path}:{n}: not a history entry ({msg}); delete or fix that line")


def _not_utf8(path: Path, n: int, raw: bytes, exc: UnicodeDecodeError) -> HistoryError:
    return HistoryError(f"{path}:{n}: not a history entry (byte 0x{raw[exc.start]:02x} at "
                        f"column {exc.start + 1} is not UTF-8); delete or fix that line")


def read_history(directory: Path, platform: str | None = None) -> list[dict[str, JSONValue]]:
    """Every entry under ``directory`` (of one platform, if given), oldest first, each line
    validated as a :class:`~pytest_accelperf.store.schema.HistoryLine`."""
    out: list[dict[str, JSONValue]] = []
    for path, n, raw in _lines(directory, platform):
        try:
            item = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError as exc:
            raise _not_utf8(path, n, raw, exc) from None
        except json.JSONDecodeError as exc:
            raise HistoryError(f"{path}:{n}: not a history entry (not JSON: {exc.msg.lower()} "
                               f"at column {exc.colno}); delete or fix that line") from None
        try:
            HistoryLine.model_validate(item)
        except ValidationError as exc:
            raise invalid_line(path, n, raw, exc) from None
        out.append(item)  # a HistoryLine: validated just now
    out.sort(key=lambda e: (str(e.get("time", "")), str(e.get("session", ""))))
    return out
