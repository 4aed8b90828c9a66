"""What a rank communicates per step (``pytest_accelperf.backends.torch.comm``): the counter
itself, then real 2-rank runs on the CPU (gloo) of a small MLP: DDP's bucket all-reduce
carries exactly the parameter bytes and scales with the model's width; ZeRO-3 issues other
collectives than ZeRO-2 (it gathers the parameters); an unchanged run gives the same record.

Five launches of a few seconds each, shared by a module-scoped fixture.
"""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("deepspeed")
pytest.importorskip("cloudpickle")

from pytest_accelperf.backends import TrainResult  # noqa: E402
from pytest_accelperf.backends.torch.comm import (  # noqa: E402
    CommCounter,
    count_deepspeed,
    largest_over_ranks,
    payload_bytes,
)
from pytest_accelperf.backends.torch.deepspeed import BACKEND  # noqa: E402
from pytest_accelperf.collect.cases import Case  # noqa: E402
from pytest_accelperf.provision.accel import Accelerator  # noqa: E402
from pytest_accelperf.torch import RankStep, train_ddp  # noqa: E402

#: Every test here is slow, out of the quick loop (`-m "not slow"`):
#: its fixtures train DDP over 2 ranks at two widths (16 s of setup).
pytestmark = pytest.mark.slow


CPU = Accelerator(name="cpu", platform="cpu-x1", device_kind="cpu", device_count=1)
BATCH, STEPS, WARMUP, IN = 8, 2, 2, 16
#: Steps whose collectives are counted: all but the first two
#: (torch/in_rank.py: RankPlan.comm_steps).
COUNTED = WARMUP + STEPS - 2


def mlp(width: int) -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(IN, width), torch.nn.Tanh(),
                               torch.nn.Linear(width, width), torch.nn.Tanh(),
                               torch.nn.Linear(width, 1))


def n_params(width: int) -> int:
    return sum(p.numel() for p in mlp(width).parameters())


def step(width: int) -> RankStep:
    def build(rank: int) -> tuple[Any, Any]:
        model = mlp(width)
        return model, torch.optim.AdamW(model.parameters(), lr=1e-2)

    def make_batch(i: int) -> dict[str, Any]:
        g = torch.Generator().manual_seed(i)
        x = torch.randn(BATCH, IN, generator=g)
        return {"x": x, "y": x.sum(dim=1, keepdim=True)}

    def loss_fn(model: Any, batch: dict[str, Any]) -> Any:
        return ((model(batch["x"]) - batch["y"]) ** 2).mean()

    return RankStep(build=build, loss_fn=loss_fn, make_batch=make_batch)


def case(backend: str, **kw: Any) -> Case:
    return Case(backend=backend, batch=BATCH, steps=STEPS, warmup=WARMUP, world_size=2,
                accels=("cpu",), **kw)


#: ZeRO sizes for a ~10k-parameter model (DeepSpeed's defaults hold the whole model).
SMALL = {"zero_optimization": {"reduce_bucket_size": 2048, "allgather_bucket_size": 2048,
                               "stage3_prefetch_bucket_size": 2048,
                               "stage3_max_live_parameters": 2048,
                               "stage3_max_reuse_distance": 2048,
                               "stage3_param_persistence_threshold": 64}}


@pytest.fixture(scope="module")
def runs() -> dict[str, TrainResult]:
    out: dict[str, TrainResult] = {}
    for stage in (2, 3):
        c = case("deepspeed", zero_stage=stage, params={"ds_config": SMALL})
        out[f"zero{stage}"] = BACKEND.train(c, step(64), CPU, timeout=600)
    c = case("deepspeed", zero_stage=3, params={"ds_config": SMALL})
    out["zero3_again"] = BACKEND.train(c, step(64), CPU, timeout=600)
    # After DeepSpeed's: the DDP cases run in its warm ranks, not in two more (rank_pool).
    out["ddp32"] = train_ddp(case("torch", label="w32"), step(32), CPU, timeout=600)
    out["ddp64"] = train_ddp(case("torch", label="w64"), step(64), CPU, timeout=600)
    return out


def collectives(result: TrainResult) -> dict[str, dict[str, int]]:
    run = result.run
    assert run.outcome == "ok", run.message
    assert run.program is not None
    assert run.details["comm"]["counted_steps"] == list(range(2, WARMUP + STEPS))
    assert run.details["comm"]["same_each_step"] and run.details["comm"]["symmetric"]
    out: dict[str, dict[str, int]] = run.program["collectives"]
    return out


# -- the counter ----------------------------------------------------------------------------
def test_payload_bytes_of_tensors_and_lists() -> None:
    assert payload_bytes(torch.zeros(10)) == 40
    assert payload_bytes([torch.zeros(3, dtype=torch.float64), torch.zeros(2)]) == 32
    assert payload_bytes(None) == 0


def test_counts_only_inside_a_step_and_divides_by_the_steps() -> None:
    counter = CommCounter()
    counter.add("all_reduce", 100)  # outside a counted step: ignored
    for _ in range(3):
        with counter.step():
            counter.add("all_reduce", 40)
            counter.add("all_gather", 10)
            counter.add("all_gather", 10)
    assert counter.per_step() == {"all_gather": {"count": 2, "bytes": 20},
                                  "all_reduce": {"count": 1, "bytes": 40}}
    assert counter.summary()["same_each_step"] and counter.summary()["steps"] == 3
    with counter.step():
        counter.add("broadcast", 8)
    summary = counter.summary()
    assert not summary["same_each_step"] and len(summary["each_step"]) == 4
    assert summary["collectives"]["broadcast"] == {"count": 0, "bytes": 2}  # 1/4, 8/4


