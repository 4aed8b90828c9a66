"""transformers' ``Trainer`` over DDP under the gate: an ``hf`` case with
``world_size = N`` trains ``Trainer.train`` in ``N`` ranks the plugin launches, each over
the process group the launch set up (:mod:`pytest_accelperf.backends.torch.trainer_ddp`:
what every rank runs, and the run made of what they return).

accelerate, which the ``Trainer`` runs on, reads the environment the launcher gives every
rank (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``) as it
reads torchrun's: ``TrainingArguments`` sees ``N`` processes, and the ``Trainer`` joins the
group (gloo on the CPU), wraps the model in ``DistributedDataParallel`` and shards the
dataset with a ``DistributedSampler``. The user's model, dataset, collator and
``TrainingArguments`` go in unchanged; ``per_device_train_batch_size`` is the per-rank
batch (``case.batch / (N * gradient_accumulation_steps)``, checked when the case is built).
"""

from __future__ import annotations

from pytest_accelperf.backends.hf.task import TrainerTask
from pytest_accelperf.backends.torch.trainer_ddp import TrainerRanks

#: The ``hf`` backend's ranks (its spec's ``ranks``).
RANKS = TrainerRanks(
    "pytest_accelperf.backends.hf.backend", TrainerTask,
    {"engine": "hf-ddp", "launcher": "accelerate (the torchelastic environment)"},
    warm=("transformers",))
