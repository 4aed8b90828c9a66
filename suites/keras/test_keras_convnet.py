"""A Keras 3 convnet trained by ``model.fit`` under the gate, on Keras's JAX backend.

The model is a small image classifier of the kind Keras's guides write (two convolution and
pooling blocks, dropout, a softmax head), compiled with Adam and sparse categorical
cross-entropy, and handed to ``KerasTask`` as ``model.fit`` takes it: arrays ``x`` and
``y`` and ``fit``'s keyword arguments (``batch_size`` from the case, ``shuffle``). The data
is synthetic 28 x 28 images and labels (nothing is downloaded). keras is imported inside
the factories: the backend imports it first, on JAX (``KERAS_BACKEND=jax``); a suite that
imports keras at its top sets ``os.environ["KERAS_BACKEND"] = "jax"`` before.

Two cases at batch 32: float32, and ``mixed_bfloat16`` (Keras's global dtype policy, set
by the model's factory: the program records its convolutions in bf16).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from pytest_accelperf import Case, CaseRunner, cases
from pytest_accelperf.keras import KerasTask

if TYPE_CHECKING:
    import keras

SAMPLES, CLASSES = 1024, 10


def convnet(case: Case) -> keras.Model:
    import keras  # imported by the backend first, on JAX (a case without keras is skipped)

    keras.mixed_precision.set_global_policy(case.params.get("policy", "float32"))
    layers = keras.layers
    model = keras.Sequential([
        keras.Input(shape=(28, 28, 1)),
        layers.Conv2D(16, kernel_size=(3, 3), activation="relu"),
        layers.MaxPooling2D(pool_size=(2, 2)),
        layers.Conv2D(32, kernel_size=(3, 3), activation="relu"),
        layers.MaxPooling2D(pool_size=(2, 2)),
        layers.Flatten(),
        layers.Dropout(0.5),
        layers.Dense(CLASSES, activation="softmax", dtype="float32"),
    ])
    model.compile(loss="sparse_categorical_crossentropy", optimizer="adam",
                  metrics=["accuracy"])
    return model


def images(case: Case) -> np.ndarray:
    rng = np.random.default_rng(0)
    return rng.random((SAMPLES, 28, 28, 1), dtype=np.float32)


def labels(case: Case) -> np.ndarray:
    return np.random.default_rng(1).integers(0, CLASSES, SAMPLES)


@cases(Case(backend="keras", batch=32, steps=12, warmup=2),
       Case(backend="keras", batch=32, steps=12, warmup=2, label="bf16",
            params={"policy": "mixed_bfloat16"}))
def test_keras_convnet(accelperf: CaseRunner) -> None:
    task = KerasTask(model=convnet, x=images, y=labels,
                     fit=lambda case: {"batch_size": case.batch, "shuffle": True})
    try:
        result = accelperf.train(task)
    finally:
        if "policy" in accelperf.case.params:  # the global policy back to Keras's default
            import keras

            keras.mixed_precision.set_global_policy("float32")
    assert result.run.outcome == "ok"
