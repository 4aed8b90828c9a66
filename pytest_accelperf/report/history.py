"""The run history: one JSON line per case per session, appended, never rewritten.

``--accelperf-history=DIR`` appends the session's runs to ``DIR/<platform>.jsonl``. Each
line carries the git commit the session ran on, the environment fingerprint, the headline
numbers and the verdicts, so trends and step changes can be plotted (the HTML report) and
listed (:func:`step_changes`) over commits, and read by anything that reads JSON lines::

    {"commit": "3d153e9...", "dirty": false, "fingerprint": "5f0c...", "nodeid": "...",
     "samples_per_second": 1020.2, "median_step_time": 0.0627, "final_loss": 2.404,
     "peak_memory": 7539712, "verdict": "regression", "checks": {"throughput": ...}, ...}
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import statistics
import subprocess
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from filelock import FileLock

from pytest_accelperf.errors import UserError
from pytest_accelperf.report.data import CaseRecord, SessionReport
from pytest_accelperf.report.writing import OutputError, append_output, describe

HISTORY_SCHEMA_VERSION = 1

#: Environment variables CI systems set to the commit under test, tried when git cannot say.
_COMMIT_VARS = ("GITHUB_SHA", "CI_COMMIT_SHA", "BUILDKITE_COMMIT", "GIT_COMMIT")


class HistoryError(UserError):
    """A history file that cannot be read; the message names the file, line and fix."""


def git_state(cwd: Path) -> tuple[str | None, bool | None]:
    """``(commit, dirty)`` of the git checkout at ``cwd``; the CI's commit variable, or
    ``(None, None)``, where there is no git or no repository."""
    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True,
                                  timeout=10, check=False)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout if done.returncode == 0 else None

    head = git("rev-parse", "HEAD")
    if head:
        status = git("status", "--porcelain", "--untracked-files=no")
        return head.strip(), (bool(status.strip()) if status is not None else None)
    for var in _COMMIT_VARS:
        if os.environ.get(var):
            return os.environ[var], None
    return None, None


def fingerprint_hash(environment: dict[str, Any]) -> str:
    """A short stable hash of an environment fingerprint (equal environments, equal hash)."""
    text = json.dumps(environment, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) else None


def entry(record: CaseRecord, *, session: str, time: str, commit: str | None,
          dirty: bool | None, update: bool) -> dict[str, Any]:
    """The history line of one case."""
    run = record.run
    derived = run.get("derived") or {}
    losses = [x for x in run.get("losses") or [] if isinstance(x, (int, float))]
    environment = dict(run.get("environment") or {})
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
        "environment": environment,
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
    session = f"{moment.strftime('%Y%m%dT%H%M%SZ')}-{uuid.uuid4().hex[:8]}"
    by_platform: dict[str, list[str]] = {}
    for record in report.sorted_records():
        line = entry(record, session=session, time=time, commit=commit, dirty=dirty,
                     update=report.update)
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


def read_history(directory: Path, platform: str | None = None) -> list[dict[str, Any]]:
    """Every entry under ``directory`` (of one platform, if given), oldest first."""
    if not directory.is_dir():
        raise HistoryError(f"{directory}: no history directory; write one with "
                           f"--accelperf-history={directory}")
    paths = ([directory / f"{platform}.jsonl"] if platform
             else sorted(directory.glob("*.jsonl")))
    out: list[dict[str, Any]] = []
    for path in paths:
        if not path.is_file():
            continue
        for n, raw in enumerate(path.read_bytes().splitlines(), start=1):
            if not raw.strip():
                continue
            try:
                item = json.loads(raw.decode("utf-8"))
            except UnicodeDecodeError as exc:
                raise HistoryError(f"{path}:{n}: not a history entry (byte "
                                   f"0x{raw[exc.start]:02x} at column {exc.start + 1} is not "
                                   f"UTF-8); delete or fix that line") from None
            except json.JSONDecodeError as exc:
                raise HistoryError(f"{path}:{n}: not a history entry ({exc.msg}); delete or "
                                   f"fix that line") from None
            if not isinstance(item, dict) or "nodeid" not in item or "session" not in item:
                raise HistoryError(f"{path}:{n}: not a history entry (no nodeid/session); "
                                   f"delete or fix that line")
            out.append(item)
    out.sort(key=lambda e: (str(e.get("time", "")), str(e.get("session", ""))))
    return out


@dataclass(frozen=True)
class StepChange:
    """A throughput step: an entry whose samples/s differs from the median of the entries
    before it by more than the threshold."""

    nodeid: str
    before: float
    after: float
    commit_before: str | None
    commit: str | None
    time: str

    @property
    def change(self) -> float:
        return self.after / self.before - 1


def step_changes(entries: list[dict[str, Any]], threshold: float,
                 window: int = 5) -> list[StepChange]:
    """Steps in samples/s along each case's history: each entry against the median of up to
    ``window`` entries before it (same environment fingerprint), counting only entries since
    the last step, so a new level is reported once, where it began."""
    by_case: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for e in entries:
        if isinstance(e.get("samples_per_second"), (int, float)):
            by_case.setdefault((e["nodeid"], str(e.get("fingerprint"))), []).append(e)
    out: list[StepChange] = []
    for (nodeid, _), seq in sorted(by_case.items()):
        start = 0
        for i in range(1, len(seq)):
            previous = seq[max(start, i - window):i]
            before = statistics.median(float(p["samples_per_second"]) for p in previous)
            after = float(seq[i]["samples_per_second"])
            if before > 0 and abs(after / before - 1) > threshold:
                out.append(StepChange(nodeid, before, after, previous[-1].get("commit"),
                                      seq[i].get("commit"), str(seq[i].get("time", ""))))
                start = i
    return out
