"""A small causal transformer (GPT) in PyTorch on the JAX suite's character corpus.

``make_task(case)`` builds a :class:`~pytest_accelperf.torch.TorchTask`: 2
pre-norm blocks, d_model 64, 4 heads, sequence 32, AdamW at 3e-3, the same sizes as the JAX
char-LM's "small". ``case.params["compile"]`` (default False) runs it through
``torch.compile``; ``case.params["seed"]`` seeds the weights and the batches.

Data: ``../jax/data/tiny_corpus.txt`` (public-domain text; see ``suites/jax/charlm.py``),
read in place. The vocabulary is the sorted set of its characters.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from pytest_accelperf.collect.cases import Case
from pytest_accelperf.torch import TorchTask

CORPUS = Path(__file__).resolve().parent.parent / "jax" / "data" / "tiny_corpus.txt"
SEQ_LEN, D_MODEL, N_LAYERS, N_HEADS, LR = 32, 64, 2, 4, 3e-3


def load_corpus(path: Path = CORPUS) -> tuple[np.ndarray, list[str]]:
    """The corpus as int64 token ids and its vocabulary (sorted characters)."""
    text = path.read_text(encoding="utf-8")
    vocab = sorted(set(text))
    index = {ch: i for i, ch in enumerate(vocab)}
    return np.array([index[ch] for ch in text], dtype=np.int64), vocab


class Block(nn.Module):
    """Pre-norm block: causal self-attention and a 4x GELU MLP, both residual."""

    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.ln_attn = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln_mlp = nn.LayerNorm(d_model)
        self.mlp_in = nn.Linear(d_model, 4 * d_model)
        self.mlp_out = nn.Linear(4 * d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = (self.qkv(self.ln_attn(x)).view(b, t, 3, self.n_heads, d // self.n_heads)
                   .permute(2, 0, 3, 1, 4))
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, d))
        out: torch.Tensor = x + self.mlp_out(F.gelu(self.mlp_in(self.ln_mlp(x))))
        return out


class GPT(nn.Module):
    def __init__(self, vocab: int, seq_len: int = SEQ_LEN, d_model: int = D_MODEL,
                 n_layers: int = N_LAYERS, n_heads: int = N_HEADS) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.pos = nn.Parameter(torch.randn(seq_len, d_model) * 0.02)
        self.blocks = nn.ModuleList(Block(d_model, n_heads) for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.pos[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        logits: torch.Tensor = self.head(self.ln_f(x))
        return logits


def make_task(case: Case) -> TorchTask:
    """The GPT task of ``case``: ``params["compile"]`` (bool), ``params["seed"]`` (int)."""
    seed = int(case.params.get("seed", 0))
    data, vocab = load_corpus()

    def make_model() -> nn.Module:
        return GPT(len(vocab))

    def loss_fn(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        logits = model(batch["x"])
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch["y"].reshape(-1))

    def make_batch(step: int) -> dict[str, torch.Tensor]:
        # Seeded by (seed, step), like the JAX char-LM: the same windows in every run.
        rng = np.random.default_rng([seed, step])
        starts = rng.integers(0, len(data) - SEQ_LEN - 1, size=case.batch)
        windows = torch.from_numpy(data[starts[:, None] + np.arange(SEQ_LEN + 1)])
        return {"x": windows[:, :-1], "y": windows[:, 1:]}

    def make_optimizer(params: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
        return torch.optim.AdamW(params, lr=LR)

    return TorchTask(make_model=make_model, loss_fn=loss_fn, make_batch=make_batch,
                     make_optimizer=make_optimizer, compile=bool(case.params.get("compile")),
                     tokens_per_sample=SEQ_LEN, seed=seed)


def n_params(task: TorchTask) -> int:
    """Parameter count of the task's model (for FLOP estimates: ~6 x params x tokens)."""
    return sum(p.numel() for p in task.make_model().parameters())


__all__ = ["CORPUS", "GPT", "load_corpus", "make_task", "n_params"]
