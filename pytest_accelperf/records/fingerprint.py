"""The numerics fingerprint of a run's parameters, as typed records of its JSON.

A run's fingerprint (:attr:`pytest_accelperf.records.run.Run.params_fingerprint`) is one
:class:`LeafFingerprint` per leaf path
(:func:`pytest_accelperf.backends.measure.common.fingerprint`); the store keeps its compact
form, a :class:`CompactFingerprint` (:func:`compact`), and both are read back as a list of
:class:`FingerprintLeaf` (:func:`fingerprint_leaves`).
The pydantic models the store validates them with are ``Leaf`` (made of
:class:`LeafFingerprint`'s fields, their constraints declared here), ``CompactSection`` and
``CompactNumerics`` in :mod:`pytest_accelperf.store.block`.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NotRequired, TypeAlias, TypedDict, TypeGuard, TypeVar

from pytest_accelperf.records.section import Int, NonNegative
from pytest_accelperf.stats.units import round_sig


class LeafFingerprint(TypedDict):
    """One leaf: its shape and dtype, its RMS, 16 evenly strided samples and ``sketch``
    (its projection on a fixed random direction over its norm), and ``state: true`` where
    it is the training state beside the parameters. Blocks recorded before the sketch
    have none. Its one declaration: :class:`pytest_accelperf.store.block.Leaf` is made of
    these fields and their constraints."""

    shape: list[Int]
    dtype: str
    rms: NonNegative
    sample: list[float]
    sketch: NotRequired[float]
    state: NotRequired[bool]


#: A run's fingerprint: per leaf path, its :class:`LeafFingerprint`.
ParamsFingerprint: TypeAlias = dict[str, LeafFingerprint]


class CompactSection(TypedDict):
    """One section of the stored fingerprint: one sketch value per leaf in path order, a
    hash of the leaves' paths, shapes and dtypes, and a tag of 2 hex digits per leaf."""

    sketch: list[float]
    structure: str
    tags: str


class CompactFingerprint(CompactSection):
    """The stored fingerprint: the parameters' section, and the state's beside them under
    ``state`` (absent from blocks recorded before the state was fingerprinted)."""

    state: NotRequired[CompactSection]


# -- the stored (compact) form, and reading either form back --------------------------------
class FingerprintError(ValueError):
    """A numerics fingerprint in none of the forms the plugin writes (an edited report or
    baseline): the message names the leaf or the field."""


@dataclass(frozen=True)
class FingerprintLeaf:
    """One leaf of a numerics fingerprint, whatever its form: ``name`` (its path; in the
    compact form, which stores no paths, ``"leaf i of n"``), whether it is ``state``
    beside the parameters, and the numbers stored for it (per leaf: its RMS and samples;
    compact: its one sketch value)."""

    name: str
    state: bool
    values: tuple[float, ...]

    @property
    def what(self) -> str:
        return "state leaf" if self.state else "parameter"

    @property
    def finite(self) -> bool:
        return all(math.isfinite(v) for v in self.values)


