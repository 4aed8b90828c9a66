"""The ``hf`` backend: a model trained by transformers' ``Trainer.train``, as written,
measured from inside the trainer's own loop (:mod:`.hf.callback`).

What it trains is a :class:`~.hf.task.TrainerTask`: the user's model, ``TrainingArguments``,
dataset and collator. Two trainings run, each a ``Trainer`` of its own (so the optimizer
and scheduler are made afresh by the trainer, as in production):

1. **counting** (untimed, then undone: the model's ``state_dict`` put back, or the model
   made again where the task makes it): on the CPU the live tensor bytes over the first
   optimizer steps (the memory check's peak and its growth per step, ``MemTracker``), and
   over one optimizer step its FLOPs and what it dispatched: ops by dtype, bytes, host
   syncs, the trainer's own included, each named at the line that made it
   (:class:`~.torch.counting.CountedSteps`);
2. **measured**: ``warmup + steps`` optimizer steps (``max_steps``), each stamped by a
   :class:`~pytest_accelperf.backends.measure.stamps.StepClock` (the device synchronized,
   the fetch of the step's micro-batches timed apart as ``input``, the drift probe after
   each), the loss the trainer computed and the learning rate each step used.

Then the numerics fingerprint of what the trainer holds: the model's ``state_dict``, and
beside it the optimizer's step count, the scheduler's ``last_epoch``, the GradScaler's
scale and the trainer's global step. What the gate owns it sets
(:data:`~.hf.task.OWNED`, ``max_steps``, ``output_dir``, the device) and says where the
user's setting differed; nothing is left on disk (``output_dir`` is a temporary
directory, no checkpoint, no logger).
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import functools
import importlib.util
import logging
import math
import shutil
import tempfile
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import transformers
from transformers import PrinterCallback, Trainer, TrainingArguments

from pytest_accelperf.backends.hf.callback import Counting, Measured, Watch, instrument
from pytest_accelperf.backends.hf.task import OWNED, TrainerTask
from pytest_accelperf.backends.measure.common import (
    TaskError,
    describe,
    task_of,
)
from pytest_accelperf.backends.measure.held import HELD_STEPS, HeldLoop, HeldStepper
from pytest_accelperf.backends.measure.stamps import StepClock
from pytest_accelperf.backends.protocol import Fit, Stepper, Task, TrainResult
from pytest_accelperf.backends.torch.counting import COUNTED_STEP
from pytest_accelperf.backends.torch.launched import one_device as trainer_one_device
from pytest_accelperf.backends.torch.memory import (
    GROWTH_STEPS,
    MEMORY_STEPS,
)
from pytest_accelperf.backends.torch.on_device import _device
from pytest_accelperf.backends.torch.step import optimizer_steps
from pytest_accelperf.backends.torch.step_record import eager_program
from pytest_accelperf.backends.torch.task import sync
from pytest_accelperf.backends.torch.trainer_run import train_with
from pytest_accelperf.backends.types import FrameworkKwargs
from pytest_accelperf.collect.cases import Case
from pytest_accelperf.errors import ConfigError
from pytest_accelperf.provision.accel import Accelerator

INSTALL = "pip install 'pytest-accelperf[hf]'"
#: What a note shows for the gate's ``output_dir``.
_TEMPORARY = "a temporary directory"


def as_trainer_task(task: Task) -> TrainerTask:
    return task_of(task, TrainerTask, "hf")


@dataclass
class Built:
    """The task made for one case: its model, dataset, label, and the training arguments
    with what the gate owns set, and one line for each user setting it replaced."""

    task: TrainerTask
    model: torch.nn.Module
    dataset: object
    args: TrainingArguments
    label: str
    notes: list[str] = field(default_factory=list)

    def train(self, max_steps: int, watch: Watch, root: str) -> Trainer:
        """One ``Trainer.train`` of ``max_steps`` optimizer steps, ``watch`` inside it."""
        args = dataclasses.replace(self.args, output_dir=root, max_steps=max_steps)
        cls = self.task.trainer_class or Trainer
        if not (isinstance(cls, type) and issubclass(cls, Trainer)):
            raise TaskError(f"TrainerTask.trainer_class must be transformers.Trainer or a "
                            f"subclass; got {describe(cls)}")
        callbacks: list[Any] = [*self.task.callbacks, watch]
        trainer = cls(model=self.model, args=args, train_dataset=self.dataset,
                      callbacks=callbacks, **self.task.trainer_kwargs())
        trainer.remove_callback(PrinterCallback)  # the gate's progress line reports steps
        instrument(trainer, watch)
        try:
            trainer.train()
        finally:
            watch.close()
        return trainer


def _model(task: TrainerTask, case: Case) -> torch.nn.Module:
    model = task.built(task.model, case, (torch.nn.Module,))
    if not isinstance(model, torch.nn.Module):
        raise TaskError(f"TrainerTask.model must be a model (a torch.nn.Module, such as "
                        f"AutoModelForCausalLM.from_config(config)) or a function of the case "
                        f"that returns one; got {type(model).__name__}")
    return model


def _named(cls: type) -> str:
    """A model's class: transformers' own by its version, the user's by its file."""
    if cls.__module__.startswith("transformers."):
        return f"{cls.__name__} (transformers {transformers.__version__})"
    return describe(cls)


