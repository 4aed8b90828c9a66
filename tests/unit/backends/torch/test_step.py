"""The user's own training step (``TorchStep``) through the in-process torch backend.

Real training on the CPU: an optimizer built with weight-decay groups, an LR scheduler
stepped once per optimizer step, gradient accumulation over micro-batches, bf16 autocast and
a ``GradScaler``; the metrics recorded per step, the trained model handed back, the memory
method that counted, FLOPs counted without advancing anything, the A/B stepper, and the
errors a step can make, which name the user's function and the fix. The tests that go
through pytest (a clean failure, the memory method in the table, a metric checked against
the baseline) run inner sessions with pytester.
"""

from __future__ import annotations

import collections
import math
import pickle
import re
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from conftest import Suite  # noqa: E402

from pytest_accelperf.backends.measure.common import TaskError  # noqa: E402
from pytest_accelperf.backends.protocol import TrainResult  # noqa: E402
from pytest_accelperf.backends.torch.backend import BACKEND  # noqa: E402
from pytest_accelperf.backends.torch.flops import count_step_flops  # noqa: E402
from pytest_accelperf.backends.torch.step import (  # noqa: E402
    as_torch_step,
    live_stateful,
    undone,
)
from pytest_accelperf.checks import Tolerances, Verdict  # noqa: E402
from pytest_accelperf.checks.numerics import check_numerics  # noqa: E402
from pytest_accelperf.collect.cases import Case  # noqa: E402
from pytest_accelperf.provision.accel import Accelerator  # noqa: E402
from pytest_accelperf.records.fingerprint import compact  # noqa: E402
from pytest_accelperf.records.run import Run  # noqa: E402
from pytest_accelperf.torch import TorchStep, TorchTask  # noqa: E402

STEPS, WARMUP, BATCH, DIM = 8, 2, 64, 8
CPU = Accelerator(name="cpu", platform="cpu-x1", device_kind="cpu", device_count=1)


def case(**kw: Any) -> Case:
    return Case(**{"backend": "torch", "batch": BATCH, "steps": STEPS, "warmup": WARMUP, **kw})


def make_batch(step: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    x = torch.randn(BATCH, DIM, generator=g)
    return {"x": x, "y": x[:, :2].sum(dim=1, keepdim=True)}


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(DIM, 32), torch.nn.Tanh(),
                                        torch.nn.Linear(32, 1))
        self.norm = torch.nn.BatchNorm1d(DIM)  # a buffer the forward pass updates

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.body(self.norm(x))
        return out

    def configure_optimizers(self, weight_decay: float, lr: float) -> torch.optim.AdamW:
        decay = [p for p in self.parameters() if p.dim() >= 2]
        rest = [p for p in self.parameters() if p.dim() < 2]
        return torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                                  {"params": rest, "weight_decay": 0.0}], lr=lr)


class Training:
    """The objects of a training loop as PyTorch's docs write it, and its step."""

    def __init__(self, accum: int = 1, amp: torch.dtype | None = None,
                 scaler: bool = False, total: int = WARMUP + STEPS) -> None:
        torch.manual_seed(0)
        self.model = Net()
        self.optimizer = self.model.configure_optimizers(0.1, 3e-2)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda it: min(1.0, (it + 1) / 3) * (1 - it / (2 * total)))
        self.scaler = torch.amp.GradScaler("cpu", enabled=scaler)
        self.accum, self.amp = accum, amp
        self.calls = 0

    def step(self, batch: dict[str, torch.Tensor]) -> dict[str, Any]:
        self.calls += 1
        lr = self.scheduler.get_last_lr()[0]
        total = torch.zeros(())
        for x, y in zip(batch["x"].chunk(self.accum), batch["y"].chunk(self.accum),
                        strict=True):
            with torch.autocast("cpu", dtype=self.amp or torch.bfloat16,
                                enabled=self.amp is not None):
                pred = self.model(x)
            loss = ((pred.float() - y) ** 2).mean() / self.accum
            self.scaler.scale(loss).backward()
            total += loss.detach()
        self.scaler.unscale_(self.optimizer)
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), 10.0)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return {"loss": total, "lr": lr, "grad_norm": norm}

    def schedule(self) -> list[float]:
        fresh = Training(total=WARMUP + STEPS)
        out = []
        for _ in range(WARMUP + STEPS):
            out.append(fresh.scheduler.get_last_lr()[0])
            fresh.optimizer.step()
            fresh.scheduler.step()
        return out

    def torch_step(self, **kw: Any) -> TorchStep:
        return TorchStep(step=self.step, make_batch=make_batch, model=self.model, **kw)


