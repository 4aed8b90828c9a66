"""Seed 004's MLP (fit y = Wx + b with Dense/relu layers, adam, MSE), cut into pipeline stages.

Seed 004 splits a 4-layer MLP (dim 2048, batch 2048) into 2 Alpa stages with 16
microbatches and checks the parameters after one step against a single-device step with
``assert_allclose(atol=5e-3)``. Here each stage is two Dense layers (``dim -> 2*dim ->
dim``, relu), ``n_stages`` of them, at dim 64 and batch 64: a few milliseconds a step on
8 virtual CPU devices.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from pytest_accelperf.collect.cases import Case
from pytest_accelperf.jax import PipelineTask

DIM = 64


def make_task(case: Case) -> PipelineTask:
    dim = int(case.params.get("dim", DIM))
    n_stages = int(case.params.get("stages", 4))
    rng = np.random.default_rng(0)
    true_w = rng.normal(size=(dim, dim)).astype(np.float32) / np.sqrt(dim)
    true_b = rng.normal(size=(dim,)).astype(np.float32)

    def init_stage(key: Any) -> dict[str, Any]:
        k1, k2 = jax.random.split(key)
        return {"w1": jax.random.normal(k1, (dim, 2 * dim)) / np.sqrt(dim),
                "b1": jnp.zeros((2 * dim,)),
                "w2": jax.random.normal(k2, (2 * dim, dim)) / np.sqrt(2 * dim),
                "b2": jnp.zeros((dim,))}

    def stage_fn(p: dict[str, Any], x: Any) -> Any:
        h = jax.nn.relu(x @ p["w1"] + p["b1"])
        return jax.nn.relu(h @ p["w2"] + p["b2"])

    def loss_fn(out: Any, batch: dict[str, Any]) -> Any:
        return jnp.mean((out - batch["y"]) ** 2)

    def make_batch(step: int) -> dict[str, np.ndarray]:
        r = np.random.default_rng(1000 + step)
        x = r.normal(size=(case.batch, dim)).astype(np.float32)
        y = x @ true_w + true_b + 0.1 * r.normal(size=(case.batch, dim)).astype(np.float32)
        return {"x": x, "y": y}

    return PipelineTask(init_stage=init_stage, stage_fn=stage_fn, loss_fn=loss_fn,
                        make_batch=make_batch, optimizer=optax.adam(1e-3), n_stages=n_stages,
                        microbatches=int(case.params.get("microbatches", 4)))
