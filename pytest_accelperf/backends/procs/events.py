"""What a launched rank reports while it runs, declared once for the ranks that write it
(:class:`~pytest_accelperf.backends.procs._rank.RankContext`, a cluster's rank actor) and
the code that reads it (:mod:`~pytest_accelperf.backends.procs.launch`,
:mod:`pytest_accelperf.cluster`).

A rank appends JSON lines to its events file, ``{"event": "progress", ...}`` and, when it
raises, ``{"event": "error", ...}``; a reader takes the ``event`` key off and has a
:class:`ProgressEvent` or an :class:`ErrorEvent`. A cluster's rank actor posts the same
progress events to its progress board. They are read back as the JSON they were written,
so a reader still checks what it uses (a line cut off by a kill is skipped). A pool's warm
rank is sent a :class:`PoolJob` for each case it forks.

Importing this module imports no framework.
"""

from __future__ import annotations

import json
import traceback
from collections.abc import Iterable, Iterator
from typing import Literal, Required, TypedDict, cast

#: The phases of a rank, in order: started, joining the process group and building the
#: engine (``init``), training (``train``), serving an A/B worker's blocks of steps
#: (``blocks``), finished (``done``).
Phase = Literal["starting", "init", "train", "blocks", "done"]

#: The types of exceptions that mean the rank ran out of memory (matched by name, on the
#: exception's classes: neither torch nor the launcher need be imported to match them).
OOM_TYPES = ("OutOfMemoryError", "CapacityExceeded")


class ProgressEvent(TypedDict, total=False):
    """A rank's ``progress`` event; each names what changed, later fields replace earlier
    ones (:meth:`~pytest_accelperf.backends.procs.launch.RankReport.add_progress`)."""

    phase: Phase
    #: The last step finished (steps count from 0, warm-up included).
    step: int
    #: The steps of the run (the JAX ranks and the cluster's report it).
    total: int
    loss: float
    #: The step's time in seconds.
    time: float
    #: Whether the step is a measured one (not a warm-up step).
    measured: bool
    #: The rank's peak memory so far, in bytes (None: not counted).
    peak_bytes: int | None


class ErrorEvent(TypedDict, total=False):
    """A rank's ``error`` event: the exception it raised (:func:`error_event`)."""

    type: Required[str]
    message: Required[str]
    #: Whether it ran out of memory (:data:`OOM_TYPES`).
    oom: Required[bool]
    #: What a :class:`~pytest_accelperf.backends.procs.launch.CapacityExceeded` says:
    #: the bytes it needed, the capacity, where the count came from.
    required: int | str
    capacity: int | str
    source: int | str
    #: The end of the formatted traceback (last: the events file has it last).
    traceback: str


class PoolJob(TypedDict):
    """What a pool sends one of its warm ranks for a case, a JSON line on the warm rank's
    stdin (:mod:`~pytest_accelperf.backends.procs.rank_pool`): the case's directory, and
    the environment and import path its forked child takes."""

    workdir: str
    env: dict[str, str]
    sys_path: list[str]


def is_oom(exc: BaseException) -> bool:
    """Whether ``exc`` is an out-of-memory error (:data:`OOM_TYPES`)."""
    return any(cls.__name__ in OOM_TYPES for cls in type(exc).__mro__)


def error_event(exc: BaseException) -> ErrorEvent:
    """The ``error`` event of a rank that raised ``exc`` (its keys in this order, as the
    rank's events file has them)."""
    event: ErrorEvent = {"type": type(exc).__name__, "message": str(exc).strip()[:2000],
                         "oom": is_oom(exc)}
    required, capacity, source = (getattr(exc, k, None)
                                  for k in ("required", "capacity", "source"))
    if isinstance(required, int | str):
        event["required"] = required
    if isinstance(capacity, int | str):
        event["capacity"] = capacity
    if isinstance(source, int | str):
        event["source"] = source
    event["traceback"] = "".join(traceback.format_exception(exc))[-4000:]
    return event


def parse_events(lines: Iterable[str | bytes]) -> Iterator[tuple[str, dict[str, object]]]:
    """Each event line of a rank as ``(kind, fields)``: its ``event`` key (``""`` where it
    has none) and the rest, as the JSON was written; a line that is not a JSON object (cut
    off by a kill, still being written) is skipped."""
    for line in lines:
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict):
            kind = event.pop("event", None)
            yield (kind if isinstance(kind, str) else ""), event


def progress_events(lines: Iterable[str | bytes]) -> list[ProgressEvent]:
    """The ``progress`` events among a rank's event ``lines`` (:func:`parse_events`)."""
    return [cast(ProgressEvent, fields) for kind, fields in parse_events(lines)
            if kind == "progress"]