@pytest.fixture(scope="module")
def plain() -> tuple[Training, TrainResult]:
    training = Training()
    result = BACKEND.train(case(), training.torch_step(), CPU)
    assert isinstance(result, TrainResult)
    return training, result


# -- the schedule, the metrics, the state -----------------------------------------------------
def test_scheduler_steps_once_per_plugin_step(plain: tuple[Training, TrainResult]) -> None:
    training, result = plain
    run = result.run
    assert run.outcome == "ok", run.message
    total = WARMUP + STEPS
    # FLOPs, memory and memory growth were counted by running the step 5 more times (1 for
    # FLOPs, 2 for the peak, 2 for the growth), all undone.
    assert training.calls == total + 5
    assert training.scheduler.last_epoch == total
    assert int(training.optimizer.state[training.model.body[0].weight]["step"]) == total
    assert run.metrics["lr"] == pytest.approx(training.schedule(), rel=1e-12)
    assert len(run.step_times) == STEPS and all(t > 0 for t in run.step_times)


def test_metrics_recorded_per_step(plain: tuple[Training, TrainResult]) -> None:
    run = plain[1].run
    assert sorted(run.metrics) == ["grad_norm", "lr"]
    assert all(len(v) == len(run.losses) == WARMUP + STEPS for v in run.metrics.values())
    assert all(math.isfinite(v) and v > 0 for v in run.metrics["grad_norm"])
    assert run.losses[-1] < run.losses[0] / 2


def test_state_is_the_trained_model(plain: tuple[Training, TrainResult]) -> None:
    training, result = plain
    assert result.state is training.model
    # The numerics fingerprint is of the model's state_dict: parameters and buffers; beside
    # them the AdamW's step (issue 23), not the disabled GradScaler's scale.
    assert set(result.params) == set(training.model.state_dict()) | {"optimizer/step"}
    fp = result.run.params_fingerprint
    assert "norm.running_mean" in fp and not fp["norm.running_mean"].get("state")
    assert fp["optimizer/step"]["state"] is True
    assert fp["optimizer/step"]["rms"] == WARMUP + STEPS
    assert int(training.model.norm.num_batches_tracked) == WARMUP + STEPS
    back = pickle.loads(pickle.dumps(result))
    assert back.state is None and back.run.case_id == result.run.case_id


def test_training_is_deterministic_with_or_without_counting(
        plain: tuple[Training, TrainResult]) -> None:
    """The counting runs are undone: a hand loop of the same steps ends where the plugin's
    run ends, bit for bit."""
    training, result = plain
    hand = Training()
    torch.manual_seed(0)
    losses = [float(hand.step(make_batch(i))["loss"]) for i in range(WARMUP + STEPS)]
    assert losses == result.run.losses
    for (name, a), b in zip(hand.model.state_dict().items(),
                            training.model.state_dict().values(), strict=True):
        assert torch.equal(a, b), name


