"""Change points over the run history: where a case's numbers stepped, between which
commits, and how sure.

The history (``--accelperf-history``, :mod:`pytest_accelperf.report.history`) holds one
line per case per session. Each case's sessions, in time order, are split by machine
(:func:`pytest_accelperf.provision.describe.machine`; by environment fingerprint in lines written
before the history kept the machine): sessions of one machine form a series, and the first
session on a new machine is itself a change point (``environment``), where the program
fields are also compared across the two environments. Within a series, a change of the
case's stack (an upgrade: :func:`pytest_accelperf.provision.describe.case_stack`) is a change
point of its own (``stack``), named by its versions (``jax 0.8.3 → 0.10.2``); the measured
metrics are searched within each stack's sessions and measured across each change of it
(the throughput and the step time, by the same test as below, listed whether it resolves
a change or not: ``significant``), and the deterministic ones are compared as anywhere in
the series (``new_stack`` where they changed across it). In each series:

- the **program fields** (FLOPs, bytes accessed, each kind of collective's count and bytes,
  host callbacks and syncs, custom calls, graphs, graph breaks, recompiles: the fields the
  ``program`` check gates, :mod:`pytest_accelperf.records.program`), and **peak memory** and the
  **final loss** where they repeat exactly from session to session (a compiler's memory
  analysis; a seeded run on one kind of device), are deterministic: any change of value
  is a change point, exact;
- **throughput** (samples/s; step time where a case has no samples per step), and memory
  and loss where they do not repeat, are measured with noise: change points are searched
  by `ruptures <https://centre-borelli.github.io/ruptures-docs/>`_ (kernel change-point
  detection, ``KernelCPD`` with the linear kernel, a mean shift of the log for
  throughput, penalised by the series' own noise), each segment at least
  ``min_sessions`` long, so a change counts only after it held that many sessions. Each
  candidate is then tested against its neighbouring segment with the Mann-Whitney U test
  (``scipy.stats.mannwhitneyu``, rank-based: one wild session cannot make a change);
  candidates above ``max_pvalue`` are dropped, the weakest first, their neighbours
  re-tested over the merged segments (the merge step of Otava's E-divisive, Fleming et
  al., ICPE 2023).

The p-value is the test's on the split the search chose, not corrected for the search;
``benchmarks/changes.py`` measures the false change points it gives on this machine's
recorded noise.
"""

from __future__ import annotations

import itertools
import math
import operator
import re
import statistics
import subprocess
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from numpy.typing import ArrayLike

from pytest_accelperf.errors import UserError
from pytest_accelperf.provision.describe import stack_changes
from pytest_accelperf.records.jsonvalue import JSONValue
from pytest_accelperf.records.program import AMOUNTS, COUNTS
from pytest_accelperf.report.detection import MAX_PVALUE as MAX_PVALUE  # re-exported
from pytest_accelperf.report.detection import Detection as Detection  # re-exported
from pytest_accelperf.report.points import Point, load_points
from pytest_accelperf.report.terminal import fmt_value
from pytest_accelperf.store.schema import ProgramRecord

#: A series is deterministic when at least this share of its consecutive sessions have
#: exactly the same value.
REPEATS = 0.5

ENVIRONMENT = "environment"
STACK = "stack"


class ChangesError(UserError):
    """What ``accelperf history changes`` cannot do; the message names the fix."""


@dataclass(frozen=True)
class Session:
    """One session of a case: what it ran on."""

    session: str
    time: str
    commit: str | None
    dirty: bool | None
    fingerprint: str | None
    order: int  #: its place among all the sessions of the history, oldest first
    machine: str | None = None  #: hash of the machine (None: a line written before it was)
    stack: str | None = None  #: hash of the case's stack (likewise)

    @property
    def revision(self) -> str:
        """The short commit, ``*`` when tracked files had changes; ``?`` when unknown."""
        if not self.commit:
            return "?"
        return self.commit[:9] + ("*" if self.dirty else "")