@functools.cache
def _defaults() -> TrainingArguments:
    """``TrainingArguments()`` as transformers fills it in: what a field is when the user
    did not set it."""
    return TrainingArguments()


def _value(name: str, value: object) -> object:
    """A field's value in a form two can be compared in (``report_to`` is a list once
    ``TrainingArguments`` has read it; ``"none"`` and ``[]`` say the same)."""
    if isinstance(value, enum.Enum):  # SaveStrategy.EPOCH: what the user wrote, "epoch"
        return value.value
    if name == "report_to":
        listed = [value] if isinstance(value, str) else value if isinstance(value, list) else []
        return sorted(str(v) for v in listed if str(v) != "none")
    return value


def training_args(given: object, case: Case, device: torch.device,
                  seed: int | None) -> tuple[TrainingArguments, list[str]]:
    """The ``TrainingArguments`` of a measured run: ``given`` with what the gate owns set,
    and a line for each of the user's settings that differed (a dict's keys as given; a
    ``TrainingArguments``'s fields where they differ from transformers' default)."""
    if given is None:
        given = {}
    if not isinstance(given, TrainingArguments | Mapping):
        raise TaskError(f"TrainerTask.args holds transformers.TrainingArguments, a dict of "
                        f"its fields, or a function of the case returning either; got "
                        f"{type(given).__name__}")
    defaults = _defaults()
    if isinstance(given, Mapping):
        user = dict(given)
    else:
        user = {f.name: getattr(given, f.name) for f in dataclasses.fields(TrainingArguments)
                if f.init and _value(f.name, getattr(given, f.name))
                != _value(f.name, getattr(defaults, f.name))}
    owned: dict[str, tuple[object, str]] = {
        **OWNED,
        "max_steps": (case.warmup + case.steps, "the case's warm-up + steps"),
        "output_dir": (_TEMPORARY, "removed after the case: nothing is left in the project"),
    }
    if case.grad_accum > 1:  # the case's accumulation drives the trainer's
        owned["gradient_accumulation_steps"] = (case.grad_accum, "the case's grad_accum")
    notes: list[str] = []
    for name, (value, why) in owned.items():
        if name in user and _value(name, user[name]) != _value(name, value):
            notes.append(f"TrainerTask.args.{name}={_value(name, user[name])!r}: the gate uses "
                         f"{value if value == _TEMPORARY else repr(value)} ({why})")
    changes: FrameworkKwargs = {k: v for k, (v, _) in owned.items() if k != "output_dir"}
    changes["output_dir"] = None  # each training's own temporary directory
    changes["use_cpu"] = device.type == "cpu"
    if seed is not None:
        changes["seed"] = seed
    try:
        if isinstance(given, Mapping):
            args = TrainingArguments(**{**given, **changes})
        else:
            args = dataclasses.replace(given, **changes)
    except (TypeError, ValueError) as exc:
        raise TaskError(f"TrainerTask.args: {str(exc).splitlines()[0]}") from None
    return args, notes