def _number(value: object, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise FingerprintError(f"{where} is {value!r}, not a number")
    return float(value)


def _compact_leaves(section: Mapping[str, Any], state: bool) -> list[FingerprintLeaf]:
    sketch = section.get("sketch")
    if not isinstance(sketch, list):
        raise FingerprintError(f"the compact fingerprint's sketch is {sketch!r}, not a list")
    what = "state leaf" if state else "leaf"
    n = len(sketch)
    return [FingerprintLeaf(f"{what} {i + 1} of {n}", state,
                            (_number(v, f"{what} {i + 1} of {n}"),))
            for i, v in enumerate(sketch)]


def fingerprint_leaves(numerics: object) -> list[FingerprintLeaf]:
    """The leaves of a numerics fingerprint in any form the plugin writes: a run's (one
    entry per leaf path, with its RMS and samples) or the store's compact one
    (:func:`compact`, with its state section). The one reader of a fingerprint's numbers,
    for the checks, :mod:`pytest_accelperf.checks.recordable` and ``accelperf baselines
    accept``: a report or a baseline is an input anyone can hand over, so anything else
    is a :class:`FingerprintError` naming what is wrong, never another exception."""
    if numerics is None:
        return []
    if not isinstance(numerics, Mapping):
        raise FingerprintError(f"the fingerprint is {type(numerics).__name__}, not an object")
    if is_compact(numerics):
        out = _compact_leaves(numerics, state=False)
        state = numerics.get(STATE)
        if state is not None:
            if not is_compact(state):
                raise FingerprintError("the compact fingerprint's state section is not one")
            out += _compact_leaves(state, state=True)
        return out
    out = []
    for path in sorted(numerics, key=str):
        leaf = numerics[path]
        if not isinstance(leaf, Mapping):
            raise FingerprintError(f"leaf {path!r} is {type(leaf).__name__}, not an object")
        sample = leaf.get("sample") or []
        if not isinstance(sample, list):
            raise FingerprintError(f"leaf {path!r}'s sample is not a list")
        values = [_number(leaf.get("rms"), f"leaf {path!r}'s rms")]
        values += [_number(v, f"leaf {path!r}'s sample") for v in sample]
        out.append(FingerprintLeaf(str(path), leaf.get(STATE) is True, tuple(values)))
    return out


# -- the compact (stored) fingerprint ----------------------------------------------------------
#: Significant digits of a stored sketch value.
SKETCH_DIGITS = 6


#: Hex digits of the structure hash, and of each leaf's tag, in a compact fingerprint.
STRUCTURE_HEX = 12


TAG_HEX = 2


def sketch_value(leaf: LeafFingerprint) -> float:
    """The one number a compact fingerprint stores for a leaf: ``rms * exp(sketch / 4)``
    (``sketch`` from :func:`pytest_accelperf.backends.measure.common.fingerprint`), 6 significant
    digits. It lies within a factor of about 0.5 to 2 of the leaf's RMS (never near 0 unless
    the leaf is), so ``np.isclose`` at the numerics tolerance reads it as it reads the RMS;
    it moves with the leaf's scale (the RMS) and with its pattern (the sketch: a sign flip
    of the whole leaf multiplies it by ``exp(-sketch / 2)``)."""
    rms, c = float(leaf["rms"]), float(leaf.get("sketch", 0.0))
    return round_sig(rms * math.exp(min(max(c / 4, -100.0), 100.0)), SKETCH_DIGITS)


def _leaf_digest(path: str, leaf: LeafFingerprint) -> str:
    shape = ",".join(str(int(n)) for n in leaf.get("shape", ()))
    text = f"{path}\t({shape})\t{leaf.get('dtype', '')}"
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def structure(fp: Mapping[str, LeafFingerprint]) -> tuple[str, str]:
    """``(structure hash, tags)`` of a per-leaf fingerprint: a hash of every leaf's path,
    shape and dtype in path order, and a tag of 2 hex digits per leaf (of the same three),
    in that order."""
    digests = [_leaf_digest(p, fp[p]) for p in sorted(fp)]
    whole = hashlib.sha256("".join(digests).encode("ascii")).hexdigest()[:STRUCTURE_HEX]
    return whole, "".join(d[:TAG_HEX] for d in digests)


def is_compact(numerics: object) -> TypeGuard[CompactFingerprint]:
    """Whether ``numerics`` is a compact fingerprint (``{"sketch", "structure", "tags"}``)
    rather than one entry per leaf."""
    return (isinstance(numerics, Mapping) and isinstance(numerics.get("sketch"), list)
            and isinstance(numerics.get("structure"), str))


def compactable(numerics: object) -> TypeGuard[Mapping[str, LeafFingerprint]]:
    """Whether ``numerics`` is a per-leaf fingerprint with a sketch for every leaf (what
    :func:`pytest_accelperf.backends.measure.common.fingerprint` makes), which :func:`compact` can
    store."""
    return (isinstance(numerics, Mapping) and bool(numerics) and not is_compact(numerics)
            and all(isinstance(p, str) and _sketched(v) for p, v in numerics.items()))


def finite(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _sketched(leaf: object) -> bool:
    """A leaf that :func:`compact` can store: finite ``rms`` >= 0 and ``sketch``, a list of
    integers for a shape, a string dtype (anything else is left to the schema to name)."""
    return (isinstance(leaf, Mapping) and finite(leaf.get("rms")) and leaf["rms"] >= 0
            and finite(leaf.get("sketch")) and isinstance(leaf.get("dtype"), str)
            and isinstance(leaf.get("shape"), list)
            and all(isinstance(n, int) and not isinstance(n, bool) for n in leaf["shape"]))


#: The mark of a state leaf in a per-leaf fingerprint (``"state": true``), and the key of
#: the state's section in a compact one.
STATE = "state"


L = TypeVar("L")


def split_state(fp: Mapping[str, L]) -> tuple[dict[str, L], dict[str, L]]:
    """A per-leaf fingerprint as ``(parameters, state)``: the leaves marked ``"state":
    true`` (the training state beside the parameters) apart from the rest. A leaf is a
    :class:`LeafFingerprint`, or JSON not yet read as one (a baseline's)."""
    params: dict[str, L] = {}
    state: dict[str, L] = {}
    for path, leaf in fp.items():
        (state if isinstance(leaf, Mapping) and leaf.get(STATE) is True else params)[path] = leaf
    return params, state


def compact_section(fp: Mapping[str, LeafFingerprint]) -> CompactSection:
    whole, tags = structure(fp)
    return {"sketch": [sketch_value(fp[p]) for p in sorted(fp)], "structure": whole,
            "tags": tags}


def compact(fp: Mapping[str, LeafFingerprint]) -> CompactFingerprint:
    """The stored form of a per-leaf fingerprint: ``{"sketch": [one number per leaf, in
    path order], "structure": hash, "tags": 2 hex digits per leaf}`` of the parameters,
    and, when the fingerprint has leaves marked ``"state"``, the same three of those under
    ``"state"``.

    The leaf paths are not stored: when the structure hash matches, the run being checked
    has the same leaves in the same order, and names them; when it does not, the tags tell
    which of the run's leaves are new or changed (:func:`check_numerics`). The state is a
    section of its own so that the parameters' section is what it was before the state
    was fingerprinted: a baseline recorded then is compared with it unchanged.
    """
    params, state = split_state(fp)
    section = compact_section(params)
    out: CompactFingerprint = {"sketch": section["sketch"], "structure": section["structure"],
                               "tags": section["tags"]}
    if state:
        out["state"] = compact_section(state)
    return out
