"""The throughput check: is this run's step time slower than the baseline's, beyond noise?

The comparison is of median step times with a bootstrap confidence interval on their
ratio (:mod:`pytest_accelperf.stats.bootstrap` documents the statistic and the verdict rule). It is
shown as throughput, ``samples_per_step / median step time`` in samples/s, because that is
the number people track; ``change`` is the relative change of that throughput.

Drift correction: when both runs timed the same reference probe after their measured steps
(:mod:`pytest_accelperf.backends.measure.probe`), each run's median step time is taken relative to
its median probe time (:func:`pytest_accelperf.stats.bootstrap.step_time_ratio`), so a machine that
is
30 % slower today (another job on the cores, a slower CI runner) leaves the verdict alone,
while a step that got slower by itself does not. The table's ``change`` is then the
corrected change of throughput, and the detail also gives the raw one. Without matching
probes (an older baseline) raw step times are compared and the detail says so. The probe
is a signal with its own noise: on one quiet 2-core machine its median moved between
sessions from 0.94 to 1.41 ms while the step moved only 8 %, and the correction alone
turned an unchanged step into a "regression" of 26 %. So against a baseline of fewer than
:data:`~pytest_accelperf.stats.bootstrap.MIN_SESSIONS` sessions (whose spread would say how far the
probe moves), a regression or an improvement stands only when the raw step times say so
too (the same rule, without the probe); otherwise it is ``inconclusive``, with both
figures. The correction can excuse a slower machine, and never accuse on its own.

An unsteady probe only turns the correction off: when the probe's interquartile range is
more than :data:`MAX_PROBE_SPREAD` of its median, in this run or in the baseline's, raw
step times are compared and judged like any other, and the detail says so (``[drift
correction off: this run's jax-cpu-matmul256x8 probe varied by IQR 71% of its median
(bound 25%); raw step times compared]``). How steady the probe is says little about how
steady the step is: Flax MNIST's short ``[nomesh-b64]`` case timed its probe at IQR 64-78 %
of its median on an idle machine (load 0.04-0.7), in 3 of 3 recordings; when that spread
made a recording noisy, the case was never judged again.

Session spread: a bootstrap interval only sees the noise within one session, and on a
shared machine whole sessions differ. A baseline recorded over several sessions
(``--accelperf-update`` once, then ``--accelperf-add-session`` in new sessions on unchanged
code) keeps one step-time level per session in ``step_time.sessions``; with
:data:`~pytest_accelperf.stats.bootstrap.MIN_SESSIONS` or more, the ratio is taken against their
geometric mean and the interval widened by their spread
(:func:`pytest_accelperf.stats.bootstrap.widen_by_sessions`), so a machine whose sessions differ by
more than the tolerance says ``inconclusive`` instead of guessing.

A baseline stored marked ``noisy`` (:func:`recording_noise`: ``--accelperf-update``
re-measured a recording whose step times were far more dispersed than a quiet machine
gives, or that was measured beside another job, and it stayed so) gets ``inconclusive``
whatever the ratio, until it is re-recorded; a session added noisy by
``--accelperf-add-session`` is kept but gives no level. Whether a recording is noisy is
the step's own dispersion and the machine's load, never the probe's.

Contamination is a reason, not a verdict: when the plugin's own evidence says the
measurement is not about the code (:func:`contamination`: this run's step times are far
more dispersed than the baseline's), a ratio beyond the tolerance is ``inconclusive``,
with the reason and what was measured; a ratio within it still passes. The surest of that
evidence is the machine's load (:func:`foreign_load`): what other processes used while
the steps were measured, read from ``/proc`` by the step loop. A steady competitor on a
2-core machine slowed a step 1.6x while the probe stayed steady (and slowed less), so
nothing else looked contaminated; past ``--accelperf-max-foreign-load`` cores the
measurement is not judged.

Throughput is only compared on the machine the baseline was recorded on: when the
environment fingerprints differ the verdict is ``incomparable`` (the caller passes
``comparable=False``, or the differing keys as ``differences`` to name them in the detail).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from pytest_accelperf.checks.base import BaseCheck
from pytest_accelperf.checks.outcome import missing_in_baseline, new_result
from pytest_accelperf.checks.protocol import CheckInput, one
from pytest_accelperf.records.run import Run
from pytest_accelperf.records.section import made
from pytest_accelperf.records.verdict import CheckData, CheckResult, Tolerances, Verdict
from pytest_accelperf.stats.bootstrap import (
    MIN_SESSIONS,
    RatioEstimate,
    SessionSpread,
    step_time_ratio,
    throughput_verdict,
    widen_by_sessions,
)
from pytest_accelperf.stats.contention import contaminated
from pytest_accelperf.stats.units import (
    SAMPLE_DIGITS,
    fmt_percent,
    fmt_ratio,
    fmt_signed_percent,
    fmt_tolerance,
    round_sig,
)
from pytest_accelperf.store.block import (
    Block,
    BlockLike,
    Probe,
    StepSession,
    StepTime,
    json_of,
    read_block,
)

METRIC = "throughput"
UNIT = "samples/s"
#: Shown instead of throughput when a case does not say how many samples a step takes.
STEP_UNIT = "s"

INCOMPARABLE_ENV = "baseline recorded in another environment; throughput not compared"


def incomparable_detail(differences: Sequence[str] = ()) -> str:
    """Why throughput was not compared with a baseline from another environment: the
    differing keys of the fingerprints (:func:`pytest_accelperf.provision.describe.differences`)
    when known, else :data:`INCOMPARABLE_ENV`."""
    if differences:
        return f"baseline recorded in another environment ({'; '.join(differences)})"
    return INCOMPARABLE_ENV


def _rate(samples_per_step: int, median: float) -> float:
    """Samples per second, or the median step time itself when the batch is unknown."""
    return samples_per_step / median if samples_per_step else median


def _ci_text(est: RatioEstimate, tolerance: float) -> str:
    return (f"{est.confidence * 100:.0f}% CI of step-time ratio {fmt_ratio(est.low)}\u2013"
            f"{fmt_ratio(est.high)}, tolerance {fmt_tolerance(tolerance)}")


#: The largest spread (interquartile range over median) of a run's probe times for which the
#: probe is trusted to measure the machine, and so to correct drift. A machine so contended
#: that a fixed matrix product takes 1.5 ms one moment and 100 ms the next (two processes
#: fighting over two cores with spinning OpenMP threads) has no one speed to correct for.
#: Past it the correction is off and raw step times are judged; nothing else follows.
MAX_PROBE_SPREAD = 0.25


def spread(samples: list[float]) -> float:
    """Interquartile range over median: a robust relative dispersion."""
    if len(samples) < 2:
        return 0.0
    q1, med, q3 = statistics.quantiles(samples, n=4)
    return (q3 - q1) / med if med > 0 else math.inf


def _probe_samples(block: Block) -> list[float]:
    return [float(t) for t in (block.probe.samples if block.probe else None) or []]


def across_stacks(kind: str, stack: Sequence[str]) -> str:
    """Why a drift probe does not correct a comparison across a stack change: it runs in the
    framework under test, so an upgrade moves it with the step and would cancel the very
    change being judged."""
    return (f"drift correction off: the {kind} probe runs on the stack that changed "
            f"({', '.join(stack)}) and would move with the step, cancelling the change "
            f"under test; raw step times compared")


def _probes(run: Run, baseline: Block, bound: float = MAX_PROBE_SPREAD,
            stack: Sequence[str] = ()) -> tuple[tuple[list[float], list[float]] | None, str]:
    """Both runs' probe times when they timed the same, steady probe; else None and, in
    words for the detail, why raw step times are compared instead. An unsteady probe
    (IQR over median past ``bound``) turns the correction off and nothing else: the raw
    step times are judged as they are. Across a ``stack`` change no probe corrects: the
    probe is a matmul in the framework under test (:func:`across_stacks`)."""
    base_probe = _probe_samples(baseline)
    kind = baseline.probe.kind if baseline.probe else None
    if not run.probe_kind or kind != run.probe_kind or not run.probe_times or not base_probe:
        return None, "raw step times: the baseline has no matching probe"
    if stack:
        return None, across_stacks(run.probe_kind, stack)
    now_spread, base_spread = spread(list(run.probe_times)), spread(base_probe)
    if now_spread > bound:
        return None, (f"drift correction off: this run's {run.probe_kind} probe varied by "
                      f"IQR {now_spread:.0%} of its median (bound {bound:.0%}); raw step "
                      f"times compared")
    if base_spread > bound:
        return None, (f"drift correction off: the baseline's {run.probe_kind} probe varied "
                      f"by IQR {base_spread:.0%} of its median (bound {bound:.0%}); raw step "
                      f"times compared, and will be for this case until it is re-recorded")
    return (list(run.probe_times), base_probe), ""


def foreign_load(run: Run, bound: float | None) -> str:
    """Why ``run``'s steps were measured beside another job, or ``""``: other processes
    used more than ``bound`` cores on average during its measured steps
    (``run.step_load``, :class:`~pytest_accelperf.stats.contention.Load`). Nothing is
    known, and nothing said, without ``/proc`` or a bound. ``/proc`` counts CPU time in
    clock ticks: a few ticks of foreign time are no evidence
    (:func:`~pytest_accelperf.stats.contention.contaminated`)."""
    load = run.step_load
    if bound is None or load is None:
        return ""
    if not contaminated(load, bound):
        return ""
    stolen = (f", {load.steal_cores:.2f} of it stolen by the hypervisor"
              if load.steal_cores >= 0.01 else "")
    return (f"other processes used {load.foreign_cores:.2f} of {load.cores} cores on average "
            f"while the steps were measured{stolen} (bound {bound:g}, "
            f"--accelperf-max-foreign-load)")


def recording_noise(run: Run, tol: Tolerances, max_foreign_load: float | None = None) -> str:
    """Why ``run`` is too noisy to become a throughput baseline, or ``""``: other processes
    used more than ``max_foreign_load`` cores while it was measured (:func:`foreign_load`),
    or its step times varied by more than ``tol.max_step_spread`` (IQR over median; four
    step times at least). A recording that stays so after re-measuring is stored marked
    ``noisy`` (:data:`NOISY_KEY`). The drift probe's spread is no part of it: an unsteady
    probe only turns drift correction off (:func:`_probes`)."""
    if run.outcome != "ok" or not run.step_times:
        return ""
    loaded = foreign_load(run, max_foreign_load)
    if loaded:
        return loaded
    steps = spread(list(run.step_times))
    if len(run.step_times) >= 4 and steps > tol.max_step_spread:
        return (f"its step times varied by IQR {steps:.0%} of their median (bound "
                f"{tol.max_step_spread:.0%}, --accelperf-max-step-spread)")
    return ""


#: The key of a stored block (and of a ``step_time.sessions`` entry) recorded too noisy to
#: judge against: why, in words (:func:`recording_noise`).
NOISY_KEY = "noisy"


def noisy_baseline(baseline: Block) -> str:
    """Why ``baseline`` was stored marked noisy (:data:`NOISY_KEY`), or ``""``."""
    why = baseline.noisy
    return str(why) if why else ""


def _step_samples(block: Block) -> list[float]:
    return [float(t) for t in (block.step_time.samples if block.step_time else None) or []]


def contamination(run: Run, baseline: Block, bound: float,
                  max_foreign_load: float | None = None) -> str:
    """Why this comparison is contaminated (the plugin's own evidence says a timing verdict
    would not be about the code), or ``""``: other processes used more than
    ``max_foreign_load`` cores while the steps were measured (:func:`foreign_load`), or
    this run's step times are far more dispersed than the baseline's (IQR over median
    past the larger of ``bound`` and three times the baseline's). The drift probe is no
    evidence of it: an unsteady probe only turns drift correction off (:func:`_probes`)."""
    loaded = foreign_load(run, max_foreign_load)
    if loaded:
        return (f"this run's measurement is contaminated: {loaded}; re-run on a quieter "
                f"machine")
    base_times = _step_samples(baseline)
    now_spread, base_spread = spread(list(run.step_times)), spread(base_times)
    if len(run.step_times) >= 4 and now_spread > max(bound, 3 * base_spread):
        return (f"this run's step times are contaminated: IQR {now_spread:.0%} of their "
                f"median against the baseline's {base_spread:.0%} (bound: the larger of "
                f"{bound:.0%} and 3x the baseline's); re-run on a quieter machine")
    return ""


def _probe_only(run: Run, baseline: Block, raw_ratio: float,
                raw_verdict: Verdict) -> str:
    """Why a verdict that only the drift correction gives is not one: the step times
    themselves did not say so (``raw_verdict``); the probe moved."""
    base_probe = _probe_samples(baseline)
    probe_ratio = (statistics.median(run.probe_times) / statistics.median(base_probe)
                   if run.probe_times and base_probe else math.nan)
    return (f"only the drift correction makes it a change: the raw step time was "
            f"{fmt_signed_percent(raw_ratio - 1)} against the baseline's ({raw_verdict} by "
            f"itself) while the {run.probe_kind} probe took "
            f"{fmt_signed_percent(probe_ratio - 1)}; the probe's level moved between the "
            f"sessions more than the step's (one quiet 2-core machine gave probe medians "
            f"0.94-1.41 ms and steps 7.2-7.9 ms for one unchanged step); record the baseline "
            f"over more sessions (--accelperf-add-session) so that their spread is known")


def session_levels(baseline: BlockLike, *, drift_corrected: bool) -> list[float]:
    """One step-time level per session recorded in ``baseline["step_time"]["sessions"]``
    (``--accelperf-add-session``): the median step time, or median step time over median
    probe time when ``drift_corrected``. Empty when a session has no probe to correct with.
    A malformed entry is a ``ValueError`` that names it."""
    step = read_block(baseline).step_time
    sessions: Any = (step.sessions if step else None) or []
    if not isinstance(sessions, list):
        raise ValueError("the baseline's step_time.sessions is not a list")
    levels: list[float] = []
    for i, entry in enumerate(sessions):
        session = entry if isinstance(entry, StepSession) else None
        if session is not None and session.noisy:
            continue  # recorded too noisy (--accelperf-add-session): kept, never a level
        med = session.median if session is not None else None
        probe = session.probe_median if session is not None else None
        if not isinstance(med, (int, float)) or not math.isfinite(med) or med <= 0:
            raise ValueError(f"the baseline's step_time.sessions[{i}] has no positive median "
                             f"step time: {json_of(entry)!r}")
        if drift_corrected:
            if not isinstance(probe, (int, float)) or not probe > 0:
                return []
            levels.append(float(med) / float(probe))
        else:
            levels.append(float(med))
    return levels


def _spread_text(spread: SessionSpread) -> str:
    left_out = ""
    if spread.outliers:
        which = ", ".join(f"#{i + 1} ({f:.2f}x the median level)"
                          for i, f in zip(spread.outliers, spread.factors, strict=True))
        how = ("the median and MAD of all of them" if spread.robust
               else "the others' mean and SD")
        left_out = (f"; outlying session(s) {which} left out, level and spread from "
                    f"{how}; re-record them with --accelperf-update on a quiet machine")
    return (f"{spread.n} baseline sessions, between-session SD "
            f"{fmt_percent(math.expm1(spread.sd))}: interval widened by it{left_out}")


def describe(est: RatioEstimate, verdict: Verdict, tolerance: float) -> str:
    """The sentence for a throughput verdict, e.g.
    ``"slower: step time 12.3% longer, throughput -11.0% (95% CI of step-time ratio
    1.10-1.15, tolerance 10%)"`` (with an en dash between the bounds)."""
    ci = _ci_text(est, tolerance)
    if verdict is Verdict.INCONCLUSIVE:
        return (f"noise too large to resolve ±{fmt_tolerance(tolerance)}: smallest detectable "
                f"change here is ±{fmt_percent(est.mdc)} (step time "
                f"{fmt_signed_percent(est.ratio - 1)}, {ci}); measure more steps or use a "
                f"quieter machine")
    if verdict is Verdict.REGRESSION:
        return (f"slower: step time {fmt_percent(est.ratio - 1)} longer, throughput "
                f"{fmt_signed_percent(1 / est.ratio - 1)} ({ci})")
    if verdict is Verdict.IMPROVEMENT:
        return (f"step time {fmt_percent(1 - est.ratio)} shorter, throughput "
                f"{fmt_signed_percent(1 / est.ratio - 1)} ({ci}); run with --accelperf-update "
                f"to record the new baseline")
    return f"within tolerance: step time {fmt_signed_percent(est.ratio - 1)} ({ci})"


