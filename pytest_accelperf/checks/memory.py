"""The memory check: peak device memory, device by device, against the baseline's.

Peak bytes are compared per device label present in both runs, as the ratio
``now / baseline``. Any device above ``1 + memory_tolerance`` is a regression (the worst
device is named, with its numbers); every device below ``1 - memory_tolerance`` is an
improvement; anything else passes. A sharded run that grows on one device only is caught:
the maximum over devices could hide it behind a larger, unchanged one.

The numbers are only comparable when both runs cover the same devices and counted memory
the same way (``memory_stats`` at run time or ``memory_analysis`` from the compiler;
``mem_tracker``, ``profiler`` or ``cuda_allocator`` for torch); otherwise the verdict is
``incomparable``. The method that counted this run's numbers is the check's
``data["source"]`` (``data["baseline_source"]``: the baseline's), whatever the verdict,
and the terminal table shows it beside the metric (``memory (profiler)``). The check
applies to runs that did not finish too: an out-of-memory run still reports what it would
have needed.

A leak is a ``memory`` regression too, with or without a baseline: where the backend read
how live memory grew over the measured steps (``memory.growth``: JAX's live arrays, the
torch profiler's allocations on counted steps, the CUDA allocator), growth beyond
``leak_bytes_per_step`` per step fails and the detail names the growth.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import replace
from typing import Any, cast

from pytest_accelperf.checks.base import BaseCheck
from pytest_accelperf.checks.outcome import missing_in_baseline, new_result
from pytest_accelperf.checks.protocol import CheckInput, SubRow, one
from pytest_accelperf.records.run import MemoryGrowth, Run
from pytest_accelperf.records.section import made
from pytest_accelperf.records.verdict import CheckData, CheckResult, Compared, Tolerances, Verdict
from pytest_accelperf.stats.units import fmt_bytes, fmt_percent, fmt_signed_percent, fmt_tolerance
from pytest_accelperf.store.block import Block, BlockLike, Growth, Memory, read, read_block

METRIC = "memory"
UNIT = "bytes"
#: Most devices listed one row each under a ``memory`` row (seed 002's eight GPU columns).
MAX_DEVICE_ROWS = 8
_REMEDY = "re-record with --accelperf-update"
#: Devices named in a sentence before the rest are counted.
_MAX_NAMED = 4


def device_order(label: str) -> list[Any]:
    """Sort key that puts ``cpu:2`` before ``cpu:10``."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", label)]


def _names(labels: list[str]) -> str:
    shown = ", ".join(labels[:_MAX_NAMED])
    return shown + (f", … ({len(labels)} in all)" if len(labels) > _MAX_NAMED else "")


def _ratio(now: int, base: int) -> float:
    if base > 0:
        return now / base
    return 1.0 if now == 0 else float("inf")


def _memory(block: Block | None) -> Memory:
    """``block``'s memory record; an empty one where it has none."""
    mem = block.memory if block is not None else None
    return mem if mem is not None else Memory.model_construct(per_device={})


def leak_sentence(growth: MemoryGrowth) -> str:
    """``"live memory grew 133.00 KiB per step over 16 measured steps (…)"``."""
    return (f"live memory grew {fmt_bytes(float(growth.get('bytes_per_step', 0)))} per step "
            f"over {growth.get('steps', '?')} measured steps "
            f"({fmt_bytes(float(growth.get('after_warmup', 0)))} after the warm-up, "
            f"{fmt_bytes(float(growth.get('after_steps', 0)))} after the last step; counted by "
            f"{growth.get('source', '?')})")


