"""The cases of the program benchmark (benchmarks/program.py). Every test builds its step
from :func:`inject.injected`, so the same files run unchanged (``none``) and with one
regression injected into the code."""

from __future__ import annotations

from inject import injected, steps

from pytest_accelperf import Case, CaseRunner, cases

STEPS = steps()
WARMUP = 2


@cases(Case(backend="jax", batch=64, mesh=(4, 2), steps=STEPS, warmup=WARMUP,
            label="sharded"))
def test_jax_sharded(accelperf: CaseRunner) -> None:
    from jax_cases import mlp

    task = mlp(accelperf.case.batch, sharded=True,
               lose_sharding=injected() == "lost_sharding")
    assert accelperf.train(task).run.outcome == "ok"


@cases(Case(backend="jax", batch=128, steps=STEPS, warmup=WARMUP, label="step"))
def test_jax_step(accelperf: CaseRunner) -> None:
    from jax_cases import mlp

    which = injected()
    task = mlp(accelperf.case.batch, extra_matmul=which == "extra_matmul",
               precision="highest" if which == "precision" else None, leak=which == "leak",
               slow_batch=0.003 if which == "slow_batch" else 0.0)
    assert accelperf.train(task).run.outcome == "ok"


@cases(Case(backend="torch", batch=64, steps=STEPS, warmup=WARMUP, label="compiled",
            accels=("cpu",)))
def test_torch_compiled(accelperf: CaseRunner) -> None:
    from torch_cases import compiled_step

    task = compiled_step(accelperf.case.batch, item_branch=injected() == "graph_break")
    assert accelperf.train(task).run.outcome == "ok"


@cases(Case(backend="torch", batch=8, steps=STEPS, warmup=WARMUP, label="eager-gpt",
            accels=("cpu",)))
def test_torch_eager_gpt(accelperf: CaseRunner) -> None:
    from torch_cases import gpt_eager

    which = injected()
    task = gpt_eager(accelperf.case.batch, item_sync=which == "item_sync",
                     manual_attention=which == "manual_attention",
                     autocast=which != "autocast_off")
    assert accelperf.train(task).run.outcome == "ok"


@cases(Case(backend="jax", batch=32, steps=STEPS, warmup=WARMUP, label="flax-bn"))
def test_flax_bn(accelperf: CaseRunner) -> None:
    from flax_cases import bn_cnn

    task = bn_cnn(accelperf.case.batch,
                  momentum=0.99 if injected() == "bn_momentum" else 0.9)
    assert accelperf.train(task).run.outcome == "ok"
