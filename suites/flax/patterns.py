"""A small synthetic image-classification set for the Flax suites: 16x16 grey images of
10 classes, each class a fixed random pattern, seen through noise and a random brightness.

Deterministic per step (``batch(step, size)``), so a sharded run and its single-device
reference see the same images, and large enough in noise that a small CNN needs a few
dozen steps to separate the classes: the loss and the accuracy move over a case.
"""

from __future__ import annotations

import numpy as np

N_CLASSES = 10
SIZE = 16
_PATTERNS = np.random.default_rng(1234).normal(size=(N_CLASSES, SIZE, SIZE, 1))


def batch(step: int, size: int, *, split: str = "train") -> dict[str, np.ndarray]:
    """``{"image": float32[size, 16, 16, 1], "label": int32[size]}`` of ``step``."""
    rng = np.random.default_rng([0 if split == "train" else 1, step])
    label = rng.integers(0, N_CLASSES, size=size)
    brightness = rng.uniform(0.5, 1.5, size=(size, 1, 1, 1))
    noise = rng.normal(scale=1.5, size=(size, SIZE, SIZE, 1))
    image = _PATTERNS[label] * brightness + noise
    return {"image": image.astype(np.float32), "label": label.astype(np.int32)}
