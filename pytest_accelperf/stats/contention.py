"""How much of the machine other processes used while a step time was measured.

A step time measured while another job shared the cores is contaminated, and pairing the
two revisions of A/B mode in alternation does not cancel it: a competing process slows the
two worker processes unequally and for minutes at a time (on this project's 2-core machine
one spinning competitor moved the ratio of two *identical* trees between 0.85 and 1.18
with 95 % intervals that excluded 1). The plugin's own evidence of that is the CPU time the
rest of the machine used during the measurement, read from ``/proc``: the busy time of all
CPUs (``/proc/stat``) less what the measuring processes themselves used
(``/proc/<pid>/stat``, all threads, and every process descended from them: the ranks of a
multi-process case, a local Ray cluster's workers), in cores on average, plus the time the
hypervisor took (steal). Only the CPUs this process may run on count
(:func:`usable_cpus`): in a cpuset the rest of a large node is not contention. Past
``--accelperf-max-foreign-load`` the throughput verdict is ``inconclusive`` with that
reason: the measurement is reported, not judged.

Where there is no ``/proc`` (macOS, Windows) nothing is known and nothing is judged from
it: :meth:`Contention.reading` is ``None`` and the verdict stands as measured.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

#: /proc/stat fields (after the ``cpu`` label) that count as busy: user, nice, system,
#: irq, softirq, steal. guest and guest_nice are already inside user and nice.
_BUSY = (0, 1, 2, 5, 6, 7)
_STEAL = 7
_PROC = Path("/proc")


@dataclass(frozen=True)
class Load:
    """What the rest of the machine used during one measurement."""

    foreign_cores: float
    """CPU time of processes other than the measured ones, in cores on average (a
    spinning competitor is ~1.0), steal included."""
    steal_cores: float
    """The part of it the hypervisor took from this virtual machine."""
    cores: int
    seconds: float
    foreign_ticks: int | None = None
    """The foreign CPU time as ``/proc`` counts it, in clock ticks (None: not known, a
    reading written before it was kept): what :func:`contaminated`'s floor is in."""

    def to_json(self) -> dict[str, float | int]:
        out: dict[str, float | int] = {
            "foreign_cores": round(self.foreign_cores, 3),
            "steal_cores": round(self.steal_cores, 3), "cores": self.cores,
            "seconds": round(self.seconds, 3)}
        if self.foreign_ticks is not None:
            out["foreign_ticks"] = self.foreign_ticks
        return out

    @classmethod
    def from_json(cls, data: dict[str, float | int]) -> Load:
        """The load :meth:`to_json` wrote (``Run.step_load``'s JSON, under the run's
        ``"extra"``)."""
        ticks = data.get("foreign_ticks")
        return cls(foreign_cores=float(data.get("foreign_cores") or 0.0),
                   steal_cores=float(data.get("steal_cores") or 0.0),
                   cores=int(data.get("cores") or 1), seconds=float(data.get("seconds") or 0.0),
                   foreign_ticks=None if ticks is None else int(ticks))

    @classmethod
    def pooled(cls, loads: Sequence[Load]) -> Load:
        """One reading for several measurements taken one after another (a re-measurement
        over more than one training): their foreign and stolen cores averaged over their
        seconds, the seconds and ticks summed (ticks unknown when any is)."""
        if not loads:
            raise ValueError("no load to pool")
        seconds = sum(max(0.0, load.seconds) for load in loads)

        def mean(values: Sequence[float]) -> float:
            if seconds <= 0:
                return sum(values) / len(values)
            return sum(v * max(0.0, load.seconds)
                       for v, load in zip(values, loads, strict=True)) / seconds

        ticks = [load.foreign_ticks for load in loads]
        return cls(foreign_cores=mean([load.foreign_cores for load in loads]),
                   steal_cores=mean([load.steal_cores for load in loads]),
                   cores=max(load.cores for load in loads), seconds=seconds,
                   foreign_ticks=(None if any(t is None for t in ticks)
                                  else sum(t for t in ticks if t is not None)))

    def text(self) -> str:
        steal = (f", {self.steal_cores:.2f} of it stolen by the hypervisor"
                 if self.steal_cores >= 0.01 else "")
        return (f"other processes used {self.foreign_cores:.2f} of {self.cores} cores on "
                f"average during the {self.seconds:.1f} s of measurement{steal}")


