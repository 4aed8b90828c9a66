"""The lightning backend trained directly: a LightningModule of the kind Lightning's docs
write (the autoencoder of its README, on synthetic data), trained by a real
``lightning.Trainer`` through the plugin's callback, on the CPU."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
L = pytest.importorskip("lightning")

from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from pytest_accelperf import AccelperfWarning  # noqa: E402
from pytest_accelperf.backends import get_backend  # noqa: E402
from pytest_accelperf.backends.lightning.backend import (  # noqa: E402
    BACKEND,
    TrainResult,
)
from pytest_accelperf.backends.measure.common import TaskError  # noqa: E402
from pytest_accelperf.checks.program import check_program  # noqa: E402
from pytest_accelperf.collect.cases import Case  # noqa: E402
from pytest_accelperf.lightning import LightningTask  # noqa: E402
from pytest_accelperf.provision.accel import Accelerator  # noqa: E402
from pytest_accelperf.records.verdict import Tolerances, Verdict  # noqa: E402

STEPS, WARMUP, BATCH = 6, 1, 16
CPU = Accelerator(name="cpu", platform="cpu-x1", device_kind="cpu", device_count=1)


class LitAutoEncoder(L.LightningModule):
    """Lightning's README autoencoder (28 * 28 inputs made 64), with a step-wise
    scheduler; ``planted`` adds one of the regressions users hit."""

    def __init__(self, planted: str = "") -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 8))
        self.decoder = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 64))
        self.planted = planted
        self.returned: list[torch.Tensor] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        (x,) = batch
        x_hat = self.decoder(self.encoder(x))
        loss = nn.functional.mse_loss(x_hat, x)
        if self.planted == "item":
            self.printed = loss.item()  # a debug line: a host sync every step
        if self.planted == "log":
            self.log("train_loss", loss, on_step=True, sync_dist=True)
        self.returned.append(loss.detach().clone())
        return loss

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.Adam(self.parameters(), lr=1e-3)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
        return {"optimizer": optimizer,
                "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


class Manual(LitAutoEncoder):
    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False


def loader(case: Case, batches: int = 32, per_device: int | None = None) -> DataLoader[Any]:
    gen = torch.Generator().manual_seed(0)
    size = per_device or case.batch
    return DataLoader(TensorDataset(torch.randn(batches * size, 64, generator=gen)),
                      batch_size=size)


class Images(L.LightningDataModule):
    """A LightningDataModule of synthetic data, as Lightning's docs write one."""

    def __init__(self, batch_size: int) -> None:
        super().__init__()
        self.batch_size = batch_size

    def setup(self, stage: str) -> None:
        gen = torch.Generator().manual_seed(0)
        self.train = TensorDataset(torch.randn(5 * self.batch_size, 64, generator=gen))

    def train_dataloader(self) -> DataLoader[Any]:
        return DataLoader(self.train, batch_size=self.batch_size)


def case(**kw: Any) -> Case:
    return Case(backend="lightning", batch=BATCH, steps=STEPS, warmup=WARMUP, **kw)


