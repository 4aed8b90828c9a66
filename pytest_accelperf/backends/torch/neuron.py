"""The Neuron backend: a :class:`~pytest_accelperf.backends.torch.task.TorchTask` trained on a
Trainium/Inferentia NeuronCore through torch-xla (torch-neuronx).

XLA devices are lazy: a step records a graph, ``xm.mark_step()`` (``torch_xla.sync()`` in
torch-xla >= 2.5) cuts it and hands it to the runtime, and ``xm.wait_device_ops()`` blocks
until the device has finished. The first executions of a new graph compile it with
neuronx-cc (minutes for a large model; ``neuron_parallel_compile`` exists to do this ahead
of time). So, as ``neuron_parallel_compile`` would, the first ``max(warmup, 2)`` steps are a
warm-up timed apart as ``compile_time`` (step 0 compiles forward+backward, step 1 the step
with optimizer state), and each measured step is timed from before the step to after
``mark_step`` + ``wait``. A measured step that compiled again (the runtime's compile
counter moved: a dynamic shape, a Python branch on a tensor) is recorded in
``run.details["recompiles"]``: its time is not a steady-state step.

Everything above the device is :func:`train_lazy`, which takes a :class:`LazyDevice`
adapter (``device``, ``mark_step``, ``wait``, ``memory``, ``compile_count``). The backend
builds the torch-xla one (:func:`xla_device`); the plugin's tests drive the same loop with a
CPU adapter, since no NeuronCore exists there.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from pytest_accelperf.backends.measure.common import fingerprint
from pytest_accelperf.backends.measure.loop import LoopResult, StepFns, run_steps
from pytest_accelperf.backends.measure.recording import RunBuilder, deadline_after
from pytest_accelperf.backends.protocol import Fit, TrainResult
from pytest_accelperf.backends.torch.flops import count_flops
from pytest_accelperf.backends.torch.task import TorchTask, as_tensors, to_device
from pytest_accelperf.backends.types import Batch
from pytest_accelperf.collect.cases import Case
from pytest_accelperf.errors import ConfigError
from pytest_accelperf.provision.accel import Accelerator
from pytest_accelperf.records.run import Run

#: Warm-up steps at least: step 0 compiles forward+backward, step 1 the optimizer's update
#: with its state allocated (a second graph on XLA).
MIN_WARMUP = 2
INSTALL = ("pip install torch-neuronx --extra-index-url https://pip.repos.neuron.amazonaws.com")


class LazyDevice(Protocol):
    """What the training loop needs of a lazy (XLA) device."""

    kind: str
    device: torch.device

    def mark_step(self) -> None:
        """Cut the recorded graph and launch it (``xm.mark_step``/``torch_xla.sync``)."""

    def wait(self) -> None:
        """Block until the device has finished all launched work."""

    def memory(self) -> dict[str, int]:
        """Peak (or in-use) bytes per device label; empty when the runtime has no counter."""

    def compile_count(self) -> int | None:
        """Graphs compiled so far in this process, or None when unknown."""


@dataclass
class XlaDevice:
    """The torch-xla adapter (torch-neuronx's device)."""

    xm: Any
    metrics: Any
    device: torch.device
    sync: Any = None
    kind: str = "xla"

    def mark_step(self) -> None:
        if self.sync is not None:
            self.sync()
        else:
            self.xm.mark_step()

    def wait(self) -> None:
        self.xm.wait_device_ops()

    def memory(self) -> dict[str, int]:
        try:
            info = self.xm.get_memory_info(self.device)
        except (RuntimeError, AttributeError):
            return {}
        label = str(self.device)
        for key in ("peak_bytes_used", "bytes_used"):
            if key in info:
                return {label: int(info[key])}
        if "kb_total" in info and "kb_free" in info:
            return {label: int(info["kb_total"] - info["kb_free"]) * 1024}
        return {}

    def compile_count(self) -> int | None:
        data = self.metrics.metric_data("CompileTime")
        return int(data[0]) if data else 0


def xla_device() -> XlaDevice:
    """The adapter over ``torch_xla`` on this host's NeuronCore (imports torch-neuronx)."""
    importlib.import_module("torch_neuronx")  # registers the Neuron PJRT plugin
    torch_xla = importlib.import_module("torch_xla")
    xm = importlib.import_module("torch_xla.core.xla_model")
    metrics = importlib.import_module("torch_xla.debug.metrics")
    device = torch_xla.device() if hasattr(torch_xla, "device") else xm.xla_device()
    return XlaDevice(xm=xm, metrics=metrics, device=device, sync=getattr(torch_xla, "sync", None))


def _build(task: TorchTask, device: torch.device) -> torch.nn.Module:
    torch.manual_seed(task.seed)
    return task.make_model().to(device)


def _step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, task: TorchTask,
          batch: Batch) -> torch.Tensor:
    """One training step; returns the loss tensor (not synchronized)."""
    optimizer.zero_grad(set_to_none=True)
    loss = task.loss_fn(model, batch)
    loss.backward()  # type: ignore[no-untyped-call]  # untyped in torch
    if task.grad_clip is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), task.grad_clip)
    optimizer.step()
    return loss


