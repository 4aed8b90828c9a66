"""How the torch trainers that own their loop (Lightning, transformers' ``Trainer``) train
a case, written once for both (:func:`train_with`): the counting training and what it
counted (memory on the CPU, one optimizer step's FLOPs and ops), then the measured
training and after it the device's peak, the loop's figures, the trained state's
fingerprint, the gate's notes and how the training ended. What differs between the two
(how a trainer is made, run, quietened and read) is a :class:`TrainerParts`.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from typing import Protocol

import numpy as np
import torch

from pytest_accelperf.backends.measure.common import Phases, fingerprint, with_state
from pytest_accelperf.backends.measure.loop import LoopResult
from pytest_accelperf.backends.measure.notes import say
from pytest_accelperf.backends.measure.probe import Probe
from pytest_accelperf.backends.measure.recording import RunBuilder, deadline_after
from pytest_accelperf.backends.measure.stamps import StepClock
from pytest_accelperf.backends.protocol import TrainResult
from pytest_accelperf.backends.torch.backend import PROBE_N
from pytest_accelperf.backends.torch.counting import CountedSteps
from pytest_accelperf.backends.torch.memory import (
    _oom_message,
    _oom_record,
    cpu_memory_growth,
    fresh_peak,
)
from pytest_accelperf.backends.torch.on_device import _device
from pytest_accelperf.backends.torch.step import host_array
from pytest_accelperf.backends.torch.step_record import eager_program
from pytest_accelperf.backends.torch.task import sync, torch_probe
from pytest_accelperf.collect.cases import Case
from pytest_accelperf.provision.accel import Accelerator


class TrainerParts(Protocol):
    """What one trainer does its own way, for :func:`train_with`: one case's task made for
    a device, its trainings and what the trained trainer holds."""

    #: One line for each user setting the gate replaced; an epoch's note is added to it.
    notes: list[str]
    #: Who stops a training early, and why it may have (:meth:`RunBuilder.stopped`).
    who: str
    why: str

    def quiet(self) -> AbstractContextManager[None]:
        """The trainer's own info lines and advice silenced (not the user's warnings)."""
        ...

    def count(self, root: str, *, memory: bool) -> CountedSteps:
        """The counting training in ``root`` (the CPU's live bytes where ``memory``), then
        undone."""
        ...

    def measure(self, steps: int, clock: StepClock, root: str) -> None:
        """The measured training of ``steps`` optimizer steps in ``root``, each stamped by
        ``clock``."""
        ...

    def model(self) -> torch.nn.Module:
        """The trained model (the one the counting left, made again where the task makes
        it)."""
        ...

    def epochs_note(self) -> str | None:
        """A line where the data held fewer batches than the measured training took."""
        ...

    def beside(self) -> dict[str, np.ndarray]:
        """The training state the trainer holds beside the model's ``state_dict``."""
        ...

    def tokens_per_sample(self) -> int | None:
        """Tokens per sample, where the measured training found them."""
        ...


def train_with(make: Callable[[torch.device], TrainerParts], case: Case, accel: Accelerator,
               timeout: float | None, *, prefix: str) -> TrainResult:
    """Train ``case`` through the trainer ``make`` makes for the session's device: the
    counting training (its memory on the CPU, one step's FLOPs and ops; an ``oom`` run
    where the peak exceeds the case's capacity), then the measured one, each in a temporary
    directory (``prefix``) removed after."""
    deadline = deadline_after(timeout)
    phases = Phases()
    device = _device(accel)
    label = f"{device.type}:{device.index or 0}"
    fresh_peak(device)  # the cases before this one freed: not in its peak
    with phases("build"):
        parts = make(device)
    say(parts.notes)
    draft = RunBuilder.for_case(case, accel.peak_flops, n_devices=1)
    with tempfile.TemporaryDirectory(prefix=prefix) as root, parts.quiet():
        # 1. counting: memory on the CPU, and one step's FLOPs and ops (then undone)
        with phases("memory"):
            counting = parts.count(root, memory=device.type == "cpu")
        if record_counted(draft, counting, label, case):  # over the case's capacity
            draft.phases(phases.record())
            return TrainResult(run=draft.build(), notes=parts.notes)
        # 2. measured
        with phases("probe"):
            probe = torch_probe(device, n=PROBE_N)
        clock = StepClock(warmup=case.warmup, steps=case.steps,
                          sync=lambda: sync(device), probe=probe, deadline=deadline)
        if device.type == "cuda":  # only a GPU's peak is of the measured training
            fresh_peak(device)  # the counting training freed: not in the measured peak
        try:
            with phases("train"):
                parts.measure(case.warmup + case.steps, clock, root)
        except torch.OutOfMemoryError as exc:
            draft.failed("oom", f"out of memory: {str(exc).splitlines()[0]}")
            draft.phases(phases.record())
            return TrainResult(run=draft.build(), notes=parts.notes)
        trained = clock.finish()
        extra = parts.epochs_note()
    if extra:
        say([extra])
        parts.notes.append(extra)
    tokens = parts.tokens_per_sample()
    if tokens:
        draft.tokens(case.batch * tokens)
    params = record_trained(
        draft, device=device, label=label, trained=trained, probe=probe, model=parts.model(),
        beside=parts.beside(), notes=parts.notes, case=case, timeout=timeout, who=parts.who,
        why=parts.why, phases=phases)
    return TrainResult(run=draft.build(), params=params, state=parts.model(),
                       notes=parts.notes)


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
