"""Page faults of the calling thread: what the kernel did for memory the thread touched.

A batch function's CPU time (``time.thread_time()``) counts the kernel's work on the
thread's behalf, and the largest part of it is page faults: memory the allocator got fresh
from the kernel (``mmap``) is zeroed and mapped one page at a time, on first touch. Whether
a batch's arrays come fresh from the kernel or from memory the process already has depends
on the process's history, not on the batch function: glibc serves an allocation over its
*dynamic* mmap threshold with ``mmap`` and returns it to the kernel when freed, and the
threshold moves with what the process allocated and freed before (another case of the
session, another framework's buffers). Measured on this project's 2-core machine, one
numpy batch function (32 crops of 224x224x3 to float32, normalized): 10.3 ms of CPU a batch
with its memory reused, 18.6 ms with it mapped afresh (2,006 page faults a batch, 11.4 ms
of system time), the same code both times.

So the ``input`` check reads the faults beside the CPU time (:mod:`pytest_accelperf.checks.input`):
a CPU time that moved together with the thread's page faults moved with the allocator's
state, which is no evidence about the code. The count is the kernel's own
(``getrusage(RUSAGE_THREAD)``: minor and major faults, exact, per thread); where the
platform does not count per thread (macOS, Windows), :func:`thread_faults` gives None and
nothing is measured.
"""

from __future__ import annotations

import resource

_RUSAGE_THREAD: int | None = getattr(resource, "RUSAGE_THREAD", None)


def thread_faults() -> int | None:
    """The calling thread's page faults so far (minor and major), or None where the
    platform does not count them per thread."""
    if _RUSAGE_THREAD is None:
        return None
    try:
        usage = resource.getrusage(_RUSAGE_THREAD)
    except (OSError, ValueError):
        return None
    return usage.ru_minflt + usage.ru_majflt