def _loop(model: torch.nn.Module, case: Case, task: TorchTask, dev: LazyDevice,
          deadline: float | None) -> tuple[LoopResult, list[int]]:
    """Warm-up and measured steps in the measured-step loop (:func:`.loop.run_steps`): the
    result and the measured steps that compiled again."""
    optimizer = task.make_optimizer(model.parameters())
    compiles: dict[str, int | None] = {"before": None}
    recompiles: list[int] = []

    def prepare(i: int) -> Batch:
        batch = to_device(task.make_batch(i), dev.device)
        dev.mark_step()  # the host->device copy is its own graph, outside the timer
        dev.wait()
        compiles["before"] = dev.compile_count()
        return batch

    def sync() -> None:
        dev.mark_step()
        dev.wait()

    def after_step(i: int, loss: torch.Tensor, measured: bool) -> None:
        before, after = compiles["before"], dev.compile_count()
        if measured and before is not None and after is not None and after > before:
            recompiles.append(i)

    fns: StepFns[Any, torch.Tensor] = StepFns(
        prepare=prepare, run=lambda i, batch: _step(model, optimizer, task, batch),
        # materialized by mark_step: no extra graph
        read=lambda loss: (float(loss.item()), {}), sync=sync, sync_before=False)
    trained = run_steps(fns, warmup=max(case.warmup, MIN_WARMUP), steps=case.steps,
                        deadline=deadline, after_step=after_step)
    return trained, recompiles


def train_lazy(case: Case, task: TorchTask, dev: LazyDevice, *, peak_flops: float | None = None,
               timeout: float | None = None) -> TrainResult:
    """Train ``task`` as ``case`` on the lazy device ``dev`` and measure it (see the module
    docstring): warm-up timed apart as compile, every step marked and waited for."""
    if task.compile:
        raise ConfigError(f"{case.id}: torch.compile does not apply on an XLA device (the graph "
                         f"is already compiled by XLA): set compile=False")
    if case.n_devices != 1 or case.reference:
        raise ConfigError(f"{case.id}: the neuron backend trains on one NeuronCore; drop the "
                         f"mesh, world_size and reference")
    deadline = deadline_after(timeout)
    draft = RunBuilder.for_case(case, peak_flops, n_devices=1,
                                tokens_per_sample=task.tokens_per_sample)
    cpu_model = _build(task, torch.device("cpu"))
    # FLOPs are the model's, not the device's: counted once on the host, untimed.
    draft.counted(flops=count_flops(cpu_model, task, as_tensors(task.make_batch(0))))
    model = cpu_model.to(dev.device)
    torch.manual_seed(task.seed)
    trained, recompiles = _loop(model, case, task, dev, deadline)
    draft.compiled(math.fsum(trained.warmup_times) if trained.warmup_times else None)
    draft.loop(trained)
    draft.warmup_step_times(trained.warmup_times)
    draft.detail(device=dev.kind)
    if recompiles:
        draft.detail(recompiles=recompiles)
    memory = dev.memory()
    if memory:
        draft.memory(memory, f"{dev.kind}_runtime")
    params: dict[str, np.ndarray] = {
        name: p.detach().cpu().numpy() for name, p in model.named_parameters()}
    draft.fingerprint(fingerprint(params))
    draft.end(trained, timeout, case)  # a loss not finite, or the deadline
    return TrainResult(run=draft.build(), params=params)


def _is_oom(exc: BaseException) -> bool:
    text = str(exc)
    return "RESOURCE_EXHAUSTED" in text or "out of memory" in text.lower()


class NeuronBackend:
    """Trains a :class:`TorchTask` on one NeuronCore through torch-xla."""

    name = "neuron"

    def unavailable_reason(self) -> str | None:
        missing = [m for m in ("torch_xla", "torch_neuronx")
                   if importlib.util.find_spec(m) is None]
        return f"the neuron backend needs {', '.join(missing)}: {INSTALL}" if missing else None

    def train(self, case: Case, task: TorchTask, accel: Accelerator, *,
              timeout: float | None = None) -> TrainResult:
        try:
            return train_lazy(case, task, xla_device(), peak_flops=accel.peak_flops,
                              timeout=timeout)
        except RuntimeError as exc:
            if not _is_oom(exc):
                raise
            run = Run(case_id=case.id, samples_per_step=case.batch, outcome="oom",
                      message=f"out of memory: {str(exc).splitlines()[0]}")
            return TrainResult(run=run)

    def fits(self, case: Case, task: TorchTask, accel: Accelerator, *,
             timeout: float | None = None) -> Fit:
        """Two real steps on the NeuronCore; a RESOURCE_EXHAUSTED does not fit."""
        small = Case(backend=case.backend, batch=case.batch, steps=1, warmup=1,
                     params=case.params)
        try:
            result = train_lazy(small, task, xla_device(), timeout=timeout)
        except RuntimeError as exc:
            if _is_oom(exc):
                return Fit(False, None, case.memory_capacity, str(exc).splitlines()[0])
            raise
        peak = result.run.peak_memory
        capacity = case.memory_capacity
        return Fit(capacity is None or peak is None or peak <= capacity, peak, capacity,
                   "neuron runtime memory")


BACKEND = NeuronBackend()
