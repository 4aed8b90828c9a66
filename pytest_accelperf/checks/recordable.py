"""What may become a baseline, and what a baseline can clear: one rule for
``--accelperf-update``, ``accelperf baselines accept`` and the messages that offer them.

A baseline records an intended change. A run that did not finish (``nan``, ``error``,
``timeout``), a failed correctness check (the single-device reference), or a non-finite
loss or parameter is a failure, and storing it would make the next run compare against a
broken expectation; so the plugin and the CLI refuse it alike, and say why
(:func:`unrecordable`).

Some failures are no baseline matter at all (:func:`not_cleared_by_a_baseline`): an A/B
comparison (the base revision decides it), and what each check says it cannot be cleared by
a baseline (:meth:`pytest_accelperf.checks.protocol.Check.not_cleared`): the reference
check (a correctness bug), a leak (judged against ``--accelperf-leak-bytes-per-step``,
baseline or not) and a scaling curve (judged against its expected shape). Accepting a run
cannot clear them, so no failure message offers it for them and ``accelperf baselines
accept`` refuses a case that has no other failure. A check may also refuse the run as a
baseline altogether (:meth:`~pytest_accelperf.checks.protocol.Check.refuses_recording`:
the reference check's failure).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from pytest_accelperf.checks.table import check_of
from pytest_accelperf.records.fingerprint import FingerprintError, fingerprint_leaves
from pytest_accelperf.records.run import Run
from pytest_accelperf.records.verdict import CheckResult, Verdict
from pytest_accelperf.store.block import BlockLike, json_of, read_block

#: Outcomes never stored as a baseline: they are failures, not expectations.
UNRECORDABLE: tuple[str, ...] = ("nan", "error", "timeout")


def unrecordable(run: Run, checks: Sequence[CheckResult],
                 block: BlockLike | None = None) -> str | None:
    """Why ``run`` must not become a baseline, None when it may. ``block`` is the run's
    baseline block (its numerics fingerprint is checked for non-finite parameters)."""
    if run.outcome in UNRECORDABLE:
        why = f" ({run.message})" if run.message else ""
        return f"the run ended with outcome {run.outcome}{why}"
    refusal = next((r for r in map(refused, checks) if r is not None), None)
    if refusal is not None:
        return refusal
    for step, loss in zip(run.loss_steps or range(len(run.losses)), run.losses, strict=False):
        if not math.isfinite(loss):
            return f"loss is {loss} at step {step}"
    fingerprint = read_block(block).numerics if block is not None else None
    try:
        leaves = fingerprint_leaves(json_of(fingerprint))
    except FingerprintError as exc:
        return f"its numerics fingerprint cannot be read: {exc}"
    for leaf in leaves:
        if not leaf.finite:
            return f"{leaf.what} {leaf.name} is not finite after training"
    return None


def shared_unchanged(checks: Sequence[CheckResult]) -> bool:
    """Whether the checks judged a case's shared sections (every check of kind
    ``deterministic``: outcome, loss, program, memory, numerics, ...) unchanged: each
    passed. Then a machine that did not record the stored block writes only its own
    timing beside it (:func:`pytest_accelperf.store.machines.merge`); otherwise
    (something new, changed, or not compared) the run's block is recorded whole."""
    shared = [c for c in checks if check_of(c.metric).kind == "deterministic"]
    return bool(shared) and all(c.verdict is Verdict.PASS for c in shared)


def refused(check: CheckResult) -> str | None:
    """Why ``check``'s failure makes its run no baseline (a correctness failure), in words;
    None when it does not (or ``check`` did not fail)."""
    return check_of(check.metric).refuses_recording(check) if check.failed else None


def not_cleared_by_a_baseline(check: CheckResult) -> str | None:
    """What clears a failed ``check`` when storing a new baseline does not, in words (a
    sentence that names the fix), or None: the check is not failed, or a baseline clears
    it."""
    if not check.failed:
        return None
    if check.data.get("mode") == "ab":
        return ("A/B verdicts are not stored: the base revision is what changes them, if the "
                "change is intended")
    return check_of(check.metric).not_cleared(check)


def clearable(checks: Sequence[CheckResult]) -> list[CheckResult]:
    """The failed checks of ``checks`` that storing the run as a baseline would clear."""
    return [c for c in checks if c.failed and not_cleared_by_a_baseline(c) is None]
