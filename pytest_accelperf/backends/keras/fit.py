"""What one case's ``model.fit`` is made of, for a run and for A/B mode's held fit: the
compiled model (a fresh Keras session, seeded), the data as ``fit`` is handed it (arrays
checked against the case's batch and cycled where shorter than the run, a short dataset
cycled), and ``fit``'s keyword arguments with what the gate owns set, each setting it
replaced said in one line (:func:`build`)."""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import jax
import numpy as np

from pytest_accelperf.backends.keras.load import keras
from pytest_accelperf.backends.keras.task import OWNED, KerasTask
from pytest_accelperf.backends.measure.common import TaskError, describe, task_of
from pytest_accelperf.backends.protocol import Task
from pytest_accelperf.backends.types import Batch, FrameworkKwargs, Untyped
from pytest_accelperf.collect.cases import Case
from pytest_accelperf.errors import ConfigError

#: What ``model.fit`` draws batches of a given size from (``batch_size``): arrays.
ARRAYS = (np.ndarray, jax.Array)
#: Keras's default ``batch_size`` for arrays.
KERAS_BATCH = 32
#: Callbacks that write files (a checkpoint, a log, a backup): left out of a measured fit.
WRITERS = ("ModelCheckpoint", "TensorBoard", "CSVLogger", "BackupAndRestore",
           "ProgbarLogger")


def as_keras_task(task: Task) -> KerasTask:
    return task_of(task, KerasTask, "keras")


@dataclass
class Built:
    """The task made for one case: its compiled model, a label naming it, ``fit``'s
    keyword arguments with what the gate owns set (its data included), the user's
    callbacks that stay, and one line for each setting the gate replaced."""

    model: Untyped
    label: str
    kwargs: FrameworkKwargs
    callbacks: list[Untyped]
    notes: list[str] = field(default_factory=list)


def _model(task: KerasTask, case: Case) -> tuple[Untyped, str]:
    model = task.built(task.model, case, (keras.Model,))
    if not isinstance(model, keras.Model):
        raise TaskError(f"KerasTask.model must be a keras.Model or a function of the case "
                        f"that returns one; got {type(model).__name__}")
    kind = type(model)  # Keras's own class by name, a user's subclass at its file
    label = (f"KerasTask.model {model.name!r} ("
             f"{kind.__name__ if kind.__module__.startswith('keras.') else describe(kind)})")
    if not model.compiled:
        raise TaskError(f"{label} was not compiled: call model.compile(optimizer=..., "
                        f"loss=...) before handing it over (fit refuses a model that was not)")
    if int(model.steps_per_execution) != 1:
        raise TaskError(f"{label} was compiled with steps_per_execution="
                        f"{model.steps_per_execution}: Keras then calls back once every "
                        f"{model.steps_per_execution} optimizer steps, and the gate stamps "
                        f"each; compile with steps_per_execution=1 (the default)")
    return model, label


def build(task: KerasTask, case: Case) -> Built:
    """Make ``task``'s model and data for ``case`` (a fresh Keras session, seeded), and
    ``fit``'s keyword arguments."""
    keras.backend.clear_session()  # layer names from 0: the fingerprint's paths are stable
    keras.utils.set_random_seed(task.seed_for(case))
    model, label = _model(task, case)
    given = task.fit(case) if callable(task.fit) else task.fit
    if not isinstance(given, Mapping):
        raise TaskError(f"KerasTask.fit holds model.fit keyword arguments (a dict, or a "
                        f"function of the case returning one); got {type(given).__name__}")
    kwargs, notes = fit_settings(given, case)
    callbacks = list(kwargs.pop("callbacks", None) or [])
    kept = [c for c in callbacks if type(c).__name__ not in WRITERS]
    for dropped in callbacks:
        if dropped not in kept:
            notes.append(f"KerasTask.fit['callbacks'] holds {type(dropped).__name__}: left "
                         f"out (nothing is written to disk; the gate reports each step)")
    x = task.built(task.x, case, (*ARRAYS, Mapping, list, tuple))
    y = task.built(task.y, case, (*ARRAYS, Mapping, list, tuple))
    if x is None:
        raise TaskError("KerasTask.x is None: give arrays, a PyDataset, a generator of "
                        "batches, or a function of the case that returns one")
    kwargs["x"], kwargs["y"] = data_for(x, y, kwargs, case, label, notes)
    return Built(model, label, kwargs, kept, notes)


