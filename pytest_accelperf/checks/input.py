"""The input check: did making each step's batch get slower than the baseline's?

The step loop times a step's device work and, apart from it, what making its batch cost
(:mod:`pytest_accelperf.backends.measure.loop`): the user's ``make_batch`` or data iterator and
the host-side conversion of what it returns (numpy to tensors for torch, tensors to numpy
for JAX), not the transfer to the device that follows. A training loop pays that on
every step, so a batch function that went from 0.1 ms to 4.7 ms slows the training by as
much while every step time stays the same: the throughput check cannot see it. This check
can.

What is measured is the **CPU time of the thread that makes the batch**
(``time.thread_time()``), not its wall time: another process on the machine delays the
thread but does not add to its CPU time, so the figure moves far less between runs than
a wall time. What it leaves out: work done in other threads or processes, a
``DataLoader``'s workers (``num_workers > 0``) and tf.data's threads; this thread's wait for
them is wall time, recorded beside it (``wall_median``, and the check's ``wait_median``,
wall less CPU) but not judged, as it moves with everything else on the machine.

What is judged is a change that matters to the training: the input is judged where its
median moved by at least :data:`MIN_SHARE` of the median step time (5 %: the step plus
its batch then take that much longer, or shorter; the longer of this run's and the
baseline's median step, so that a session the machine slowed as a whole does not lower
the bar). So an input that is a
meaningful share of the step, at least 5 % of it, fails when it becomes twice as slow (it
adds its whole share); a batch function that grows from a small share to a large one is
judged (the issue's 0.1 ms that became 4.7 ms of a 30 ms step: 15 %); and a change smaller
than that ``pass``-es, the detail saying it was too small a share of the step to judge.
Below it, a change moves the training less than the step times' own noise, and
sub-millisecond CPU times moved up to 2.7x between sessions of unchanged code under load
(measured: docs/measured.md), which at a small share would otherwise be a verdict about
nothing.

A change past that floor is judged by the ratio of median input times, with the
throughput check's bootstrap interval and verdict rule
(:func:`pytest_accelperf.stats.bootstrap.step_time_ratio`,
:func:`~pytest_accelperf.stats.bootstrap.throughput_verdict`) under ``input_tolerance``: a
``regression`` when the interval lies beyond it, ``inconclusive`` when the noise is too
large to resolve it.

**Evidence before a verdict.** A thread's CPU time is not the code's alone (issue 48: an
unchanged Flax ImageNet case's batch measured 1.54 ms, then 5.56 ms of CPU a batch in one
session, 3.61x, and 1.5 ms again in the next). So a change past the floor is weighed before
it is believed, as the throughput check's is:

- **this thread's speed**: each run times a fixed piece of host work in the same thread
  right after each batch (:mod:`pytest_accelperf.stats.yardstick`), and the ratio of the
  inputs is divided by the ratio of the yardsticks (``data["yardstick_ratio"]``), as step
  times are corrected by the drift probe: a machine that slowed the thread's computing as a
  whole cancels;
- **the kernel's work for the batch's memory**: page faults count in the CPU time, and
  how many a batch takes is the allocator's state, which the process's history sets
  (:mod:`pytest_accelperf.backends.measure.faults`: one numpy batch function took 10.3 ms of
  CPU with its memory reused and 18.6 ms with it mapped afresh, 2,006 faults a batch). A
  change measured while the two runs' faults a batch differ (by :data:`MIN_FAULT_CHANGE`
  and :data:`FAULT_SHARE`) is ``inconclusive``, the detail naming both counts;
- **company**: a change measured while other processes used more than
  ``--accelperf-max-foreign-load`` cores (steal included), or while the thread waited for a
  CPU for :data:`QUEUED_SHARE` of its batch's CPU time, where no yardstick can correct it
  (a baseline recorded before the yardstick), is ``inconclusive``;
- **the wall time**: a thread's CPU time is part of its wall time, so a CPU change that
  the wall time does not show at least half of is ``inconclusive``.

Each of these keeps what was measured in ``data["measured_verdict"]`` and why it was set
aside in ``data["contaminated"]``; and a regression, or a slowdown set aside so, is
measured again before it fails anything (:class:`pytest_accelperf.gate.judge.Confirmation`):
it stands only when a second training says so too. What is not weighed: the step time and
the program, which a batch function's change does not move.

A step whose batch took longer to make than the step itself is *input-bound*: the
accelerator waits on the host. The check counts such steps in this run (per step, input
CPU time against step time) and says so in its detail and in ``data["input_bound_steps"]``
whatever the verdict. Like throughput, input times are compared only in the environment
the baseline was recorded in; a baseline recorded before input times were kept gives
``new`` (a missing figure), never a failure.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from pytest_accelperf.checks.base import BaseCheck
from pytest_accelperf.checks.outcome import missing_in_baseline, new_result
from pytest_accelperf.checks.protocol import CheckInput, one
from pytest_accelperf.checks.throughput import foreign_load
from pytest_accelperf.records.run import Run
from pytest_accelperf.records.section import made
from pytest_accelperf.records.verdict import CheckData, CheckResult, Tolerances, Verdict
from pytest_accelperf.stats.bootstrap import (
    MIN_SAMPLES,
    RatioEstimate,
    step_time_ratio,
    throughput_verdict,
)
from pytest_accelperf.stats.units import (
    SAMPLE_DIGITS,
    fmt_percent,
    fmt_ratio,
    fmt_tolerance,
    round_sig,
)
from pytest_accelperf.stats.yardstick import KIND as YARDSTICK_KIND
from pytest_accelperf.store.block import Block, BlockLike, InputTime, StepTime, read_block

METRIC = "input"
UNIT = "s"
#: The change of the median input time, as a share of the (longer of the two runs')
#: median step time, from which the input is judged.
MIN_SHARE = 0.05
#: The smallest change of the median input time that is judged, whatever the step: a
#: thread's CPU time for a sub-millisecond batch moves by tenths of a millisecond between
#: processes of unchanged code (0.028 -> 0.073 ms, 2.6x, 11.6 % of a 0.6 ms step, failed
#: an unchanged torch case at tolerance 0.5; the suites' inputs of 0.12-1.04 ms moved up
#: to 2.7x). Regressions of the input pipeline worth gating are milliseconds (Flax's
#: 0.1 -> 4.7 ms; a tokenizer in the loop).
MIN_CHANGE_S = 5e-4
#: Input samples are floored at this many seconds before their ratio is taken: a batch
#: served from memory can take less CPU time than the clock resolves (0 s), and a ratio
#: needs positive numbers.
FLOOR_S = 1e-7
#: Two runs' page faults a batch (their medians) differ, as evidence that the allocator
#: served the batch's memory differently, where they differ by at least this many ...
MIN_FAULT_CHANGE = 64
#: ... and by at least this share of the larger (64 faults: 256 KiB of fresh 4 KiB pages).
FAULT_SHARE = 0.25
#: The share of a CPU change the wall time must show too (module docstring).
WALL_SHARE = 0.5
#: The thread waited for a CPU, making its batches, for at least this share of their CPU
#: time (medians; this thread's ``schedstat``): it had company, whatever ``/proc/stat`` said.
QUEUED_SHARE = 0.25


def fmt_ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g} ms"


def ratio_words(est: RatioEstimate, base: float, tolerance: float, *,
                enclosed: bool = False) -> tuple[str, float | None]:
    """How a judged change is said, and the change the table shows: ``2.50x the
    baseline's, 95% CI 2.31-2.70, tolerance 50%`` (``enclosed``: ``2.50x the baseline's
    (95% CI 2.31-2.70, tolerance 50%)``) and ``ratio - 1``; but where the baseline's
    median is at :data:`FLOOR_S` or under it (a batch served from memory, a thread never
    blocked), the ratio is one to the floor, not to anything measured (``200900.00x``,
    ``+20089900.0%`` for a 20 ms sleep): then ``from nothing (the baseline's median is
    under the floor of 0.0001 ms; tolerance 50%)`` and no change."""
    tolerated = f"tolerance {fmt_tolerance(tolerance)}"
    if base <= FLOOR_S:
        return (f"from nothing (the baseline's median is under the floor of "
                f"{fmt_ms(FLOOR_S)}; {tolerated})"), None
    interval = (f"{est.confidence * 100:.0f}% CI {fmt_ratio(est.low)}\u2013"
                f"{fmt_ratio(est.high)}, {tolerated}")
    ratio = f"{fmt_ratio(est.ratio)}x the baseline's"
    return (f"{ratio} ({interval})" if enclosed else f"{ratio}, {interval}"), est.ratio - 1


def _samples(part: InputTime | StepTime | None) -> list[float]:
    return [float(t) for t in (part.samples if part else None) or []]


def median_step(block: Block) -> float | None:
    """The median of ``block``'s step times; None without any."""
    samples = _samples(block.step_time)
    return statistics.median(samples) if samples else None


