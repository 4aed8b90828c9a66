"""The verdicts of A/B mode (see :mod:`pytest_accelperf.ab`).

Throughput: the paired ratio of an :class:`~pytest_accelperf.ab.rounds.ABMeasurement`
under the tolerance, with the two arms' programs diffed (:func:`ab_check`); ``new`` for a
case the base revision lacks (:func:`new_in_head`); the stored-baseline check, with a note,
for one that could not be compared (:func:`not_compared`).

The deterministic checks against the base arm's own record, not the stored baseline: the
program, as each arm's worker compiled it (:func:`ab_program_check`); memory, numerics and
loss, the head's normal run (the pytest process's) against the run the base arm trained
once as a normal run trains it (:func:`ab_record_checks`), by the very checks of the
stored-baseline path (:mod:`pytest_accelperf.checks.memory`, ``.numerics``,
``.convergence``) with the base's run as their baseline. Each returns a new
:class:`CheckResult`, never changing the one it was given.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import replace

from pytest_accelperf.ab.rounds import ABMeasurement
from pytest_accelperf.checks.apply import named_stack
from pytest_accelperf.checks.program import check_program
from pytest_accelperf.checks.protocol import CheckInput
from pytest_accelperf.checks.summary import summarize
from pytest_accelperf.checks.table import DEFAULT, check_of
from pytest_accelperf.checks.throughput import foreign_load
from pytest_accelperf.records.program import describe_changes
from pytest_accelperf.records.run import Run
from pytest_accelperf.records.verdict import CheckData, CheckResult, Tolerances, Verdict
from pytest_accelperf.stats.bootstrap import MAX_PAIRS, ProcessSpread, ab_ratio, ab_verdict, pairs_t
from pytest_accelperf.stats.contention import contaminated
from pytest_accelperf.stats.units import fmt_percent, fmt_ratio, fmt_signed_percent, fmt_tolerance
from pytest_accelperf.store.block import Block, read_block
from pytest_accelperf.store.schema import block_model

METRIC = "throughput"


def program_diff(measured: ABMeasurement, tolerance: float) -> list[str] | None:
    """How the head's program differs from the base's, in words (empty: the same
    program); None when either arm has no program record."""
    base, head = measured.programs.get("base"), measured.programs.get("head")
    if not base or not head:
        return None
    return describe_changes(base, head, tolerance)


def ab_check(label: str, measured: ABMeasurement, samples_per_step: int,
             tolerance: float, block: int, max_foreign_load: float = math.inf,
             program_tolerance: float = 0.01, stack: str = "",
             stacks: dict[str, dict[str, str]] | None = None,
             environment: str = "") -> CheckResult:
    """The throughput verdict of an A/B measurement: ``inconclusive`` whatever the ratio
    when other processes used more than ``max_foreign_load`` cores during it. The two
    arms' programs are diffed and the difference follows the verdict: a slowdown comes
    with its likely cause (``program: all-gather: 2 → 6 per step (+48.00 MiB)``), or with
    ``same program`` when only the kernels' speed can explain it. ``stack``: how the two
    arms' environments differ (``stack: jax 0.8.3 → 0.10.2``), named after it;
    ``stacks``: each arm's, and ``environment``: the base arm's where it is not this
    session's, for the report."""
    est, spread = ab_ratio(measured.head, measured.base, measured.pairs)
    verdict = ab_verdict(est, tolerance)
    dirty = contaminated(measured.load, max_foreign_load)
    if dirty:
        verdict = Verdict.INCONCLUSIVE
    base_median = float(_median([t for b in measured.base for t in b]))
    head_median = float(_median([t for b in measured.head for t in b]))
    unit = "samples/s" if samples_per_step else "s"
    # The row's two figures come from the estimator of its change: the base arm's typical
    # least-disturbed step (the median over its rounds of a round's fastest step, what the
    # paired ratio pairs), and that step times the paired ratio. Medians of every step
    # (kept in data) disagreed with the change column: a row read 45,589/s → 38,733/s
    # beside "+22.6%", the medians' noise against the paired estimate.
    base_step = float(_median([min(b) for b in measured.base if len(b)]))
    head_step = base_step * est.ratio

    def rate(seconds: float) -> float:
        return samples_per_step / seconds if samples_per_step else seconds

    ci = (f"{est.confidence * 100:.0f}% CI of the paired step-time ratio "
          f"{fmt_ratio(est.low)}\u2013{fmt_ratio(est.high)}{_levels(spread)}, tolerance "
          f"{fmt_tolerance(tolerance)}; {len(measured.base)} alternating rounds of {block} "
          f"steps in {measured.seconds:.1f} s")
    if verdict is Verdict.REGRESSION:
        text = f"slower than {label}: step time {fmt_percent(est.ratio - 1)} longer ({ci})"
    elif verdict is Verdict.IMPROVEMENT:
        text = f"faster than {label}: step time {fmt_percent(1 - est.ratio)} shorter ({ci})"
    elif dirty:
        assert measured.load is not None
        text = (f"against {label}: not judged, the measurement is contaminated: "
                f"{measured.load.text()} (bound --accelperf-max-foreign-load="
                f"{max_foreign_load:g}); step time {fmt_signed_percent(est.ratio - 1)} "
                f"({ci}); run on a machine with nothing else running, or raise the bound")
    elif verdict is Verdict.INCONCLUSIVE:
        text = (f"against {label}: noise too large to resolve ±{fmt_tolerance(tolerance)}: "
                f"smallest detectable change here is ±{fmt_percent(est.mdc)} (step time "
                f"{fmt_signed_percent(est.ratio - 1)}, {ci}); {_narrower(spread)}")
    else:
        text = (f"within tolerance of {label}: step time "
                f"{fmt_signed_percent(est.ratio - 1)} ({ci})")
    diff = program_diff(measured, program_tolerance)
    if diff is not None:
        text += (f"; program: {'; '.join(diff)}" if diff
                 else "; same program in both revisions")
    if stack:
        text += f"; {stack}"
    data: CheckData = {
        "mode": "ab", "ref": label, "tolerance": tolerance, "ratio": est.ratio,
        "ci": [est.low, est.high], "mdc": est.mdc, "confidence": est.confidence,
        "rounds": len(measured.base), "block": block, "seconds": measured.seconds,
        "first": measured.first, "load": measured.load.to_json() if measured.load else None,
        "max_foreign_load": max_foreign_load if math.isfinite(max_foreign_load) else None,
        "contaminated": dirty, "processes": measured.processes, "pairs": measured.pairs,
        "process_sd": spread.process_sd if spread else None,
        "within_sd": spread.within_sd if spread else None,
        "median_step_time": {"now": head_median, "baseline": base_median},
        "blocks": {"base": measured.base, "head": measured.head}, "program_diff": diff,
        "stack": stacks or None, "base_env": environment or None}
    return CheckResult(METRIC, verdict, f"A/B {text}", baseline=rate(base_step),
                       now=rate(head_step), unit=unit,
                       change=(1 / est.ratio if samples_per_step else est.ratio) - 1, data=data)


