"""The plugin inside transformers' ``Trainer`` loop: a ``TrainerCallback``, and two of the
trainer's own methods wrapped on the instance (:func:`instrument`).

``Trainer.train`` owns the loop; the plugin follows it from what the trainer offers:

* ``get_batch_samples``: the trainer fetches all the micro-batches of one optimizer step
  at once, before ``on_step_begin``; the wrapper times that fetch on its own (``input``),
  apart from the step;
* ``training_step``: the wrapper keeps the loss each micro-batch's ``training_step``
  returned (a detached tensor, the one the trainer adds into its own running loss: no
  extra forward, no host sync inside the step); the step's loss is their sum, as the
  trainer's (each is divided by the accumulation steps, or normalized by the step's
  label count, by the trainer);
* :class:`Watch`, the callback: the learning rate each optimizer step used
  (``on_pre_optimizer_step``, before the scheduler steps), the end of each optimizer step
  (``on_step_end``: the device synchronized, then the losses read), and the end of each
  accumulated micro-batch (``on_substep_end``).

The user's code of a step is each ``training_step`` (the forward in ``compute_loss``, the
backward; the batch's move to the device with it) and the optimizer's ``step`` (between
``on_pre_optimizer_step`` and ``on_optimizer_step``); the rest of the step is the
trainer's own time (``trainer_times``: its loop, callbacks, gradient clipping, the
scheduler, ``zero_grad``, the NaN filter of the loss).

Two trainings use them (:mod:`.hf.backend`): a counting one, untimed and undone afterwards,
where :class:`Counting` counts memory and one optimizer step's FLOPs and ops as
:class:`~.torch.counting.CountedSteps` counts them for every trainer, and the measured one,
where a :class:`~pytest_accelperf.backends.measure.stamps.StepClock` stamps each step.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping, Sequence

import torch
from transformers import Trainer, TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from pytest_accelperf.backends.measure.common import TaskError, describe
from pytest_accelperf.backends.measure.stamps import Clocked, StepClock
from pytest_accelperf.backends.torch.counting import COUNTED_STEP, CountedSteps
from pytest_accelperf.backends.torch.ops import uncounted
from pytest_accelperf.backends.types import Untyped

__all__ = ["COUNTED_STEP", "Counting", "Measured", "Watch", "instrument"]

#: transformers' and accelerate's packages: a host sync inside them is named at the
#: user's frame that called them (a ``Trainer`` subclass's ``compute_loss``, a model of
#: the user's own), else at the innermost of their frames (a model's line in
#: ``modeling_*.py``, or the trainer's own where its loop made it).
LIBRARIES = tuple(os.path.dirname(spec.origin or "") + os.sep for spec in (
    importlib.util.find_spec("transformers"), importlib.util.find_spec("accelerate"))
    if spec is not None)
#: The start of the ValueError ``Trainer.compute_loss`` raises for a model that returned
#: no loss.
_NO_LOSS = "The model did not return a loss"


class Watch(TrainerCallback):
    """What both trainings read from the loop: the loss of each optimizer step, the
    learning rate it used, and the sequence length of its first batch."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.losses: list[torch.Tensor] = []  # the running step's micro-batch losses
        self.tokens_per_sample: int | None = None
        self._lr: float | None = None

    # -- the loop's events, to each training's own use --------------------------------
    def begin(self, model: torch.nn.Module) -> bool:
        """The trainer is about to fetch its first batch. True: stop."""
        return False

    def fetch_started(self) -> None:
        """The trainer starts fetching the batches of a step."""

    def fetch_ended(self) -> None:
        """The trainer has them."""

    def substep_ended(self) -> None:
        """A micro-batch whose optimizer did not step ended."""

    def user_started(self) -> None:
        """The trainer calls the user's code: a micro-batch's ``training_step`` (the
        forward in ``compute_loss``, the backward) or the optimizer's ``step``."""

    def user_ended(self) -> None:
        """That code returned to the trainer."""

    def batch_ended(self) -> None:
        """An optimizer step ended, before its loss is read."""

    def after_step(self, loss: float, metrics: Mapping[str, float]) -> bool:
        """The step's loss and metrics. True: stop."""
        return False

    def close(self) -> None:
        """The training ended, or failed: leave nothing entered."""

    def fetched(self, batches: Sequence[object]) -> None:
        """The batches of a step: the first one's sequence length is kept."""
        if self.tokens_per_sample is None and batches:
            first = batches[0]
            ids = first.get("input_ids") if isinstance(first, Mapping) else None
            if isinstance(ids, torch.Tensor) and ids.dim() == 2:
                self.tokens_per_sample = int(ids.shape[1])

    # -- the Trainer's events ------------------------------------------------------------
    def on_train_begin(self, args: TrainingArguments, state: TrainerState,
                       control: TrainerControl, **kwargs: Untyped) -> None:
        if self.begin(kwargs["model"]):
            control.should_training_stop = True

    def on_pre_optimizer_step(self, args: TrainingArguments, state: TrainerState,
                              control: TrainerControl, **kwargs: Untyped) -> None:
        optimizer = kwargs.get("optimizer")
        if optimizer is not None:
            self._lr = float(optimizer.param_groups[0]["lr"])
        self.user_started()  # the trainer calls optimizer.step() next

    def on_optimizer_step(self, args: TrainingArguments, state: TrainerState,
                          control: TrainerControl, **kwargs: Untyped) -> None:
        self.user_ended()

    def on_substep_end(self, args: TrainingArguments, state: TrainerState,
                       control: TrainerControl, **kwargs: Untyped) -> None:
        self.substep_ended()

    def on_step_end(self, args: TrainingArguments, state: TrainerState,
                    control: TrainerControl, **kwargs: Untyped) -> None:
        self.batch_ended()
        with uncounted():  # the plugin's read of the loss: not the step's host sync
            loss = sum(float(t.detach().float().item()) for t in self.losses)
        if not self.losses:
            raise TaskError(f"{self.label}: the trainer stepped without a training_step the "
                            f"gate saw (a Trainer subclass that overrides the training loop)")
        self.losses = []
        metrics = {"lr": self._lr} if self._lr is not None else {}
        if self.after_step(loss, metrics):
            control.should_training_stop = True


