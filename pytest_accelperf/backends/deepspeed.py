"""The DeepSpeed backend: ZeRO stages 0-3, optional CPU offload, ``world_size`` ranks.

A ``backend="deepspeed"`` case trains a
:class:`~pytest_accelperf.backends.torch_task.TorchTask` (the same task the torch backend
trains) with ``deepspeed.initialize`` in
``case.world_size`` processes that the plugin launches itself (no ``deepspeed`` or
``torchrun`` launcher: :mod:`pytest_accelperf.backends.launch`; gloo on the CPU, nccl on
GPUs), or as Ray actors. The rank loop, what is measured and how, are those of
:mod:`pytest_accelperf.backends.torch_ranks` (shared with DDP); this module builds the
engine, and its ``RANKS`` is what the backend's spec names as its ranks.

The DeepSpeed configuration comes from the case (:func:`ds_config`):

* ``train_batch_size = case.batch`` (the global batch), ``train_micro_batch_size_per_gpu =
  case.batch / world_size``, no gradient accumulation;
* ``zero_optimization.stage = case.zero_stage``; ``offload_optimizer`` (``case.offload`` in
  ``optimizer``/``all``) and ``offload_param`` (``param``/``all``, stage 3) to the CPU;
* ``gradient_clipping`` always explicit: ``case.grad_clip`` (or the task's), 0 for none:
  DeepSpeed's own default (1.0) is never used by accident;
* fp32 (``case.params["precision"] = "bf16"`` turns on DeepSpeed's bf16 on GPUs);
* ``case.params["ds_config"]``: a dict merged over all this (bucket sizes, say), except the
  batch and clipping keys, which come from the case.

Optimizer: the task's own (``make_optimizer``), as a client optimizer, so no C++ op is
compiled for it. With the optimizer offloaded, a torch ``Adam``/``AdamW`` is replaced by
``DeepSpeedCPUAdam`` with the same hyper-parameters (what DeepSpeed requires of offload);
any other optimizer is kept (``zero_force_ds_cpu_optimizer: false``). ZeRO-3 builds the
model inside ``deepspeed.zero.Init`` so that each rank holds only its partition from the
start, as it must for a model that does not fit one device.

C++ ops: DeepSpeed compiles ``deepspeed_shm_comm`` (the CPU accelerator's shared-memory
collectives, at ``init_distributed`` on the CPU) and ``cpu_adam`` (for offload) on first use,
about a minute each on two cores, into ``TORCH_EXTENSIONS_DIR``: by default the persistent
``~/.cache/pytest-accelperf/torch_extensions`` (see :mod:`.launch`), so once per machine.

Memory (``memory_per_device = {"rank0": ..., "rank1": ...}``): on GPUs each rank's
``torch.cuda.max_memory_allocated``, where offload shows as fewer device bytes. On the CPU
each rank's MemTracker count of live tensor bytes over construction and the first two
steps: there the "device" *is* the CPU, so offloaded optimizer state or parameters are
still counted (offload moves them to the same memory); what ZeRO partitions away from a
rank does disappear from its count.
"""

from __future__ import annotations

import copy
import importlib
import importlib.util
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from pytest_accelperf.accel import Accelerator
from pytest_accelperf.backends.base import Fit, TrainResult
from pytest_accelperf.backends.ranks import train_in_ranks
from pytest_accelperf.backends.torch_ranks import RankPlan, TorchRanks, micro_batch, resolve_clip
from pytest_accelperf.backends.torch_task import TorchTask
from pytest_accelperf.cases import Case

INSTALL = "pip install 'pytest-accelperf[deepspeed]' (DeepSpeed 0.19; torch first)"
#: Keys of ``params["ds_config"]`` that the case itself decides.
_CASE_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu",
              "gradient_accumulation_steps", "gradient_clipping")


def import_deepspeed() -> Any:
    """The ``deepspeed`` module (untyped; imported only in the ranks, never in pytest's
    process, where its import-time warnings would meet ``filterwarnings = error``)."""
    return importlib.import_module("deepspeed")


def _merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def ds_config(case: Case, grad_clip: float | None, device: str = "cpu") -> dict[str, Any]:
    """The DeepSpeed config of ``case`` (see the module doc)."""
    stage = case.zero_stage or 0
    if stage == 0 and case.offload != "none":
        raise ValueError(f"{case.id}: offload={case.offload!r} needs ZeRO stage 1 or more "
                         f"(DeepSpeed offloads partitioned state); set zero_stage")
    zero: dict[str, Any] = {"stage": stage}
    pin = device == "cuda"  # pinned host memory only helps device transfers
    if case.offload in ("optimizer", "all"):
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": pin}
    if case.offload in ("param", "all"):
        zero["offload_param"] = {"device": "cpu", "pin_memory": pin}
    precision = str(case.params.get("precision", "fp32"))
    if precision not in ("fp32", "bf16"):
        raise ValueError(f"{case.id}: params['precision'] is 'fp32' or 'bf16', not "
                         f"{precision!r}")
    config: dict[str, Any] = {
        "train_batch_size": case.batch,
        "train_micro_batch_size_per_gpu": micro_batch(case),
        "gradient_accumulation_steps": 1,
        "gradient_clipping": float(grad_clip or 0.0),
        "zero_optimization": zero,
        "bf16": {"enabled": precision == "bf16"},
        "fp16": {"enabled": False},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 1 << 30,
        "wall_clock_breakdown": False,
    }
    extra = case.params.get("ds_config", {})
    if not isinstance(extra, Mapping):
        raise ValueError(f"{case.id}: params['ds_config'] must be a dict, not "
                         f"{type(extra).__name__}")
    clash = sorted(set(extra) & set(_CASE_KEYS))
    if clash:
        raise ValueError(f"{case.id}: params['ds_config'] sets {clash}, which come from the "
                         f"case (batch, world_size, grad_clip): set those on the Case")
    return _merge(config, extra)


