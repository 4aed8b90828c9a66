"""The ``lightning`` backend's A/B stepper: a LightningModule's ``Trainer.fit`` held at its
optimizer steps (:class:`~pytest_accelperf.backends.measure.held.HeldLoop`), what
:meth:`LightningBackend.stepper <.lightning.backend.LightningBackend.stepper>` returns.

Built as a run builds it (the same module, data and trainer settings, the same seed), its
program record counted as a run counts it (one counting training of
:data:`~.lightning.callback.COUNTED_STEP` + 1 steps, then undone), then one ``Trainer.fit``
started in a thread of its own and held before each optimizer step until A/B mode asks for
a block. Its temporary root (the trainer's ``default_root_dir``) is removed at
:meth:`close`.
"""

from __future__ import annotations

import shutil
import tempfile

import lightning.pytorch as pl

from pytest_accelperf.backends.lightning.callback import Measured
from pytest_accelperf.backends.lightning.fit import (
    as_lightning_task,
    build,
    count,
    one_device,
    quiet,
)
from pytest_accelperf.backends.measure.held import HELD_STEPS, HeldLoop, HeldStepper
from pytest_accelperf.backends.protocol import Task
from pytest_accelperf.backends.torch.on_device import _device
from pytest_accelperf.backends.torch.step_record import eager_program
from pytest_accelperf.backends.torch.task import sync
from pytest_accelperf.collect.cases import Case
from pytest_accelperf.provision.accel import Accelerator


class LightningStepper(HeldStepper):
    """A case's ``Trainer.fit``, held between optimizer steps: :meth:`run` trains ``n``
    more and gives their times (see the module docstring)."""

    def __init__(self, case: Case, task: Task, accel: Accelerator) -> None:
        one_device(case)
        lightning_task = as_lightning_task(task)
        device = _device(accel)
        built = build(lightning_task, case, device)
        root = self._root = tempfile.mkdtemp(prefix="accelperf-lightning-")
        try:
            with quiet():
                counted = count(built, lightning_task, case, device, root,
                                memory=False)
            self._program = eager_program(counted.flops, counted.ops)
            self._held = HeldLoop(built.label)
            measured = Measured(case, device, built.label,
                                self._held.clock(lambda: sync(device)))
            pl.seed_everything(lightning_task.seed_for(case), workers=True, verbose=False)

            def fit() -> None:
                with quiet():
                    built.fit(HELD_STEPS, measured, root)

            self._held.start(fit)
        except BaseException:
            shutil.rmtree(root, ignore_errors=True)
            raise