def build(task: TrainerTask, case: Case, device: torch.device) -> Built:
    """Make ``task``'s model and dataset for ``case`` (seeded), and its arguments."""
    given = task.args
    if callable(given) and not isinstance(given, TrainingArguments | Mapping):
        given = given(case)
    args_seed = given.seed if isinstance(given, TrainingArguments) else (
        given.get("seed", 42) if isinstance(given, Mapping) else 42)
    seed = task.seed_for(case, int(args_seed))
    args, notes = training_args(given, case, device, seed)
    transformers.set_seed(seed)
    model = _model(task, case)
    label = f"TrainerTask.model {_named(type(model))}"
    world = int(args.world_size)
    total = int(args.train_batch_size) * int(args.gradient_accumulation_steps) * world
    if total != case.batch:
        per = args.gradient_accumulation_steps * world
        raise TaskError(
            f"{label}: the global batch is {total} (per_device_train_batch_size "
            f"{args.per_device_train_batch_size} x gradient_accumulation_steps "
            f"{args.gradient_accumulation_steps} x {world} process(es)), but {case.id} "
            f"declares batch={case.batch}: make per_device_train_batch_size "
            f"{case.batch // per if case.batch % per == 0 else '?'} (from "
            f"accelperf.case.batch), or the case's batch {total}")
    dataset = task.built(task.train_dataset, case, (torch.utils.data.Dataset, list, tuple))
    if dataset is None:
        raise TaskError("TrainerTask.train_dataset is None: give a dataset (a torch Dataset, "
                        "a datasets.Dataset, a list of examples) or a function of the case "
                        "that returns one")
    return Built(task, model, dataset, args, label, notes)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """The gate's own trainers are quiet: transformers' info lines about the trainer the
    gate made are not the case's result; its warnings stay (they are the user's)."""
    log = transformers.logging
    level = log.get_verbosity()
    log.set_verbosity(logging.WARNING)
    try:
        with warnings.catch_warnings():
            yield
    finally:
        log.set_verbosity(level)


def _snapshot(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}


def state_beside(trainer: Trainer) -> dict[str, np.ndarray]:
    """The training state the trainer holds beside the model's ``state_dict``: the
    optimizer's step count, the scheduler's ``last_epoch``, the GradScaler's scale (fp16),
    the global step (accelerate's wrappers seen through)."""
    optimizer = getattr(trainer.optimizer, "optimizer", trainer.optimizer)
    out = optimizer_steps([optimizer]) if optimizer is not None else {}
    scheduler = getattr(trainer.lr_scheduler, "scheduler", trainer.lr_scheduler)
    epoch = getattr(scheduler, "last_epoch", None)
    if isinstance(epoch, int):
        out["scheduler/last_epoch"] = np.asarray(epoch, dtype=np.float32)
    scaler = getattr(trainer.accelerator, "scaler", None)
    if isinstance(scaler, torch.amp.GradScaler) and scaler.is_enabled():
        out["scaler/scale"] = np.asarray(scaler.get_scale(), dtype=np.float32)
    out["trainer/global_step"] = np.asarray(trainer.state.global_step, dtype=np.float32)
    return out


def count(built: Built, case: Case, device: torch.device, root: str, *,
          memory: bool) -> Counting:
    """The counting training (``memory``: the CPU's live bytes over
    :data:`MEMORY_STEPS` + :data:`GROWTH_STEPS` optimizer steps; else just through
    :data:`COUNTED_STEP`), then undone: the model's ``state_dict`` put back, or the model
    made again where the task makes it."""
    saved = _snapshot(built.model)
    counting = Counting(device, built.label)
    counting.steps = MEMORY_STEPS + GROWTH_STEPS if memory else COUNTED_STEP + 1
    built.train(counting.steps, counting, root)
    if isinstance(built.task.model, torch.nn.Module):
        built.model.load_state_dict(saved)  # the state_dict; its Python attributes stay
        built.model.zero_grad(set_to_none=True)
    else:  # made again, as the first time: nothing of the counting is left in it
        transformers.set_seed(built.args.seed)
        built.model = _model(built.task, case)
    return counting


class HfBackend:
    """Trains a :class:`TrainerTask` with transformers' ``Trainer.train`` in this process,
    on the CPU or one CUDA device."""

    name = "hf"

    def unavailable_reason(self) -> str | None:
        missing = [p for p in ("torch", "transformers", "accelerate")
                   if importlib.util.find_spec(p) is None]
        if missing:
            return f"backend 'hf' needs {', '.join(missing)}: {INSTALL}"
        return None

    def fits(self, case: Case, task: Task, accel: Accelerator, *,
             timeout: float | None = None) -> Fit:
        """CPU: the counted peak of the counting training against ``memory_capacity``."""
        device = _device(accel)
        if device.type != "cpu" or not case.memory_capacity:
            raise ConfigError(f"{case.id}: the hf backend searches a maximum batch on the "
                              f"CPU against the case's memory_capacity only")
        built = build(as_trainer_task(task), case, device)
        with tempfile.TemporaryDirectory(prefix="accelperf-hf-") as root, _quiet():
            counting = count(built, case, device, root, memory=True)
        return Fit(counting.peak <= case.memory_capacity, counting.peak,
                   int(case.memory_capacity), "mem_tracker peak")

    def train(self, case: Case, task: Task, accel: Accelerator, *,
              timeout: float | None = None) -> TrainResult:
        trainer_task = as_trainer_task(task)
        one_device(case)
        return train_with(lambda device: HfParts(build(trainer_task, case, device), case,
                                                 device),
                          case, accel, timeout, prefix="accelperf-hf-")

    def stepper(self, case: Case, task: Task, accel: Accelerator) -> Stepper:
        """The case's ``Trainer.train`` held between optimizer steps, for A/B mode
        (:class:`HfStepper`)."""
        return HfStepper(case, task, accel)


