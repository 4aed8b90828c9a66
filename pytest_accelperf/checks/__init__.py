"""The checks: a run (and its baseline block) against the stored baseline block.

:func:`run_checks` (:mod:`.apply`) is the one entry point. It returns one
:class:`CheckResult` per metric that applies to the run, in the order of the table of checks
(:data:`pytest_accelperf.checks.table.BUILTIN`, then any a plugin registered): each check is
one module defining ``CHECK`` (:class:`pytest_accelperf.checks.protocol.Check`), and the
table is the one place that lists them. The built-in ones:

``outcome``
    did it finish as the baseline did (:mod:`.outcome`);
``throughput``
    median step time, with a bootstrap interval (:mod:`.throughput`);
``loss``
    the loss curve within a band (:mod:`.convergence`);
each metric of the training step (``accuracy``, ``lr``, ...)
    its curve within a band, when the step returns metrics (:mod:`.metrics`);
``input``
    CPU time making each step's batch, where it is a meaningful share of the step
    (:mod:`.input`);
``input_wait``
    the time that thread was blocked making the batch, neither on a CPU nor waiting for
    one: a sleep, a slow read, a queue (:mod:`.input_wait`);
``compile``
    compile time, corrected for the machine's speed (:mod:`.compile_time`);
``program``
    what the compiled program does: FLOPs, bytes, collectives, host callbacks, graph breaks
    (:mod:`.program`), with no timing noise;
``memory``
    peak bytes per device, and live memory's growth per step (:mod:`.memory`);
``numerics``
    the parameter fingerprint (:mod:`.numerics`);
``reference``
    the parameters against a single-device reference run, when the case has one;
``max_batch``
    the largest batch that fits, when the test searched for it (:mod:`.max_batch`);
``scaling``
    the shape of a scaling curve, judged across the cases of a group when its last point
    arrives (:mod:`.scaling`), never by :func:`run_checks`.

A run that did not finish gets the ``outcome`` check, ``memory`` where there are numbers,
and, for a non-finite loss, a ``loss`` regression naming the step. A compile-only run
(``--accelperf-target``: ``run.compile_only``, no step executed) gets the checks
its program answers, ``outcome``, ``compile``, ``program`` and ``memory``; the ``outcome``
check names the ones not run (:data:`pytest_accelperf.provision.targets.NOT_RUN`), which are never a
verdict. With no baseline every
applicable metric is ``new`` (except that a failed run never passes); ``reference`` needs
no baseline. Checks never modify their inputs.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pytest_accelperf.checks.apply import run_checks
    from pytest_accelperf.checks.base import BaseCheck
    from pytest_accelperf.checks.compile_time import check_compile_time
    from pytest_accelperf.checks.convergence import check_convergence, nan_result
    from pytest_accelperf.checks.input import check_input
    from pytest_accelperf.checks.input_wait import check_input_wait
    from pytest_accelperf.checks.max_batch import check_max_batch
    from pytest_accelperf.checks.memory import check_memory
    from pytest_accelperf.checks.metrics import check_metrics
    from pytest_accelperf.checks.numerics import check_numerics, check_reference
    from pytest_accelperf.checks.outcome import NO_BASELINE, check_outcome
    from pytest_accelperf.checks.program import check_program
    from pytest_accelperf.checks.protocol import Check, CheckInput
    from pytest_accelperf.checks.table import check_of, checks
    from pytest_accelperf.checks.throughput import check_throughput
    from pytest_accelperf.records.verdict import CheckResult, Tolerances, Verdict

#: Where each name of this package lives: imported when first asked for, so that importing
#: one check's module (or :mod:`pytest_accelperf.records.verdict`, as every case does) does not
#: import every check, numpy and scipy with it (``accelperf history changes`` and the
#: other commands start faster).
_EXPORTS = {
    "NO_BASELINE": "outcome",
    "BaseCheck": "base",
    "Check": "protocol",
    "CheckInput": "protocol",
    "CheckResult": "pytest_accelperf.records.verdict",
    "Tolerances": "pytest_accelperf.records.verdict",
    "Verdict": "pytest_accelperf.records.verdict",
    "check_compile_time": "compile_time",
    "check_convergence": "convergence",
    "check_input": "input",
    "check_input_wait": "input_wait",
    "check_max_batch": "max_batch",
    "check_memory": "memory",
    "check_metrics": "metrics",
    "check_numerics": "numerics",
    "check_of": "table",
    "check_outcome": "outcome",
    "check_program": "program",
    "check_reference": "numerics",
    "check_throughput": "throughput",
    "checks": "table",
    "nan_result": "convergence",
    "run_checks": "apply",
}

__all__ = [
    "NO_BASELINE",
    "BaseCheck",
    "Check",
    "CheckInput",
    "CheckResult",
    "Tolerances",
    "Verdict",
    "check_compile_time",
    "check_convergence",
    "check_input",
    "check_input_wait",
    "check_max_batch",
    "check_memory",
    "check_metrics",
    "check_numerics",
    "check_of",
    "check_outcome",
    "check_program",
    "check_reference",
    "check_throughput",
    "checks",
    "nan_result",
    "run_checks",
]


def __getattr__(name: str) -> object:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'pytest_accelperf.checks' has no attribute {name!r}")
    if "." not in module:
        module = f"pytest_accelperf.checks.{module}"
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
