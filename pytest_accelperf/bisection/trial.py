"""One pytest session at one commit (see :mod:`pytest_accelperf.bisection`): run in a fresh
worktree of the commit, in the same place as the user's working directory, with the user's
node ids and pytest arguments and the options the bisection adds; its ``--accelperf-json``
report read back through the report's schema (:func:`~pytest_accelperf.report.loading.
load_report`); the worktree removed.

The session runs in a process group of its own, its output in a log file: on Ctrl-C or
SIGTERM it is sent SIGINT (pytest stops its A/B workers), and the whole group is killed
if it has not ended :data:`STOP_GRACE_S` seconds later.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from pytest_accelperf.ab.tree import moved_path
from pytest_accelperf.bisection import BisectError
from pytest_accelperf.bisection.commits import Commit, CommitRange, Worktrees
from pytest_accelperf.interrupt import sigint_delivered
from pytest_accelperf.report.data import CaseRecord
from pytest_accelperf.report.loading import ReportFileError, load_report

#: pytest's exit statuses after which the report is read: every test passed, or some
#: failed (a regression fails its test).
READ = (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED)
#: Seconds a session has to stop after SIGINT before its process group is killed.
STOP_GRACE_S = 15.0
#: Options of pytest-accelperf that a bisection sets in its sessions itself: the user's
#: pytest arguments may not, and what to pass to ``accelperf bisect`` instead.
OWN_OPTIONS: dict[str, str] = {
    "--accelperf-compare": "each commit is compared with GOOD by the bisection",
    "--accelperf-compare-python": "every commit and GOOD run in this environment",
    "--accelperf-compare-tolerance": "pass accelperf bisect --tolerance",
    "--accelperf-compare-budget": "pass accelperf bisect --budget",
    "--accelperf-json": "pass accelperf bisect --json for the bisection's own result",
    "--accelperf-update": "GOOD's session records the baseline the others are checked "
                          "against, in a store of the bisection's own",
    "--accelperf-add-session": "GOOD's session records the baseline",
    "--accelperf-baselines": "the sessions use a store of the bisection's own",
}
#: What every session adds: no profiler trace of a regression, no re-measurement of a
#: stored-baseline throughput regression (neither is evidence here), no pytest cache in
#: the worktree.
QUIET = ("--accelperf-explain=off", "--accelperf-confirm=0")


@dataclass(frozen=True)
class Session:
    """What one pytest session at one commit gave."""

    commit: Commit
    #: The command as run (``argv``), and where (in a worktree that is gone by now).
    command: tuple[str, ...]
    cwd: Path
    status: int
    seconds: float
    #: The report's cases by node id (empty when the report could not be read).
    cases: Mapping[str, CaseRecord] = field(default_factory=dict)
    #: Why the session says nothing of the commit (it did not collect, import or run);
    #: empty when its report was read.
    why: str = ""


def own_option(args: Sequence[str]) -> str | None:
    """A one-line error when ``args`` (the user's pytest arguments) set an option the
    bisection sets itself, else None."""
    for arg in args:
        name = arg.split("=", 1)[0]
        if name in OWN_OPTIONS:
            return (f"{name} is set by accelperf bisect in every session it runs "
                    f"({OWN_OPTIONS[name]}); leave it out of the pytest arguments")
    return None


def session_env(root: Path, tree: Path, environ: Mapping[str, str]) -> dict[str, str]:
    """The environment of a session: this one, with every ``PYTHONPATH`` entry inside
    the repository moved into the commit's worktree, so that the code under test is the
    commit's, not the working tree's."""
    env = dict(environ)
    if env.get("PYTHONPATH"):
        entries = env["PYTHONPATH"].split(os.pathsep)
        env["PYTHONPATH"] = os.pathsep.join(moved_path(entries, root, tree))
    return env


def pytest_argv(args: Sequence[str], extra: Sequence[str], python: str | None = None
                ) -> list[str]:
    """The session's command: the user's pytest arguments, then the bisection's own; under
    ``python`` (default: this interpreter)."""
    return [python or sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args, *extra,
            *QUIET]


def report_paths(scratch: Path, point: Commit) -> tuple[Path, Path]:
    """A new session's report and log in ``scratch``, numbered in the order they ran."""
    runs = len(list(scratch.glob("*.log")))
    stem = scratch / f"{runs:02d}-{point.short}"
    return stem.with_suffix(".json"), stem.with_suffix(".log")


def run_session(trees: Worktrees, rng: CommitRange, commit: Commit, args: Sequence[str],
                extra: Sequence[str], scratch: Path) -> Session:
    """Run ``pytest ARGS EXTRA`` in a fresh worktree of ``commit`` and read its report;
    the worktree is removed before this returns (or raises)."""
    report, log = report_paths(scratch, commit)
    argv = pytest_argv(args, [*extra, f"--accelperf-json={report}"])
    tree = trees.add(commit)
    cwd = tree / rng.subdir
    t0 = time.monotonic()
    try:
        if not cwd.is_dir():
            return Session(commit, tuple(argv), cwd, -1, 0.0,
                           why=f"{rng.subdir} does not exist at this commit")
        status = run_logged(argv, cwd, session_env(rng.root, tree, os.environ), log)
    finally:
        trees.remove(tree)
    return read_session(commit, argv, cwd, status, time.monotonic() - t0, report, log)


def read_session(commit: Commit, argv: Sequence[str], cwd: Path, status: int,
                 seconds: float, report: Path, log: Path) -> Session:
    """What a session that ended with ``status`` gave: its report's cases, or why it says
    nothing of ``commit`` (it did not collect, import or run)."""
    if status not in READ:
        return Session(commit, tuple(argv), cwd, status, seconds,
                       why=f"pytest exit {status} ({_exit_name(status)}): {summary(log)}")
    try:
        records = load_report(report)[0].records
    except ReportFileError as exc:
        return Session(commit, tuple(argv), cwd, status, seconds,
                       why=f"no report read back ({exc}): {summary(log)}")
    if not records:
        return Session(commit, tuple(argv), cwd, status, seconds,
                       why="no accelperf case ran (are the node ids accelperf cases?)")
    return Session(commit, tuple(argv), cwd, status, seconds,
                   cases={r.nodeid: r for r in records})


def _exit_name(status: int) -> str:
    try:
        return pytest.ExitCode(status).name.lower().replace("_", " ")
    except ValueError:
        return "killed" if status < 0 else "unknown"


#: A line of pytest's output that says what went wrong: an ``E   `` line of a traceback
#: (``E   ModuleNotFoundError: No module named 'x'``), ``ERROR`` of the summary, an
#: exception's own line.
_ERROR_LINE = re.compile(r"^(E\s{2,}\S.*|ERROR\s.*|\w+Error: .*)$")
#: pytest's usage error: ``python -m pytest: error: unrecognized arguments: --x``.
_USAGE_LINE = re.compile(r"^[\w .\-]+: error: .*$")


def summary(log: Path) -> str:
    """The line of a session's output that best says why it failed: the first ``E``
    line of a traceback, else pytest's usage error, else the last ``ERROR`` line, else
    the last line."""
    try:
        lines = [line.rstrip() for line in log.read_text(errors="replace").splitlines()
                 if line.strip()]
    except OSError:
        return "(no output)"
    errors = [line for line in lines if _ERROR_LINE.match(line)]
    chosen = (next((line for line in errors if line.startswith("E ")), None)
              or next((line for line in lines if _USAGE_LINE.match(line)), None)
              or (errors[-1] if errors else (lines[-1] if lines else "(no output)")))
    chosen = re.sub(r"^E\s+", "", chosen)
    return chosen if len(chosen) <= 200 else chosen[:197] + "..."


def run_logged(argv: Sequence[str], cwd: Path, env: Mapping[str, str], log: Path) -> int:
    """Run ``argv`` to its end, its output to ``log``; on an interrupt, stop it (SIGINT to
    its group, SIGKILL after :data:`STOP_GRACE_S`) and raise the interrupt on."""
    with log.open("wb") as out:
        with sigint_delivered():  # the session handles SIGINT, so :func:`stop` stops it
            proc = subprocess.Popen(list(argv), cwd=cwd, env=dict(env),
                                    stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        try:
            return proc.wait()
        except BaseException:
            stop(proc)
            raise


def stop(proc: subprocess.Popen[bytes]) -> None:
    """Stop a session and everything it started (its process group): SIGINT, so that
    pytest stops its workers, then SIGKILL to whatever is left."""
    try:
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=STOP_GRACE_S)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        pass
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def require(session: Session, which: str, hint: str) -> Session:
    """``session`` when it ran; a :class:`BisectError` naming the end (GOOD or BAD) and
    why it did not."""
    if session.why:
        raise BisectError(f"{which} {session.commit.short} ({session.commit.subject}) cannot "
                          f"be tested: {session.why}; {hint}")
    return session
