"""The ``jax-pipeline`` backend: GPipe pipeline parallelism in plain JAX (``jax.shard_map`` +
``lax.ppermute``), checked against the same model run sequentially on one device.

A :class:`PipelineTask` describes a model as ``n_stages`` identical stages (their parameters
stacked on a leading axis) plus a loss on the last stage's output. On a mesh with a
``"stage"`` axis each device holds one stage (``PartitionSpec("stage")``) and the batch is
split into ``microbatches``; a ``lax.scan`` over ``microbatches + stages - 1`` ticks runs,
on every device, its stage on the microbatch in front of it and passes the activation to
the next stage with ``ppermute`` (GPipe's forward schedule; ``jax.grad`` of it is the
backward schedule, the ppermutes transposed). With a ``"data"`` axis too (a data x stage
mesh) each data row pipelines its share of the batch and the loss is averaged across rows.

The training itself is the JAX backend's (AOT compile timed apart, every step blocked,
memory from the compiler, the drift probe); :meth:`PipelineBackend.train` binds the task to
the case's mesh, and for ``Case(reference=True)`` also trains the *sequential* model (the
stages applied one after another, no shard_map) on one device: the seed-004 check that a
pipelined step learns the same parameters as a single-device step (``reference_atol``,
default 5e-3).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, PartitionSpec

from pytest_accelperf.backends.jax.backend import BACKEND as JAX_BACKEND
from pytest_accelperf.backends.jax.compile import global_lowering
from pytest_accelperf.backends.jax.hlo import counted_model_flops
from pytest_accelperf.backends.jax.step import JaxTask
from pytest_accelperf.backends.protocol import Fit, TrainResult
from pytest_accelperf.backends.types import Batch, PyTree, UserValue
from pytest_accelperf.collect.cases import Case
from pytest_accelperf.errors import ConfigError
from pytest_accelperf.provision.accel import Accelerator

P: Any = PartitionSpec
# Untyped in jax: through Any so mypy --strict accepts the calls.
lax: Any = jax.lax
STAGE = "stage"
DATA = "data"


@dataclass
class PipelineTask:
    """A model of ``n_stages`` identical stages, pipelined over the mesh's ``stage`` axis.

    ``init_stage(key)`` returns one stage's parameters (stacked ``n_stages`` times with
    independent keys); ``stage_fn(stage_params, x)`` maps activations to activations of the
    same shape; ``loss_fn(outputs, batch)`` is the scalar loss of the last stage's outputs
    for the whole (local) batch. ``make_batch(step)`` returns the global host batch, a dict
    with the stages' input under ``input_key``. ``microbatches`` must divide the batch of
    every data row.
    """

    init_stage: Callable[[Any], PyTree]
    stage_fn: Callable[[PyTree, Any], Any]
    loss_fn: Callable[[Any, PyTree], Any]
    make_batch: Callable[[int], PyTree]
    optimizer: optax.GradientTransformation
    n_stages: int
    microbatches: int
    input_key: str = "x"
    seed: int = 0

    def init_params(self, key: jax.Array) -> PyTree:
        keys = jax.random.split(key, self.n_stages)
        return {"stages": jax.vmap(self.init_stage)(keys)}

    def sequential_loss(self, params: PyTree, batch: Batch) -> UserValue:
        """The model without a pipeline: every stage in turn on the whole batch."""
        x = batch[self.input_key]
        for s in range(self.n_stages):
            x = self.stage_fn(jax.tree.map(lambda a, s=s: a[s], params["stages"]), x)
        return self.loss_fn(x, batch)

    def pipelined_loss(self, mesh: Mesh) -> Callable[[PyTree, Batch], UserValue]:
        """The GPipe loss over ``mesh`` (needs a ``stage`` axis of size ``n_stages``)."""
        names = tuple(mesh.axis_names)
        if STAGE not in names or mesh.shape[STAGE] != self.n_stages:
            raise ConfigError(f"a {self.n_stages}-stage pipeline needs a mesh axis 'stage' of "
                             f"size {self.n_stages}; the case's mesh is {dict(mesh.shape)}: "
                             f"declare mesh=(..., {self.n_stages}) with axis_names "
                             f"(..., 'stage')")
        n_stages, n_micro, key, stage_fn, loss_fn = (self.n_stages, self.microbatches,
                                                     self.input_key, self.stage_fn,
                                                     self.loss_fn)
        batch_spec = P(DATA) if DATA in names else P()
        ticks = n_micro + n_stages - 1
        forward = [(i, i + 1) for i in range(n_stages - 1)]

        def local(params: PyTree, batch: Batch) -> UserValue:
            mine = jax.tree.map(lambda a: a[0], params["stages"])  # this device's stage
            stage = lax.axis_index(STAGE)
            x = batch[key]
            if x.shape[0] % n_micro:
                raise ConfigError(f"the batch of one data row ({x.shape[0]}) is not divisible "
                                 f"into {n_micro} microbatches")
            micro = x.reshape(n_micro, x.shape[0] // n_micro, *x.shape[1:])
            last = stage == n_stages - 1

            def tick(carry: tuple[jax.Array, jax.Array],
                     t: jax.Array) -> tuple[tuple[jax.Array, jax.Array], None]:
                incoming, outputs = carry
                fresh = micro[jnp.clip(t, 0, n_micro - 1)]
                out = stage_fn(mine, jnp.where(stage == 0, fresh, incoming))
                done = t - (n_stages - 1)  # the microbatch the last stage finishes now
                slot = jnp.clip(done, 0, n_micro - 1)
                keep = jnp.logical_and(last, done >= 0)
                outputs = outputs.at[slot].set(jnp.where(keep, out, outputs[slot]))
                return (lax.ppermute(out, STAGE, forward), outputs), None

            # The carry varies across stages (each holds its own activation): say so, as
            # shard_map's type system requires of a scan carry.
            init = jax.tree.map(lambda a: lax.pcast(a, (STAGE,), to="varying"),
                                (jnp.zeros_like(micro[0]), jnp.zeros_like(micro)))
            (_, outputs), _ = lax.scan(tick, init, jnp.arange(ticks))
            loss = loss_fn(outputs.reshape(x.shape), batch)
            loss = lax.psum(jnp.where(last, loss, 0.0), STAGE)
            return lax.pmean(loss, DATA) if DATA in names else loss

        return jax.shard_map(local, mesh=mesh, in_specs=(P(STAGE), batch_spec),
                             out_specs=P())

    def bind(self, mesh: Mesh | None) -> JaxTask:
        """The :class:`JaxTask` of this model: pipelined over ``mesh``, or sequential on
        one device when ``mesh`` is None."""
        loss = self.sequential_loss if mesh is None else self.pipelined_loss(mesh)
        return JaxTask(init_params=self.init_params, loss_fn=loss, make_batch=self.make_batch,
                       optimizer=self.optimizer,
                       param_specs=lambda _params: {"stages": P(STAGE)},
                       batch_spec=P(DATA), seed=self.seed)


def model_flops_of(task: PipelineTask, case: Case) -> float | None:
    """The model's FLOPs of a step: the sequential model's step (every stage in turn over
    the global batch) lowered on one device, its loops counted per iteration. The
    pipelined program is a ``shard_map``, whose unpartitioned program is one stage's share
    of the schedule, bubble ticks included: 12.2 MFLOP for the 25.2 the 4-stage MLP of
    ``suites/pipeline`` does at batch 64 (2.5 before loops were counted). None where it
    cannot be lowered."""
    lowered = global_lowering(task.bind(None), case)
    return None if lowered is None else counted_model_flops(lowered)


class PipelineBackend:
    """Trains a :class:`PipelineTask` through the JAX backend (see the module docstring)."""

    name = "jax-pipeline"

    def unavailable_reason(self) -> str | None:
        return JAX_BACKEND.unavailable_reason()

    def fits(self, case: Case, task: PipelineTask, accel: Accelerator, *,
             timeout: float | None = None) -> Fit:
        return JAX_BACKEND.fits(case, task.bind(accel.mesh(case.mesh, case.axis_names)),
                                accel, timeout=timeout)

    def settle(self, accel: Accelerator, within: float) -> bool:
        return JAX_BACKEND.settle(accel, within)

    def train(self, case: Case, task: PipelineTask, accel: Accelerator, *,
              timeout: float | None = None) -> TrainResult:
        if case.mesh is None:
            raise ConfigError(f"{case.id}: a pipeline case needs a mesh with a 'stage' axis, "
                             f"e.g. mesh=({task.n_stages},), axis_names=('stage',)")
        mesh = accel.mesh(case.mesh, case.axis_names)
        result = JAX_BACKEND.train(replace(case, reference=False), task.bind(mesh), accel,
                                   timeout=timeout)
        if result.run.program is not None and "flops" in result.run.program:
            program = result.run.program.copy()
            flops = model_flops_of(task, case)
            if flops is not None:
                program["flops"], program["global_flops"] = flops, True
            else:  # one stage's share of the schedule is not the model's FLOPs
                del program["flops"]
            result.run = replace(result.run, program=program)
        result.run = result.run.noted(pipeline={"stages": task.n_stages,
                                                "microbatches": task.microbatches,
                                                "mesh": dict(mesh.shape)})
        if case.reference and result.run.outcome == "ok":
            single = replace(case, mesh=None, reference=False)
            ref = JAX_BACKEND.train(single, task.bind(None), accel, timeout=timeout)
            if ref.run.outcome == "ok":
                result.reference_params = ref.params
            else:
                result.run = result.run.noted(reference=f"single-device reference not run: "
                                                        f"{ref.run.outcome} {ref.run.message}")
        return result


BACKEND = PipelineBackend()