def _epochs_note(built: Built, case: Case) -> str | None:
    """A line where the dataset held fewer examples than the run trained on: the Trainer
    began a new epoch (its loader iterated again) after each pass; and where its last
    batch of an epoch is smaller than the rest."""
    try:
        examples = len(built.dataset)  # type: ignore[arg-type]
    except TypeError:  # an IterableDataset: as long as it yields
        return None
    args = built.args
    per_device = int(args.train_batch_size)
    accumulation = int(args.gradient_accumulation_steps)
    batches = examples // per_device if args.dataloader_drop_last else math.ceil(
        examples / per_device)
    needed = (case.warmup + case.steps) * accumulation
    if batches >= needed:
        return None
    short = examples % per_device
    last = ("" if args.dataloader_drop_last or not short else
            f"; the last batch of each epoch holds {short} example(s), not {per_device} "
            f"(dataloader_drop_last=True drops it)")
    return (f"TrainerTask.train_dataset holds {examples} example(s), {batches} batch(es) of "
            f"per_device_train_batch_size {per_device}, the case {needed} (warm-up + steps x "
            f"gradient_accumulation_steps): the Trainer began a new epoch after each "
            f"{batches} (the dataset cycled: its loader iterated again, its end-of-epoch "
            f"work inside the step that followed){last}")


class HfParts:
    """A case's ``Trainer.train`` for :func:`~.torch.trainer_run.train_with`."""

    why = "a callback set control.should_training_stop, or the data ended"

    def __init__(self, built: Built, case: Case, device: torch.device) -> None:
        self.built, self.case, self.device = built, case, device
        self.notes, self.who = built.notes, f"{built.label}: the Trainer"
        self.trainer: Trainer | None = None
        self.measured: Measured | None = None

    def quiet(self) -> contextlib.AbstractContextManager[None]:
        return _quiet()

    def count(self, root: str, *, memory: bool) -> Counting:
        return count(self.built, self.case, self.device, root, memory=memory)

    def measure(self, steps: int, clock: StepClock, root: str) -> None:
        self.measured = Measured(self.built.label, clock)
        self.trainer = self.built.train(steps, self.measured, root)

    def model(self) -> torch.nn.Module:
        return self.built.model

    def epochs_note(self) -> str | None:
        return _epochs_note(self.built, self.case)

    def beside(self) -> dict[str, np.ndarray]:
        assert self.trainer is not None, "measure() first"
        return state_beside(self.trainer)

    def tokens_per_sample(self) -> int | None:
        return self.measured.tokens_per_sample if self.measured is not None else None


def one_device(case: Case) -> None:
    """Refuse a case this process cannot train (:func:`.torch.launched.one_device`)."""
    trainer_one_device(case, "an hf", "the Trainer's DDP")


class HfStepper(HeldStepper):
    """A case's ``Trainer.train``, held between optimizer steps, for A/B mode: :meth:`run`
    trains ``n`` more and gives their times.

    Built as a run builds it (the same model, dataset and training arguments, the same
    seed), its program record counted as a run counts it (one counting training through
    :data:`~.hf.callback.COUNTED_STEP`, then undone), then one ``Trainer.train`` of
    :data:`~pytest_accelperf.backends.measure.held.HELD_STEPS` optimizer steps (the
    Trainer's own epochs cycle the dataset) started in a thread of its own and held before
    each optimizer step (:class:`~pytest_accelperf.backends.measure.held.HeldLoop`) until
    A/B mode asks for a block. Its temporary output directory is removed at
    :meth:`close`."""

    def __init__(self, case: Case, task: Task, accel: Accelerator) -> None:
        one_device(case)
        device = _device(accel)
        built = build(as_trainer_task(task), case, device)
        root = self._root = tempfile.mkdtemp(prefix="accelperf-hf-")
        try:
            with _quiet():
                counted = count(built, case, device, root, memory=False)
            self._program = eager_program(counted.flops, counted.ops)
            self._held = HeldLoop(built.label)
            measured = Measured(built.label, self._held.clock(lambda: sync(device)))
            transformers.set_seed(built.args.seed)

            def train() -> None:
                with _quiet():
                    built.train(HELD_STEPS, measured, root)

            self._held.start(train)
        except BaseException:
            shutil.rmtree(root, ignore_errors=True)
            raise


BACKEND = HfBackend()
