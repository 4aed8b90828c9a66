"""One rank of a launch (see :mod:`pytest_accelperf.backends.procs.launch`): the child's side.

``python -m pytest_accelperf.backends.procs._rank WORKDIR RANK`` loads ``(fn, args)`` from
``WORKDIR/payload.pkl``, calls ``fn(ctx, *args)`` and writes the result to
``WORKDIR/rank{RANK}.result.pkl``; progress and any error go, one JSON object a line, to
``WORKDIR/rank{RANK}.jsonl``. An exception is reported (type, message, traceback, whether
it was an out-of-memory) and the process exits with ``EXIT_RAISED``.

``python -m pytest_accelperf.backends.procs._rank --warm MODULES RANK`` is a pool's warm rank
(:mod:`pytest_accelperf.backends.procs.rank_pool`): it imports ``MODULES`` once, then forks one
child per case it is sent on stdin; the child runs the case as above (:func:`run_case`).
"""

from __future__ import annotations

import importlib
import json
import os
import pickle
import signal
import sys
import traceback
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from typing_extensions import Unpack

from pytest_accelperf.backends.procs.events import PoolJob, ProgressEvent, error_event


@dataclass
class RankContext:
    """What a rank function gets: who it is and how to report progress."""

    rank: int
    world_size: int
    local_rank: int
    device: str
    workdir: Path

    @property
    def events(self) -> Path:
        return self.workdir / f"rank{self.rank}.jsonl"

    def emit(self, event: str, **fields: object) -> None:
        """Append one event line (flushed at once: a kill may come any moment)."""
        with self.events.open("a", encoding="utf-8") as f:
            f.write(json.dumps({"event": event, **fields}, default=str) + "\n")

    def progress(self, **fields: Unpack[ProgressEvent]) -> None:
        """Report progress: ``phase`` ("init", "train", "done"), ``step`` (the last step
        finished), ``peak_bytes``, anything JSON-able. Later fields replace earlier ones."""
        self.emit("progress", **fields)


def _die_with_parent() -> None:
    """Linux: have the kernel SIGKILL this rank when its parent (pytest) dies, so a killed
    session leaves no rank behind."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() == 1:  # the parent died before prctl
        os._exit(1)


def run_case(workdir: Path, rank: int) -> int:
    """Run the case in ``workdir`` in this process: load ``(fn, args)``, call it, write the
    result (or the error); returns the exit code (0, or 17 = ``launch.EXIT_RAISED``)."""
    ctx = RankContext(rank=rank, world_size=int(os.environ.get("WORLD_SIZE", "1")),
                      local_rank=int(os.environ.get("LOCAL_RANK", str(rank))),
                      device=os.environ.get("ACCELPERF_DEVICE", "cpu"), workdir=workdir)
    ctx.progress(phase="starting")
    try:
        with (workdir / "payload.pkl").open("rb") as f:
            fn, args = pickle.load(f)
        result = fn(ctx, *args)
    except BaseException as exc:
        ctx.emit("error", **error_event(exc))
        sys.stdout.flush()
        sys.stderr.flush()
        return 17  # launch.EXIT_RAISED
    tmp = workdir / f"rank{rank}.result.pkl.tmp"
    with tmp.open("wb") as f:
        pickle.dump(result, f)
    tmp.rename(workdir / f"rank{rank}.result.pkl")
    ctx.progress(phase="done")
    sys.stdout.flush()
    sys.stderr.flush()
    return 0


def main(argv: list[str]) -> int:
    if argv and argv[0] == "--warm":
        return warm_main(argv[1], int(argv[2]))
    workdir, rank = Path(argv[0]), int(argv[1])
    _die_with_parent()
    # os._exit: skip atexit hooks and process-group teardown, which may wait on peers.
    os._exit(run_case(workdir, rank))


# -- a warm rank of a pool (see pytest_accelperf.backends.procs.rank_pool) ------------------------
def warm_main(modules: str, rank: int) -> int:
    """A pool's warm rank: import ``modules`` (comma-separated; ``module:function`` also
    calls ``function()`` of it, without arguments; one that fails is skipped: a case that
    needs it fails in its own process, as a fresh rank would), then, for each JSON line
    on stdin (``workdir``, ``env``, ``sys_path``), fork a child that runs that case as a
    fresh rank would (:func:`run_case`) and report ``{"event": "started", "pid"}`` and
    ``{"event": "exit", "pid", "code"}`` on stdout. Ends at the end of stdin."""
    _die_with_parent()
    # The imports leave a BLAS thread or two (none of them Python's, none busy: BLAS
    # libraries stop theirs around a fork); fork's warning about threads is not for them.
    warnings.filterwarnings("ignore", message=".*fork.*", category=DeprecationWarning)
    status = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # what the imports print goes to the warm log, not to the status pipe
    for name in filter(None, modules.split(",")):
        module, _, function = name.partition(":")
        try:
            imported = importlib.import_module(module)
            if function:
                getattr(imported, function)()
        except Exception:  # the case that needs it fails in its own process, with its log
            print(f"warm rank {rank}: {name} failed; left to the cases", file=sys.stderr)
            traceback.print_exc()
    stdin = sys.stdin.buffer
    while True:
        line = stdin.readline()
        if not line:
            return 0
        job = cast(PoolJob, json.loads(line))  # as the pool sent it
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the case's process
            code = 1
            try:
                status.close()
                _become_case(job)
                code = run_case(Path(job["workdir"]), rank)
            except BaseException:
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        status.write(json.dumps({"event": "started", "pid": pid}) + "\n")
        _, wait_status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(wait_status)
        status.write(json.dumps({"event": "exit", "pid": pid, "code": code}) + "\n")


def _become_case(job: PoolJob) -> None:
    """In a forked child: the case's own stdin (none), log, environment and import path."""
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    log = os.open(Path(job["workdir"]) / f"rank{os.environ.get('RANK', '0')}.log",
                  os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.environ.clear()
    os.environ.update(job["env"])
    missing = [p for p in job.get("sys_path", []) if p and p not in sys.path]
    sys.path[:0] = missing
    _die_with_parent()  # the parent is now the warm rank


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
