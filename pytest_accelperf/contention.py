"""How much of the machine other processes used while a step time was measured.

A step time measured while another job shared the cores is contaminated, and pairing the
two revisions of A/B mode in alternation does not cancel it: a competing process slows the
two worker processes unequally and for minutes at a time (on this project's 2-core machine
one spinning competitor moved the ratio of two *identical* trees between 0.85 and 1.18
with 95 % intervals that excluded 1). The plugin's own evidence of that is the CPU time the
rest of the machine used during the measurement, read from ``/proc``: the busy time of all
CPUs (``/proc/stat``) less what the measuring processes themselves used
(``/proc/<pid>/stat``, all threads), in cores on average, plus the time the hypervisor
took (steal). Past ``--accelperf-max-foreign-load`` the throughput verdict is
``inconclusive`` with that reason: the measurement is reported, not judged.

Where there is no ``/proc`` (macOS, Windows) nothing is known and nothing is judged from
it: :meth:`Contention.reading` is ``None`` and the verdict stands as measured.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
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

    def to_json(self) -> dict[str, float | int]:
        return {"foreign_cores": round(self.foreign_cores, 3),
                "steal_cores": round(self.steal_cores, 3), "cores": self.cores,
                "seconds": round(self.seconds, 3)}

    def text(self) -> str:
        steal = (f", {self.steal_cores:.2f} of it stolen by the hypervisor"
                 if self.steal_cores >= 0.01 else "")
        return (f"other processes used {self.foreign_cores:.2f} of {self.cores} cores on "
                f"average during the {self.seconds:.1f} s of measurement{steal}")


def _ticks() -> float:
    return float(os.sysconf("SC_CLK_TCK"))


def _host_ticks() -> tuple[int, int] | None:
    """(busy, steal) clock ticks of all CPUs since boot, or None without /proc."""
    try:
        line = (_PROC / "stat").read_text().splitlines()[0]
    except (OSError, IndexError):
        return None
    fields = [int(x) for x in line.split()[1:]]
    busy = sum(fields[i] for i in _BUSY if i < len(fields))
    steal = fields[_STEAL] if len(fields) > _STEAL else 0
    return busy, steal


def _process_ticks(pid: int) -> int:
    """utime + stime of every thread of ``pid`` (0 once it has exited)."""
    try:
        text = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return 0
    fields = text[text.rindex(")") + 2:].split()  # the name may hold spaces and ')'
    return int(fields[11]) + int(fields[12])  # fields 14 and 15 of proc(5)


class Contention:
    """Measure the rest of the machine between :meth:`start` and :meth:`reading`.

    ``pids`` are the processes doing the measured work (the workers, this process); their
    CPU time is subtracted. Reading ``/proc`` costs some microseconds, outside any timer.
    """

    def __init__(self, pids: Iterable[int]) -> None:
        self._pids = tuple(dict.fromkeys(pids))
        self._start: tuple[float, tuple[int, int], int] | None = None

    def _own(self) -> int:
        return sum(_process_ticks(pid) for pid in self._pids)

    def start(self) -> Contention:
        host = _host_ticks()
        self._start = None if host is None else (time.monotonic(), host, self._own())
        return self

    def reading(self) -> Load | None:
        """The load since :meth:`start`, or None where ``/proc`` cannot be read."""
        host = _host_ticks()
        if self._start is None or host is None:
            return None
        t0, (busy0, steal0), own0 = self._start
        seconds = time.monotonic() - t0
        if seconds <= 0:
            return None
        per_tick = 1.0 / _ticks()
        own = max(0, self._own() - own0)
        foreign = max(0, host[0] - busy0 - own) * per_tick / seconds
        steal = max(0, host[1] - steal0) * per_tick / seconds
        return Load(foreign_cores=foreign, steal_cores=steal, cores=os.cpu_count() or 1,
                    seconds=seconds)


def contaminated(load: Load | None, bound: float) -> bool:
    """Whether ``load`` is past ``bound`` cores (never, when nothing is known)."""
    return load is not None and load.foreign_cores > bound


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