def _narrower(spread: ProcessSpread | None) -> str:
    """What would narrow an interval too wide to judge: more process pairs where they
    are what widens it (two pairs, Student's t of 12.71; or a spread between processes
    that counts for more than the rounds', which a longer budget does not narrow), else
    more rounds (a longer budget)."""
    if spread is not None and spread.processes < MAX_PAIRS and (
            spread.processes < 3 or spread.process_dominates):
        k = spread.processes
        why = (f"over {k} process pairs the interval is Student's t {pairs_t(k):.2f} "
               f"standard errors wide each way, over {k + 1} {pairs_t(k + 1):.2f}")
        if spread.process_dominates:
            why += ("; the processes' spread counts for more in it than the rounds', "
                    "and a longer budget narrows only the rounds' part")
        return f"raise --accelperf-compare-processes ({why}) or use a quieter machine"
    return "raise --accelperf-compare-budget or use a quieter machine"


def _levels(spread: ProcessSpread | None) -> str:
    """The interval's two levels, in words: over how many process pairs, and the spread
    between them beside the spread between rounds (the larger named first)."""
    if spread is None:
        return (" over the rounds of one process per revision (the between-process "
                "variance is not sampled: --accelperf-compare-processes)")
    between = f"between processes sd {fmt_percent(spread.process_sd, 2)}"
    within = f"between rounds sd {fmt_percent(spread.within_sd, 2)}"
    levels = f"{between}, {within}" if spread.process_dominates else f"{within}, {between}"
    return f" over {spread.processes} process pairs ({levels})"


