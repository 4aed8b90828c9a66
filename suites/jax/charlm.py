"""A character-level causal transformer LM: the model of seed 000, scaled for CPU.

``make_task(case)`` builds a :class:`~pytest_accelperf.jax.JaxTask` from
``case.params["size"]``: ``"small"`` trains in seconds on CPU; ``"full"`` is large enough
that batch 4096 on one device needs far more than a 16 GiB accelerator (only compiled,
never run, by the suite), while a 4x2 mesh brings it well under.

Data: ``data/tiny_corpus.txt``, public-domain English text: Shakespeare's sonnets 1, 2,
18, 29, 30, 55, 60, 73, 116 and 130 (1609 Quarto, modern spelling), Abraham Lincoln's
Gettysburg Address (1863, Bliss copy) and the opening of the United States Declaration of
Independence (1776). All are in the public domain. The vocabulary is the sorted set of its
characters.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import PartitionSpec as _PartitionSpec

from pytest_accelperf.collect.cases import Case
from pytest_accelperf.jax import JaxTask

# Untyped in jax: through Any so the module passes mypy --strict too.
P: Any = _PartitionSpec

CORPUS = Path(__file__).parent / "data" / "tiny_corpus.txt"

#: Model sizes. At batch 4096 XLA:CPU plans "full" at 35.6 GiB per device on one device,
#: 6.4 GiB on a 4x2 mesh and 4.2 GiB on 8x1 (float32, no rematerialization).
SIZES: dict[str, dict[str, Any]] = {
    "small": {"seq_len": 32, "d_model": 64, "n_layers": 2, "n_heads": 4, "lr": 3e-3},
    "full": {"seq_len": 128, "d_model": 256, "n_layers": 2, "n_heads": 4, "lr": 1e-3},
}


def load_corpus(path: Path = CORPUS) -> tuple[np.ndarray, list[str]]:
    """The corpus as int32 token ids and its vocabulary (sorted characters)."""
    text = path.read_text(encoding="utf-8")
    vocab = sorted(set(text))
    index = {ch: i for i, ch in enumerate(vocab)}
    return np.array([index[ch] for ch in text], dtype=np.int32), vocab


class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention and a 4x MLP, both residual."""

    d_model: int
    n_heads: int

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        b, t, d = x.shape
        h = nn.LayerNorm(name="ln_attn")(x)
        qkv = nn.Dense(3 * d, name="qkv")(h).reshape(b, t, 3, self.n_heads, d // self.n_heads)
        # A (1, 1, t, t) mask broadcasts over batch and heads: a per-example mask would
        # be a batch x t x t tensor, gigabytes at the full size.
        mask = nn.make_causal_mask(jnp.ones((1, t), dtype=jnp.int32))
        att = nn.dot_product_attention(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], mask=mask)
        x = x + nn.Dense(d, name="proj")(att.reshape(b, t, d))
        h = nn.LayerNorm(name="ln_mlp")(x)
        h = nn.Dense(d, name="mlp_out")(nn.gelu(nn.Dense(4 * d, name="mlp_in")(h)))
        return x + h


class CharLM(nn.Module):
    vocab: int
    seq_len: int
    d_model: int
    n_layers: int
    n_heads: int

    @nn.compact
    def __call__(self, tokens: jax.Array) -> jax.Array:
        t = tokens.shape[1]
        pos = self.param("pos", nn.initializers.normal(0.02), (self.seq_len, self.d_model))
        x = nn.Embed(self.vocab, self.d_model, name="embed")(tokens) + pos[:t]
        for i in range(self.n_layers):
            x = Block(self.d_model, self.n_heads, name=f"block{i}")(x)
        return nn.Dense(self.vocab, name="head")(nn.LayerNorm(name="ln_f")(x))


def _axis_size(case: Case, axis: str) -> int:
    if case.mesh is None or axis not in case.axis_names[: len(case.mesh)]:
        return 1
    return case.mesh[case.axis_names.index(axis)]


def make_task(case: Case) -> JaxTask:
    """The char-LM task of ``case``: ``params["size"]`` (small/full), ``params["seed"]``."""
    size = case.params.get("size", "small")
    try:
        cfg = SIZES[size]
    except KeyError:
        raise ValueError(f"unknown charlm size {size!r}; have {sorted(SIZES)}") from None
    seed = int(case.params.get("seed", 0))
    data, vocab = load_corpus()
    seq_len = cfg["seq_len"]
    model = CharLM(len(vocab), seq_len, cfg["d_model"], cfg["n_layers"], cfg["n_heads"])
    model_size = _axis_size(case, "model")

    def init_params(key: jax.Array) -> Any:
        return model.init(key, jnp.zeros((1, seq_len), jnp.int32))

    def loss_fn(params: Any, batch: dict[str, jax.Array]) -> jax.Array:
        logits: Any = model.apply(params, batch["x"])
        # Cross-entropy through a one-hot product, not optax's integer-label gather: the
        # gather's scatter-add gradient is constant-folded by XLA:CPU for seconds per
        # compile at batch 4096.
        labels = jax.nn.one_hot(batch["y"], len(vocab), dtype=logits.dtype)
        return -jnp.mean(jnp.sum(labels * jax.nn.log_softmax(logits), axis=-1))

    def make_batch(step: int) -> dict[str, np.ndarray]:
        # Seeded by (seed, step): the same windows whatever the mesh or the run order.
        rng = np.random.default_rng([seed, step])
        starts = rng.integers(0, len(data) - seq_len - 1, size=case.batch)
        windows = data[starts[:, None] + np.arange(seq_len + 1)]
        return {"x": windows[:, :-1], "y": windows[:, 1:]}

    def param_specs(abstract: Any) -> Any:
        # Megatron-lite: a Dense kernel's output dim over "model" when it divides evenly
        # (the 57-char vocabulary head does not), everything else replicated.
        def spec(path: tuple[Any, ...], leaf: Any) -> Any:
            name = getattr(path[-1], "key", None)
            if name == "kernel" and len(leaf.shape) == 2 and leaf.shape[-1] % model_size == 0:
                return P(None, "model")
            return P()

        return jax.tree_util.tree_map_with_path(spec, abstract)

    return JaxTask(init_params=init_params, loss_fn=loss_fn, make_batch=make_batch,
                   optimizer=optax.adamw(cfg["lr"]), param_specs=param_specs,
                   batch_spec=P("data"), tokens_per_sample=seq_len, seed=seed)
