"""Lightning's own example modules under the gate, as written, with the regressions its
users hit planted by ``ACCELPERF_TRIAL`` (benchmarks/lightning_trials.py):

- ``LightningTransformer`` (``lightning.pytorch.demos``: its download hook replaced,
  synthetic tokens of the demo's shape), trained in 32-bit, in one process and by
  Lightning's DDP over 2 ranks the plugin launches (``world_size=2``);
- the autoencoder of Lightning's README (``LitAutoEncoder``, 28 x 28 images made
  synthetic), trained under ``bf16-mixed`` as a user training in mixed precision would.

Plants (one a session; ``none``: the code as written):

- ``precision_off``: the autoencoder's ``precision="bf16-mixed"`` becomes ``"32-true"``;
- ``log_sync_dist``: ``self.log("train_loss", loss, on_step=True, sync_dist=True)`` in the
  transformer's ``training_step``;
- ``debug_item``: a debug line reading ``loss.item()`` in the transformer's
  ``training_step`` (a host sync every step);
- ``grad_clip``: ``gradient_clip_val=1.0`` added to the transformer's ``Trainer``;
- ``no_accumulation``: the transformer's two accumulated micro-batches of 4 become one
  batch of 8 (the same global batch).
"""

from __future__ import annotations

import os
from typing import Any

import lightning as L
import torch
from lightning.pytorch.demos import LightningTransformer
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from pytest_accelperf import Case, CaseRunner, cases
from pytest_accelperf.lightning import LightningTask

TRIAL = os.environ.get("ACCELPERF_TRIAL", "none")
VOCAB, SEQ = 2000, 35


class Transformer(LightningTransformer):
    """Lightning's demo without its download; the plants in ``training_step``."""

    def prepare_data(self) -> None:
        pass

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = super().training_step(batch, batch_idx)
        if TRIAL == "log_sync_dist":
            self.log("train_loss", loss, on_step=True, sync_dist=True)
        if TRIAL == "debug_item":
            self.last_loss = loss.item()
        return loss


class LitAutoEncoder(L.LightningModule):
    """Lightning's README autoencoder, as written there."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(28 * 28, 64), nn.ReLU(), nn.Linear(64, 3))
        self.decoder = nn.Sequential(nn.Linear(3, 64), nn.ReLU(), nn.Linear(64, 28 * 28))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, _ = batch
        x = x.view(x.size(0), -1)
        z = self.encoder(x)
        x_hat = self.decoder(z)
        loss = nn.functional.mse_loss(x_hat, x)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=1e-3)


def tokens(batch: int) -> DataLoader[Any]:
    gen = torch.Generator().manual_seed(0)
    t = torch.randint(0, VOCAB, (64 * batch, SEQ + 1), generator=gen)
    return DataLoader(TensorDataset(t[:, :-1], t[:, 1:]), batch_size=batch)


def images(batch: int) -> DataLoader[Any]:
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(64 * batch, 1, 28, 28, generator=gen)
    return DataLoader(TensorDataset(x, torch.zeros(64 * batch)), batch_size=batch)


@cases(Case(backend="lightning", batch=8, steps=10, warmup=2, label="transformer"),
       Case(backend="lightning", batch=8, steps=6, warmup=2, world_size=2,
            label="transformer"))
def test_transformer(accelperf: CaseRunner) -> None:
    """One process, and Lightning's DDP over 2 launched ranks (``world_size=2``: the
    loader's batch is the per-device one, Lightning's sampler shards it)."""
    accumulate = 1 if TRIAL == "no_accumulation" else 2
    trainer: dict[str, Any] = {"accumulate_grad_batches": accumulate}
    if TRIAL == "grad_clip":
        trainer["gradient_clip_val"] = 1.0
    accelperf.train(LightningTask(
        module=lambda case: Transformer(vocab_size=VOCAB),
        data=lambda case: tokens(case.batch // (accumulate * case.world_size)),
        trainer=trainer))


@cases(Case(backend="lightning", batch=32, steps=10, warmup=2, label="autoencoder"))
def test_autoencoder(accelperf: CaseRunner) -> None:
    precision = "32-true" if TRIAL == "precision_off" else "bf16-mixed"
    accelperf.train(LightningTask(module=lambda case: LitAutoEncoder(),
                                  data=lambda case: images(case.batch),
                                  trainer={"precision": precision}))
