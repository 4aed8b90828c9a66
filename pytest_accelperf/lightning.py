"""What a suite imports to train with PyTorch Lightning: :class:`LightningTask`.

``LightningTask(module=, data=, trainer={...})`` puts a ``LightningModule`` under the gate
as ``lightning.Trainer.fit`` trains it (``@cases(backend="lightning", ...)``); see
``docs/trainers.md``. Importing this module imports neither torch nor lightning: the
backend imports them when a case trains. (This module is ``pytest_accelperf.lightning``;
every ``import lightning`` in the package is absolute and gets Lightning.)
"""

from pytest_accelperf.backends.lightning.task import OWNED, LightningTask

__all__ = ["OWNED", "LightningTask"]