def share_text(input_s: float, step: float | None) -> str:
    return f"{fmt_percent(input_s / step)} of the step" if step else "step time unknown"


def change_floor(step_base: float | None, step_now: float | None, *,
                 corrected: bool = False) -> tuple[float, float | None]:
    """The smallest change of a median input time that is judged, and the step it is a
    share of: :data:`MIN_SHARE` of the longer of the two median steps (a session whose
    steps the machine slowed, 4x measured, slowed sub-millisecond CPU times too), at least
    :data:`MIN_CHANGE_S` (the module docstring). ``corrected``: the input is corrected for
    the thread's speed (:mod:`pytest_accelperf.stats.yardstick`), so the slowed session is
    accounted for and the baseline's step is the one the change is a share of (beside a
    competing job, nanoGPT's 21 ms step took 65 ms and put a planted 3 ms under the floor)."""
    if corrected and step_base:
        step_now = None
    step_ref = max((t for t in (step_base, step_now) if t), default=None)
    return max(MIN_SHARE * step_ref if step_ref else 0.0, MIN_CHANGE_S), step_ref


def sample_ratio(now: Sequence[float], base: Sequence[float], tolerance: float
                 ) -> tuple[RatioEstimate, Verdict]:
    """The ratio of two runs' input samples (floored at :data:`FLOOR_S`) with the throughput
    check's bootstrap interval, and its verdict under ``tolerance``."""
    est = step_time_ratio([max(t, FLOOR_S) for t in now], [max(t, FLOOR_S) for t in base])
    return est, throughput_verdict(est, tolerance)