def _leak(result: CheckResult | None, block: Block, tol: Tolerances) -> CheckResult | None:
    """``result`` made a regression when live memory grew per step beyond
    ``leak_bytes_per_step``, baseline or not: a step that keeps something alive each step
    runs out of memory in a long training, whatever its peak over a few steps."""
    record = _memory(block).growth
    if not isinstance(record, Growth):
        return result
    growth = cast(MemoryGrowth, record.to_json())  # the JSON of a run's MemoryGrowth
    per_step = float(growth.get("bytes_per_step") or 0.0)
    if result is not None:
        result = replace(result, data={**result.data, "growth": growth})
    if per_step <= tol.leak_bytes_per_step:
        return result
    if result is None:
        result = CheckResult(METRIC, Verdict.REGRESSION, "", unit=UNIT, data={"growth": growth})
    # Judged without the baseline: accepting one cannot clear it.
    return replace(result, verdict=Verdict.REGRESSION, data={**result.data, "leak": True},
                   detail=(f"{leak_sentence(growth)}: a leak (tolerance "
                           f"{fmt_bytes(tol.leak_bytes_per_step)} per step; something the "
                           f"step keeps alive each step, e.g. a tensor appended to a list)"))


def check_memory(block: BlockLike, baseline: BlockLike | None,
                 tol: Tolerances) -> CheckResult | None:
    """Peak memory per device of ``block`` against ``baseline``'s, and live memory's growth
    per step (a leak, judged with or without a baseline); None without any."""
    block, baseline = read_block(block), read_block(baseline)
    return _leak(_check_peak(block, baseline, tol), block, tol)


def _check_peak(block: Block, baseline: Block | None, tol: Tolerances) -> CheckResult | None:
    now_mem, base_mem = _memory(block), _memory(baseline)
    now_dev: dict[str, int] = {k: int(v) for k, v in (now_mem.per_device or {}).items()}
    base_dev: dict[str, int] = {k: int(v) for k, v in (base_mem.per_device or {}).items()}
    now_peak = float(max(now_dev.values())) if now_dev else None
    if not now_dev and not base_dev:
        return None
    if baseline is None:
        return new_result(METRIC, now=now_peak, unit=UNIT,
                          data={"per_device": now_dev, "source": now_mem.source})
    if not base_dev:
        missing = missing_in_baseline(METRIC, "memory record", baseline, now=now_peak, unit=UNIT)
        return replace(missing, data={**missing.data, "source": now_mem.source})

    base_peak = float(max(base_dev.values()))
    change = now_peak / base_peak - 1 if now_peak is not None and base_peak else None
    tolerance = tol.memory_tolerance
    now_src, base_src = now_mem.source, base_mem.source
    data: CheckData = {"tolerance": tolerance, "source": now_src,
                            "baseline_source": base_src}
    result = CheckResult(METRIC, Verdict.PASS, "", baseline=base_peak, now=now_peak, unit=UNIT,
                         change=change, data=data)

    if not now_dev:
        return replace(result, verdict=Verdict.INCOMPARABLE, detail=(
            f"this run recorded no device memory, the baseline did; {_REMEDY}"))
    if set(now_dev) != set(base_dev):
        only_now = sorted(set(now_dev) - set(base_dev), key=device_order)
        only_base = sorted(set(base_dev) - set(now_dev), key=device_order)
        parts = []
        if only_now:
            parts.append(f"only now: {_names(only_now)}")
        if only_base:
            parts.append(f"only in the baseline: {_names(only_base)}")
        return replace(result, verdict=Verdict.INCOMPARABLE,
                       detail=f"devices differ from the baseline's ({'; '.join(parts)}); {_REMEDY}",
                       data={**data, "devices": sorted(now_dev, key=device_order),
                             "baseline_devices": sorted(base_dev, key=device_order)})
    if now_src and base_src and now_src != base_src:
        return replace(result, verdict=Verdict.INCOMPARABLE, detail=(
            f"memory counted by {now_src}, the baseline's by {base_src}; {_REMEDY}"))

    labels = sorted(now_dev, key=device_order)
    ratios = {d: _ratio(now_dev[d], base_dev[d]) for d in labels}
    per_device: dict[str, Compared] = {
        d: {"baseline": base_dev[d], "now": now_dev[d], "ratio": ratios[d]} for d in labels}
    data["per_device"] = per_device
    worst_up = max(labels, key=lambda d: ratios[d])  # first of the largest, in device order

    def numbers(d: str) -> str:
        return f"{fmt_bytes(now_dev[d])}, baseline {fmt_bytes(base_dev[d])}"

    def change_text(d: str) -> str:
        return f"{fmt_signed_percent(ratios[d] - 1)}, tolerance {fmt_tolerance(tolerance)}"

    over = [d for d in labels if ratios[d] > 1 + tolerance]
    if over:
        detail = f"peak memory on {worst_up} is {numbers(worst_up)} ({change_text(worst_up)})"
        if len(labels) > 1:
            detail += f"; {len(over)} of {len(labels)} devices over: {_names(over)}"
        return replace(result, verdict=Verdict.REGRESSION, detail=detail,
                       data={**data, "device": worst_up})
    if all(r < 1 - tolerance for r in ratios.values()):
        least = max(labels, key=lambda d: ratios[d])
        scope = f"all {len(labels)} devices" if len(labels) > 1 else labels[0]
        return replace(result, verdict=Verdict.IMPROVEMENT, data=data, detail=(
            f"peak memory down by at least {fmt_percent(1 - ratios[least])} on "
            f"{scope} (least on {least}: {numbers(least)}; tolerance "
            f"{fmt_tolerance(tolerance)}); run with --accelperf-update to record "
            f"the new baseline"))
    worst = max(labels, key=lambda d: abs(ratios[d] - 1))
    scope = f"on all {len(labels)} devices" if len(labels) > 1 else f"on {labels[0]}"
    return replace(result, data={**data, "device": worst}, detail=(
        f"peak memory within {fmt_tolerance(tolerance)} {scope} (largest change "
        f"{fmt_signed_percent(ratios[worst] - 1)} on {worst})"))