def instrument(trainer: Trainer, watch: Watch) -> None:
    """Wrap ``trainer``'s ``get_batch_samples`` (the fetch, timed apart) and
    ``training_step`` (its loss kept, a model without one said in one line) on the
    instance, around whatever class (a user's subclass included) defines them."""
    fetch = trainer.get_batch_samples
    step = trainer.training_step

    def get_batch_samples(*args: Untyped, **kwargs: Untyped) -> Untyped:
        watch.fetch_started()
        try:
            out = fetch(*args, **kwargs)
        finally:
            watch.fetch_ended()
        watch.fetched(out[0])
        return out

    def training_step(*args: Untyped, **kwargs: Untyped) -> Untyped:
        watch.user_started()
        try:
            loss = step(*args, **kwargs)
        except ValueError as exc:
            if not str(exc).startswith(_NO_LOSS):
                raise
            inputs = args[1] if len(args) > 1 else kwargs.get("inputs")
            raise TaskError(no_loss(watch.label, trainer, inputs)) from None
        finally:
            watch.user_ended()
        if isinstance(loss, torch.Tensor):
            watch.losses.append(loss)
        return loss

    trainer.get_batch_samples = get_batch_samples  # type: ignore[method-assign]
    trainer.training_step = training_step  # type: ignore[method-assign]


def no_loss(label: str, trainer: Trainer, inputs: object) -> str:
    """The line for a model that returned no loss: what the batches hold, and the collator
    that made them."""
    keys = ", ".join(map(str, inputs)) if isinstance(inputs, Mapping) else type(inputs).__name__
    collator = trainer.data_collator
    made = (f"TrainerTask.data_collator {describe(collator)}"
            if collator is not None else "the Trainer's default collator")
    return (f"{label} returned no loss: the batches made by {made} hold {keys} and no "
            f"'labels': give a collator that sets them (for a causal LM, "
            f"DataCollatorForLanguageModeling(tokenizer, mlm=False)), or labels in the "
            f"dataset's examples")


class Measured(Clocked, Watch):
    """The measured training: a :class:`StepClock` stamps each optimizer step (and, through
    :class:`Clocked`, the parts of each)."""

    def __init__(self, label: str, clock: StepClock) -> None:
        super().__init__(label)
        self.clock = clock

    def begin(self, model: torch.nn.Module) -> bool:
        return self.clock.start()  # True where A/B mode's held loop is closing

    def after_step(self, loss: float, metrics: Mapping[str, float]) -> bool:
        return self.clock.after_batch(loss, metrics)


class Counting(CountedSteps, Watch):
    """The counting training (untimed, undone afterwards): what
    :class:`~.torch.counting.CountedSteps` counts (memory on the CPU, and one optimizer
    step's FLOPs and ops), driven from the Trainer's events."""

    def __init__(self, device: torch.device, label: str) -> None:
        Watch.__init__(self, label)
        CountedSteps.__init__(self, device, LIBRARIES)

    def begin(self, model: torch.nn.Module) -> bool:
        self.start(model)
        return False

    def substep_ended(self) -> None:
        CountedSteps.batch_ended(self)

    def after_step(self, loss: float, metrics: Mapping[str, float]) -> bool:
        return self.stepped()