def _ticks() -> float:
    return float(os.sysconf("SC_CLK_TCK"))


def usable_cpus() -> frozenset[int] | None:
    """The CPUs this process may run on (its affinity: a container's or a CI job's cpuset),
    or None where the OS does not say."""
    if not hasattr(os, "sched_getaffinity"):
        return None
    try:
        return frozenset(os.sched_getaffinity(0))
    except OSError:
        return None


def _host_ticks(cpus: frozenset[int] | None = None) -> tuple[int, int] | None:
    """(busy, steal) clock ticks since boot of ``cpus`` (``/proc/stat``'s ``cpuN`` lines),
    or of all CPUs when None; None without /proc. On a machine shared by cpusets (a CI
    pod on a large node) only the CPUs this process may use can slow it: the others'
    load is not contention."""
    try:
        lines = (_PROC / "stat").read_text().splitlines()
    except OSError:
        return None
    rows: list[list[int]] = []
    for line in lines:
        label, _, rest = line.partition(" ")
        if not label.startswith("cpu"):
            break  # the cpu lines come first
        if (label == "cpu") == (cpus is None) and (cpus is None or int(label[3:]) in cpus):
            rows.append([int(x) for x in rest.split()])
    if not rows:
        return None
    busy = sum(r[i] for r in rows for i in _BUSY if i < len(r))
    steal = sum(r[_STEAL] for r in rows if len(r) > _STEAL)
    return busy, steal


def _stat(pid: int) -> tuple[int, int] | None:
    """``(parent pid, CPU ticks)`` of ``pid``, or None once it has exited. The ticks are
    utime + stime of all its threads plus cutime + cstime, what its exited and waited-for
    children used: a rank that ends during a measurement moves its time into its parent's
    count instead of out of the sum."""
    try:
        text = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()  # the name may hold spaces and ')'
    # proc(5) fields 4 (ppid) and 14-17 (utime, stime, cutime, cstime)
    return int(fields[1]), sum(int(fields[i]) for i in (11, 12, 13, 14))


def _tree_ticks(roots: Iterable[int]) -> int:
    """CPU ticks of ``roots`` and of every process descended from them."""
    stats: dict[int, tuple[int, int]] = {}
    try:
        entries = [e.name for e in os.scandir(_PROC) if e.name.isdigit()]
    except OSError:
        entries = []
    for name in entries:
        stat = _stat(int(name))
        if stat is not None:
            stats[int(name)] = stat
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    seen: set[int] = set()
    todo = [pid for pid in roots if pid in stats]
    while todo:
        pid = todo.pop()
        if pid not in seen:
            seen.add(pid)
            todo.extend(children.get(pid, ()))
    return sum(stats[pid][1] for pid in seen)


#: The environment variable that names the session's own process (set by the plugin when
#: pytest starts, in each xdist worker its own): a process it started (a rank, a Ray
#: worker of the session's local cluster) counts the session's whole process tree as the
#: measurement's own (:func:`measuring_root`).
ROOT_ENV = "ACCELPERF_SESSION_PID"


def _ancestors(pid: int) -> list[int]:
    chain: list[int] = []
    while pid > 1 and len(chain) < 64:
        chain.append(pid)
        stat = _stat(pid)
        if stat is None:
            break
        pid = stat[0]
    return chain


def measuring_root() -> int:
    """The process whose tree does a case's work: the session's (:data:`ROOT_ENV`) when it
    is this process or one of its ancestors, else this process (a worker of a cluster
    started elsewhere)."""
    me = os.getpid()
    try:
        root = int(os.environ.get(ROOT_ENV, ""))
    except ValueError:
        return me
    return root if root in _ancestors(me) else me


