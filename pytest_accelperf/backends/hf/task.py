"""What a suite hands the ``hf`` backend: :class:`TrainerTask`, and the
``TrainingArguments`` fields the gate owns in a measured run (:data:`OWNED`).

Importing this module imports neither torch nor transformers: a suite's module can build a
task at collection, and ``import pytest_accelperf.hf`` stays light.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pytest_accelperf.backends.measure.factories import CaseFactories
from pytest_accelperf.backends.types import FrameworkKwargs

if TYPE_CHECKING:
    from pytest_accelperf.collect.cases import Case

#: ``TrainingArguments`` fields the gate sets in a measured run, and why: a user's setting
#: that differs from the field's default and from the gate's is replaced, said in one line
#: (``max_steps`` is the case's ``warmup + steps``, ``output_dir`` a temporary directory,
#: ``use_cpu`` and ``seed`` are set apart).
OWNED: Mapping[str, tuple[object, str]] = {
    "save_strategy": ("no", "no checkpoint is left in the project"),
    "report_to": ("none", "no logger is started and no log folder is left in the project"),
    "disable_tqdm": (True, "the gate's own progress line reports each step"),
    "eval_strategy": ("no", "evaluation is not part of a training step"),
    "load_best_model_at_end": (False, "no checkpoint is saved to load"),
    "push_to_hub": (False, "nothing leaves the machine"),
}


@dataclass(frozen=True)
class TrainerTask(CaseFactories):
    """A model trained by transformers' ``Trainer.train`` under the gate, with the names
    ``Trainer`` takes.

    ``model`` is the model to train (a ``PreTrainedModel`` or any ``torch.nn.Module`` whose
    forward returns a loss), or a function of the
    :class:`~pytest_accelperf.collect.cases.Case` that makes it (called after the seed is
    set). ``args`` is a ``TrainingArguments``, a dict of its fields, or a function of the
    case that returns either: the gate sets the fields it owns (:data:`OWNED`,
    ``max_steps``, ``output_dir``) and says where yours differed; a case's ``grad_accum``
    above 1 is ``gradient_accumulation_steps``. The global batch,
    ``per_device_train_batch_size`` times ``gradient_accumulation_steps`` times the world
    size, must be the case's ``batch``. ``train_dataset`` is the dataset (a torch
    ``Dataset``, a ``datasets.Dataset``, a list of examples, an ``IterableDataset``), or a
    function of the case that returns one. ``data_collator``, ``processing_class``,
    ``callbacks`` and ``compute_loss_func`` go to ``Trainer`` as given; ``trainer_class``
    is your ``Trainer`` subclass, where you override ``compute_loss`` or
    ``training_step``.

    ``seed`` seeds the model's making and each training (``transformers.set_seed``, and
    ``TrainingArguments.seed``); None takes ``args.seed``; a case's ``params["seed"]`` takes
    the place of both.
    """

    model: object
    args: object = None
    train_dataset: object = None
    data_collator: object = None
    processing_class: object = None
    callbacks: Sequence[object] = ()
    compute_loss_func: object = None
    trainer_class: object = None
    seed: int | None = None

    def seed_for(self, case: Case, args_seed: int) -> int:
        """The seed of ``case``: its ``params["seed"]``, else :attr:`seed`, else
        ``args_seed`` (``TrainingArguments.seed``)."""
        seed = case.params.get("seed", self.seed if self.seed is not None else args_seed)
        return int(seed)

    def trainer_kwargs(self) -> FrameworkKwargs:
        """The ``Trainer`` keyword arguments given as they are (not the model, args or
        dataset: the backend builds those per case)."""
        out: FrameworkKwargs = {"data_collator": self.data_collator,
                                "processing_class": self.processing_class,
                                "compute_loss_func": self.compute_loss_func}
        return {k: v for k, v in out.items() if v is not None}
