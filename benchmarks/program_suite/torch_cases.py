"""The torch step of the program benchmark: a two-layer MLP through ``torch.compile``,
AdamW. ``item_branch`` adds a Python branch on a tensor's ``.item()`` in the forward (a
graph break)."""

from __future__ import annotations

from typing import Any

import torch

from pytest_accelperf.backends.torch import TorchStep

DIM, HIDDEN = 64, 256


class Net(torch.nn.Module):
    def __init__(self, item_branch: bool = False) -> None:
        super().__init__()
        self.inner = torch.nn.Linear(DIM, HIDDEN)
        self.out = torch.nn.Linear(HIDDEN, 1)
        self.item_branch = item_branch

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.inner(x))
        if self.item_branch and h.abs().mean().item() > 100.0:  # never true; breaks the graph
            h = h * 0.5
        out: torch.Tensor = self.out(h)
        return out


def compiled_step(batch: int, *, item_branch: bool = False) -> TorchStep:
    torch.manual_seed(0)
    model = Net(item_branch)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    compiled: Any = torch.compile(model)

    def train(module: Any, b: dict[str, torch.Tensor]) -> torch.Tensor:
        optimizer.zero_grad(set_to_none=True)
        loss = ((module(b["x"]) - b["y"]) ** 2).mean()
        loss.backward()
        optimizer.step()
        return loss.detach()

    def make_batch(step: int) -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(step)
        x = torch.randn(batch, DIM, generator=g)
        return {"x": x, "y": x[:, :2].sum(dim=1, keepdim=True)}

    return TorchStep(step=lambda b: train(compiled, b), make_batch=make_batch, model=model,
                     compile=True, count_step=lambda b: train(model, b))