def _median(values: list[float]) -> float:
    return statistics.median(values)


def not_compared(label: str, why: str, stored: CheckResult | None) -> CheckResult | None:
    """The throughput check when a case could not be compared: the stored-baseline check
    with a note, or ``new`` when the base revision has no such case."""
    if stored is None:
        return None
    return replace(stored, detail=f"{stored.detail} [not compared with {label}: {why}]".strip(),
                   data={**stored.data, "ab": {"ref": label, "skipped": why}})


def new_in_head(label: str, why: str, stored: CheckResult | None) -> CheckResult:
    """The throughput check of a case the base revision does not have: ``new``."""
    return CheckResult(METRIC, Verdict.NEW, f"not in {label} ({why}): nothing to compare "
                       f"with", now=stored.now if stored else None,
                       unit=stored.unit if stored else "samples/s",
                       data={"mode": "ab", "ref": label})


PROGRAM_METRIC = "program"


def ab_program_check(label: str, measured: ABMeasurement, tolerance: float
                     ) -> CheckResult | None:
    """The program check of A/B mode: the head's program against the base arm's own, as
    each arm's worker compiled or dispatched it, exactly (no timing): more work than the
    base revision is a ``regression`` that fails the case even where the timing interval
    cannot resolve it; less, an ``improvement``. None when either arm has no program
    record (the stored-baseline check stands). An A/B verdict (``data["mode"] == "ab"``):
    the base revision decides it, no baseline clears it."""
    base, head = measured.programs.get("base"), measured.programs.get("head")
    if not base or not head:
        return None
    result = check_program({"program": head}, {"program": base},
                           Tolerances(program_tolerance=tolerance), comparable=True)
    if result is None:
        return None
    data: CheckData = {**result.data, "mode": "ab", "against": label}
    if result.verdict is Verdict.REGRESSION:
        lines = "; ".join(describe_changes(base, head, tolerance))
        detail = (f"more work than {label}: {lines} (A/B: each revision's own program, "
                  f"no timing)")
    elif result.verdict is Verdict.IMPROVEMENT:
        lines = "; ".join(describe_changes(base, head, tolerance))
        detail = f"less work than {label}: {lines} (A/B: each revision's own program)"
    elif result.verdict is Verdict.PASS:
        detail = result.detail.replace("same program as the baseline",
                                       f"same program as {label}")
    else:
        detail = f"{result.detail} (A/B: against {label}'s program)"
    return replace(result, detail=detail, data=data)


#: The checks A/B mode judges against the base arm's record (:func:`ab_record_checks`):
#: besides the step's outcome, memory, numerics and losses, the making of its batches
#: (``input``: CPU time; ``input_wait``: time blocked), which no A/B step time includes.
RECORD_METRICS = ("outcome", "memory", "numerics", "loss", "metrics", "input", "input_wait")

#: What a stored-baseline detail says that is not so of the base arm (its remedies), then
#: how it names the baseline, in A/B words (``{label}``: the base revision), in this order.
_REMEDIES = ("; run with --accelperf-update to record the new baseline",
             "; run with --accelperf-update to record it",
             "; if intended, re-record with --accelperf-update",
             "; re-record with --accelperf-update")
_NAMES = (("the baseline fingerprint", "{label}'s fingerprint"),
          ("the baseline's", "{label}'s"),
          ("the baseline", "{label}"),
          (", baseline ", ", {label} "))


