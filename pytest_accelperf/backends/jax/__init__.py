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

Importing this package imports no framework; its submodules import jax.
"""
