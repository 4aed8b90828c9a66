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
from typing import NotRequired, TypedDict

from pytest_accelperf.checks.base import CheckData, CheckResult, Tolerances, Verdict
from pytest_accelperf.checks.outcome import missing_in_baseline, new_result
from pytest_accelperf.checks.protocol import BaseCheck, CheckInput, one
from pytest_accelperf.records.run import Run
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


def change_floor(step_base: float | None, step_now: float | None) -> tuple[float, float | None]:
    """The smallest change of a median input time that is judged, and the step it is a
    share of: :data:`MIN_SHARE` of the longer of the two median steps (a session whose
    steps the machine slowed, 4x measured, slowed sub-millisecond CPU times too), at least
    :data:`MIN_CHANGE_S` (the module docstring)."""
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
                  words: Callable[[str, str], str], why_share: str, why_min: str) -> Judged:
    """The rules the ``input`` and ``input_wait`` checks share, once both runs have
    samples: not compared across environments, not judged under the floor
    (:func:`change_floor`) or with too few samples, else the ratio of the samples
    (:func:`sample_ratio`), for the check ``metric``. ``data`` gets the baseline's share
    and the floor; ``words`` names the medians from the baseline's and this run's shares
    of the step; ``what`` names the quantity, ``why_share``/``why_min`` end the detail
    under either floor, and ``tail`` ends the details of this helper's results."""
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
    floor, step_ref = change_floor(step_base, step_now)
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


def input_bound(inputs: list[float], steps: list[float]) -> int:
    """How many steps took longer to make the batch of (input CPU time) than to run
    (device step time); the two lists are per measured step, in order."""
    return sum(1 for made, ran in zip(inputs, steps, strict=False) if made > ran)


def check_input(block: BlockLike, baseline: BlockLike | None, tol: Tolerances, *,
                comparable: bool = True) -> CheckResult | None:
    """``block``'s input CPU time against ``baseline``'s (see the module docstring); None
    when this run timed no input (a backend that does not, an ingested log)."""
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
    judged = judge_medians(
        now_samples, base_samples, step_now, median_step(baseline), data, tol.input_tolerance,
        metric=METRIC, comparable=comparable, what="input time", tail=bound_text,
        words=lambda base_share, now_share: (f"input {fmt_ms(now)} CPU per step ({now_share}), "
                                             f"baseline {fmt_ms(base)} ({base_share})"),
        why_share=": too small a share of the step to judge",
        why_min=(f"under the {fmt_ms(MIN_CHANGE_S)} from which an input change is judged (a "
                 f"thread's CPU time moves by tenths of a millisecond between processes)"))
    if judged.est is None or judged.verdict is None:
        return judged.result
    result, words, est, verdict = judged.result, judged.words, judged.est, judged.verdict
    tolerance = tol.input_tolerance
    data.update({"ratio": est.ratio, "ci_low": est.low, "ci_high": est.high, "mdc": est.mdc,
                 "confidence": est.confidence})
    stats_text, change = ratio_words(est, base, tolerance)
    tail = {Verdict.INCONCLUSIVE: "; too noisy to resolve a change of the tolerance's size",
            Verdict.IMPROVEMENT: "; run with --accelperf-update to record it"}.get(
                verdict, "")
    return replace(result, verdict=verdict, change=change, data=data.copy(),
                   detail=f"{words}: {stats_text}{tail}{bound_text}")


class InputSection(TypedDict):
    """The block's ``input`` (:class:`~pytest_accelperf.store.block.InputTime` reads it)."""

    median: float
    samples: list[float]
    wall_median: NotRequired[float]
    blocked_median: NotRequired[float]
    blocked_samples: NotRequired[list[float]]


def input_block(run: Run) -> InputSection:
    """The block's ``input``: CPU seconds making each measured step's batch (every sample,
    rounded as step times are, and their median), the median wall seconds of the same,
    and the seconds the thread was blocked making it, every sample and their median
    (:attr:`pytest_accelperf.records.run.Run.input_times`, ``input_blocked_times``; the
    ``input_wait`` check, :mod:`pytest_accelperf.checks.input_wait`)."""
    out: InputSection = {
        "median": round_sig(statistics.median(run.input_times)),
        "samples": [round_sig(t, SAMPLE_DIGITS) for t in run.input_times],
    }
    if run.input_wall_times:
        out["wall_median"] = round_sig(statistics.median(run.input_wall_times))
    if run.input_blocked_times:
        out["blocked_median"] = round_sig(statistics.median(run.input_blocked_times))
        out["blocked_samples"] = [round_sig(t, SAMPLE_DIGITS) for t in run.input_blocked_times]
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
                               comparable=given.comparable))

    def record(self, run: Run) -> Mapping[str, object]:
        """``input``, where the run timed the making of its batches."""
        return {"input": input_block(run)} if run.outcome == "ok" and run.input_times else {}

    def label(self, result: CheckResult) -> str:
        """``input (bound 38/40)``: in how many steps the batch took longer to make than
        the step."""
        bound, steps = result.data.get("input_bound_steps"), result.data.get("steps")
        if isinstance(bound, int) and bound > 0 and isinstance(steps, int):
            return f"input (bound {bound}/{steps})"
        return result.metric


CHECK = InputCheck()
