"""The in-process torch step on its device: which device an accelerator is
(:func:`_device`: the CPU or CUDA device 0), and the user's step as the measured-step loop
(:mod:`pytest_accelperf.backends.measure.loop`) runs it there (:func:`_step_fns`). The
torch backend's run (:mod:`.torch.backend`) and its A/B stepper (:mod:`.torch.stepper`)
share them.
"""

from __future__ import annotations

import torch

from pytest_accelperf.backends.measure.loop import StepFns
from pytest_accelperf.backends.torch.step import TorchStep, float_metrics
from pytest_accelperf.backends.torch.task import as_tensors, sync, to_device
from pytest_accelperf.backends.types import Batch, UserValue
from pytest_accelperf.errors import ConfigError
from pytest_accelperf.provision.accel import Accelerator


def _device(accel: Accelerator) -> torch.device:
    if accel.name == "cpu":
        return torch.device("cpu")
    if accel.name == "gpu":
        if not torch.cuda.is_available():
            raise RuntimeError(
                "--accel=gpu but torch sees no CUDA device (torch.cuda.is_available() is "
                f"False; torch {torch.__version__}): install a CUDA build of torch")
        return torch.device("cuda", 0)
    raise ConfigError(f"the torch backend runs on cpu or gpu, not {accel.name!r}: "
                     f"declare the case with accels=('cpu', 'gpu')")


def _step_fns(step: TorchStep, device: torch.device) -> StepFns[Batch, UserValue]:
    """The user's step as the measured-step loop runs it (:mod:`.loop`): the batch moved
    outside the timer, the device synchronized, the metrics read after the timer (on the
    CPU the step is already done)."""

    def read(raw: UserValue) -> tuple[float, dict[str, float]]:
        values = float_metrics(step, raw)
        return values.pop(step.loss), values

    return StepFns(prepare=lambda i: to_device(step.make_batch(i), device),
                   run=lambda i, batch: step.step(batch), read=read,
                   sync=lambda: sync(device),
                   # The user's data work and the conversion (the step's input time), then
                   # the move, apart (:mod:`.loop`).
                   host=lambda i: as_tensors(step.make_batch(i)),
                   put=lambda i, host: to_device(host, device))
