"""The ``lightning`` backend: a LightningModule trained by ``lightning.Trainer.fit``, as
written, measured from inside Lightning's own loop (:mod:`.lightning.callback`).

What it trains is a :class:`~.lightning.task.LightningTask`: the user's module, data and
``Trainer`` keyword arguments. Two trainings run, each a ``Trainer.fit`` of its own:

1. **counting** (untimed, then undone: the module's ``state_dict`` and the RNG put back,
   and the optimizer and scheduler made again by ``configure_optimizers``), as the torch
   backend's counting steps: on the CPU the live tensor bytes over the first optimizer
   steps (the memory check's peak and its growth per step, counted by the torch backend's
   ``MemTracker``), and over one optimizer step its FLOPs and what it dispatched: the ops
   by dtype, the bytes they move and the host syncs, the trainer's own included, each
   named at the user's line that made it (:class:`~.torch.ops.OpCounter`, Lightning's
   frames seen through): the program check's record;
2. **measured**: ``warmup + steps`` optimizer steps (``max_steps``), each stamped by a
   :class:`~pytest_accelperf.backends.measure.stamps.StepClock` (the device synchronized,
   the fetch of the data timed apart as ``input``, the drift probe after each), the loss
   ``training_step`` returned and the learning rate each step used.

Then the numerics fingerprint of what the trainer holds: the module's ``state_dict``,
and beside it the optimizer's step count, the scheduler's, the precision plugin's loss
scale and the trainer's global step. What the gate owns in both trainings it sets
(:data:`~.lightning.task.OWNED`, ``max_steps``, the accelerator and one device) and says
where the user's setting differed; nothing is left on disk (the trainer's root is a
temporary directory, no logger, no checkpoint).
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
import os
import tempfile

import lightning.pytorch as pl
import numpy as np
import torch

from pytest_accelperf.backends.lightning.callback import (
    Counting,
    Measured,
)
from pytest_accelperf.backends.lightning.fit import (
    Built,
    as_lightning_task,
    build,
    count,
    one_device,
    quiet,
    snapshot,
)
from pytest_accelperf.backends.lightning.task import LightningTask
from pytest_accelperf.backends.measure.stamps import StepClock
from pytest_accelperf.backends.protocol import Fit, Stepper, Task, TrainResult
from pytest_accelperf.backends.torch.memory import (
    MEMORY_STEPS,
)
from pytest_accelperf.backends.torch.on_device import _device
from pytest_accelperf.backends.torch.step import optimizer_steps
from pytest_accelperf.backends.torch.trainer_run import train_with
from pytest_accelperf.collect.cases import Case
from pytest_accelperf.errors import ConfigError
from pytest_accelperf.provision.accel import Accelerator

#: The plugin's own files: a note points at the first frame outside them.
_PLUGIN = os.path.dirname(os.path.dirname(os.path.dirname(__file__))) + os.sep
INSTALL = "pip install 'pytest-accelperf[lightning]'"


def state_beside(trainer: pl.Trainer) -> dict[str, np.ndarray]:
    """The training state the trainer holds beside the module's ``state_dict``: the
    optimizer's step count (the largest ``step`` in its per-parameter state), each
    scheduler's ``last_epoch``, the precision plugin's loss scale, the global step."""
    out = optimizer_steps(trainer.optimizers)
    configs = trainer.lr_scheduler_configs
    for i, config in enumerate(configs):
        epoch = getattr(config.scheduler, "last_epoch", None)
        if isinstance(epoch, int):
            name = "scheduler" if len(configs) == 1 else f"scheduler{i}"
            out[f"{name}/last_epoch"] = np.asarray(epoch, dtype=np.float32)
    scaler = getattr(trainer.precision_plugin, "scaler", None)
    if isinstance(scaler, torch.amp.GradScaler) and scaler.is_enabled():
        out["scaler/scale"] = np.asarray(scaler.get_scale(), dtype=np.float32)
    out["trainer/global_step"] = np.asarray(trainer.global_step, dtype=np.float32)
    return out


class LightningBackend:
    """Trains a :class:`LightningTask` with ``lightning.Trainer.fit`` in this process, on
    the CPU or one CUDA device."""

    name = "lightning"

    def unavailable_reason(self) -> str | None:
        missing = [p for p in ("torch", "lightning") if importlib.util.find_spec(p) is None]
        if missing:
            return f"backend 'lightning' needs {', '.join(missing)}: {INSTALL}"
        return None

    def fits(self, case: Case, task: Task, accel: Accelerator, *,
             timeout: float | None = None) -> Fit:
        """CPU: the counted peak of the counting training against ``memory_capacity``."""
        device = _device(accel)
        if device.type != "cpu" or not case.memory_capacity:
            raise ConfigError(f"{case.id}: the lightning backend searches a maximum batch on "
                              f"the CPU against the case's memory_capacity only")
        built = build(as_lightning_task(task), case, device)
        counting = Counting(case, device, built.label)
        with tempfile.TemporaryDirectory(prefix="accelperf-lightning-") as root, quiet():
            built.fit(MEMORY_STEPS, counting, root)
        return Fit(counting.peak <= case.memory_capacity, counting.peak,
                   int(case.memory_capacity), "mem_tracker peak")

    def train(self, case: Case, task: Task, accel: Accelerator, *,
              timeout: float | None = None) -> TrainResult:
        lightning_task = as_lightning_task(task)
        one_device(case)
        return train_with(lambda device: LightningParts(lightning_task, case, device),
                          case, accel, timeout, prefix="accelperf-lightning-")

    def stepper(self, case: Case, task: Task, accel: Accelerator) -> Stepper:
        """The case's ``Trainer.fit`` held between optimizer steps, for A/B mode
        (:class:`~.lightning.stepper.LightningStepper`)."""
        from pytest_accelperf.backends.lightning.stepper import LightningStepper

        return LightningStepper(case, task, accel)


class LightningParts:
    """A case's ``Trainer.fit`` for :func:`~.torch.trainer_run.train_with`."""

    why = "a callback or the module set trainer.should_stop, or the data ended"

    def __init__(self, task: LightningTask, case: Case, device: torch.device) -> None:
        self.task, self.case, self.device = task, case, device
        self.built = build(task, case, device)
        self.notes, self.who = self.built.notes, f"{self.built.label}: Lightning"
        self.saved = snapshot(self.built.module)
        self.seed = task.seed_for(case)
        self.trainer: pl.Trainer | None = None

    def quiet(self) -> contextlib.AbstractContextManager[None]:
        return quiet()

    def count(self, root: str, *, memory: bool) -> Counting:
        return count(self.built, self.task, self.case, self.device, root, memory=memory,
                     saved=self.saved)

    def measure(self, steps: int, clock: StepClock, root: str) -> None:
        measured = Measured(self.case, self.device, self.built.label, clock)
        pl.seed_everything(self.seed, workers=True, verbose=False)
        self.trainer = self.built.fit(steps, measured, root)

    def model(self) -> torch.nn.Module:
        return self.built.module

    def _trained(self) -> pl.Trainer:
        assert self.trainer is not None, "measure() first"
        return self.trainer

    def epochs_note(self) -> str | None:
        return _epochs_note(self._trained(), self.case, self.built)

    def beside(self) -> dict[str, np.ndarray]:
        return state_beside(self._trained())

    def tokens_per_sample(self) -> int | None:
        return None


def _epochs_note(trainer: pl.Trainer, case: Case, built: Built) -> str | None:
    """A line where the data held fewer batches than the run trained: Lightning began a
    new epoch (the loader iterated again) after each pass."""
    per_epoch = trainer.num_training_batches
    needed = (case.warmup + case.steps) * int(trainer.accumulate_grad_batches)
    if not isinstance(per_epoch, int | float) or math.isinf(per_epoch) or per_epoch >= needed:
        return None
    return (f"LightningTask.data holds {int(per_epoch)} batch(es) an epoch, the case "
            f"{needed} (warm-up + steps x accumulate_grad_batches): Lightning began a new "
            f"epoch after each {int(per_epoch)} (the loader iterated again, its end-of-epoch "
            f"work inside the step that followed)")


BACKEND = LightningBackend()
