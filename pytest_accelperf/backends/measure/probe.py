"""The reference workload timed after every measured step, to cancel machine drift (after
every k-th in a run of more than ``loop.MAX_PROBES`` measured steps).

On a shared machine the same step takes 20-50 % longer in one process than in another
because something else is using the cores, the memory bus or the clock. Comparing a step
time with one recorded hours earlier compares two machines. So after each measured step,
outside its timer, the backend runs a *probe*: a fixed matrix product in the same framework,
on the same device, with the same threads, synchronized like the step. The probe's time is
what the machine gave at that moment; the throughput check compares ``step / probe``
(:mod:`pytest_accelperf.stats.bootstrap`), so a slowdown that hits both cancels, and a slowdown of
the step alone (a regression) does not.

A probe is identified by its ``kind`` string (framework, size, repetitions): ratios are
only compared between runs whose probes are of the same kind.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

#: Side of the square float32 matrices multiplied; 2 * N**3 FLOPs per product.
PROBE_N = 256
#: Products per probe. About 1-3 ms on two desktop cores: small next to a training step,
#: large next to the timer's resolution.
PROBE_REPS = 8


@dataclass(frozen=True)
class Probe:
    """A timed reference workload: ``run()`` does the work and returns when it is done."""

    kind: str
    run: Callable[[], None]

    def time(self) -> float:
        """Seconds one probe takes now."""
        t0 = time.perf_counter()
        self.run()
        return time.perf_counter() - t0


def numpy_probe(n: int = PROBE_N, reps: int = PROBE_REPS) -> Probe:
    """A framework-neutral probe: ``reps`` float32 products of ``n x n`` matrices in numpy."""
    import numpy as np

    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)

    def run() -> None:
        x = a
        for _ in range(reps):
            x = np.tanh(x @ b)

    return Probe(f"numpy-matmul{n}x{reps}", run)
