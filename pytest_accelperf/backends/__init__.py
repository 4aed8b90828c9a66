"""Backends: the frameworks that run training steps, each described by a BackendSpec."""

from pytest_accelperf.backends.protocol import Backend, Fit, TrainResult
from pytest_accelperf.backends.registry import BACKENDS, BackendRegistry, get_backend
from pytest_accelperf.backends.spec import BackendSpec, BackendSpecError

__all__ = ["BACKENDS", "Backend", "BackendRegistry", "BackendSpec", "BackendSpecError", "Fit",
           "TrainResult", "get_backend"]
