"""The torch step of the program benchmark: a two-layer MLP through ``torch.compile``,
AdamW. ``item_branch`` adds a Python branch on a tensor's ``.item()`` in the forward (a
graph break)."""

from __future__ import annotations

from typing import Any

import torch

from pytest_accelperf.torch import TorchStep

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


# --------------------------------------------------------------------------------------
# An eager GPT-2 trained by a nanoGPT-style loop (code we did not write: transformers')

VOCAB, SEQ = 96, 32


def gpt_eager(batch: int, *, micro_steps: int = 4, item_sync: bool = False,
              manual_attention: bool = False, autocast: bool = True) -> TorchStep:
    """Hugging Face's ``GPT2LMHeadModel`` (2 layers, width 64, 4 heads, sequence 32), AdamW,
    trained the way nanoGPT's ``train.py`` trains: ``micro_steps`` micro-batches a step,
    each forward under ``torch.autocast(bfloat16)``, the loss divided by the micro-steps,
    gradients clipped to 1.0. Its batches come from a generator like nanoGPT's
    ``get_batch`` (random windows of a token stream, seeded), handed over as ``data=``.

    The injections, as a pull request would make them:

    * ``item_sync``: ``loss.item()`` in every micro-step (a host sync: logging the loss);
    * ``manual_attention``: ``attn_implementation="eager"`` (matmul, mask, softmax,
      matmul) instead of ``"sdpa"`` (``scaled_dot_product_attention``): the same FLOPs;
    * ``autocast=False``: every matmul in float32 instead of bfloat16.
    """
    from contextlib import nullcontext

    import numpy as np
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=VOCAB, n_positions=SEQ,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0,
                        eos_token_id=0,
                        attn_implementation="eager" if manual_attention else "sdpa")
    model = GPT2LMHeadModel(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    ctx: Any = (torch.autocast("cpu", dtype=torch.bfloat16) if autocast else nullcontext())
    tokens = np.random.default_rng(1234).integers(0, VOCAB, size=100_000, dtype=np.int64)
    logged: list[float] = []

    def get_batches() -> Any:  # nanoGPT's get_batch, as a generator of steps' batches
        rng = np.random.default_rng(0)
        while True:
            ix = rng.integers(0, len(tokens) - SEQ, size=(micro_steps, batch))
            yield {"x": torch.from_numpy(tokens[ix[..., None] + np.arange(SEQ)])}

    def step(b: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        total = torch.zeros(())
        for micro in range(micro_steps):
            with ctx:
                out = model(input_ids=b["x"][micro], labels=b["x"][micro])
                loss = out.loss / micro_steps
            if item_sync:
                logged.append(loss.item())
            loss.backward()
            total += loss.detach().float()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return {"loss": total}

    return TorchStep(step=step, data=get_batches, model=model, tokens_per_sample=SEQ,
                     stateful=())
