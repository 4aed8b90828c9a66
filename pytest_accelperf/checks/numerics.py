"""The numerics checks: trained parameters against the baseline and against a reference.

``numerics`` compares the parameter fingerprint of the block (``block["numerics"]``: per
parameter path ``{"shape", "dtype", "rms", "sample"}``, a few fixed elements and the RMS
of the leaf after training) with the baseline's. A changed structure (a path added or
removed, a new shape or dtype) is a regression; so is any value outside
``np.isclose(now, baseline, rtol=numerics_rtol, atol=numerics_atol)``. It catches a
change in the arithmetic (a new reduction order, a dtype promotion, a different RNG split)
that leaves the loss inside its band.

``reference`` compares the full final parameters with those of a single-device reference
run of the same case, element by element, as ``np.testing.assert_allclose(params,
reference, rtol=reference_rtol, atol=reference_atol)`` would (except that a NaN never
matches). It needs no baseline: sharding must not change what is learned.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from pytest_accelperf.checks.base import CheckResult, Tolerances, Verdict
from pytest_accelperf.checks.outcome import missing_in_baseline, new_result
from pytest_accelperf.units import fmt_num

METRIC = "numerics"
REFERENCE_METRIC = "reference"
UNIT = "max |Δ|"
#: Structural differences listed in a sentence before the rest are counted.
_MAX_LISTED = 5


@dataclass(frozen=True)
class LeafDiff:
    """How one parameter leaf compares: its largest absolute difference and mismatches."""

    path: str
    max_abs: float
    mismatched: int
    size: int


def _as_float(x: Any) -> npt.NDArray[np.float64]:
    return np.array(x, dtype=np.float64, copy=True)


def compare_leaf(path: str, now: Any, ref: Any, *, rtol: float, atol: float) -> LeafDiff:
    """Compare two arrays of one leaf with ``np.isclose(now, ref)`` (``ref`` the reference)."""
    a, b = np.ravel(_as_float(now)), np.ravel(_as_float(ref))
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.abs(a - b)
        close = np.isclose(a, b, rtol=rtol, atol=atol, equal_nan=False)
    # A NaN difference is worse than any number: rank it as infinite, show it as nan.
    max_abs = float(np.max(np.where(np.isnan(diff), np.inf, diff))) if diff.size else 0.0
    if np.isnan(diff).any():
        max_abs = float("nan")
    return LeafDiff(path, max_abs, int(np.count_nonzero(~close)), int(a.size))


def _rank(d: LeafDiff) -> float:
    return float("inf") if np.isnan(d.max_abs) else d.max_abs


def _listed(items: list[str]) -> str:
    text = "; ".join(items[:_MAX_LISTED])
    return text + (f"; and {len(items) - _MAX_LISTED} more" if len(items) > _MAX_LISTED else "")


def _shape_text(shape: Any) -> str:
    return str(tuple(int(n) for n in shape))


def structure_changes(now: Mapping[str, tuple[Any, str]],
                      base: Mapping[str, tuple[Any, str]]) -> list[str]:
    """Added, removed and reshaped (or re-typed) leaves, as phrases, in path order."""
    out: list[str] = []
    for path in sorted(set(now) | set(base)):
        if path not in base:
            shape, dtype = now[path]
            out.append(f"added {path} {_shape_text(shape)} {dtype}")
        elif path not in now:
            shape, dtype = base[path]
            out.append(f"removed {path} {_shape_text(shape)} {dtype}")
        else:
            (s1, t1), (s0, t0) = now[path], base[path]
            if _shape_text(s1) != _shape_text(s0):
                out.append(f"{path} shape {_shape_text(s0)} → {_shape_text(s1)}")
            if str(t1) != str(t0):
                out.append(f"{path} dtype {t0} → {t1}")
    return out


def _fingerprint_values(leaf: Mapping[str, Any]) -> list[float]:
    return [float(x) for x in leaf.get("sample") or []] + [float(leaf.get("rms", np.nan))]


def check_numerics(block: dict[str, Any], baseline: dict[str, Any] | None,
                   tol: Tolerances, *, same_environment: bool = True) -> CheckResult | None:
    """The parameter fingerprint of ``block`` against ``baseline``'s; None without any.

    ``same_environment=False`` (the baseline came from another host CPU or framework
    version) compares at ``numerics_cross_rtol/atol`` instead, and says so: other kernels
    round differently, and a bitwise-tight tolerance would fail every such run.
    """
    rtol, atol = ((tol.numerics_rtol, tol.numerics_atol) if same_environment
                  else (tol.numerics_cross_rtol, tol.numerics_cross_atol))
    now_fp: dict[str, Any] = block.get("numerics") or {}
    base_fp: dict[str, Any] = (baseline or {}).get("numerics") or {}
    if not now_fp and not base_fp:
        return None
    if baseline is None:
        return new_result(METRIC, unit=UNIT, data={"leaves": len(now_fp)})
    if not base_fp:
        return missing_in_baseline(METRIC, "parameter fingerprint", baseline, unit=UNIT)

    result = CheckResult(METRIC, Verdict.PASS, "", unit=UNIT,
                         data={"rtol": rtol, "atol": atol,
                               "leaves": len(now_fp)})
    changes = structure_changes(
        {p: (leaf.get("shape", ()), str(leaf.get("dtype", ""))) for p, leaf in now_fp.items()},
        {p: (leaf.get("shape", ()), str(leaf.get("dtype", ""))) for p, leaf in base_fp.items()},
    )
    if changes:
        result.verdict = Verdict.REGRESSION
        result.detail = f"parameter structure changed: {_listed(changes)}"
        result.data["changes"] = changes
        return result

    diffs: list[LeafDiff] = []
    for path in sorted(now_fp):
        now_v, base_v = _fingerprint_values(now_fp[path]), _fingerprint_values(base_fp[path])
        if len(now_v) != len(base_v):
            result.verdict = Verdict.INCOMPARABLE
            result.detail = (f"the fingerprint of {path} has {len(now_v) - 1} sampled values, "
                             f"the baseline's {len(base_v) - 1}; re-record with "
                             f"--accelperf-update")
            return result
        diffs.append(compare_leaf(path, now_v, base_v, rtol=rtol, atol=atol))
    worst = max(diffs, key=_rank)
    failing = [d for d in diffs if d.mismatched]
    result.now = worst.max_abs
    result.data.update({"max_abs": {d.path: d.max_abs for d in diffs}, "worst": worst.path})
    tols = f"rtol {fmt_num(rtol)}, atol {fmt_num(atol)}"
    if not same_environment:
        tols += ", the cross-environment tolerance: the baseline is from another environment"
    if failing:
        bad = max(failing, key=_rank)
        result.verdict = Verdict.REGRESSION
        result.detail = (f"{bad.path} differs from the baseline fingerprint: max |Δ| = "
                         f"{fmt_num(bad.max_abs)} ({tols}); {len(failing)} of {len(diffs)} "
                         f"leaves differ")
        result.data["failing"] = [d.path for d in failing]
        return result
    result.detail = (f"fingerprints of {len(diffs)} parameter leaves match the baseline "
                     f"(max |Δ| = {fmt_num(worst.max_abs)}, {tols})")
    return result


def check_reference(params: Mapping[str, Any] | None, reference: Mapping[str, Any],
                    tol: Tolerances) -> CheckResult:
    """Final parameters against a single-device reference run's, leaf by leaf."""
    atol, rtol = tol.reference_atol, tol.reference_rtol
    within = f"atol={fmt_num(atol)}" + (f", rtol={fmt_num(rtol)}" if rtol else "")
    result = CheckResult(REFERENCE_METRIC, Verdict.PASS, "", unit=UNIT,
                         data={"atol": atol, "rtol": rtol})
    if not params:
        result.verdict = Verdict.INCONCLUSIVE
        result.detail = "this run returned no parameters to compare with the reference"
        return result
    now_arrays = {p: np.asarray(v) for p, v in params.items()}
    ref_arrays = {p: np.asarray(v) for p, v in reference.items()}
    changes = structure_changes({p: (a.shape, str(a.dtype)) for p, a in now_arrays.items()},
                                {p: (a.shape, str(a.dtype)) for p, a in ref_arrays.items()})
    # A dtype difference alone is not structural here: values are compared as float64.
    changes = [c for c in changes if " dtype " not in c]
    if changes:
        result.verdict = Verdict.REGRESSION
        result.detail = (f"parameter structure differs from the single-device reference: "
                         f"{_listed(changes)}")
        result.data["changes"] = changes
        return result

    diffs = [compare_leaf(p, now_arrays[p], ref_arrays[p], rtol=rtol, atol=atol)
             for p in sorted(now_arrays)]
    worst = max(diffs, key=_rank)
    mismatched = sum(d.mismatched for d in diffs)
    total = sum(d.size for d in diffs)
    result.now = worst.max_abs
    result.data.update({"max_abs": {d.path: d.max_abs for d in diffs}, "worst": worst.path,
                        "mismatched": mismatched, "total": total})
    if mismatched:
        failing = [d for d in diffs if d.mismatched]
        bad = max(failing, key=_rank)
        result.verdict = Verdict.REGRESSION
        result.detail = (f"{bad.path} differs from the single-device reference: max |Δ| = "
                         f"{fmt_num(bad.max_abs)} beyond {within}; {mismatched:,} of "
                         f"{total:,} elements ({mismatched / total:.1%}) mismatched in "
                         f"{len(failing)} of {len(diffs)} leaves")
        return result
    result.detail = (f"parameters match the single-device reference within {within} "
                     f"(max |Δ| = {fmt_num(worst.max_abs)})")
    return result
