"""Deprecated: now :mod:`pytest_accelperf.backends.procs._rank`. This path goes in the next
release."""

from typing import Any

from pytest_accelperf.backends._moved import forward, warn_moved

warn_moved(__name__)


def __getattr__(name: str) -> Any:
    return forward(__name__, name)
