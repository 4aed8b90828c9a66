"""The baseline block: the part of a run that the checks need, small enough to diff.

A block is plain JSON. It is what ``--accelperf-update`` stores per case and what every
check compares a new run against. Keep it stable: a field renamed here is a schema change
(bump ``SCHEMA_VERSION`` in ``baselines.py``).
"""

from __future__ import annotations

import copy
import datetime as _dt
import math
import statistics
from collections.abc import Sequence
from typing import Any

from pytest_accelperf.run import Run
from pytest_accelperf.units import round_sig as _round

#: Loss checkpoints kept per case (the seed logs every 20 steps of ~400).
N_CHECKPOINTS = 10
#: Significant digits of each step-time and probe sample: a rounding error of at most
#: 0.05 %, far below what one step's time varies by, and 2 to 3 characters less per sample
#: (a block holds 20 to 100 of each) than the 6 digits of a median.
SAMPLE_DIGITS = 4
#: Keys left out of a block when their value is None or empty (every reader takes a
#: missing key as None; they cost a line each for nothing).
_OMITTED_WHEN_EMPTY = ("message", "tokens_per_step", "samples_per_second", "compile_time",
                       "flops_per_step", "mfu")


def loss_checkpoints(losses: list[float], steps: list[int] | None = None,
                     n: int = N_CHECKPOINTS) -> list[list[float]]:
    """``[[step, mean loss of the window ending at step], ...]`` at ``n`` even checkpoints.

    The mean over each window smooths the step-to-step noise of small batches, so the band
    compares the trend rather than one lucky batch. Non-finite losses propagate (a NaN
    anywhere in a window makes that checkpoint NaN), so they cannot hide in an average.
    """
    if not losses:
        return []
    steps = steps if steps is not None else list(range(len(losses)))
    k = min(n, len(losses))
    bounds = [round((i + 1) * len(losses) / k) for i in range(k)]
    out: list[list[float]] = []
    start = 0
    for end in bounds:
        window = losses[start:end]
        out.append([float(steps[end - 1]), _round(math.fsum(window) / len(window))])
        start = end
    return out


#: Sessions kept in a baseline's ``step_time.sessions`` (the oldest are dropped).
MAX_SESSIONS = 20


def _session(median: float, probes: Sequence[float]) -> dict[str, float | None]:
    """One ``step_time.sessions`` entry: the median step time and the probe's median (the
    throughput check divides the two when it corrects for drift), None without a probe."""
    return {"median": _round(median),
            "probe_median": _round(statistics.median(probes)) if probes else None}


def session_entry(run: Run) -> dict[str, float | None] | None:
    """This session's step-time level for ``step_time.sessions``; None without step times."""
    med = run.median_step_time
    if med is None:
        return None
    return _session(med, run.probe_times if run.probe_kind else [])


def with_added_session(baseline: dict[str, Any] | None, run: Run,
                       diffs: Sequence[str]) -> dict[str, Any]:
    """``baseline`` with ``run``'s step-time level appended to ``step_time.sessions``
    (``--accelperf-add-session``); everything else stays as recorded. A baseline from before
    sessions were kept gets its own level as the first session. A ``ValueError`` says why no
    session can be added (no baseline, another environment, another batch)."""
    if baseline is None:
        raise ValueError("there is no baseline to add it to; record one first with "
                         "--accelperf-update")
    entry = session_entry(run)
    step = baseline.get("step_time")
    if entry is None or not isinstance(step, dict):
        return baseline  # no step times (an out-of-memory outcome, a max-batch case)
    if diffs:
        raise ValueError(f"the baseline was recorded in another environment "
                         f"({'; '.join(diffs)}); re-record it here with --accelperf-update")
    if int(baseline.get("samples_per_step") or 0) != run.samples_per_step:
        raise ValueError(f"the baseline took {baseline.get('samples_per_step')} samples per "
                         f"step, this run {run.samples_per_step}; re-record it with "
                         f"--accelperf-update")
    sessions = step.get("sessions")
    if not isinstance(sessions, list):
        median = step.get("median")
        if not isinstance(median, (int, float)) or not median > 0:
            raise ValueError("the baseline's step_time has no median to start its sessions "
                             "with; re-record it with --accelperf-update")
        sessions = [_session(median, (baseline.get("probe") or {}).get("samples") or [])]
    merged = copy.deepcopy(baseline)
    merged["step_time"]["sessions"] = [*sessions, entry][-MAX_SESSIONS:]
    return merged


