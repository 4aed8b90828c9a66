"""The torch backend trained directly (no pytester): the suite's GPT, eager, on the CPU."""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from pytest_accelperf.backends import TrainResult, get_backend  # noqa: E402
from pytest_accelperf.backends.torch.backend import BACKEND  # noqa: E402
from pytest_accelperf.backends.torch.flops import count_flops  # noqa: E402
from pytest_accelperf.collect.cases import Case  # noqa: E402
from pytest_accelperf.provision.accel import Accelerator  # noqa: E402
from pytest_accelperf.torch import TorchTask  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[4] / "suites" / "torch"))
from gpt import make_task, n_params  # noqa: E402

STEPS, WARMUP, BATCH, SEQ = 12, 1, 8, 32
CPU = Accelerator(name="cpu", platform="cpu-x1", device_kind="cpu", device_count=1)


def small(**kw: Any) -> Case:
    return Case(backend="torch", batch=BATCH, steps=STEPS, warmup=WARMUP, **kw)


@pytest.fixture(scope="module")
def first() -> TrainResult:
    case = small()
    return BACKEND.train(case, make_task(case), CPU)


@pytest.fixture(scope="module")
def second() -> TrainResult:
    case = small()
    return BACKEND.train(case, make_task(case), CPU)


def test_registered_and_loadable() -> None:
    entry = get_backend("torch")
    assert entry.unavailable_reason() is None
    assert entry.load() is BACKEND
    assert BACKEND.unavailable_reason() is None


def test_trains_and_loss_decreases(first: TrainResult) -> None:
    run = first.run
    assert run.outcome == "ok", run.message
    assert len(run.step_times) == STEPS
    assert all(t > 0 for t in run.step_times)
    assert len(run.losses) == WARMUP + STEPS == len(run.loss_steps)
    assert run.losses[-1] < run.losses[0] - 0.5
    assert run.compile_time is None  # eager
    assert run.n_devices == 1
    assert run.tokens_per_step == BATCH * SEQ


def test_flops_match_six_params_tokens(first: TrainResult) -> None:
    flops = first.run.flops_per_step
    assert flops is not None and flops > 0
    estimate = 6 * n_params(make_task(small())) * BATCH * SEQ
    assert 0.5 < flops / estimate < 2.0


def test_memory_counted_and_deterministic(first: TrainResult, second: TrainResult) -> None:
    assert first.run.memory_source == "mem_tracker"
    assert list(first.run.memory_per_device) == ["cpu:0"]
    peak = first.run.memory_per_device["cpu:0"]
    # At least params + grads + two AdamW moments (float32).
    assert peak > 4 * 4 * n_params(make_task(small()))
    assert second.run.memory_per_device == first.run.memory_per_device


def test_training_is_deterministic(first: TrainResult, second: TrainResult) -> None:
    assert first.run.losses == second.run.losses
    assert first.run.params_fingerprint == second.run.params_fingerprint
    # TorchTask's parameters by name and, beside them, its AdamW's step (issue 23).
    named = {n for n, _ in make_task(small()).make_model().named_parameters()}
    assert set(first.params) == named | {"optimizer/step"}


def test_flop_count_leaves_the_model_unchanged() -> None:
    task = make_task(small())
    torch.manual_seed(0)
    model = task.make_model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.random.get_rng_state()
    assert count_flops(model, task, task.make_batch(0)) is not None
    assert all(p.grad is None for p in model.parameters())
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert torch.equal(rng, torch.random.get_rng_state())


def linear_task(nan_at: int | None = None) -> TorchTask:
    def make_batch(step: int) -> dict[str, Any]:
        g = torch.Generator().manual_seed(step)
        x = torch.randn(BATCH, 16, generator=g)
        scale = torch.tensor(math.nan if step == nan_at else 1.0)
        return {"x": x, "y": x.sum(dim=1, keepdim=True), "scale": scale}

    def loss_fn(model: torch.nn.Module, batch: dict[str, Any]) -> Any:
        return ((model(batch["x"]) - batch["y"]) ** 2).mean() * batch["scale"]

    def make_optimizer(params: Iterable[torch.nn.Parameter]) -> torch.optim.Optimizer:
        return torch.optim.SGD(params, lr=0.05)

    return TorchTask(make_model=lambda: torch.nn.Linear(16, 1), loss_fn=loss_fn,
                     make_batch=make_batch, make_optimizer=make_optimizer, grad_clip=1.0)