@dataclass(frozen=True)
class ChangePoint:
    """One change point of one case's series: the level before and after, the last session
    before it and the first after it, and how sure (``p_value`` None: exact)."""

    platform: str
    nodeid: str
    metric: str
    unit: str
    before: float | None
    after: float | None
    p_value: float | None
    last_before: Session
    first_after: Session
    sessions_before: int  #: sessions of the series at the level before (since the last change)
    sessions_after: int  #: sessions at the new level (to the next change, or the end)
    #: The first session after is the first of a new environment fingerprint: the level
    #: before is that of the previous environment.
    new_environment: bool = False
    #: The first session after is the first of another stack on the same machine: the
    #: change lies across an upgrade (or a downgrade), named by ``stack``.
    new_stack: bool = False
    #: How the stack changed across it (``jax 0.8.3 → 0.10.2``,
    #: :func:`pytest_accelperf.provision.describe.stack_changes`); empty where it did not.
    stack: tuple[str, ...] = ()
    #: A level measured across a stack change whose test gave p above ``max_pvalue``: the
    #: measurement, not a change (listed all the same: an upgrade that changed nothing).
    significant: bool = True

    @property
    def exact(self) -> bool:
        return self.p_value is None

    @property
    def change(self) -> float | None:
        """``after / before - 1``; None where either is unknown or before is 0."""
        if self.before is None or self.after is None or self.before == 0:
            return None
        return self.after / self.before - 1

    @property
    def commits(self) -> str:
        """``last..first``: the commit range the change lies in."""
        return f"{self.last_before.revision}..{self.first_after.revision}"

    @property
    def sure(self) -> str:
        if self.metric == ENVIRONMENT:
            return "exact (new fingerprint)"
        if self.metric == STACK:
            return "exact (new stack)"
        if self.p_value is None:
            return "exact" + (" (new environment)" if self.new_environment
                              else " (new stack)" if self.new_stack else "")
        sessions = f"{self.sessions_before} → {self.sessions_after} sessions"
        if self.new_stack:
            sessions += ", new stack"
        none = "" if self.significant else ", no change"
        return f"p={self.p_value:.1g}{none} ({sessions})"

    def levels(self) -> str:
        """``before → after`` in the metric's unit; the versions that changed for the
        ``stack`` change point."""
        if self.metric == ENVIRONMENT:
            return (f"{(self.last_before.fingerprint or '?')[:8]} → "
                    f"{(self.first_after.fingerprint or '?')[:8]}")
        if self.metric == STACK:
            return ", ".join(self.stack) or (f"{(self.last_before.stack or '?')[:8]} → "
                                             f"{(self.first_after.stack or '?')[:8]}")
        return f"{fmt_value(self.before, self.unit)} → {fmt_value(self.after, self.unit)}"

    def to_json(self) -> dict[str, JSONValue]:
        """A change point of ``accelperf history changes --json``: its fields (a session's
        ``order``, its place in this history alone, left out) and what they give,
        ``change`` and ``exact``."""
        data = asdict(self)
        for side in ("last_before", "first_after"):
            del data[side]["order"]
        data["stack"] = list(self.stack)
        return {**data, "change": self.change, "exact": self.exact}


# -- one series --------------------------------------------------------------------------------
def noise_scale(values: ArrayLike) -> float:
    """A robust standard deviation of the noise of ``values``: the median absolute
    deviation of consecutive differences, scaled to a normal's sigma (a step moves one
    difference, not the median)."""
    import numpy as np

    diffs = np.diff(np.asarray(values, dtype=float))
    if diffs.size == 0:
        return 0.0
    mad = float(np.median(np.abs(diffs - np.median(diffs))))
    return 1.4826 * mad / math.sqrt(2)


def candidates(values: Sequence[float], detection: Detection) -> list[int]:
    """Where ``ruptures`` (``KernelCPD``, linear kernel: a shift of the mean) splits
    ``values``, each segment at least ``min_sessions`` long: the index of the first
    value of each new segment."""
    import numpy as np
    import ruptures

    n = len(values)
    if n < 2 * detection.min_sessions:
        return []
    signal = np.asarray(values, dtype=float)
    sigma = noise_scale(signal)
    spread = float(np.ptp(signal))
    if spread == 0:
        return []
    # a series without noise between its steps (sigma 0): any step is a candidate
    variance = sigma**2 if sigma > 0 else (spread * 1e-6) ** 2
    algo = ruptures.KernelCPD(kernel="linear", min_size=detection.min_sessions)
    bkps = algo.fit(signal).predict(pen=detection.penalty * variance * math.log(n))
    return [int(b) for b in bkps[:-1]]