def fit_settings(given: Mapping[str, Any], case: Case) -> tuple[FrameworkKwargs, list[str]]:
    """``model.fit``'s keyword arguments in a measured run: ``given`` with what the gate
    owns set, and a line for each of ``given``'s that differed."""
    kwargs = dict(given)
    notes: list[str] = []
    for name in ("x", "y"):
        if name in kwargs:
            raise TaskError(f"KerasTask.fit[{name!r}]: give the data as KerasTask({name}=...)")
    owned: dict[str, tuple[object, str]] = {
        **OWNED, "steps_per_epoch": (case.warmup + case.steps, "the case's warm-up + steps")}
    for name, (value, why) in owned.items():
        if name in kwargs and kwargs[name] != value:
            notes.append(f"KerasTask.fit[{name!r}]={kwargs[name]!r}: the gate uses "
                         f"{value!r} ({why})")
        kwargs[name] = value
    for name in ("validation_data", "validation_split"):
        if kwargs.get(name) and "validation_freq" not in given:
            notes.append(f"KerasTask.fit[{name!r}]: validation is not run "
                         f"(validation_freq=[]: it is not part of a training step)")
    return kwargs, notes


def _is_arrays(data: object) -> bool:
    leaves = jax.tree.leaves(data)
    return bool(leaves) and all(isinstance(leaf, ARRAYS) for leaf in leaves)


def data_for(x: object, y: object, kwargs: FrameworkKwargs, case: Case, label: str,
             notes: list[str]) -> tuple[object, object]:
    """``x`` and ``y`` as ``fit`` is handed them: arrays checked against the case's batch
    and cycled to ``warmup + steps`` full batches where they hold fewer (said in
    ``notes``); a dataset or iterable of batches cycled where it is shorter."""
    needed = case.warmup + case.steps
    if not _is_arrays(x):
        return cycled_batches(x, needed, kwargs, notes), y
    size = kwargs.get("batch_size") or KERAS_BATCH
    if size != case.batch:
        given = ("KerasTask.fit['batch_size']" if kwargs.get("batch_size")
                 else "Keras's default batch_size (fit was given none)")
        raise TaskError(
            f"{label}: the global batch is {size} ({given}), but {case.id} declares "
            f"batch={case.batch}: give fit batch_size={case.batch} (KerasTask(fit=lambda "
            f"case: {{'batch_size': case.batch, ...}})), or make the case's batch {size}")
    kwargs["batch_size"] = size
    n = int(np.shape(jax.tree.leaves(x)[0])[0])
    split = float(kwargs.get("validation_split") or 0.0)
    trained = math.ceil(n * (1.0 - split))
    if trained >= needed * size:
        return x, y
    take = np.arange(needed * size) % trained
    if split:
        kwargs["validation_split"] = 0.0
    weights = kwargs.get("sample_weight")
    if _is_arrays(weights):
        kwargs["sample_weight"] = jax.tree.map(lambda a: np.asarray(a)[take], weights)
    notes.append(f"KerasTask.x holds {trained} training samples, {trained // size} full "
                 f"batch(es) of {size}; the case trains {needed} (warm-up + steps): cycled "
                 f"(the arrays repeated to {needed * size} samples, one epoch)")

    def cycle(a: Untyped) -> np.ndarray:
        return np.asarray(a)[take]

    return (jax.tree.map(cycle, x), None if y is None else jax.tree.map(cycle, y))


def cycled_batches(data: object, needed: int, kwargs: FrameworkKwargs,
                   notes: list[str]) -> object:
    """A dataset of fewer than ``needed`` batches (a ``PyDataset``, a sized iterable) as a
    generator that starts it again at its end, in order (``shuffle`` off: Keras shuffles
    no generator), said in ``notes``; else ``data``."""
    if isinstance(data, keras.utils.PyDataset):
        length = int(data.num_batches or len(data))
        if length >= needed:
            return data
        notes.append(f"KerasTask.x is a PyDataset of {length} batch(es); the case trains "
                     f"{needed} (warm-up + steps): cycled (its batches taken again in order, "
                     f"one epoch, without its workers)")
        kwargs["shuffle"] = False
        return (data[i % length] for i in range(needed))
    if hasattr(data, "__len__") and not isinstance(data, Iterator):
        length = len(data)
        if length >= needed:
            return data
        notes.append(f"KerasTask.x holds {length} batch(es); the case trains {needed} "
                     f"(warm-up + steps): cycled (its batches taken again, one epoch)")
        kwargs["shuffle"] = False
        return _again(data, needed)
    return data


def _again(data: Untyped, needed: int) -> Iterator[Batch]:
    given = 0
    while given < needed:
        for batch in data:
            yield batch
            given += 1
            if given == needed:
                return


def one_device(case: Case) -> None:
    if case.world_size > 1 or case.n_devices != 1:
        raise ConfigError(f"{case.id}: the keras backend trains on one device for now "
                          f"(world_size={case.world_size}, mesh={case.mesh}); "
                          f"keras.distribution under the gate is not built yet")
    if case.reference:
        raise ConfigError(f"{case.id}: the keras backend has no single-device reference "
                          f"run: drop reference=True")
