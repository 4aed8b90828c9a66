"""What a suite imports to train with PyTorch.

Your own training step over your model and optimizer (:class:`TorchStep`), a model and loss
made into one (:class:`TorchTask`), a step for DDP and DeepSpeed ranks (:class:`RankStep`,
its ``build`` returning a :class:`Built`), and DDP called directly (:func:`train_ddp`).
Importing this module imports torch; ``import pytest_accelperf`` does not. The backends
themselves live in :mod:`pytest_accelperf.backends.torch`.

(This module is ``pytest_accelperf.torch``; every ``import torch`` in the package is
absolute and gets PyTorch.)
"""

from pytest_accelperf.backends.torch.ddp import train_ddp
from pytest_accelperf.backends.torch.rank_step import Built, RankStep
from pytest_accelperf.backends.torch.step import TorchStep
from pytest_accelperf.backends.torch.task import TorchTask

__all__ = ["Built", "RankStep", "TorchStep", "TorchTask", "train_ddp"]
