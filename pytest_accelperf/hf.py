"""What a suite imports to train with Hugging Face's ``Trainer``: :class:`TrainerTask`.

``TrainerTask(model=, args=, train_dataset=, data_collator=)`` puts a model under the gate
as transformers' ``Trainer.train`` trains it (``@cases(backend="hf", ...)``); see
``docs/trainers.md``. Importing this module imports neither torch nor transformers: the
backend imports them when a case trains.
"""

from pytest_accelperf.backends.hf.task import OWNED, TrainerTask

__all__ = ["OWNED", "TrainerTask"]
