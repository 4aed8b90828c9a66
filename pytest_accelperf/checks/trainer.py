"""The trainer check: did the trainer's own time per step grow?

A trainer that owns its loop (Lightning's ``Trainer.fit``, transformers' ``Trainer``,
Keras's ``model.fit``) spends part of each step outside the user's code: its hooks, its
logging, its loop, the precision plugin's bookkeeping, a callback's work. The trainer
backends' callbacks tell the step clock when the trainer calls the user's forward, backward
and optimizer step and when they return (:class:`~pytest_accelperf.backends.measure.stamps.
StepClock`, the device synchronized at each), and the rest of each measured step is
:attr:`Run.trainer_times <pytest_accelperf.records.run.Run.trainer_times>`: the figure
Lightning's own "parity" benchmarks bound (its loop against plain PyTorch on the same
model). A release of the trainer, a callback or a logger that costs more per step moves it
while the user's code stays the same.

It is judged by the input check's rules (:func:`~.input.judge_medians`): where its median
moved by at least 5 % of the median step and 0.5 ms, by the ratio of the medians with the
throughput check's bootstrap interval under ``throughput_tolerance`` (it is a part of the
step time), only in the environment the baseline was recorded in, and ``inconclusive``
where other processes used more than ``--accelperf-max-foreign-load`` cores.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import replace

from pytest_accelperf.checks.base import BaseCheck
from pytest_accelperf.checks.input import (
    MIN_CHANGE_S,
    fmt_ms,
    interval_verdict,
    judge_medians,
    median_step,
)
from pytest_accelperf.checks.outcome import missing_in_baseline, new_result
from pytest_accelperf.checks.protocol import CheckInput, one
from pytest_accelperf.checks.throughput import foreign_load
from pytest_accelperf.records.run import Run
from pytest_accelperf.records.verdict import CheckData, CheckResult, Tolerances
from pytest_accelperf.stats.units import SAMPLE_DIGITS, round_sig
from pytest_accelperf.store.block import BlockLike, TrainerTime, read_block

METRIC = "trainer"
SECTION = "trainer"
UNIT = "s"
#: What the trainer's time is, in the detail.
OWN = "the trainer's own time: the step outside the user's forward, backward and optimizer step"


def _section(block: BlockLike | None) -> TrainerTime | None:
    return None if block is None else read_block(block).trainer


def check_trainer(block: BlockLike, baseline: BlockLike | None, tol: Tolerances, *,
                  comparable: bool = True, loaded: str = "") -> CheckResult | None:
    """``block``'s trainer time against ``baseline``'s (see the module docstring); None
    where the run measured none. ``loaded``: why this run was measured beside another job
    (:func:`~.throughput.foreign_load`), or ``""``."""
    now_part = _section(block)
    if now_part is None:
        return None
    now_samples = [float(t) for t in now_part.samples]
    now = statistics.median(now_samples)
    step_now = median_step(read_block(block))
    data: CheckData = {"tolerance": tol.throughput_tolerance,
                       "share": now / step_now if step_now else None,
                       "steps": len(now_samples)}
    if baseline is None:
        return new_result(METRIC, now=now, unit=UNIT, data=data,
                          detail="no baseline; run with --accelperf-update to record it")
    base_part = _section(baseline)
    if base_part is None:
        result = missing_in_baseline(METRIC, "trainer time", read_block(baseline), now=now,
                                     unit=UNIT)
        return replace(result, data={**result.data, **data})
    base_samples = [float(t) for t in base_part.samples]
    base = statistics.median(base_samples)
    judged = judge_medians(
        now_samples, base_samples, step_now, median_step(read_block(baseline)), data,
        tol.throughput_tolerance, metric=METRIC, comparable=comparable, what="trainer time",
        tail="", words=lambda base_share, now_share: (
            f"the trainer's own {fmt_ms(now)} a step ({now_share}), baseline "
            f"{fmt_ms(base)} ({base_share})"),
        why_share="", why_min=f"under the {fmt_ms(MIN_CHANGE_S)} from which it is judged")
    return interval_verdict(judged, data, now, base, tol.throughput_tolerance, loaded=loaded,
                            regression_tail=f"; {OWN}")


class TrainerCheck(BaseCheck):
    """The ``trainer`` row of a trainer's case (Lightning, transformers, Keras)."""

    metric = METRIC
    tolerances = ("throughput_tolerance",)
    sections = (SECTION, "step_time")
    kind = "interval"

    def check(self, given: CheckInput) -> tuple[CheckResult, ...]:
        if not given.stepped:
            return ()
        return one(check_trainer(given.block, given.baseline, given.tol,
                                 comparable=given.comparable,
                                 loaded=foreign_load(given.run, given.max_foreign_load)))

    def record(self, run: Run) -> Mapping[str, object]:
        """``trainer``, where the run measured the trainer's own time."""
        times = run.trainer_times
        if run.outcome != "ok" or not times:
            return {}
        return {SECTION: {"median": round_sig(statistics.median(times)),
                          "samples": [round_sig(t, SAMPLE_DIGITS) for t in times]}}


CHECK = TrainerCheck()
