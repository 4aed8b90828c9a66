"""The in-process torch backend's A/B stepper: a case's step on its device, trained on
demand in blocks of steps (:mod:`pytest_accelperf.ab`), what
:meth:`TorchBackend.stepper <pytest_accelperf.backends.torch.backend.TorchBackend.stepper>`
returns, on the shared :class:`~pytest_accelperf.backends.measure.stepper.BlockStepper`.
"""

from __future__ import annotations

import torch

from pytest_accelperf.backends.measure.data import expect
from pytest_accelperf.backends.measure.stepper import BlockStepper
from pytest_accelperf.backends.protocol import Task
from pytest_accelperf.backends.torch.flops import count_step
from pytest_accelperf.backends.torch.on_device import _device, _step_fns
from pytest_accelperf.backends.torch.step import (
    as_torch_step,
    float_metrics,
    rewind,
    step_stateful,
)
from pytest_accelperf.backends.torch.step_record import eager_program
from pytest_accelperf.backends.torch.task import to_device
from pytest_accelperf.backends.types import Batch, UserValue
from pytest_accelperf.collect.cases import Case
from pytest_accelperf.errors import ConfigError
from pytest_accelperf.provision.accel import Accelerator
from pytest_accelperf.records.program import ProgramRecord


class TorchStepper(BlockStepper[Batch, UserValue]):
    """A case's step on its device, trained on demand in blocks of steps (the A/B
    comparison of :mod:`pytest_accelperf.ab`), timed as in a run
    (:class:`.measure.stepper.BlockStepper`). ``program`` is an eager step's program
    record, counted as a run counts it (one call of the step on step 0's batch, undone)
    before the first block; None for a compiled step (its record needs dynamo's
    accounting over a run)."""

    def __init__(self, case: Case, task: Task, accel: Accelerator) -> None:
        if case.world_size > 1 or case.n_devices != 1:
            raise ConfigError(f"{case.id}: A/B comparison runs single-process torch cases "
                             f"only")
        device = _device(accel)
        self._step_fn = as_torch_step(task, device)
        self._step_fn.to(device)
        expect(self._step_fn.make_batch, case.warmup + case.steps)
        rewind(self._step_fn)
        self._program: ProgramRecord | None = None
        if not self._step_fn.compile:
            counted = count_step(self._step_fn, to_device(self._step_fn.make_batch(0), device),
                                 device, step_stateful(self._step_fn))
            self._program = eager_program(counted.flops, counted.ops)
        super().__init__(_step_fns(self._step_fn, device), case.warmup + case.steps)
        torch.manual_seed(self._step_fn.seed)
        if self._step_fn.compile:
            self.run(1)  # compiles

    @property
    def program(self) -> ProgramRecord | None:
        return self._program

    def after_block(self, last: UserValue) -> None:
        float_metrics(self._step_fn, last)  # the last step's outputs, as a run reads them