@dataclass(frozen=True)
class Judged:
    """What :func:`judge_medians` made of two runs' samples: ``result`` (a ``pass`` with
    the medians, or the final result where ``est`` is None), the words that name the two
    medians, and the ratio's estimate and verdict where it got that far."""

    result: CheckResult
    words: str
    est: RatioEstimate | None = None
    verdict: Verdict | None = None


def judge_medians(now_samples: Sequence[float], base_samples: Sequence[float],
                  step_now: float | None, step_base: float | None, data: CheckData,
                  tolerance: float, *, metric: str, comparable: bool, what: str, tail: str,
                  words: Callable[[str, str], str], why_share: str, why_min: str,
                  corrected: bool = False) -> Judged:
    """The rules the ``input`` and ``input_wait`` checks share, once both runs have
    samples: not compared across environments, not judged under the floor
    (:func:`change_floor`) or with too few samples, else the ratio of the samples
    (:func:`sample_ratio`), for the check ``metric``. ``data`` gets the baseline's share
    and the floor; ``words`` names the medians from the baseline's and this run's shares
    of the step; ``what`` names the quantity, ``why_share``/``why_min`` end the detail
    under either floor, and ``tail`` ends the details of this helper's results;
    ``corrected``: the caller corrects the ratio for the thread's speed (:func:`change_floor`)."""
    now, base = statistics.median(now_samples), statistics.median(base_samples)
    data["baseline_share"] = base / step_base if step_base else None
    result = CheckResult(metric, Verdict.PASS, "", baseline=base, now=now, unit=UNIT,
                         change=now / base - 1 if base > 0 else None)
    said = words(share_text(base, step_base), share_text(now, step_now))
    if not comparable:
        return Judged(replace(result, verdict=Verdict.INCOMPARABLE, data=data.copy(),
                              detail=f"baseline recorded in another environment; {what} "
                                     f"not compared"), said)
    # The floor: a change that moves the training by less than MIN_SHARE of its step is
    # not judged, however sure (module docstring).
    floor, step_ref = change_floor(step_base, step_now, corrected=corrected)
    data["min_change_s"] = floor
    if abs(now - base) < floor:
        why = (f"under the {fmt_percent(MIN_SHARE)} of the {fmt_ms(step_ref)} step from "
               f"which it is judged{why_share}" if step_ref and floor > MIN_CHANGE_S else
               why_min)
        return Judged(replace(result, data=data.copy(), detail=(
            f"{said}: a change of {fmt_ms(abs(now - base))}, {why}{tail}")), said)
    if min(len(now_samples), len(base_samples)) < MIN_SAMPLES:
        return Judged(replace(result, verdict=Verdict.INCONCLUSIVE, data=data.copy(), detail=(
            f"{said}; fewer than {MIN_SAMPLES} measured steps on one side: "
            f"too few to judge{tail}")), said)
    est, verdict = sample_ratio(now_samples, base_samples, tolerance)
    return Judged(result, said, est, verdict)


