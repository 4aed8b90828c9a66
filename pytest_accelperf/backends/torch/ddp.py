"""torch DistributedDataParallel: a ``backend="torch"`` case with ``world_size > 1``.

The torch backend's spec names this module as its ranks (``RANKS``): the plugin trains
such a case here, in ``world_size`` launched ranks (or Ray actors), each wrapping the task's
model in ``DistributedDataParallel`` with the task's own optimizer. The rank loop
(:mod:`pytest_accelperf.backends.torch.in_rank`), what is measured and how
(:mod:`pytest_accelperf.backends.torch.processes`), are shared with DeepSpeed.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Any

import numpy as np
import torch

from pytest_accelperf.backends.procs.ranks import train_in_ranks
from pytest_accelperf.backends.protocol import Task, TrainResult
from pytest_accelperf.backends.torch.comm import CommCounter, register_ddp_hook
from pytest_accelperf.backends.torch.in_rank import EngineDescription, RankPlan
from pytest_accelperf.backends.torch.processes import TorchRanks
from pytest_accelperf.backends.torch.rank_step import RankStep, compiled_graphs, group_summary
from pytest_accelperf.collect.cases import Case
from pytest_accelperf.errors import ConfigError
from pytest_accelperf.provision.accel import Accelerator


class DDPRankEngine:
    """``torch.nn.parallel.DistributedDataParallel`` over the model the user's ``build``
    made in this rank, with the user's own optimizer and schedule: gradients accumulate
    under ``no_sync`` over ``case.grad_accum`` micro-batches (each loss scaled by
    ``1 / grad_accum``), then ``clip_grad_norm_`` (if asked), ``optimizer.step()``,
    ``scheduler.step()``. ``compile=True`` compiles the DDP module with ``torch.compile``
    (torch's DDP-aware compilation: graphs split at the gradient buckets), when the rank
    loop asks (:meth:`compile`). The gradient buckets are all-reduced by torch's default
    comm hook, wrapped to count them (:func:`~.torch.comm.register_ddp_hook`)."""

    #: What a pool's warm ranks import for DDP cases.
    warm_modules: tuple[str, ...] = ("torch.nn.parallel", "pytest_accelperf.backends.torch.ddp")

    def __init__(self, plan: RankPlan, device: torch.device, rank: int) -> None:
        from torch.nn.parallel import DistributedDataParallel

        step = plan.step
        torch.manual_seed(step.seed)
        built = step.built(rank)
        module = built.model.to(device)
        self.module = module
        self.step_spec = step
        ddp = DistributedDataParallel(
            module, device_ids=[device.index] if device.type == "cuda" else None)
        self.ddp = ddp
        self.comm = CommCounter()
        register_ddp_hook(ddp, self.comm)  # counts each bucket's all-reduce in counted steps
        self.model: Any = ddp
        assert built.optimizer is not None  # built() allows None only for a DeepSpeed config
        self.optimizer = built.optimizer
        self.scheduler = built.scheduler
        self.clip = plan.grad_clip
        self.accum = plan.case.grad_accum
        self.groups = group_summary(self.optimizer)
        self.steps = self.micro_steps = 0

    @staticmethod
    def init_distributed(backend: str) -> None:
        import torch.distributed as dist

        if not dist.is_initialized():
            dist.init_process_group(backend)

    def micro_step(self, boundary: bool) -> AbstractContextManager[object]:
        return nullcontext() if boundary else self.ddp.no_sync()

    def backward(self, loss: torch.Tensor) -> None:
        scaled = loss / self.accum if self.accum > 1 else loss
        scaled.backward()  # type: ignore[no-untyped-call]  # untyped in torch

    def step(self, boundary: bool) -> None:
        self.micro_steps += 1
        if not boundary:
            return
        self.steps += 1
        if self.clip:
            torch.nn.utils.clip_grad_norm_(self.module.parameters(), self.clip)
        self.optimizer.step()
        if self.scheduler is not None:
            self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)

    def counting(self) -> AbstractContextManager[object]:
        return self.comm.step()  # the comm hook counts while the step is open

    def compile(self) -> None:
        self.model = torch.compile(self.ddp)

    def lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    def full_params(self, rank: int) -> dict[str, np.ndarray] | None:
        if rank != 0:
            return None
        return self.step_spec.params_of(self.module)

    def describe(self) -> EngineDescription:
        return {"engine": "ddp", "optimizer": type(self.optimizer).__name__,
                "grad_clip": self.clip, "optimizer_steps": self.steps,
                "micro_steps": self.micro_steps,
                "scheduler": type(self.scheduler).__name__ if self.scheduler else None,
                "compile": self.step_spec.compile, "param_groups": self.groups,
                "compiled_graphs": compiled_graphs() if self.step_spec.compile else 0}


def _check(case: Case, step: RankStep) -> None:
    if case.world_size < 2:
        raise ConfigError(f"{case.id}: DDP needs world_size >= 2; train one process with the "
                         f"torch backend")


#: The torch backend's ranks (its spec's ``ranks``).
RANKS = TorchRanks(DDPRankEngine, _check)


def train_ddp(case: Case, task: Task, accel: Accelerator,
              timeout: float | None = None) -> TrainResult:
    """Train a ``backend="torch"`` case with ``world_size > 1`` by DDP in ranks launched on
    this machine (what ``accelperf.train`` does for it without a cluster)."""
    return train_in_ranks(RANKS, case, task, accel, timeout=timeout)


