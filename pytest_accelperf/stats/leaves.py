"""One parameter leaf against another: :func:`compare_leaf`, what the numerics and
reference checks and the JAX backend's reference steps compare arrays with."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt


@dataclass(frozen=True)
class LeafDiff:
    """How one parameter leaf compares: its largest absolute difference and mismatches."""

    path: str
    max_abs: float
    mismatched: int
    size: int


def _as_float(x: npt.ArrayLike) -> npt.NDArray[np.float64]:
    return np.array(x, dtype=np.float64, copy=True)


def compare_leaf(path: str, now: npt.ArrayLike, ref: npt.ArrayLike, *, rtol: float,
                 atol: float) -> LeafDiff:
    """Compare two arrays of one leaf (numpy arrays, or a framework's that numpy reads)
    with ``np.isclose(now, ref)`` (``ref`` the reference)."""
    a, b = np.ravel(_as_float(now)), np.ravel(_as_float(ref))
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.abs(a - b)
        close = np.isclose(a, b, rtol=rtol, atol=atol, equal_nan=False)
    # A NaN difference is worse than any number: rank it as infinite, show it as nan.
    max_abs = float(np.max(np.where(np.isnan(diff), np.inf, diff))) if diff.size else 0.0
    if np.isnan(diff).any():
        max_abs = float("nan")
    return LeafDiff(path, max_abs, int(np.count_nonzero(~close)), int(a.size))
