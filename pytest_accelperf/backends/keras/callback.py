"""What the ``keras`` backend reads from inside ``model.fit``: :class:`GateCallback`.

Keras's JAX trainer runs each batch as: ``on_train_batch_begin``; the train function,
``train_function(state, iterator)``, which takes the batch with ``next(iterator)`` and runs
the train step (jitted, or op by op with ``jit_compile=False``); ``on_train_batch_end``
with the step's logs. The gate's callback:

* wraps ``model.train_function`` for the length of the fit (:meth:`GateCallback.wrap`,
  put back by :meth:`GateCallback.unwrap`) so that the iterator it is handed is a
  :class:`Fetching` one: Keras's fetch of each batch (its data adapter slicing the arrays,
  a ``PyDataset``'s ``__getitem__``, a generator's ``next``) is timed apart as the step's
  ``input``, and the first batch's shapes are kept (the global batch, checked; the
  program, lowered for them after the fit);
* brackets the train step itself (from the batch fetched to the step's outputs ready,
  the device synchronized) as the user's code of the step: the rest of the step is Keras's
  own time (its loop, the callbacks, the logs made Python numbers), ``trainer_times``;
* at ``on_train_batch_end`` waits for the device (the state the step made, and its logs),
  then reads the loss Keras computed and the learning rate the step used, and hands them
  to the :class:`~pytest_accelperf.backends.measure.stamps.StepClock`; a step is one
  batch (the gate refuses ``steps_per_execution`` above 1).

Keras reports ``loss`` as the mean over the epoch so far (its loss tracker, weighted by
the batch's size); the loss of step ``k`` of the epoch is taken back out of it:
``k * mean_k - (k - 1) * mean_{k-1}`` (in float64, from Keras's float32 mean).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import jax
import numpy as np

from pytest_accelperf.backends.keras.load import keras
from pytest_accelperf.backends.measure.common import TaskError
from pytest_accelperf.backends.measure.stamps import StepClock
from pytest_accelperf.backends.types import Batch, PyTree, Untyped
from pytest_accelperf.collect.cases import Case

# jax and keras leave these untyped; mypy --strict refuses untyped calls, so they go
# through Any.
_block_until_ready: Any = jax.block_until_ready
_ShapeDtypeStruct: Any = jax.ShapeDtypeStruct
_Callback: Any = keras.callbacks.Callback


def synced(model: Untyped) -> None:
    """Wait for the device to finish what the fit dispatched: the state of the step that
    ran last (Keras keeps it as ``model._jax_state`` between batches)."""
    _block_until_ready(getattr(model, "_jax_state", None))


def abstract(tree: PyTree) -> PyTree:
    """``tree``'s arrays as ``jax.ShapeDtypeStruct`` (what a lowering takes)."""
    def spec(a: PyTree) -> PyTree:
        dtype = a.dtype if hasattr(a, "dtype") else np.asarray(a).dtype
        return _ShapeDtypeStruct(np.shape(a), dtype)

    return jax.tree.map(spec, tree)


def leading(batch: Batch) -> int | None:
    """The leading dimension of the batch's first array: its batch size."""
    for leaf in jax.tree.leaves(batch):
        shape = getattr(leaf, "shape", None)
        if shape:
            return int(shape[0])
    return None


class Fetching(Iterator[Batch]):
    """Keras's iterator of batches, each ``next`` told to the callback (timed apart)."""

    def __init__(self, inner: Iterator[Batch], callback: GateCallback) -> None:
        self.inner, self.callback = inner, callback

    def __next__(self) -> Batch:
        self.callback.fetch_started()
        try:
            batch = next(self.inner)
        finally:
            self.callback.fetch_ended()
        self.callback.fetched(batch)
        self.callback.clock.user_started()  # the train step runs on the batch now
        return batch