def train(task: LightningTask, the_case: Case | None = None) -> TrainResult:
    result = BACKEND.train(the_case or case(), task, CPU)
    assert isinstance(result, TrainResult)
    return result


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Every training of this module runs here: nothing may be left behind. On one torch
    thread: on this 2-core machine beside other jobs (load 4), two threads made each of
    the autoencoder's 4 ms steps 145 ms (waking the other thread after Lightning's Python
    between ops), and this module 27 s instead of 8."""
    path = tmp_path_factory.mktemp("lightning-cwd")
    before, threads = Path.cwd(), torch.get_num_threads()
    os.chdir(path)
    torch.set_num_threads(1)
    try:
        yield path
    finally:
        os.chdir(before)
        torch.set_num_threads(threads)


def task(planted: str = "", **trainer: Any) -> LightningTask:
    return LightningTask(module=lambda c: LitAutoEncoder(planted), data=loader,
                         trainer=trainer)


@pytest.fixture(scope="module")
def plain(workdir: Path) -> TrainResult:
    return train(task())


@pytest.fixture(scope="module")
def again(workdir: Path) -> TrainResult:
    return train(task())


def test_registered_and_named_like_its_library() -> None:
    spec = get_backend("lightning")
    assert spec.requires == ("torch", "lightning")
    assert spec.load() is BACKEND and BACKEND.unavailable_reason() is None
    assert "lightning" in (spec.packages or ())


def test_steps_times_losses_and_learning_rate(plain: TrainResult) -> None:
    run = plain.run
    assert run.outcome == "ok", run.message
    assert len(run.step_times) == STEPS and all(t > 0 for t in run.step_times)
    assert len(run.losses) == WARMUP + STEPS == len(run.loss_steps)
    # The loss the trainer computed is what training_step returned, step by step.
    assert run.losses == pytest.approx([float(t) for t in plain.state.returned], rel=1e-6)
    # The rate each step used, as the step-wise scheduler set it.
    assert run.metrics["lr"] == pytest.approx([1e-3, 1e-3, 5e-4, 5e-4, 2.5e-4, 2.5e-4,
                                               1.25e-4])
    # The fetch of each measured step's batch, timed apart.
    assert len(run.inputs.wall_times) == STEPS == len(run.inputs.times)
    assert len(run.probe_times) == STEPS and run.probe_kind.startswith("torch-cpu")


def test_memory_flops_and_program_as_the_torch_backend_counts(
        plain: TrainResult) -> None:
    run = plain.run
    assert run.memory_source == "mem_tracker"
    params = sum(p.numel() for p in LitAutoEncoder().parameters())
    assert run.memory_per_device["cpu:0"] > 4 * 4 * params  # params, grads, Adam's two
    # The module keeps each step's loss (a float32 tensor): the leak check sees 4 bytes a step.
    assert run.memory_growth is not None and run.memory_growth["bytes_per_step"] == 4
    # forward and backward of the four matrices (4,608 weights): 3 products each, less the
    # gradient of the input, which nothing needs
    assert run.flops_per_step == 3 * 2 * BATCH * 4608 - 2 * BATCH * 64 * 32
    program = run.program
    assert program is not None and program["source"] == "torch"
    assert program["host_syncs"] == 0  # the gate's own read of the loss is not counted
    assert program["ops"]["addmm[f32]"] == 4


def test_numerics_fingerprint_stable_and_covers_the_trainer_state(
        plain: TrainResult, again: TrainResult) -> None:
    first = plain.run.params_fingerprint
    assert first == again.run.params_fingerprint
    state = {k for k, leaf in first.items() if leaf.get("state")}
    assert state == {"optimizer/step", "scheduler/last_epoch", "trainer/global_step"}
    assert first["trainer/global_step"]["sample"] == [WARMUP + STEPS]


def test_a_debug_item_is_caught_without_a_clock(plain: TrainResult,
                                                workdir: Path) -> None:
    planted = train(task("item")).run
    result = check_program(_block(planted.program), _block(plain.run.program),
                           Tolerances(), comparable=True)
    assert result is not None and result.verdict is Verdict.REGRESSION, result
    assert "host syncs: 0 → 1" in result.detail
    (site,) = planted.program["host_sync_sites"]  # type: ignore[index]
    assert "in LitAutoEncoder.training_step: self.printed = loss.item()" in site


def test_precision_off_shows_in_the_program_dtypes(plain: TrainResult,
                                                   workdir: Path) -> None:
    mixed = train(task(precision="bf16-mixed")).run
    assert mixed.outcome == "ok", mixed.message
    assert "addmm[bf16]" in mixed.program["ops"]  # type: ignore[index]
    result = check_program(_block(plain.run.program), _block(mixed.program),
                           Tolerances(), comparable=True)
    assert result is not None and result.verdict is Verdict.REGRESSION, result
    assert "bf16" in result.detail and "f32" in result.detail


def test_accumulation_stamps_optimizer_steps(workdir: Path) -> None:
    def half(c: Case) -> DataLoader[Any]:
        return loader(c, per_device=c.batch // 2)

    result = train(LightningTask(module=lambda c: LitAutoEncoder(), data=half,
                                 trainer={"accumulate_grad_batches": 2}))
    run = result.run
    assert run.outcome == "ok", run.message
    assert len(run.step_times) == STEPS and len(run.losses) == WARMUP + STEPS
    micro = [float(t) for t in result.state.returned]
    assert len(micro) == 2 * (WARMUP + STEPS)
    assert run.losses == pytest.approx([(a + b) / 2 for a, b in zip(micro[::2], micro[1::2],
                                                                     strict=True)], rel=1e-6)
    assert run.params_fingerprint["trainer/global_step"]["sample"] == [WARMUP + STEPS]


def test_the_cases_grad_accum_drives_the_trainers_accumulation(workdir: Path) -> None:
    def half(c: Case) -> DataLoader[Any]:
        return loader(c, per_device=c.batch // c.grad_accum)

    with pytest.warns(AccelperfWarning) as said:
        result = train(LightningTask(module=lambda c: LitAutoEncoder(), data=half,
                                     trainer={"accumulate_grad_batches": 4}),
                       case(grad_accum=2))
    assert [str(w.message) for w in said] == [
        "LightningTask.trainer['accumulate_grad_batches']=4: the gate uses 2 (the case's "
        "grad_accum)"]
    assert result.run.case_id == "lightning-nomesh-ga2-b16"
    assert len(result.state.returned) == 2 * (WARMUP + STEPS)


def test_what_the_gate_owns_is_set_and_said(workdir: Path) -> None:
    with pytest.warns(AccelperfWarning) as said:
        result = train(task(max_steps=100, logger=True, enable_progress_bar=True))
    lines = [str(w.message) for w in said]
    assert lines == result.notes == result.run.details["notes"]
    assert {Path(w.filename).name for w in said} == {"test_backend.py"}  # the user's line
    assert lines == [
        "LightningTask.trainer['logger']=True: the gate uses False (no log folder is left "
        "in the project)",
        "LightningTask.trainer['enable_progress_bar']=True: the gate uses False (the gate's "
        "own progress line reports each step)",
        f"LightningTask.trainer['max_steps']=100: the gate uses {WARMUP + STEPS} (the case's "
        f"warm-up + steps)"]


def test_a_short_dataset_runs_more_epochs_and_says_so(workdir: Path) -> None:
    short = LightningTask(module=lambda c: LitAutoEncoder(),
                          data=lambda c: loader(c, batches=3))
    with pytest.warns(AccelperfWarning, match="holds 3 batch") as said:
        run = train(short).run
    assert run.outcome == "ok" and len(run.step_times) == STEPS
    assert str(said[0].message) == (
        "LightningTask.data holds 3 batch(es) an epoch, the case 7 (warm-up + steps x "
        "accumulate_grad_batches): Lightning began a new epoch after each 3 (the loader "
        "iterated again, its end-of-epoch work inside the step that followed)")


def test_a_datamodule_trains_as_a_loader_does(plain: TrainResult,
                                               workdir: Path) -> None:
    with pytest.warns(AccelperfWarning, match="holds 5 batch"):
        result = train(LightningTask(module=lambda c: LitAutoEncoder(),
                                     data=lambda c: Images(c.batch)))
    run = result.run
    assert run.outcome == "ok" and len(run.step_times) == STEPS
    assert run.program == plain.run.program  # the same step on other data
    with pytest.raises(TaskError, match="the global batch is 8 "):
        train(LightningTask(module=lambda c: LitAutoEncoder(), data=Images(8)))


def test_fits_against_the_declared_capacity(plain: TrainResult,
                                            workdir: Path) -> None:
    peak = plain.run.memory_per_device["cpu:0"]
    for capacity, fits in ((2 * peak, True), (peak // 2, False)):
        fit = BACKEND.fits(case(memory_capacity=capacity), task(), CPU)
        assert (fit.fits, fit.required_bytes, fit.capacity_bytes) == (fits, peak, capacity)


def test_a_global_batch_unlike_the_case_is_one_line(workdir: Path) -> None:
    with pytest.raises(TaskError) as error:
        train(LightningTask(module=lambda c: LitAutoEncoder(),
                            data=lambda c: loader(c, per_device=8)))
    assert str(error.value).startswith("LightningTask.module LitAutoEncoder (")
    assert str(error.value).split("test_backend.py:")[1] == (
        f"{LitAutoEncoder.__init__.__code__.co_firstlineno - 4}): the global batch is 8 (the "
        f"loader's batch 8 x accumulate_grad_batches 1 x 1 device(s)), but "
        f"lightning-nomesh-b16 declares batch=16: make the loader's batch_size 16 (from "
        f"accelperf.case.batch), or the case's batch 8")


def test_manual_optimization_is_refused_saying_why(workdir: Path) -> None:
    with pytest.raises(TaskError, match="automatic_optimization = False: its training_step "
                                        "steps the optimizer itself"):
        train(LightningTask(module=Manual(), data=loader))


def test_a_timeout_ends_the_trainers_loop_at_a_step_boundary(workdir: Path) -> None:
    run = BACKEND.train(case(), task(), CPU, timeout=1e-9).run
    assert run.outcome == "timeout" and len(run.losses) == 1
    assert run.message.startswith("exceeded the 1e-09 s timeout after 1 of 7 steps")


def test_nothing_is_left_in_the_working_directory(plain: TrainResult,
                                                  workdir: Path) -> None:
    assert list(workdir.iterdir()) == []


def test_lightning_not_installed_skips_with_its_install_line(
        monkeypatch: pytest.MonkeyPatch) -> None:
    found = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "lightning" else found(name, *a))
    assert get_backend("lightning").unavailable_reason() == (
        "backend 'lightning' needs lightning, which is not installed: pip install "
        "'pytest-accelperf[lightning]' (install torch first: pip install torch==2.13.0 for "
        "CPU)")


def test_importing_the_entry_point_imports_no_framework() -> None:
    import subprocess
    import sys

    code = ("import sys, pytest_accelperf.lightning\n"
            "print(sorted(m for m in ('torch', 'lightning') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"


def _block(program: object) -> dict[str, Any]:
    return {"outcome": "ok", "environment": {}, "program": program}


def test_the_ab_stepper_holds_the_trainers_loop_between_blocks(workdir: Path) -> None:
    """A/B mode's stepper: ``Trainer.fit`` in a thread of its own, held before each
    optimizer step; each ``run(n)`` lets exactly ``n`` through and gives their times; the
    program is the run's (the planted sync counted); ``close`` ends the fit and leaves
    nothing behind."""
    import threading

    stepper = BACKEND.stepper(case(), task("item"), CPU)
    try:
        first = stepper.run(3)
        held = stepper._held._clock  # type: ignore[attr-defined]
        assert held is not None and len(held.out.step_times) == 3
        second = stepper.run(2)
        assert len(first) == 3 and len(second) == 2
        assert all(0 < t < 5 for t in first + second)
        assert len(held.out.step_times) == 5  # held: no step ran past what was asked
        program = stepper.program
        assert program is not None and program.get("flops") and program.get("host_syncs")
    finally:
        stepper.close()
    assert not [t for t in threading.enumerate() if t.name.startswith("accelperf-held")]
    assert not list(workdir.iterdir())


class SlowCallback(L.Callback):
    """A user's callback that costs 20 ms a batch: the trainer's own time, not the user's
    forward, backward or optimizer step."""

    def on_train_batch_end(self, *args: Any) -> None:
        import time

        time.sleep(0.02)


@pytest.mark.timing
def test_the_trainers_own_time_is_measured_and_a_slow_callback_fails_it(
        plain: TrainResult, workdir: Path) -> None:
    """Lightning's parity figure: each measured step less the user's training_step,
    backward and optimizer step. A callback that sleeps 20 ms a batch moves it by about
    20 ms (the user's time stays the same), and the trainer check fails it."""
    from pytest_accelperf.checks.trainer import CHECK, check_trainer

    own = plain.run.trainer_times
    assert own is not None and len(own) == STEPS
    assert all(0 < t < s for t, s in zip(own, plain.run.step_times, strict=True))
    slow = train(task(callbacks=[SlowCallback()])).run
    assert slow.trainer_times is not None
    import statistics

    moved = statistics.median(slow.trainer_times) - statistics.median(own)
    assert 0.015 < moved < 0.2, (own, slow.trainer_times)
    block = {**_block(slow.program), **CHECK.record(slow), "step_time": {
        "median": statistics.median(slow.step_times), "samples": slow.step_times}}
    base = {**_block(plain.run.program), **CHECK.record(plain.run), "step_time": {
        "median": statistics.median(plain.run.step_times), "samples": plain.run.step_times}}
    result = check_trainer(block, base, Tolerances(throughput_tolerance=0.5))
    assert result is not None and result.verdict is Verdict.REGRESSION, result
    assert result.detail.startswith("the trainer's own "), result.detail
