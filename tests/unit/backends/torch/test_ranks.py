"""The per-rank factory (``RankStep``): the user's own model, optimizer (parameter groups
from the model) and LR schedule, trained by DeepSpeed and DDP in two launched ranks on the
CPU, with gradient accumulation, ZeRO-3 with and without ``zero.Init``, ``torch.compile``,
bucket sizes fitted to the model, and the errors of a factory that returns the wrong thing.

Each launch costs ~10 s here (two interpreters importing torch and DeepSpeed), so the
trained runs are shared by module-scoped fixtures.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("deepspeed")
pytest.importorskip("cloudpickle")

from pytest_accelperf.backends import TrainResult  # noqa: E402
from pytest_accelperf.backends.measure.common import TaskError  # noqa: E402
from pytest_accelperf.backends.torch.deepspeed import (  # noqa: E402
    BACKEND,
    SIZED_KEYS,
    DeepSpeedRankEngine,
    ds_config,
    size_buckets,
    zero_defaults,
)
from pytest_accelperf.backends.torch.in_rank import RankPlan, micro_batches  # noqa: E402
from pytest_accelperf.backends.torch.processes import train_reference  # noqa: E402
from pytest_accelperf.checks.numerics import check_reference  # noqa: E402
from pytest_accelperf.collect.cases import Case  # noqa: E402
from pytest_accelperf.provision.accel import Accelerator  # noqa: E402
from pytest_accelperf.records.verdict import Tolerances, Verdict  # noqa: E402
from pytest_accelperf.torch import (  # noqa: E402
    Built,
    RankStep,
    train_ddp,
)

#: Every test here is slow, out of the quick loop (`-m "not slow"`):
#: its fixtures launch DDP and DeepSpeed ranks (46 s of setup in the quick loop at load 2).
pytestmark = pytest.mark.slow


CPU = Accelerator(name="cpu", platform="cpu-x1", device_kind="cpu", device_count=1)
BATCH, STEPS, WARMUP, WIDTH, LR, WARM = 16, 3, 2, 64, 1e-2, 3
#: Client optimizer calls per step, counted by an optimizer pre-hook (the way a schedule
#: copied into a pre-hook counts): one dict per rank process.
CALLS = {"n": 0}


class Net(torch.nn.Module):
    """A small residual MLP with a GPT-style scaled init of its output projections and a
    ``configure_optimizers`` that puts >= 2-D weights in the decayed group."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = torch.nn.Linear(16, WIDTH)
        self.blocks = torch.nn.ModuleList(torch.nn.Linear(WIDTH, WIDTH) for _ in range(2))
        self.norm = torch.nn.LayerNorm(WIDTH)
        self.out = torch.nn.Linear(WIDTH, 1)
        for name, p in self.named_parameters():  # the model's own init
            if name.endswith("weight") and p.dim() >= 2:
                torch.nn.init.normal_(p, std=0.02 / math.sqrt(2 * len(self.blocks)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for block in self.blocks:
            h = h + torch.tanh(block(h))
        out: torch.Tensor = self.out(self.norm(h))
        return out

    def configure_optimizers(self, weight_decay: float, lr: float) -> torch.optim.Optimizer:
        decay = [p for p in self.parameters() if p.dim() >= 2]
        other = [p for p in self.parameters() if p.dim() < 2]
        return torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                                  {"params": other, "weight_decay": 0.0}], lr=lr)


def schedule(step: int) -> float:
    """Linear warm-up over WARM steps, then 1/sqrt decay (a factor of LR)."""
    return (step + 1) / WARM if step < WARM else math.sqrt(WARM / (step + 1))


def build(rank: int) -> tuple[Any, Any, Any]:
    model = Net()
    optimizer = model.configure_optimizers(weight_decay=0.1, lr=LR)
    optimizer.register_step_pre_hook(lambda *_: CALLS.__setitem__("n", CALLS["n"] + 1))
    return model, optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)


def without_schedule(rank: int) -> tuple[Any, Any]:
    model = Net()
    return model, model.configure_optimizers(weight_decay=0.1, lr=LR)


