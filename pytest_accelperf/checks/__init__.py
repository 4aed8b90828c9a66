"""The checks: a run (and its baseline block) against the stored baseline block.

:func:`run_checks` is the one entry point. It returns one :class:`CheckResult` per metric
that applies to the run, in the order of the table of checks
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
(``--accelperf-target``: ``run.extra["compile_only"]``, no step executed) gets the checks
its program answers, ``outcome``, ``compile``, ``program`` and ``memory``; the ``outcome``
check names the ones not run (:data:`pytest_accelperf.targets.NOT_RUN`), which are never a
verdict. With no baseline every
applicable metric is ``new`` (except that a failed run never passes); ``reference`` needs
no baseline. Checks never modify their inputs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pytest_accelperf import summary
from pytest_accelperf.block import BlockLike, read_block
from pytest_accelperf.checks.base import CheckResult, Tolerances, Verdict
from pytest_accelperf.checks.compile_time import check_compile_time
from pytest_accelperf.checks.convergence import check_convergence, nan_result
from pytest_accelperf.checks.input import check_input
from pytest_accelperf.checks.max_batch import check_max_batch
from pytest_accelperf.checks.memory import check_memory
from pytest_accelperf.checks.metrics import check_metrics
from pytest_accelperf.checks.numerics import check_numerics, check_reference
from pytest_accelperf.checks.outcome import NO_BASELINE, check_outcome
from pytest_accelperf.checks.program import check_program
from pytest_accelperf.checks.protocol import BaseCheck, Check, CheckInput
from pytest_accelperf.checks.table import check_of, checks
from pytest_accelperf.checks.throughput import check_throughput
from pytest_accelperf.run import Run
from pytest_accelperf.schema import block_model

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


def run_checks(run: Run, block: BlockLike | None, baseline: BlockLike | None,
               tol: Tolerances, *, comparable: bool = True, differences: Sequence[str] = (),
               program_differences: Sequence[str] | None = None,
               reference_params: Mapping[str, Any] | None = None,
               params: Mapping[str, Any] | None = None,
               loss_either_way: bool = False,
               max_foreign_load: float | None = None) -> list[CheckResult]:
    """Every check that applies to ``run`` against ``baseline`` (None: nothing stored).

    ``block`` is ``summarize(run)`` (computed here when None); it and ``baseline`` are read
    as :class:`~pytest_accelperf.block.Block` with the sections of every check of the table
    (:func:`pytest_accelperf.schema.block_model`) for the checks. ``comparable`` is False when
    the baseline was recorded in another environment, and ``differences`` say how (in
    words, :func:`pytest_accelperf.fingerprint.differences`; any makes it not comparable):
    throughput, input time, compile time and the program are then ``incomparable`` and the other
    checks still apply (numerics at its cross-environment tolerance).
    ``program_differences`` (default: ``differences``) are those that make the program
    incomparable (:data:`pytest_accelperf.fingerprint.PROGRAM_KEYS`): another host CPU
    runs the same program.
    ``params``/``reference_params`` are flat ``{path: array}`` dicts of final parameters;
    with a reference the ``reference`` check runs, baseline or not. ``loss_either_way``:
    a loss below its band fails too (``--accelperf-loss-either-way``).
    ``max_foreign_load``: cores other processes may have used while the step compiled, or
    while its steps were measured, before a compile-time or throughput change is not
    judged (``--accelperf-max-foreign-load``).
    """
    if block is None:
        block = summary.summarize(run)
    model = block_model()
    given = CheckInput(
        run=run, block=read_block(block, model), baseline=read_block(baseline, model), tol=tol,
        comparable=comparable and not differences,
        program_comparable=comparable and not (
            differences if program_differences is None else program_differences),
        differences=tuple(differences), params=params, reference_params=reference_params,
        loss_either_way=loss_either_way, max_foreign_load=max_foreign_load)
    return [result for check in checks() for result in check.check(given)]