def interval_verdict(judged: Judged, data: CheckData, now: float, base: float,
                     tolerance: float, *, loaded: str, note: str = "", loaded_why: str = "",
                     regression_tail: str = "") -> CheckResult:
    """The result of a median :func:`judge_medians` got as far as a ratio for (``est`` and
    ``verdict`` set), for a quantity judged as it was measured (``input_wait``,
    ``trainer``): the change a step with its interval, ``note`` after it; a regression or
    an improvement measured beside another job (``loaded``) is not judged (``loaded_why``
    says why that matters); a regression's detail ends with ``regression_tail``."""
    result, words, est, verdict = judged.result, judged.words, judged.est, judged.verdict
    if est is None or verdict is None:
        return result
    data.update({"ratio": est.ratio, "ci_low": est.low, "ci_high": est.high, "mdc": est.mdc,
                 "confidence": est.confidence, "measured_verdict": verdict.value})
    change = now - base
    stats_text, relative = ratio_words(est, base, tolerance, enclosed=True)
    text = (f"{words}: {'+' if change > 0 else '-'}{fmt_ms(abs(change))} a step, "
            f"{stats_text}{note}")
    if loaded and verdict in (Verdict.REGRESSION, Verdict.IMPROVEMENT):
        return replace(result, verdict=Verdict.INCONCLUSIVE, change=relative,
                       data={**data, "contaminated": loaded},
                       detail=f"not judged, measured beside another job: {loaded}; "
                              f"{loaded_why}measured: {text}")
    tail = {Verdict.INCONCLUSIVE: "; too noisy to resolve a change of the tolerance's size",
            Verdict.IMPROVEMENT: "; run with --accelperf-update to record it",
            Verdict.REGRESSION: regression_tail}.get(verdict, "")
    return replace(result, verdict=verdict, change=relative, data=data.copy(),
                   detail=text + tail)


def yardstick_ratio(now: InputTime | None, base: InputTime | None) -> float | None:
    """This run's yardstick median over the baseline's (:mod:`pytest_accelperf.stats.yardstick`),
    where both ran the same kind of yardstick; None otherwise."""
    if now is None or base is None:
        return None
    a, b = now.yardstick_median, base.yardstick_median
    if (a is None or b is None or a <= 0 or b <= 0 or now.yardstick_kind != YARDSTICK_KIND
            or base.yardstick_kind != YARDSTICK_KIND):
        return None
    return float(a) / float(b)


def fault_doubt(now: InputTime | None, base: InputTime | None) -> str:
    """Why the two runs' batches took their memory from the kernel differently (their page
    faults a batch differ: :data:`MIN_FAULT_CHANGE`, :data:`FAULT_SHARE`), or ``""``. A
    baseline that counted none, against a run that faulted that often, cannot say."""
    f_now = now.fault_median if now is not None else None
    f_base = base.fault_median if base is not None else None
    if f_now is None:
        return ""
    if f_base is None:
        if f_now < MIN_FAULT_CHANGE:
            return ""
        return (f"this run's batch took {f_now:,.0f} page faults and the baseline counted none "
                f"(recorded before page faults were; re-record it with --accelperf-update to "
                f"judge this): the kernel's work for the batch's memory counts in its CPU "
                f"time")
    if abs(f_now - f_base) < max(MIN_FAULT_CHANGE, FAULT_SHARE * max(f_now, f_base)):
        return ""
    return (f"the batch's memory came from the kernel differently: {f_base:,.0f} page faults "
            f"a batch in the baseline, {f_now:,.0f} now (the allocator's state, which the "
            f"process's history sets, not the batch function; the kernel's work for them "
            f"counts in the CPU time)")


