"""What a suite imports to train with JAX.

Your own step and state (:class:`JaxStep`), a model and loss made into one
(:class:`JaxTask`), a Flax NNX model and optimizer (:func:`nnx_step`), a pipeline of stages
(:class:`PipelineTask`, the ``jax-pipeline`` backend), and a compile-only memory prediction
(:func:`predict_memory`). Importing this module imports jax; ``import pytest_accelperf``
does not. The backend itself lives in :mod:`pytest_accelperf.backends.jax`.
"""

from pytest_accelperf.backends.jax.memory import predict_memory
from pytest_accelperf.backends.jax.pipeline import PipelineTask
from pytest_accelperf.backends.jax.step import JaxStep, JaxTask, nnx_step

__all__ = ["JaxStep", "JaxTask", "PipelineTask", "nnx_step", "predict_memory"]