def test_a_step_trained_again_starts_where_it_first_started() -> None:
    """A re-measurement (``--accelperf-confirm``) trains the same TorchStep a second time:
    it is rewound first, so the schedule, the weights and the losses start over."""
    training = Training()
    step = training.torch_step()
    first = BACKEND.train(case(), step, CPU).run
    trained = {k: v.clone() for k, v in training.model.state_dict().items()}
    second = BACKEND.train(case(), step, CPU).run
    assert second.losses == first.losses and second.metrics == first.metrics
    assert second.memory_per_device == first.memory_per_device
    assert training.scheduler.last_epoch == WARMUP + STEPS
    assert all(torch.equal(trained[k], v) for k, v in training.model.state_dict().items())


def test_a_step_whose_memory_count_fell_back_is_rewound_with_its_optimizer() -> None:
    """Gradient accumulation calls the model twice in a step: MemTracker raises before the
    optimizer first steps, and the profiler counts instead. The optimizer was then missing
    from where the step started, and a re-measurement trained it on (AdamW's step 28 where
    14 were run: suites/torch/test_schedule_accum_bf16.py failed on unchanged code, beside
    another job, whenever its throughput was re-measured)."""
    training = Training(accum=2)
    step = training.torch_step()
    first = BACKEND.train(case(), step, CPU).run
    assert first.memory_source == "profiler"
    trained = {k: v.clone() for k, v in training.model.state_dict().items()}
    second = BACKEND.train(case(), step, CPU).run
    assert second.losses == first.losses
    head = next(iter(training.model.parameters()))
    assert int(training.optimizer.state[head]["step"]) == WARMUP + STEPS
    assert all(torch.equal(trained[k], v) for k, v in training.model.state_dict().items())


def test_flop_count_advances_nothing() -> None:
    training = Training(scaler=True)
    step = training.torch_step()
    before = {k: v.clone() for k, v in training.model.state_dict().items()}
    rng = torch.random.get_rng_state()
    scale = training.scaler.state_dict()
    flops = count_step_flops(step, make_batch(0))
    assert flops is not None and flops > 0
    assert training.calls == 1
    assert training.scheduler.last_epoch == 0 and training.optimizer.state_dict()["state"] == {}
    assert training.scaler.state_dict() == scale
    assert all(p.grad is None for p in training.model.parameters())
    assert all(torch.equal(before[k], v) for k, v in training.model.state_dict().items())
    assert torch.equal(rng, torch.random.get_rng_state())


class WarmupThenLambda(torch.optim.lr_scheduler.LambdaLR):
    """A scheduler class of the user's own: :func:`live_stateful` finds its instances by
    their exact class, derived from torch's."""


def test_live_stateful_finds_every_scheduler_and_scaler() -> None:
    training = Training()
    mine = WarmupThenLambda(training.optimizer, lambda it: 1.0)
    found = live_stateful()
    assert any(obj is training.scheduler for obj in found)
    assert any(obj is training.scaler for obj in found)
    assert any(obj is mine for obj in found)
    assert not any(obj is training.optimizer or obj is training.model for obj in found)
    # Handed one scan, undone puts back what it holds: the scheduler steps, then is undone.
    with undone(training.torch_step(), found):
        training.step(make_batch(0))
    assert training.scheduler.last_epoch == 0 and mine.last_epoch == 0


