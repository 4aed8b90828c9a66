#!/usr/bin/env python
"""The plugin's DeepSpeed defaults against the ones before issue 23: per-rank memory and
step time, ZeRO 0-3 at world size 2 on the CPU.

::

    python benchmarks/zero_defaults.py [--models mlp3x1024,...] [--rounds 3] [--steps 20]

For each model and ZeRO stage, trains two arms in alternation, ``--rounds`` times each,
through the deepspeed backend (launched ranks, the warm rank pool):

* ``before``: the sizes the plugin set before (each of ``reduce_bucket_size``,
  ``allgather_bucket_size`` and, at ZeRO-3, ``stage3_prefetch_bucket_size``,
  ``stage3_max_live_parameters``, ``stage3_max_reuse_distance`` = ``min(DeepSpeed's
  default, parameter count)``), given as the step's ``ds_config`` (a user's keys win);
* ``after``: nothing set: the plugin's defaults (``size_buckets``).

It prints, per model and stage, rank 0's peak (the MemTracker count over construction and
the first two steps) in bytes per parameter for both arms, the median over rounds of each
run's median step time, their ratio (after / before), and the 1-minute load average (the
machine's other work shows in the timings). Models, all above 1 M parameters, torch ``Adam``
unless named ``fused``:

* ``mlp3x1024``: issue 23's report, three 1024x1024 layers (3.1 M parameters);
* ``mlp8x512fused``: eight 512x512 layers, ``Adam(fused=True)`` (2.1 M);
* ``mlp20x256``: twenty 256x256 layers (1.3 M), every tensor under DeepSpeed's 1e5-element
  persistence threshold;
* ``emb4000x256``: an embedding of 4000x256 and two 256x256 layers (1.2 M), 89 % of the
  parameters in one tensor.
"""

from __future__ import annotations

import argparse
import os
import statistics
from collections.abc import Callable
from typing import Any

import torch

from pytest_accelperf.backends.torch.deepspeed import BACKEND
from pytest_accelperf.collect.cases import Case
from pytest_accelperf.provision.accel import Accelerator
from pytest_accelperf.torch import RankStep

CPU = Accelerator(name="cpu", platform="cpu-x1", device_kind="cpu", device_count=1)
BATCH = 8
Pieces = tuple[Callable[[int], Any], Callable[[int], Any], Callable[[Any, Any], Any]]


def mlp(width: int, depth: int, fused: bool = False) -> Pieces:
    def build(rank: int) -> Any:
        layers: list[torch.nn.Module] = []
        for _ in range(depth):
            layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
        model = torch.nn.Sequential(*layers[:-1])
        return model, torch.optim.Adam(model.parameters(), lr=1e-3, fused=fused)

    def make_batch(step: int) -> Any:
        g = torch.Generator().manual_seed(step)
        return {"x": torch.randn(BATCH, width, generator=g),
                "y": torch.randn(BATCH, width, generator=g)}

    def loss_fn(model: Any, batch: Any) -> Any:
        return ((model(batch["x"]) - batch["y"]) ** 2).mean()

    return build, make_batch, loss_fn


class Embedder(torch.nn.Module):
    def __init__(self, vocab: int, width: int) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, width)
        self.hidden = torch.nn.Linear(width, width)
        self.out = torch.nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.out(torch.relu(self.hidden(self.emb(x))))
        return out


def embedder(vocab: int, width: int) -> Pieces:
    def build(rank: int) -> Any:
        model = Embedder(vocab, width)
        return model, torch.optim.Adam(model.parameters(), lr=1e-3)

    def make_batch(step: int) -> Any:
        g = torch.Generator().manual_seed(step)
        return {"x": torch.randint(0, vocab, (BATCH, 16), generator=g),
                "y": torch.randn(BATCH, 16, width, generator=g)}

    def loss_fn(model: Any, batch: Any) -> Any:
        return ((model(batch["x"]) - batch["y"]) ** 2).mean()

    return build, make_batch, loss_fn


MODELS: dict[str, Pieces] = {
    "mlp3x1024": mlp(1024, 3), "mlp8x512fused": mlp(512, 8, fused=True),
    "mlp20x256": mlp(256, 20), "emb4000x256": embedder(4000, 256)}
#: DeepSpeed 0.19's defaults of the keys the plugin sized before.
DS_DEFAULTS = {"reduce_bucket_size": 500_000_000, "allgather_bucket_size": 500_000_000,
               "stage3_prefetch_bucket_size": 50_000_000,
               "stage3_max_live_parameters": 1_000_000_000,
               "stage3_max_reuse_distance": 1_000_000_000}


def before(n_params: int, stage: int) -> dict[str, Any]:
    """The ``zero_optimization`` sizes the plugin set before issue 23, set explicitly."""
    if stage == 0:
        return {}
    whole = -(-n_params // 256) * 256
    keys = [k for k in DS_DEFAULTS if stage == 3 or not k.startswith("stage3_")]
    return {"zero_optimization": {k: min(DS_DEFAULTS[k], whole) for k in keys}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    print("| model | params | ZeRO | before B/param | after B/param | step before | "
          "step after | after / before | load |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name in args.models.split(","):
        build, make_batch, loss_fn = MODELS[name]
        n = sum(p.numel() for p in build(0)[0].parameters())
        for stage in (0, 1, 2, 3):
            peaks: dict[str, int] = {}
            steps: dict[str, list[float]] = {"before": [], "after": []}
            loads = []
            for _ in range(args.rounds):
                for arm in ("before", "after"):
                    case = Case(backend="deepspeed", zero_stage=stage, batch=BATCH,
                                steps=args.steps, warmup=2, world_size=2, accels=("cpu",))
                    step = RankStep(build=build, loss_fn=loss_fn, make_batch=make_batch,
                                    ds_config=before(n, stage) if arm == "before" else {})
                    run = BACKEND.train(case, step, CPU, timeout=900).run
                    assert run.outcome == "ok", run.message
                    peaks.setdefault(arm, run.memory_per_device["rank0"])
                    steps[arm].append(statistics.median(run.step_times))
                    loads.append(os.getloadavg()[0])
            t0, t1 = (statistics.median(steps[a]) for a in ("before", "after"))
            print(f"| {name} | {n:,} | {stage} | {peaks['before'] / n:.2f} | "
                  f"{peaks['after'] / n:.2f} | {t0 * 1e3:.1f} ms | {t1 * 1e3:.1f} ms | "
                  f"{t1 / t0:.2f} | {min(loads):.1f}-{max(loads):.1f} |", flush=True)


if __name__ == "__main__":
    main()
