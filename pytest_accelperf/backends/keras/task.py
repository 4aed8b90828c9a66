"""What a suite hands the ``keras`` backend: :class:`KerasTask`, and the ``model.fit``
settings the gate owns in a measured run (:data:`OWNED`).

Importing this module imports neither keras nor jax: a suite's module can build a task at
collection, and ``import pytest_accelperf.keras`` stays light.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pytest_accelperf.backends.measure.factories import CaseFactories

if TYPE_CHECKING:
    from pytest_accelperf.collect.cases import Case

#: ``model.fit`` keyword arguments the gate sets in a measured run, and why: a user's
#: setting that differs is replaced, said in one line (``steps_per_epoch`` is the case's
#: ``warmup + steps``, set apart).
OWNED: Mapping[str, tuple[object, str]] = {
    "epochs": (1, "one epoch of the case's warm-up + steps batches (steps_per_epoch)"),
    "initial_epoch": (0, "the run starts at the first epoch"),
    "verbose": (0, "the gate's own progress line reports each step"),
    "validation_freq": ([], "validation is not part of a training step: it is not run"),
}


@dataclass(frozen=True)
class KerasTask(CaseFactories):
    """A compiled Keras 3 model trained by ``model.fit`` (on JAX) under the gate.

    ``model`` is the compiled ``keras.Model``, or a function of the
    :class:`~pytest_accelperf.collect.cases.Case` that makes and compiles it (called after
    ``keras.backend.clear_session()`` and the seed). ``x`` and ``y`` are what ``fit``
    takes: arrays (numpy, or a dict or list of them), a ``keras.utils.PyDataset``, a
    generator or another iterable of batches (``y`` then None), or a function of the case
    that returns one. ``fit`` holds ``model.fit`` keyword arguments as you pass them
    (``batch_size``, ``shuffle``, ``class_weight``, your callbacks, ...), or a function
    of the case that returns them: the gate sets those it owns (:data:`OWNED`, and
    ``steps_per_epoch``), leaves out the callbacks that write files, and says where yours
    differed. The global batch, ``fit``'s ``batch_size`` for arrays (Keras's default 32
    when it is not given) or the dataset's own batch, must be the case's ``batch``.

    ``seed`` is what ``keras.utils.set_random_seed`` is given before the model is made and
    again before ``fit`` (Python's, numpy's and Keras's generators); a case's
    ``params["seed"]`` takes its place.
    """

    model: object
    x: object = None
    y: object = None
    fit: Mapping[str, Any] | Callable[[Case], Mapping[str, Any]] = field(default_factory=dict)
    seed: int = 0

    def seed_for(self, case: Case) -> int:
        """The seed of ``case``: its ``params["seed"]``, else :attr:`seed`."""
        return int(case.params.get("seed", self.seed))
