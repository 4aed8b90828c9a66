"""The checks: a run (and its baseline block) against the stored baseline block.

:func:`run_checks` is the one entry point. It returns one :class:`CheckResult` per metric
that applies to the run, in a fixed order:

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
    the largest batch that fits, when the test searched for it (:mod:`.max_batch`).

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
from pytest_accelperf.checks.throughput import check_throughput
from pytest_accelperf.run import Run
from pytest_accelperf.summary import summarize

__all__ = [
    "NO_BASELINE",
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
    "check_outcome",
    "check_program",
    "check_reference",
    "check_throughput",
    "run_checks",
]


def run_checks(run: Run, block: dict[str, Any] | None, baseline: dict[str, Any] | None,
               tol: Tolerances, *, comparable: bool = True, differences: Sequence[str] = (),
               program_differences: Sequence[str] | None = None,
               reference_params: Mapping[str, Any] | None = None,
               params: Mapping[str, Any] | None = None,
               loss_either_way: bool = False,
               max_foreign_load: float | None = None) -> list[CheckResult]:
    """Every check that applies to ``run`` against ``baseline`` (None: nothing stored).

    ``block`` is ``summarize(run)`` (computed here when None). ``comparable`` is False when
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
        block = summarize(run)
    program_comparable = comparable and not (
        differences if program_differences is None else program_differences)
    comparable = comparable and not differences
    results: list[CheckResult] = [check_outcome(run, block, baseline)]
    optional: list[CheckResult | None]
    if run.outcome == "ok" and run.extra.get("compile_only"):
        optional = [
            check_compile_time(block, baseline, tol, comparable=comparable,
                               compile_load=run.extra.get("compile_load"),
                               max_foreign_load=max_foreign_load),
            check_program(block, baseline, tol, comparable=program_comparable),
            check_memory(block, baseline, tol),
        ]
    elif run.outcome == "ok":
        optional = [
            check_throughput(run, block, baseline, tol, comparable=comparable,
                             differences=differences, max_foreign_load=max_foreign_load),
            check_convergence(run, block, baseline, tol, either_way=loss_either_way),
            *check_metrics(block, baseline, tol),
            check_input(block, baseline, tol, comparable=comparable),
            check_compile_time(block, baseline, tol, comparable=comparable,
                               compile_load=run.extra.get("compile_load"),
                               max_foreign_load=max_foreign_load),
            check_program(block, baseline, tol, comparable=program_comparable),
            check_memory(block, baseline, tol),
            check_numerics(block, baseline, tol, same_environment=comparable),
        ]
        if reference_params is not None:
            optional.append(check_reference(params, reference_params, tol))
    else:
        optional = [
            nan_result(run, baseline) if run.outcome == "nan" else None,
            check_memory(block, baseline, tol) if baseline is None or baseline.get("memory")
            else None,
        ]
    optional.append(check_max_batch(block, baseline))
    results.extend(r for r in optional if r is not None)
    return results
