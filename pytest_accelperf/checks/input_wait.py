"""The input-wait check: did making each step's batch start *waiting* longer?

The ``input`` check (:mod:`.input`) judges the CPU time of the thread that makes the
batch. A batch function can get slower without using more CPU: a sleep, a read from a slow
disk (nanoGPT's ``np.memmap`` of a dataset that fell out of the page cache), a network
fetch, a queue or a lock, a ``DataLoader`` whose workers fell behind. The thread is then
*blocked*: neither on a CPU nor waiting for one. The step loop measures that per step
(:mod:`pytest_accelperf.backends.measure.blocked`: wall time less CPU time less the
run-queue delay the kernel counted, so another process on the machine does not add to it),
and this check judges it with the input check's rules:

- it is judged where its median moved by at least :data:`~.input.MIN_SHARE` of the median
  step (5 %) and at least :data:`~.input.MIN_CHANGE_S` (0.5 ms); a smaller change
  ``pass``-es, the detail saying why;
- past that, by the ratio of the medians with the throughput check's bootstrap interval
  and verdict rule under ``input_tolerance`` (samples floored at :data:`~.input.FLOOR_S`:
  a batch served from memory is blocked 0 s);
- only in the environment the baseline was recorded in; a baseline recorded before the
  blocked time was measured (or on a kernel that does not count it) gives ``new``.

What a blocked thread waits for may be another thread or process (a ``DataLoader``'s
workers, an XLA thread computing a batch): another job on the machine slows *that* down,
and the wait grows with it. So a ``regression`` or ``improvement`` measured while other
processes used more than ``--accelperf-max-foreign-load`` cores is reported
``inconclusive``, as the throughput check does (a ``pass`` holds).
"""

from __future__ import annotations

import statistics
from dataclasses import replace

from pytest_accelperf.checks.base import BaseCheck
from pytest_accelperf.checks.input import (
    MIN_CHANGE_S,
    MIN_SHARE,
    fmt_ms,
    interval_verdict,
    judge_medians,
    median_step,
)
from pytest_accelperf.checks.outcome import missing_in_baseline, new_result
from pytest_accelperf.checks.protocol import CheckInput, one
from pytest_accelperf.checks.throughput import foreign_load
from pytest_accelperf.records.verdict import CheckData, CheckResult, Tolerances
from pytest_accelperf.store.block import BlockLike, InputTime, read_block

METRIC = "input_wait"
UNIT = "s"
#: What blocked means, in the detail.
BLOCKED = "blocked: off the CPU and not waiting for one (a sleep, a read, a queue, a lock)"


def _blocked(part: InputTime | None) -> list[float]:
    return [float(t) for t in (part.blocked_samples if part else None) or []]


def check_input_wait(block: BlockLike, baseline: BlockLike | None, tol: Tolerances, *,
                     comparable: bool = True, loaded: str = "") -> CheckResult | None:
    """``block``'s blocked input time against ``baseline``'s (see the module docstring);
    None when this run measured none. ``loaded``: why this run was measured beside
    another job (:func:`~.throughput.foreign_load`), or ``""``."""
    block, baseline = read_block(block), read_block(baseline)
    now_samples = _blocked(block.input)
    if not now_samples:
        return None
    now = statistics.median(now_samples)
    step_now = median_step(block)
    data: CheckData = {"tolerance": tol.input_tolerance, "min_share": MIN_SHARE,
                            "share": now / step_now if step_now else None,
                            "steps": len(now_samples)}
    if baseline is None:
        return new_result(METRIC, now=now, unit=UNIT, data=data,
                          detail="no baseline; run with --accelperf-update to record it")
    base_samples = _blocked(baseline.input)
    if not base_samples:
        result = missing_in_baseline(METRIC, "blocked input time", baseline, now=now,
                                     unit=UNIT)
        return replace(result, data={**result.data, **data})
    base = statistics.median(base_samples)
    judged = judge_medians(
        now_samples, base_samples, step_now, median_step(baseline), data, tol.input_tolerance,
        metric=METRIC, comparable=comparable, what="blocked input time", tail="",
        words=lambda base_share, now_share: (f"blocked {fmt_ms(now)} per step making the "
                                             f"batch ({now_share}), baseline {fmt_ms(base)} "
                                             f"({base_share})"),
        why_share="", why_min=f"under the {fmt_ms(MIN_CHANGE_S)} from which it is judged")
    return interval_verdict(
        judged, data, now, base, tol.input_tolerance, loaded=loaded, note=f"; {BLOCKED}",
        loaded_why="what the batch waits for (another thread or process) slows down with "
                   "the machine; ")


class InputWaitCheck(BaseCheck):
    """The ``input_wait`` row: the ``input`` section's blocked times (the input check
    records the section)."""

    metric = METRIC
    tolerances = ("input_tolerance",)
    sections = ("input", "step_time")
    kind = "interval"

    def check(self, given: CheckInput) -> tuple[CheckResult, ...]:
        if not given.stepped:
            return ()
        return one(check_input_wait(given.block, given.baseline, given.tol,
                                    comparable=given.comparable,
                                    loaded=foreign_load(given.run, given.max_foreign_load)))


CHECK = InputWaitCheck()
