"""What a single-device reference run yields: :class:`ReferenceParams` (the
``reference`` check compares it, :mod:`pytest_accelperf.checks.numerics`)."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np


class ReferenceParams(dict[str, "np.ndarray"]):
    """The single-device reference's parameters and the state beside them (a flat ``{path:
    array}`` dict; ``state`` names the state's leaves), with what they are compared with:
    ``compared``, the run's own after the same ``steps`` steps from the same initial state
    and batches, on its ``mesh`` (``"4x2"``). Without ``compared``, the check compares the
    run's final parameters (a reference that trained every step of the case). ``initial``:
    the reference's parameters before its first step, from which the check tells whether
    they moved at all (when they did not, any program, one that updates nothing included,
    would match). ``least``: the steps the case asked for (``Case.reference_steps``), where
    ``steps`` may be more (the reference trains on until the parameters moved)."""

    def __init__(self, params: Mapping[str, np.ndarray], *,
                 compared: Mapping[str, np.ndarray] | None = None,
                 steps: int | None = None, mesh: str = "", state: Collection[str] = (),
                 initial: Mapping[str, np.ndarray] | None = None,
                 least: int | None = None) -> None:
        super().__init__(params)
        self.least = least
        self.compared = dict(compared) if compared is not None else None
        self.steps = steps
        self.mesh = mesh
        self.state = frozenset(state)
        self.initial = dict(initial) if initial is not None else None
