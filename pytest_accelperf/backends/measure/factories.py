"""A trainer's task whose parts may be factories of the case (``LightningTask``,
``TrainerTask``, ``KerasTask``): the module, the model, the data, the arrays are each
either the thing itself or a callable the backend calls with the :class:`Case`, so that
the case grid (batch, world size, precision) drives them.

Importing this module imports no framework.
"""

from __future__ import annotations

from collections.abc import Callable

from pytest_accelperf.collect.cases import Case


class CaseFactories:
    """What a trainer's task shares: how each of its parts is made for a case."""

    def built(self, value: object, case: Case, kinds: tuple[type, ...]) -> object:
        """``value`` as one of ``kinds``, or what it returns called with ``case`` (a
        callable that is none of ``kinds``: a generator function is called too; what is
        neither is handed on, for the backend to refuse in its own words)."""
        if isinstance(value, kinds) or not callable(value):
            return value
        factory: Callable[[Case], object] = value
        return factory(case)
