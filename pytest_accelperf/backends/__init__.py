"""Backends: the frameworks that run training steps, each described by a BackendSpec.

A backend is a spec (``spec.py``) naming its module, whose ``BACKEND`` implements the
protocol (``protocol.py``); ``registry.py`` finds specs by name, ``builtin.py`` declares the
built-in ones. The code is one folder a framework, with the same file names in each:
``jax/`` and ``torch/`` (``backend``, ``step``, ``ranks``, ``program``, ``memory``, ...);
what they share imports no framework: ``measure/`` (the step loop, the drift probe) and
``procs/`` (launched ranks).
"""

from pytest_accelperf.backends.protocol import Backend, Fit, TrainResult
from pytest_accelperf.backends.registry import BACKENDS, BackendRegistry, get_backend
from pytest_accelperf.backends.spec import BackendSpec, BackendSpecError

__all__ = ["BACKENDS", "Backend", "BackendRegistry", "BackendSpec", "BackendSpecError", "Fit",
           "TrainResult", "get_backend"]
