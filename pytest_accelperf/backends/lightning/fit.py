"""A :class:`~.lightning.task.LightningTask` made for a case and fitted: what both the
``lightning`` backend's run (:mod:`.lightning.backend`) and its A/B stepper
(:mod:`.lightning.stepper`) train with.

:func:`build` makes the case's module (seeded), its data and the ``Trainer``'s keyword
arguments, with what the gate owns set (:func:`trainer_settings`, one line for each of the
user's settings it replaced); :meth:`Built.fit` runs one ``Trainer.fit`` with the plugin's
callback inside it; :func:`count` runs the counting training and undoes it; :func:`quiet`
keeps Lightning's advice about the gate's own trainers out of the case's output.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Checkpoint

from pytest_accelperf.backends.lightning.callback import (
    COUNTED_STEP,
    Counting,
    GateProfiler,
    Watch,
)
from pytest_accelperf.backends.lightning.task import OWNED, LightningTask
from pytest_accelperf.backends.measure.common import TaskError, describe, task_of
from pytest_accelperf.backends.protocol import Task
from pytest_accelperf.backends.torch.launched import launched
from pytest_accelperf.backends.torch.launched import one_device as trainer_one_device
from pytest_accelperf.backends.torch.memory import GROWTH_STEPS, MEMORY_STEPS
from pytest_accelperf.backends.types import FrameworkKwargs
from pytest_accelperf.collect.cases import Case


def as_lightning_task(task: Task) -> LightningTask:
    return task_of(task, LightningTask, "lightning")


@dataclass
class Built:
    """The task made for one case: its module, data, label, and the trainer's settings
    with what the gate owns set, and one line for each user setting it replaced."""

    module: pl.LightningModule
    data: object
    label: str
    kwargs: FrameworkKwargs
    notes: list[str] = field(default_factory=list)

    def fit(self, max_steps: int, watch: Watch, root: str) -> pl.Trainer:
        """One ``Trainer.fit`` of ``max_steps`` optimizer steps, ``watch`` inside it."""
        kwargs = dict(self.kwargs, max_steps=max_steps, default_root_dir=root,
                      profiler=GateProfiler(watch),
                      callbacks=[*self.kwargs.get("callbacks", ()), watch])
        trainer = pl.Trainer(**kwargs)
        data = self.data
        try:
            if isinstance(data, pl.LightningDataModule):
                trainer.fit(self.module, datamodule=data)
            else:
                trainer.fit(self.module, train_dataloaders=data)
        finally:
            watch.close()
        return trainer


def make_module(task: LightningTask, case: Case) -> pl.LightningModule:
    module = task.built(task.module, case, (pl.LightningModule,))
    if not isinstance(module, pl.LightningModule):
        raise TaskError(f"LightningTask.module must be a LightningModule or a function of "
                        f"the case that returns one; got {type(module).__name__}")
    return module


def build(task: LightningTask, case: Case, device: torch.device) -> Built:
    """Make ``task``'s module and data for ``case`` (seeded), and the trainer's settings."""
    pl.seed_everything(task.seed_for(case), workers=True, verbose=False)
    module = make_module(task, case)
    label = f"LightningTask.module {describe(type(module))}"
    if not module.automatic_optimization:
        raise TaskError(
            f"{label} sets automatic_optimization = False: its training_step steps the "
            f"optimizer itself, where the gate cannot see which call is an optimizer step "
            f"to stamp; the lightning backend measures automatic optimization only (use it, "
            f"or write the step as a TorchStep)")
    data = task.built(task.data, case, (pl.LightningDataModule, torch.utils.data.DataLoader))
    if data is None:
        raise TaskError("LightningTask.data is None: give a LightningDataModule, a DataLoader "
                        "or a function of the case that returns one")
    kwargs, notes = trainer_settings(task.trainer, case, device)
    return Built(module, data, label, kwargs, notes)


def trainer_settings(given: Mapping[str, Any], case: Case,
                     device: torch.device) -> tuple[FrameworkKwargs, list[str]]:
    """The ``Trainer`` keyword arguments of a measured run: ``given`` with what the gate
    owns set, and a line for each of ``given``'s that differed."""
    if not isinstance(given, Mapping):
        raise TaskError(f"LightningTask.trainer holds lightning.Trainer keyword arguments "
                        f"(a dict); got {type(given).__name__}")
    kwargs = dict(given)
    notes: list[str] = []
    owned: dict[str, tuple[object, str]] = {
        **OWNED,
        "max_steps": (case.warmup + case.steps, "the case's warm-up + steps"),
        "accelerator": ("gpu" if device.type == "cuda" else "cpu", "the session's --accel"),
        "devices": (1, "a case of world_size 1 trains on one device"),
    }
    rank = launched()
    if rank is not None:  # one of the plugin's launched ranks: Lightning's DDP over them
        owned["devices"] = (rank.local_world_size, "the case's ranks on this machine, one "
                                                   "device each")
        owned["num_nodes"] = (rank.machines, "the machines the case's ranks run on")
        launched_ddp(kwargs, notes)
    if case.grad_accum > 1:  # the case's accumulation drives the trainer's
        owned["accumulate_grad_batches"] = (case.grad_accum, "the case's grad_accum")
    for name, (value, why) in owned.items():
        if name in kwargs and kwargs[name] != value and not (
                name == "profiler" and kwargs[name] is None):
            notes.append(f"LightningTask.trainer[{name!r}]={kwargs[name]!r}: the gate uses "
                         f"{value!r} ({why})")
        kwargs[name] = value
    kwargs.pop("max_steps")  # set per training
    kwargs.pop("profiler")  # the gate's, per training
    callbacks = list(kwargs.get("callbacks") or [])
    kept = [c for c in callbacks if not isinstance(c, Checkpoint)]
    if len(kept) != len(callbacks):
        notes.append("LightningTask.trainer['callbacks'] holds a checkpoint callback: "
                     "left out (no checkpoint is left in the project)")
    kwargs["callbacks"] = kept
    return kwargs, notes


