"""The ``keras`` backend: a compiled Keras 3 model trained by ``model.fit`` on JAX, as
written, measured from inside Keras's own loop (:mod:`.keras.callback`).

What it trains is a :class:`~.keras.task.KerasTask`: the user's model, data and ``fit``
keyword arguments. One ``model.fit`` runs, of ``warmup + steps`` batches (one epoch of
``steps_per_epoch`` batches), each stamped by a
:class:`~pytest_accelperf.backends.measure.stamps.StepClock` from the gate's callback (the
device synchronized, Keras's fetch of the batch timed apart as ``input``, the drift probe
after each), with the loss Keras computed and the learning rate each step used. After it,
untimed: the program of Keras's train function, lowered and compiled for the batch the fit
drew (:mod:`.keras.program`: FLOPs, bytes, the HLO's ops, the dispatches per step, the
compiler's memory plan), and the numerics fingerprint of the whole state: the model's
trainable and non-trainable variables (a seed generator's state included), and beside
them the optimizer's (its iteration count, learning rate, moments).

What the gate owns it sets (:data:`~.keras.task.OWNED`, ``steps_per_epoch``; the
callbacks that write files are left out) and says where the user's setting differed;
arrays shorter than the run are cycled, and said so (:mod:`.keras.fit`). Nothing is left
on disk.
"""

from __future__ import annotations

import importlib.util

import jax
import numpy as np

from pytest_accelperf.backends.jax.backend import jax_probe
from pytest_accelperf.backends.jax.compile import _is_oom
from pytest_accelperf.backends.keras.callback import GateCallback, synced
from pytest_accelperf.backends.keras.fit import as_keras_task, build, one_device
from pytest_accelperf.backends.keras.load import keras
from pytest_accelperf.backends.keras.program import train_program
from pytest_accelperf.backends.measure.common import (
    Phases,
    fingerprint,
    with_state,
)
from pytest_accelperf.backends.measure.notes import say
from pytest_accelperf.backends.measure.recording import RunBuilder, deadline_after
from pytest_accelperf.backends.measure.stamps import StepClock
from pytest_accelperf.backends.protocol import Fit, Stepper, Task, TrainResult
from pytest_accelperf.backends.types import Untyped
from pytest_accelperf.collect.cases import Case
from pytest_accelperf.errors import ConfigError
from pytest_accelperf.provision.accel import Accelerator

INSTALL = "pip install 'pytest-accelperf[keras]'"


def _fingerprinted(model: Untyped) -> tuple[dict[str, np.ndarray], list[str]]:
    """The model's variables (trainable and not) by path, and beside them the
    optimizer's (its iteration count, learning rate and moments)."""
    def flat(variables: list[Untyped]) -> dict[str, np.ndarray]:
        return {str(v.path): np.asarray(jax.device_get(v.value)) for v in variables}

    own = flat([*model.trainable_variables, *model.non_trainable_variables])
    return with_state(own, flat(list(model.optimizer.variables)))


class KerasBackend:
    """Trains a :class:`KerasTask` with ``model.fit`` (Keras 3 on JAX) in this process, on
    JAX's first device."""

    name = "keras"

    def unavailable_reason(self) -> str | None:
        missing = [p for p in ("jax", "keras") if importlib.util.find_spec(p) is None]
        if missing:
            return f"backend 'keras' needs {', '.join(missing)}: {INSTALL}"
        return None

    def fits(self, case: Case, task: Task, accel: Accelerator, *,
             timeout: float | None = None) -> Fit:
        raise ConfigError(f"{case.id}: the keras backend does not search a maximum batch")

    def stepper(self, case: Case, task: Task, accel: Accelerator) -> Stepper:
        """The case's ``model.fit`` held between steps, for A/B mode
        (:class:`~.keras.stepper.KerasStepper`)."""
        from pytest_accelperf.backends.keras.stepper import KerasStepper

        return KerasStepper(case, task, accel)

    def train(self, case: Case, task: Task, accel: Accelerator, *,
              timeout: float | None = None) -> TrainResult:
        keras_task = as_keras_task(task)
        one_device(case)
        deadline = deadline_after(timeout)
        phases = Phases()
        with phases("build"):
            built = build(keras_task, case)
        say(built.notes)
        draft = RunBuilder.for_case(case, accel.peak_flops, n_devices=1)
        model = built.model
        device = jax.devices()[0]  # where Keras places a model without a distribution
        with phases("probe"):
            probe = jax_probe(device)
        clock = StepClock(warmup=case.warmup, steps=case.steps, sync=lambda: synced(model),
                          probe=probe, deadline=deadline)
        callback = GateCallback(case, built.label, clock)
        keras.utils.set_random_seed(keras_task.seed_for(case))
        try:
            with phases("train"):
                model.fit(**built.kwargs, callbacks=[*built.callbacks, callback])
        except RuntimeError as exc:
            if not _is_oom(exc):
                raise
            draft.failed("oom", f"out of memory: {str(exc).splitlines()[0]}")
            draft.phases(phases.record())
            return TrainResult(run=draft.build(), notes=built.notes)
        finally:
            callback.unwrap(model)
        trained = clock.finish()
        draft.loop(trained, probe)
        if callback.batch_spec is not None:
            with phases("program"):
                program = train_program(model, callback.batch_spec)
            draft.counted(flops=program.record.get("flops"), program=program.record)
            if program.planned:
                draft.memory({f"{device.platform}:{device.id}": program.planned["required_bytes"]},
                             "memory_analysis")
            draft.detail(jit_compile=program.jitted)
        with phases("fingerprint"):
            params, state_names = _fingerprinted(model)
            draft.fingerprint(fingerprint(params, state_names))
        if built.notes:
            draft.detail(notes=list(built.notes))
        draft.stopped(trained, timeout, case, f"{built.label}: model.fit",
                      "a callback set model.stop_training, or the data ran out")
        draft.phases(phases.record())
        return TrainResult(run=draft.build(), params=params, state=model,
                           notes=built.notes)


BACKEND = KerasBackend()
