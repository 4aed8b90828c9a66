"""What the gate says when it fails a case, or warns about one: the words, made here from
the case's checks (:meth:`pytest_accelperf.gate.runner.CaseRunner._gate` decides, and raises).

A failure message groups what failed by what clears it
(:mod:`pytest_accelperf.checks.recordable`): a stored-baseline failure is cleared by accepting
the change; an A/B failure by the base revision; a reference failure (the sharded run
disagrees with its single-device run) by fixing the code; a leak by fixing the step.
Accepting is offered only for what it clears, with the command that does it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from pytest_accelperf.checks.numerics import REFERENCE_METRIC
from pytest_accelperf.checks.recordable import clearable, not_cleared_by_a_baseline
from pytest_accelperf.records.verdict import CheckResult
from pytest_accelperf.report.writing import readable_back


def accept_command(nodeid: str, *, target: str | None, accel: str) -> str:
    """The command that records ``nodeid``'s run as its baseline."""
    where = f"--accelperf-target={target}" if target else f"--accel={accel}"
    return f"pytest '{nodeid}' {where} --accelperf-update"


def other_environment(nodeid: str, diffs: Sequence[str]) -> str:
    """The warning of a case whose baseline was recorded in another environment
    (``diffs``: how it differs, in words)."""
    note = "; ".join(diffs)
    return (f"{nodeid}: baseline from another environment ({note}); throughput not "
            f"compared, other checks still apply. Re-record on this machine with "
            f"--accelperf-update")


def not_recorded(nodeid: str, unstorable: str) -> str:
    """The failure of ``--accelperf-update`` for a run that may not become a baseline."""
    return (f"{nodeid}: not recorded as a baseline: {unstorable}; fix the run, then record "
            f"it")


def no_baseline(nodeid: str, accept: str) -> str:
    """The failure of a case that has no baseline."""
    return f"{nodeid}: no baseline; run with --accelperf-update to record it:\n  {accept}"


def failure_message(nodeid: str, platform: str, failed: Sequence[CheckResult], *,
                    has_baseline: bool, unstorable: str | None, accept: str,
                    report: Path | None = None) -> str:
    """What failed, grouped by what clears it (see the module doc). ``unstorable``: why
    the run can never be a baseline (then no accepting is offered); ``accept``: the command
    that accepts it; ``report``: this session's JSON report (``--accelperf-json``), offered
    to accept from without re-running where it can be read back."""
    stored = clearable(failed)
    ab = [c for c in failed if c.data.get("mode") == "ab"]
    reference = [c for c in failed if c.metric == REFERENCE_METRIC]
    other = [c for c in failed if c not in stored and c not in ab and c not in reference]
    lines = []
    if stored:
        lines.append(f"{nodeid}: {len(stored)} regression(s) against the "
                     f"{platform} baseline:" if has_baseline else
                     f"{nodeid}: {len(stored)} failure(s) on {platform} (no "
                     f"baseline yet):")
        lines += [f"  {c.metric}: {c.detail}" for c in stored]
    if reference:
        lines.append(f"{nodeid}: the run disagrees with its single-device "
                     f"reference, a correctness bug in the parallel code (a partition "
                     f"spec, a missing gradient reduction), not a change of baseline:")
        lines += [f"  {c.metric}: {c.detail}" for c in reference]
    if ab:
        lines.append(f"{nodeid}: {len(ab)} regression(s) against the base revision (A/B):")
        lines += [f"  {c.metric}: {c.detail}" for c in ab]
        lines.append("A/B verdicts are not stored: if this change is intended, the "
                     "base revision is what changes it.")
    if other:
        lines.append(f"{nodeid}: {len(other)} failure(s) that no baseline clears:")
        for c in other:
            lines += [f"  {c.metric}: {c.detail}",
                      f"  -> {not_cleared_by_a_baseline(c)}"]
    if unstorable is not None or reference:
        # Accepting cannot clear a failure that is never stored: say so, not "accept".
        lines.append("This run cannot become a baseline: fix the failure "
                     "(--accelperf-update and accelperf baselines accept refuse to "
                     "record it).")
        return "\n".join(lines)
    if stored:
        left = ["the A/B one"] * bool(ab) + [f"the {c.metric} one" for c in other]
        also = (f" (this clears the stored-baseline failures above, not "
                f"{' or '.join(left)})" if left else "")
        lines.append(f"If this change is intended, accept it{also} with:\n  {accept}")
        if report is not None and readable_back(report):
            case = nodeid.split("::", 1)[-1]
            lines.append(f"or, without re-running, from this session's report:\n"
                         f"  accelperf baselines accept {report} "
                         f"--case '{case}'")
    return "\n".join(lines)
