"""One rank of a launch (see :mod:`pytest_accelperf.backends.launch`): the child's side.

``python -m pytest_accelperf.backends._rank WORKDIR RANK`` loads ``(fn, args)`` from
``WORKDIR/payload.pkl``, calls ``fn(ctx, *args)`` and writes the result to
``WORKDIR/rank{RANK}.result.pkl``; progress and any error go, one JSON object a line, to
``WORKDIR/rank{RANK}.jsonl``. An exception is reported (type, message, traceback, whether
it was an out-of-memory) and the process exits with ``EXIT_RAISED``.
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: Exception class names that mean "out of memory" (torch's CUDA one and the CPU capacity
#: overrun), matched by name so this module imports no framework.
OOM_TYPES = ("OutOfMemoryError", "CapacityExceeded")


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

    def emit(self, event: str, **fields: Any) -> None:
        """Append one event line (flushed at once: a kill may come any moment)."""
        with self.events.open("a", encoding="utf-8") as f:
            f.write(json.dumps({"event": event, **fields}, default=str) + "\n")

    def progress(self, **fields: Any) -> None:
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


def _is_oom(exc: BaseException) -> bool:
    return any(cls.__name__ in OOM_TYPES for cls in type(exc).__mro__)


def main(argv: list[str]) -> int:
    workdir, rank = Path(argv[0]), int(argv[1])
    _die_with_parent()
    ctx = RankContext(rank=rank, world_size=int(os.environ.get("WORLD_SIZE", "1")),
                      local_rank=int(os.environ.get("LOCAL_RANK", str(rank))),
                      device=os.environ.get("ACCELPERF_DEVICE", "cpu"), workdir=workdir)
    ctx.progress(phase="starting")
    try:
        with (workdir / "payload.pkl").open("rb") as f:
            fn, args = pickle.load(f)
        result = fn(ctx, *args)
    except BaseException as exc:
        extra = {k: getattr(exc, k) for k in ("required", "capacity", "source")
                 if isinstance(getattr(exc, k, None), int | str)}
        ctx.emit("error", type=type(exc).__name__, message=str(exc).strip()[:2000],
                 oom=_is_oom(exc), **extra,
                 traceback="".join(traceback.format_exception(exc))[-4000:])
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(17)  # launch.EXIT_RAISED; skip atexit hooks that may wait on peers
    tmp = workdir / f"rank{rank}.result.pkl.tmp"
    with tmp.open("wb") as f:
        pickle.dump(result, f)
    tmp.rename(workdir / f"rank{rank}.result.pkl")
    ctx.progress(phase="done")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # process-group teardown and atexit hooks can block on a finished peer


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