def in_ab_words(detail: str, label: str) -> str:
    """A stored-baseline check's ``detail`` as said of the base revision ``label``: its
    baseline named as ``label``, its remedies (re-recording with ``--accelperf-update``,
    which does not change an A/B verdict) left out.

    >>> in_ab_words("peak memory on cpu:0 is 2.00 MiB, baseline 1.00 MiB (+100.0%, "
    ...             "tolerance 10%)", "HEAD (0123456789)")
    'peak memory on cpu:0 is 2.00 MiB, HEAD (0123456789) 1.00 MiB (+100.0%, tolerance 10%)'
    >>> in_ab_words("loss at step 9 is 0.9, above the baseline's 0.5 ± 0.026 (rtol 5%, "
    ...             "atol 0.001)", "main")
    "loss at step 9 is 0.9, above main's 0.5 ± 0.026 (rtol 5%, atol 0.001)"
    """
    for remedy in _REMEDIES:
        detail = detail.replace(remedy, "")
    for old, new in _NAMES:
        detail = detail.replace(old, new.format(label=label))
    return detail


def _headline(result: CheckResult, label: str) -> str:
    """What an A/B verdict of the base arm's record says first: ``more memory than
    {label}``, ``same numerics as {label}``; ``""`` for a verdict that is the head's
    alone (a leak, a loss that is not finite)."""
    verdict, metric, data = result.verdict, result.metric, result.data
    if data.get("leak") or "nan_step" in data:
        return ""
    words = {("outcome", Verdict.PASS): "same outcome as",
             ("memory", Verdict.REGRESSION): "more memory than",
             ("memory", Verdict.IMPROVEMENT): "less memory than",
             ("memory", Verdict.PASS): "as much memory as",
             ("numerics", Verdict.REGRESSION): "other numerics than",
             ("numerics", Verdict.PASS): "same numerics as",
             ("loss", Verdict.REGRESSION): ("other training than" if data.get("either_way")
                                            else "higher loss than"),
             ("loss", Verdict.IMPROVEMENT): "lower loss than",
             ("loss", Verdict.PASS): "same loss curve as",
             ("input", Verdict.REGRESSION): "more CPU a batch than",
             ("input", Verdict.IMPROVEMENT): "less CPU a batch than",
             ("input", Verdict.PASS): "as much CPU a batch as",
             ("input_wait", Verdict.REGRESSION): "longer waits a batch than",
             ("input_wait", Verdict.IMPROVEMENT): "shorter waits a batch than",
             ("input_wait", Verdict.PASS): "as long waits a batch as"}
    if (metric, verdict) not in words and check_of(metric) is DEFAULT:  # a step metric
        return f"{'same' if verdict is Verdict.PASS else 'other'} {metric} curve " \
               f"{'as' if verdict is Verdict.PASS else 'than'} {label}"
    return f"{words.get((metric, verdict), 'against')} {label}"


