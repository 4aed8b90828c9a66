"""What a check is: the :class:`Check` protocol, what every check is given
(:class:`CheckInput`), and :class:`BaseCheck`, whose defaults a check overrides where it
differs.

A check is one module of :mod:`pytest_accelperf.checks` that defines ``CHECK``, an object
of this protocol, and one line of the table (:data:`pytest_accelperf.checks.table.BUILTIN`)
that names it. Everything that handles checks by kind loops over that table and asks the
check, rather than testing ``metric == "..."``:

* :func:`pytest_accelperf.checks.run_checks` calls every check's :meth:`~Check.check`, in
  the table's order (the order of the report's rows);
* :func:`pytest_accelperf.checks.summary.summarize` stores every check's :meth:`~Check.record` of
  the run in the baseline block (the sections it owns), and the schema validates a
  section that :class:`pytest_accelperf.store.schema.Block` does not declare with the check's
  :attr:`~Check.section_models`;
* :mod:`pytest_accelperf.checks.recordable` asks whether storing a baseline clears a failure
  (:meth:`~Check.not_cleared`) and whether a failure may never be stored
  (:meth:`~Check.refuses_recording`);
* :mod:`pytest_accelperf.checks.family` counts a check as an interval, another timing or a
  deterministic check by its :attr:`~Check.kind`;
* the terminal table (:mod:`pytest_accelperf.report.terminal`) asks for the metric
  column's label, whether the change is the gate's estimate, and rows under the check's.

A result is matched to its check by :attr:`CheckResult.metric
<pytest_accelperf.records.verdict.CheckResult.metric>` (:func:`pytest_accelperf.checks.table.
check_of`); a result no check of the table names (a step metric such as ``accuracy``, a
hook's own check) gets :class:`BaseCheck`'s defaults. Checks never modify their inputs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from pytest_accelperf.records.run import Run
from pytest_accelperf.records.verdict import CheckResult, Tolerances
from pytest_accelperf.store.block import Block

#: How :mod:`pytest_accelperf.checks.family` counts a check's results: ``interval`` (a timing whose
#: verdict may come from an interval, with a false-alarm rate), ``timing`` (a timing without
#: one: counted apart), ``deterministic`` (only counted).
Kind = Literal["interval", "timing", "deterministic"]


@dataclass(frozen=True)
class CheckInput:
    """What every check is given: the run, its baseline block, the stored block (None:
    nothing stored) and the case's tolerances, with what the session knows about them.
    The blocks are read as :class:`~pytest_accelperf.store.block.Block` (its sections typed:
    ``given.baseline.step_time.samples``; a check's own section as its
    :attr:`~Check.section_models` says), not validated: a run's own block may hold what
    the store refuses (a failed outcome, a NaN), which the checks judge
    (:func:`~pytest_accelperf.store.block.read`).

    ``comparable``: the baseline was recorded in this environment, so timings are compared
    (``differences`` say how it differs, in words, when it is not). ``program_comparable``:
    the same for the compiled program (another host CPU runs the same program).
    ``stack``: how the stack (Python, framework packages, accelerator libraries) differs
    from the baseline's, in words (:func:`pytest_accelperf.provision.describe.stack_changes`); a
    stack change is judged like any other change, never ``incomparable``, but what depends
    on the stack's own arithmetic or speed says so (numerics at the cross-environment
    tolerance; no drift correction by a probe that runs on the stack under test).
    ``params``/``reference_params``: flat ``{path: array}`` final parameters of the run and
    of its single-device reference (None: no reference). ``loss_either_way``:
    ``--accelperf-loss-either-way``. ``max_foreign_load``: ``--accelperf-max-foreign-load``.

    Timing is kept per machine (:mod:`pytest_accelperf.store.machines`): ``comparable``,
    ``differences`` and ``stack`` are of this machine's timing in the baseline;
    ``shared_differences`` and ``shared_stack`` (None: the same) of the environment the
    shared sections were recorded in (numerics, its tolerance). ``machine_new``: this
    machine's name where the baseline has no timing of it (its timing checks are then
    ``new for this machine``, :func:`pytest_accelperf.checks.apply.run_checks`).
    """

    run: Run
    block: Block
    baseline: Block | None
    tol: Tolerances
    comparable: bool = True
    program_comparable: bool = True
    differences: tuple[str, ...] = ()
    stack: tuple[str, ...] = ()
    params: Mapping[str, Any] | None = None
    reference_params: Mapping[str, Any] | None = None
    loss_either_way: bool = False
    max_foreign_load: float | None = None
    shared_differences: tuple[str, ...] | None = None
    shared_stack: tuple[str, ...] | None = None
    machine_new: str = ""

    @property
    def same_environment(self) -> bool:
        """Whether the shared sections (numerics) were recorded in this environment: the
        same machine and stack."""
        differ = self.differences if self.shared_differences is None \
            else self.shared_differences
        stack = self.stack if self.shared_stack is None else self.shared_stack
        return self.comparable and not differ and not stack

    @property
    def ok(self) -> bool:
        """Whether the run finished (outcome ``ok``)."""
        return self.run.outcome == "ok"

    @property
    def stepped(self) -> bool:
        """Whether the run finished having executed its steps (:func:`stepped`): most checks
        judge only such a run."""
        return stepped(self.run)


def stepped(run: Run) -> bool:
    """Whether ``run`` finished (outcome ``ok``) having executed its steps: not a
    compile-only run (``--accelperf-target``, ``run.compile_only``), which has a
    program, a compile time and a memory plan, and no step times, loss or parameters."""
    return run.outcome == "ok" and not run.compile_only


@dataclass(frozen=True)
class SubRow:
    """A row the terminal table shows under a check's own (a device's memory, the checks a
    compile-only case did not run): numbers in ``unit``, formatted by the table as a
    check's are, and what its verdict column says."""

    label: str
    baseline: float | None = None
    now: float | None = None
    change: float | None = None
    unit: str = ""
    verdict: str = ""


