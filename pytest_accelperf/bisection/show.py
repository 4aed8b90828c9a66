"""A bisection in words (see :mod:`pytest_accelperf.bisection`): a line per step as it
happens, and at the end the first bad commit, the table of the evidence and the command
that reproduces the last decisive comparison (and the first bad commit's).
"""

from __future__ import annotations

from tabulate import tabulate

from pytest_accelperf.bisection.commits import CommitRange
from pytest_accelperf.bisection.driver import Result, Step, reproduced
from pytest_accelperf.bisection.status import Status

#: Characters of a subject or an evidence shown in the table.
SUBJECT = 40
EVIDENCE = 110


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 1] + "\u2026"


def _position(step: Step, rng: CommitRange) -> str:
    return "GOOD" if step.position == 0 else f"{step.position}/{len(rng.commits)}"


def start_line(rng: CommitRange, args: tuple[str, ...]) -> str:
    """What is about to be bisected."""
    return (f"accelperf bisect: {len(rng.commits)} commit(s) in {rng.good.short}..."
            f"{rng.bad.short} (first-parent), sessions of: {' '.join(args)}")


def step_line(step: Step, rng: CommitRange) -> str:
    """``[9/16] 1a2b3c4d5e program  bad   FLOPs +52.3% (6.1 s)``."""
    return (f"[{_position(step, rng)}] {step.commit.short} {step.kind:<7} {step.call:<9} "
            f"{step.evidence} ({step.seconds:.1f} s)")


def table(result: Result) -> str:
    """The evidence of every step, in the order they ran."""
    rows = [(str(i), step.commit.short, _position(step, result.range),
             _cut(step.commit.subject, SUBJECT), step.kind, step.call,
             _cut(step.evidence, EVIDENCE), f"{step.seconds:.1f} s")
            for i, step in enumerate(result.steps)]
    return tabulate(rows, headers=("step", "commit", "n", "subject", "against GOOD",
                                   "verdict", "evidence", "time"), disable_numparse=True)


#: What a search ran on, in the headline.
BASES = {"program": "program record", "timing": "A/B timing",
         "input": "input checks (the making of the batch, against GOOD's recording)"}


def headline(result: Result) -> str:
    """The first bad commit (sha and subject) or why there is none."""
    bad = result.first_bad
    if result.status is Status.FOUND and bad is not None:
        return (f"first bad commit: {bad.sha} {bad.subject}\n"
                f"(commit {result.range.position(bad)} of {len(result.range.commits)} in "
                f"{result.range.good.short}..{result.range.bad.short}, found on the "
                f"{BASES.get(result.basis, result.basis)} in "
                f"{result.comparisons} comparisons with GOOD, {result.seconds:.0f} s)")
    return f"no first bad commit: {result.message}"


def render(result: Result) -> str:
    """Everything printed at the end of a bisection."""
    parts = [headline(result), "", "evidence (each commit against GOOD "
             f"{result.range.good.short}):", table(result)]
    parts += [f"note: {note}" for note in result.notes]
    shown = reproduced(result.steps, result.first_bad)
    if result.reproduce and shown:
        what = " and ".join(f"{s.commit.short} ({s.call})" for s in shown)
        how = ("in A/B mode" if all(s.kind == "A/B" for s in shown) else
               f"its {'input' if any(s.kind == 'input' for s in shown) else 'program'} "
               f"check against the baseline GOOD's session records")
        which = "the last decisive comparison" + (" and the first bad commit's"
                                                   if len(shown) > 1 else "")
        parts += ["", f"reproduce {which} ({what}, against GOOD {result.range.good.short}, "
                      f"{how}):"]
        parts += [f"  {line}" for line in result.reproduce]
    return "\n".join(parts) + "\n"