def test_nan_is_an_outcome_naming_the_step() -> None:
    run = BACKEND.train(small(), linear_task(nan_at=4), CPU).run
    assert run.outcome == "nan"
    assert run.nan_step == 4
    assert run.message == "loss is nan at step 4"
    assert len(run.losses) == 5 and math.isnan(run.losses[-1])
    assert len(run.step_times) == 4 - WARMUP + 1  # the NaN step is timed, as in jax


def test_declared_capacity_is_an_oom_outcome(first: TrainResult) -> None:
    peak = first.run.memory_per_device["cpu:0"]
    case = small(memory_capacity=peak // 2)
    run = BACKEND.train(case, make_task(case), CPU).run
    assert run.outcome == "oom"
    assert run.oom == {"required_bytes": peak, "capacity_bytes": peak // 2,
                       "exceeded_by_bytes": peak - peak // 2, "source": "mem_tracker"}
    assert run.step_times == [] and run.losses == []
    assert "out of memory" in run.message


def test_reference_and_mesh_are_refused() -> None:
    with pytest.raises(ValueError, match="reference runs are implemented for the jax backend"):
        BACKEND.train(small(reference=True), linear_task(), CPU)
    with pytest.raises(ValueError, match="one device"):
        BACKEND.train(small(mesh=(2, 1)), linear_task(), CPU)


def test_unknown_accelerator_is_refused() -> None:
    tpu = Accelerator(name="tpu", platform="tpu-x1", device_kind="tpu", device_count=1)
    with pytest.raises(ValueError, match="cpu or gpu"):
        BACKEND.train(small(), linear_task(), tpu)



def test_flops_of_the_suite_gpt_match_the_analytic_count() -> None:
    """torch's FlopCounterMode has no formula for the CPU flash-attention kernel and counted
    attention as 0; the plugin's counter (``torch.task.flop_counter``) gives the analytic
    count exactly: per token and layer, 12 d^2 multiply-adds for the projections and the
    MLP and 2 T d for the two attention products; d V for the head; times 2 (a
    multiply-add is two FLOPs) and 3 (the forward, and the backward's two products each)."""
    from torch.utils.flop_counter import FlopCounterMode

    from pytest_accelperf.backends.torch.flops import count_flops

    sys.path.insert(0, str(Path(__file__).resolve().parents[4] / "suites" / "torch"))
    import gpt

    case = Case(backend="torch", batch=8, steps=1, warmup=0)
    task = gpt.make_task(case)
    torch.manual_seed(0)
    model = task.make_model()
    batch = task.make_batch(0)
    b, t, d, layers = case.batch, gpt.SEQ_LEN, gpt.D_MODEL, gpt.N_LAYERS
    vocab = model.head.out_features
    per_token = layers * (12 * d * d + 2 * t * d) + d * vocab
    analytic = 2 * 3 * b * t * per_token
    assert count_flops(model, task, batch) == analytic
    plain = FlopCounterMode(display=False)
    with plain:
        task.loss_fn(model, batch).backward()
    attention = 2 * 3 * b * t * layers * 2 * t * d
    assert plain.get_total_flops() == analytic - attention  # what torch alone counts


def test_a_long_run_probes_drift_at_most_max_probes_times() -> None:
    """Up to MAX_PROBES measured steps the drift probe runs after every one (every suite
    of this project); a longer run probes after every k-th, evenly, MAX_PROBES at most."""
    from pytest_accelperf.backends.measure.loop import MAX_PROBES, StepFns, run_steps
    from pytest_accelperf.backends.measure.probe import Probe

    probed: list[int] = []
    done: list[int] = []

    def run(i: int, batch: Any) -> Any:  # a step of a few microseconds: the loop is tested
        done.append(i)
        return torch.ones(4).sum() * batch

    fns = StepFns(prepare=float, run=run, read=lambda out: (float(out), {}))
    probe = Probe("torch-cpu-count", lambda: probed.append(done[-1]))
    short = run_steps(fns, warmup=2, steps=MAX_PROBES, probe=probe,
                      report=lambda *args: None)
    assert len(short.probe_times) == MAX_PROBES == len(short.step_times)
    assert probed == list(range(2, 2 + MAX_PROBES))  # after each measured step
    probed.clear()
    long = run_steps(fns, warmup=2, steps=2 * MAX_PROBES + 50, probe=probe,
                     report=lambda *args: None)
    assert len(long.step_times) == 2 * MAX_PROBES + 50
    assert len(long.probe_times) == (2 * MAX_PROBES + 50) // 3 <= MAX_PROBES
    assert probed == list(range(4, 2 + 2 * MAX_PROBES + 50, 3))  # every 3rd measured step
