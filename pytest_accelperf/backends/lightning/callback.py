"""The plugin inside Lightning's loop: a ``lightning.pytorch.Callback`` and a ``Profiler``.

``Trainer.fit`` owns the loop; the plugin follows it from two places Lightning offers:

* :class:`GateProfiler`, the trainer's profiler: Lightning brackets its fetch of each
  training batch with ``profiler.start/stop("[_TrainingEpochLoop].train_dataloader_next")``,
  so the fetch is timed on its own (``input``), apart from the step;
* :class:`GateCallback`, a callback: the end of each batch (the device synchronized there,
  the loss read from ``on_train_batch_end``'s ``outputs``, what ``training_step``
  returned), the learning rate each optimizer step used (``on_before_optimizer_step``), and
  a batch whose optimizer stepped (``trainer.global_step`` moved: with
  ``accumulate_grad_batches`` one step of several batches).

Two trainings use them (:mod:`.lightning.backend`): a counting one, untimed and undone
afterwards, where :class:`Counting` counts memory and what one step dispatched (FLOPs,
ops, host syncs) as :class:`~.torch.counting.CountedSteps` counts them for every trainer
(transformers' too), and the measured one, where a
:class:`~pytest_accelperf.backends.measure.stamps.StepClock` stamps each step.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import lightning
import lightning.pytorch as pl
import torch
from lightning.pytorch.profilers import Profiler

from pytest_accelperf.backends.measure.common import TaskError
from pytest_accelperf.backends.measure.stamps import Clocked, StepClock
from pytest_accelperf.backends.torch.counting import COUNTED_STEP, CountedSteps
from pytest_accelperf.backends.torch.ops import uncounted
from pytest_accelperf.backends.torch.task import leaves_with_paths
from pytest_accelperf.backends.types import Batch, UserValue
from pytest_accelperf.collect.cases import Case

#: The profiler action Lightning wraps around its fetch of a training batch.
FETCH = "train_dataloader_next"
#: The profiler actions Lightning wraps around the user's code of a step (the strategy's
#: ``training_step`` and ``backward``, and the module's ``optimizer_step``, which holds
#: both where the optimizer steps): what is outside them is the trainer's own time.
USER_ACTIONS = (("[Strategy]", ".training_step"), ("[Strategy]", ".backward"),
                ("[LightningModule]", ".optimizer_step"))


def user_action(action_name: str) -> bool:
    """Whether ``action_name`` is one of :data:`USER_ACTIONS`."""
    return any(action_name.startswith(a) and action_name.endswith(b) for a, b in USER_ACTIONS)
#: Lightning's packages: a host sync inside them is named at the user's frame that called
#: them (``self.log`` in ``training_step``), or at Lightning's own where its loop made it.
LIBRARIES = tuple(os.path.dirname(m.__file__ or "") + os.sep for m in (lightning, pl))
__all__ = ["COUNTED_STEP", "Counting", "GateProfiler", "Measured", "Watch"]


class GateProfiler(Profiler):
    """Tells ``watch`` when Lightning starts and stops fetching a training batch."""

    def __init__(self, watch: Watch) -> None:
        super().__init__()
        self.watch = watch
        self._depth = 0  # user actions open (optimizer_step holds the other two)

    def start(self, action_name: str) -> None:
        if action_name.endswith(FETCH):
            self.watch.fetch_started()
        elif user_action(action_name):
            self._depth += 1
            if self._depth == 1:
                self.watch.user_started()

    def stop(self, action_name: str) -> None:
        if action_name.endswith(FETCH):
            self.watch.fetch_ended()
        elif user_action(action_name) and self._depth > 0:
            self._depth -= 1
            if self._depth == 0:
                self.watch.user_ended()


class Watch(pl.Callback):
    """What both trainings read from the loop: each batch's loss, the learning rate, and
    which batch stepped the optimizer; and the global batch, checked on the first."""

    def __init__(self, case: Case, device: torch.device, label: str) -> None:
        self.case, self.device, self.label = case, device, label
        self._global_step = 0
        self._lr: float | None = None
        self._checked = False

    # -- the loop's events, to each training's own use --------------------------------
    def fetch_started(self) -> None:
        """The trainer starts fetching a batch."""

    def fetch_ended(self) -> None:
        """The trainer has the batch."""

    def batch_ended(self) -> None:
        """A batch ended, before its loss is read."""

    def user_started(self) -> None:
        """The trainer calls the user's code of the step (:data:`USER_ACTIONS`)."""

    def user_ended(self) -> None:
        """The user's code of the step returned to the trainer."""

    def after_batch(self, trainer: pl.Trainer, loss: float,
                    metrics: Mapping[str, float] | None) -> bool:
        """The batch's loss; ``metrics`` where its optimizer stepped. True: stop."""
        return False

    def close(self) -> None:
        """The training ended, or failed: leave nothing entered."""

    # -- Lightning's hooks ---------------------------------------------------------------
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._global_step = trainer.global_step

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                             batch: Batch, batch_idx: int) -> None:
        if not self._checked:
            self._checked = True
            check_global_batch(self.case, trainer, batch, self.label)

    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                                 optimizer: torch.optim.Optimizer) -> None:
        self._lr = float(optimizer.param_groups[0]["lr"])

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           outputs: UserValue, batch: Batch, batch_idx: int) -> None:
        self.batch_ended()
        with uncounted():  # the plugin's read of the loss: not the step's host sync
            loss = micro_loss(outputs, trainer, self.label)
        stepped = trainer.global_step > self._global_step
        self._global_step = trainer.global_step
        metrics = None
        if stepped:
            metrics = {"lr": self._lr} if self._lr is not None else {}
        if self.after_batch(trainer, loss, metrics):
            trainer.should_stop = True

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                     exception: BaseException) -> None:
        self.close()


