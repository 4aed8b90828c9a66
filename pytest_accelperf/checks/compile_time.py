"""The compile-time check: how long the user waits before the first step, against the
baseline's.

``compile_time`` covers every compile the user waits for (JAX: the step's and the
initializer's lower and compile; torch.compile: dynamo's trace and inductor's compile of
forward and backward, with the in-process caches cleared first, plus that first step);
each backend says what it timed in ``Run.compile_time_covers`` or
``Run.compile_time_parts``.

One compile is one sample, so the check is noise-aware the only ways one sample can be:

* drift: when both runs timed the same probe, each compile time is taken relative to its
  run's median probe time, so a machine that is slower today as a whole does not count;
* contamination: a run or baseline whose probe was unsteady (IQR over median above
  ``max_probe_spread``) was measured on a machine
  with no one speed, and a change beyond the tolerance is ``inconclusive``, not a verdict;
* contention during the compile: where the backend read what other processes used of
  the machine while it compiled (``Run.compile_load``, from ``/proc``;
  :mod:`pytest_accelperf.stats.contention`), more than ``--accelperf-max-foreign-load`` cores
  makes a change beyond the tolerance ``inconclusive``: the probe is timed beside the
  steps, not beside the compile, and cannot see a job that ran only then (an unchanged
  2.8 s JAX compile took 5.6 s beside other jobs, a false 2x regression);
* a floor: a change under :data:`MIN_CHANGE_S` seconds is never a verdict (the spread of
  a sub-second compile on a shared runner).

Beyond ``compile_tolerance`` (default 1.0: on a shared 2-core runner one unchanged compile
went from 288 ms to 778 ms under load; PyTorch gates at 0.15 on dedicated machines),
longer is a ``regression`` and shorter an ``improvement``. Like throughput, compile times
are compared only in the environment the baseline was recorded in.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from pytest_accelperf.checks.base import BaseCheck
from pytest_accelperf.checks.outcome import missing_in_baseline, new_result
from pytest_accelperf.checks.protocol import CheckInput, one
from pytest_accelperf.checks.throughput import across_stacks, spread
from pytest_accelperf.records.run import Run
from pytest_accelperf.records.verdict import CheckData, CheckResult, Tolerances, Verdict
from pytest_accelperf.stats.units import fmt_signed_percent, fmt_tolerance, round_sig
from pytest_accelperf.store.block import Block, BlockLike, read_block

METRIC = "compile"
UNIT = "s"
#: Seconds of change below which compile time never gives a verdict.
MIN_CHANGE_S = 0.5


def _probe(block: Block) -> tuple[str, list[float]]:
    probe = block.probe
    if probe is None:
        return "", []
    return str(probe.kind or ""), [float(t) for t in probe.samples or []]


def check_compile_time(block: BlockLike, baseline: BlockLike | None,
                       tol: Tolerances, *, comparable: bool,
                       compile_load: Mapping[str, float] | None = None,
                       max_foreign_load: float | None = None,
                       stack: Sequence[str] = ()) -> CheckResult | None:
    """``block``'s compile time against ``baseline``'s; None when this run compiled nothing
    it timed. ``compile_load`` is what other processes used while this run compiled
    (:meth:`~pytest_accelperf.stats.contention.Load.to_json`); past ``max_foreign_load`` cores a
    change is not judged. Across a ``stack`` change the probe does not correct it (it runs
    on the stack under test, :func:`~pytest_accelperf.checks.throughput.across_stacks`)."""
    block, baseline = read_block(block), read_block(baseline)
    now: Any = block.compile_time
    if not isinstance(now, int | float) or now <= 0:
        return None
    now = float(now)
    if baseline is None:
        return new_result(METRIC, now=now, unit=UNIT)
    base: Any = baseline.compile_time
    if not isinstance(base, int | float) or base <= 0:
        return missing_in_baseline(METRIC, "compile time", baseline, now=now, unit=UNIT)
    base = float(base)
    tolerance = tol.compile_tolerance
    if not comparable:
        return CheckResult(METRIC, Verdict.INCOMPARABLE,
                           "baseline recorded in another environment; compile time not "
                           "compared", baseline=base, now=now, unit=UNIT,
                           change=now / base - 1, data={"tolerance": tolerance})
    ratio, how = now / base, "raw"
    (now_kind, now_probe), (base_kind, base_probe) = _probe(block), _probe(baseline)
    unsteady = max(spread(now_probe), spread(base_probe)) if now_probe and base_probe else 0.0
    if now_kind and now_kind == base_kind and now_probe and base_probe and stack:
        how = across_stacks(now_kind, stack).removeprefix("drift correction off: ")
        how = f"uncorrected: {how}"
    elif now_kind and now_kind == base_kind and now_probe and base_probe and \
            unsteady <= tol.max_probe_spread:
        machine = statistics.median(now_probe) / statistics.median(base_probe)
        ratio, how = ratio / machine, f"corrected for a machine {machine:.2f}x the baseline's"
    data: CheckData = {"tolerance": tolerance, "ratio": ratio, "correction": how}
    # Symmetric in the ratio: twice as long, or half as long, at the default of 1.0.
    beyond = (ratio > 1 + tolerance or ratio < 1 / (1 + tolerance)) and \
        abs(now - base) >= MIN_CHANGE_S
    words = (f"compile {now:.2f} s, baseline {base:.2f} s ({fmt_signed_percent(ratio - 1)} "
             f"{how}; tolerance {fmt_tolerance(tolerance)}, changes under "
             f"{MIN_CHANGE_S:g} s not counted)")
    foreign = float((compile_load or {}).get("foreign_cores") or 0.0)
    if compile_load is not None:
        data["load"] = dict(compile_load)
    verdict, detail = Verdict.PASS, words
    if not beyond:
        pass
    elif max_foreign_load is not None and foreign > max_foreign_load:
        verdict = Verdict.INCONCLUSIVE
        detail = (f"{words}; not judged: other processes used {foreign:.2f} cores on "
                  f"average while it compiled (bound {max_foreign_load:g}, "
                  f"--accelperf-max-foreign-load), a compile beside another job")
    elif unsteady > tol.max_probe_spread:
        verdict = Verdict.INCONCLUSIVE
        detail = (f"{words}; the probe was too unsteady (IQR {unsteady:.0%} of its "
                  f"median) to tell a slower compile from a contended machine")
    elif ratio > 1:
        verdict = Verdict.REGRESSION
    else:
        verdict = Verdict.IMPROVEMENT
        detail = f"{words}; run with --accelperf-update to record it"
    return CheckResult(METRIC, verdict, detail, baseline=base, now=now, unit=UNIT,
                       change=ratio - 1, data=data)


class CompileCheck(BaseCheck):
    """The ``compile`` row: one sample, so a timing without an interval."""

    metric = METRIC
    tolerances = ("compile_tolerance", "max_probe_spread")
    sections = ("compile_time", "probe")
    kind = "timing"

    def check(self, given: CheckInput) -> tuple[CheckResult, ...]:
        if not given.ok:
            return ()
        return one(check_compile_time(given.block, given.baseline, given.tol,
                                      comparable=given.comparable,
                                      compile_load=(given.run.compile_load.to_json()
                                                    if given.run.compile_load else None),
                                      max_foreign_load=given.max_foreign_load,
                                      stack=given.stack))

    def record(self, run: Run) -> Mapping[str, object]:
        """``compile_time``, where the run timed a compile."""
        if run.outcome != "ok" or not run.compile_time:
            return {}
        return {"compile_time": round_sig(run.compile_time)}

    def adjusted(self, result: CheckResult) -> bool:
        """A compile time corrected for the machine's speed by the probe."""
        return result.change is not None and \
            str(result.data.get("correction", "")).startswith("corrected")


CHECK = CompileCheck()
