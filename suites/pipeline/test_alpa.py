"""Seed 004 with Alpa itself: the MLP split into two pipeline stages with
``alpa.mark_pipeline_boundary()``, ``PipeshardParallel(num_micro_batches=16,
layer_option="manual")``, parameters checked against a single-device step (atol=5e-3).

Alpa needs Python <= 3.9 and jax 0.3.x: the cases skip elsewhere with that reason.
"""

from __future__ import annotations

import importlib
from typing import Any

from pytest_accelperf import Case, CaseRunner, cases
from pytest_accelperf.jax import JaxTask


def make_alpa_task(case: Case) -> JaxTask:
    alpa: Any = importlib.import_module("alpa")
    import flax.linen as nn
    import jax
    import jax.numpy as jnp
    import optax

    dim = int(case.params.get("dim", 256))

    class ManualPipelineMLP(nn.Module):
        hidden_dim: int

        @nn.compact
        def __call__(self, x: Any) -> Any:
            x = nn.relu(nn.Dense(self.hidden_dim * 4)(x))
            x = nn.relu(nn.Dense(self.hidden_dim)(x))
            alpa.mark_pipeline_boundary()
            x = nn.relu(nn.Dense(self.hidden_dim * 4)(x))
            return nn.relu(nn.Dense(self.hidden_dim)(x))

    model = ManualPipelineMLP(hidden_dim=dim)
    k1, k2 = jax.random.split(jax.random.PRNGKey(0))
    w, b = jax.random.normal(k1, (dim, dim)), jax.random.normal(k2, (dim,))

    def make_batch(step: int) -> dict[str, Any]:
        kx, kn = jax.random.split(jax.random.PRNGKey(100 + step))
        x = jax.random.normal(kx, (case.batch, dim))
        return {"x": x, "y": x @ w + b + 0.1 * jax.random.normal(kn, (case.batch, dim))}

    return JaxTask(
        init_params=lambda key: model.init(key, jnp.ones((1, dim))),
        loss_fn=lambda params, batch: jnp.mean((model.apply(params, batch["x"]) - batch["y"])
                                               ** 2),
        make_batch=make_batch, optimizer=optax.adam(1e-3))


@cases(Case(backend="alpa", batch=256, mesh=(1, 8), steps=5, reference=True,
            accels=("gpu",), label="pipeshard", params={"microbatches": 16,
                                                        "layers": "manual"}))
def test_alpa_pipeshard_matches_single_device(accelperf: CaseRunner) -> None:
    result = accelperf.train(make_alpa_task(accelperf.case))
    assert result.check("reference").verdict.value == "pass"
