"""What a suite imports to train with Keras 3's ``model.fit``: :class:`KerasTask`.

``KerasTask(model=, x=, y=, fit={...})`` puts a compiled Keras model under the gate as
``model.fit`` trains it, on the JAX backend of Keras (``@cases(backend="keras", ...)``);
see ``docs/trainers.md``. Importing this module imports neither keras nor jax: the
backend imports them when a case trains (this module is ``pytest_accelperf.keras``; every
``import keras`` in the package is absolute and gets Keras).
"""

from pytest_accelperf.backends.keras.task import OWNED, KerasTask

__all__ = ["OWNED", "KerasTask"]
