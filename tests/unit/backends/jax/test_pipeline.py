"""The GPipe pipeline (shard_map + ppermute) computes the sequential model's loss and
gradients, on a stage-only and a data x stage mesh, and says clearly what a mesh lacks."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

# The JAX backend's own frameworks (pip install 'pytest-accelperf[jax]').
pytest.importorskip("flax")
pytest.importorskip("optax")
import jax

sys.path.insert(0, str(Path(__file__).resolve().parents[4] / "suites" / "pipeline"))
from mlp_stages import make_task

from pytest_accelperf.collect.cases import Case
from pytest_accelperf.provision.accel import provision


@pytest.fixture(scope="module")
def accel():  # type: ignore[no-untyped-def]
    return provision("cpu", 8, None)


@pytest.mark.slow
@pytest.mark.parametrize(("mesh", "names"), [((4,), ("stage",)), ((2, 4), ("data", "stage"))])
def test_pipelined_loss_and_grads_equal_sequential(accel, mesh, names) -> None:  # type: ignore[no-untyped-def]
    case = Case(backend="jax-pipeline", batch=32, mesh=mesh, axis_names=names)
    task = make_task(case)
    params = task.init_params(jax.random.key(0))
    batch = task.make_batch(0)
    m = accel.mesh(mesh, names)
    seq_loss, seq_grads = jax.value_and_grad(task.sequential_loss)(params, batch)
    pipe_loss, pipe_grads = jax.jit(jax.value_and_grad(task.pipelined_loss(m)))(params, batch)
    assert float(pipe_loss) == pytest.approx(float(seq_loss), rel=1e-5)
    for a, b in zip(jax.tree.leaves(pipe_grads), jax.tree.leaves(seq_grads), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5)


def test_a_mesh_without_the_stage_axis_is_refused(accel) -> None:  # type: ignore[no-untyped-def]
    case = Case(backend="jax-pipeline", batch=32, mesh=(8,), axis_names=("data",))
    task = make_task(case)
    with pytest.raises(ValueError, match="needs a mesh axis 'stage' of size 4"):
        task.pipelined_loss(accel.mesh((8,), ("data",)))


def test_a_batch_not_divisible_into_microbatches_is_refused(accel) -> None:  # type: ignore[no-untyped-def]
    case = Case(backend="jax-pipeline", batch=6, mesh=(4,), axis_names=("stage",))
    task = make_task(case)
    loss = task.pipelined_loss(accel.mesh((4,), ("stage",)))
    with pytest.raises(ValueError, match="not divisible into 4 microbatches"):
        loss(task.init_params(jax.random.key(0)), task.make_batch(0))


@pytest.mark.slow  # compiles a pipeline (5 s): not in the quick loop
def test_the_program_counts_the_models_flops_and_every_tick(accel) -> None:  # type: ignore[no-untyped-def]
    """The record of a pipelined step (4 stages of dim -> 2 dim -> dim, 4 microbatches,
    7 ticks), against the analytic count 2·m·n·k per matmul, forward and backward: the
    model's FLOPs are the sequential model's (the pipelined program is one stage's share
    of the schedule: it read 2.5 MFLOP, 12.2 once its ticks were counted, for the model's
    25.2), and the hardware FLOPs every device's every tick, bubbles included (counted
    once before, one tick of seven)."""
    from pytest_accelperf.backends.jax.pipeline import BACKEND

    dim, batch = 64, 64
    case = Case(backend="jax-pipeline", batch=batch, mesh=(4,), axis_names=("stage",),
                steps=2, warmup=1)
    run = BACKEND.train(case, make_task(case), accel, timeout=300).run
    assert run.outcome == "ok", run.message
    program = run.program
    assert program is not None and program["global_flops"] is True
    stage = 2 * (2 * dim * 2 * dim)  # two matmuls a row, forward
    model = 3 * 4 * stage * batch  # forward and backward (two matmuls each), 4 stages
    assert program["flops"] == pytest.approx(model, rel=0.03)
    ticks, rows = 4 + 4 - 1, batch // 4
    assert program["hardware_flops"] == pytest.approx(4 * ticks * 3 * stage * rows, rel=0.06)
    assert program["loops"] == 2  # the forward and the backward scan over the ticks
    assert program["collectives"]["collective-permute"]["count"] == 2 * ticks