class Check(Protocol):
    """One check: a metric of a run judged against the stored baseline.

    ``metric``: the metric its results carry (:attr:`CheckResult.metric
    <pytest_accelperf.records.verdict.CheckResult.metric>`), and the name a reader sees in the
    table. ``tolerances``: the fields of :class:`~pytest_accelperf.records.verdict.Tolerances`
    it reads. ``sections``: the fields of the baseline block it reads
    (:class:`pytest_accelperf.store.schema.Block`). ``section_models``: the schema of sections it
    adds that :class:`~pytest_accelperf.store.schema.Block` does not declare (``{name: pydantic
    model or type}``). ``cleared_by_a_baseline``: whether storing the run as the baseline
    (``--accelperf-update``, ``accelperf baselines accept``) clears its failure.
    ``kind``: how the suite's verdict counts it (:data:`Kind`).
    """

    @property
    def metric(self) -> str: ...

    @property
    def tolerances(self) -> tuple[str, ...]: ...

    @property
    def sections(self) -> tuple[str, ...]: ...

    @property
    def section_models(self) -> Mapping[str, Any]: ...

    @property
    def cleared_by_a_baseline(self) -> bool: ...

    @property
    def kind(self) -> Kind: ...

    def check(self, given: CheckInput) -> Sequence[CheckResult]:
        """Its results for the run in ``given`` (none where it does not apply)."""
        ...

    def record(self, run: Run) -> Mapping[str, object]:
        """The sections of the baseline block it owns, for ``run`` (``{}``: none)."""
        ...

    def not_cleared(self, result: CheckResult) -> str | None:
        """Why storing a baseline does not clear ``result``, a failure of this check (a
        sentence that names the fix); None where it does."""
        ...

    def refuses_recording(self, result: CheckResult) -> str | None:
        """Why a run with ``result``, a failure of this check, must never be stored as a
        baseline; None where it may be."""
        ...

    def label(self, result: CheckResult) -> str:
        """The metric column of ``result``'s row in the terminal table."""
        ...

    def adjusted(self, result: CheckResult) -> bool:
        """Whether ``result.change`` is the gate's estimate rather than now over the
        baseline column (the table marks it)."""
        ...

    def sub_rows(self, result: CheckResult) -> Sequence[SubRow]:
        """Rows the terminal table shows under ``result``'s own."""
        ...


def one(result: CheckResult | None) -> tuple[CheckResult, ...]:
    """``result`` as the sequence :meth:`Check.check` returns: empty for None."""
    return () if result is None else (result,)
