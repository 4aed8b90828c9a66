"""The numerics checks: trained parameters against the baseline and against a reference.

``numerics`` compares the parameter fingerprint of the block (``block["numerics"]``) with
the baseline's. A run's fingerprint has, per parameter path, ``{"shape", "dtype", "rms",
"sample", "sketch"}`` (:func:`pytest_accelperf.backends.measure.common.fingerprint`), and the same
for each leaf of the training state beside the parameters (running statistics, step
counters, a loss scale), marked ``"state": true``; the store keeps its compact form
(:func:`compact`): one number per leaf in path order, ``rms * exp(sketch / 4)``, a hash of
the leaves' paths, shapes and dtypes, and a 2-hex-digit tag per leaf, for the parameters
and, apart, for the state (``"state"``). A baseline recorded before the state was
fingerprinted has no state: its parameters are compared as before and the run's state
leaves are named as new. A changed structure (a path added or removed, a new shape or dtype) is a
regression; so is any value outside ``np.isclose(now, baseline, rtol=numerics_rtol,
atol=numerics_atol)``. It catches a change in the arithmetic (a new reduction order, a dtype
promotion, a different RNG split) that leaves the loss inside its band, and names the leaf.
A baseline recorded before the compact form (RMS and 16 samples per leaf) is compared with
this run's RMS and samples, as it was then.

``reference`` compares the full parameters with those of a single-device reference run of
the same case, element by element, as ``np.testing.assert_allclose(params, reference,
rtol=reference_rtol, atol=reference_atol)`` would (except that a NaN never matches). It
needs no baseline: sharding must not change what is learned. Where the backend gives a
:class:`ReferenceParams` with ``compared`` (the JAX backend), the two compared are the
sharded program's and the single-device program's parameters (and the state beside them)
after the same few steps (``Case.reference_steps``, default 1, or more until the parameters
moved: where they never moved beyond the tolerance, ``ReferenceParams.initial`` shows it and
the check is ``inconclusive``, since a program that updated nothing would pass) from the
same initial state and batches: rounding
differences between two correct programs grow with every step of training (a correct
data-parallel CNN: 5.2e-6 after 2 steps, 1.27e-2 after 32, beyond the seed's 5e-3), while
a sharding bug (statistics over one shard, a missing gradient reduction) shows from the
first step. Otherwise the run's final parameters are compared.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import replace
from typing import Any, SupportsInt

import numpy as np

from pytest_accelperf.checks.base import BaseCheck
from pytest_accelperf.checks.outcome import missing_in_baseline, new_result
from pytest_accelperf.checks.protocol import CheckInput, one, stepped
from pytest_accelperf.records.fingerprint import (
    STATE,
    TAG_HEX,
    CompactFingerprint,
    CompactSection,
    FingerprintError,
    LeafFingerprint,
    compact_section,
    compactable,
    fingerprint_leaves,
    finite,
    is_compact,
    split_state,
)
from pytest_accelperf.records.reference import ReferenceParams
from pytest_accelperf.records.run import Run
from pytest_accelperf.records.verdict import CheckData, CheckResult, Tolerances, Verdict
from pytest_accelperf.stats.leaves import LeafDiff, compare_leaf
from pytest_accelperf.stats.units import fmt_num, fmt_percent
from pytest_accelperf.store.block import Block, BlockLike, json_of, read_block

METRIC = "numerics"
REFERENCE_METRIC = "reference"
UNIT = "max |Δ|"
#: Structural differences listed in a sentence before the rest are counted.
_MAX_LISTED = 5


def _rank(d: LeafDiff) -> float:
    return float("inf") if np.isnan(d.max_abs) else d.max_abs


def _listed(items: list[str]) -> str:
    text = "; ".join(items[:_MAX_LISTED])
    return text + (f"; and {len(items) - _MAX_LISTED} more" if len(items) > _MAX_LISTED else "")


def _shape_text(shape: Iterable[SupportsInt]) -> str:
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


def _leaf_count(numerics: Mapping[str, Any]) -> int:
    try:
        return len(fingerprint_leaves(numerics))
    except FingerprintError:
        return len(numerics)


def _tags(text: str) -> list[str]:
    return [text[i:i + TAG_HEX] for i in range(0, len(text), TAG_HEX)]


def _tag_changes(now: CompactSection, names: list[str] | None,
                 leaves: Mapping[str, LeafFingerprint], base: CompactSection) -> list[str]:
    """The structure differences of a compact ``now`` from a compact ``base``, named by
    ``names`` (the run's leaves in path order) where they are known."""
    def leaf(j: int) -> str:
        if names is None:
            return f"leaf {j + 1}"
        info = leaves[names[j]]
        return f"{names[j]} {_shape_text(info.get('shape', ()))} {info.get('dtype', '')}"

    def where(j: int) -> str:
        if names is None:
            return f"before leaf {j + 1}" if j < len(now["sketch"]) else "at the end"
        before = f"after {names[j - 1]}" if j > 0 else "first"
        after = f"before {names[j]}" if j < len(names) else "last"
        return f"{before}, {after}" if 0 < j < len(names) else (after if j else before)

    out: list[str] = []
    ops = difflib.SequenceMatcher(a=_tags(str(base.get("tags", ""))),
                                  b=_tags(str(now.get("tags", ""))),
                                  autojunk=False).get_opcodes()
    for op, i1, i2, j1, j2 in ops:
        if op == "equal":
            continue
        if op == "replace" and i2 - i1 == j2 - j1:
            out.extend(f"{leaf(j)}: name, shape or dtype changed" for j in range(j1, j2))
            continue
        out.extend(f"added {leaf(j)}" for j in range(j1, j2))
        if i2 > i1:
            n = i2 - i1
            out.append(f"removed {n} lea{'f' if n == 1 else 'ves'} ({where(j1)})")
    if not out:
        out.append(f"the structure hash is {now.get('structure')}, the baseline's "
                   f"{base.get('structure')}, and no leaf can be told apart by its tag")
    return out


def _check_compact(result: CheckResult, now_fp: Mapping[str, Any], base: CompactFingerprint,
                   rtol: Callable[[str], float], atol: float, tols: str) -> CheckResult:
    """``now_fp`` (per leaf, or compact) against a compact baseline fingerprint, section by
    section: the parameters, then the state beside them; ``rtol`` per leaf path."""
    names: dict[str, list[str] | None] = {"params": None, STATE: None}
    leaves: Mapping[str, LeafFingerprint] = {}
    now: dict[str, CompactSection | None]
    if is_compact(now_fp):
        now = {"params": now_fp, STATE: now_fp.get("state")}
    elif compactable(now_fp):
        params, state = split_state(now_fp)
        now = {"params": compact_section(params),
               STATE: compact_section(state) if state else None}
        names, leaves = {"params": sorted(params), STATE: sorted(state)}, now_fp
    else:
        return replace(result, verdict=Verdict.INCOMPARABLE, detail=(
            "the baseline's fingerprint is the compact one (a sketch per leaf), "
            "this run's has no sketch to compare with it; re-record with "
            "--accelperf-update"))
    then: dict[str, CompactSection | None] = {"params": base, STATE: base.get("state")}
    changed: dict[str, list[str]] = {}
    diffs: list[LeafDiff] = []
    new: list[str] = []
    n_state = 0
    for key in ("params", STATE):
        section, recorded = now[key], then[key]
        if section is None and recorded is None:
            continue
        if recorded is None:  # a baseline recorded before the state was fingerprinted
            n_new = len(section["sketch"]) if section is not None else 0
            new = names[key] or [f"{n_new} state leaves"]
            continue
        if section is None:
            n = len(recorded["sketch"])
            changed[key] = [f"removed the {n} state lea{'f' if n == 1 else 'ves'} beside "
                            f"the parameters that the baseline fingerprints"]
            continue
        if (section["structure"] != recorded["structure"]
                or len(section["sketch"]) != len(recorded["sketch"])):
            changed[key] = _tag_changes(section, names[key], leaves, recorded)
            continue
        n = len(section["sketch"])
        what = "leaf" if key == "params" else "state leaf"
        paths = names[key] or [f"{what} {i + 1} of {n}" for i in range(n)]
        diffs.extend(compare_leaf(p, [a], [b], rtol=rtol(p), atol=atol)
                     for p, a, b in zip(paths, section["sketch"], recorded["sketch"],
                                        strict=True))
        n_state += n if key == STATE else 0
    if changed:
        return _structure_changed(result, changed)
    return _verdict(result, diffs, tols, n_state=n_state, new=new)


def _structure_changed(result: CheckResult, changed: Mapping[str, list[str]]) -> CheckResult:
    """A regression listing what changed of the parameters' structure (``changed["params"]``)
    and of the state's (``changed["state"]``)."""
    which = " and ".join(w for k, w in (("params", "parameter"), (STATE, "state")) if k in changed)
    changes = [c for key in ("params", STATE) for c in changed.get(key, [])]
    return replace(result, verdict=Verdict.REGRESSION,
                   detail=f"{which} structure changed: {_listed(changes)}",
                   data={**result.data, "changes": changes})


def _verdict(result: CheckResult, diffs: list[LeafDiff], tols: str, *, n_state: int = 0,
             new: list[str] | None = None) -> CheckResult:
    """The verdict of ``diffs`` (the last ``n_state`` of them state leaves); ``new``: the
    run's state leaves that a baseline recorded before the state was fingerprinted has
    not, named in the detail and left uncompared."""
    note = ""
    data = result.data.copy()
    if new:
        data["new"] = list(new)
        note = (f"; new, not compared: {_listed(new)} (the state beside the parameters, which "
                f"the baseline, recorded before the plugin fingerprinted it, lacks: "
                f"--accelperf-update records it)")
    if not diffs:
        return replace(result, data=data, detail="no parameter leaves to compare" + note)
    worst = max(diffs, key=_rank)
    failing = [d for d in diffs if d.mismatched]
    data.update({"max_abs": {d.path: d.max_abs for d in diffs}, "worst": worst.path})
    if failing:
        bad = max(failing, key=_rank)
        return replace(result, verdict=Verdict.REGRESSION, now=worst.max_abs,
                       data={**data, "failing": [d.path for d in failing]},
                       detail=(f"{bad.path} differs from the baseline fingerprint: max "
                               f"|Δ| = {fmt_num(bad.max_abs)} ({tols}); {len(failing)} of "
                               f"{len(diffs)} leaves differ{note}"))
    n_params = len(diffs) - n_state
    counted = (f"{n_params} parameter leaves" if not n_state
               else f"{n_params} parameter and {n_state} state leaves")
    return replace(result, now=worst.max_abs, data=data, detail=(
        f"fingerprints of {counted} match the baseline "
        f"(max |Δ| = {fmt_num(worst.max_abs)}, {tols}){note}"))


#: A run is compared with its baseline at a relative tolerance of at least this many times
#: the spread of a replay (``numerics_spread``, the largest ``||run - replay|| / ||run||``
#: of a leaf, where the platform does not repeat its arithmetic exactly: a GPU's atomic
#: reductions). Two runs of unchanged code differ by about the spread; a leaf's stored
#: number (its RMS and a projection on a fixed direction) moves by at most about
#: ``(1 + |N(0, 1)| / 4)`` times a leaf's relative difference.
SPREAD_FACTOR = 10


def _spread(*blocks: Block | None) -> dict[str, float]:
    """Per leaf, the larger replay spread of the blocks (``numerics_spread``)."""
    out: dict[str, float] = {}
    for block in blocks:
        value: Any = block.numerics_spread if block is not None else None
        for path, d in (value.items() if isinstance(value, Mapping) else ()):
            if finite(d):
                out[path] = max(out.get(path, 0.0), float(d))
    return out


def check_numerics(block: BlockLike, baseline: BlockLike | None,
                   tol: Tolerances, *, same_environment: bool = True) -> CheckResult | None:
    """The parameter fingerprint of ``block`` against ``baseline``'s; None without any.

    Where the platform does not repeat its arithmetic exactly (``numerics_spread`` in
    the block or the baseline: how far a replay of the same steps moved the fingerprint,
    on a GPU), the relative tolerance of each leaf that moved is at least
    :data:`SPREAD_FACTOR` times its larger spread (a relative difference), and the detail
    says so.

    ``same_environment=False`` (the baseline came from another host CPU or framework
    version) compares at ``numerics_cross_rtol/atol`` instead, and says so: other kernels
    round differently, and a bitwise-tight tolerance would fail every such run.

    A compact baseline (``{"sketch", "structure", "tags"}``, what the store writes) is
    compared with the compact form of this run's fingerprint, one sketch value per leaf,
    named by this run's leaf paths. A per-leaf baseline (recorded before the compact form)
    is compared as it always was: its RMS and 16 samples per leaf, which this run still
    computes.
    """
    rtol, atol = ((tol.numerics_rtol, tol.numerics_atol) if same_environment
                  else (tol.numerics_cross_rtol, tol.numerics_cross_atol))
    block, baseline = read_block(block), read_block(baseline)
    # The fingerprints as JSON, what the fingerprint's functions here (and the store's
    # compaction, pytest_accelperf.store.baselines) read.
    now_fp: Mapping[str, Any] = json_of(block.numerics) or {}
    base_fp: Mapping[str, Any] = (
        json_of(baseline.numerics if baseline is not None else None) or {})
    if not now_fp and not base_fp:
        return None
    if baseline is None:
        return new_result(METRIC, unit=UNIT, data={"leaves": _leaf_count(now_fp)})
    if not base_fp:
        return missing_in_baseline(METRIC, "parameter fingerprint", baseline, unit=UNIT)

    spread = _spread(block, baseline)
    data: CheckData = {"rtol": rtol, "atol": atol,
                            "leaves": _leaf_count(now_fp) if now_fp else 0}
    tols = f"rtol {fmt_num(rtol)}, atol {fmt_num(atol)}"
    loosened = {p: SPREAD_FACTOR * d for p, d in spread.items() if SPREAD_FACTOR * d > rtol}
    if loosened:
        data["spread"] = spread
        worst = max(spread, key=spread.__getitem__)
        tols += (f"; rtol {SPREAD_FACTOR}x this platform's own spread for the "
                 f"{len(loosened)} lea{'f' if len(loosened) == 1 else 'ves'} a replay of the "
                 f"same steps moved (up to {fmt_percent(spread[worst])} of {worst}'s norm): "
                 f"finer changes of them cannot be told from it")
    base_rtol = rtol

    def rtol_of(path: str) -> float:
        return loosened.get(path, base_rtol)
    if not same_environment:
        tols += ", the cross-environment tolerance: the baseline is from another environment"
    if is_compact(base_fp):
        result = CheckResult(METRIC, Verdict.PASS, "", unit=UNIT,
                             data={**data, "format": "compact"})
        return _check_compact(result, now_fp, base_fp, rtol_of, atol, tols)
    result = CheckResult(METRIC, Verdict.PASS, "", unit=UNIT, data=data)
    if is_compact(now_fp):
        return replace(result, verdict=Verdict.INCOMPARABLE, detail=(
            "the baseline's fingerprint is per leaf (RMS and samples), this "
            "run's is the compact one; re-record with --accelperf-update"))

    # Per leaf (recorded before the compact form, and so before the state was
    # fingerprinted): the run's state leaves are new unless the baseline has some.
    (now_params, now_state), (base_params, base_state) = split_state(now_fp), \
        split_state(base_fp)
    new = sorted(now_state) if now_state and not base_state else []
    sections = [("params", now_params, base_params)]
    if not new:
        sections.append((STATE, now_state, base_state))
    changed: dict[str, list[str]] = {}
    for key, now_s, base_s in sections:
        changes = structure_changes(
            {p: (leaf.get("shape", ()), str(leaf.get("dtype", ""))) for p, leaf in now_s.items()},
            {p: (leaf.get("shape", ()), str(leaf.get("dtype", ""))) for p, leaf in base_s.items()})
        if changes:
            changed[key] = changes
    if changed:
        return _structure_changed(result, changed)

    diffs: list[LeafDiff] = []
    for _, now_s, base_s in sections:
        for path in sorted(now_s):
            try:
                now_v, base_v = (list(fingerprint_leaves({path: s[path]})[0].values)
                                 for s in (now_s, base_s))
            except FingerprintError as exc:
                return replace(result, verdict=Verdict.INCOMPARABLE, detail=(
                    f"a fingerprint cannot be read: {exc}; re-record with "
                    f"--accelperf-update"))
            if len(now_v) != len(base_v):
                return replace(result, verdict=Verdict.INCOMPARABLE, detail=(
                    f"the fingerprint of {path} has {len(now_v) - 1} sampled "
                    f"values, the baseline's {len(base_v) - 1}; re-record with "
                    f"--accelperf-update"))
            diffs.append(compare_leaf(path, now_v, base_v, rtol=rtol_of(path), atol=atol))
    return _verdict(result, diffs, tols, n_state=0 if new else len(now_state), new=new)


def _steps_text(steps: int) -> str:
    return f"{steps} step" if steps == 1 else f"{steps} steps"


def check_reference(params: Mapping[str, np.ndarray] | None,
                    reference: Mapping[str, np.ndarray],
                    tol: Tolerances) -> CheckResult:
    """Parameters against a single-device reference run's, leaf by leaf: the run's after
    ``reference.steps`` steps when ``reference`` is a :class:`ReferenceParams` that carries
    them (``compared``), else its final ``params``."""
    atol, rtol = tol.reference_atol, tol.reference_rtol
    within = f"atol={fmt_num(atol)}" + (f", rtol={fmt_num(rtol)}" if rtol else "")
    data: CheckData = {"atol": atol, "rtol": rtol}
    steps: int | None = None
    what = "parameters"  # what is compared, for the detail
    if isinstance(reference, ReferenceParams) and reference.compared is not None:
        params, steps = reference.compared, reference.steps
        if steps is not None:
            data["steps"] = steps
            on = f" on the {reference.mesh} mesh" if reference.mesh else ""
            what = f"parameters after {_steps_text(steps)}{on}"
    result = CheckResult(REFERENCE_METRIC, Verdict.PASS, "", unit=UNIT, data=data)
    if not params:
        return replace(result, verdict=Verdict.INCONCLUSIVE,
                       detail="this run returned no parameters to compare with the reference")
    now_arrays = {p: np.asarray(v) for p, v in params.items()}
    ref_arrays = {p: np.asarray(v) for p, v in reference.items()}
    changes = structure_changes({p: (a.shape, str(a.dtype)) for p, a in now_arrays.items()},
                                {p: (a.shape, str(a.dtype)) for p, a in ref_arrays.items()})
    # A dtype difference alone is not structural here: values are compared as float64.
    changes = [c for c in changes if " dtype " not in c]
    if changes:
        return replace(result, verdict=Verdict.REGRESSION,
                       data={**data, "changes": changes},
                       detail=(f"parameter structure differs from the single-device "
                               f"reference: {_listed(changes)}"))

    diffs = [compare_leaf(p, now_arrays[p], ref_arrays[p], rtol=rtol, atol=atol)
             for p in sorted(now_arrays)]
    worst = max(diffs, key=_rank)
    mismatched = sum(d.mismatched for d in diffs)
    total = sum(d.size for d in diffs)
    data = {**data, "max_abs": {d.path: d.max_abs for d in diffs}, "worst": worst.path,
            "mismatched": mismatched, "total": total}
    result = replace(result, now=worst.max_abs, data=data)
    if mismatched:
        failing = [d for d in diffs if d.mismatched]
        bad = max(failing, key=_rank)
        after = f" after {_steps_text(steps)}" if steps is not None else ""
        return replace(result, verdict=Verdict.REGRESSION, detail=(
            f"{bad.path} differs from the single-device reference{after}: max "
            f"|Δ| = {fmt_num(bad.max_abs)} beyond {within}; {mismatched:,} of "
            f"{total:,} elements ({mismatched / total:.1%}) mismatched in "
            f"{len(failing)} of {len(diffs)} leaves{_growth(steps, reference)}"))
    unmoved = _unmoved(reference, rtol=rtol, atol=atol)
    if unmoved is not None:
        n = len(unmoved)
        largest = max(unmoved, key=_rank)
        taken = _steps_text(steps) if steps is not None else "the run"
        return replace(result, verdict=Verdict.INCONCLUSIVE,
                       data={**data, "moved": largest.max_abs}, detail=(
            f"the parameters did not move beyond {within} in {taken} "
            f"(largest move {fmt_num(largest.max_abs)} in {largest.path}, of "
            f"{n} parameter lea{'f' if n == 1 else 'ves'}; learning rate 0 at "
            f"the start of the schedule?), so a program that updated nothing "
            f"would match the reference: raise reference_steps past the "
            f"warm-up"))
    return replace(result, detail=(f"{what} match the single-device reference within {within} "
                                   f"(largest |Δ| {fmt_num(worst.max_abs)} in {worst.path})"
                                   f"{_growth(steps, reference)}"))


def _unmoved(reference: Mapping[str, np.ndarray], *, rtol: float,
             atol: float) -> list[LeafDiff] | None:
    """How far each parameter of ``reference`` moved from where it started
    (``ReferenceParams.initial``), when none moved beyond the tolerance: then a program
    that updated nothing would pass the check. None when one did, or when the start is not
    known (the state beside the parameters is left out: a step counter always moves)."""
    initial = getattr(reference, "initial", None)
    if not initial:
        return None
    state: Collection[str] = getattr(reference, "state", frozenset())
    moves = [compare_leaf(p, initial[p], reference[p], rtol=rtol, atol=atol)
             for p in sorted(initial) if p in reference and p not in state]
    if not moves or any(d.mismatched for d in moves):
        return None
    return moves


def _growth(steps: int | None, reference: Mapping[str, np.ndarray]) -> str:
    """What a comparison after more than one step adds to the detail: why that many (the
    case's ``reference_steps``, or the first step after which the parameters had moved,
    when that was later: ``ReferenceParams.least``)."""
    if steps is None or steps <= 1:
        return ""
    least = getattr(reference, "least", None)
    why = ("reference_steps" if least is None or steps <= least else
           f"the first after which the parameters had moved beyond the tolerance; "
           f"reference_steps {least}")
    return (f"; compared after {steps} steps ({why}): rounding differences between "
            f"the two programs grow with every step")


class NumericsCheck(BaseCheck):
    """The ``numerics`` row: the parameter fingerprint, at the cross-environment tolerance
    against a baseline recorded elsewhere."""

    metric = METRIC
    tolerances = ("numerics_rtol", "numerics_atol", "numerics_cross_rtol",
                  "numerics_cross_atol")
    sections = ("numerics", "numerics_spread")

    def check(self, given: CheckInput) -> tuple[CheckResult, ...]:
        if not given.stepped:
            return ()
        return one(check_numerics(given.block, given.baseline, given.tol,
                                  same_environment=given.same_environment))

    def record(self, run: Run) -> Mapping[str, object]:
        """``numerics``: the run's per-leaf fingerprint (the store keeps its compact
        form, :func:`compact`); ``numerics_spread``: how far a replay moved each leaf, where
        the backend replayed the training; none for a compile-only run, which trained
        nothing."""
        if not stepped(run):
            return {}
        if run.replay is not None and run.replay["leaves"]:
            return {"numerics": run.params_fingerprint,
                    "numerics_spread": dict(run.replay["leaves"])}
        return {"numerics": run.params_fingerprint}


class ReferenceCheck(BaseCheck):
    """The ``reference`` row: the parameters against a single-device reference run, when
    the case has one (no baseline needed). A failure is a correctness bug: no baseline
    clears it, and such a run is never stored."""

    metric = REFERENCE_METRIC
    tolerances = ("reference_rtol", "reference_atol")
    cleared_by_a_baseline = False
    uncleared = ("the run disagrees with its single-device reference, a correctness bug in "
                 "the parallel code (a partition spec, a missing gradient reduction): fix it")

    def check(self, given: CheckInput) -> tuple[CheckResult, ...]:
        if not given.stepped or given.reference_params is None:
            return ()
        return (check_reference(given.params, given.reference_params, given.tol),)

    def refuses_recording(self, result: CheckResult) -> str | None:
        return (f"the reference check failed: {result.detail}. A correctness failure is not "
                f"an intended change")


CHECK = NumericsCheck()
REFERENCE = ReferenceCheck()