def check_throughput(run: Run, block: BlockLike, baseline: BlockLike | None,
                     tol: Tolerances, *, comparable: bool = True,
                     differences: Sequence[str] = (), stack: Sequence[str] = (),
                     max_foreign_load: float | None = None) -> CheckResult | None:
    """Step times of ``run`` against ``baseline["step_time"]["samples"]``.

    ``stack``: how the stack differs from the baseline's (an upgrade): judged all the same,
    with raw step times (no drift probe corrects across it, :func:`across_stacks`).

    None when the run measured no step times and there is nothing stored to compare with.
    ``differences`` (how the environments differ, in words) makes the run not comparable,
    as ``comparable=False`` does, and is named in the ``incomparable`` verdict's detail.
    ``max_foreign_load``: cores other processes may use while the steps are measured
    before a change is not judged (None: not read).
    """
    comparable = comparable and not differences
    baseline = read_block(baseline)
    unit = UNIT if run.samples_per_step else STEP_UNIT
    now_median = run.median_step_time
    now = _rate(run.samples_per_step, now_median) if now_median else None
    step = baseline.step_time if baseline is not None else None
    base_samples: list[float] = list((step.samples if step else None) or [])
    if not run.step_times and not base_samples:
        return None
    if baseline is None:
        return new_result(METRIC, now=now, unit=unit, data={"n": {"now": len(run.step_times)}})
    if not base_samples:
        return missing_in_baseline(METRIC, "step times", baseline, now=now, unit=unit)

    base_batch = int(baseline.samples_per_step or 0)
    base_median = statistics.median(base_samples)
    base = _rate(base_batch if run.samples_per_step else 0, base_median)
    change = now / base - 1 if now is not None and base else None
    tolerance = tol.throughput_tolerance
    data: CheckData = {
        "tolerance": tolerance,
        "n": {"now": len(run.step_times), "baseline": len(base_samples)},
        "median_step_time": {"now": now_median, "baseline": base_median}}
    result = CheckResult(METRIC, Verdict.PASS, "", baseline=base, now=now, unit=unit,
                         change=change, data=data)

    if not comparable:
        return replace(result, verdict=Verdict.INCOMPARABLE,
                       detail=incomparable_detail(differences))
    if base_batch != run.samples_per_step:
        return replace(result, verdict=Verdict.INCOMPARABLE, detail=(
            f"the baseline took {base_batch} samples per step, this run "
            f"{run.samples_per_step}; re-record with --accelperf-update"))
    pair, why_raw = _probes(run, baseline, stack=stack)
    try:
        est = step_time_ratio(run.step_times, base_samples, probes=pair)
    except ValueError as exc:
        return replace(result, verdict=Verdict.INCONCLUSIVE,
                       detail=f"step times cannot be compared: {exc}")

    spread: SessionSpread | None = None
    try:
        levels = session_levels(baseline, drift_corrected=pair is not None)
    except ValueError as exc:
        return replace(result, verdict=Verdict.INCONCLUSIVE,
                       detail=f"{exc}; fix it or re-record with --accelperf-update")
    if len(levels) >= MIN_SESSIONS and now_median:
        now_level = (now_median / statistics.median(run.probe_times) if pair is not None
                     else now_median)
        est, spread = widen_by_sessions(est, now_level, levels)

    verdict = throughput_verdict(est, tolerance)
    final = verdict
    raw_ratio = now_median / base_median if now_median and base_median else None
    if pair is not None:
        change = 1 / est.ratio - 1
        raw = (f"; raw step time {fmt_signed_percent(raw_ratio - 1)}"
               if raw_ratio is not None else "")
        detail = (describe(est, verdict, tolerance)
                  + f" [drift-corrected by the {run.probe_kind} probe{raw}]")
    elif run.probe_kind:
        detail = describe(est, verdict, tolerance) + f" [{why_raw}]"
    else:
        detail = describe(est, verdict, tolerance)
    if spread is not None:
        change = 1 / est.ratio - 1
        detail += f" [{_spread_text(spread)}]"
    dirty = contamination(run, baseline, tol.max_probe_spread, max_foreign_load)
    blind = noisy_baseline(baseline)
    if blind:
        # A level recorded blind is no level: a pass against it means as little as a
        # regression or an improvement (173 ms stored for a true 8 ms hid a 15 % slowdown).
        final = Verdict.INCONCLUSIVE
        detail = (f"not judged, the baseline was stored marked noisy ({blind}), so "
                  f"its step times are no level to judge against; re-record it with "
                  f"--accelperf-update on a quiet machine; measured: {detail}")
    elif dirty and verdict in (Verdict.REGRESSION, Verdict.IMPROVEMENT):
        final = Verdict.INCONCLUSIVE
        detail = f"not judged, {dirty}; measured: {detail}"
    elif loaded := foreign_load(run, max_foreign_load):
        detail += (f" [measured beside another job: {loaded}; a pass holds, another "
                   f"job only slows a step down]")
    elif pair is not None and spread is None and raw_ratio is not None \
            and verdict in (Verdict.REGRESSION, Verdict.IMPROVEMENT):
        raw_verdict = throughput_verdict(step_time_ratio(run.step_times, base_samples),
                                         tolerance)
        if raw_verdict is not verdict:
            final = Verdict.INCONCLUSIVE
            detail = (f"not judged, {_probe_only(run, baseline, raw_ratio, raw_verdict)}"
                      f"; measured: {detail}")
            data["probe_only"] = True
    data["contaminated"] = dirty or None
    data["measured_verdict"] = verdict.value  # before contamination or a noisy mark
    if run.step_load is not None:
        data["load"] = run.step_load.to_json()
    data["noisy_baseline"] = blind or None
    data.update({"ratio": est.ratio, "ci": [est.low, est.high], "mdc": est.mdc,
                 "confidence": est.confidence, "drift_corrected": pair is not None,
                 "raw_ratio": raw_ratio, "sessions": len(levels),
                 "session_sd": spread.sd if spread is not None else None,
                 "session_outliers": list(spread.outliers) if spread is not None else []})
    return replace(result, verdict=final, detail=detail, change=change, data=data)