def ab_record_checks(label: str, measured: ABMeasurement, run: Run, block: Block,
                     tol: Tolerances, *, loss_either_way: bool = False,
                     stack: tuple[str, ...] = (), max_foreign_load: float | None = None
                     ) -> dict[str, CheckResult]:
    """The outcome, memory, numerics, loss and batch (input) checks of A/B mode
    (:data:`RECORD_METRICS`): ``run`` (the head's normal run; ``block``, its
    ``summarize(run)``) against the base arm's record
    of the case (``measured.base_run``), by each check of the table
    (:meth:`~pytest_accelperf.checks.protocol.Check.check`, as
    :func:`~pytest_accelperf.checks.run_checks` calls it) with the base's run as the
    baseline. Per metric the A/B verdict (``data["mode"] == "ab"``, ``data["against"]``:
    ``label``; its detail says ``than``/``as`` ``label``): a regression fails the case
    whether or not a baseline is stored, and no baseline clears it.

    ``stack``: how the head's stack differs from the base arm's, one package a phrase
    (``--accelperf-compare-python``, or an environment built for the base revision). Then
    the numerics are compared at the cross-environment tolerance
    (``numerics_cross_rtol``/``atol``: other kernels round differently), as against a
    baseline recorded under another stack, and every verdict that compared names the
    difference (``stack: jax 0.8.3 → 0.10.2``): an upgrade that changes the arithmetic
    beyond that tolerance is a regression, named with the upgrade, never hidden.

    The batch checks compare the two runs' per-step samples by the input checks' own rules
    (their floor, their interval, ``input_tolerance``). Unlike A/B's rounds, the two runs
    are not interleaved, and a batch's CPU time moves with the machine's load too (caches
    and cores shared: unchanged code's 3.4 ms against 5.4 ms, A/A beside CI's tests): a
    change measured while either run had other processes using more than
    ``max_foreign_load`` cores (``--accelperf-max-foreign-load``) is ``inconclusive``,
    as the throughput verdict is.

    Empty where the base arm has no record (``measured.base_run`` None) or its run did not
    finish (the stored-baseline checks stand: :func:`record_not_compared`); a metric the
    base's run has nothing of (``new``) is left out too. A verdict that is the head's
    alone (a leak: live memory growing per step) keeps its own words and is no A/B verdict
    (no ``data["mode"]``): what clears it is its own check's."""
    base = measured.base_run
    if base is None or base.outcome != "ok":
        return {}
    model = block_model()
    given = CheckInput(run=run, block=read_block(block, model),
                       baseline=read_block(summarize(base), model), tol=tol, stack=stack,
                       loss_either_way=loss_either_way, max_foreign_load=max_foreign_load)
    out: dict[str, CheckResult] = {}
    loaded = "; ".join(f"{arm}: {why}" for arm, why in (
        ("this run", foreign_load(run, max_foreign_load)),
        (f"{label}'s run", foreign_load(base, max_foreign_load))) if why)
    for metric in RECORD_METRICS:
        for result in check_of(metric).check(given):  # the step metrics: one per metric
            if result.verdict is Verdict.NEW:
                continue
            result = named_stack(result, stack)
            headline = _headline(result, label)
            if not headline:  # the head's alone (a leak): judged, and cleared, as always
                out[result.metric] = replace(result, data={**result.data, "against": label})
                continue
            result = replace(
                result, detail=f"{headline}: {in_ab_words(result.detail, label)}",
                data={**result.data, "mode": "ab", "against": label})
            out[result.metric] = (_unloaded(result, loaded) if metric in BATCH_METRICS
                                  else result)
    return out


#: The checks of the making of the batch among :data:`RECORD_METRICS`: two runs not
#: interleaved, so judged only where neither was measured beside another job.
BATCH_METRICS = ("input", "input_wait")


def _unloaded(result: CheckResult, loaded: str) -> CheckResult:
    """A batch check's ``result``, or, where a run was measured beside another job
    (``loaded``, why), its regression or improvement ``inconclusive``, saying why and what
    was measured (a ``pass`` holds; ``input_wait`` has already said so of this run)."""
    measured = result.verdict.value
    if result.verdict is Verdict.INCONCLUSIVE and result.data.get("contaminated"):
        # set aside already, by the check's own evidence (the input check's): A/B's reason
        # goes first, the check's stays in the detail
        measured = str(result.data.get("measured_verdict") or "")
    if not loaded or measured not in (Verdict.REGRESSION.value, Verdict.IMPROVEMENT.value):
        return result
    return replace(result, verdict=Verdict.INCONCLUSIVE,
                   data={**result.data, "contaminated": loaded, "measured_verdict": measured},
                   detail=(f"not judged, measured beside another job ({loaded}): the two "
                           f"runs are not interleaved; measured: {result.detail}"))


def record_not_compared(label: str, measured: ABMeasurement, stored: CheckResult
                        ) -> CheckResult:
    """A memory, numerics or loss check that the base arm's record could not judge: the
    stored-baseline check, with a note of why (as :func:`not_compared` for throughput)."""
    base = measured.base_run
    if base is None:
        why = measured.base_run_note or "the base arm has no record of the case"
    elif base.outcome != "ok":
        message = f": {base.message}" if base.message else ""
        why = f"its run of the case ended {base.outcome}{message}"
    else:
        why = f"its run of the case has no {stored.metric} record"
    return replace(stored, detail=f"{stored.detail} [not compared with {label}: {why}]".strip(),
                   data={**stored.data, "ab": {"ref": label, "skipped": why}})