def _pvalue(left: Sequence[float], right: Sequence[float]) -> float:
    """The two-sided Mann-Whitney U test of two segments (1 where every value is equal)."""
    from scipy.stats import mannwhitneyu

    if len(set(left) | set(right)) == 1:
        return 1.0
    return float(mannwhitneyu(left, right, alternative="two-sided").pvalue)


def significant(values: Sequence[float], splits: Sequence[int], detection: Detection
                ) -> list[tuple[int, float]]:
    """``[(split, p-value)]`` of the ``splits`` that hold: each tested (Mann-Whitney U)
    against the segments on either side of it; while one is above ``max_pvalue``, the
    weakest is dropped and its neighbours tested again over the merged segments."""
    kept = sorted(splits)
    x = list(values)

    def test(i: int) -> float:
        lo = kept[i - 1] if i > 0 else 0
        hi = kept[i + 1] if i + 1 < len(kept) else len(x)
        return _pvalue(x[lo:kept[i]], x[kept[i]:hi])

    pvalues = [test(i) for i in range(len(kept))]
    while kept:
        worst = max(range(len(kept)), key=lambda i: pvalues[i])
        if pvalues[worst] <= detection.max_pvalue:
            break
        del kept[worst], pvalues[worst]
        for i in (worst - 1, worst):
            if 0 <= i < len(kept):
                pvalues[i] = test(i)
    return list(zip(kept, pvalues, strict=True))


def noisy_changes(values: Sequence[float], detection: Detection, *, log: bool = False
                  ) -> list[tuple[int, float]]:
    """``[(index, p-value)]`` of the change points of a series measured with noise:
    ``index`` is the first value at the new level. ``log``: search the log of the
    values (a slowdown is a ratio); the test, on ranks, is the same either way."""
    if len(values) < 2 * detection.min_sessions:
        return []
    signal = list(map(math.log, values)) if log else list(values)
    return significant(values, candidates(signal, detection), detection)


def exact_changes(values: Sequence[float | None]) -> list[int]:
    """Indices where a deterministic value differs from the last known one before it
    (None: not recorded in that session; it is skipped)."""
    out: list[int] = []
    last: float | None = None
    for i, v in enumerate(values):
        if v is None:
            continue
        if last is not None and v != last:
            out.append(i)
        last = v
    return out


def repeats(values: Sequence[float]) -> bool:
    """Whether a series repeats itself exactly from session to session (at least
    :data:`REPEATS` of its consecutive pairs are equal): a deterministic one."""
    if len(values) < 2:
        return True
    same: int = sum(map(operator.eq, values, itertools.islice(values, 1, None)))
    return same >= REPEATS * (len(values) - 1)


# -- the program fields of the points --------------------------------------------------------
def program_values(program: ProgramRecord | None) -> dict[tuple[str, str], float]:
    """``{(metric, unit): value}`` of the gated fields of a program record."""
    if program is None:
        return {}
    record: Mapping[str, Any] = program  # read by the names of AMOUNTS and COUNTS
    out: dict[tuple[str, str], float] = {}
    for name, (label, unit) in AMOUNTS.items():
        value = record.get(name)
        if value is not None:
            out[(label, unit)] = float(value)
    for kind, c in sorted((program.get("collectives") or {}).items()):
        out[(f"{kind} count", "")] = float(c["count"])
        out[(f"{kind} bytes", "bytes")] = float(c["bytes"])
    for name, label in COUNTS.items():
        value = record.get(name)
        if value is not None:
            out[(label, "")] = float(value)
    return out


def _program_tables(points: Sequence[Point]) -> list[dict[tuple[str, str], float]]:
    """:func:`program_values` of each point's program; a kind of collective that another
    point's record lists counts as 0 in a record that counted collectives but not that
    kind (as the ``program`` check compares them: an all-gather added)."""
    kinds = sorted({k for p in points if p.program for k in p.program.get("collectives") or ()})
    out: list[dict[tuple[str, str], float]] = []
    for p in points:
        table = program_values(p.program)
        if p.program is not None and p.program.get("collectives") is not None:
            for kind in kinds:
                table.setdefault((f"{kind} count", ""), 0.0)
                table.setdefault((f"{kind} bytes", "bytes"), 0.0)
        out.append(table)
    return out