class GateCallback(_Callback):  # type: ignore[misc]
    """The measured fit's callback (the module docstring): each batch stamped by
    ``clock``, its loss and learning rate read; the first batch checked against the
    case's ``batch``."""

    def __init__(self, case: Case, label: str, clock: StepClock) -> None:
        super().__init__()
        self.case, self.label, self.clock = case, label, clock
        self.batch_spec: PyTree = None  #: the first batch, as ShapeDtypeStructs
        self._original: Untyped = None
        self._in_epoch = 0  # batches of this epoch so far
        self._mean = 0.0  # Keras's loss: the epoch's mean so far
        self._iterations = 0  # the optimizer's iterations before the fit

    # -- the train function, wrapped for the fit ------------------------------------
    def wrap(self, model: Untyped) -> None:
        """Hand ``model``'s train function a :class:`Fetching` iterator (this fit only)."""
        original = self._original = model.train_function

        def train_function(state: PyTree, iterator: Iterator[Batch]) -> Untyped:
            out = original(state, Fetching(iterator, self))
            _block_until_ready(out)  # the logs and the new state: the step is done
            self.clock.user_ended()
            return out

        model.train_function = train_function

    @property
    def keras_function(self) -> Untyped:
        """Keras's own train function while the fit runs (None before, and after it)."""
        return self._original

    def unwrap(self, model: Untyped) -> None:
        """Put ``model``'s own train function back (a later fit makes none otherwise)."""
        if self._original is not None:
            model.train_function, self._original = self._original, None

    def fetch_started(self) -> None:
        self.clock.fetch_started()

    def fetch_ended(self) -> None:
        self.clock.fetch_ended()

    def fetched(self, batch: Batch) -> None:
        if self.batch_spec is not None:
            return
        self.batch_spec = abstract(batch)
        size = leading(batch)
        if size is not None and size != self.case.batch:
            raise TaskError(
                f"{self.label}: the global batch is {size} (the first batch fit drew), but "
                f"{self.case.id} declares batch={self.case.batch}: make the data's batch "
                f"{self.case.batch} (from accelperf.case.batch), or the case's batch {size}")

    # -- Keras's hooks -------------------------------------------------------------------
    def on_train_begin(self, logs: Mapping[str, float] | None = None) -> None:
        self.wrap(self.model)
        self._iterations = int(np.asarray(self.model.optimizer.iterations.value))
        if self.clock.start():  # a held fit (A/B mode) told to stop before its first step
            self.model.stop_training = True

    def on_epoch_begin(self, epoch: int, logs: Mapping[str, float] | None = None) -> None:
        self._in_epoch, self._mean = 0, 0.0

    def on_train_batch_end(self, batch: int, logs: Mapping[str, float] | None = None) -> None:
        self.clock.batch_ended()  # the device synchronized: the state the step made
        logs = logs or {}
        if "loss" not in logs:
            raise TaskError(f"{self.label}: the train step's logs hold no 'loss' (only "
                            f"{', '.join(sorted(logs)) or 'nothing'}): a custom train_step "
                            f"must return the loss tracker's result under 'loss'")
        k = self._in_epoch = self._in_epoch + 1
        mean = float(logs["loss"])
        loss = k * mean - (k - 1) * self._mean if k > 1 else mean
        self._mean = mean
        metrics = {"lr": self.learning_rate(self.clock.done)}
        if self.clock.after_batch(loss, metrics):
            self.model.stop_training = True

    def learning_rate(self, step: int) -> float:
        """The learning rate of the optimizer's step ``step`` of this fit: a schedule's
        value at the optimizer's iteration count then, else the rate it holds."""
        optimizer = self.model.optimizer
        rate = getattr(optimizer, "_learning_rate", None)
        schedule = keras.optimizers.schedules.LearningRateSchedule
        if isinstance(rate, schedule):
            return float(np.asarray(rate(self._iterations + step)))
        if callable(rate) and not hasattr(rate, "value"):
            return float(np.asarray(rate()))
        return float(np.asarray(optimizer.learning_rate))
