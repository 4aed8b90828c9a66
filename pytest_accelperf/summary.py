"""The baseline block: the part of a run that the checks need, small enough to diff.

A block is plain JSON. It is what ``--accelperf-update`` stores per case and what every
check compares a new run against. Keep it stable: a field renamed here is a schema change
(bump ``SCHEMA_VERSION`` in ``baselines.py``).
"""

from __future__ import annotations

import datetime as _dt
import math
import statistics
from typing import Any

from pytest_accelperf.run import Run
from pytest_accelperf.units import round_sig as _round

#: Loss checkpoints kept per case (the seed logs every 20 steps of ~400).
N_CHECKPOINTS = 10


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


def session_entry(run: Run) -> dict[str, float | None] | None:
    """This session's step-time level for ``step_time.sessions``: the median step time and,
    when a probe was timed, the probe's median (the throughput check divides the two when it
    corrects for drift). None without step times."""
    med = run.median_step_time
    if med is None:
        return None
    probe = statistics.median(run.probe_times) if run.probe_times and run.probe_kind else None
    return {"median": _round(med), "probe_median": _round(probe) if probe else None}


def summarize(run: Run) -> dict[str, Any]:
    """The baseline block for ``run``."""
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
        block["step_time"] = {
            "median": _round(med) if med is not None else None,
            "samples": [_round(t) for t in run.step_times],
        }
        entry = session_entry(run)
        if entry is not None:
            block["step_time"]["sessions"] = [entry]
        if run.probe_times and run.probe_kind:
            block["probe"] = {"kind": run.probe_kind,
                              "samples": [_round(t) for t in run.probe_times]}
        block["samples_per_second"] = _round(sps) if sps is not None else None
        block["compile_time"] = _round(run.compile_time) if run.compile_time else None
        block["loss"] = {
            "checkpoints": loss_checkpoints(run.losses, run.loss_steps),
            "final": _round(run.losses[-1]) if run.losses else None,
            "steps": len(run.losses),
        }
        block["numerics"] = run.params_fingerprint
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
    return block
