"""How long this thread was *blocked*: off the CPU and not waiting for one.

A thread's wall time over an interval is the sum of three parts: the CPU time it used
(``time.thread_time()``), the time it was runnable but waited for a CPU (the run-queue
delay: what another process on the machine costs it), and the time it was not runnable at
all: asleep, reading a file or a socket, waiting on a queue, a lock, another thread or a
``DataLoader``'s workers. The third is this module's figure::

    blocked = wall - CPU - run-queue delay

The CPU time of a batch function does not see a sleep or a slow read (it uses no CPU), and
its wall time moves with the machine's load (the run-queue delay); what is left once both
are taken out is the waiting the code itself asked for. Under 3 spinning processes on 2
cores, a batch function of 150 ms of CPU work measured 150 ms of run-queue delay and 0.0 ms
blocked, the same with a 10 ms sleep added: 10.1 ms blocked.

The run-queue delay is the kernel's scheduler statistics of this thread
(``/proc/thread-self/schedstat``: CPU nanoseconds, run-queue nanoseconds, timeslices;
Linux, ``CONFIG_SCHED_INFO``). Where it is not there (macOS, Windows, a kernel without it,
or one that does not count: no timeslice counted for a thread that has run),
:meth:`BlockedClock.open` gives None and nothing is measured. The statistics are per
thread: a clock is opened, read and closed by the thread it measures.

What waits for another thread or process grows when the machine slows *that* one down
(its run-queue delay is not this thread's), so the check that judges this figure
(:mod:`pytest_accelperf.checks.input_wait`) does not judge it beside another job.
"""

from __future__ import annotations

import os
import time
from types import TracebackType

#: The scheduler statistics of the calling thread.
SCHEDSTAT = "/proc/thread-self/schedstat"


class BlockedClock:
    """This thread's blocked seconds over an interval: :meth:`mark` at its start,
    :meth:`since` at its end. A context manager that closes its file."""

    def __init__(self, fd: int) -> None:
        self._fd = fd

    @classmethod
    def open(cls, path: str = SCHEDSTAT) -> BlockedClock | None:
        """A clock of the calling thread, or None where the kernel does not count its
        run-queue delay."""
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            return None
        clock = cls(fd)
        try:
            _, _, slices = clock._read()
        except (OSError, ValueError):
            clock.close()
            return None
        if slices <= 0:  # this thread has run: a kernel that counts would have counted it
            clock.close()
            return None
        return clock

    def _read(self) -> tuple[int, int, int]:
        cpu, delay, slices = (int(x) for x in os.pread(self._fd, 128, 0).split()[:3])
        return cpu, delay, slices

    def mark(self) -> tuple[float, float, int]:
        """The start of an interval: wall and CPU seconds, run-queue nanoseconds."""
        delay = self._read()[1]
        return time.perf_counter(), time.thread_time(), delay

    def since(self, mark: tuple[float, float, int]) -> float:
        """Seconds this thread was blocked since ``mark`` (never below 0: the three clocks
        are read one after the other)."""
        return self.split(mark)[0]

    def split(self, mark: tuple[float, float, int]) -> tuple[float, float]:
        """Seconds this thread was blocked since ``mark`` (as :meth:`since`), and seconds
        it waited for a CPU (its run-queue delay: what another process, or another thread
        of this one, cost it; the ``input`` check's evidence of company,
        :mod:`pytest_accelperf.checks.input`)."""
        delay = self._read()[1]
        wall, cpu = time.perf_counter() - mark[0], time.thread_time() - mark[1]
        queued = max(0.0, (delay - mark[2]) * 1e-9)
        return max(0.0, wall - cpu - queued), queued

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> BlockedClock:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