def wall_doubt(now: InputTime | None, base: InputTime | None, cpu_now: float,
               cpu_base: float) -> str:
    """Why the wall time does not corroborate a CPU change (it shows less than
    :data:`WALL_SHARE` of it, in the same direction), or ``""`` (also where either run has
    no wall time)."""
    w_now = now.wall_median if now is not None else None
    w_base = base.wall_median if base is not None else None
    if w_now is None or w_base is None:
        return ""
    change, wall_change = cpu_now - cpu_base, float(w_now) - float(w_base)
    if wall_change * (1 if change > 0 else -1) >= WALL_SHARE * abs(change):
        return ""
    return (f"its wall time did not move with it ({fmt_ms(float(w_base))} \u2192 "
            f"{fmt_ms(float(w_now))} a batch, against {'+' if change > 0 else '-'}"
            f"{fmt_ms(abs(change))} of CPU): a thread's CPU time is part of its wall time")


def input_bound(inputs: list[float], steps: list[float]) -> int:
    """How many steps took longer to make the batch of (input CPU time) than to run
    (device step time); the two lists are per measured step, in order."""
    return sum(1 for made, ran in zip(inputs, steps, strict=False) if made > ran)


def check_input(block: BlockLike, baseline: BlockLike | None, tol: Tolerances, *,
                comparable: bool = True, loaded: str = "") -> CheckResult | None:
    """``block``'s input CPU time against ``baseline``'s (see the module docstring); None
    when this run timed no input (a backend that does not, an ingested log). ``loaded``:
    why this run was measured beside another job
    (:func:`~pytest_accelperf.checks.throughput.foreign_load`), or ``""``."""
    block, baseline = read_block(block), read_block(baseline)
    now_samples = _samples(block.input)
    if not now_samples:
        return None
    now = statistics.median(now_samples)
    step_samples = _samples(block.step_time)
    step_now = median_step(block)
    bound = input_bound(now_samples, step_samples)
    data: CheckData = {
        "tolerance": tol.input_tolerance, "min_share": MIN_SHARE,
        "share": now / step_now if step_now else None,
        "input_bound_steps": bound, "steps": len(now_samples),
    }
    wall = block.input.wall_median if block.input else None
    if isinstance(wall, int | float):
        data["wall_median"] = float(wall)
        data["wait_median"] = max(0.0, float(wall) - now)
    bound_text = (f"; input-bound: the batch took longer to make than the step in {bound} of "
                  f"{len(now_samples)} steps" if bound else "")
    if baseline is None:
        return new_result(METRIC, now=now, unit=UNIT, data=data,
                          detail=f"no baseline; run with --accelperf-update to record it"
                                 f"{bound_text}")
    base_samples = _samples(baseline.input)
    if not base_samples:
        result = missing_in_baseline(METRIC, "input time", baseline, now=now, unit=UNIT)
        return replace(result, data={**result.data, **data},
                       detail=result.detail + bound_text)
    base = statistics.median(base_samples)
    scale = yardstick_ratio(block.input, baseline.input)
    judged = judge_medians(
        now_samples, base_samples, step_now, median_step(baseline), data, tol.input_tolerance,
        metric=METRIC, comparable=comparable, what="input time", tail=bound_text,
        words=lambda base_share, now_share: (f"input {fmt_ms(now)} CPU per step ({now_share}), "
                                             f"baseline {fmt_ms(base)} ({base_share})"),
        why_share=": too small a share of the step to judge",
        why_min=(f"under the {fmt_ms(MIN_CHANGE_S)} from which an input change is judged (a "
                 f"thread's CPU time moves by tenths of a millisecond between processes)"),
        corrected=scale is not None)
    if judged.est is None or judged.verdict is None:
        return judged.result
    result, words, est, verdict = judged.result, judged.words, judged.est, judged.verdict
    tolerance = tol.input_tolerance
    corrected = ""
    if scale is not None:
        # Relative to the yardstick, as step times are to the drift probe (module docstring).
        est, verdict = sample_ratio([t / scale for t in now_samples], base_samples, tolerance)
        data["yardstick_ratio"] = scale
        corrected = (f" (corrected for this thread's speed: its yardstick took "
                     f"{fmt_ratio(scale)}x the baseline's CPU time)")
    data.update({"ratio": est.ratio, "ci_low": est.low, "ci_high": est.high, "mdc": est.mdc,
                 "confidence": est.confidence, "measured_verdict": verdict.value})
    stats_text, change = ratio_words(est, base, tolerance)
    measured = f"{words}: {stats_text}{corrected}"
    queued = block.input.queued_median if block.input is not None else None
    if not loaded and queued is not None and now > 0 and queued >= QUEUED_SHARE * now:
        loaded = (f"this thread waited {fmt_ms(float(queued))} a batch for a CPU while it made "
                  f"it ({fmt_percent(float(queued) / now)} of its CPU time)")
    if verdict in (Verdict.REGRESSION, Verdict.IMPROVEMENT):
        doubt = (fault_doubt(block.input, baseline.input)
                 or (f"measured beside another job: {loaded}, and the baseline has no "
                     f"yardstick of this thread's speed to correct by (re-record it with "
                     f"--accelperf-update)" if loaded and scale is None else "")
                 or wall_doubt(block.input, baseline.input, now, base))
        if doubt:
            return replace(result, verdict=Verdict.INCONCLUSIVE, change=change,
                           data={**data, "contaminated": doubt},
                           detail=f"not judged: {doubt}; measured: {measured}{bound_text}")
    tail = {Verdict.INCONCLUSIVE: "; too noisy to resolve a change of the tolerance's size",
            Verdict.IMPROVEMENT: "; run with --accelperf-update to record it"}.get(
                verdict, "")
    return replace(result, verdict=verdict, change=change, data=data.copy(),
                   detail=f"{measured}{tail}{bound_text}")


