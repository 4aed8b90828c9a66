"""The bisection itself (see :mod:`pytest_accelperf.bisection`): GOOD's session records the
baseline, BAD's says whether the programs differ, then a binary search on the program record
or, where the programs agree, on A/B timing; every step's evidence kept, and the
commands that reproduce the last decisive one and the first bad commit's.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Literal, Protocol, TypedDict

from pytest_accelperf.bisection import BisectError
from pytest_accelperf.bisection.commits import Commit, CommitRange, Worktrees
from pytest_accelperf.bisection.evidence import (
    Call,
    Judgement,
    Targets,
    halfway,
    host_targets,
    judge_host,
    judge_program,
    judge_timing,
    program_targets,
    unjudged_host,
    unsearched_regressions,
)
from pytest_accelperf.bisection.search import Search
from pytest_accelperf.bisection.status import Status as Status  # re-exported
from pytest_accelperf.bisection.trial import Session, require, run_session, session_env
from pytest_accelperf.gate.options import BY_KEY
from pytest_accelperf.records.program import describe_changes

Kind = Literal["record", "program", "A/B", "input"]


@dataclass(frozen=True)
class Settings:
    """What to bisect with: the node ids and pytest arguments, and A/B mode's tolerance
    (of BAD against GOOD; a commit between is judged against BAD's level) and budget."""

    args: tuple[str, ...]
    tolerance: float = 0.01
    budget: float | None = None


class StepJson(TypedDict):
    """:meth:`Step.to_json`: a step of ``accelperf bisect --json``."""

    sha: str
    subject: str
    position: int
    kind: Kind
    call: Call
    evidence: str
    seconds: float
    tolerance: float | None


class FirstBadJson(TypedDict):
    sha: str
    subject: str
    position: int


class _ResultJson(TypedDict):
    status: str
    exit_status: int
    message: str
    basis: str
    good: str
    bad: str
    commits: int
    first_bad: FirstBadJson | None
    suspects: list[str]
    comparisons: int
    sessions: int
    seconds: float
    steps: list[StepJson]
    reproduce: list[str]
    notes: list[str]


class ResultJson(_ResultJson, total=False):
    """:meth:`Result.to_json`: ``accelperf bisect --json``; the last four keys only for a
    range of releases."""

    package: str
    diff: list[str]
    environments: list[str]
    advice: list[str]


@dataclass(frozen=True)
class Step:
    """One commit tested against GOOD (or GOOD's own session, ``reference``)."""

    commit: Commit
    position: int  #: 1 .. len(range) (BAD the last), 0 for GOOD
    kind: Kind
    call: Call
    evidence: str
    seconds: float
    #: The session's command (``argv``, without ``--accelperf-json``).
    command: tuple[str, ...]
    #: The A/B tolerance the verdict was under.
    tolerance: float | None = None

    def to_json(self) -> StepJson:
        return {"sha": self.commit.sha, "subject": self.commit.subject,
                "position": self.position, "kind": self.kind, "call": self.call,
                "evidence": self.evidence, "seconds": round(self.seconds, 3),
                "tolerance": self.tolerance}


@dataclass(frozen=True)
class Result:
    """What a bisection found, and how."""

    range: CommitRange
    status: Status
    message: str
    #: What the search ran on: ``program`` (the record) or ``timing`` (A/B mode).
    basis: str
    steps: tuple[Step, ...]
    first_bad: Commit | None
    #: When not found: the commits the first bad one may be (skipped ones, and the
    #: oldest known bad).
    suspects: tuple[Commit, ...] = ()
    #: Shell lines that reproduce the last decisive comparison (and the first bad
    #: commit's, when that is another).
    reproduce: tuple[str, ...] = ()
    seconds: float = 0.0
    notes: tuple[str, ...] = field(default_factory=tuple)
    #: A range of releases: the first bad release's program against the release before it,
    #: in words (a line per case that differs).
    diff: tuple[str, ...] = ()
    #: A range of releases: each release's environment, and what to do next.
    environments: tuple[str, ...] = ()
    advice: tuple[str, ...] = ()

    @property
    def comparisons(self) -> int:
        """Commits compared with GOOD (skipped ones included; GOOD's own session not)."""
        return sum(1 for s in self.steps if s.call != "reference")

    def to_json(self) -> ResultJson:
        bad = self.first_bad
        out: ResultJson = {
            "status": self.status.name.lower(), "exit_status": int(self.status),
            "message": self.message, "basis": self.basis,
            "good": self.range.good.sha, "bad": self.range.bad.sha,
            "commits": len(self.range.commits),
            "first_bad": {"sha": bad.sha, "subject": bad.subject,
                          "position": self.range.position(bad)} if bad else None,
            "suspects": [c.sha for c in self.suspects],
            "comparisons": self.comparisons, "sessions": len(self.steps),
            "seconds": round(self.seconds, 3), "steps": [s.to_json() for s in self.steps],
            "reproduce": list(self.reproduce), "notes": list(self.notes)}
        if self.range.package:
            out.update({"package": self.range.package, "diff": list(self.diff),
                        "environments": list(self.environments),
                        "advice": list(self.advice)})
        return out


_FIX = ("check that pytest ARGS runs there (accelperf bisect runs the node ids and "
        "pytest arguments after -- in a worktree of each commit)")


class Points(Protocol):
    """Where and how a bisection runs a session at a point of its range: a commit in a
    worktree of its own (:class:`Commits`), or a release in an environment of its own
    (:class:`pytest_accelperf.bisection.releases.Releases`). Entered once around the
    bisection (what it made is removed on leaving)."""

    def __enter__(self) -> Points: ...

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None: ...

    def session(self, point: Commit, extra: Sequence[str], scratch: Path) -> Session:
        """``pytest ARGS EXTRA`` at ``point``, its report read back."""
        ...

    def compare_with_good(self) -> list[str]:
        """The options of a session in A/B mode against GOOD."""
        ...

    def reproduce(self, steps: Sequence[Step], first_bad: Commit | None) -> tuple[str, ...]:
        """Shell lines that repeat the steps :func:`reproduced` picks."""
        ...

    def environments(self) -> tuple[str, ...]:
        """Each point's environment in words, where the points have their own."""
        ...

    def advice(self, result: Result) -> tuple[str, ...]:
        """What to do next, given the result."""
        ...


class Commits:
    """The points of a range of commits: each session in a fresh git worktree of its
    commit, under this interpreter; GOOD's A/B arm in this environment too."""

    def __init__(self, rng: CommitRange, settings: Settings) -> None:
        self.rng, self.settings = rng, settings
        self.trees: Worktrees | None = None

    def __enter__(self) -> Commits:
        self.trees = Worktrees(self.rng.root)
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self.trees is not None:
            self.trees.close()

    def session(self, point: Commit, extra: Sequence[str], scratch: Path) -> Session:
        assert self.trees is not None
        return run_session(self.trees, self.rng, point, self.settings.args, extra, scratch)

    def compare_with_good(self) -> list[str]:
        # GOOD's arm in this environment, as every commit's: the commits are what is
        # bisected, not their dependency files (which would build GOOD an environment)
        return [f"--accelperf-compare={self.rng.good.sha}",
                f"--accelperf-compare-python={sys.executable}"]

    def reproduce(self, steps: Sequence[Step], first_bad: Commit | None) -> tuple[str, ...]:
        return reproduce(self.rng, steps, first_bad)

    def environments(self) -> tuple[str, ...]:
        return ()

    def advice(self, result: Result) -> tuple[str, ...]:
        return ()


_FIX_RELEASES = ("check that pytest ARGS runs here under that release (accelperf bisect "
                 "--package runs the node ids and pytest arguments after -- in the current "
                 "directory, under each release's interpreter)")


def bisect(rng: CommitRange, settings: Settings,
           progress: Callable[[Step], None] = lambda step: None,
           points: Points | None = None) -> Result:
    """Find the first commit (or release) of ``rng`` that made the cases worse than at
    GOOD; ``points``: how a session runs at one (default: :class:`Commits`)."""
    return _Bisection(rng, settings, progress,
                      points if points is not None else Commits(rng, settings)).run()


class _Bisection:
    def __init__(self, rng: CommitRange, settings: Settings,
                 progress: Callable[[Step], None], points: Points) -> None:
        self.rng, self.settings, self.progress = rng, settings, progress
        self.points = points
        self.steps: list[Step] = []
        #: Each session's programs by node id, by the point's ``sha``.
        self.programs: dict[str, dict[str, Mapping[str, object]]] = {}
        self.t0 = time.monotonic()

    def _step(self, session: Session, kind: Kind, judged: Judgement,
              tolerance: float | None = None) -> Step:
        command = tuple(a for a in session.command if not a.startswith("--accelperf-json="))
        self.programs.setdefault(session.commit.sha, {}).update(
            {n: r.run["program"] for n, r in session.cases.items()
             if isinstance(r.run.get("program"), dict)})
        step = Step(session.commit, self.rng.position(session.commit), kind, judged.call,
                    self._ends(judged.evidence), session.seconds, command, tolerance)
        self.steps.append(step)
        self.progress(step)
        return step

    def _result(self, status: Status, message: str, basis: str, *,
                first_bad: Commit | None = None, suspects: Sequence[Commit] = (),
                notes: Sequence[str] = ()) -> Result:
        result = Result(self.rng, status, self._ends(message), basis, tuple(self.steps),
                        first_bad, tuple(suspects),
                        self.points.reproduce(self.steps, first_bad),
                        time.monotonic() - self.t0, tuple(self._ends(n) for n in notes),
                        self._diff(first_bad) if self.rng.package else (),
                        self.points.environments())
        return dataclasses.replace(result, advice=self.points.advice(result))

    def _ends(self, text: str) -> str:
        """The words for the two ends: GOOD and BAD for commits, LOW and HIGH for
        releases."""
        if not self.rng.package:
            return text
        return re.sub(r"\bBAD\b", "HIGH", re.sub(r"\bGOOD\b", "LOW", text))

    def _diff(self, first_bad: Commit | None) -> tuple[str, ...]:
        """The first bad point's programs against the point's before it, a line per case
        that differs."""
        if first_bad is None:
            return ()
        index = self.rng.commits.index(first_bad)
        before = self.rng.commits[index - 1] if index else self.rng.good
        then, now = self.programs.get(before.sha, {}), self.programs.get(first_bad.sha, {})
        many = len(now) > 1
        lines = []
        for nodeid in sorted(set(then) & set(now)):
            changed = describe_changes(then[nodeid], now[nodeid], 0.0)
            name = f"{nodeid.rsplit('::', 1)[-1]}: " if many else ""
            lines.append(name + ("; ".join(changed) if changed else
                                 f"same program as {before.short}"))
        return tuple(lines)

    def run(self) -> Result:
        rng = self.rng
        low, high = ("LOW", "HIGH") if rng.package else ("GOOD", "BAD")
        with self.points as points, tempfile.TemporaryDirectory(
                prefix="accelperf-bisect-runs-") as tmp:
            scratch = Path(tmp)
            store = f"--accelperf-baselines={scratch / 'store'}"

            def session(commit: Commit, *extra: str) -> Session:
                return points.session(commit, extra, scratch)

            fix = _FIX_RELEASES if rng.package else _FIX
            good = require(session(rng.good, "--accelperf-update", store), low, fix)
            unrecorded = [r for r in good.cases.values() if r.block is None]
            if unrecorded:
                raise BisectError(f"{low} {rng.good.short}: {unrecorded[0].nodeid} was not "
                                  f"recorded as a baseline ({unrecorded[0].run.get('outcome')}"
                                  f"); pick a {low} whose cases run")
            good_programs = {n: r.run["program"] for n, r in good.cases.items()
                             if isinstance(r.run.get("program"), dict)}
            self._step(good, "record", Judgement(
                "reference", f"baseline of {len(good.cases)} case(s) recorded"))
            bad = require(session(rng.bad, store), high, fix)
            missing = sorted(set(bad.cases) - set(good.cases))
            notes = [f"{n} is not collected at GOOD: not compared" for n in missing]
            cases = set(bad.cases) & set(good.cases)
            if not cases:
                raise BisectError(f"none of BAD's cases ({', '.join(sorted(bad.cases))}) ran "
                                  f"at GOOD {rng.good.short}: nothing to compare")
            targets, judged = program_targets(bad, good_programs)
            self._step(bad, "program", judged)
            if targets:
                return self._search("program", notes, lambda c: self._program(
                    session(c, store), targets, good_programs))
            tolerance = self.settings.tolerance
            ab = [store, *points.compare_with_good()]
            if self.settings.budget is not None:
                ab.append(f"--accelperf-compare-budget={self.settings.budget:g}")
            bad_ab = require(session(rng.bad, *ab,
                                     f"--accelperf-compare-tolerance={tolerance:g}"),
                             high, fix)
            judged = judge_timing(bad_ab, cases)
            self._step(bad_ab, "A/B", judged, tolerance)
            if judged.call == "bad":
                levels = dict(judged.levels)
                # A/B mode measures until its interval is half as wide as the tolerance:
                # the distance to the nearest halfway ratio, so that it can decide.
                near = min(halfway(level) - 1 for level in levels.values())
                notes.append("a commit between is bad when its interval lies above "
                             + ", ".join(f"{halfway(r):.3f} ({n.rsplit('::', 1)[-1]})"
                                         for n, r in sorted(levels.items()))
                             + ": halfway, in ratio, from GOOD to BAD's level; good when it "
                               "lies below; skipped when it straddles it")
                return self._search("timing", notes, lambda c: self._timing(
                    session(c, *ab, f"--accelperf-compare-tolerance={near:.4g}"), levels,
                    near))
            host = host_targets(bad)
            if host and not judged.faster:
                # The step time is no worse, the making of the batch is: search on its
                # checks in sessions against GOOD's recording, as on the step time.
                notes.append("a commit between is bad when its interval lies above "
                             + ", ".join(f"{halfway(r):.3f} ({m} of "
                                         f"{n.rsplit('::', 1)[-1]})"
                                         for (n, m), r in sorted(host.items()))
                             + ": halfway, in ratio, from GOOD to BAD's level; good when it "
                               "lies below or under the check's floor; skipped when it "
                               "straddles it")
                return self._search("input", notes, lambda c: self._host(
                    session(c, store), host))
            others = unsearched_regressions(bad)
            listed = "; ".join(words for _, words in others)
            apart = (" (the input check times making the batch apart from the step)"
                     if any(metric.startswith("input") for metric, _ in others) else "")
            if judged.faster:
                return self._result(
                    Status.GOOD_ALREADY_BAD,
                    f"GOOD is already worse than BAD: BAD is faster ({judged.evidence}), and "
                    f"its program is no worse; nothing to bisect"
                    + (f". BAD's session against GOOD's recording regressed on {listed}, "
                       f"which accelperf bisect does not search on{apart}" if others else ""),
                    "timing", notes=notes)
            if others:
                # BAD's session against GOOD's recording failed a check the search
                # cannot follow: saying that BAD is no worse would be untrue.
                return self._result(
                    Status.BAD_NOT_BAD,
                    f"BAD's program is no worse than GOOD's and A/B mode did not find its "
                    f"step time worse ({judged.evidence}), but BAD's session against GOOD's "
                    f"recording regressed on {listed}: accelperf bisect searches on the "
                    f"program and A/B mode's step time only, and neither includes "
                    f"{'them' if len(others) > 1 else 'it'}{apart}; it cannot bisect this",
                    "timing", notes=notes)
            why = ("they are the same within the tolerance" if judged.call == "good" else
                   "A/B mode could not tell them apart; raise --budget or --tolerance, or "
                   "run on a quieter machine")
            unjudged = unjudged_host(bad)
            if unjudged:
                why += (f"; BAD's session against GOOD's recording measured a slowdown of "
                        f"{'; '.join(unjudged)}, not judged a regression (what the batch "
                        f"waits for slows down with the machine): run on a quieter machine, "
                        f"or, beside another job, pass a higher --accelperf-max-foreign-load "
                        f"after --")
            return self._result(
                Status.BAD_NOT_BAD,
                f"BAD is not worse than GOOD: its program is no worse, and {why} "
                f"({judged.evidence})",
                "timing", notes=notes)

    def _program(self, session: Session, targets: Targets,
                 good_programs: Mapping[str, Mapping[str, object]]) -> None:
        self._step(session, "program", judge_program(session, targets, good_programs))

    def _host(self, session: Session, levels: dict[tuple[str, str], float]) -> None:
        self._step(session, "input", judge_host(session, levels))

    def _timing(self, session: Session, levels: dict[str, float], tolerance: float) -> None:
        self._step(session, "A/B", judge_timing(session, levels), tolerance)

    def _search(self, basis: str, notes: list[str],
                test: Callable[[Commit], None]) -> Result:
        commits = self.rng.commits
        search = Search(len(commits))
        while (index := search.next()) is not None:
            test(commits[index])
            call = self.steps[-1].call
            search.mark(index, call if call in ("good", "bad") else "skip")
        suspects = [commits[i] for i in search.suspects()]
        if len(suspects) == 1:
            first = suspects[0]
            return self._result(Status.FOUND, first_bad_words(self.rng, first), basis,
                                first_bad=first, notes=notes)
        listed = ", ".join(f"{c.short} ({c.subject})" for c in suspects)
        unit = self.rng.unit
        return self._result(Status.NOT_FOUND, f"only skipped {unit}s are left: the first bad "
                            f"{unit} is one of {listed}; "
                            f"{narrowed(self.rng, self.settings, suspects, basis)}",
                            basis, suspects=suspects, notes=notes)


def first_bad_words(rng: CommitRange, first: Commit) -> str:
    """``first bad commit: SHA SUBJECT``, or for releases ``first bad release: jax 0.9.1
    (after 0.9.0)``."""
    if not rng.package:
        return f"first bad commit: {first.sha} {first.subject}"
    index = rng.commits.index(first)
    before = rng.commits[index - 1] if index else rng.good
    return f"first bad release: {rng.package} {first.sha} (after {before.sha})"


def narrowed(rng: CommitRange, settings: Settings, suspects: Sequence[Commit],
             basis: str) -> str:
    """The command that bisects only the commits left (``suspects``, the known bad one
    last), in words: from the last good one to it, with twice the A/B budget where the
    search was on timing (those commits were skipped because their intervals could not
    say)."""
    first = rng.commits.index(suspects[0])
    good = rng.commits[first - 1] if first else rng.good
    budget = (settings.budget if settings.budget is not None
              else float(BY_KEY["compare_budget"].default_number))
    argv = ["accelperf", "bisect", "--tolerance", f"{settings.tolerance:g}"]
    if basis == "timing":
        argv += ["--budget", f"{2 * budget:g}"]
    elif settings.budget is not None:
        argv += ["--budget", f"{budget:g}"]
    if rng.package:
        argv += ["--package", rng.package, good.sha, suspects[-1].sha]
    else:
        argv += [good.sha[:10], suspects[-1].sha[:10]]
    argv += ["--", *settings.args]
    why = ("on a quieter machine or with more time to measure" if basis == "timing"
           else "once what made them untestable is fixed")
    return f"to decide between them, bisect only them {why}: {shlex.join(argv)}"


def _python() -> str:
    """``python`` where that is this interpreter on the PATH, else its full path."""
    found = shutil.which("python")
    if found and os.path.realpath(found) == os.path.realpath(sys.executable):
        return "python"
    return sys.executable


def reproduced(steps: Sequence[Step], first_bad: Commit | None) -> list[Step]:
    """The steps :func:`reproduce` repeats: the last decisive one (a commit called good or
    bad), and the first bad commit's own when that is another (the one that shows the
    regression)."""
    decisive = [s for s in steps if s.call in ("good", "bad")]
    if not decisive:
        return []
    shown = [decisive[-1]]
    culprit = next((s for s in reversed(decisive) if s.commit == first_bad and s.call == "bad"),
                   None)
    if culprit is not None and culprit is not shown[0]:
        shown.append(culprit)
    return shown


def reproduce(rng: CommitRange, steps: Sequence[Step],
              first_bad: Commit | None = None) -> tuple[str, ...]:
    """Shell lines that reproduce the steps :func:`reproduced` picks: a worktree of each
    commit and the same pytest session (for the program, GOOD's recording first), the
    worktrees removed after."""
    shown = reproduced(steps, first_bad)
    if not shown:
        return ()
    tmp = Path(tempfile.gettempdir())
    store = tmp / "accelperf-bisect-store"
    if any(s.kind != "A/B" for s in shown):
        shown = [steps[0], *shown]  # GOOD's session, recording the baseline
    trees = {s.commit.sha: tmp / f"accelperf-bisect-{s.commit.short}" for s in shown}

    def line(step: Step) -> str:
        tree = trees[step.commit.sha]
        env = session_env(rng.root, tree, os.environ).get("PYTHONPATH")
        prefix = (f"PYTHONPATH={shlex.quote(env)} "
                  if env is not None and env != os.environ.get("PYTHONPATH") else "")
        argv = [_python() if a == sys.executable else a for a in step.command]
        argv = [f"--accelperf-baselines={store}" if a.startswith("--accelperf-baselines=")
                else a for a in argv]
        if step.kind == "A/B":
            argv = [a for a in argv if not a.startswith("--accelperf-baselines=")]
        where = tree / rng.subdir
        return f"(cd {shlex.quote(str(where))} && {prefix}{shlex.join(argv)})"

    root = shlex.quote(str(rng.root))
    lines = [f"git -C {root} worktree add --detach {shlex.quote(str(tree))} {sha}"
             for sha, tree in trees.items()]
    lines += [line(s) for s in shown]
    lines += [f"git -C {root} worktree remove --force {shlex.quote(str(tree))}"
              for tree in trees.values()]
    if any(s.kind != "A/B" for s in shown):
        lines.append(f"rm -rf {shlex.quote(str(store))}")
    return tuple(lines)
