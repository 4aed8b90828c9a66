"""torch DistributedDataParallel: a ``backend="torch"`` case with ``world_size > 1``.

The torch backend's spec names this module as its ranks (``RANKS``): the plugin trains
such a case here, in ``world_size`` launched ranks (or Ray actors), each wrapping the task's
model in ``DistributedDataParallel`` with the task's own optimizer. The rank loop, what is
measured and how, are :mod:`pytest_accelperf.backends.torch_ranks`'s, shared with DeepSpeed.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from pytest_accelperf.accel import Accelerator
from pytest_accelperf.backends.base import Fit, TrainResult
from pytest_accelperf.backends.ranks import train_in_ranks

# Re-exported: they lived here before DeepSpeed needed them without DDP.
from pytest_accelperf.backends.torch_ranks import RankPlan, TorchRanks
from pytest_accelperf.backends.torch_ranks import build_run as build_run
from pytest_accelperf.backends.torch_ranks import make_plan as make_plan
from pytest_accelperf.backends.torch_ranks import rank_main as rank_main
from pytest_accelperf.backends.torch_ranks import slice_batch as slice_batch
from pytest_accelperf.backends.torch_ranks import train_reference as train_reference
from pytest_accelperf.backends.torch_task import TorchTask
from pytest_accelperf.cases import Case


class DDPRankEngine:
    """``torch.nn.parallel.DistributedDataParallel`` over the task's model, with the task's
    own optimizer; clipping by ``clip_grad_norm_`` on the all-reduced gradients."""

    def __init__(self, plan: RankPlan, device: torch.device) -> None:
        from torch.nn.parallel import DistributedDataParallel

        torch.manual_seed(plan.task.seed)
        module = plan.task.make_model().to(device)
        self.module = module
        self.model: torch.nn.Module = DistributedDataParallel(
            module, device_ids=[device.index] if device.type == "cuda" else None)
        self.optimizer = plan.task.make_optimizer(self.model.parameters())
        self.clip = plan.grad_clip

    @staticmethod
    def init_distributed(backend: str) -> None:
        import torch.distributed as dist

        if not dist.is_initialized():
            dist.init_process_group(backend)

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()  # type: ignore[no-untyped-call]  # untyped in torch

    def step(self) -> None:
        if self.clip:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def full_params(self, rank: int) -> dict[str, np.ndarray] | None:
        if rank != 0:
            return None
        return {n: p.detach().cpu().numpy().copy() for n, p in self.module.named_parameters()}

    def describe(self) -> dict[str, Any]:
        return {"engine": "ddp", "optimizer": type(self.optimizer).__name__,
                "grad_clip": self.clip}


def _check(case: Case, task: TorchTask) -> None:
    if case.world_size < 2:
        raise ValueError(f"{case.id}: DDP needs world_size >= 2; train one process with the "
                         f"torch backend")


#: The torch backend's ranks (its spec's ``ranks``).
RANKS = TorchRanks(DDPRankEngine, _check)


def train_ddp(case: Case, task: TorchTask, accel: Accelerator,
              timeout: float | None = None) -> TrainResult:
    """Train a ``backend="torch"`` case with ``world_size > 1`` by DDP in ranks launched on
    this machine (what ``accelperf.train`` does for it without a cluster)."""
    return train_in_ranks(RANKS, case, task, accel, timeout=timeout)


def fits_ddp(case: Case, task: TorchTask, accel: Accelerator,
             timeout: float | None = None) -> Fit:
    """:meth:`Backend.fits` for DDP cases (see :meth:`TorchRanks.fits`)."""
    return RANKS.fits(case, task, accel, timeout=timeout)
