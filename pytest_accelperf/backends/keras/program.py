"""The program of Keras's train function: what XLA made of ``model.train_step``, read
after the fit (untimed) for the batch the fit drew, into the program record and the
memory plan, by the JAX backend's readers (:func:`.jax.hlo.program_of`,
:func:`.jax.memory._analysis_bytes`).

Keras's JAX trainer jits ``train_step`` with ``donate_argnums=0`` (``make_train_function``)
unless the model was compiled with ``jit_compile=False`` or ``run_eagerly=True``, when it
runs the step op by op. The jitted function is Keras's own where it can be found (the
``step_function`` its train function closes over), else the same ``jax.jit`` made again;
it is lowered on the state's and the batch's shapes and compiled once more, outside any
timing: its cost analysis is the record's FLOPs and bytes, its memory analysis the plan.

``dispatches`` is what the host launches per step: 1 for a jitted step (one XLA program),
else one per operation of the step's jaxpr, each dispatched on its own (a change from 1 to
some hundreds is ``jit_compile=False``). An op-by-op step has no plan of its own: its
memory is left unrecorded; its FLOPs are those of the same step jitted (the arithmetic does
not change).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import jax

from pytest_accelperf.backends.jax.hlo import program_of
from pytest_accelperf.backends.jax.memory import _analysis_bytes
from pytest_accelperf.backends.keras.callback import abstract
from pytest_accelperf.backends.types import PyTree, Untyped
from pytest_accelperf.records.program import ProgramRecord

# jax leaves these untyped; mypy --strict refuses untyped calls, so they go through Any.
_jit: Any = jax.jit
_make_jaxpr: Any = jax.make_jaxpr


@dataclass(frozen=True)
class TrainProgram:
    """The train function's program record, its memory plan (empty when the step runs op
    by op) and whether Keras jits the step."""

    record: ProgramRecord
    planned: dict[str, int]
    jitted: bool


def jits(model: Untyped) -> bool:
    """Whether Keras runs ``model``'s train step as one jitted program."""
    return bool(model.jit_compile) and not bool(model.run_eagerly)


def state_spec(model: Untyped) -> PyTree:
    """The state Keras's JAX trainer hands ``train_step``, as shapes: the trainable and
    non-trainable variables, the optimizer's and the metrics' (``_get_jax_state``'s
    order)."""
    parts = (model.trainable_variables, model.non_trainable_variables,
             model.optimizer.variables, model.metrics_variables)
    return tuple(abstract([v.value for v in part]) for part in parts)


def keras_jitted(function: Untyped) -> Untyped:
    """Keras's own jitted train step (what its train function ``function`` closes over),
    or None."""
    if not inspect.isfunction(function):
        return None
    step = inspect.getclosurevars(function).nonlocals.get("step_function")
    return step if hasattr(step, "lower") else None


def train_program(model: Untyped, batch_spec: PyTree,
                  function: Untyped = None) -> TrainProgram:
    """The program of ``model``'s train step for a batch of ``batch_spec`` (the module
    docstring); ``function`` is Keras's train function (``model.train_function`` when
    None: after the fit, once the gate's wrapper is gone)."""
    state = state_spec(model)
    jitted = jits(model)
    own = keras_jitted(function or getattr(model, "train_function", None)) if jitted else None
    step = own or _jit(model.train_step, donate_argnums=0)
    lowered = step.lower(state, batch_spec)
    compiled = lowered.compile()
    record = program_of(lowered, compiled, 1)
    if jitted:
        record["dispatches"] = 1
        return TrainProgram(record, _analysis_bytes(compiled), True)
    record["dispatches"] = len(_make_jaxpr(model.train_step)(state, batch_spec).jaxpr.eqns)
    return TrainProgram(record, {}, False)
