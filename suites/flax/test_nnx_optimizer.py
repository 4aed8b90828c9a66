"""A Flax NNX CNN with BatchNorm and Dropout, an ``nnx.Optimizer`` and ``nnx.MultiMetric``.

The model, the optimizer, the metrics and ``train_step`` are written as Flax's NNX MNIST
tutorial writes them: ``train_step(model, optimizer, metrics, batch)`` decorated with
``nnx.jit``, updating all three in place and returning nothing. The plugin takes it
unchanged (:func:`~pytest_accelperf.jax.nnx_step`): it splits the objects into a
state, jits the step over the case's shardings, reads the metrics of every step (reset
before it, computed after), and hands the trained objects back, which the test evaluates
in ``model.eval()`` mode.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import jax
import optax
from flax import nnx
from patterns import batch

from pytest_accelperf import CaseRunner, cases
from pytest_accelperf.jax import nnx_step


class CNN(nnx.Module):
    """A simple CNN model."""

    def __init__(self, *, rngs: nnx.Rngs) -> None:
        self.conv1 = nnx.Conv(1, 16, kernel_size=(3, 3), rngs=rngs)
        self.batch_norm = nnx.BatchNorm(16, rngs=rngs)
        self.dropout = nnx.Dropout(rate=0.2, rngs=rngs)
        self.avg_pool = partial(nnx.avg_pool, window_shape=(2, 2), strides=(2, 2))
        self.linear1 = nnx.Linear(16 * 8 * 8, 64, rngs=rngs)
        self.linear2 = nnx.Linear(64, 10, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = self.avg_pool(nnx.relu(self.batch_norm(self.conv1(x))))
        x = x.reshape(x.shape[0], -1)  # flatten
        x = self.dropout(nnx.relu(self.linear1(x)))
        return self.linear2(x)


def loss_fn(model: CNN, batch: dict[str, jax.Array]) -> tuple[jax.Array, jax.Array]:
    logits = model(batch["image"])
    loss = optax.softmax_cross_entropy_with_integer_labels(
        logits=logits, labels=batch["label"]).mean()
    return loss, logits


@nnx.jit
def train_step(model: CNN, optimizer: nnx.Optimizer[Any], metrics: nnx.MultiMetric,
               batch: dict[str, jax.Array]) -> None:
    """Train for a single step."""
    grad_fn = nnx.value_and_grad(loss_fn, has_aux=True)
    (loss, logits), grads = grad_fn(model, batch)
    metrics.update(loss=loss, logits=logits, labels=batch["label"])  # In-place updates.
    optimizer.update(model, grads)  # In-place updates.


@nnx.jit
def eval_step(model: CNN, metrics: nnx.MultiMetric, batch: dict[str, jax.Array]) -> None:
    loss, logits = loss_fn(model, batch)
    metrics.update(loss=loss, logits=logits, labels=batch["label"])  # In-place updates.


@cases(backend="jax", mesh=[None, (8, 1)], batch=[128], steps=100, warmup=2)
def test_nnx_optimizer(accelperf: CaseRunner) -> None:
    model = CNN(rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adamw(0.005, 0.9), wrt=nnx.Param)
    metrics = nnx.MultiMetric(accuracy=nnx.metrics.Accuracy(),
                              loss=nnx.metrics.Average("loss"))
    size = accelperf.case.batch
    result = accelperf.train(nnx_step(train_step, (model, optimizer, metrics),
                                      make_batch=lambda step: batch(step, size)))
    model, optimizer, metrics = result.state
    model.eval()  # running batch statistics, no dropout
    metrics.reset()
    eval_step(model, metrics, batch(0, 512, split="test"))
    held_out = float(metrics.compute()["accuracy"])
    assert held_out > 0.5, f"held-out accuracy {held_out:.2f}"
