"""The table of checks: every check of a run, one line each, in the order of the report.

Adding a check is its module (``checks/<name>.py``, defining ``CHECK``: a
:class:`~pytest_accelperf.checks.protocol.Check`) and one line in :data:`BUILTIN`. A
plugin or a ``conftest.py`` adds one for a session through the
``pytest_accelperf_checks`` hook (:mod:`pytest_accelperf.hookspecs`), which registers it
here (:func:`register`) until the session ends.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from pytest_accelperf.checks import (
    compile_time,
    convergence,
    input_wait,
    max_batch,
    memory,
    metrics,
    numerics,
    outcome,
    program,
    scaling,
    throughput,
    trainer,
)
from pytest_accelperf.checks import input as input_time
from pytest_accelperf.checks.base import BaseCheck
from pytest_accelperf.checks.protocol import Check
from pytest_accelperf.store.schema import declare_sections, withdraw_sections

#: The built-in checks, in the order of their rows.
BUILTIN: tuple[Check, ...] = (
    outcome.CHECK,
    throughput.CHECK,
    convergence.CHECK,
    metrics.CHECK,
    input_time.CHECK,
    input_wait.CHECK,
    trainer.CHECK,
    compile_time.CHECK,
    program.CHECK,
    memory.CHECK,
    numerics.CHECK,
    numerics.REFERENCE,
    max_batch.CHECK,
    scaling.CHECK,
)

#: The checks registered for this session (:func:`register`), after the built-in ones.
_added: list[Check] = []
for _check in BUILTIN:  # the store validates what a check records (store/schema.py)
    declare_sections(_check.section_models)

#: What a result gets that no check of the table names: a step metric (``accuracy``), a
#: check returned by the ``pytest_accelperf_extra_checks`` hook.
DEFAULT: Check = BaseCheck()


def checks() -> tuple[Check, ...]:
    """Every check: the built-in ones, then those registered."""
    return (*BUILTIN, *_added)


def check_of(metric: str) -> Check:
    """The check whose results carry ``metric``; :data:`DEFAULT` for a metric no check
    names."""
    return next((c for c in checks() if c.metric == metric), DEFAULT)


def register(*new: Check) -> None:
    """Add checks after the built-in ones (until :func:`unregister`). A metric that a
    check already has is a ValueError naming it."""
    taken = {c.metric for c in checks()}
    for check in new:
        if not check.metric or check.metric in taken:
            raise ValueError(f"check {check!r}: metric {check.metric!r} is "
                             f"{'taken by another check' if check.metric else 'empty'}; "
                             f"give it a name of its own")
        taken.add(check.metric)
    _added.extend(new)
    for check in new:
        declare_sections(check.section_models)


def unregister(*old: Check) -> None:
    """Remove checks :func:`register` added (those not registered are ignored)."""
    for check in old:
        if check in _added:
            _added.remove(check)
    kept = {name for check in checks() for name in check.section_models}
    withdraw_sections(name for check in old for name in check.section_models
                      if name not in kept)


@contextlib.contextmanager
def registered(*new: Check) -> Iterator[None]:
    """The checks ``new`` registered for the block."""
    register(*new)
    try:
        yield
    finally:
        unregister(*new)
