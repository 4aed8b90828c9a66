"""The outcome check: did the case finish as its baseline did?

A run ends ``ok``, or ``oom`` (it does not fit in device memory), ``nan`` (the loss
became non-finite), ``error`` or ``timeout``. Out of memory is an expected, recordable
outcome (a sweep's largest batch may not fit); the other three are failures and never a
baseline. The rule, baseline outcome against this run's:

========== ==================== =============
baseline   now                  verdict
========== ==================== =============
(none)     ok / oom             new
(none)     nan / error / timeout regression
same       same                 pass
ok         anything else        regression
not ok     ok                   improvement
oom        nan / error / timeout regression
========== ==================== =============

This module also holds what every check shares about a missing baseline: the ``new``
result and its sentence.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any, cast

from pytest_accelperf.checks.base import BaseCheck
from pytest_accelperf.checks.protocol import CheckInput, SubRow
from pytest_accelperf.provision.targets import NOT_RUN, not_run
from pytest_accelperf.records.run import OomRecord, Run
from pytest_accelperf.records.verdict import CheckData, CheckResult, Verdict
from pytest_accelperf.stats.units import fmt_bytes
from pytest_accelperf.store.block import Block, BlockLike, read_block

METRIC = "outcome"

#: The sentence of every ``new`` verdict: what to run to record the baseline.
NO_BASELINE = "no baseline; run with --accelperf-update to record it"

#: Outcomes that are failures: never stored, never a pass.
FAILED_OUTCOMES: tuple[str, ...] = ("nan", "error", "timeout")


def new_result(metric: str, *, now: float | None = None, unit: str = "",
               data: CheckData | None = None, detail: str = NO_BASELINE) -> CheckResult:
    """The ``new`` verdict of ``metric``: nothing stored to compare with, ``now`` shown."""
    return CheckResult(metric=metric, verdict=Verdict.NEW, detail=detail, now=now, unit=unit,
                       data=data.copy() if data else CheckData())


def missing_in_baseline(metric: str, what: str, baseline: Block, *,
                        now: float | None = None, unit: str = "") -> CheckResult:
    """``new`` for a metric the stored baseline lacks (e.g. no loss curve in an OOM baseline)."""
    outcome = baseline.outcome or "ok"
    why = "the baseline" if outcome == "ok" else f"the baseline ({_describe(outcome, None)})"
    return new_result(metric, now=now, unit=unit, data={"baseline_outcome": outcome},
                      detail=f"{why} has no {what}; run with --accelperf-update to record it")


def oom_sentence(oom: Mapping[str, Any] | None) -> str:
    """``"needs 20.93 GiB of 15.48 GiB"`` from an ``oom`` record, or ``""`` without one;
    whose memory plan it is where the record says (``(XLA:CPU's memory plan)``)."""
    if not oom:
        return ""
    required, capacity = oom.get("required_bytes"), oom.get("capacity_bytes")
    if required is None or capacity is None:
        return ""
    whose = f" ({oom['planned_by']}'s memory plan)" if oom.get("planned_by") else ""
    return f"needs {fmt_bytes(required)} of {fmt_bytes(capacity)}{whose}"


def _describe(outcome: str, oom: Mapping[str, Any] | None, nan_step: int | None = None) -> str:
    """An outcome in words, with the numbers that go with it."""
    if outcome == "oom":
        need = oom_sentence(oom)
        return f"out of memory: {need}" if need else "out of memory"
    if outcome == "nan":
        return f"loss became nan at step {nan_step}" if nan_step is not None else "loss became nan"
    return {"ok": "finished", "error": "failed with an error", "timeout": "timed out"}.get(
        outcome, outcome)


def _with_message(sentence: str, message: str) -> str:
    message = message.strip()
    if not message or message in sentence:
        return sentence
    return f"{sentence} ({message})"


def _required(oom: Mapping[str, Any] | None) -> float | None:
    value = (oom or {}).get("required_bytes")
    return float(value) if value is not None else None


def check_outcome(run: Run, block: BlockLike, baseline: BlockLike | None) -> CheckResult:
    """This run's outcome against the baseline's (see the table in the module docstring).

    Where either side ran out of memory, ``baseline``/``now`` are the bytes the case
    needs (unit ``bytes``), so the table shows how far from fitting it is. A compile-only
    run's (``run.compile_only``) says so, and names the checks that did not run
    (``data["not_run"]``).
    """
    result = _check_outcome(run, read_block(block), read_block(baseline))
    target = run.compile_only
    if target:
        result = replace(
            result, data={**result.data, "compile_only": str(target), "not_run": list(NOT_RUN)},
            detail=(f"{result.detail}; {not_run(str(target))}" if run.outcome == "ok"
                    else result.detail))
    return result


def _check_outcome(run: Run, block: Block, baseline: Block | None) -> CheckResult:
    # The block's OOM section is the JSON of a run's OomRecord.
    now_oom = cast(OomRecord, block.oom.to_json()) if block.oom is not None else run.oom
    data: CheckData = {"now": run.outcome, "message": run.message}
    if now_oom:
        data["oom"] = now_oom.copy()
    now_desc = _describe(run.outcome, now_oom, run.nan_step)
    unit = "bytes" if now_oom else ""

    if baseline is None:
        if run.outcome in FAILED_OUTCOMES:
            return CheckResult(METRIC, Verdict.REGRESSION,
                               _with_message(f"{now_desc}; a failed run never passes",
                                             run.message),
                               now=_required(now_oom), unit=unit, data=data)
        return new_result(METRIC, now=_required(now_oom), unit=unit, data=data)

    base_outcome = str(baseline.outcome or "ok")
    base_oom = cast(OomRecord, baseline.oom.to_json()) if baseline.oom is not None else None
    data["baseline"] = base_outcome
    if base_oom:
        data["baseline_oom"] = base_oom.copy()
        unit = "bytes"
    base_desc = _describe(base_outcome, base_oom)
    base_required, now_required = _required(base_oom), _required(now_oom)
    change = now_required / base_required - 1 if base_required and now_required else None

    verdict = Verdict.PASS
    if run.outcome == base_outcome:
        done = "compiled" if run.compile_only else "finished"
        detail = (f"{done} as in the baseline" if run.outcome == "ok"
                  else f"{now_desc}, as in the baseline")
        if run.outcome == "oom" and now_oom:
            detail = f"out of memory as in the baseline: {oom_sentence(now_oom)}"
    elif run.outcome == "ok":
        verdict = Verdict.IMPROVEMENT
        detail = (f"finished where the baseline did not ({base_desc}); "
                  f"run with --accelperf-update to record the new baseline")
    elif base_outcome == "ok":
        verdict = Verdict.REGRESSION
        where = "fit in memory" if run.outcome == "oom" else "finished"
        detail = _with_message(f"{now_desc} where the baseline {where}", run.message)
    elif run.outcome in FAILED_OUTCOMES:
        verdict = Verdict.REGRESSION
        detail = _with_message(f"{now_desc}; the baseline: {base_desc}", run.message)
    else:
        # Now out of memory, baseline a failure: failures are never stored, so the file
        # was edited by hand or written by another version.
        verdict = Verdict.INCOMPARABLE
        detail = (f"{now_desc}; the baseline records a failure ({base_desc}), which "
                  f"is never a baseline: re-record with --accelperf-update")
    return CheckResult(METRIC, verdict, detail, baseline=base_required, now=now_required,
                       unit=unit, change=change, data=data)


class OutcomeCheck(BaseCheck):
    """The ``outcome`` row: every run gets it, finished or not; a compile-only case's names
    its target, and the checks it did not run follow it."""

    metric = METRIC
    sections = ("outcome", "oom", "message")

    def check(self, given: CheckInput) -> tuple[CheckResult, ...]:
        return (check_outcome(given.run, given.block, given.baseline),)

    def label(self, result: CheckResult) -> str:
        """``outcome (compile-only tpu-v5e:2x4)`` for a compile-only case."""
        target = result.data.get("compile_only")
        return f"{result.metric} (compile-only {target})" if target else result.metric

    def sub_rows(self, result: CheckResult) -> list[SubRow]:
        """A compile-only case's checks that did not run (no step executed), in one row
        whose verdict column says ``not run``, never ``pass``."""
        names = result.data.get("not_run")
        if not isinstance(names, list) or not names:
            return []
        return [SubRow(", ".join(str(n) for n in names), verdict="not run")]


CHECK = OutcomeCheck()