def test_a_step_that_names_its_schedulers_is_trained_without_the_scan(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``TorchStep.stateful`` names what the counting steps put back: no scan of the
    process (it would fail here), the same schedule as the scan gives, and TorchTask's
    step names none (it steps its optimizer only)."""
    import pytest_accelperf.backends.torch.step as torch_step

    def no_scan() -> list[Any]:
        raise AssertionError("the process was scanned for schedulers")

    monkeypatch.setattr(torch_step, "live_stateful", no_scan)
    training = Training(scaler=True)
    result = BACKEND.train(case(), training.torch_step(
        stateful=[training.scheduler, training.scaler]), CPU)
    assert isinstance(result, TrainResult) and result.run.outcome == "ok"
    assert result.run.metrics["lr"] == pytest.approx(training.schedule())
    # The scaler it names is the one fingerprinted (issue 23).
    assert result.run.params_fingerprint["scaler/scale"]["rms"] == training.scaler.get_scale()
    task = TorchTask(make_model=Net, loss_fn=lambda m, b: ((m(b["x"]) - b["y"]) ** 2).mean(),
                     make_batch=make_batch,
                     make_optimizer=lambda p: torch.optim.SGD(p, lr=0.1))
    assert task.to_step().stateful == ()
    assert BACKEND.train(case(), task, CPU).run.outcome == "ok"


def test_the_run_says_where_its_time_went(plain: tuple[Training, TrainResult]) -> None:
    phases = plain[1].run.phases
    assert phases is not None
    assert set(phases) == {"build", "memory", "flops", "probe", "train", "fingerprint",
                           "total"}
    assert all(seconds >= 0 for seconds in phases.values())
    run = plain[1].run
    # make_batch and the move, outside the timer
    assert run.batch_time is not None and run.batch_time > 0
    assert phases["train"] >= sum(run.step_times) + run.batch_time
    assert sum(v for k, v in phases.items() if k != "total") <= phases["total"]


# -- accumulation, autocast, a scaler, and the memory method ----------------------------------
def test_accumulation_trains_and_memory_names_the_profiler(
        plain: tuple[Training, TrainResult]) -> None:
    training = Training(accum=4)
    run = BACKEND.train(case(), training.torch_step(), CPU).run
    assert run.outcome == "ok", run.message
    assert training.scheduler.last_epoch == WARMUP + STEPS
    # MemTracker raises on a module called twice in one step: the profiler counted it, and
    # the run says so (it is never passed off as MemTracker's number).
    assert run.memory_source == "profiler"
    assert plain[1].run.memory_source == "mem_tracker"
    assert run.memory_per_device["cpu:0"] > 0
    assert run.losses[-1] < run.losses[0] / 2
    assert run.losses != plain[1].run.losses  # BatchNorm saw quarter batches


def test_bf16_autocast_and_a_grad_scaler() -> None:
    training = Training(amp=torch.bfloat16, scaler=True)
    run = BACKEND.train(case(), training.torch_step(), CPU).run
    assert run.outcome == "ok", run.message
    assert run.losses[-1] < run.losses[0] / 2
    # The scaler grew its tracker once per plugin step: the counting steps were undone.
    assert training.scaler.state_dict()["_growth_tracker"] == WARMUP + STEPS
    # Found alive and moved by the training: its scale is fingerprinted (issue 23).
    scale = run.params_fingerprint["scaler/scale"]
    assert scale["state"] is True and scale["rms"] == training.scaler.get_scale()


def test_fp16_autocast_with_a_grad_scaler() -> None:
    training = Training(amp=torch.float16, scaler=True)
    run = BACKEND.train(case(), training.torch_step(), CPU).run
    assert run.outcome == "ok", run.message
    assert run.losses[-1] < run.losses[0] / 2
    assert training.scaler.get_scale() > 0


def test_batchnorm_running_statistics_are_fingerprinted_beside_the_parameters() -> None:
    """Issue 23: ``TorchTask`` fingerprinted ``named_parameters()`` alone, so a changed
    BatchNorm momentum, which moves only the running statistics (training normalizes with
    each batch's own), passed the numerics check. Its buffers and its optimizer's step are
    now fingerprinted beside the parameters, and the check names the buffer."""
    def task(momentum: float) -> TorchTask:
        def make_model() -> Net:
            net = Net()
            net.norm.momentum = momentum
            return net
        return TorchTask(make_model=make_model,
                         loss_fn=lambda m, b: ((m(b["x"]) - b["y"]) ** 2).mean(),
                         make_batch=make_batch,
                         make_optimizer=lambda p: torch.optim.Adam(p, lr=1e-2))

    base = BACKEND.train(case(), task(0.1), CPU).run
    changed = BACKEND.train(case(), task(0.01), CPU).run
    assert base.outcome == changed.outcome == "ok", (base.message, changed.message)
    fp = base.params_fingerprint
    assert {k for k, v in fp.items() if v.get("state")} == {
        "norm.running_mean", "norm.running_var", "norm.num_batches_tracked", "optimizer/step"}
    assert fp["optimizer/step"]["rms"] == fp["norm.num_batches_tracked"]["rms"] == WARMUP + STEPS
    check = check_numerics({"numerics": changed.params_fingerprint},
                           {"numerics": compact(fp)}, Tolerances())
    assert check is not None and check.verdict is Verdict.REGRESSION, check.detail
    assert check.detail.startswith("norm.running_"), check.detail
    assert set(check.data["failing"]) == {"norm.running_mean", "norm.running_var"}


def test_an_optimizer_outside_the_model_is_undone_too() -> None:
    """A parameter the model does not own (a learned temperature), with its own optimizer
    and scheduler: found by the optimizer-step hook, undone after counting."""
    torch.manual_seed(0)
    model = torch.nn.Linear(DIM, 1)
    temperature = torch.nn.Parameter(torch.ones(()))
    opt = torch.optim.SGD([*model.parameters(), temperature], lr=0.05)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.9)

    def train_step(batch: dict[str, torch.Tensor]) -> torch.Tensor:
        opt.zero_grad()
        loss = ((model(batch["x"]) * temperature - batch["y"]) ** 2).mean()
        loss.backward()
        opt.step()
        sched.step()
        return loss

    run = BACKEND.train(case(), TorchStep(train_step, make_batch, model), CPU).run
    assert run.outcome == "ok", run.message
    assert sched.last_epoch == WARMUP + STEPS
    assert run.metrics == {}  # a bare loss tensor: the loss only
    assert float(temperature.detach()) != 1.0


# -- numpy batches, as DataLoader gives them ---------------------------------------------------
Point = collections.namedtuple("Point", ["x", "y"])


def test_a_batch_of_numpy_arrays_trains_as_the_same_batch_of_tensors(
        plain: tuple[Training, TrainResult]) -> None:
    """Seen: a make_batch of numpy arrays crashed inside the step (DataLoader gives such a
    user tensors). They are made tensors as DataLoader makes them, and train exactly as
    the same batch given as tensors."""

    def numpy_batch(step: int) -> dict[str, Any]:
        return {k: v.numpy() for k, v in make_batch(step).items()}

    _, tensors = plain
    training = Training()
    result = BACKEND.train(case(), TorchStep(training.step, numpy_batch, training.model), CPU)
    assert result.run.outcome == "ok", result.run.message
    assert result.run.losses == tensors.run.losses
    assert result.run.params_fingerprint == tensors.run.params_fingerprint
    assert result.run.flops_per_step == tensors.run.flops_per_step > 0


def test_numpy_leaves_become_tensors_and_containers_keep_their_types() -> None:
    """What DataLoader's default_convert does to each leaf (a numpy array or numpy scalar
    becomes a tensor of its dtype, sharing memory; a Python number or string stays), with
    every container kept: a tuple stays a tuple (default_convert alone makes it a list),
    a namedtuple its type. A read-only array is copied (no warning: the suite turns
    warnings into errors)."""
    from pytest_accelperf.backends.torch.task import as_tensors, to_device

    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    frozen = np.ones(3, np.int64)
    frozen.flags.writeable = False
    batch = {"pair": (x, np.float32(2.0)), "point": Point(x=frozen, y=3), "names": ["a", "b"],
             "scale": 0.5, "nested": {"ids": [np.array([1, 2], np.int32)]}}
    for out in (as_tensors(batch), to_device(batch, torch.device("cpu"))):
        pair, point = out["pair"], out["point"]
        assert type(pair) is tuple and isinstance(point, Point)
        assert isinstance(pair[0], torch.Tensor) and pair[0].dtype == torch.float32
        assert torch.equal(pair[0], torch.from_numpy(x))
        assert pair[0].data_ptr() == x.ctypes.data  # shared, as DataLoader shares it
        assert isinstance(pair[1], torch.Tensor) and pair[1].dim() == 0
        assert point.x.dtype == torch.int64 and point.y == 3 and type(point.y) is int
        assert point.x.data_ptr() != frozen.ctypes.data  # the read-only array was copied
        assert out["names"] == ["a", "b"] and out["scale"] == 0.5
        assert out["nested"]["ids"][0].dtype == torch.int32


def test_ranks_split_numpy_arrays_as_they_split_tensors() -> None:
    """DDP and DeepSpeed ranks take their rows of the global batch: a numpy array was
    given whole to every rank (only tensors were split). Now it is made a tensor first."""
    from pytest_accelperf.backends.torch.in_rank import micro_batches

    c = Case(backend="torch", batch=8, world_size=2, grad_accum=2, steps=1, warmup=0)
    rows = np.arange(8, dtype=np.float32)
    batch = {"x": rows, "pair": Point(x=rows * 2, y=np.float32(1))}
    parts = [micro_batches(batch, r, c) for r in range(2)]
    assert [m["x"].tolist() for m in parts[1]] == [[4.0, 5.0], [6.0, 7.0]]
    assert [m["pair"].x.tolist() for m in parts[0]] == [[0.0, 2.0], [4.0, 6.0]]
    assert all(isinstance(m["pair"], Point) and float(m["pair"].y) == 1.0
               for p in parts for m in p)


# -- TorchTask on TorchStep -------------------------------------------------------------------
def task() -> TorchTask:
    return TorchTask(make_model=lambda: torch.nn.Linear(DIM, 1),
                     loss_fn=lambda m, b: ((m(b["x"]) - b["y"]) ** 2).mean(),
                     make_batch=make_batch,
                     make_optimizer=lambda p: torch.optim.SGD(p, lr=0.05), grad_clip=1.0)


def test_torch_task_trains_through_its_step() -> None:
    step = as_torch_step(task())
    assert isinstance(step, TorchStep) and isinstance(step.model, torch.nn.Linear)
    assert step.label.startswith("TorchTask.loss_fn <lambda> "
                                 "(tests/unit/backends/torch/test_step.py:")
    result = BACKEND.train(case(), task(), CPU)
    assert result.run.outcome == "ok"
    assert result.run.losses[-1] < result.run.losses[0]
    assert result.run.metrics == {}
    assert isinstance(result, TrainResult) and isinstance(result.state, torch.nn.Linear)
    assert set(result.params) == {"weight", "bias"}


def test_the_ab_stepper_trains_a_step() -> None:
    training = Training()
    stepper = BACKEND.stepper(case(), training.torch_step(), CPU)
    times = stepper.run(3)
    assert len(times) == 3 and all(t > 0 for t in times)
    assert training.scheduler.last_epoch == 3


# -- outcomes ---------------------------------------------------------------------------------
def test_nan_and_timeout_with_a_step() -> None:
    training = Training()

    def nan_at_4(batch: dict[str, torch.Tensor]) -> dict[str, Any]:
        out = training.step(batch)
        if training.scheduler.last_epoch == 5:  # the fifth optimizer step (step 4)
            out["loss"] = out["loss"] * math.nan
        return out

    run = BACKEND.train(case(), TorchStep(nan_at_4, make_batch, training.model), CPU).run
    assert run.outcome == "nan" and run.nan_step == 4
    assert len(run.metrics["lr"]) == len(run.losses) == 5

    slow = Training()
    result = BACKEND.train(case(steps=10_000), slow.torch_step(), CPU, timeout=0.5)
    assert result.run.outcome == "timeout"
    assert "timeout after" in result.run.message
    assert isinstance(result, TrainResult) and result.state is slow.model


# -- errors name the step and the fix ---------------------------------------------------------
def _raises(step: Callable[[Any], Any], model: Any = None) -> str:
    training = Training()
    with pytest.raises(TaskError) as info:
        BACKEND.train(case(), TorchStep(step, make_batch, model or training.model), CPU)
    return str(info.value)


def test_step_errors_name_the_function_and_the_fix() -> None:
    training = Training()

    def no_loss(batch: Any) -> Any:
        training.step(batch)
        return {"accuracy": 1.0}

    def vector_metric(batch: Any) -> Any:
        return {**training.step(batch), "per_row": batch["x"][:, 0]}

    def returns_a_tuple(batch: Any) -> Any:
        out = training.step(batch)
        return out["loss"], out["lr"]

    def reserved(batch: Any) -> Any:
        return {**training.step(batch), "memory": 1.0}

    where = r"\(tests/unit/backends/torch/test_step\.py:\d+\)"
    text = _raises(no_loss)
    assert re.search(rf"the step no_loss {where} returns no metric 'loss' \(metrics: "
                     rf"'accuracy'\): return the loss under 'loss', or name its key with "
                     rf"TorchStep\(\.\.\., loss='<key>'\)", text), text
    text = _raises(vector_metric)
    assert re.search(rf"vector_metric {where} returns metric 'per_row' as a tensor of shape "
                     rf"\({BATCH},\)", text) and "reduce it" in text, text
    assert "return the loss tensor, or a dict" in _raises(returns_a_tuple)
    assert "rename it (e.g. 'train_memory')" in _raises(reserved)
    with pytest.raises(TaskError, match=r"TorchStep\.model of the step .* must be the nn\.Module"):
        TorchStep(training.step, make_batch, model="net")


def test_a_model_that_is_not_a_module_names_the_field_and_what_was_given() -> None:
    """One line naming the field (the key or index among several) and what was given,
    with the fix where the mistake is a common one (the class or the factory for the
    model)."""
    training = Training()

    def make_model() -> torch.nn.Module:
        return Net()

    head = r"must be the nn\.Module the step trains, or a list or dict of them; got "
    given = {
        "net": rf"^TorchStep\.model of the step Training\.step "
               rf"\(tests/unit/backends/torch/test_step\.py:"
               rf"\d+\) {head}str 'net'$",
        Net: rf"TorchStep\.model of .*{head}the class Net, not a model: pass an instance, "
             rf"Net\(\.\.\.\)$",
        make_model: rf"TorchStep\.model of .*{head}the function make_model "
                    rf"\(tests/unit/backends/torch/test_step\.py:\d+\): pass the model it makes "
                    rf"\(make_model\(\)\)$",
        (training.model, training.optimizer): rf"TorchStep\.model\[1\] of .*{head}a AdamW "
                                              rf"object$",
    }
    for model, pattern in given.items():
        with pytest.raises(TaskError) as info:
            TorchStep(training.step, make_batch, model=model)
        assert re.search(pattern, str(info.value)), str(info.value)
        assert "\n" not in str(info.value)
    with pytest.raises(TaskError, match=rf"TorchStep\.model\['dec'\] of .*{head}None$"):
        TorchStep(training.step, make_batch, model={"enc": training.model, "dec": None})
    with pytest.raises(TaskError, match=rf"{head}an empty list$"):
        TorchStep(training.step, make_batch, model=[])
    # A TorchTask whose make_model returns something else: named, not an AttributeError.
    bad = TorchTask(make_model=lambda: (Net(), None), loss_fn=lambda m, b: m(b["x"]).mean(),
                    make_batch=make_batch, make_optimizer=lambda p: torch.optim.SGD(p, lr=0.1))
    with pytest.raises(TaskError, match=r"TorchTask\.make_model <lambda> "
                                        r"\(tests/unit/backends/torch/test_"
                                        r"step\.py:\d+\) must return the nn\.Module to train; "
                                        r"it returns a tuple object$"):
        BACKEND.train(case(), bad, CPU)
    with pytest.raises(TaskError, match=r"TorchStep\.step must be the training step"):
        TorchStep(None, make_batch, training.model)  # type: ignore[arg-type]
    with pytest.raises(TaskError, match="trains a TorchStep"):
        BACKEND.train(case(), object(), CPU)


def test_a_result_without_state_pickles() -> None:
    result = TrainResult(run=Run(case_id="c"), state=torch.nn.Linear(2, 2))
    assert pickle.loads(pickle.dumps(result)).state is None


# -- through pytest ---------------------------------------------------------------------------
TORCH_SUITE = '''
import torch
from pytest_accelperf import Case, cases
from pytest_accelperf.torch import TorchStep

LR_SCALE = {scale}


def make_batch(step):
    g = torch.Generator().manual_seed(step)
    x = torch.randn(16, 8, generator=g)
    return {{"x": x, "y": x.sum(dim=1, keepdim=True)}}


@cases(Case(backend="torch", batch=16, steps=6, warmup=1, accels=("cpu",)),
       Case(backend="torch", batch=16, steps=6, warmup=1, grad_accum=2, accels=("cpu",)))
def test_step(accelperf):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2 * LR_SCALE)
    sched = torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.5, total_iters=4)
    k = accelperf.case.grad_accum

    def train_step(batch):
        for x, y in zip(batch["x"].chunk(k), batch["y"].chunk(k)):
            loss = ((model(x) - y) ** 2).mean() / k
            loss.backward()
        opt.step()
        sched.step()
        opt.zero_grad()
        return {{"loss": loss * k, "lr": sched.get_last_lr()[0]}}

    result = accelperf.train(TorchStep(train_step, make_batch, model))
    assert result.state is model
    assert sched.last_epoch == 7


@cases(Case(backend="torch", batch=16, steps=2, warmup=0, accels=("cpu",)))
def test_no_loss(accelperf):
    model = torch.nn.Linear(8, 1)
    accelperf.train(TorchStep(lambda batch: {{"acc": 1.0}}, make_batch, model))
'''


@pytest.mark.slow
def test_through_pytest_memory_method_metrics_and_errors(suite: Suite) -> None:
    suite.write(TORCH_SUITE.format(scale=1.0), name="test_torch_suite")
    # One session records test_step's two cases and runs test_no_loss beside them (it was
    # a session of its own: each costs a pytest start and its cases' trainings).
    result = suite.run("--accel=cpu", "--accelperf-update")
    result.assert_outcomes(passed=2, failed=1)
    text = result.stdout.str()
    # A step without a loss fails cleanly: the user's function and the fix, no traceback.
    result.stdout.fnmatch_lines(["*returns no metric 'loss' (metrics: 'acc'): return the loss "
                                 "under 'loss'*"])
    assert "Traceback" not in text
    # The memory row names the method that counted it.
    assert re.search(r"test_step\[torch-nomesh-b16\].*\n(.*\n)*?\s+memory \(mem_tracker\)",
                     text), text
    assert re.search(r"memory \(profiler\)", text), text
    stored = suite.load("test_torch_suite")["cases"]
    assert len(stored) == 2  # test_step's two cases; the failed test_no_loss stores nothing
    assert {b["memory"]["source"] for b in stored.values()} == {"mem_tracker", "profiler"}
    assert all("lr" in b["metrics"] for b in stored.values())

    # The same suite passes against its baselines; a changed learning rate fails its metric.
    assert suite.run("--accel=cpu", "-k", "test_step").ret == 0
    suite.write(TORCH_SUITE.format(scale=2.0), name="test_torch_suite")
    result = suite.run("--accel=cpu", "-k", "test_step", "--accelperf-json=report.json")
    result.assert_outcomes(failed=2)
    checks = {c["metric"]: c for c in suite.report()["cases"][0]["checks"]}
    assert checks["lr"]["verdict"] == "regression"
    assert "the training step changed" in checks["lr"]["detail"]
