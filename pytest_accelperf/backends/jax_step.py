"""Deprecated: now :mod:`pytest_accelperf.backends.jax.step`; what a suite imports of it
(JaxStep, JaxTask, nnx_step) is in :mod:`pytest_accelperf.jax`. This path goes in the next
release."""

from typing import Any

from pytest_accelperf.backends._moved import forward, warn_moved

warn_moved(__name__)


def __getattr__(name: str) -> Any:
    return forward(__name__, name)
