"""The JAX backends, one module a part:

* ``backend``: the ``jax`` backend (:data:`~.jax.backend.BACKEND`): trains a step, times it,
  checks it against its single-device reference;
* ``step``: the step API (``JaxStep``, ``JaxTask``, ``nnx_step``: import them from
  :mod:`pytest_accelperf.jax`);
* ``sharding``: the shardings of a step's state and batch on the case's mesh;
* ``compile``: the step compiled ahead of time; ``program``: what XLA made of it (FLOPs,
  bytes, collectives); ``memory``: its memory plan, capacity and out-of-memory records;
* ``ranks``: a case spanning processes (``jax.distributed``);
* ``pipeline``: GPipe (``jax-pipeline``); ``alpa``: Alpa.

Importing this package imports no framework; its submodules import jax. Until the next
release it also gives the names of the module it replaces (``backends/jax.py``), with a
:class:`DeprecationWarning` naming their new place (:mod:`pytest_accelperf.backends._moved`).
"""

from typing import Any

from pytest_accelperf.backends._moved import old_name


def __getattr__(name: str) -> Any:
    return old_name(__name__, name)