def micro_loss(outputs: UserValue, trainer: pl.Trainer, label: str) -> float:
    """The loss ``training_step`` returned for this batch, as a float: Lightning hands
    ``on_train_batch_end`` its detached copy divided by ``accumulate_grad_batches``."""
    loss = outputs.get("loss") if isinstance(outputs, Mapping) else outputs
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        raise TaskError(f"{label}: training_step returned no loss the gate can read "
                        f"({type(outputs).__name__}): return the loss tensor, or a dict "
                        f"holding it under 'loss'")
    return float(loss.detach().float().item()) * trainer.accumulate_grad_batches


def per_device_batch(trainer: pl.Trainer, batch: Batch) -> int | None:
    """The batch one device trains on: the loader's ``batch_size``, else the leading
    dimension of the batch's first tensor."""
    size = getattr(trainer.train_dataloader, "batch_size", None)
    if isinstance(size, int):
        return size
    for _, leaf in leaves_with_paths(batch):
        if isinstance(leaf, torch.Tensor) and leaf.dim() > 0:
            return int(leaf.shape[0])
    return None


def check_global_batch(case: Case, trainer: pl.Trainer, batch: Batch, label: str) -> None:
    """The global batch (per device x ``accumulate_grad_batches`` x devices) must be the
    case's ``batch``; one :class:`TaskError` line naming both otherwise."""
    per_device = per_device_batch(trainer, batch)
    if per_device is None:
        return
    accumulate, world = int(trainer.accumulate_grad_batches), int(trainer.world_size)
    total = per_device * accumulate * world
    fits = case.batch % (accumulate * world) == 0
    if total != case.batch:
        raise TaskError(
            f"{label}: the global batch is {total} (the loader's batch {per_device} x "
            f"accumulate_grad_batches {accumulate} x {world} device(s)), but {case.id} "
            f"declares batch={case.batch}: make the loader's batch_size "
            f"{case.batch // (accumulate * world) if fits else '?'} (from "
            f"accelperf.case.batch), or the case's batch {total}")


class Measured(Clocked, Watch):
    """The measured training: a :class:`StepClock` stamps each optimizer step (and, through
    :class:`Clocked`, the parts of each)."""

    def __init__(self, case: Case, device: torch.device, label: str,
                 clock: StepClock) -> None:
        super().__init__(case, device, label)
        self.clock = clock

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        if self.clock.start():
            trainer.should_stop = True

    def after_batch(self, trainer: pl.Trainer, loss: float,
                    metrics: Mapping[str, float] | None) -> bool:
        return self.clock.after_batch(loss, metrics)


class Counting(CountedSteps, Watch):
    """The counting training (untimed, undone afterwards): what
    :class:`~.torch.counting.CountedSteps` counts (memory on the CPU, and one optimizer
    step's FLOPs and ops), driven from Lightning's hooks."""

    def __init__(self, case: Case, device: torch.device, label: str) -> None:
        Watch.__init__(self, case, device, label)
        CountedSteps.__init__(self, device, LIBRARIES)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        self.start(pl_module)

    def after_batch(self, trainer: pl.Trainer, loss: float,
                    metrics: Mapping[str, float] | None) -> bool:
        return metrics is not None and self.stepped()
