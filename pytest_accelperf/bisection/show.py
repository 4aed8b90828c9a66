"""A bisection in words (see :mod:`pytest_accelperf.bisection`): a line per step as it
happens, and at the end the first bad commit, the table of the evidence and the command
that reproduces the last decisive comparison (and the first bad commit's).
"""

from __future__ import annotations

from tabulate import tabulate

from pytest_accelperf.bisection.commits import CommitRange
from pytest_accelperf.bisection.driver import Result, Step, first_bad_words, reproduced
from pytest_accelperf.bisection.status import Status

#: Characters of a subject or an evidence shown in the table.
SUBJECT = 40
EVIDENCE = 110


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 1] + "\u2026"


def _good(rng: CommitRange) -> str:
    """What the first end is called: GOOD (commits) or LOW (releases)."""
    return "LOW" if rng.package else "GOOD"


def _position(step: Step, rng: CommitRange) -> str:
    return _good(rng) if step.position == 0 else f"{step.position}/{len(rng.commits)}"


def start_line(rng: CommitRange, args: tuple[str, ...]) -> str:
    """What is about to be bisected."""
    if rng.package:
        return (f"accelperf bisect: {len(rng.commits)} release(s) of {rng.package} after "
                f"{rng.good.sha} up to {rng.bad.sha} "
                f"({', '.join(c.sha for c in (rng.good, *rng.commits))}), each in an "
                f"environment of its own, sessions of: {' '.join(args)}")
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
    rng = result.range
    return tabulate(rows, headers=("step", rng.unit, "n", "installed" if rng.package
                                   else "subject", f"against {_good(rng)}", "verdict",
                                   "evidence", "time"), disable_numparse=True)


#: What a search ran on, in the headline.
BASES = {"program": "program record", "timing": "A/B timing",
         "input": "input checks (the making of the batch, against GOOD's recording)"}


def headline(result: Result) -> str:
    """The first bad commit (sha and subject) or why there is none."""
    bad, rng = result.first_bad, result.range
    if result.status is Status.FOUND and bad is not None:
        return (f"{first_bad_words(rng, bad)}\n"
                f"({rng.unit} {rng.position(bad)} of {len(rng.commits)} in "
                f"{rng.good.short}..{rng.bad.short}, found on the "
                f"{BASES.get(result.basis, result.basis)} in "
                f"{result.comparisons} comparisons with {_good(rng)}, {result.seconds:.0f} s)")
    return f"no first bad {rng.unit}: {result.message}"


def render(result: Result) -> str:
    """Everything printed at the end of a bisection."""
    rng = result.range
    parts = [headline(result)]
    if result.diff and result.first_bad is not None:
        index = rng.commits.index(result.first_bad)
        before = rng.commits[index - 1] if index else rng.good
        parts += [f"its program against {rng.package} {before.sha}'s:"]
        parts += [f"  {line}" for line in result.diff]
    parts += ["", f"evidence (each {rng.unit} against {_good(rng)} {rng.good.short}):",
              table(result)]
    parts += [f"note: {note}" for note in result.notes]
    if result.environments:
        parts += ["", "environments (overlays of this one, in the cache):"]
        parts += [f"  {line}" for line in result.environments]
    shown = reproduced(result.steps, result.first_bad)
    if result.reproduce and shown:
        what = " and ".join(f"{s.commit.short} ({s.call})" for s in shown)
        how = ("in A/B mode" if all(s.kind == "A/B" for s in shown) else
               f"its {'input' if any(s.kind == 'input' for s in shown) else 'program'} "
               f"check against the baseline {_good(rng)}'s session records")
        which = "the last decisive comparison" + (f" and the first bad {rng.unit}'s"
                                                   if len(shown) > 1 else "")
        parts += ["", f"reproduce {which} ({what}, against {_good(rng)} {rng.good.short}, "
                      f"{how}):"]
        parts += [f"  {line}" for line in result.reproduce]
    if result.advice:
        parts += ["", "next:"]
        parts += [f"  {line}" for line in result.advice]
    return "\n".join(parts) + "\n"