# -- a whole history ---------------------------------------------------------------------------
#: Measured fields: (metric, field of :class:`Point`, unit).
THROUGHPUT = ("throughput", "throughput", "samples/s")
STEP_TIME = ("step time", "step_time", "s")
MEASURED = (("peak memory", "memory", "bytes"), ("final loss", "loss", ""))


Orders = Mapping[str, int]  # {session: its order among the history's sessions}


def _session(p: Point, orders: Orders) -> Session:
    return Session(p.session, p.time, p.commit, p.dirty, p.fingerprint, orders[p.session],
                   p.machine, p.stack)


def _median(xs: Sequence[float]) -> float:
    return float(statistics.median(xs))


def _stack_words(last: Point, first: Point) -> tuple[str, ...]:
    """How the stack changed from ``last`` to ``first`` (empty where it did not)."""
    if last.stack == first.stack:
        return ()
    return tuple(stack_changes(first.versions or {}, last.versions or {}))


def _cuts(points: Sequence[Point]) -> list[int]:
    """Where the stack changes in a machine's sessions of a case: the index of the first
    session of each new stack."""
    stacks = [p.stack for p in points]
    if not any(map(operator.ne, stacks, itertools.islice(stacks, 1, None))):
        return []
    return [k for k in range(1, len(stacks)) if stacks[k] != stacks[k - 1]]


def _series_changes(platform: str, nodeid: str, metric: str, unit: str,
                    points: Sequence[Point], values: Sequence[float], orders: Orders,
                    detection: Detection, *, log: bool, exact: bool,
                    stacks: bool = False, step_time: bool = False
                    ) -> Iterator[ChangePoint]:
    """The change points of one metric over one machine's sessions of a case.

    A measured metric is searched within each stack's sessions, and measured across each
    change of the stack, by the same test as a change the search proposed: the median
    since the change before it (or the stack's first session) against the median to the
    change after it, the Mann-Whitney U test's p-value, whether significant or not.
    ``stacks``: the stack changes in these sessions (else they are not looked for).
    ``step_time``: the step time is measured across each change of the stack too, over
    the same sessions (beside the throughput)."""
    cuts = _cuts(points) if stacks else []
    found: list[tuple[int, float | None]]
    if exact:
        found = [(i, None) for i in exact_changes(values)]
    elif cuts:
        found = []
        for lo, hi in itertools.pairwise([0, *cuts, len(values)]):
            found += [(lo + i, p) for i, p in noisy_changes(values[lo:hi], detection, log=log)]
    else:
        found = list(noisy_changes(values, detection, log=log))
    at = [i for i, _ in found]
    bounds = [0, *(at if exact else sorted({*at, *cuts})), len(values)]
    for i, p in found:
        k = bounds.index(i)
        lo, hi = bounds[k - 1], bounds[k + 1]
        before = values[i - 1] if exact else _median(values[lo:i])
        after = values[i] if exact else _median(values[i:hi])
        words = _stack_words(points[i - 1], points[i])
        yield ChangePoint(platform, nodeid, metric, unit, before, after, p,
                          _session(points[i - 1], orders), _session(points[i], orders),
                          i - lo, hi - i, new_stack=points[i - 1].stack != points[i].stack,
                          stack=words)
    if exact:
        return
    for c in cuts:
        k = bounds.index(c)
        lo, hi = bounds[k - 1], bounds[k + 1]
        s0, s1 = _session(points[c - 1], orders), _session(points[c], orders)
        words = _stack_words(points[c - 1], points[c])
        measured: list[tuple[str, str, Sequence[float], Sequence[float]]] = [
            (metric, unit, values[lo:c], values[c:hi])]
        if step_time:
            measured.append((STEP_TIME[0], STEP_TIME[2],
                             [q.step_time for q in points[lo:c] if q.step_time],
                             [q.step_time for q in points[c:hi] if q.step_time]))
        for name, unit_, a, b in measured:
            if not a or not b:
                continue
            p = _pvalue(a, b)
            yield ChangePoint(platform, nodeid, name, unit_, _median(a), _median(b),
                              p, s0, s1, len(a), len(b), new_stack=True, stack=words,
                              significant=p <= detection.max_pvalue)


def _series_key(p: Point) -> str | tuple[str | None]:
    """What splits a case's sessions into series: the machine; the environment's
    fingerprint in lines written before the machine was told from the stack."""
    return p.machine if p.machine is not None else (p.fingerprint,)


