"""The Flax step of the program benchmark: a small CNN with BatchNorm, trained by its own
``train_step`` as Flax's ImageNet example trains its ResNet (``mutable=['batch_stats']``,
the running statistics carried in the ``TrainState``). ``momentum`` is BatchNorm's (the
ImageNet example's 0.9; the injection ``bn_momentum`` makes it Flax's default 0.99): it
changes only ``batch_stats``, which the step uses at evaluation, never the loss.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax.training import train_state

from pytest_accelperf.jax import JaxStep


class CNN(nn.Module):
    momentum: float = 0.9

    @nn.compact
    def __call__(self, x: jax.Array, train: bool) -> jax.Array:
        x = nn.Conv(features=16, kernel_size=(3, 3), use_bias=False)(x)
        x = nn.BatchNorm(use_running_average=not train, momentum=self.momentum,
                         epsilon=1e-5)(x)
        x = nn.avg_pool(nn.relu(x), window_shape=(2, 2), strides=(2, 2))
        x = x.reshape((x.shape[0], -1))
        return nn.Dense(features=10)(x)


class TrainState(train_state.TrainState):
    batch_stats: Any


def bn_cnn(batch: int, *, momentum: float = 0.9) -> JaxStep:
    model = CNN(momentum=momentum)

    def init(key: jax.Array) -> TrainState:
        variables = model.init(key, jnp.ones((1, 16, 16, 1)), train=False)
        return TrainState.create(apply_fn=model.apply, params=variables["params"],
                                 batch_stats=variables["batch_stats"],
                                 tx=optax.sgd(0.05, momentum=0.9))

    def train_step(state: TrainState, b: dict[str, jax.Array]) -> tuple[TrainState, Any]:
        def loss_fn(params: Any) -> tuple[jax.Array, Any]:
            logits, updates = state.apply_fn(
                {"params": params, "batch_stats": state.batch_stats}, b["image"],
                train=True, mutable=["batch_stats"])
            loss = optax.softmax_cross_entropy_with_integer_labels(logits, b["label"]).mean()
            return loss, updates

        (loss, updates), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
        state = state.apply_gradients(grads=grads, batch_stats=updates["batch_stats"])
        return state, {"loss": loss}

    def make_batch(step: int) -> dict[str, np.ndarray]:
        r = np.random.default_rng(step)
        label = r.integers(0, 10, size=batch)
        image = r.standard_normal((batch, 16, 16, 1), dtype=np.float32)
        image[:, label % 4, :, 0] += 2.0  # a learnable signal: a bright row per class
        return {"image": image, "label": label.astype(np.int32)}

    return JaxStep(init=init, step=train_step, make_batch=make_batch)
