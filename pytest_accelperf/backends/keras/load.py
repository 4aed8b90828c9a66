"""Keras 3 imported on its JAX backend, once per process: :data:`keras`.

Keras reads its backend when it is first imported (``KERAS_BACKEND``, else
``~/.keras/keras.json``, else TensorFlow) and cannot change it afterwards. The gate trains
Keras on JAX, so this module sets ``KERAS_BACKEND=jax`` where nothing chose a backend and
keras is not imported yet; a process whose keras is already on another backend, or whose
``KERAS_BACKEND`` names another, is refused in one line (:class:`ConfigError`): there is no
way to measure that process's keras on JAX.

JAX itself is set up by the plugin before this runs (the session's devices: on the CPU,
the ``--xla_force_host_platform_device_count`` virtual devices); Keras without a
``keras.distribution`` places the model on the first of them (``jax.devices()[0]``), as it
does in production on one device.

Keras writes ``keras.json`` into its home (``~/.keras``, or ``KERAS_HOME``) on its first
import where none is there: what that import created is removed again, so that a session
leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
from collections.abc import Iterator

from pytest_accelperf.backends.types import Framework
from pytest_accelperf.errors import ConfigError

_FIX = ("set KERAS_BACKEND=jax before anything imports keras (in the environment, or at "
        "the top of conftest.py: os.environ['KERAS_BACKEND'] = 'jax')")


def _home() -> str:
    """Where Keras keeps ``keras.json``, as its config module works it out."""
    if "KERAS_HOME" in os.environ:
        return os.environ["KERAS_HOME"]
    base = os.path.expanduser("~")
    if not os.access(base, os.W_OK):
        base = "/tmp"
    return os.path.join(base, ".keras")


@contextlib.contextmanager
def _no_config_left() -> Iterator[None]:
    """Remove the ``keras.json`` (and its folder) that keras's first import writes."""
    home = _home()
    config = os.path.join(home, "keras.json")
    had_home, had_config = os.path.isdir(home), os.path.exists(config)
    try:
        yield
    finally:
        if not had_config and os.path.exists(config):
            with contextlib.suppress(OSError):
                os.remove(config)
        if not had_home and os.path.isdir(home):
            with contextlib.suppress(OSError):
                os.rmdir(home)  # only when empty


def keras_on_jax() -> Framework:
    """The ``keras`` module, imported on its JAX backend (see the module docstring)."""
    loaded = sys.modules.get("keras")
    if loaded is None:
        chosen = os.environ.get("KERAS_BACKEND")
        if chosen and chosen != "jax":
            raise ConfigError(f"KERAS_BACKEND={chosen}: the keras backend trains Keras 3 on "
                              f"JAX; {_FIX}")
        os.environ["KERAS_BACKEND"] = "jax"
        with _no_config_left():
            loaded = importlib.import_module("keras")
    backend = str(loaded.backend.backend())
    if backend != "jax":
        raise ConfigError(f"keras was imported in this process on its {backend!r} backend "
                          f"before the case trained, and cannot change it; the keras backend "
                          f"trains Keras 3 on JAX: {_FIX}")
    return loaded


keras = keras_on_jax()