def _case_changes(platform: str, nodeid: str, seq: Sequence[Point], orders: Orders,
                  detection: Detection) -> Iterator[ChangePoint]:
    """The change points of one case (its sessions oldest first)."""
    by_machine: dict[str | tuple[str | None], list[Point]] = {}
    for k, p in enumerate(seq):
        key = _series_key(p)
        if key not in by_machine and k:
            yield from _new_environment(platform, nodeid, seq[k - 1], p, orders)
        by_machine.setdefault(key, []).append(p)
    for series in by_machine.values():
        yield from _machine_changes(platform, nodeid, series, orders, detection)


_COLUMN = {name: i for i, name in enumerate(Point._fields)}


def _machine_changes(platform: str, nodeid: str, series: Sequence[Point], orders: Orders,
                     detection: Detection) -> Iterator[ChangePoint]:
    """The change points of one machine's sessions of a case (one fingerprint's, in lines
    written before the machine was told from the stack): each change of the stack, and
    each metric's changes."""
    cuts = _cuts(series)
    bounds = [0, *cuts, len(series)]
    for k, c in enumerate(cuts, start=1):
        last, first = series[c - 1], series[c]
        yield ChangePoint(platform, nodeid, STACK, "", None, None, None,
                          _session(last, orders), _session(first, orders),
                          c - bounds[k - 1], bounds[k + 1] - c, new_stack=True,
                          stack=_stack_words(last, first))
    columns = list(zip(*series, strict=True))  # one pass in C: a column per field
    timing = THROUGHPUT if any(columns[_COLUMN["throughput"]]) else STEP_TIME
    step_time = timing is THROUGHPUT and bool(cuts)
    for (metric, field, unit), noisy in ((timing, True), *((m, False) for m in MEASURED)):
        column = columns[_COLUMN[field]]
        points: Sequence[Point]
        values: Sequence[float]
        if None in column or (noisy and 0 in column):
            keep = [i for i, v in enumerate(column) if v is not None and (v > 0 or not noisy)]
            points, values = [series[i] for i in keep], [float(column[i]) for i in keep]
        else:
            points, values = series, column
        yield from _series_changes(platform, nodeid, metric, unit, points, values, orders,
                                   detection, log=noisy, exact=not noisy and repeats(values),
                                   stacks=bool(cuts), step_time=noisy and step_time)
    if _records_differ([r for r in columns[_COLUMN["program"]] if r is not None]):
        yield from _program_changes(platform, nodeid, series, orders)


def _records_differ(records: Sequence[ProgramRecord]) -> bool:
    """Whether any of a series' program records differs from the one before it (compared
    whole as dicts, in C: equal but where the program changed). Records read from the
    cache of the points are one object where equal, and compared by identity first."""
    return (any(map(operator.is_not, records, itertools.islice(records, 1, None)))
            and any(map(operator.ne, records, itertools.islice(records, 1, None))))


def _program_changes(platform: str, nodeid: str, series: Sequence[Point], orders: Orders
                     ) -> Iterator[ChangePoint]:
    """Exact changes of the program fields of one machine's sessions of a case (those
    across a change of the stack say so, and name it)."""
    records = [p for p in series if p.program is not None]
    values = _program_tables(records)
    for name in sorted({k for v in values for k in v}):
        column = [v.get(name) for v in values]
        at = exact_changes(column)
        known = [i for i, v in enumerate(column) if v is not None]
        bounds = [known[0] if known else 0, *at, len(column)]
        for k, i in enumerate(at):
            j = max(j for j in known if j < i)  # the last session that recorded it before
            words = _stack_words(records[j], records[i])
            yield ChangePoint(platform, nodeid, name[0], name[1], column[j], column[i], None,
                              _session(records[j], orders), _session(records[i], orders),
                              i - bounds[k], bounds[k + 2] - i,
                              new_stack=records[j].stack != records[i].stack, stack=words)


def _new_environment(platform: str, nodeid: str, last: Point, first: Point, orders: Orders
                     ) -> Iterator[ChangePoint]:
    """A case's first session on a machine it never ran on (in lines written before the
    machine was told from the stack: with a fingerprint it never had): the change point
    ``environment``, and each program field that differs across it."""
    s0, s1 = _session(last, orders), _session(first, orders)
    yield ChangePoint(platform, nodeid, ENVIRONMENT, "", None, None, None, s0, s1, 0, 0,
                      new_environment=True)
    before, after = _program_tables([last, first])
    for name in sorted(set(before) & set(after)):
        if before[name] != after[name]:
            yield ChangePoint(platform, nodeid, name[0], name[1], before[name], after[name],
                              None, s0, s1, 0, 0, new_environment=True)


