"""What a case that ran to the end stores in the baseline store: one decision, made by
:func:`to_store` from the judged result (:class:`~pytest_accelperf.gate.judge.Evaluated`) and
the session's settings, before the runner records the case (the controller writes what
every case stored, :mod:`pytest_accelperf.store.baselines`).

* Nothing but under ``--accelperf-update``, and never a run that may not become a baseline
  (:func:`pytest_accelperf.checks.recordable.unrecordable`: it is failed instead, saying why).
* ``--accelperf-add-session``: the stored baseline with this run's step-time level added
  (:func:`pytest_accelperf.checks.summary.with_added_session`) to this machine's timing
  (:mod:`pytest_accelperf.store.machines`; a machine with no timing of its own has none
  to add to), or nothing, and why not.
* A recording that stays too noisy to be a level after it was re-measured
  (:class:`pytest_accelperf.gate.judge.Recording`,
  :func:`~pytest_accelperf.checks.throughput.recording_noise`) is stored marked
  ``noisy`` (:func:`marked_noisy`), with a warning: a new baseline whole (its throughput is
  inconclusive until re-recorded), an added session that session alone (it is kept, and
  gives no level).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pytest_accelperf.checks.recordable import unrecordable
from pytest_accelperf.checks.summary import with_added_session
from pytest_accelperf.checks.throughput import NOISY_KEY
from pytest_accelperf.gate.judge import Evaluated
from pytest_accelperf.records.run import Run


@dataclass(frozen=True)
class ToStore:
    """What :func:`to_store` decided for one case.

    ``block``: the block to store (None: nothing). ``unstorable``: why the run must never
    become a baseline (None: it may). ``refused``: why no session was added (``""``: none
    was asked for, or it was). ``noisy``: the warning of a block stored marked noisy
    (``""``: it was not). ``note``: what the recording did before (re-measured it), said
    where the block is stored unmarked.
    """

    block: dict[str, Any] | None
    unstorable: str | None
    refused: str = ""
    noisy: str = ""
    note: str = ""


def to_store(ev: Evaluated, *, update: bool, add_session: bool,
             noise: Callable[[Run], str]) -> ToStore:
    """What to store of the judged case ``ev`` (see the module doc). ``noise(run)`` says
    why ``run`` is too noisy to be a level, or ``""``."""
    unstorable = unrecordable(ev.run, ev.checks, ev.block)
    block = ev.block.to_json() if update and unstorable is None else None
    refused = ""
    if add_session and block is not None:
        stored = ev.stored
        try:
            if stored is not None and stored.new:
                raise ValueError(f"this machine ({stored.machine}) has no timing of its own "
                                 f"in the baseline to add a session to; record it first "
                                 f"with --accelperf-update")
            block = with_added_session(ev.baseline.to_json() if ev.baseline else None, ev.run,
                                       list(ev.diffs))
        except ValueError as exc:
            block, refused = None, str(exc)
        if block is not None and stored is not None and stored.timing_env is not None:
            # The session joins this machine's timing, recorded in its own environment.
            block = {**block, "environment": dict(stored.timing_env)}
            if stored.timing_recorded_at is not None:
                block["recorded_at"] = stored.timing_recorded_at
    if block is not None and ev.machine:
        block = {**block, "machine": ev.machine}  # whose timing it is (store/machines.py)
    noisy = noise(ev.run) if block is not None else ""
    if block is not None and noisy:
        block, warning = marked_noisy(block, noisy, ev.recording_note,
                                      add_session=add_session)
        return ToStore(block, unstorable, refused, noisy=warning)
    note = ev.recording_note if block is not None else ""
    return ToStore(block, unstorable, refused, note=note)


def marked_noisy(block: dict[str, Any], noisy: str, note: str, *,
                 add_session: bool) -> tuple[dict[str, Any], str]:
    """``block`` to store marked noisy (a new baseline: the block; an added session: that
    session), and the warning that the terminal, the reports and the gate carry."""
    why = f"{noisy}{'; ' + note if note else ''}"
    step = block.get("step_time") or {}
    sessions = step.get("sessions")
    if add_session and isinstance(sessions, list) and sessions:
        block = {**block, "step_time": {
            **step, "sessions": [*sessions[:-1], {**sessions[-1], NOISY_KEY: why}]}}
        what = ("this session's step-time level was stored marked noisy: it is kept but "
                "gives the throughput check no level; add a session again on a quiet "
                "machine")
    else:
        block = {**block, NOISY_KEY: why}
        what = ("stored marked noisy: its throughput is inconclusive until it is "
                "re-recorded with --accelperf-update on a quiet machine")
    return block, f"recorded on a noisy machine: {why}; {what}"