def session_level(median: float, probes: Sequence[float]) -> StepSession:
    """One ``step_time.sessions`` entry: the median step time and the probe's median (the
    throughput check divides the two when it corrects for drift), None without a probe."""
    return made(StepSession, median=round_sig(median),
                probe_median=round_sig(statistics.median(probes)) if probes else None)


def session_entry(run: Run) -> StepSession | None:
    """This session's step-time level for ``step_time.sessions``; None without step times."""
    med = run.median_step_time
    if med is None:
        return None
    return session_level(med, run.probe_times if run.probe_kind else [])


class ThroughputCheck(BaseCheck):
    """The ``throughput`` row: against the stored step times, or (A/B mode,
    :mod:`pytest_accelperf.ab.verdict`) against the base revision."""

    metric = METRIC
    tolerances = ("throughput_tolerance", "max_probe_spread", "max_step_spread")
    sections = ("step_time", "probe", "samples_per_second", "samples_per_step", "noisy")
    kind = "interval"

    def check(self, given: CheckInput) -> tuple[CheckResult, ...]:
        if not given.stepped:
            return ()
        return one(check_throughput(given.run, given.block, given.baseline, given.tol,
                                    comparable=given.comparable,
                                    differences=given.differences, stack=given.stack,
                                    max_foreign_load=given.max_foreign_load))

    def record(self, run: Run) -> Mapping[str, object]:
        """``step_time`` (every sample, their median, this session's level), ``probe``
        (the drift probe's samples) and ``samples_per_second``, of a finished run."""
        if run.outcome != "ok":
            return {}
        out: dict[str, object] = {}
        med = run.median_step_time
        if med is not None:  # no step times (an ingested log without them): no step_time
            step_time = made(StepTime, median=round_sig(med),
                             samples=[round_sig(t, SAMPLE_DIGITS) for t in run.step_times])
            entry = session_entry(run)
            if entry is not None:
                step_time.sessions = [entry]
            out["step_time"] = step_time.to_json()
        if run.probe_times and run.probe_kind:
            out["probe"] = made(Probe, kind=run.probe_kind,
                                samples=[round_sig(t, SAMPLE_DIGITS)
                                         for t in run.probe_times]).to_json()
        sps = run.samples_per_second
        if sps is not None:
            out["samples_per_second"] = round_sig(sps)
        return out

    def adjusted(self, result: CheckResult) -> bool:
        """A change corrected by the drift probe, or taken against the mean level of the
        baseline's sessions (not in A/B mode, whose change is its paired ratio's)."""
        if result.change is None or result.data.get("mode") == "ab":
            return False
        return bool(result.data.get("drift_corrected")) or \
            result.data.get("session_sd") is not None


CHECK = ThroughputCheck()