def find_changes(points: Iterable[Point], detection: Detection | None = None
                 ) -> list[ChangePoint]:
    """Every change point of every case of ``points`` (a history, oldest first, as
    :func:`load_points` returns it), ordered by the session it appeared in, then case
    and metric."""
    detection = detection or Detection()
    orders: dict[str, int] = {}
    cases: dict[tuple[str, str], list[Point]] = {}
    for p in points:
        if p.session not in orders:
            orders[p.session] = len(orders)
        key = (p.platform, p.nodeid)
        if key in cases:
            cases[key].append(p)
        else:
            cases[key] = [p]
    out: list[ChangePoint] = []
    for (platform, nodeid), seq in cases.items():
        out.extend(_case_changes(platform, nodeid, seq, orders, detection))
    out.sort(key=lambda c: (c.first_after.order, c.platform, c.nodeid, metric_order(c)))
    return out


def metric_order(change: ChangePoint) -> tuple[bool, str]:
    """The order of a session's change points of one case: a new environment or stack
    first (what the rows after it changed across), then by metric."""
    return change.metric not in (ENVIRONMENT, STACK), change.metric


# -- a history directory -----------------------------------------------------------------------
#: ``(time, session, commit)`` of a session.
SessionKey = tuple[str, str, str | None]


@dataclass(frozen=True)
class Analysis:
    """The change points of a history directory, and what they were found over."""

    changes: list[ChangePoint]
    sessions: list[SessionKey]  #: every session, oldest first
    cases: int


def analyse(directory: Path, platform: str | None = None,
            detection: Detection | None = None) -> Analysis:
    """The change points of the history under ``directory`` (of one platform, if given),
    as :func:`find_changes` finds them over :func:`load_points`; each line validated."""
    points = load_points(directory, platform)
    sessions: dict[str, tuple[str, str | None]] = {}
    for p in points:
        sessions.setdefault(p.session, (p.time, p.commit))
    keys = [(time, session, commit) for session, (time, commit) in sessions.items()]
    return Analysis(find_changes(points, detection), keys,
                    len({(p.platform, p.nodeid) for p in points}))


# -- since -------------------------------------------------------------------------------------
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}([T ].*)?$")


def since_order(sessions: Sequence[SessionKey], ref: str, cwd: Path) -> int:
    """The order of the last session before the change points ``--since REF`` lists, in
    ``sessions`` (oldest first): the first session that ran commit ``REF`` (a commit or
    its prefix, or anything ``git rev-parse`` resolves in ``cwd``), or the last one before
    the date ``REF`` (``2026-11-20``, ``2026-11-20T14:00``)."""
    if _DATE.match(ref):
        return sum(time < ref for time, _, _ in sessions) - 1
    full = _rev_parse(ref, cwd)
    prefixes = [p.lower() for p in (full, ref) if p]
    for i, (_, _, commit) in enumerate(sessions):
        if commit and any(commit.lower().startswith(p) for p in prefixes):
            return i
    shown = f"{ref} ({full[:12]})" if full and full != ref else ref
    raise ChangesError(f"--since {shown}: no session of the history ran that commit; pass a "
                       f"commit that a session ran (git log), or a date such as 2026-11-20")


def _rev_parse(ref: str, cwd: Path) -> str | None:
    try:
        done = subprocess.run(["git", "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"],
                              cwd=cwd, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return (done.stdout.strip() or None) if done.returncode == 0 else None


def worse(change: ChangePoint) -> bool | None:
    """Whether a change point is for the worse: less throughput, more step time, and more
    of anything else (memory, loss, FLOPs, bytes, collectives, syncs, recompiles); None
    for a new environment or stack, a level measured across a stack that did not change,
    or an unknown level."""
    before, after = change.before, change.after
    if (change.metric in (ENVIRONMENT, STACK) or not change.significant or before is None
            or after is None or before == after):
        return None
    return after < before if change.metric == THROUGHPUT[0] else after > before
