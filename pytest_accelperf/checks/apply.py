"""Every check of the table applied to one run: :func:`run_checks`, the one entry point of
:mod:`pytest_accelperf.checks`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from pytest_accelperf.checks import summary
from pytest_accelperf.checks.protocol import CheckInput
from pytest_accelperf.checks.table import check_of, checks
from pytest_accelperf.provision.describe import stack_words
from pytest_accelperf.records.run import Run
from pytest_accelperf.records.verdict import CheckResult, Tolerances, Verdict
from pytest_accelperf.store.block import BlockLike, read_block
from pytest_accelperf.store.schema import block_model


def run_checks(run: Run, block: BlockLike | None, baseline: BlockLike | None,
               tol: Tolerances, *, comparable: bool = True, differences: Sequence[str] = (),
               program_differences: Sequence[str] | None = None,
               stack: Sequence[str] = (),
               reference_params: Mapping[str, Any] | None = None,
               params: Mapping[str, Any] | None = None,
               loss_either_way: bool = False,
               max_foreign_load: float | None = None,
               shared_differences: Sequence[str] | None = None,
               shared_stack: Sequence[str] | None = None,
               machine_new: str = "") -> list[CheckResult]:
    """Every check that applies to ``run`` against ``baseline`` (None: nothing stored).

    ``block`` is ``summarize(run)`` (computed here when None); it and ``baseline`` are read
    as :class:`~pytest_accelperf.store.block.Block` with the sections of every check of the table
    (:func:`pytest_accelperf.store.schema.block_model`) for the checks. ``comparable`` is False when
    the baseline was recorded in another environment, and ``differences`` say how (in
    words, :func:`pytest_accelperf.provision.describe.differences`; any makes it not comparable):
    throughput, input time, compile time and the program are then ``incomparable`` and the other
    checks still apply (numerics at its cross-environment tolerance).
    ``program_differences`` (default: ``differences``) are those that make the program
    incomparable (:data:`pytest_accelperf.provision.describe.PROGRAM_KEYS`): another host CPU
    runs the same program.
    ``stack``: how the stack differs from the baseline's
    (:func:`pytest_accelperf.provision.describe.stack_changes`): every check judges the run all
    the same, and each verdict against the baseline names it in its detail and its data
    (``stack: jax 0.8.3 → 0.10.2``).
    ``params``/``reference_params`` are flat ``{path: array}`` dicts of final parameters;
    with a reference the ``reference`` check runs, baseline or not. ``loss_either_way``:
    a loss below its band fails too (``--accelperf-loss-either-way``).
    ``max_foreign_load``: cores other processes may have used while the step compiled, or
    while its steps were measured, before a compile-time or throughput change is not
    judged (``--accelperf-max-foreign-load``).

    Timing is kept per machine (:mod:`pytest_accelperf.store.machines`): ``differences``
    and ``stack`` are then those of this machine's timing in the baseline, and
    ``shared_differences`` and ``shared_stack`` (None: the same) those of the shared
    sections (the numerics' tolerance; the stack the deterministic verdicts name).
    ``machine_new``: this machine's name, where the baseline has no timing of it: each
    timing check (a check of kind ``interval`` or ``timing``) that found nothing to compare
    says ``new for this machine``, and the deterministic checks are judged as ever.
    """
    if block is None:
        block = summary.summarize(run)
    model = block_model()
    given = CheckInput(
        run=run, block=read_block(block, model), baseline=read_block(baseline, model), tol=tol,
        comparable=comparable and not differences,
        program_comparable=comparable and not (
            differences if program_differences is None else program_differences),
        differences=tuple(differences), stack=tuple(stack), params=params,
        reference_params=reference_params, loss_either_way=loss_either_way,
        max_foreign_load=max_foreign_load,
        shared_differences=None if shared_differences is None else tuple(shared_differences),
        shared_stack=None if shared_stack is None else tuple(shared_stack),
        machine_new=machine_new)
    results = [result for check in checks() for result in check.check(given)]
    if machine_new:
        results = [new_for_machine(r, machine_new) if _timing(r) else r for r in results]
    shared = stack if shared_stack is None else shared_stack
    if not stack and not shared:
        return results
    return [named_stack(r, stack if _timing(r) else shared) for r in results]


def _timing(result: CheckResult) -> bool:
    """Whether ``result`` is of a timing check (kept per machine)."""
    return check_of(result.metric).kind != "deterministic"


def new_for_machine(result: CheckResult, machine: str) -> CheckResult:
    """``result``, a timing check's, as ``new for this machine`` where it found nothing to
    compare with (the baseline holds no timing of ``machine``); as it is otherwise."""
    if result.verdict is not Verdict.NEW:
        return result
    return replace(result, detail=(
        f"new for this machine ({machine}): the baseline holds no timing of it; run with "
        f"--accelperf-update to record its timing beside the other machines'"),
        data={**result.data, "machine_new": machine})


#: Verdicts that compared the run with a baseline, and so name a stack change.
_COMPARED = (Verdict.PASS, Verdict.REGRESSION, Verdict.IMPROVEMENT, Verdict.INCONCLUSIVE)


def named_stack(result: CheckResult, stack: Sequence[str]) -> CheckResult:
    """``result`` naming the stack change it was judged across, in its detail and as
    ``data["stack"]`` (a verdict against a baseline; ``new`` and ``incomparable`` compared
    nothing)."""
    if not stack or result.verdict not in _COMPARED or "stack" in result.data:
        return result
    words = stack_words(stack)
    detail = f"{result.detail}; {words}" if result.detail else words
    return replace(result, detail=detail, data={**result.data, "stack": list(stack)})
