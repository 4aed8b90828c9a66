"""Held-out-style cases for the input check's false-alarm rate (benchmarks/input_sessions.py).

Two training loops as their authors write them, each with its own batch function:

- a Flax CNN with BatchNorm and Dropout, trained by the ``train_step`` Flax's guides write
  (``suites/flax/test_linen_bn_dropout.py``'s model and step), its batches made in numpy by
  an ImageNet-example-style augmentation (crop, flip, normalize of 32x32x3 images from a
  uint8 pool), on a mesh of 8 (the issue's ``mesh8x1``);
- nanoGPT's ``train.py`` loop (forward, ``loss.backward()``, ``optimizer.step()``,
  ``zero_grad(set_to_none=True)``) on a GPT of nanoGPT's shape, its batches made by
  nanoGPT's ``get_batch`` from an ``np.memmap`` of uint16 tokens.

Each case is declared twice: ``label="same"`` never changes, and ``label="planted"`` spins
``$ACCELPERF_PLANT_MS`` milliseconds of this thread's CPU time inside its batch function
(0 when recording: both record the same code). So one session holds the unchanged code and
the planted slowdown side by side, against baselines of the same code.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import torch
from flax.training import train_state
from torch import nn as tnn
from torch.nn import functional as F

from pytest_accelperf import Case, CaseRunner, cases
from pytest_accelperf.collect.cases import grid
from pytest_accelperf.jax import JaxStep
from pytest_accelperf.torch import TorchStep

PLANT_S = float(os.environ.get("ACCELPERF_PLANT_MS", "0")) / 1e3


def plant(case: Case) -> None:
    """The planted slowdown: this thread's CPU time, whatever the machine runs."""
    if case.label == "planted" and PLANT_S > 0:
        end = time.thread_time() + PLANT_S
        while time.thread_time() < end:
            pass


# -- Flax: the guides' CNN and train_step, an ImageNet-style numpy pipeline ----------------
class CNN(nn.Module):
    @nn.compact
    def __call__(self, x: jax.Array, train: bool) -> jax.Array:
        x = nn.Conv(features=16, kernel_size=(3, 3))(x)
        x = nn.BatchNorm(use_running_average=not train)(x)
        x = nn.avg_pool(nn.relu(x), window_shape=(2, 2), strides=(2, 2))
        x = nn.Conv(features=16, kernel_size=(3, 3))(x)
        x = nn.avg_pool(nn.relu(x), window_shape=(2, 2), strides=(2, 2))
        x = x.reshape((x.shape[0], -1))
        x = nn.relu(nn.Dense(features=64)(x))
        x = nn.Dropout(rate=0.2, deterministic=not train)(x)
        return nn.Dense(features=10)(x)


class TrainState(train_state.TrainState):
    batch_stats: Any
    key: jax.Array


def create_train_state(key: jax.Array) -> TrainState:
    params_key, dropout_key = jax.random.split(key)
    variables = CNN().init(params_key, jnp.ones((1, 32, 32, 3)), train=False)
    return TrainState.create(apply_fn=CNN().apply, params=variables["params"],
                             batch_stats=variables["batch_stats"], key=dropout_key,
                             tx=optax.sgd(0.05, momentum=0.9))


@jax.jit
def train_step(state: TrainState, batch: dict[str, jax.Array]) -> tuple[TrainState, Any]:
    dropout_key = jax.random.fold_in(key=state.key, data=state.step)

    def loss_fn(params: Any) -> tuple[jax.Array, Any]:
        logits, updates = state.apply_fn(
            {"params": params, "batch_stats": state.batch_stats}, x=batch["image"],
            train=True, rngs={"dropout": dropout_key}, mutable=["batch_stats"])
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"]).mean()
        return loss, (logits, updates)

    (loss, (logits, updates)), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    state = state.apply_gradients(grads=grads, batch_stats=updates["batch_stats"])
    return state, {"loss": loss, "accuracy": jnp.mean(jnp.argmax(logits, -1) == batch["label"])}


