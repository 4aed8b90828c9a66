"""Framework-free helpers shared by the backends (importing this imports no ML framework)."""

from __future__ import annotations

import math
import os
import time
from typing import Any

import numpy as np

from pytest_accelperf.units import round_sig

#: Values per leaf sampled into the numerics fingerprint.
N_SAMPLES = 16


def fingerprint(flat: dict[str, np.ndarray]) -> dict[str, Any]:
    """Shape, dtype, RMS and 16 fixed samples per leaf, rounded to 7 significant digits."""
    out: dict[str, Any] = {}
    for key, arr in flat.items():
        values = np.asarray(arr, dtype=np.float64).ravel()
        n, k = values.size, min(N_SAMPLES, values.size)
        rms = float(np.sqrt(np.mean(np.square(values)))) if n else 0.0
        idx = (np.arange(k) * n) // k if k else np.zeros(0, dtype=int)  # evenly strided
        out[key] = {"shape": list(arr.shape), "dtype": str(arr.dtype), "rms": round_sig(rms, 7),
                    "sample": [round_sig(float(v), 7) for v in values[idx]]}
    return out


#: Fault injection, for measuring the gate itself (``benchmarks/gate.py``): every measured
#: step is made longer by this fraction (``0.05``: 5 % slower), by spinning on the CPU
#: inside the step's timer, so a benchmark can ask "would the gate have caught this?".
INJECT_ENV = "ACCELPERF_INJECT_SLOWDOWN"


def injected_slowdown() -> float:
    """The fraction set in ``ACCELPERF_INJECT_SLOWDOWN`` (0 when unset).

    >>> os.environ[INJECT_ENV] = "0.05"; injected_slowdown(); del os.environ[INJECT_ENV]
    0.05
    """
    value = os.environ.get(INJECT_ENV, "").strip()
    if not value:
        return 0.0
    try:
        fraction = float(value)
    except ValueError:
        fraction = math.nan
    if not (math.isfinite(fraction) and 0 <= fraction <= 10):
        raise ValueError(f"{INJECT_ENV}={value!r}: expected a fraction between 0 and 10, "
                         f"e.g. 0.05 for steps 5 % slower; unset it to measure normally")
    return fraction


def stretch(t0: float, t1: float, fraction: float) -> float:
    """Spin until a step that ran from ``t0`` to ``t1`` has taken ``1 + fraction`` times
    as long; returns the new end time (``t1`` itself when ``fraction`` is 0)."""
    if fraction <= 0:
        return t1
    end = t0 + (t1 - t0) * (1 + fraction)
    now = time.perf_counter()
    while now < end:
        now = time.perf_counter()
    return now
