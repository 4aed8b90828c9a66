"""What the torch trainers that own their loop (Lightning, transformers' ``Trainer``)
record around it, written once for both: what the counting training counted (memory on
the CPU, one optimizer step's FLOPs and ops) before the measured training, and after it
the device's peak, the loop's figures, the trained state's fingerprint, the gate's notes
and how the training ended.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch

from pytest_accelperf.backends.measure.common import Phases, fingerprint, with_state
from pytest_accelperf.backends.measure.loop import LoopResult
from pytest_accelperf.backends.measure.probe import Probe
from pytest_accelperf.backends.measure.recording import RunBuilder
from pytest_accelperf.backends.torch.counting import CountedSteps
from pytest_accelperf.backends.torch.memory import _oom_message, _oom_record, cpu_memory_growth
from pytest_accelperf.backends.torch.step import host_array
from pytest_accelperf.backends.torch.step_record import eager_program
from pytest_accelperf.collect.cases import Case


def record_counted(draft: RunBuilder, counting: CountedSteps, label: str, case: Case) -> bool:
    """What the counting training counted, into ``draft``: the CPU's peak and growth of
    live bytes (where it counted them) and the counted step's FLOPs and program. True
    where the peak exceeds the case's ``memory_capacity``: the run is then an ``oom``,
    never trained."""
    memory = counting.memory()
    if memory is not None:
        draft.memory({label: memory.peak}, memory.source)
        draft.memory_growth(cpu_memory_growth(memory))
        capacity = case.memory_capacity
        if capacity and memory.peak > capacity:
            oom = _oom_record(memory.peak, int(capacity), memory.source)
            draft.failed("oom", _oom_message(oom), oom=oom)
            return True
    draft.counted(flops=counting.flops, program=eager_program(counting.flops, counting.ops))
    return False


def record_trained(draft: RunBuilder, *, device: torch.device, label: str,
                   trained: LoopResult, probe: Probe, model: torch.nn.Module,
                   beside: Mapping[str, np.ndarray], notes: list[str], case: Case,
                   timeout: float | None, who: str, why: str,
                   phases: Phases) -> dict[str, np.ndarray]:
    """What the measured training gave, into ``draft``: the CUDA allocator's peak (on a
    GPU), the loop's figures, the fingerprint of ``model``'s state dict with the trainer's
    state ``beside`` it (optimizer, scheduler, scaler, global step), the gate's ``notes``,
    and how it ended (:meth:`RunBuilder.stopped`: ``who`` stopped early and ``why`` it may
    have); the phases last. Returns the fingerprinted parameters and state."""
    if device.type == "cuda":
        draft.memory({label: int(torch.cuda.max_memory_allocated(device))}, "cuda_allocator")
    draft.loop(trained, probe)
    with phases("fingerprint"):
        own = {k: host_array(v) for k, v in model.state_dict().items()
               if isinstance(v, torch.Tensor)}
        params, state_names = with_state(own, dict(beside))
        draft.fingerprint(fingerprint(params, state_names))
    if notes:
        draft.detail(notes=list(notes))
    draft.stopped(trained, timeout, case, who, why)
    draft.phases(phases.record())
    return params