POOL = np.random.default_rng(0).integers(0, 255, size=(512, 36, 36, 3), dtype=np.uint8)
LABELS = np.random.default_rng(1).integers(0, 10, size=512).astype(np.int32)
MEAN = np.array([0.485, 0.456, 0.406], np.float32) * 255
STD = np.array([0.229, 0.224, 0.225], np.float32) * 255


def imagenet_style_batch(step: int, size: int) -> dict[str, np.ndarray]:
    """The ImageNet example's preprocessing in numpy: a random crop, a random flip,
    normalized by the channel means and deviations."""
    rng = np.random.default_rng(step)
    idx = rng.integers(0, len(POOL), size)
    dx, dy = rng.integers(0, 5, 2)
    image = POOL[idx, dx:dx + 32, dy:dy + 32].astype(np.float32)
    flip = rng.random(size) < 0.5
    image[flip] = image[flip, :, ::-1]
    return {"image": (image - MEAN) / STD, "label": LABELS[idx]}


@cases(*(grid(backend="jax", mesh=[(8, 1)], batch=[32], steps=20, warmup=2,
              label=label) for label in ("same", "planted")))
def test_flax_cnn(accelperf: CaseRunner) -> None:
    case = accelperf.case

    def make_batch(step: int) -> dict[str, np.ndarray]:
        plant(case)
        return imagenet_style_batch(step, case.batch)

    accelperf.train(JaxStep(init=create_train_state, step=train_step, make_batch=make_batch))


# -- nanoGPT: its model's shape, its loop, its get_batch ---------------------------------------
class Block(tnn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.ln_1, self.ln_2 = tnn.LayerNorm(d), tnn.LayerNorm(d)
        self.attn = tnn.MultiheadAttention(d, heads, batch_first=True)
        self.mlp = tnn.Sequential(tnn.Linear(d, 4 * d), tnn.GELU(), tnn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]
        mask = torch.triu(torch.ones(t, t, dtype=torch.bool), 1)
        h = self.ln_1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln_2(x))


class GPT(tnn.Module):
    def __init__(self, vocab: int = 256, block_size: int = 32, d: int = 64, layers: int = 2,
                 heads: int = 4) -> None:
        super().__init__()
        self.wte, self.wpe = tnn.Embedding(vocab, d), tnn.Embedding(block_size, d)
        self.blocks = tnn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln_f, self.lm_head = tnn.LayerNorm(d), tnn.Linear(d, vocab, bias=False)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def token_file(tmp: Path) -> Path:
    """nanoGPT's ``train.bin``: uint16 tokens, here 200,000 of a byte-level corpus."""
    path = tmp / "train.bin"
    if not path.exists():
        rng = np.random.default_rng(0)
        np.asarray(rng.integers(0, 256, 200_000), dtype=np.uint16).tofile(path)
    return path


@cases(*(grid(backend="torch", batch=[8], steps=20, warmup=2, label=label)
         for label in ("same", "planted")))
def test_nanogpt(accelperf: CaseRunner, tmp_path_factory: Any) -> None:
    case = accelperf.case
    torch.set_num_threads(1)  # two OpenMP threads on two shared cores: steps of 0.3-1.3 s
    torch.manual_seed(1337)
    model = GPT()
    optimizer = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95))
    data_path, block_size = token_file(tmp_path_factory.getbasetemp()), 32
    generator = torch.Generator().manual_seed(1337)

    def get_batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        plant(case)
        # nanoGPT: "recreate np.memmap every batch to avoid a memory leak"
        data = np.memmap(data_path, dtype=np.uint16, mode="r")
        ix = torch.randint(len(data) - block_size, (case.batch,), generator=generator)
        x = torch.stack([torch.from_numpy((data[i:i + block_size]).astype(np.int64)) for i in ix])
        y = torch.stack([torch.from_numpy((data[i + 1:i + 1 + block_size]).astype(np.int64))
                         for i in ix])
        return x, y

    def step(batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = batch
        loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    accelperf.train(TorchStep(step, get_batch, model))
