"""A re-measurement (a throughput confirmation, a noisy recording measured again) re-times
the steps and nothing else.

Seen on outside code: Flax's MNIST example recorded a compile time of 18 ms, its
re-measurement's lookup in JAX's in-memory cache, against a true 2.9 s (and the next run's
compile check said +15,492 %); nanoGPT's train loop keeps ``iter_num`` in its own
closure for the learning-rate schedule, so a second training in the process runs on a
later stretch of the schedule and its losses are not the first's.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from conftest import Suite

# A torch step written as nanoGPT's train.py writes its loop: the learning rate comes from
# an iteration counter in the closure, which no undo can reach. The schedule decays fast,
# so a training that starts 20 steps later ends with a visibly different loss.
COUNTER_SUITE = '''
import torch

from pytest_accelperf import cases
from pytest_accelperf.torch import TorchStep


@cases(backend="torch", batch=[64], steps=20, warmup=1, accels=("cpu",))
def test_counter(accelperf):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    iter_num = 0

    def train_step(batch):
        nonlocal iter_num
        lr = 0.05 * 0.8 ** iter_num
        for group in optimizer.param_groups:
            group["lr"] = lr
        x, y = batch
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        iter_num += 1
        return {"loss": loss.detach(), "lr": lr}

    def make_batch(step):
        g = torch.Generator().manual_seed(step)
        x = torch.randn(64, 256, generator=g)
        return x, x[:, :1] * 2.0

    accelperf.train(TorchStep(train_step, make_batch, model))
'''


def faster(block: dict[str, Any]) -> None:
    """A baseline 1000x faster than anything this machine does: every run regresses, and
    the confirmation re-measures it."""
    block["step_time"]["samples"] = [t / 1000 for t in block["step_time"]["samples"]]


#: The baseline claims 1000x the throughput; the suite's tolerance (1000) is for tests
#: that are not about throughput.
TOLERANCE = "--accelperf-throughput-tolerance=3"
#: The confirmed regression is not explained: no 3 more steps under the framework's
#: profiler (jax.profiler, torch.profiler) for a trace these tests do not read.
NO_EXPLAIN = "--accelperf-explain=off"


def _checks(suite: Suite) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    case = suite.report()["cases"][0]
    return case, {c["metric"]: c for c in case["checks"]}


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_a_confirmation_keeps_the_first_trainings_losses(suite: Suite) -> None:
    pytest.importorskip("torch")
    suite.write(COUNTER_SUITE)
    suite.run("--accelperf-update").assert_outcomes(passed=1)
    suite.edit(faster)
    suite.run("--accelperf-json=report.json", "--accelperf-confirm=1", TOLERANCE, NO_EXPLAIN,
              "--accelperf-max-probe-spread=1000", "--accelperf-max-step-spread=1000")
    _, checks = _checks(suite)
    assert checks["throughput"]["verdict"] == "regression"
    assert "confirmed by 1 re-measurement" in checks["throughput"]["detail"]
    # The re-measured training ran on a later stretch of the schedule (its lr started at
    # 0.05 * 0.8**24): judged on it, the loss and the lr curve would both have moved.
    assert checks["loss"]["verdict"] == "pass", checks["loss"]["detail"]
    assert checks["lr"]["verdict"] == "pass", checks["lr"]["detail"]


# An NNX step jitted once at module level, as Flax's MNIST example writes it (``@nnx.jit``):
# a second training in the process finds its compiled program in JAX's in-memory cache.
JIT_SUITE = '''
import numpy as np
import optax
from flax import nnx

from pytest_accelperf import cases
from pytest_accelperf.jax import nnx_step


class MLP(nnx.Module):
    def __init__(self, rngs):
        self.l1 = nnx.Linear(256, 512, rngs=rngs)
        self.l2 = nnx.Linear(512, 8, rngs=rngs)

    def __call__(self, x):
        return self.l2(nnx.tanh(self.l1(x)))


@nnx.jit
def train_step(model, optimizer, batch):
    def loss_fn(model):
        return ((model(batch["x"]) - batch["y"]) ** 2).mean()
    loss, grads = nnx.value_and_grad(loss_fn)(model)
    optimizer.update(model, grads)
    return loss


def make_batch(step):
    rng = np.random.default_rng(step)
    x = rng.normal(size=(128, 256)).astype(np.float32)
    return {"x": x, "y": x[:, :8]}


@cases(backend="jax", batch=[128], steps=20, warmup=2)
def test_jit(accelperf):
    model = MLP(nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.sgd(0.01), wrt=nnx.Param)
    accelperf.train(nnx_step(train_step, (model, optimizer), make_batch))
'''


@pytest.mark.slow
@pytest.mark.timing
def test_a_confirmation_keeps_the_first_compile_time(suite: Suite) -> None:
    pytest.importorskip("flax")
    suite.write(JIT_SUITE)
    suite.run("--accelperf-update").assert_outcomes(passed=1)
    recorded = suite.load()["cases"]
    (block,) = recorded.values()
    suite.edit(faster)
    suite.run("--accelperf-json=report.json", "--accelperf-confirm=1", TOLERANCE, NO_EXPLAIN,
              "--accelperf-max-probe-spread=1000", "--accelperf-max-step-spread=1000")
    case, checks = _checks(suite)
    assert "confirmed by 1 re-measurement" in checks["throughput"]["detail"]
    # A fresh process compiles again: the first training's compile is a real one, of the
    # order of the recorded one; the re-measurement's would be a cache lookup (~1 %).
    assert case["run"]["compile_time"] > 0.2 * block["compile_time"], (
        case["run"]["compile_time"], block["compile_time"])


# -- what a re-measurement contributes, on runs built by hand --------------------------------
def _trained(times: list[float], *, foreign: float | None = None, seconds: float = 1.0,
             loss: float = 1.0) -> Any:
    from pytest_accelperf.backends.protocol import TrainResult
    from pytest_accelperf.records.run import Run
    from pytest_accelperf.stats.contention import Load

    load = None if foreign is None else Load(
        foreign_cores=foreign, steal_cores=0.0, cores=2, seconds=seconds,
        foreign_ticks=int(foreign * seconds * 100))
    return TrainResult(run=Run(case_id="c", samples_per_step=8, n_devices=1, step_times=times,
                               probe_times=[0.001] * len(times), probe_kind="numpy",
                               losses=[loss], warmup_step_times=[0.5], step_load=load))


def test_a_re_measurement_brings_the_load_it_was_measured_under() -> None:
    """A recording measured beside another job and re-measured on a quiet machine was
    still judged by the first measurement's load (the re-measurement kept the first's
    ``step_load``): stored noisy though the stored step times were quiet, and so again at
    every re-recording under the same luck."""
    from pytest_accelperf.checks.throughput import recording_noise
    from pytest_accelperf.gate.runner import retimed
    from pytest_accelperf.records.verdict import Tolerances

    first = _trained([0.010] * 20, foreign=1.0, loss=2.0)
    again = retimed(first, _trained([0.011] * 20, foreign=0.0, loss=9.0))
    assert again.run.step_load is not None and again.run.step_load.foreign_cores == 0.0
    assert again.run.step_times == [0.011] * 20 and again.run.losses == [2.0]
    assert recording_noise(first.run, Tolerances(), 0.25)
    assert recording_noise(again.run, Tolerances(), 0.25) == ""


def test_a_longer_re_measurement_pools_its_trainings() -> None:
    """A noisy recording is re-measured over two trainings (runner.RECORDING_WINDOWS): one
    measurement of all their steps, under the load of all their seconds."""
    from pytest_accelperf.gate.runner import RECORDING_WINDOWS, retimed

    assert RECORDING_WINDOWS == 2
    first = _trained([0.010] * 20, foreign=0.0, loss=2.0)
    pooled = retimed(first, _trained([0.011] * 20, foreign=0.9, seconds=1.0),
                     _trained([0.012] * 20, foreign=0.1, seconds=3.0))
    run = pooled.run
    assert run.step_times == [0.011] * 20 + [0.012] * 20
    assert len(run.probe_times) == 40 and run.losses == [2.0]
    load = run.step_load
    assert load is not None
    assert load.seconds == 4.0 and load.foreign_cores == pytest.approx(0.3)
    assert load.foreign_ticks == 90 + 30
    # a training that did not finish is what it is
    failed = _trained([0.011] * 3)
    failed.run = replace(failed.run, outcome="timeout")
    assert retimed(first, _trained([0.011] * 20), failed).run.outcome == "timeout"
