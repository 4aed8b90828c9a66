"""The train step the gate benchmark measures: a JAX MLP, about 10 ms a step on 2 CPU cores.

``CASE`` is the one training case both arms of the benchmark time; ``make_task(case)``
builds its :class:`~pytest_accelperf.jax.JaxTask`. The model is a 3-hidden-layer
GELU MLP regressing ``tanh`` of its input, trained with AdamW: a dense, jitted,
compute-bound step of the size the issue's measurement used (about 10 ms a step here),
whose only work is XLA's, so a slowdown that the benchmark injects is the only change
between runs. Plain jax and optax: no flax, so a session compiles it in well under a second.

One device (``--accelperf-cpu-devices=1``), no mesh: the pytest-benchmark arm times a
plain ``jax.jit`` step on the default device, as the issue's gate did, and a mesh of
virtual CPU devices on two cores would add the scheduling noise of several XLA device
threads sharing two cores, which is not what either gate is being asked about.
"""

from __future__ import annotations

import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from pytest_accelperf.collect.cases import Case
from pytest_accelperf.jax import JaxTask

#: Model size: about 10 ms a step on this project's 2-core CPU machine, one device
#: (measured on a quiet moment: hidden 704 took 7.1-8.2 ms, 832 9.3-10.6 ms, 896 9.7-11.6).
DIM, HIDDEN, LAYERS = 256, 832, 3
#: Measured steps per case: about 1 s of steps, the time pytest-benchmark's default
#: ``--benchmark-max-time=1.0`` gives its arm, so both gates see as many steps.
#: ``ACCELPERF_GATE_STEPS`` overrides it (the benchmark's --steps).
STEPS = int(os.environ.get("ACCELPERF_GATE_STEPS", "100"))
WARMUP = 5
BATCH = 256

CASE = Case(backend="jax", batch=BATCH, steps=STEPS, warmup=WARMUP, label="gate",
            params={"dim": DIM, "hidden": HIDDEN, "layers": LAYERS})


def make_task(case: Case = CASE) -> JaxTask:
    """The MLP task of ``case`` (``params``: dim, hidden, layers; ``case.batch``)."""
    dim = int(case.params.get("dim", DIM))
    hidden = int(case.params.get("hidden", HIDDEN))
    layers = int(case.params.get("layers", LAYERS))
    widths = [dim] + [hidden] * layers + [dim]

    def init_params(key: Any) -> Any:
        keys = jax.random.split(key, len(widths) - 1)
        return [{"w": jax.random.normal(k, (a, b)) / a**0.5, "b": jnp.zeros((b,))}
                for k, a, b in zip(keys, widths[:-1], widths[1:], strict=True)]

    def loss_fn(params: Any, batch: Any) -> Any:
        x = batch["x"]
        for i, layer in enumerate(params):
            x = x @ layer["w"] + layer["b"]
            if i < len(params) - 1:
                x = jax.nn.gelu(x)
        return jnp.mean((x - batch["y"]) ** 2)

    def make_batch(step: int) -> dict[str, np.ndarray]:
        # Elementwise only: a numpy matrix product here (a BLAS call between two timed
        # steps) left OpenBLAS threads spinning into the next step and made it 1.7-2x
        # slower on two cores.
        rng = np.random.default_rng([7, step])
        x = rng.standard_normal((case.batch, dim), dtype=np.float32)
        return {"x": x, "y": np.tanh(x)}

    return JaxTask(init_params=init_params, loss_fn=loss_fn, make_batch=make_batch,
                   optimizer=optax.adamw(1e-3))
