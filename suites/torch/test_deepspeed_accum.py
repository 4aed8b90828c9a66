"""The small GPT as a DeepSpeed user trains it: their own AdamW with weight-decay groups and
LR schedule, gradient accumulation, ZeRO-2 and ZeRO-3 at world size 2.

The user's code is what a DeepSpeed training script already has: ``build(rank)`` makes the
model, the optimizer over its parameter groups and the schedule (DeepSpeed's docs pass
these to ``deepspeed.initialize``), and ``loss_fn(engine, batch)`` is the forward of one
micro-batch. The plugin runs the loop the docs write (``engine.backward(loss);
engine.step()``) over ``grad_accum`` micro-batches per step, and checks the loss and the
learning rate of every step against the baseline (a schedule that ran twice as fast would
show in ``lr``). Two cases, about 10 s each here.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from gpt import GPT, load_corpus, make_task

from pytest_accelperf import Case, CaseRunner, RankStep, cases

VOCAB = len(load_corpus()[1])
COMMON = {"model": "gpt", "batch": 16, "grad_accum": 2, "steps": 6, "warmup": 2,
          "world_size": 2, "accels": ("cpu", "gpu")}


# -- the user's code: build (8 lines) and RankStep (2) besides the forward (loss_fn) -----
def build(rank: int) -> tuple[Any, Any, Any]:
    model = GPT(VOCAB)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                                   {"params": rest, "weight_decay": 0.0}], lr=3e-3)
    warmup = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 4))
    return model, optimizer, warmup


def loss_fn(engine: Any, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    logits = engine(batch["x"])
    return F.cross_entropy(logits.flatten(0, 1), batch["y"].flatten())


@cases([Case(backend="deepspeed", zero_stage=stage, reference=stage == 2, **COMMON)
        for stage in (2, 3)])
def test_gpt_accumulating(accelperf: CaseRunner) -> None:
    step = RankStep(build=build, loss_fn=loss_fn,
                    make_batch=make_task(accelperf.case).make_batch)
    # -- end of the user's code ---------------------------------------------------------
    result = accelperf.train(step)
    engine = result.run.details["engine"]
    assert engine["optimizer_steps"] * 2 == engine["micro_steps"]
    assert engine["param_groups"][0]["tensors"] > 0  # weight decay is on
    assert result.run.metrics["lr"][:4] == pytest.approx([3e-3 * (s + 1) / 4 for s in range(4)])