def input_block(run: Run) -> dict[str, Any]:
    """The block's ``input``: CPU seconds making each measured step's batch (every sample,
    rounded as step times are, and their median) and the median wall seconds of the same
    (:attr:`pytest_accelperf.run.Run.input_times`)."""
    out: dict[str, Any] = {
        "median": _round(statistics.median(run.input_times)),
        "samples": [_round(t, SAMPLE_DIGITS) for t in run.input_times],
    }
    if run.input_wall_times:
        out["wall_median"] = _round(statistics.median(run.input_wall_times))
    return out


def metric_curves(run: Run) -> dict[str, dict[str, Any]]:
    """``{name: {"checkpoints", "final", "steps"}}`` of the step's other metrics, as the
    loss's curve; a metric with a non-finite value is left out (a baseline is strict JSON,
    and a NaN learning rate would have made the loss NaN anyway)."""
    out: dict[str, dict[str, Any]] = {}
    for name, values in sorted(run.metrics.items()):
        if not values or not all(math.isfinite(v) for v in values):
            continue
        steps = run.loss_steps if len(run.loss_steps) == len(values) else None
        out[name] = {"checkpoints": loss_checkpoints(values, steps),
                     "final": _round(values[-1]), "steps": len(values)}
    return out


def summarize(run: Run) -> dict[str, Any]:
    """The baseline block for ``run``.

    ``numerics`` is the run's per-leaf fingerprint (what the checks compare with a baseline
    of either form); the store keeps its compact form
    (:func:`pytest_accelperf.baselines.check_block`)."""
    block: dict[str, Any] = {
        "outcome": run.outcome,
        "message": run.message,
        "environment": run.environment,
        "samples_per_step": run.samples_per_step,
        "tokens_per_step": run.tokens_per_step,
        "n_devices": run.n_devices,
        "recorded_at": _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat(),
    }
    if run.oom is not None:
        block["oom"] = run.oom
    if run.outcome == "ok":
        med = run.median_step_time
        sps = run.samples_per_second
        if med is not None:  # no step times (an ingested log without them): no step_time
            block["step_time"] = {
                "median": _round(med),
                "samples": [_round(t, SAMPLE_DIGITS) for t in run.step_times],
            }
            entry = session_entry(run)
            if entry is not None:
                block["step_time"]["sessions"] = [entry]
        if run.input_times:
            block["input"] = input_block(run)
        if run.probe_times and run.probe_kind:
            block["probe"] = {"kind": run.probe_kind,
                              "samples": [_round(t, SAMPLE_DIGITS) for t in run.probe_times]}
        block["samples_per_second"] = _round(sps) if sps is not None else None
        block["compile_time"] = _round(run.compile_time) if run.compile_time else None
        stepped = not run.extra.get("compile_only")  # a compile-only run has no steps
        if stepped:
            block["loss"] = {
                "checkpoints": loss_checkpoints(run.losses, run.loss_steps),
                "final": _round(run.losses[-1]) if run.losses else None,
                "steps": len(run.losses),
            }
        metrics = metric_curves(run)
        if metrics:
            block["metrics"] = metrics
        if stepped:
            block["numerics"] = run.params_fingerprint
            replay = run.extra.get("replay")
            if isinstance(replay, dict) and replay.get("leaves"):
                block["numerics_spread"] = dict(replay["leaves"])
        block["flops_per_step"] = _round(run.flops_per_step) if run.flops_per_step else None
        block["mfu"] = _round(run.mfu) if run.mfu is not None else None
    if run.max_batch is not None:
        block["max_batch"] = run.max_batch
    if run.memory_per_device:
        block["memory"] = {
            "per_device": dict(sorted(run.memory_per_device.items())),
            "peak": run.peak_memory,
            "source": run.memory_source,
        }
        if run.memory_growth is not None:
            block["memory"]["growth"] = run.memory_growth
    if run.outcome == "ok" and run.program is not None:
        block["program"] = run.program
    for key in _OMITTED_WHEN_EMPTY:
        if block.get(key) in (None, ""):
            block.pop(key, None)
    return block
