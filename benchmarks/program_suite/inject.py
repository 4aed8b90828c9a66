"""Which regression this session injects: ``ACCELPERF_BENCH_INJECT``.

``none`` (or unset): the code as recorded. Otherwise one of :data:`INJECTIONS`, each a
change of the code's behaviour the way a pull request would make it, in one case:

* ``extra_matmul`` (``test_jax_step``): one more matmul by ``w2`` in the loss;
* ``precision`` (``test_jax_step``): the step traced under
  ``jax.default_matmul_precision("highest")``;
* ``leak`` (``test_jax_step``): ``make_batch`` keeps every batch it placed on the device
  in a list (128 KiB a step);
* ``slow_batch`` (``test_jax_step``): ``make_batch`` does 3 ms more CPU work a batch (the
  issue's Flax batch function went from 0.1 to 4.7 ms), outside the step's timer;
* ``lost_sharding`` (``test_jax_sharded``): ``w1``'s spec replicated (``P()``) instead of
  split over ``model``;
* ``graph_break`` (``test_torch_compiled``): a Python branch on ``.item()`` in the
  forward of the compiled model;
* ``item_sync`` (``test_torch_eager_gpt``): ``loss.item()`` in every micro-step of the
  nanoGPT-style loop (a host sync);
* ``manual_attention`` (``test_torch_eager_gpt``): GPT-2's attention through
  ``attn_implementation="eager"`` (matmul, mask, softmax) instead of ``"sdpa"``;
* ``autocast_off`` (``test_torch_eager_gpt``): the forward without
  ``torch.autocast(bfloat16)``: every matmul in float32;
* ``bn_momentum`` (``test_flax_bn``): BatchNorm's momentum 0.9 -> 0.99 (only the running
  statistics change).

``ACCELPERF_BENCH_STEPS`` sets the measured steps of every case (default 30).
"""

from __future__ import annotations

import os

ENV = "ACCELPERF_BENCH_INJECT"
STEPS_ENV = "ACCELPERF_BENCH_STEPS"
#: Injection -> the test whose code it changes.
INJECTIONS = {
    "extra_matmul": "test_jax_step",
    "precision": "test_jax_step",
    "leak": "test_jax_step",
    "slow_batch": "test_jax_step",
    "lost_sharding": "test_jax_sharded",
    "graph_break": "test_torch_compiled",
    "item_sync": "test_torch_eager_gpt",
    "manual_attention": "test_torch_eager_gpt",
    "autocast_off": "test_torch_eager_gpt",
    "bn_momentum": "test_flax_bn",
}


def injected() -> str:
    """The injection of this session ("none" when unset); an unknown name is an error."""
    name = os.environ.get(ENV, "").strip() or "none"
    if name != "none" and name not in INJECTIONS:
        raise ValueError(f"{ENV}={name!r}: expected none or one of {', '.join(INJECTIONS)}")
    return name


def steps(default: int = 30) -> int:
    return int(os.environ.get(STEPS_ENV, "") or default)
