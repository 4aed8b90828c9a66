#!/usr/bin/env python
"""What the plugin costs a trainer's step (issue 45, item 5): the same ``Trainer.fit`` timed
with and without the gate, side by side in one process, interleaved.

::

    python benchmarks/trainer_overhead.py [--reps 5] [--steps 40] [--models autoencoder,transformer]

For each model, ``--reps`` rounds, each of two trainings in a random order:

- **plain**: ``lightning.Trainer.fit`` as a user runs it (no logger, no checkpoint, no
  progress bar: what the gate also turns off), with one callback that reads
  ``time.perf_counter()`` at the end of each batch; a step is the time between two batch
  ends: the fetch of the batch, the trainer's loop and hooks, the user's step;
- **gated**: the ``lightning`` backend's measured training of the same module and data
  (``BACKEND.train``: the counting training first, untimed, then the measured one); a step
  is its step time plus its batch's fetch (``input_wall_times``), the same span.

Both train ``--steps`` steps after 5 of warm-up, on one torch thread. It prints, per model,
the median step of each arm over all rounds, and the median of the per-round ratios
gated / plain with its range, and the machine's load; ``--out`` writes them as JSON. The
goal (issue 45) is at most 5 % per step.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.demos import LightningTransformer
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from pytest_accelperf.backends.lightning.backend import BACKEND
from pytest_accelperf.collect.cases import Case
from pytest_accelperf.lightning import LightningTask
from pytest_accelperf.provision.accel import Accelerator

CPU = Accelerator(name="cpu", platform="cpu-x1", device_kind="cpu", device_count=1)
WARMUP = 5


class Transformer(LightningTransformer):
    def prepare_data(self) -> None:
        pass


class LitAutoEncoder(L.LightningModule):
    """Lightning's README autoencoder."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(28 * 28, 64), nn.ReLU(), nn.Linear(64, 3))
        self.decoder = nn.Sequential(nn.Linear(3, 64), nn.ReLU(), nn.Linear(64, 28 * 28))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x = batch[0].view(batch[0].size(0), -1)
        loss = nn.functional.mse_loss(self.decoder(self.encoder(x)), x)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=1e-3)


def transformer_data(batch: int) -> DataLoader[Any]:
    t = torch.randint(0, 2000, (256 * batch, 36), generator=torch.Generator().manual_seed(0))
    return DataLoader(TensorDataset(t[:, :-1], t[:, 1:]), batch_size=batch)


def image_data(batch: int) -> DataLoader[Any]:
    x = torch.rand(256 * batch, 1, 28, 28, generator=torch.Generator().manual_seed(0))
    return DataLoader(TensorDataset(x), batch_size=batch)


MODELS = {
    "autoencoder": (LitAutoEncoder, image_data, 32),
    "transformer": (lambda: Transformer(vocab_size=2000), transformer_data, 8),
}


class Stamps(L.Callback):
    def __init__(self) -> None:
        self.ends: list[float] = []

    def on_train_batch_end(self, *args: Any) -> None:
        self.ends.append(time.perf_counter())


def plain(model: str, steps: int) -> list[float]:
    make, data, batch = MODELS[model]
    L.seed_everything(0, verbose=False)
    stamps = Stamps()
    with tempfile.TemporaryDirectory() as root:
        trainer = L.Trainer(max_steps=WARMUP + steps, logger=False, enable_checkpointing=False,
                            enable_progress_bar=False, enable_model_summary=False,
                            accelerator="cpu", devices=1, default_root_dir=root,
                            callbacks=[stamps], num_sanity_val_steps=0, max_epochs=-1)
        trainer.fit(make(), train_dataloaders=data(batch))
    ends = stamps.ends[WARMUP - 1:]
    return [b - a for a, b in itertools.pairwise(ends)]


def gated(model: str, steps: int) -> list[float]:
    make, data, batch = MODELS[model]
    case = Case(backend="lightning", batch=batch, steps=steps, warmup=WARMUP)
    task = LightningTask(module=lambda c: make(), data=lambda c: data(c.batch))
    run = BACKEND.train(case, task, CPU).run
    assert run.outcome == "ok", run.message
    return [s + f for s, f in zip(run.step_times, run.inputs.wall_times, strict=True)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--models", default="autoencoder,transformer")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    out: dict[str, Any] = {"load_before": os.getloadavg()[0]}
    for model in args.models.split(","):
        arms: dict[str, list[float]] = {"plain": [], "gated": []}
        ratios = []
        for _ in range(args.reps):
            medians = {}
            for arm in random.sample(["plain", "gated"], 2):
                times = plain(model, args.steps) if arm == "plain" else gated(model, args.steps)
                arms[arm] += times
                medians[arm] = statistics.median(times)
            ratios.append(medians["gated"] / medians["plain"])
        row = {"plain_ms": statistics.median(arms["plain"]) * 1e3,
               "gated_ms": statistics.median(arms["gated"]) * 1e3,
               "ratio_median": statistics.median(ratios), "ratio_min": min(ratios),
               "ratio_max": max(ratios), "reps": args.reps, "steps": args.steps}
        out[model] = row
        print(f"{model}: plain {row['plain_ms']:.2f} ms, gated {row['gated_ms']:.2f} ms a step; "
              f"gated/plain {row['ratio_median']:.3f} (rounds {row['ratio_min']:.3f}-"
              f"{row['ratio_max']:.3f}, {args.reps} rounds of {args.steps} steps)", flush=True)
    out["load_after"] = os.getloadavg()[0]
    print(f"load {out['load_before']:.1f} -> {out['load_after']:.1f}")
    if args.out:
        args.out.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
