"""The numerics fingerprint of a run's parameters, as typed records of its JSON.

A run's fingerprint (:attr:`pytest_accelperf.records.run.Run.params_fingerprint`) is one
:class:`LeafFingerprint` per leaf path
(:func:`pytest_accelperf.backends.measure.common.fingerprint`); the store keeps its compact
form, a :class:`CompactFingerprint` (:func:`pytest_accelperf.checks.numerics.compact`).
The pydantic models the store validates them with are ``Leaf``, ``CompactSection`` and
``CompactNumerics`` in :mod:`pytest_accelperf.store.block`.
"""

from __future__ import annotations

from typing import NotRequired, TypeAlias, TypedDict


class LeafFingerprint(TypedDict):
    """One leaf: its shape and dtype, its RMS, 16 evenly strided samples and ``sketch``
    (its projection on a fixed random direction over its norm), and ``state: true`` where
    it is the training state beside the parameters. Blocks recorded before the sketch
    have none."""

    shape: list[int]
    dtype: str
    rms: float
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
