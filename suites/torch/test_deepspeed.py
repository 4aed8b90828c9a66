"""A GPT at world size 2: DeepSpeed ZeRO 0-3 x CPU offload, and torch DDP.

Mirrors DeepSpeed's own GPT benchmark table (seed 002: ZeRO stage x CPU offload; time per
iteration, per-GPU memory; a configuration that does not fit is an outcome, "cannot even
initialize model" or out of memory at a step) at a size a 2-core CPU trains in seconds.
Each case launches two ranks (gloo on the CPU, one GPU each with ``--accel=gpu``): about
10 s here, mostly two interpreters importing torch and DeepSpeed. The first run on a
machine also compiles DeepSpeed's ``deepspeed_shm_comm`` and ``cpu_adam`` ops (about a
minute each), cached in ``~/.cache/pytest-accelperf/torch_extensions`` (or
``$TORCH_EXTENSIONS_DIR``).

Memory true to the seed: there, per-GPU memory falls as the stage partitions more of the
training state (which is what lets a higher stage fit a larger batch). Here it does too,
and each stage's per-rank memory is checked against :func:`expected_bytes`, a model of
DeepSpeed's own allocations at that stage, within :data:`MEMORY_TOLERANCE`. What makes the
measurement show the stages rather than the setup:

* the GPT is wider (``d_model`` 384: 3.6 M parameters, Ψ = 13.8 MiB of fp32) and the
  global batch small (4: 2 samples a rank), so the training state dominates the
  activations (0.23 Ψ) as it does at 345 M parameters;
* the optimizer is fused AdamW (``fused=True``), as the seed's Megatron-DeepSpeed runs
  use DeepSpeed's FusedAdam: torch's default CPU AdamW allocates two partition-sized
  temporaries per step (``exp_avg_sq.sqrt() / bias_correction``), a term no GPU run has;
* ZeRO's buckets and ZeRO-3's live-parameter limits are sized to the model
  (:data:`ZERO_CONFIG`), not left at DeepSpeed's defaults for billions of parameters
  (5e8-element buckets, 1e9 live parameters: "keep everything gathered").

The ZeRO-3 case also trains the GPT in this process with plain torch on the full global
batch and checks the gathered parameters against it (the ``reference`` check).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

import pytest
import torch
import torch.nn.functional as F
from gpt import GPT, LR, load_corpus, make_task

from pytest_accelperf import Case, CaseRunner, MaxBatchSearch, cases
from pytest_accelperf.torch import TorchTask, train_ddp

VOCAB = len(load_corpus()[1])
D_MODEL = 384
WORLD = 2
#: ZeRO sizes, in elements, for the 3.6 M-parameter GPT: buckets of 100 k elements (3 % of
#: the model; DeepSpeed's 5e8 defaults would each hold the whole model), and ZeRO-3 keeping
#: at most 100 k gathered parameters live and re-gathering rather than caching (DeepSpeed's
#: 1e9 defaults keep the whole model gathered after the first step, which is ZeRO-2's
#: parameter memory plus ZeRO-3's bookkeeping). Tensors under 1 000 elements (biases,
#: LayerNorms) stay whole on every rank, as DeepSpeed intends for small tensors.
BUCKET = 100_000
ZERO_CONFIG = {"zero_optimization": {
    "reduce_bucket_size": BUCKET, "allgather_bucket_size": BUCKET,
    "stage3_prefetch_bucket_size": BUCKET, "stage3_max_live_parameters": BUCKET,
    "stage3_max_reuse_distance": BUCKET, "stage3_param_persistence_threshold": 1_000}}
COMMON = {"batch": 4, "steps": 10, "warmup": 2, "world_size": WORLD, "accels": ("cpu", "gpu")}
ZERO = [(0, "none"), (1, "none"), (1, "optimizer"), (2, "none"), (2, "optimizer"),
        (3, "none"), (3, "optimizer"), (3, "all")]
#: The measured per-rank peak must be within this fraction of :func:`expected_bytes`.
MEMORY_TOLERANCE = 0.10


def wide_task(case: Case) -> TorchTask:
    """The suite GPT (``gpt.make_task``: corpus, batches, loss, seed) at ``d_model``
    :data:`D_MODEL`, trained by fused AdamW at the same learning rate."""

    def make_model() -> torch.nn.Module:
        return GPT(VOCAB, d_model=D_MODEL)

    def make_optimizer(params: Iterable[torch.nn.Parameter]) -> torch.optim.Optimizer:
        return torch.optim.AdamW(params, lr=LR, fused=True)

    return dataclasses.replace(make_task(case), make_model=make_model,
                               make_optimizer=make_optimizer)


# -- the expected-bytes model ------------------------------------------------------------
def model_sizes(case: Case) -> dict[str, int]:
    """What :func:`expected_bytes` needs of the model, counted (not timed) here: its
    parameter bytes (Ψ), its largest module's own parameter bytes, and the activations of
    one micro-batch: the bytes of the distinct tensors autograd saves for the backward
    (``saved_tensors_hooks``), parameters left out."""
    task = wide_task(case)
    torch.manual_seed(task.seed)
    model = task.make_model()
    params = list(model.parameters())
    ptrs = {p.untyped_storage().data_ptr() for p in params}
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in ptrs:
            saved[storage.data_ptr()] = storage.nbytes()
        return t

    micro = case.batch // case.world_size // case.grad_accum
    batch = task.make_batch(0)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        logits = model(batch["x"][:micro])
        F.cross_entropy(logits.flatten(0, 1), batch["y"][:micro].flatten())
    largest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())
    return {"params": 4 * sum(p.numel() for p in params), "largest_module": 4 * largest,
            "activations": sum(saved.values())}


def expected_bytes(stage: int, params: int, largest_module: int, activations: int,
                   world: int = WORLD, bucket: int = BUCKET) -> dict[str, int]:
    """DeepSpeed 0.19's per-rank peak at ZeRO ``stage``, fp32 (every tensor 4 bytes a
    parameter), fused Adam, no offload: the tensors live at the moment of the peak, by
    what they are. ``params`` is Ψ (parameter bytes), ``bucket`` in elements.

    Stage 0 peaks in the gradient all-reduce after the backward (activations freed):
    the model's parameters (Ψ) and gradients (Ψ), Adam's two moments (2Ψ), and the flat
    copy of every gradient the engine all-reduces (``engine.allreduce_bucket`` flattens
    its bucket, whose size is the constant ``MEMORY_OPT_ALLREDUCE_SIZE`` = 5e8 elements,
    not a config key: the whole model): 5Ψ.

    Stages 1-3 keep an fp32 *master copy* of the rank's partition
    (``single_partition_of_fp32_groups``, ``fp32_partitioned_groups_flat``: a clone even
    when the model is fp32) and Adam's moments for that partition only: Ψ/N + 2Ψ/N.

    Stage 1 peaks when the boundary reduces the gradients (after the backward): the
    flattened parameters (Ψ: ``bit16_groups_flat``, the model's parameters are views of
    it), every parameter's full gradient (Ψ: ZeRO-1 keeps them until the boundary), the
    fp32 accumulator of the rank's gradient partition (Ψ/N), master copy and moments
    (3Ψ/N), and the reduce bucket (``reduce_bucket_size`` elements): 2Ψ + 4Ψ/N + bucket.

    Stage 2 peaks in the optimizer step: parameters (Ψ), the reduced gradient partition
    (``grads_in_partition``, Ψ/N), the flat fp32 copy of it the step hands the optimizer
    (Ψ/N; the partition is freed after the copy), master copy and moments (3Ψ/N): Ψ + 5Ψ/N.
    (The reduce bucket is freed at the end of the backward, before the step.)

    Stage 3 peaks in the backward: the parameter partition (``lp_param_buffer``, Ψ/N),
    master copy and moments (3Ψ/N), the flat gradient partition
    (``grad_partitions_flat_buffer``, Ψ/N, held from construction), the reduce bucket
    (allocated at construction), the activations of the micro-batch, and the backward of
    the largest module: its gathered parameters, its full gradient, and the flat copy
    ``reduce_scatter_coalesced`` makes of a gradient larger than the bucket (3 x its
    parameter bytes). The optimizer step (the same state, the gradient copy in place of the
    activations and the module) is smaller here.
    """
    n = world
    bucket_bytes = 4 * bucket
    if stage == 0:
        return {"parameters": params, "gradients": params, "adam moments": 2 * params,
                "all-reduce flat copy": params}
    state = {"fp32 master copy": params // n, "adam moments": 2 * params // n}
    if stage == 1:
        return {"parameters": params, "gradients": params,
                "gradient partition": params // n, **state, "reduce bucket": bucket_bytes}
    if stage == 2:
        return {"parameters": params, "gradient partition": params // n,
                "gradient copy for the step": params // n, **state}
    if stage == 3:
        return {"parameter partition": params // n, **state,
                "gradient partition": params // n, "reduce bucket": bucket_bytes,
                "activations": activations,
                "largest module: gathered, gradient, scatter copy": 3 * largest_module}
    raise ValueError(f"ZeRO stage {stage}")


def check_memory(case: Case, per_rank: dict[str, int]) -> list[str]:
    """Each rank's peak against :func:`expected_bytes` of the case's stage: an
    AssertionError naming every term when one differs by more than
    :data:`MEMORY_TOLERANCE`; what was compared otherwise."""
    sizes = model_sizes(case)
    terms = expected_bytes(case.zero_stage or 0, sizes["params"], sizes["largest_module"],
                           sizes["activations"], world=case.world_size)
    expected = sum(terms.values())
    psi = sizes["params"]
    lines = []
    for rank, measured in sorted(per_rank.items()):
        line = (f"ZeRO-{case.zero_stage} {rank}: {measured / psi:.3f} Ψ measured, "
                f"{expected / psi:.3f} Ψ expected (Ψ = {psi} parameter bytes)")
        if abs(measured / expected - 1) > MEMORY_TOLERANCE:
            shown = ", ".join(f"{name} {value / psi:.3f} Ψ" for name, value in terms.items())
            raise AssertionError(f"{line}: off by {measured / expected - 1:+.1%}, more than "
                                 f"{MEMORY_TOLERANCE:.0%}; expected = {shown}")
        lines.append(line)
    return lines


@cases([Case(backend="deepspeed", zero_stage=stage, offload=offload, model="gpt",
             reference=(stage, offload) == (3, "none"), params={"ds_config": ZERO_CONFIG},
             **COMMON)
        for stage, offload in ZERO])
def test_zero(accelperf: CaseRunner) -> None:
    case = accelperf.case
    result = accelperf.train(wide_task(case))
    assert result.run.outcome == "ok"
    assert set(result.run.memory_per_device) == {"rank0", "rank1"}
    if case.offload == "none" and result.run.memory_source == "mem_tracker":
        # On the CPU, offloaded state moves to the same memory: only the device-resident
        # configurations have a stage's footprint.
        check_memory(case, result.run.memory_per_device)


@cases(Case(backend="torch", model="gpt", label="ddp", **COMMON))
def test_ddp(accelperf: CaseRunner) -> None:
    # DDP trains through pytest_accelperf.backends.torch.ddp; checked like any other run.
    case = accelperf.case
    result = accelperf.check(train_ddp(case, wide_task(case), accelperf.accelerator,
                                       timeout=accelperf.settings.timeout))
    assert result.run.outcome == "ok"
    program = result.run.program
    assert program is not None and program["source"] == "ddp"
    # One bucket all-reduce a step carrying every parameter's gradient once.
    assert program["collectives"]["all_reduce"]["bytes"] == pytest.approx(
        model_sizes(case)["params"], rel=0.01)


# Seed 002's "Max Global BSZ" column: the largest global batch (a multiple of 8, as in the
# seed) whose busiest rank stays within a declared 64 MiB under ZeRO-2 (its training state
# is 3.5 Ψ = 48 MiB), each candidate two real steps in both ranks. A drop of the max batch
# is a regression.
@cases(Case(backend="deepspeed", zero_stage=2, offload="none", model="gpt", label="maxbatch",
            memory_capacity=64 * 2**20, params={"ds_config": ZERO_CONFIG},
            **{**COMMON, "batch": 8, "steps": 5, "accels": ("cpu",)}))
def test_zero_max_batch(accelperf: CaseRunner) -> None:
    result = accelperf.train(wide_task(accelperf.case),
                             max_batch=MaxBatchSearch(wide_task, limit=1024, multiple_of=8))
    assert result.run.max_batch is not None and result.run.max_batch["value"] >= 8
