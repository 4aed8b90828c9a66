"""The small GPT at world size 2: DeepSpeed ZeRO 0-3 x CPU offload, and torch DDP.

Mirrors DeepSpeed's own GPT benchmark table (ZeRO stage x CPU offload; time per iteration,
per-GPU memory; a configuration that does not fit is an outcome, "cannot even initialize
model" or out of memory at a step) at a size a 2-core CPU trains in seconds. Each case
launches two ranks (gloo on the CPU, one GPU each with ``--accel=gpu``): about 10 s here,
mostly two interpreters importing torch and DeepSpeed. The first run on a machine also
compiles DeepSpeed's ``deepspeed_shm_comm`` and ``cpu_adam`` ops (about a minute each),
cached in ``~/.cache/pytest-accelperf/torch_extensions`` (or ``$TORCH_EXTENSIONS_DIR``).

The ZeRO-3 case also trains the GPT in this process with plain torch on the full global
batch and checks the gathered parameters against it (the ``reference`` check).
"""

from __future__ import annotations

from gpt import make_task

from pytest_accelperf import Case, CaseRunner, MaxBatchSearch, cases
from pytest_accelperf.backends.ddp import train_ddp

#: Bucket sizes for a 110k-parameter model. DeepSpeed's defaults (5e8 elements) are sized
#: for billions of parameters: a 2 GB ZeRO-3 gradient bucket would be all the count showed.
BUCKETS = {"zero_optimization": {"reduce_bucket_size": 50_000, "allgather_bucket_size": 50_000,
                                 "stage3_prefetch_bucket_size": 50_000,
                                 "stage3_param_persistence_threshold": 1_000}}
COMMON = {"batch": 8, "steps": 10, "warmup": 2, "world_size": 2, "accels": ("cpu", "gpu")}
ZERO = [(0, "none"), (1, "none"), (1, "optimizer"), (2, "none"), (2, "optimizer"),
        (3, "none"), (3, "optimizer"), (3, "all")]


@cases([Case(backend="deepspeed", zero_stage=stage, offload=offload, model="gpt",
             reference=(stage, offload) == (3, "none"), params={"ds_config": BUCKETS},
             **COMMON)
        for stage, offload in ZERO])
def test_zero(accelperf: CaseRunner) -> None:
    result = accelperf.train(make_task(accelperf.case))
    assert result.run.outcome == "ok"
    assert set(result.run.memory_per_device) == {"rank0", "rank1"}


@cases(Case(backend="torch", model="gpt", label="ddp", **COMMON))
def test_ddp(accelperf: CaseRunner) -> None:
    # DDP trains through pytest_accelperf.backends.ddp; checked like any other run.
    case = accelperf.case
    result = accelperf.check(train_ddp(case, make_task(case), accelperf.accelerator,
                                       timeout=accelperf.settings.timeout))
    assert result.run.outcome == "ok"


# Seed 002's "Max Global BSZ" column: the largest global batch (a multiple of 8, as in the
# seed) whose busiest rank stays within a declared 8 MiB under ZeRO-2, each candidate two
# real steps in both ranks. A drop of the max batch is a regression.
@cases(Case(backend="deepspeed", zero_stage=2, offload="none", model="gpt", label="maxbatch",
            memory_capacity=8 * 2**20, params={"ds_config": BUCKETS},
            **{**COMMON, "steps": 5, "accels": ("cpu",)}))
def test_zero_max_batch(accelperf: CaseRunner) -> None:
    result = accelperf.train(make_task(accelperf.case),
                             max_batch=MaxBatchSearch(make_task, limit=1024, multiple_of=8))
    assert result.run.max_batch is not None and result.run.max_batch["value"] >= 8