#: Lightning 2.6's own use of torch's pytree, which torch 2.13 deprecates: Lightning's to
#: fix, not the user's (an error where a suite turns warnings into errors).
_LIGHTNING_OWN = r"`isinstance\(treespec, LeafSpec\)` is deprecated"


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """The gate's own trainers are quiet: Lightning's advice about the run (a loader with
    few workers), its deprecation of its own use of torch, and its info lines about the
    trainer the gate made (devices, the tip to install a logger, ``max_steps`` reached)
    are not the case's result."""
    from lightning.fabric.utilities.warnings import PossibleUserWarning

    loggers = [logging.getLogger(name) for name in ("lightning.pytorch", "lightning.fabric")]
    levels = [lg.level for lg in loggers]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PossibleUserWarning)
        warnings.filterwarnings("ignore", _LIGHTNING_OWN, FutureWarning)
        for lg in loggers:
            lg.setLevel(logging.WARNING)
        try:
            yield
        finally:
            for lg, level in zip(loggers, levels, strict=True):
                lg.setLevel(level)


def snapshot(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().to("cpu", copy=True) for k, v in module.state_dict().items()}


def restore(module: torch.nn.Module, saved: Mapping[str, torch.Tensor]) -> None:
    module.load_state_dict(saved)
    module.zero_grad(set_to_none=True)


def count(built: Built, task: LightningTask, case: Case, device: torch.device, root: str,
          *, memory: bool, saved: Mapping[str, torch.Tensor] | None = None) -> Counting:
    """The counting training (``memory``: the CPU's live bytes over
    :data:`MEMORY_STEPS` + :data:`GROWTH_STEPS` optimizer steps; else just through
    :data:`COUNTED_STEP`, for its FLOPs and ops), then undone: the module's ``state_dict``
    put back (``saved``, taken now where not given), or the module made again where the
    task makes it."""
    if saved is None:
        saved = snapshot(built.module)
    counting = Counting(case, device, built.label)
    counting.steps = MEMORY_STEPS + GROWTH_STEPS if memory else COUNTED_STEP + 1
    built.fit(counting.steps, counting, root)
    if isinstance(task.module, pl.LightningModule):
        restore(built.module, saved)  # the state_dict; its Python attributes stay
    else:  # made again, as the first time: nothing of the counting is left in it
        pl.seed_everything(task.seed_for(case), workers=True, verbose=False)
        built.module = make_module(task, case)
    return counting


#: ``Trainer(strategy=...)`` values that mean DDP over the launched ranks as they are.
_DDP_NAMES = ("auto", "ddp", None)


def launched_ddp(kwargs: FrameworkKwargs, notes: list[str]) -> None:
    """Set ``kwargs`` (a ``Trainer``'s) for a launched rank: Lightning's DDP over the
    process group the plugin launched, found by ``TorchElasticEnvironment`` in the ranks'
    own environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``,
    ``MASTER_PORT``): Lightning starts no process of its own. Another strategy the user
    gave (a ``DDPStrategy`` object too: a strategy serves one ``Trainer``, and the gate
    makes two) is replaced, said in ``notes``."""
    from lightning.fabric.plugins.environments.cluster_environment import ClusterEnvironment
    from lightning.fabric.plugins.environments.torchelastic import TorchElasticEnvironment

    given = kwargs.get("strategy", "auto")
    if not (isinstance(given, str) or given is None) or given not in _DDP_NAMES:
        notes.append(f"LightningTask.trainer['strategy']={given!r}: the gate uses 'ddp' over "
                     f"the case's launched ranks (world_size > 1)")
    kwargs["strategy"] = "ddp"
    plugins = kwargs.get("plugins") or []
    plugins = list(plugins) if isinstance(plugins, list | tuple) else [plugins]
    kept = [p for p in plugins if not isinstance(p, ClusterEnvironment)]
    if len(kept) != len(plugins):
        notes.append("LightningTask.trainer['plugins'] holds a cluster environment: the gate "
                     "uses TorchElasticEnvironment (the ranks it launched)")
    kwargs["plugins"] = [*kept, TorchElasticEnvironment()]


def one_device(case: Case) -> None:
    """Refuse a case this process cannot train (:func:`.torch.launched.one_device`)."""
    trainer_one_device(case, "a lightning", "Lightning's DDP")