def test_the_record_takes_the_largest_over_ranks() -> None:
    a = {"all_reduce": {"count": 1, "bytes": 40}}
    b = {"all_reduce": {"count": 1, "bytes": 44}, "broadcast": {"count": 2, "bytes": 8}}
    assert largest_over_ranks([a, b, None]) == {"all_reduce": {"count": 1, "bytes": 44},
                                                "broadcast": {"count": 2, "bytes": 8}}
    assert largest_over_ranks([None]) is None


def test_deepspeed_backend_methods_are_wrapped_and_counted(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import deepspeed.comm.comm as comm

    class Backend:
        def all_reduce(self, tensor: Any, op: Any = None, group: Any = None,
                       async_op: bool = False) -> str:
            return "reduced"

        def all_gather_into_tensor(self, output_tensor: Any, input_tensor: Any,
                                   group: Any = None, async_op: bool = False) -> str:
            return "gathered"

    backend = Backend()
    monkeypatch.setattr(comm, "cdb", backend)
    counter = CommCounter()
    assert count_deepspeed(counter) == ["all_reduce", "all_gather_into_tensor"]
    assert count_deepspeed(counter) == []  # wrapped once
    assert backend.all_reduce(torch.zeros(4)) == "reduced"  # not counted: no step open
    with counter.step():
        backend.all_reduce(torch.zeros(4))
        backend.all_gather_into_tensor(torch.zeros(8), input_tensor=torch.zeros(4))
    assert counter.per_step() == {"all_gather": {"count": 1, "bytes": 16},
                                  "all_reduce": {"count": 1, "bytes": 16}}


# -- real ranks -----------------------------------------------------------------------------
@pytest.mark.slow
def test_ddp_all_reduces_the_parameter_bytes_once_a_step(runs: dict[str, TrainResult]) -> None:
    for width in (32, 64):
        result = runs[f"ddp{width}"]
        assert result.run.program is not None and result.run.program["source"] == "ddp"
        # One bucket (25 MiB by default) holding every parameter's fp32 gradient.
        assert collectives(result) == {"all_reduce": {"count": 1,
                                                      "bytes": 4 * n_params(width)}}


def test_doubling_the_width_raises_the_bytes_by_the_parameter_ratio(
        runs: dict[str, TrainResult]) -> None:
    narrow = collectives(runs["ddp32"])["all_reduce"]["bytes"]
    wide = collectives(runs["ddp64"])["all_reduce"]["bytes"]
    assert wide / narrow == pytest.approx(n_params(64) / n_params(32), rel=1e-9)
    assert 3.0 < wide / narrow < 4.0  # the 64x64 hidden layer: about 3.5x


def test_zero3_gathers_parameters_that_zero2_keeps(runs: dict[str, TrainResult]) -> None:
    zero2, zero3 = collectives(runs["zero2"]), collectives(runs["zero3"])
    psi = 4 * n_params(64)
    assert runs["zero3"].run.program["source"] == "deepspeed"  # type: ignore[index]
    # ZeRO-2 all-reduces the gradients in buckets (plus a 4-byte scalar) and gathers each
    # rank's updated partition once.
    assert zero2["all_reduce"]["bytes"] == pytest.approx(psi, rel=0.01)
    assert zero2["all_gather"] == {"count": 1, "bytes": pytest.approx(psi / 2, rel=0.01)}
    assert "reduce_scatter" not in zero2
    # ZeRO-3 reduce-scatters the gradients and gathers the parameters module by module,
    # each rank contributing its partition: at least Ψ/2 a step (once for the forward; a
    # module gathered again for the backward adds its share).
    assert zero3["reduce_scatter"]["bytes"] == pytest.approx(psi, rel=0.05)
    assert zero3["all_gather"]["count"] > 2 * zero2["all_gather"]["count"]
    assert zero3["all_gather"]["bytes"] >= 0.45 * psi
    assert set(zero3) != set(zero2)


def test_an_unchanged_run_gives_the_same_record(runs: dict[str, TrainResult]) -> None:
    assert runs["zero3"].run.program == runs["zero3_again"].run.program
    assert collectives(runs["zero3"]) == collectives(runs["zero3_again"])


def test_rank_zero_records_what_its_counted_micro_batch_dispatched(
        runs: dict[str, TrainResult]) -> None:
    """The same counted call as the FLOPs (tests/unit/backends/torch/test_ops.py has the rules): the
    MLP's products, DDP's bucket all-reduce, and the wait ZeRO-3 adds (``.item()`` on a
    tensor a GPU would hold: the ranks agree on the parameters they fetch)."""
    from pytest_accelperf.records.program import matmul_dtypes

    ddp = runs["ddp32"].run.program
    assert ddp is not None
    # 3 products forward, 3 weight gradients, 2 input gradients (the first layer's input
    # needs none).
    assert matmul_dtypes(ddp["ops"]) == {"f32": 8}
    assert ddp["ops"]["c10d.allreduce_[f32]"] == 1
    assert ddp["host_syncs"] == 0 and ddp["bytes_accessed"] > 0
    zero3 = runs["zero3"].run.program
    assert zero3 is not None and matmul_dtypes(zero3["ops"]) == {"f32": 8}
    assert zero3["host_syncs"] == sum(zero3["host_sync_sites"].values()) >= 1
    assert all(site.startswith("_local_scalar_dense at deepspeed/runtime/zero/")
               for site in zero3["host_sync_sites"]), zero3["host_sync_sites"]
    # Keyed by DeepSpeed's function and source text, not the line, which moves between
    # its releases (the committed baselines' line-keyed sites compare per file and op).
    assert ("_local_scalar_dense at deepspeed/runtime/zero/utils.py in "
            "assert_lst_len_same_as_other_ranks: rank0_list_length = "
            "rank0_len_tensor.cpu().item()") in zero3["host_sync_sites"], zero3["host_sync_sites"]
