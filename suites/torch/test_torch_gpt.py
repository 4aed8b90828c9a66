"""A small GPT in PyTorch (single process) on the JAX suite's corpus: eager and compiled.

The compiled case costs one ``torch.compile`` of forward and backward (about 40 s on the
2-core development CPU, reported as compile time, never as a step time).
"""

from __future__ import annotations

from gpt import make_task

from pytest_accelperf import Case, CaseRunner, MaxBatchSearch, cases


@cases(backend="torch", batch=[8, 32], steps=20, warmup=2, accels=("cpu", "gpu"))
def test_torch_gpt(accelperf: CaseRunner) -> None:
    result = accelperf.train(make_task(accelperf.case))
    assert result.run.outcome == "ok"


# Inductor's CPU kernels are not bitwise reproducible from one compile to the next (measured:
# max |delta| 1.5e-4 on a bias after 22 steps), so numerics get a tolerance that admits that
# and still catches a real change in the math.
@cases(Case(backend="torch", batch=8, steps=20, warmup=2, label="compiled",
            accels=("cpu", "gpu"), params={"compile": True},
            tolerances={"numerics_atol": 2e-3, "numerics_rtol": 1e-3}))
def test_torch_gpt_compiled(accelperf: CaseRunner) -> None:
    result = accelperf.train(make_task(accelperf.case))
    assert result.run.outcome == "ok"
    assert result.run.compile_time is not None


# Seed 002's "max batch size" column, on one process: the largest batch whose MemTracker-
# counted peak (parameters, gradients, AdamW state, activations) fits a declared 64 MiB.
@cases(Case(backend="torch", batch=8, steps=10, warmup=1, label="maxbatch", accels=("cpu",),
            memory_capacity=64 * 2**20))
def test_torch_gpt_max_batch(accelperf: CaseRunner) -> None:
    result = accelperf.train(make_task(accelperf.case),
                             max_batch=MaxBatchSearch(make_task, limit=4096))
    assert result.run.max_batch is not None and result.run.max_batch["value"] >= 8
