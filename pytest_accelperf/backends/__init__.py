"""Backends: the frameworks that run training steps (jax here; torch, deepspeed, ... later)."""

from pytest_accelperf.backends.base import BACKENDS, Backend, TrainResult, get_backend

__all__ = ["BACKENDS", "Backend", "TrainResult", "get_backend"]