def _offload_optimizer(client: torch.optim.Optimizer) -> tuple[torch.optim.Optimizer, bool]:
    """``DeepSpeedCPUAdam`` with ``client``'s groups and hyper-parameters when ``client`` is
    a torch Adam/AdamW (second: whether DeepSpeed must accept a client CPU optimizer)."""
    if not isinstance(client, torch.optim.Adam):
        return client, False
    DeepSpeedCPUAdam = importlib.import_module("deepspeed.ops.adam").DeepSpeedCPUAdam

    groups = client.param_groups
    if any(g.get("amsgrad") for g in groups):
        raise ValueError("DeepSpeedCPUAdam (needed to offload the optimizer) has no amsgrad: "
                         "use amsgrad=False or offload='none'")
    decoupled = isinstance(client, torch.optim.AdamW) or bool(
        groups[0].get("decoupled_weight_decay"))
    params = [{"params": g["params"], "lr": g["lr"], "betas": g["betas"], "eps": g["eps"],
               "weight_decay": g["weight_decay"]} for g in groups]
    first = params[0]
    optimizer: torch.optim.Optimizer = DeepSpeedCPUAdam(
        params, lr=first["lr"], betas=first["betas"], eps=first["eps"],
        weight_decay=first["weight_decay"], adamw_mode=decoupled)
    return optimizer, True


class DeepSpeedRankEngine:
    """One rank's ``DeepSpeedEngine`` (built inside the rank; see the module doc)."""

    def __init__(self, plan: RankPlan, device: torch.device) -> None:
        deepspeed = import_deepspeed()

        case, task = plan.case, plan.task
        self.stage = case.zero_stage or 0
        self.config = ds_config(case, plan.grad_clip, device.type)
        torch.manual_seed(task.seed)
        if self.stage == 3:
            with deepspeed.zero.Init(config_dict_or_path=self.config):
                module = task.make_model()
        else:
            module = task.make_model().to(device)
        client = task.make_optimizer(module.parameters())
        optimizer = client
        if case.offload in ("optimizer", "all"):
            optimizer, is_ds_adam = _offload_optimizer(client)
            if not is_ds_adam:
                self.config["zero_force_ds_cpu_optimizer"] = False
        self.optimizer_name = type(optimizer).__name__
        engine, _, _, _ = deepspeed.initialize(model=module, optimizer=optimizer,
                                               config=self.config, dist_init_required=False)
        self.engine = engine
        self.model: torch.nn.Module = engine

    @staticmethod
    def init_distributed(backend: str) -> None:
        import_deepspeed().init_distributed(dist_backend=backend)

    def backward(self, loss: torch.Tensor) -> None:
        self.engine.backward(loss)

    def step(self) -> None:
        self.engine.step()  # clips per the config, steps, zeroes the gradients

    def full_params(self, rank: int) -> dict[str, np.ndarray] | None:
        module = self.engine.module
        if self.stage == 3:
            deepspeed = import_deepspeed()

            with deepspeed.zero.GatheredParameters(list(module.parameters()),
                                                   modifier_rank=None):
                return self._copy(module) if rank == 0 else None
        return self._copy(module) if rank == 0 else None

    @staticmethod
    def _copy(module: torch.nn.Module) -> dict[str, np.ndarray]:
        return {n: p.detach().float().cpu().numpy().copy()
                for n, p in module.named_parameters()}

    def describe(self) -> dict[str, Any]:
        deepspeed = import_deepspeed()

        return {"engine": "deepspeed", "deepspeed": deepspeed.__version__,
                "optimizer": self.optimizer_name, "config": self.config}


def _check(case: Case, task: TorchTask) -> None:
    """Refuse, before any launch, what a DeepSpeed case cannot be (with the fix)."""
    if case.zero_stage is None:
        raise ValueError(f"{case.id}: a deepspeed case needs zero_stage (0, 1, 2 or 3)")
    if case.mesh is not None:
        raise ValueError(f"{case.id}: deepspeed cases are data parallel over world_size "
                         f"ranks; drop mesh={case.mesh}")
    if task.compile:
        raise ValueError(f"{case.id}: the deepspeed backend trains eagerly; drop "
                         f"compile=True from the task")
    ds_config(case, resolve_clip(case, task))  # fail here, not in every rank


#: The deepspeed backend's ranks (its spec's ``ranks``): every case, ``world_size`` 1 too.
RANKS = TorchRanks(DeepSpeedRankEngine, _check)


class DeepSpeedBackend:
    """Trains a :class:`TorchTask` with DeepSpeed in ``case.world_size`` launched ranks."""

    name = "deepspeed"

    def unavailable_reason(self) -> str | None:
        missing = [p for p in ("torch", "deepspeed", "cloudpickle")
                   if importlib.util.find_spec(p) is None]
        if missing:
            return f"the deepspeed backend needs {', '.join(missing)}: {INSTALL}"
        return None

    def train(self, case: Case, task: TorchTask, accel: Accelerator, *,
              timeout: float | None = None) -> TrainResult:
        """Train and measure ``case`` in ranks launched on this machine (see
        :mod:`.torch_ranks` for what is measured). With ``case.reference`` the task is also
        trained in this process by plain torch on the full global batch, and its parameters
        are returned for the reference check."""
        return train_in_ranks(RANKS, case, task, accel, timeout=timeout)

    def fits(self, case: Case, task: TorchTask, accel: Accelerator, *,
             timeout: float | None = None) -> Fit:
        """Two real steps in every rank; the largest rank's peak against the capacity."""
        return RANKS.fits(case, task, accel, timeout=timeout)


BACKEND = DeepSpeedBackend()
