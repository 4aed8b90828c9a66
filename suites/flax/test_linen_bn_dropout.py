"""A Flax linen CNN with BatchNorm and Dropout, trained by its own ``train_step``.

The model, the ``TrainState`` (with ``batch_stats`` and a dropout ``key``) and the
``train_step`` are written as Flax's guides write them ("Batch normalization" and
"Dropout": ``mutable=['batch_stats']``, ``rngs={'dropout': ...}`` with a key folded with
``state.step``, metrics returned beside the state). The plugin takes the step unchanged
(:class:`~pytest_accelperf.jax.JaxStep`), jits it with the case's shardings, times
it, records the loss and the accuracy of every step and hands the trained state back: the
test evaluates it on held-out images with the running batch statistics.

``test_pmap_style`` is the same model written for ``pmap`` (BatchNorm over
``axis_name='batch'``, gradients and metrics averaged with ``lax.pmean``): the plugin binds
``'batch'`` to the mesh's ``data`` axis (``bind_axes``).
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax.training import train_state
from patterns import batch

from pytest_accelperf import CaseRunner, cases
from pytest_accelperf.jax import JaxStep


class CNN(nn.Module):
    axis_name: str | None = None  # 'batch' in pmap code

    @nn.compact
    def __call__(self, x: jax.Array, train: bool) -> jax.Array:
        x = nn.Conv(features=16, kernel_size=(3, 3))(x)
        x = nn.BatchNorm(use_running_average=not train, axis_name=self.axis_name)(x)
        x = nn.avg_pool(nn.relu(x), window_shape=(2, 2), strides=(2, 2))
        x = x.reshape((x.shape[0], -1))  # flatten
        x = nn.relu(nn.Dense(features=64)(x))
        x = nn.Dropout(rate=0.2, deterministic=not train)(x)
        return nn.Dense(features=10)(x)


class TrainState(train_state.TrainState):
    batch_stats: Any
    key: jax.Array


def create_train_state(key: jax.Array, axis_name: str | None = None) -> TrainState:
    params_key, dropout_key = jax.random.split(key)
    model = CNN(axis_name=axis_name)
    variables = model.init(params_key, jnp.ones((1, 16, 16, 1)), train=False)
    return TrainState.create(apply_fn=model.apply, params=variables["params"],
                             batch_stats=variables["batch_stats"], key=dropout_key,
                             tx=optax.adam(1e-3))


@jax.jit
def train_step(state: TrainState, batch: dict[str, jax.Array]) -> tuple[TrainState, Any]:
    dropout_train_key = jax.random.fold_in(key=state.key, data=state.step)

    def loss_fn(params: Any) -> tuple[jax.Array, Any]:
        logits, updates = state.apply_fn(
            {"params": params, "batch_stats": state.batch_stats},
            x=batch["image"], train=True, rngs={"dropout": dropout_train_key},
            mutable=["batch_stats"])
        loss = optax.softmax_cross_entropy_with_integer_labels(
            logits=logits, labels=batch["label"]).mean()
        return loss, (logits, updates)

    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
    (loss, (logits, updates)), grads = grad_fn(state.params)
    state = state.apply_gradients(grads=grads)
    state = state.replace(batch_stats=updates["batch_stats"])
    metrics = {
        "loss": loss,
        "accuracy": jnp.mean(jnp.argmax(logits, -1) == batch["label"]),
    }
    return state, metrics


@jax.jit
def eval_step(state: TrainState, batch: dict[str, jax.Array]) -> jax.Array:
    logits = state.apply_fn({"params": state.params, "batch_stats": state.batch_stats},
                            x=batch["image"], train=False)
    return jnp.mean(jnp.argmax(logits, -1) == batch["label"])


@cases(backend="jax", mesh=[None, (8, 1)], batch=[128], steps=100, warmup=2)
def test_linen_bn_dropout(accelperf: CaseRunner) -> None:
    size = accelperf.case.batch
    result = accelperf.train(JaxStep(init=create_train_state, step=train_step,
                                     make_batch=lambda step: batch(step, size)))
    assert len(result.run.metrics["accuracy"]) == len(result.run.losses)
    held_out = eval_step(result.state, batch(0, 512, split="test"))
    assert float(held_out) > 0.5, f"held-out accuracy {float(held_out):.2f}"


def pmap_train_step(state: TrainState, batch: dict[str, jax.Array]) -> tuple[TrainState, Any]:
    """The step as pmap code writes it: each device its share of the batch, averaged."""
    dropout_key = jax.random.fold_in(jax.random.fold_in(state.key, state.step),
                                     jax.lax.axis_index("batch"))

    def loss_fn(params: Any) -> tuple[jax.Array, Any]:
        logits, updates = state.apply_fn(
            {"params": params, "batch_stats": state.batch_stats}, x=batch["image"],
            train=True, rngs={"dropout": dropout_key}, mutable=["batch_stats"])
        loss = optax.softmax_cross_entropy_with_integer_labels(
            logits=logits, labels=batch["label"]).mean()
        return loss, (logits, updates)

    (loss, (logits, updates)), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    grads = jax.lax.pmean(grads, axis_name="batch")
    state = state.apply_gradients(grads=grads, batch_stats=updates["batch_stats"])
    metrics = {"loss": loss, "accuracy": jnp.mean(jnp.argmax(logits, -1) == batch["label"])}
    return state, jax.lax.pmean(metrics, axis_name="batch")


@cases(backend="jax", mesh=[(4, 2)], batch=[128], steps=100, warmup=2, label="pmap")
def test_pmap_style(accelperf: CaseRunner) -> None:
    size = accelperf.case.batch
    result = accelperf.train(JaxStep(init=lambda key: create_train_state(key, "batch"),
                                     step=pmap_train_step, bind_axes={"batch": "data"},
                                     make_batch=lambda step: batch(step, size)))
    assert result.run.outcome == "ok"
