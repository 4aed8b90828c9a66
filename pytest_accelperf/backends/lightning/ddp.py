"""Lightning's own DDP under the gate: a ``lightning`` case with ``world_size = N`` trains
``Trainer.fit`` in ``N`` ranks the plugin launches, each over the process group the launch
set up (:mod:`pytest_accelperf.backends.torch.trainer_ddp`: what every rank runs, and the
run made of what they return).

Lightning accepts a process group launched outside it (torchrun's, SLURM's): inside a
launched rank the backend's trainer settings (:func:`~.lightning.fit.trainer_settings`)
are ``strategy="ddp"``, ``plugins=[TorchElasticEnvironment()]`` (which reads the rank from
the environment the launcher gives it: ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``MASTER_ADDR``, ``MASTER_PORT``), ``devices`` the ranks on this machine and ``num_nodes``
the machines (``devices=N``, ``num_nodes=1`` where the plugin launches them; one rank a
host on a Ray cluster: ``devices=1``, ``num_nodes=N``): the ``Trainer`` starts no process
of its own, it joins the group. The user's LightningModule and data go in unchanged;
Lightning gives each rank its share of the loader through its ``DistributedSampler``.
"""

from __future__ import annotations

from pytest_accelperf.backends.lightning.task import LightningTask
from pytest_accelperf.backends.torch.trainer_ddp import TrainerRanks

#: The ``lightning`` backend's ranks (its spec's ``ranks``).
RANKS = TrainerRanks(
    "pytest_accelperf.backends.lightning.backend", LightningTask,
    {"engine": "lightning-ddp", "strategy": "ddp",
     "cluster_environment": "TorchElasticEnvironment"},
    warm=("lightning.pytorch",))