class Contention:
    """Measure the rest of the machine between :meth:`start` and :meth:`reading`.

    ``pids`` are the processes doing the measured work (the workers, this process); their
    CPU time, and that of every process descended from them, is subtracted. Reading
    ``/proc`` costs a few milliseconds (one pass over its process entries), outside any
    timer.
    """

    def __init__(self, pids: Iterable[int]) -> None:
        self._pids = tuple(dict.fromkeys(pids))
        cpus = usable_cpus()
        # all of the machine's CPUs: the aggregate line; a subset: its own lines
        self._cpus = cpus if cpus is not None and len(cpus) < (os.cpu_count() or 1) else None
        self._cores = len(cpus) if cpus else (os.cpu_count() or 1)
        self._start: tuple[float, tuple[int, int], int] | None = None

    def _own(self) -> int:
        return _tree_ticks(self._pids)

    def start(self) -> Contention:
        host = _host_ticks(self._cpus)
        self._start = None if host is None else (time.monotonic(), host, self._own())
        return self

    def reading(self) -> Load | None:
        """The load since :meth:`start`, or None where ``/proc`` cannot be read."""
        host = _host_ticks(self._cpus)
        if self._start is None or host is None:
            return None
        t0, (busy0, steal0), own0 = self._start
        seconds = time.monotonic() - t0
        if seconds <= 0:
            return None
        per_tick = 1.0 / _ticks()
        own = max(0, self._own() - own0)
        ticks = max(0, host[0] - busy0 - own)
        steal = max(0, host[1] - steal0) * per_tick / seconds
        return Load(foreign_cores=ticks * per_tick / seconds, steal_cores=steal,
                    cores=self._cores, seconds=seconds, foreign_ticks=ticks)


#: Clock ticks of other processes' CPU time that are no evidence of load, whatever the
#: window: ``/proc`` counts CPU time in ticks (10 ms), and one tick in a 20 ms window reads
#: as half a core.
MIN_FOREIGN_TICKS = 2


def contaminated(load: Load | None, bound: float) -> bool:
    """Whether ``load`` is past ``bound`` cores (never, when nothing is known, nor on
    :data:`MIN_FOREIGN_TICKS` ticks of foreign time or less). The ticks are the reading's
    own count; a reading without it has them estimated from its cores and seconds, which
    its JSON rounds (3 decimals: two ticks in 14 ms read back as 2.02), so there it takes
    half a tick more."""
    if load is None or load.foreign_cores <= bound:
        return False
    if load.foreign_ticks is not None:
        return load.foreign_ticks > MIN_FOREIGN_TICKS
    try:
        tick = 1.0 / _ticks()
    except (ValueError, OSError, AttributeError):  # no sysconf (Windows)
        tick = 0.01
    return load.foreign_cores * load.seconds / tick > MIN_FOREIGN_TICKS + 0.5


#: Seconds the confirmation of a regression waits, at most, for a quieter machine.
QUIET_WAIT_S = 5.0
#: The window over which the load is read while waiting.
_QUIET_WINDOW_S = 1.0


def wait_for_quiet(bound: float, *, max_wait: float = QUIET_WAIT_S,
                   pids: Iterable[int] = ()) -> tuple[float, Load | None]:
    """Back off before a re-measurement: read the rest of the machine's load (less this
    process's and ``pids``') in windows of a second until it is within ``bound`` cores or
    ``max_wait`` seconds passed. ``(seconds waited, the last window's load)``; at once
    ``(0.0, None)`` where ``/proc`` cannot be read."""
    waited, load = 0.0, None
    while waited < max_wait:
        contention = Contention([os.getpid(), *pids]).start()
        time.sleep(_QUIET_WINDOW_S)
        load = contention.reading()
        if load is None:
            return waited, None
        waited += load.seconds
        if load.foreign_cores <= bound:
            break
    return waited, load
