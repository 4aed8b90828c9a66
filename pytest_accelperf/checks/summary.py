"""The baseline block: the part of a run that the checks need, small enough to diff.

A block is plain JSON. It is what ``--accelperf-update`` stores per case and what every
check compares a new run against. This module writes what every run records; each check
writes the sections it owns (:meth:`pytest_accelperf.checks.protocol.Check.record`: the
loss curve is the loss check's, the step times the throughput check's). Keep it stable: a
field renamed is a schema change (bump ``SCHEMA_VERSION`` in ``baselines.py``).
"""

from __future__ import annotations

import copy
import datetime as _dt
from collections.abc import Sequence
from typing import Any

from pytest_accelperf.checks.table import checks
from pytest_accelperf.checks.throughput import session_entry, session_level
from pytest_accelperf.records.run import Run
from pytest_accelperf.stats.units import SAMPLE_DIGITS as SAMPLE_DIGITS
from pytest_accelperf.stats.units import round_sig as _round
from pytest_accelperf.store.block import Block, read_block
from pytest_accelperf.store.schema import block_model

#: Keys left out of a block when their value is None or empty (every reader takes a
#: missing key as None; they cost a line each for nothing).
_OMITTED_WHEN_EMPTY = ("message", "tokens_per_step", "samples_per_second", "compile_time",
                       "flops_per_step", "mfu")


#: Sessions kept in a baseline's ``step_time.sessions`` (the oldest are dropped).
MAX_SESSIONS = 20


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
        sessions = [session_level(median, (baseline.get("probe") or {}).get("samples")
                                  or []).to_json()]
    merged = copy.deepcopy(baseline)
    merged["step_time"]["sessions"] = [*sessions, entry.to_json()][-MAX_SESSIONS:]
    return merged


def summarize(run: Run) -> Block:
    """The baseline block for ``run``: what every run records (outcome, environment, batch,
    devices, when), then each check's sections of it, in the order of the table of checks
    (:meth:`pytest_accelperf.checks.protocol.Check.record`), typed as
    :class:`~pytest_accelperf.store.block.Block` (with every check's own section,
    :func:`pytest_accelperf.store.schema.block_model`), not validated: a failed run's block is
    judged by the checks, never stored (:func:`pytest_accelperf.store.block.read`). Its JSON, what
    the store and the reports keep, is ``summarize(run).to_json()``.

    ``numerics`` is the run's per-leaf fingerprint (what the checks compare with a baseline
    of either form); the store keeps its compact form
    (:func:`pytest_accelperf.store.baselines.check_block`)."""
    block: dict[str, Any] = {
        "outcome": run.outcome,
        "message": run.message,
        "environment": run.environment.to_json(),
        "samples_per_step": run.samples_per_step,
        "tokens_per_step": run.tokens_per_step,
        "n_devices": run.n_devices,
        "recorded_at": _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat(),
    }
    if run.oom is not None:
        block["oom"] = run.oom
    if run.outcome == "ok":
        block["flops_per_step"] = _round(run.flops_per_step) if run.flops_per_step else None
        block["mfu"] = _round(run.mfu) if run.mfu is not None else None
    for check in checks():
        block.update(check.record(run))
    for key in _OMITTED_WHEN_EMPTY:
        if block.get(key) in (None, ""):
            block.pop(key, None)
    return read_block(block, block_model())
