"""The Alpa backend: a :class:`~pytest_accelperf.backends.jax.step.JaxTask` parallelized by
``alpa.parallelize`` with ``PipeshardParallel`` (pipeline + shard parallelism, seed 004).

Alpa runs on Ray with its own jaxlib build and needs Python <= 3.9 and jax 0.3.x, so the
backend is registered lazily and skips with that reason everywhere else. Note that this
plugin itself requires Python >= 3.10: until Alpa supports a newer Python (or the plugin an
older one) the cases skip everywhere, and this module has never run against a real Alpa.

Case fields it reads from ``case.params``: ``microbatches`` (``num_micro_batches``, default
16), ``layers`` (``"manual"``: the model marks its stages with
``alpa.mark_pipeline_boundary()``; an int ``n``: ``alpa.AutoLayerOption(layer_num=n)``),
``stage_option`` (``"auto"`` or ``"uniform"``, default ``"auto"``). The train step uses
``alpa.grad`` so gradient accumulation across microbatches is separated from the update,
as Alpa requires. The first call compiles (Alpa's stage profiling and solver included) and
is timed as ``compile_time``; every measured step ends with the executable's ``sync()``.
``Case(reference=True)`` also runs the same steps jitted on one device with plain JAX and
compares the parameters (``reference_atol``, default 5e-3, the seed's ``assert_allclose``).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from pytest_accelperf.backends.jax.step import JaxTask
from pytest_accelperf.backends.measure.common import fingerprint
from pytest_accelperf.backends.measure.loop import StepFns, run_steps
from pytest_accelperf.backends.measure.recording import RunBuilder, deadline_after
from pytest_accelperf.backends.protocol import Fit, TrainResult
from pytest_accelperf.backends.types import Batch, Framework, PyTree, Untyped, UserValue
from pytest_accelperf.collect.cases import Case
from pytest_accelperf.provision.accel import Accelerator

INSTALL = ("Alpa needs Python <= 3.9 and jax 0.3.x: in a Python 3.9 environment, pip install "
           "alpa and its jaxlib build (https://alpa.ai/install.html)")


def _flat(jax: Framework, tree: PyTree) -> dict[str, np.ndarray]:
    leaves, _ = jax.tree_util.tree_flatten_with_path(tree)
    return {jax.tree_util.keystr(path): np.asarray(leaf) for path, leaf in leaves}


def _method(alpa: Framework, case: Case) -> Untyped:
    layers = case.params.get("layers", "manual")
    layer_option = (layers if layers == "manual"
                    else alpa.AutoLayerOption(layer_num=int(layers)))
    return alpa.PipeshardParallel(num_micro_batches=int(case.params.get("microbatches", 16)),
                                  layer_option=layer_option,
                                  stage_option=case.params.get("stage_option", "auto"))


def _steps(jax: Framework, optax: Framework, task: JaxTask,
           grad: Untyped) -> Callable[[PyTree, PyTree, Batch], tuple[PyTree, PyTree, UserValue]]:
    def step(params: PyTree, opt_state: PyTree,
             batch: Batch) -> tuple[PyTree, PyTree, UserValue]:
        def loss_of(p: PyTree) -> UserValue:
            return task.loss_fn(p, batch)

        loss = loss_of(params)
        grads = grad(loss_of)(params)
        updates, opt_state = task.optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return step


@dataclass
class _Live:
    """The training as Alpa's steps go: the state, and the executable of the first step
    (None until that step compiled it)."""

    params: PyTree
    opt_state: PyTree
    executable: Untyped = None


class AlpaBackend:
    name = "alpa"

    def unavailable_reason(self) -> str | None:
        if importlib.util.find_spec("alpa") is None:
            return f"{INSTALL} (this is Python {sys.version_info.major}.{sys.version_info.minor})"
        return None

    def fits(self, case: Case, task: JaxTask, accel: Accelerator, *,
             timeout: float | None = None) -> Fit:
        raise NotImplementedError(f"{case.id}: Alpa plans memory per stage while it compiles "
                                  f"and exposes no single-step memory query to search with; "
                                  f"search the maximum batch with the jax backend")

    def train(self, case: Case, task: JaxTask, accel: Accelerator, *,
              timeout: float | None = None) -> TrainResult:
        alpa = importlib.import_module("alpa")
        jax = importlib.import_module("jax")
        optax = importlib.import_module("optax")
        deadline = deadline_after(timeout)
        alpa.init(cluster="ray")
        try:
            step = alpa.parallelize(_steps(jax, optax, task, alpa.grad),
                                    method=_method(alpa, case))
            params = task.init_params(jax.random.PRNGKey(task.seed))
            opt_state = task.optimizer.init(params)
            draft = RunBuilder.for_case(case, accel.peak_flops, n_devices=case.n_devices)
            live = _Live(params, opt_state)

            def one_step(i: int, batch: Batch) -> UserValue:
                live.params, live.opt_state, loss = step(live.params, live.opt_state, batch)
                if live.executable is None:
                    live.executable = step.get_last_executable()
                return loss

            def sync() -> None:
                if live.executable is not None:  # none before the first call compiled it
                    live.executable.sync()

            fns: StepFns[Any, Any] = StepFns(prepare=task.make_batch, run=one_step,
                                             read=lambda loss: (float(loss), {}), sync=sync)
            # Step 0 compiles (with Alpa's stage profiling and solver): a warm-up step
            # whose wall time is the compile time, never a measured one.
            trained = run_steps(fns, warmup=max(1, case.warmup), steps=case.steps,
                                deadline=deadline)
            draft.compiled(trained.warmup_times[0])
            draft.loop(trained)
            draft.end(trained, timeout, case)  # a loss not finite, or the deadline
            executable = live.executable
            params = live.params
            if hasattr(executable, "get_total_allocation_size"):
                draft.memory({"alpa:total": int(executable.get_total_allocation_size())},
                             "alpa_allocation")
            flat = _flat(jax, jax.device_get(params))
            draft.fingerprint(fingerprint(flat))
        finally:
            alpa.shutdown()
        reference = self._reference(jax, optax, case, task) if case.reference else None
        return TrainResult(run=draft.build(), params=flat, reference_params=reference)

    def _reference(self, jax: Framework, optax: Framework, case: Case,
                   task: JaxTask) -> dict[str, np.ndarray]:
        """The same steps jitted on one device with plain JAX (``jax.grad``)."""
        step = jax.jit(_steps(jax, optax, task, jax.grad))
        params = task.init_params(jax.random.PRNGKey(task.seed))
        opt_state = task.optimizer.init(params)
        for i in range(case.warmup + case.steps):
            params, opt_state, _ = step(params, opt_state, task.make_batch(i))
        return _flat(jax, jax.device_get(params))


BACKEND = AlpaBackend()
