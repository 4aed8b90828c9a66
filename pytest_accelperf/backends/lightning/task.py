"""What a suite hands the ``lightning`` backend: :class:`LightningTask`, and the
``Trainer`` settings the gate owns in a measured run (:data:`OWNED`).

Importing this module imports neither torch nor lightning: a suite's module can build a
task at collection, and ``import pytest_accelperf.lightning`` stays light.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pytest_accelperf.backends.measure.factories import CaseFactories

if TYPE_CHECKING:
    from pytest_accelperf.collect.cases import Case

#: ``Trainer`` keyword arguments the gate sets in a measured run, and why: a user's
#: setting that differs is replaced, said in one line (``max_steps`` is the case's
#: ``warmup + steps``, set apart).
OWNED: Mapping[str, tuple[object, str]] = {
    "logger": (False, "no log folder is left in the project"),
    "enable_checkpointing": (False, "no checkpoint is left in the project"),
    "enable_progress_bar": (False, "the gate's own progress line reports each step"),
    "enable_model_summary": (False, "the summary table is printed, not measured"),
    "profiler": (None, "the gate times the trainer's data fetch through its own profiler"),
    "max_epochs": (-1, "the run ends at max_steps, over as many epochs as that takes"),
    "num_sanity_val_steps": (0, "validation is not part of a training step"),
    "limit_val_batches": (0, "validation is not part of a training step"),
}


@dataclass(frozen=True)
class LightningTask(CaseFactories):
    """A LightningModule trained by ``lightning.Trainer.fit`` under the gate.

    ``module`` is the ``LightningModule`` to train, or a function of the
    :class:`~pytest_accelperf.collect.cases.Case` that makes it (called after the seed
    is set). ``data`` is what ``Trainer.fit`` trains on: a ``LightningDataModule``, a
    ``DataLoader`` (any iterable of batches), or a function of the case that returns one
    of them. ``trainer`` holds ``lightning.Trainer`` keyword arguments, as a user passes
    them (``precision``, ``accumulate_grad_batches``, ``gradient_clip_val``, ...): the
    gate sets those it owns (:data:`OWNED`, and ``max_steps``), and says where yours
    differed. A case's ``grad_accum`` above 1 is the trainer's
    ``accumulate_grad_batches``. The global batch, the loader's batch times
    ``accumulate_grad_batches`` times the devices, must be the case's ``batch``.

    ``seed`` seeds everything (``lightning.seed_everything``) before the module is made
    and before each training; a case's ``params["seed"]`` takes its place.
    """

    module: object
    data: object
    trainer: Mapping[str, Any] = field(default_factory=dict)
    seed: int = 0

    def seed_for(self, case: Case) -> int:
        """The seed of ``case``: its ``params["seed"]``, else :attr:`seed`."""
        seed = case.params.get("seed", self.seed)
        return int(seed)
