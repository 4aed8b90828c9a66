#!/usr/bin/env python
"""How long the three change-point libraries issue 27 names take on a series of 100
sessions, and what each proposes on 20 flat ones.

20 series with a 5 % step at session 60 and 20 flat ones, noise 2 % of the level
(Gaussian: a timing of the libraries, not a test of their quality; ``changes.py``
measures that over recorded noise). Apache Otava and MongoDB's library pin numpy versions
that conflict with JAX's (``numpy==2.2.*``; ``numpy<2``), so each runs in a venv of its
own::

    python -m venv /tmp/v1 && /tmp/v1/bin/pip install apache-otava==0.8.0
    /tmp/v1/bin/python benchmarks/changes_libraries.py otava
    python -m venv /tmp/v2 && /tmp/v2/bin/pip install signal-processing-algorithms==2.1.6
    /tmp/v2/bin/python benchmarks/changes_libraries.py spa
    python benchmarks/changes_libraries.py ruptures      # the project's venv

Each line: the time per series, the change points found in the first 3 stepped series,
and how many were proposed over the 20 flat ones (ruptures: before any significance test;
it has none).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from importlib.metadata import version
from typing import Any

import numpy as np

rng = np.random.default_rng(0)
PACKAGES = {"otava": "apache-otava", "spa": "signal-processing-algorithms",
            "ruptures": "ruptures"}


def series(step: float = 0.05, n: int = 100, at: int = 60, cv: float = 0.02) -> Any:
    x = 1.0 + rng.standard_normal(n) * cv
    x[at:] *= 1 + step
    return x


STEPPED = [series() for _ in range(20)]
FLAT = [series(step=0.0) for _ in range(20)]


def bench(name: str, fn: Callable[[Any], list[int]]) -> None:
    fn(STEPPED[0])
    t = time.perf_counter()
    found = [fn(s) for s in STEPPED]
    per = (time.perf_counter() - t) / len(STEPPED)
    flat = sum(len(fn(s)) for s in FLAT)
    shown = [[int(i) for i in f] for f in found[:3]]
    print(f"{name:58s} {per * 1e3:7.2f} ms/series  stepped: {shown}  flat: {flat} over 20")


def pen(s: Any) -> float:
    sigma = float(np.median(np.abs(np.diff(s)))) / 0.6745 / np.sqrt(2)
    return float(2 * np.log(len(s)) * sigma**2)


def main(which: str) -> None:
    print(PACKAGES[which], version(PACKAGES[which]), "numpy", np.__version__)
    if which == "otava":
        from otava.analysis import (  # type: ignore[import-not-found]
            compute_change_points,
            compute_change_points_orig,
        )

        # lists: an ndarray raised ValueError in compute_change_points (0.8.0)
        bench("otava compute_change_points (window 50, p 0.001)",
              lambda s: [c.index for c in compute_change_points(
                  list(s), window_len=50, max_pvalue=0.001)[0]])
        bench("otava compute_change_points (window 30, p 0.01)",
              lambda s: [c.index for c in compute_change_points(
                  list(s), window_len=30, max_pvalue=0.01)[0]])
        bench("otava compute_change_points_orig (E-divisive, 100 perms)",
              lambda s: [c.index for c in compute_change_points_orig(
                  list(s), max_pvalue=0.01, seed=1)[0]])
    elif which == "spa":
        from signal_processing_algorithms.energy_statistics.energy_statistics import (  # type: ignore[import-not-found]
            e_divisive,
        )

        np.random.seed(1)  # its permutations draw from numpy's global generator
        bench("SPA e_divisive (p 0.01, 100 perms)",
              lambda s: list(e_divisive(s, pvalue=0.01, permutations=100)))
    else:
        import ruptures as rpt

        bench("ruptures Pelt l2 (min_size 3, BIC penalty)",
              lambda s: rpt.Pelt(model="l2", min_size=3, jump=1).fit(s).predict(
                  pen=pen(s))[:-1])
        bench("ruptures Binseg l2 (BIC penalty)",
              lambda s: rpt.Binseg(model="l2", min_size=3, jump=1).fit(s).predict(
                  pen=pen(s))[:-1])
        bench("ruptures KernelCPD linear (compiled, BIC penalty)",
              lambda s: rpt.KernelCPD(kernel="linear", min_size=3).fit(s).predict(
                  pen=pen(s))[:-1])


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "ruptures")
