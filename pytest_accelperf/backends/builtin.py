"""The built-in backends, registered as any other: through ``pytest_accelperf_backends``.

The plugin registers this module as a pytest plugin (in ``pytest_configure``), as
pytest-xdist registers its schedulers; a conftest or another plugin adds its own backends
the same way (:mod:`pytest_accelperf.hookspecs`). Outside pytest (Ray and A/B workers,
scripts) :func:`pytest_accelperf.backends.registry.get_backend` finds these by name.

Importing this module imports no framework: each spec names its module, imported only when
one of its cases trains.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from pytest_accelperf.backends.spec import BackendSpec

if TYPE_CHECKING:
    import pytest

_JAX = ("jax", "jaxlib", "flax", "optax", "numpy")
_TORCH_FIRST = "(install torch first: pip install torch==2.13.0 for CPU)"

SPECS: tuple[BackendSpec, ...] = (
    BackendSpec(
        # flax only for nnx_step and Linen's annotations, which say so themselves: a plain
        # JAX, Equinox or Haiku user has none
        "jax", "pytest_accelperf.backends.jax.backend", requires=("jax", "optax"),
        install="pip install 'pytest-accelperf[jax]'", packages=_JAX,
        ranks="pytest_accelperf.backends.jax.processes", ab_blocks=True, compile_only=True,
    ),
    BackendSpec(
        "torch", "pytest_accelperf.backends.torch.backend", requires=("torch",),
        install=f"pip install 'pytest-accelperf[torch]' {_TORCH_FIRST}",
        packages=("torch", "numpy"), ranks="pytest_accelperf.backends.torch.ddp", ab_blocks=True,
    ),
    BackendSpec(
        "deepspeed", "pytest_accelperf.backends.torch.deepspeed",
        requires=("torch", "deepspeed", "cloudpickle"),
        install=f"pip install 'pytest-accelperf[deepspeed]' {_TORCH_FIRST}",
        packages=("torch", "deepspeed", "numpy"), in_process=False,
        ranks="pytest_accelperf.backends.torch.deepspeed",
    ),
    # A LightningModule trained by lightning.Trainer.fit, measured from a callback.
    BackendSpec(
        "lightning", "pytest_accelperf.backends.lightning.backend",
        requires=("torch", "lightning"),
        install=f"pip install 'pytest-accelperf[lightning]' {_TORCH_FIRST}",
        packages=("torch", "lightning", "numpy"), ab_blocks=True,
        ranks="pytest_accelperf.backends.lightning.ddp",
    ),
    # A compiled Keras 3 model trained by model.fit on JAX, measured from a callback.
    BackendSpec(
        "keras", "pytest_accelperf.backends.keras.backend", requires=("jax", "keras"),
        install="pip install 'pytest-accelperf[keras]'",
        packages=("keras", "jax", "jaxlib", "numpy"), ab_blocks=True,
    ),
    # A model trained by transformers' Trainer.train, measured from a TrainerCallback.
    BackendSpec(
        "hf", "pytest_accelperf.backends.hf.backend",
        requires=("torch", "transformers", "accelerate"),
        install=f"pip install 'pytest-accelperf[hf]' {_TORCH_FIRST}",
        packages=("torch", "transformers", "accelerate", "tokenizers", "numpy"),
        ab_blocks=True, ranks="pytest_accelperf.backends.hf.ddp",
    ),
    # Trainium / Inferentia through torch-xla; torch-neuronx is on AWS's own index only
    # (the PyPI name is a placeholder).
    BackendSpec(
        "neuron", "pytest_accelperf.backends.torch.neuron",
        requires=("torch", "torch_xla", "torch_neuronx"),
        install="pip install torch-neuronx --extra-index-url "
                "https://pip.repos.neuron.amazonaws.com (on a Trainium/Inferentia instance "
                "with the Neuron driver)",
        packages=("torch", "numpy"),
    ),
    BackendSpec(
        "alpa", "pytest_accelperf.backends.jax.alpa",
        requires=("alpa", "jax", "flax", "optax", "ray"),
        install="Alpa needs Python <= 3.9 and jax 0.3.x (this is Python "
                f"{sys.version_info.major}.{sys.version_info.minor}): in a Python 3.9 "
                "environment, pip install alpa and its jaxlib build "
                "(https://alpa.ai/install.html)",
        packages=_JAX,
    ),
    BackendSpec(
        "jax-pipeline", "pytest_accelperf.backends.jax.pipeline", requires=("jax", "optax"),
        install="pip install 'pytest-accelperf[jax]'", packages=_JAX,
    ),
    # Measurements taken outside the plugin (accelperf.ingest): nothing to import. An
    # ingested log's own versions (compiler, runtime) come with it under other names and
    # always count; this machine's packages say nothing about it.
    BackendSpec("external", "pytest_accelperf.backends.external", packages=()),
)


def pytest_accelperf_backends(config: pytest.Config) -> list[BackendSpec]:
    """The built-in backends (this module is registered as a plugin by the plugin)."""
    return list(SPECS)
