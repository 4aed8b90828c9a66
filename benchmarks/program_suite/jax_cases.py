"""The JAX steps of the program benchmark: a two-layer MLP, plain SGD.

``mlp(...)`` is ``relu(x @ w1) @ w2`` regressed on a target; its arguments are the
injections of :mod:`inject` (the same switches a pull request would flip in real code).
"""

from __future__ import annotations

import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec

from pytest_accelperf.jax import JaxStep

P: Any = PartitionSpec  # untyped in jax
D = 256  # width of both layers


def mlp(batch: int, *, sharded: bool = False, lose_sharding: bool = False,
        extra_matmul: bool = False, precision: str | None = None,
        leak: bool = False, slow_batch: float = 0.0) -> JaxStep:
    """``sharded``: both parameters split by columns over ``model`` (``lose_sharding``:
    ``w1`` replicated instead); ``extra_matmul``: one more ``@ w2`` in the loss;
    ``precision``: the step traced under ``jax.default_matmul_precision``; ``leak``:
    ``make_batch`` keeps each batch's inputs on the device in a list; ``slow_batch``:
    ``make_batch`` spends that many more seconds of CPU time a batch (a busy loop on the
    thread's own clock: the same work whatever else the machine runs)."""
    kept: list[Any] = []

    def init(key: Any) -> dict[str, Any]:
        k1, k2 = jax.random.split(key)
        return {"w1": jax.random.normal(k1, (D, D)) * 0.05,
                "w2": jax.random.normal(k2, (D, D)) * 0.05}

    def loss(p: dict[str, Any], b: dict[str, Any]) -> Any:
        h = jax.nn.relu(b["x"] @ p["w1"])
        if extra_matmul:
            h = jnp.tanh(h @ p["w2"])
        y = h @ p["w2"]
        return jnp.mean((y - b["y"]) ** 2)

    def step(p: dict[str, Any], b: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        if precision:
            with jax.default_matmul_precision(precision):
                value, grads = jax.value_and_grad(loss)(p, b)
        else:
            value, grads = jax.value_and_grad(loss)(p, b)
        return jax.tree.map(lambda w, g: w - 0.01 * g, p, grads), {"loss": value}

    def make_batch(i: int) -> dict[str, Any]:
        r = np.random.default_rng(i)
        x = r.standard_normal((batch, D), dtype=np.float32)
        if leak:  # "cache" the batch on the device, and never drop it
            kept.append(jax.device_put(x))
        end = time.thread_time() + slow_batch
        while time.thread_time() < end:  # a slower batch function: more CPU work a batch
            pass
        return {"x": x, "y": np.tanh(x)}

    col = P(None, "model")
    specs = ({"w1": P() if lose_sharding else col, "w2": col} if sharded
             else {"w1": P(), "w2": P()})
    return JaxStep(init=init, step=step, make_batch=make_batch, state_specs=specs)
