"""Framework-free helpers shared by the backends (importing this imports no ML framework)."""

from __future__ import annotations

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
