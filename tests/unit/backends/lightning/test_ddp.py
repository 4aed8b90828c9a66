"""Lightning's own DDP over 2 ranks launched by the plugin, on the CPU (gloo): a tiny
LightningModule trained as written, once plain and once with
``self.log(..., on_step=True, sync_dist=True)`` planted, in one module-scoped training
each (slow: two 2-rank launches)."""

from __future__ import annotations

import math
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
from pytest_accelperf.backends.lightning.ddp import RANKS  # noqa: E402
from pytest_accelperf.backends.procs.ranks import train_in_ranks  # noqa: E402
from pytest_accelperf.backends.protocol import TrainResult  # noqa: E402
from pytest_accelperf.checks.program import check_program  # noqa: E402
from pytest_accelperf.collect.cases import Case  # noqa: E402
from pytest_accelperf.errors import ConfigError  # noqa: E402
from pytest_accelperf.lightning import LightningTask  # noqa: E402
from pytest_accelperf.provision.accel import Accelerator  # noqa: E402
from pytest_accelperf.records.verdict import Tolerances, Verdict  # noqa: E402

pytestmark = pytest.mark.slow

WORLD, BATCH, STEPS, WARMUP = 2, 16, 3, 1
CPU = Accelerator(name="cpu", platform="cpu-x2", device_kind="cpu", device_count=2)


class Tiny(L.LightningModule):
    """A small autoencoder of the kind Lightning's README writes; ``sync_dist`` plants
    ``self.log("loss", loss, on_step=True, sync_dist=True)``."""

    def __init__(self, sync_dist: bool = False) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, 8), nn.ReLU(), nn.Linear(8, 32))
        self.sync_dist = sync_dist

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        (x,) = batch
        loss = nn.functional.mse_loss(self.net(x), x)
        if self.sync_dist:
            self.log("loss", loss, on_step=True, sync_dist=True)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def loader(case: Case) -> DataLoader[Any]:
    """The user's loader, at the per-device batch: Lightning shards it over the ranks."""
    per_device = case.batch // case.world_size
    gen = torch.Generator().manual_seed(0)
    return DataLoader(TensorDataset(torch.randn(64 * per_device, 32, generator=gen)),
                      batch_size=per_device)


def ddp_case(**kw: Any) -> Case:
    fields: dict[str, Any] = {"batch": BATCH, "steps": STEPS, "warmup": WARMUP, **kw}
    return Case(backend="lightning", world_size=WORLD, **fields)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The trainings run here (the ranks start in this directory): nothing may be left."""
    path = tmp_path_factory.mktemp("lightning-ddp-cwd")
    before = Path.cwd()
    os.chdir(path)
    try:
        yield path
    finally:
        os.chdir(before)


def train(sync_dist: bool, **trainer: Any) -> TrainResult:
    task = LightningTask(module=lambda case: Tiny(sync_dist), data=loader, trainer=trainer)
    return train_in_ranks(RANKS, ddp_case(), task, CPU, timeout=300)


@pytest.fixture(scope="module")
def plain(workdir: Path) -> TrainResult:
    return train(sync_dist=False)


@pytest.fixture(scope="module")
def logged(workdir: Path) -> TrainResult:
    """Planted, and with a strategy of the user's that the gate replaces (said once, in
    the process that asked for the training)."""
    with pytest.warns(AccelperfWarning, match="trainer\\['strategy'\\]='ddp_spawn'"):
        return train(sync_dist=True, strategy="ddp_spawn")


def test_the_spec_names_these_ranks() -> None:
    spec = get_backend("lightning")
    assert spec.spans_ranks(WORLD) and spec.load_ranks() is RANKS


def test_trains_ddp_over_two_ranks(plain: TrainResult) -> None:
    run = plain.run
    assert run.outcome == "ok", run.message
    assert run.n_devices == WORLD and run.samples_per_step == BATCH
    assert sorted(run.memory_per_device) == ["rank0", "rank1"]
    assert all(v > 0 for v in run.memory_per_device.values())
    assert len(run.step_times) == STEPS
    assert len(run.losses) == WARMUP + STEPS and all(math.isfinite(x) for x in run.losses)
    ranks = run.details["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1]
    assert all(len(r["step_times"]) == STEPS for r in ranks)
    # each rank trained its own share of the global batch: their losses differ
    assert ranks[0]["local_losses"] != ranks[1]["local_losses"]
    assert run.params_fingerprint is not None and plain.params


def test_counts_ddp_gradient_all_reduce(plain: TrainResult) -> None:
    """DDP's bucket all-reduce (issued by its C++ reducer) is seen: one bucket of all
    the gradients (32*8 + 8 + 8*32 + 32 float32 = 2,208 bytes) per step."""
    program = plain.run.program
    assert program is not None
    assert program["collectives"]["all_reduce"] == {"count": 1, "bytes": 552 * 4}
    assert plain.run.details["comm"]["symmetric"]


def test_sync_dist_caught_by_the_program_check(plain: TrainResult,
                                                logged: TrainResult) -> None:
    assert logged.run.outcome == "ok", logged.run.message
    before, after = plain.run.program, logged.run.program
    assert before is not None and after is not None
    assert after["collectives"]["all_reduce"]["count"] == \
        before["collectives"]["all_reduce"]["count"] + 1
    result = check_program(_block(after), _block(before), Tolerances(), comparable=True)
    assert result is not None and result.verdict is Verdict.REGRESSION, result
    assert "all_reduce" in result.detail


def test_the_users_strategy_replaced_is_said(logged: TrainResult) -> None:
    assert logged.notes == ["LightningTask.trainer['strategy']='ddp_spawn': the gate uses "
                            "'ddp' over the case's launched ranks (world_size > 1)"]
    assert logged.run.details["notes"] == logged.notes


def test_nothing_left_in_the_project(plain: TrainResult, logged: TrainResult,
                                     workdir: Path) -> None:
    assert list(workdir.iterdir()) == []


def test_refuses_what_it_cannot_train() -> None:
    task = LightningTask(module=lambda case: Tiny(), data=loader)
    with pytest.raises(ConfigError, match="multiple of 2"):
        RANKS.job(ddp_case(batch=15), task, CPU, cpu_devices=2, platform=None, timeout=None)
    gpu = Accelerator(name="gpu", platform="gpu-x2", device_kind="gpu", device_count=2)
    with pytest.raises(ConfigError, match="CPU"):
        RANKS.job(ddp_case(), task, gpu, cpu_devices=2, platform=None, timeout=None)
    from pytest_accelperf.backends.lightning.backend import BACKEND

    with pytest.raises(ConfigError, match="in the plugin's launched ranks"):
        BACKEND.train(ddp_case(), task, CPU)  # not in one process


def _block(program: object) -> dict[str, Any]:
    return {"outcome": "ok", "environment": {}, "program": program}