def make_batch(step: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(step)
    x = torch.randn(BATCH, 16, generator=g)
    return {"x": x, "y": torch.sin(x.sum(dim=1, keepdim=True))}


def loss_fn(model: Any, batch: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    loss = ((model(batch["x"]) - batch["y"]) ** 2).mean()
    return loss, {"opt_calls": float(CALLS["n"])}


def rank_step(**kw: Any) -> RankStep:
    return RankStep(**{"build": build, "loss_fn": loss_fn, "make_batch": make_batch, **kw})


def case(backend: str = "deepspeed", **kw: Any) -> Case:
    base: dict[str, Any] = {"batch": BATCH, "steps": STEPS, "warmup": WARMUP,
                            "world_size": 2, "accels": ("cpu",)}
    return Case(backend=backend, **{**base, **kw})


#: An optimizer and schedule that DeepSpeed builds from its config, as its tutorials
#: write it (DeepSpeedExamples' CIFAR-10: "optimizer" and "scheduler" sections, the model
#: handed over alone): AdamW and a linear warm-up over WARM steps.
FROM_CONFIG = {"optimizer": {"type": "AdamW", "params": {"lr": LR, "weight_decay": 0.1}},
               "scheduler": {"type": "WarmupLR", "params": {
                   "warmup_min_lr": 0.0, "warmup_max_lr": LR, "warmup_num_steps": WARM,
                   "warmup_type": "linear"}}}


def model_only(rank: int) -> Net:
    return Net()


#: DeepSpeed's defaults, set explicitly: the run as it was before the plugin sized them.
def unsized() -> dict[str, Any]:
    defaults = zero_defaults()
    return {"zero_optimization": {k: defaults[k] for k in SIZED_KEYS if k in defaults}}


@pytest.fixture(scope="module")
def runs() -> dict[str, TrainResult]:
    out: dict[str, TrainResult] = {}
    # ZeRO-2, 2 micro-batches per step, DeepSpeed's engine.compile(), a user bucket key.
    c = case(zero_stage=2, grad_accum=2, reference=True)
    out["accum"] = BACKEND.train(c, rank_step(compile=True, ds_config={
        "zero_optimization": {"allgather_bucket_size": 4096}}), CPU, timeout=600)
    c = case(zero_stage=3, reference=True)
    out["zero3"] = BACKEND.train(c, rank_step(), CPU, timeout=600)
    c = case(zero_stage=3, zero_init=True)  # no schedule: ZeRO-3 drops the empty group
    out["zero3_init"] = BACKEND.train(c, rank_step(build=without_schedule), CPU, timeout=600)
    c = case(zero_stage=2)
    out["sized"] = BACKEND.train(c, rank_step(), CPU, timeout=600)
    out["unsized"] = BACKEND.train(c, rank_step(ds_config=unsized()), CPU, timeout=600)
    out["from_config"] = BACKEND.train(case(zero_stage=2), rank_step(
        build=model_only, ds_config=FROM_CONFIG), CPU, timeout=600)
    c = case(backend="torch", grad_accum=2, reference=True, label="ddp")
    out["ddp_compile"] = train_ddp(c, rank_step(compile=True), CPU, timeout=600)
    return out


def _ok(result: TrainResult) -> Any:
    assert result.run.outcome == "ok", result.run.message
    return result.run


@pytest.mark.slow
def test_the_schedule_advances_once_per_optimizer_step_at_zero2(
        runs: dict[str, TrainResult]) -> None:
    run = _ok(runs["accum"])
    n = WARMUP + 1 + STEPS  # compiling adds a warm-up step
    assert len(run.losses) == n
    expected = [LR * schedule(i) for i in range(n)]
    assert run.metrics["lr"] == pytest.approx(expected, rel=1e-6)
    engine = run.details["engine"]
    assert engine["scheduler"] == "LambdaLR"
    assert engine["optimizer_steps"] == n and engine["micro_steps"] == 2 * n
    # The double-speed hazard, measured: DeepSpeed's ZeRO-2 calls the client optimizer's
    # step() once per parameter group, so a schedule counting those calls (an optimizer
    # pre-hook) would run twice as fast as the optimizer steps the scheduler counts.
    groups = len(engine["param_groups"])
    assert groups == 2
    assert run.metrics["opt_calls"] == [float(groups * i) for i in range(n)]


def test_accumulation_makes_the_global_batch_of_micro_batches(
        runs: dict[str, TrainResult]) -> None:
    result = runs["accum"]
    run = _ok(result)
    config = run.details["engine"]["config"]
    assert config["gradient_accumulation_steps"] == 2
    assert config["train_batch_size"] == BATCH == run.samples_per_step
    assert config["train_micro_batch_size_per_gpu"] == BATCH // (2 * 2)
    assert run.details["micro_batch"] == BATCH // 4 and run.details["grad_accum"] == 2
    # Two micro-batches on each of two ranks are one step on the global batch.
    assert result.reference_params is not None
    check = check_reference(result.params, result.reference_params, Tolerances())
    assert check.verdict is Verdict.PASS, check.detail
    # The same global batch without accumulation: another micro-batch size, same training.
    sized = _ok(runs["sized"])
    assert sized.details["engine"]["config"]["train_micro_batch_size_per_gpu"] == BATCH // 2
    assert sized.details["engine"]["micro_steps"] == WARMUP + STEPS
    assert run.losses[:WARMUP + STEPS] == pytest.approx(sized.losses, rel=1e-4)


def test_micro_batches_are_consecutive_rows_of_the_ranks_share() -> None:
    c = case(zero_stage=0, grad_accum=2)
    batch = {"x": torch.arange(BATCH), "scale": torch.tensor(2.0)}
    parts = [micro_batches(batch, r, c) for r in range(2)]
    assert [p["x"].tolist() for p in parts[1]] == [[8, 9, 10, 11], [12, 13, 14, 15]]
    assert torch.equal(torch.cat([m["x"] for p in parts for m in p]), batch["x"])
    with pytest.raises(ValueError, match="not divisible by 4"):
        BACKEND.train(case(zero_stage=0, grad_accum=2, batch=6), rank_step(), CPU)


def test_deepspeed_compile_trains(runs: dict[str, TrainResult]) -> None:
    run = _ok(runs["accum"])
    assert run.details["engine"]["compile"] == "engine.compile()"
    assert run.details["engine"]["compiled_graphs"] > 0


def test_zero3_builds_without_zero_init_by_default(runs: dict[str, TrainResult]) -> None:
    n_decay = sum(1 for p in Net().parameters() if p.dim() >= 2)
    result = runs["zero3"]
    run = _ok(result)
    assert run.details["engine"]["zero_init"] is False
    decayed = run.details["engine"]["param_groups"][0]
    assert decayed["weight_decay"] == 0.1 and decayed["tensors"] == n_decay > 0
    # The model's own scaled init survived: the ranks match plain torch built the same way.
    assert result.reference_params is not None
    check = check_reference(result.params, result.reference_params, Tolerances())
    assert check.verdict is Verdict.PASS, check.detail
    # Asked for, zero.Init partitions each weight as it is made: the model's own code sees
    # empty tensors, so its weight-decay group comes out empty (what the run shows).
    inited = _ok(runs["zero3_init"])
    assert inited.details["engine"]["zero_init"] is True
    assert inited.details["engine"]["param_groups"][0]["tensors"] == 0


def test_the_users_deepspeed_key_wins(runs: dict[str, TrainResult]) -> None:
    engine = _ok(runs["accum"]).details["engine"]
    zero = engine["config"]["zero_optimization"]
    assert zero["allgather_bucket_size"] == 4096
    assert "zero_optimization.allgather_bucket_size" not in engine["plugin_set"]
    n = sum(p.numel() for p in Net().parameters())
    assert n <= engine["plugin_set"]["zero_optimization.reduce_bucket_size"] < 2 * n
    # Merge order: the case's params["ds_config"], then the RankStep's, over the plugin's.
    c = case(zero_stage=1, params={"ds_config": {"zero_optimization": {
        "reduce_bucket_size": 10, "allgather_bucket_size": 20}}})
    config = ds_config(c, None, extra={"zero_optimization": {"reduce_bucket_size": 30}})
    assert config["zero_optimization"] == {"stage": 1, "reduce_bucket_size": 30,
                                           "allgather_bucket_size": 20}
    assert size_buckets(config, 10**6, zero_defaults(), 2) == {}  # both set by the user
    with pytest.raises(ValueError, match=r"RankStep.ds_config sets .*come from the case"):
        ds_config(c, None, extra={"gradient_accumulation_steps": 4})


def test_deepspeed_builds_the_optimizer_and_schedule_of_its_config(
        runs: dict[str, TrainResult]) -> None:
    """``build`` returns the model alone and the config has ``optimizer`` and
    ``scheduler`` sections, as DeepSpeed's tutorials write it: DeepSpeed builds both, the
    run says so, and the learning rate each step used is the config's warm-up."""
    run = _ok(runs["from_config"])
    engine = run.details["engine"]
    assert engine["optimizer"].endswith("(from the config)"), engine["optimizer"]
    assert engine["scheduler"] == "WarmupLR (from the config)"
    assert [g["weight_decay"] for g in engine["param_groups"]] == [0.1]
    # DeepSpeed's WarmupLR: its iteration count starts at -1 (the first two steps at the
    # minimum), then linear over WARM steps
    expected = [LR * max(0, i - 1) / WARM for i in range(WARMUP + STEPS)]
    assert run.metrics["lr"] == pytest.approx(expected, abs=1e-9)
    assert all(math.isfinite(x) for x in run.losses) and run.losses[-1] < run.losses[0]


def test_an_optimizer_left_to_a_config_is_refused_where_nothing_builds_it() -> None:
    """Where no DeepSpeed config builds it (DDP, the single-process reference), a model
    without its optimizer is one line naming both fixes."""
    step = rank_step(build=model_only)
    with pytest.raises(TaskError, match=r"returns a Net, the model alone: .* give its config an "
                                        r"'optimizer' section"):
        step.built(0)
    with pytest.raises(TaskError, match=r"returns None as the optimizer: .* give its config an "
                                        r"'optimizer' section"):
        rank_step(build=lambda rank: (Net(), None)).built(0)
    assert step.built(0, config_optimizer=True).optimizer is None
    with pytest.raises(TaskError, match="the reference trains the model with plain torch"):
        c = case(zero_stage=2, reference=True)
        train_reference(c, step, RankPlan(DeepSpeedRankEngine, c, step, "cpu", None))


def test_bucket_sizes_fit_the_model(runs: dict[str, TrainResult]) -> None:
    sized, unsized_run = _ok(runs["sized"]), _ok(runs["unsized"])
    small, big = max(sized.memory_per_device.values()), max(
        unsized_run.memory_per_device.values())
    defaults = zero_defaults()
    # DeepSpeed's default reduce bucket alone is this many fp32 bytes per rank.
    assert big > 4 * defaults["reduce_bucket_size"] > 1000 * small
    n = sum(p.numel() for p in Net().parameters())
    assert small < 40 * 4 * n  # a few copies of the model, not gigabytes
    assert sized.losses == pytest.approx(unsized_run.losses, rel=1e-5)  # same training
    assert set(sized.details["engine"]["plugin_set"]) == {
        "zero_optimization.reduce_bucket_size", "zero_optimization.allgather_bucket_size"}
    assert unsized_run.details["engine"]["plugin_set"] == {}
    # ZeRO-3 sizes its own keys too; stage 0 has no ZeRO buffers to size.
    zero3 = _ok(runs["zero3"]).details["engine"]["plugin_set"]
    assert "zero_optimization.stage3_prefetch_bucket_size" in zero3
    assert size_buckets({"zero_optimization": {"stage": 0}}, n, defaults, 2) == {}
    big_model = size_buckets({"zero_optimization": {"stage": 2}}, 10**12, defaults, 2)
    assert big_model == {k: defaults[k] for k in ("reduce_bucket_size",
                                                  "allgather_bucket_size")}


def test_a_compiled_ddp_case_trains(runs: dict[str, TrainResult]) -> None:
    result = runs["ddp_compile"]
    run = _ok(result)
    engine = run.details["engine"]
    assert engine["engine"] == "ddp" and engine["compile"] is True
    assert engine["compiled_graphs"] > 0
    n = WARMUP + 1 + STEPS  # compiling adds a warm-up step
    assert engine["optimizer_steps"] == n and engine["micro_steps"] == 2 * n
    assert run.metrics["lr"] == pytest.approx([LR * schedule(i) for i in range(n)], rel=1e-6)
    assert len(run.step_times) == STEPS and run.losses[-1] < run.losses[0]
    assert result.reference_params is not None
    check = check_reference(result.params, result.reference_params, Tolerances())
    assert check.verdict is Verdict.PASS, check.detail


def only_a_model(rank: int) -> Any:
    return Net()


def test_a_factory_that_returns_the_wrong_thing_names_itself_and_the_fix() -> None:
    step = RankStep(build=only_a_model, loss_fn=loss_fn, make_batch=make_batch)
    with pytest.raises(TaskError, match=r"RankStep.build only_a_model \(tests/unit/"
                                        r"backends/torch/test_ranks.py:\d+\) returns a Net, "
                                        r"the model alone: return \(model, optimizer\)"):
        step.built(0)
    # Through the launch, as the session sees it: the rank's TaskError, not a traceback.
    with pytest.raises(TaskError, match=r"\(rank \d\): RankStep.build only_a_model .*"
                                        r"model.configure_optimizers"):
        train_ddp(case(backend="torch", label="ddp"), step, CPU, timeout=600)

    def other_params(rank: int) -> Built:
        return Built(Net(), torch.optim.SGD(Net().parameters(), lr=0.1))

    with pytest.raises(TaskError, match="not the returned model's: build the optimizer"):
        RankStep(build=other_params, loss_fn=loss_fn, make_batch=make_batch).built(0)
    vector = RankStep(build=build, loss_fn=lambda m, b: m(b["x"]) - b["y"],
                      make_batch=make_batch)
    with pytest.raises(TaskError, match=r"returns a tensor of shape \(16, 1\).*loss.mean"):
        vector.compute(Net(), make_batch(0))
    with pytest.raises(TaskError, match="must be a function of the rank"):
        RankStep(build=42, loss_fn=loss_fn, make_batch=make_batch)  # type: ignore[arg-type]


def test_case_declares_accumulation_and_zero_init() -> None:
    assert case(zero_stage=3, zero_init=True, grad_accum=4).id == "deepspeed-w2-zero3-zinit-ga4-b16"
    assert case(zero_stage=2).id == "deepspeed-w2-zero2-b16"  # ids of existing cases unchanged
    with pytest.raises(ValueError, match="grad_accum must be a whole number >= 1"):
        case(zero_stage=2, grad_accum=0)
    with pytest.raises(ValueError, match="set zero_stage=3"):
        case(zero_stage=2, zero_init=True)