def input_block(run: Run) -> InputTime:
    """The block's ``input``, as :class:`~pytest_accelperf.store.block.InputTime` (its one
    declaration; its JSON: ``.to_json()``): CPU seconds making each measured step's batch
    (every sample, rounded as step times are, and their median), the median wall seconds of
    the same,
    and the seconds the thread was blocked making it, every sample and their median
    (:attr:`pytest_accelperf.records.run.InputSeries.times`, ``blocked_times``; the
    ``input_wait`` check, :mod:`pytest_accelperf.checks.input_wait`); and the medians of
    the evidence the check weighs: the seconds the thread waited for a CPU, its page
    faults, and the yardstick's CPU seconds with its kind."""
    series = run.inputs
    out = made(InputTime, median=round_sig(statistics.median(series.times)),
               samples=[round_sig(t, SAMPLE_DIGITS) for t in series.times])
    if series.wall_times:
        out.wall_median = round_sig(statistics.median(series.wall_times))
    if series.blocked_times:
        out.blocked_median = round_sig(statistics.median(series.blocked_times))
        out.blocked_samples = [round_sig(t, SAMPLE_DIGITS) for t in series.blocked_times]
    if series.queued_times:
        out.queued_median = round_sig(statistics.median(series.queued_times))
    if series.faults:
        out.fault_median = float(statistics.median(series.faults))
    if series.yardstick_times:
        out.yardstick_median = round_sig(statistics.median(series.yardstick_times))
        out.yardstick_kind = YARDSTICK_KIND
    return out


class InputCheck(BaseCheck):
    """The ``input`` row; an input-bound case says so in its label."""

    metric = METRIC
    tolerances = ("input_tolerance",)
    sections = ("input", "step_time")
    kind = "interval"

    def check(self, given: CheckInput) -> tuple[CheckResult, ...]:
        if not given.stepped:
            return ()
        return one(check_input(given.block, given.baseline, given.tol,
                               comparable=given.comparable,
                               loaded=foreign_load(given.run, given.max_foreign_load)))

    def record(self, run: Run) -> Mapping[str, object]:
        """``input``, where the run timed the making of its batches."""
        return {"input": input_block(run).to_json()} if run.outcome == "ok" \
            and run.inputs.times else {}

    def label(self, result: CheckResult) -> str:
        """``input (bound 38/40)``: in how many steps the batch took longer to make than
        the step."""
        bound, steps = result.data.get("input_bound_steps"), result.data.get("steps")
        if isinstance(bound, int) and bound > 0 and isinstance(steps, int):
            return f"input (bound {bound}/{steps})"
        return result.metric


CHECK = InputCheck()
