"""The input check's yardstick: how fast the thread that makes the batch computes right now.

A batch function's CPU time (``time.thread_time()``) is not the code's alone: on a shared
machine a virtual CPU shares its core's caches, its memory bandwidth and, on some
hypervisors, its stolen time with other work, and the same code takes more CPU time. The
drift probe (:mod:`.probe`) measures the machine's speed for the *step*, in wall time, on
the framework's device. This is its counterpart for the *input*: a fixed piece of host work
of the kind batch functions do (numpy arithmetic on an array that fits a core's cache, and a
Python loop), timed by the same clock as the batch (this thread's CPU time), in the same
thread, right after a measured step's batch was made (at most 10 a run, evenly spread:
:func:`pytest_accelperf.backends.measure.loop.yardstick_every`) and outside every timer.

The ``input`` check compares input CPU times relative to it
(:mod:`pytest_accelperf.checks.input`): the ratio of the two runs' input medians divided by
the ratio of their yardsticks' medians. So a machine that slowed this thread's computing as a
whole cancels, and a batch function that got slower does not. What it cannot see is work the
kernel does for the batch's memory (page faults:
:mod:`pytest_accelperf.backends.measure.faults`), which the check weighs apart. About
0.3 ms of CPU time each.
"""

from __future__ import annotations

import time

import numpy as np

#: Elements of the yardstick's array (160 KB of float64: a core's L2 cache holds it).
_N = 20_000
#: Passes of numpy arithmetic over it, and iterations of the Python loop.
_PASSES = 4
_LOOP = 800
#: What the yardstick is, stored beside its times: only yardsticks of one kind compare.
KIND = f"numpy{_N}x{_PASSES}+py{_LOOP}"

_ARRAY = np.linspace(0.0, 1.0, _N)


def yardstick() -> float:
    """CPU seconds of this thread doing the fixed work once."""
    c0 = time.thread_time()
    x = _ARRAY
    for _ in range(_PASSES):
        x = x * 1.000001 + 0.5
    total = float(x.sum())
    for k in range(_LOOP):
        total += k * 0.5
    return time.thread_time() - c0 if total == total else 0.0  # total read: not optimized out
