"""The suite's GPT trained the way PyTorch's docs write a training loop, through TorchStep.

The user's own step, unchanged: AdamW from the model's ``configure_optimizers`` (weight
decay on matrices, none on biases, norms and embeddings' positions), a warm-up + cosine
``LambdaLR`` stepped once per optimizer step, gradient accumulation over ``grad_accum``
micro-batches, and the forward pass under ``torch.autocast(..., dtype=torch.bfloat16)``.
The step returns its loss and the learning rate it trained with; the plugin times it,
records both per step, counts its FLOPs and memory (``mem_tracker`` without accumulation,
``profiler`` with it, where MemTracker cannot follow a module called twice in a step), and
hands the trained model back.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from gpt import GPT, SEQ_LEN, load_corpus

from pytest_accelperf import Case, CaseRunner, cases
from pytest_accelperf.torch import TorchStep

LR, WEIGHT_DECAY, WARMUP_ITERS = 3e-3, 0.1, 4


class NanoGPT(GPT):
    """The suite's GPT with nanoGPT's ``configure_optimizers``."""

    def configure_optimizers(self, weight_decay: float, learning_rate: float,
                             betas: tuple[float, float]) -> torch.optim.AdamW:
        params = [p for p in self.parameters() if p.requires_grad]
        groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
                  {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas)


def warmup_cosine(warmup: int, total: int) -> Any:
    """The LR multiplier of optimizer step ``it``: linear warm-up, then cosine to 10 %."""
    def factor(it: int) -> float:
        if it < warmup:
            return (it + 1) / warmup
        progress = (it - warmup) / max(1, total - warmup)
        return 0.1 + 0.45 * (1 + math.cos(math.pi * progress))
    return factor


@cases(Case(backend="torch", batch=16, steps=12, warmup=2, accels=("cpu", "gpu")),
       Case(backend="torch", batch=16, steps=12, warmup=2, grad_accum=4, accels=("cpu", "gpu")))
def test_schedule_accum_bf16(accelperf: CaseRunner) -> None:
    case = accelperf.case
    total = case.warmup + case.steps
    data, vocab = load_corpus()

    # -- the user's training code, as PyTorch's docs write it -------------------------------
    torch.manual_seed(0)
    model = NanoGPT(len(vocab))
    optimizer = model.configure_optimizers(WEIGHT_DECAY, LR, (0.9, 0.95))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine(WARMUP_ITERS, total))
    accum = case.grad_accum

    def train_step(batch: dict[str, torch.Tensor]) -> dict[str, Any]:
        lr = scheduler.get_last_lr()[0]
        total_loss = torch.zeros((), device=batch["x"].device)
        for x, y in zip(batch["x"].chunk(accum), batch["y"].chunk(accum), strict=True):
            with torch.autocast(device_type=x.device.type, dtype=torch.bfloat16):
                logits = model(x)
            loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten()) / accum
            loss.backward()
            total_loss += loss.detach()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        return {"loss": total_loss, "lr": lr}
    # ----------------------------------------------------------------------------------------

    def make_batch(step: int) -> dict[str, torch.Tensor]:
        rng = np.random.default_rng([0, step])
        starts = rng.integers(0, len(data) - SEQ_LEN - 1, size=case.batch)
        windows = torch.from_numpy(data[starts[:, None] + np.arange(SEQ_LEN + 1)])
        return {"x": windows[:, :-1], "y": windows[:, 1:]}

    result = accelperf.train(TorchStep(train_step, make_batch, model,
                                       tokens_per_sample=SEQ_LEN))

    run = result.run
    assert run.outcome == "ok", run.message
    # The schedule as the plugin recorded it: one scheduler step per plugin step, and none
    # from counting FLOPs and memory (they are undone).
    schedule = warmup_cosine(WARMUP_ITERS, total)
    assert run.metrics["lr"] == [LR * schedule(i) for i in range(total)]
    assert scheduler.last_epoch == total
    assert run.losses[-1] < run.losses[0] - 0.5
    cpu_source = "profiler" if accum > 1 else "mem_tracker"
    assert run.memory_source == (cpu_source if accelperf.accelerator.name == "cpu"
                                 else "cuda_allocator")
    # The trained model itself comes back: its weights are what the step last trained.
    assert result.state is model
    assert int(optimizer.state[model.head.weight]["step"]) == total