class MemoryCheck(BaseCheck):
    """The ``memory`` row, for runs that did not finish too (an out-of-memory run still
    says what it would have needed); its label names how the peak was counted, and a row
    per device follows where their peaks differ."""

    metric = METRIC
    tolerances = ("memory_tolerance", "leak_bytes_per_step")
    sections = ("memory",)

    def check(self, given: CheckInput) -> tuple[CheckResult, ...]:
        if not given.ok and given.baseline is not None and not given.baseline.memory:
            return ()
        return one(check_memory(given.block, given.baseline, given.tol))

    def record(self, run: Run) -> Mapping[str, object]:
        """``memory``: peak bytes per device, their maximum, how they were counted, and
        live memory's growth per step where the backend read it."""
        if not run.memory_per_device:
            return {}
        memory = made(Memory, per_device=dict(sorted(run.memory_per_device.items())),
                      peak=run.peak_memory, source=run.memory_source)
        if run.memory_growth is not None:
            memory.growth = read(Growth, run.memory_growth)
        return {"memory": memory.to_json()}

    def not_cleared(self, result: CheckResult) -> str | None:
        """A leak is judged against ``--accelperf-leak-bytes-per-step``, baseline or not."""
        if not result.data.get("leak"):
            return None
        return ("live memory grows with every step, a leak judged against "
                "--accelperf-leak-bytes-per-step whatever the baseline: fix the step (or "
                "raise the bound if the growth is intended)")

    def label(self, result: CheckResult) -> str:
        """``memory (mem_tracker)``, ``memory (profiler)``: the method that counted this
        run's peak, so that a case whose counting method changed is never silent about
        it."""
        source = result.data.get("source")
        return f"{result.metric} ({source})" if isinstance(source, str) and source \
            else result.metric

    def sub_rows(self, result: CheckResult) -> list[SubRow]:
        """One per device (or rank) when their peaks differ, up to
        :data:`MAX_DEVICE_ROWS`; none when every device holds the same bytes (the check's
        own row already says it) or when there are more devices than that."""
        per = result.data.get("per_device") or {}
        if not 1 < len(per) <= MAX_DEVICE_ROWS:
            return []
        rows: list[SubRow] = []
        seen: set[tuple[object, object]] = set()
        for label, value in per.items():
            if isinstance(value, dict):
                base, now, ratio = value.get("baseline"), value.get("now"), value.get("ratio")
            else:
                base, now, ratio = None, value, None
            seen.add((base, now))
            rows.append(SubRow(f"  {label}", base, now,
                               ratio - 1 if isinstance(ratio, float) else None, UNIT))
        return rows if len(seen) > 1 else []


CHECK = MemoryCheck()
