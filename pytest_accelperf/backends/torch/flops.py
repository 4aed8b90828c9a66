"""Counting the FLOPs of the in-process torch step, and what one call of it dispatched.

``FlopCounterMode`` (:func:`~.torch.task.flop_counter`, which also counts the CPU
flash-attention kernels) over one untimed call of the step on step 0's batch
(``TorchStep.count_step`` where given), undone afterwards (:func:`~.torch.step.undone`):
the optimizer, scheduler and scaler are not advanced by it; beside it the
:class:`~.torch.ops.OpCounter` counts every op of the same call (:func:`count_step`), what
the program record of an eager step is made of (:mod:`.torch.step_record`).
:func:`count_flops` counts a :class:`~.torch.task.TorchTask`'s forward and backward (the
neuron backend's lazy loop).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from pytest_accelperf.backends.torch.ops import OpCounter, OpCounts
from pytest_accelperf.backends.torch.step import TorchStep, metrics_of, run_step, undone
from pytest_accelperf.backends.torch.task import TorchTask, flop_counter
from pytest_accelperf.backends.types import Batch


def count_flops(model: torch.nn.Module, task: TorchTask, batch: Batch) -> float | None:
    """FLOPs of one forward + backward of ``batch`` (the optimizer's are not counted).

    Leaves ``model`` as it found it: gradients dropped, buffers (batch-norm statistics)
    restored, and the global RNG state restored (dropout draws nothing from training's).
    """
    buffers = {name: b.detach().clone() for name, b in model.named_buffers()}
    rng = torch.random.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    counter = flop_counter()
    try:
        with counter:
            task.loss_fn(model, batch).backward()  # type: ignore[no-untyped-call]
    finally:
        model.zero_grad(set_to_none=True)
        with torch.no_grad():
            for name, b in model.named_buffers():
                b.copy_(buffers[name])
        torch.random.set_rng_state(rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state_all(cuda_rng)
    flops = float(counter.get_total_flops())
    return flops if flops > 0 else None


@dataclass(frozen=True)
class StepCount:
    """What one counted call of the step did: its ``flops`` (None when none were counted)
    and ``ops``, what it dispatched (:meth:`.torch.ops.OpCounter.record`)."""

    flops: float | None
    ops: OpCounts


def count_step(step: TorchStep, batch: Batch, device: torch.device,
               stateful: Sequence[object] | None = None) -> StepCount:
    """FLOPs and dispatched ops of one call of the step (``count_step``, default
    ``step``) on ``batch`` (on ``device``), undone afterwards
    (:func:`~.torch.step.undone`, ``stateful`` as there): parameters, optimizer,
    scheduler, scaler and RNG as before, so the measured run is the same with or without
    it. ``FlopCounterMode`` counts matrix products and convolutions (forward and
    backward): the optimizer's elementwise update adds none. The :class:`OpCounter`
    beside it counts every op of the same call, the optimizer's included (entered first,
    it sees the ops FlopCounterMode decomposes into)."""
    ops, counter = OpCounter(device), flop_counter()
    with undone(step, stateful), ops, counter:
        metrics_of(step, run_step(step, batch, counting=True))
    flops = float(counter.get_total_flops())
    return StepCount(flops if flops > 0 else None, ops.record())


def count_step_flops(step: TorchStep, batch: Batch,
                     stateful: Sequence[object] | None = None) -> float | None:
    """FLOPs of one counted call of the step on ``batch`` (:func:`count_step`; the device
    only decides which ops are host syncs, which this drops)."""
    return count_step(step, batch, torch.device("cpu"), stateful).flops
