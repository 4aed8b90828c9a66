"""Per-rank memory falls with the ZeRO stage under the plugin's own DeepSpeed defaults.

Issue 23: a user's MLP of 3.1 M parameters (three 1024x1024 layers, torch ``Adam``, world
size 2, nothing in ``ds_config``) peaked on rank 0 at 20.0 / 18.0 / 18.0 / 23.4 bytes a
parameter at ZeRO 0 / 1 / 2 / 3: ZeRO-3 used more than no ZeRO at all, where the ZeRO paper
and the project's seed report (DeepSpeed's GPT grid) show memory falling with the stage.
The plugin had sized DeepSpeed's buckets and ZeRO-3's limits to the whole model; they are now
a fraction of a rank's share (``backends/torch/deepspeed.py``: :func:`size_buckets`).

Each stage's per-rank peak (the rank's MemTracker count over construction and the first two
steps) is checked against :func:`expected_bytes`, a count of what DeepSpeed 0.19 and torch's
Adam hold at that stage's peak, built from the model's shapes alone. Four cases, one counted
step pair each: 19 s on the project's two cores at load average 6, with the warm rank pool.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("deepspeed")
pytest.importorskip("cloudpickle")

from pytest_accelperf.backends import TrainResult  # noqa: E402
from pytest_accelperf.backends.torch.deepspeed import BACKEND, size_buckets  # noqa: E402
from pytest_accelperf.collect.cases import Case  # noqa: E402
from pytest_accelperf.provision.accel import Accelerator  # noqa: E402
from pytest_accelperf.torch import RankStep  # noqa: E402

#: Every test here is slow, out of the quick loop (`-m "not slow"`):
#: its fixture sizes DeepSpeed's buffers over ranks (20 s of setup).
pytestmark = pytest.mark.slow


CPU = Accelerator(name="cpu", platform="cpu-x1", device_kind="cpu", device_count=1)
WIDTH, DEPTH, BATCH, WORLD = 1024, 3, 8, 2
#: The report's model: three 1024x1024 layers with biases.
SHAPES = [s for _ in range(DEPTH) for s in ((WIDTH, WIDTH), (WIDTH,))]
N_PARAMS = sum(math.prod(s) for s in SHAPES)  # 3,148,800
#: What the plugin sizes every ZeRO key to for this model (the rule, written out here so
#: that the test does not take it from the code it checks): 1/8 of a rank's share of the
#: parameters (3,148,800 / 2 / 8 = 196,800), rounded up to 256 elements.
BUCKET = 196_864
#: How close the measured peaks came to :func:`expected_bytes` (exact bytes, 2026-11-26,
#: four repeats alike): ZeRO 0-2 within 24-36 bytes (scalars) on rank 0; rank 1 at ZeRO-1
#: 4,072 bytes under (it has already freed one bias gradient, 4 KiB, when it allocates its
#: gradient partition: five of the six full gradients are live there); ZeRO-3 65,581 bytes
#: (0.15 %) over on both ranks (the ReLU outputs saved for the backward and the three biases
#: ZeRO-3 keeps whole, left out of the count). 1 % leaves room for an allocation of a few
#: KiB more in another torch or DeepSpeed patch release, and is a fifth of the smallest gap
#: between two stages (ZeRO-1 16.94 against ZeRO-2 16.02 bytes a parameter: 5.4 %) and a
#: sixth of what the old defaults were off by at ZeRO-1 (18.03: +6.4 %; +12 % at ZeRO-2,
#: +64 % at ZeRO-3).
TOLERANCE = 0.01


def build(rank: int) -> tuple[Any, Any]:
    layers: list[Any] = []
    for _ in range(DEPTH):
        layers += [torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers[:-1])
    return model, torch.optim.Adam(model.parameters(), lr=1e-3)  # torch's default CPU Adam


def make_batch(step: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(step)
    return {"x": torch.randn(BATCH, WIDTH, generator=g),
            "y": torch.randn(BATCH, WIDTH, generator=g)}


def loss_fn(model: Any, batch: dict[str, Any]) -> Any:
    return ((model(batch["x"]) - batch["y"]) ** 2).mean()


def partition_tensors(rank: int, world: int = WORLD) -> int:
    """Elements of the tensors that overlap ``rank``'s share of ZeRO 1-2's flat parameter
    buffer (``params_in_partition``): ZeRO-1 and 2 size a rank's gradient partition by whole
    tensors, so a tensor across the boundary counts whole on both sides."""
    lo, hi = rank * N_PARAMS // world, (rank + 1) * N_PARAMS // world
    total, offset = 0, 0
    for shape in SHAPES:
        size = math.prod(shape)
        if offset < hi and offset + size > lo:
            total += size
        offset += size
    return total


def expected_bytes(stage: int, rank: int, world: int = WORLD) -> dict[str, int]:
    """Rank ``rank``'s peak at ZeRO ``stage`` under the plugin's defaults: the tensors live at
    that moment, by what they are (fp32 throughout, torch's single-tensor CPU ``Adam``, no
    offload; DeepSpeed 0.19 on the CPU accelerator, gloo). Ψ is the parameter bytes.

    * ZeRO-0 peaks in the engine's gradient all-reduce: parameters, gradients, Adam's two
      moments (the paper's 16 bytes a parameter) and the flat copy of every gradient the
      engine all-reduces (``engine.allreduce_bucket``: its bucket is the constant
      ``MEMORY_OPT_ALLREDUCE_SIZE``, 5e8 elements, no config key; the whole model): 5Ψ.
    * Stages 1-3 add DeepSpeed's fp32 master copy of the rank's partition (a clone even of
      an fp32 model) and hold Adam's moments for the partition only: 3Ψ/N.
    * ZeRO-1 peaks where the boundary reduce copies gradients into the partition: the flat
      parameters (the model's are views of it), every full gradient (kept until the
      boundary), the gradient partition (whole tensors, :func:`partition_tensors`) and the
      reduce bucket.
    * ZeRO-2 peaks in Adam's step: the parameters, the flat fp32 gradient the step hands the
      optimizer (Ψ/N; the reduced partition is freed by then) and Adam's two partition-sized
      temporaries (``exp_avg_sq.sqrt()`` and its quotient): Ψ + 6Ψ/N.
    * ZeRO-3 peaks in the backward, at the reduce-scatter of the largest weight's gradient:
      the parameter partition, master copy, moments and the flat gradient partition (5Ψ/N,
      held from construction), the reduce bucket, and the largest weight three times: gathered
      for its backward, its full gradient, and gloo's copy of it in the reduce-scatter. (The
      step, with ``sub_group_size`` a fraction of the partition, is smaller.)

    Every stage also holds the step's global batch (the ranks' rows are views of it)."""
    psi, n = 4 * N_PARAMS, world
    batch = 2 * BATCH * WIDTH * 4
    largest = 4 * max(math.prod(s) for s in SHAPES)
    if stage == 0:
        return {"parameters": psi, "gradients": psi, "adam moments": 2 * psi,
                "all-reduce flat copy": psi, "batch": batch}
    state = {"fp32 master copy": psi // n, "adam moments": 2 * psi // n}
    if stage == 1:
        return {"flat parameters": psi, "gradients": psi,
                "gradient partition": 4 * partition_tensors(rank, world), **state,
                "reduce bucket": 4 * BUCKET, "batch": batch}
    if stage == 2:
        return {"flat parameters": psi, "fp32 gradient for the step": psi // n, **state,
                "adam temporaries": 2 * psi // n, "batch": batch}
    if stage == 3:
        return {"parameter partition": psi // n, **state, "gradient partition": psi // n,
                "reduce bucket": 4 * BUCKET, "largest weight gathered": largest,
                "its gradient": largest, "gloo's reduce-scatter copy": largest,
                "batch": batch}
    raise ValueError(f"ZeRO stage {stage}")


@pytest.fixture(scope="module")
def runs() -> dict[int, TrainResult]:
    out = {}
    for stage in (0, 1, 2, 3):
        case = Case(backend="deepspeed", zero_stage=stage, batch=BATCH, steps=1, warmup=2,
                    world_size=WORLD, accels=("cpu",))
        out[stage] = BACKEND.train(case, RankStep(build=build, loss_fn=loss_fn,
                                                  make_batch=make_batch), CPU, timeout=600)
    return out


def _per_rank(runs: dict[int, TrainResult]) -> dict[int, dict[str, int]]:
    for stage, result in runs.items():
        assert result.run.outcome == "ok", f"ZeRO-{stage}: {result.run.message}"
        assert result.run.memory_source == "mem_tracker"
    return {stage: result.run.memory_per_device for stage, result in runs.items()}


@pytest.mark.slow
def test_per_rank_memory_falls_with_the_stage(runs: dict[int, TrainResult]) -> None:
    per_rank = _per_rank(runs)
    for rank in ("rank0", "rank1"):
        peaks = [per_rank[stage][rank] / N_PARAMS for stage in (0, 1, 2, 3)]
        shown = " / ".join(f"{p:.2f}" for p in peaks)
        assert all(a >= b for a, b in itertools.pairwise(peaks)), f"{rank}: {shown} B/param"
        # Not merely non-increasing: ZeRO-3 saves a quarter of ZeRO-0's bytes and more.
        assert peaks[3] < 0.75 * peaks[0], f"{rank}: {shown} B/param"


@pytest.mark.slow
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_each_stage_matches_the_expected_bytes(runs: dict[int, TrainResult],
                                               stage: int) -> None:
    per_rank = _per_rank(runs)[stage]
    for r in range(WORLD):
        terms = expected_bytes(stage, r)
        expected, measured = sum(terms.values()), per_rank[f"rank{r}"]
        shown = ", ".join(f"{k} {v / N_PARAMS:.3f}" for k, v in terms.items())
        assert measured == pytest.approx(expected, rel=TOLERANCE), (
            f"ZeRO-{stage} rank{r}: {measured / N_PARAMS:.3f} B/param measured, "
            f"{expected / N_PARAMS:.3f} expected ({shown})")


def test_the_plugin_lists_what_it_sized(runs: dict[int, TrainResult]) -> None:
    sized = {stage: runs[stage].run.details["engine"]["plugin_set"] for stage in runs}
    assert sized[0] == {}  # stage 0 has no ZeRO buffers
    buckets = {"zero_optimization.reduce_bucket_size": BUCKET,
               "zero_optimization.allgather_bucket_size": BUCKET}
    assert sized[1] == sized[2] == buckets
    assert sized[3] == {**buckets, **{f"zero_optimization.{k}": BUCKET for k in (
        "stage3_prefetch_bucket_size", "stage3_max_live_parameters",
        "stage3_max_reuse_distance", "stage3_model_persistence_threshold",
        "sub_group_size")}}
    config = runs[3].run.details["engine"]["config"]["zero_optimization"]
    assert config["sub_group_size"] == BUCKET  # what the engine was given


#: DeepSpeed 0.19's defaults of the sized keys (``zero_defaults()`` reads them from its
#: config model in a rank; written out so this test imports no DeepSpeed).
DEFAULTS = {"reduce_bucket_size": 500_000_000, "allgather_bucket_size": 500_000_000,
            "stage3_prefetch_bucket_size": 50_000_000,
            "stage3_max_live_parameters": 1_000_000_000,
            "stage3_max_reuse_distance": 1_000_000_000,
            "stage3_model_persistence_threshold": 2**63 - 1,
            "sub_group_size": 1_000_000_000}


def test_sizes_are_a_fraction_of_a_ranks_share_within_floor_and_caps() -> None:
    def sized(n: int, world: int, stage: int = 3, **zero: Any) -> dict[str, int]:
        return size_buckets({"zero_optimization": {"stage": stage, **zero}}, n, DEFAULTS,
                            world)

    assert set(sized(N_PARAMS, WORLD).values()) == {BUCKET}
    assert set(sized(N_PARAMS, WORLD, stage=1)) == {"reduce_bucket_size",
                                                    "allgather_bucket_size"}
    # More ranks, smaller shares: 3,148,800 / 8 / 8 = 49,200, under the 65,536 floor.
    assert sized(N_PARAMS, 8)["reduce_bucket_size"] == 65_536
    # A model under the floor: the whole model (rounded up to 256), never more.
    assert sized(9_000, WORLD)["reduce_bucket_size"] == 9_216
    # Billions of parameters: each key at most DeepSpeed's own default.
    huge = sized(10**12, WORLD)
    assert huge["reduce_bucket_size"] == DEFAULTS["reduce_bucket_size"]
    assert huge["stage3_prefetch_bucket_size"] == DEFAULTS["stage3_prefetch_bucket_size"]
    assert huge["stage3_model_persistence_threshold"] == 10**12 // 16
    # A key the user set is theirs, and not listed as the plugin's.
    mine = sized(N_PARAMS, WORLD, sub_group_size=123)
    assert "sub_group_size" not in mine and len(mine) == 6
    assert sized(N_PARAMS, WORLD, stage=0) == {}
