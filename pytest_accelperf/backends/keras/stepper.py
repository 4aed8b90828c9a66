"""The ``keras`` backend's A/B stepper: a compiled Keras model's ``model.fit`` held at its
steps (:class:`~pytest_accelperf.backends.measure.held.HeldLoop`), what
:meth:`KerasBackend.stepper <.keras.backend.KerasBackend.stepper>` returns.

Built as a run builds it (the same model, data and ``fit`` settings, the same seed), then
one ``model.fit`` of :data:`~.measure.held.HELD_STEPS` steps started in a thread of its
own and held before each step until A/B mode asks for a block. A held fit cannot be one
epoch of arrays repeated to a million batches: arrays are handed to it as a generator of
their batches in order, again from the start at their end (the fetch is timed apart in
both arms alike); a dataset is cycled as a short one is in a run. Its program record is
the train step's, lowered for the batch the fit drew (:mod:`.keras.program`), once the
first block ran.
"""

from __future__ import annotations

from collections.abc import Iterator

import jax
import numpy as np

from pytest_accelperf.backends.keras.callback import GateCallback, synced
from pytest_accelperf.backends.keras.fit import (
    ARRAYS,
    KERAS_BATCH,
    as_keras_task,
    build,
    cycled_batches,
    one_device,
)
from pytest_accelperf.backends.keras.load import keras
from pytest_accelperf.backends.keras.program import train_program
from pytest_accelperf.backends.measure.held import HELD_STEPS, HeldLoop, HeldStepper
from pytest_accelperf.backends.protocol import Task
from pytest_accelperf.backends.types import Batch, FrameworkKwargs, Untyped
from pytest_accelperf.collect.cases import Case
from pytest_accelperf.provision.accel import Accelerator
from pytest_accelperf.records.program import ProgramRecord

#: ``fit`` arguments of arrays that a generator of batches does not take.
_ARRAY_ONLY = ("batch_size", "validation_split", "sample_weight", "y")


def endless(x: Untyped, y: Untyped, weights: Untyped, size: int) -> Iterator[Batch]:
    """The batches of arrays ``x``, ``y`` (and ``weights``) in order, from the start again
    at their end, for ever."""
    n = int(np.shape(jax.tree.leaves(x)[0])[0])
    start = 0
    while True:
        rows = np.arange(start, start + size) % n
        start = (start + size) % n

        def take(a: Untyped, rows: np.ndarray = rows) -> np.ndarray:
            taken: np.ndarray = np.asarray(a)[rows]
            return taken

        parts = [jax.tree.map(take, x)]
        if y is not None:
            parts.append(jax.tree.map(take, y))
            if weights is not None:
                parts.append(jax.tree.map(take, weights))
        yield tuple(parts) if len(parts) > 1 else parts[0]


def held_fit(kwargs: FrameworkKwargs) -> FrameworkKwargs:
    """``fit``'s arguments for a held fit of :data:`HELD_STEPS` steps (the module
    docstring)."""
    held = dict(kwargs, steps_per_epoch=HELD_STEPS)
    x = held["x"]
    leaves = jax.tree.leaves(x)
    if leaves and all(isinstance(leaf, ARRAYS) for leaf in leaves):
        size = int(held.get("batch_size") or KERAS_BATCH)
        held["x"] = endless(x, held.get("y"), held.get("sample_weight"), size)
        for name in _ARRAY_ONLY:
            held.pop(name, None)
        held["shuffle"] = False  # Keras shuffles no generator (and warns where told to)
    else:
        held["x"] = cycled_batches(x, HELD_STEPS, held, [])
    return held


class KerasStepper(HeldStepper):
    """A case's ``model.fit``, held between steps: :meth:`run` trains ``n`` more and gives
    their times (see the module docstring)."""

    def __init__(self, case: Case, task: Task, accel: Accelerator) -> None:
        one_device(case)
        keras_task = as_keras_task(task)
        built = build(keras_task, case)
        model = self._model = built.model
        self._held = HeldLoop(built.label)
        self._callback = GateCallback(case, built.label, self._held.clock(
            lambda: synced(model)))
        self._program: ProgramRecord | None = None
        kwargs = held_fit(built.kwargs)
        callbacks = [*built.callbacks, self._callback]
        keras.utils.set_random_seed(keras_task.seed_for(case))

        def fit() -> None:
            try:
                model.fit(**kwargs, callbacks=callbacks)
            finally:
                self._callback.unwrap(model)

        self._held.start(fit)

    @property
    def program(self) -> ProgramRecord | None:
        """The train step's program record, once a block drew a batch (else None)."""
        spec = self._callback.batch_spec
        if self._program is None and spec is not None:
            self._program = train_program(self._model, spec,
                                          self._callback.keras_function).record
        return self._program
