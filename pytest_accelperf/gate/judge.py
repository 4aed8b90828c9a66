"""Judging a case's timing: the step between evaluating a run and recording it.

A case flows one way (:mod:`pytest_accelperf.gate.runner`): measured, evaluated (every check
against the stored baseline, giving an :class:`Evaluated`), judged, recorded once, gated.
Judging decides what the throughput check finally says (or, when recording, which
measurement is stored), by one of four strategies; each
takes the evaluated result and returns a new one, never changing what it was given:

:class:`StoredBaseline`
    the stored-baseline verdict stands (``--accelperf-update``, ``--accelperf-confirm=0``,
    a run checked or ingested rather than trained);
:class:`Confirmation`
    an apparent regression of throughput or of the making of the batch (``input``,
    ``input_wait``) is re-measured (``--accelperf-confirm`` times) and stands only if
    confirmed;
:class:`Recording`
    ``--accelperf-update`` and ``--accelperf-add-session``: a recording too noisy to be a
    baseline is re-measured (the same loop, :func:`remeasure_until`, each re-measurement
    over more steps), and one that stays noisy is recorded marked so;
:class:`ABComparison`
    A/B mode (``--accelperf-compare``): the throughput check becomes the paired comparison
    with the base revision (:mod:`pytest_accelperf.ab`).

A re-measurement trains the case again in this process; :func:`retimed` makes one
measurement of the first training and the timings of the trainings after it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal, Protocol, TypedDict

from pytest_accelperf.ab.rounds import ABMeasurement, Comparison
from pytest_accelperf.ab.verdict import (
    RECORD_METRICS,
    ab_check,
    ab_program_check,
    ab_record_checks,
    new_in_head,
    not_compared,
    record_not_compared,
)
from pytest_accelperf.backends.protocol import TrainResult
from pytest_accelperf.backends.spec import BackendSpec
from pytest_accelperf.checks.throughput import spread
from pytest_accelperf.records.run import InputSeries, Run
from pytest_accelperf.records.verdict import CheckResult, Tolerances, Verdict
from pytest_accelperf.stats.contention import Load, wait_for_quiet
from pytest_accelperf.store.block import Block
from pytest_accelperf.store.machines import MachineView

METRIC = "throughput"


@dataclass(frozen=True)
class Evaluated:
    """A run with its checks, before it is judged, recorded and gated. ``diffs``: how
    the machine differs from the baseline's (throughput then is ``incomparable``);
    ``stack``: how the stack does (an upgrade: judged, and named by every verdict)."""

    run: Run
    block: Block
    baseline: Block | None
    checks: tuple[CheckResult, ...]
    diffs: tuple[str, ...] = ()
    state: Any = None  # the backend's final state of the training, when it returns one
    stack: tuple[str, ...] = ()
    #: What :class:`Recording` did before this run was recorded ("" when nothing).
    recording_note: str = ""
    #: The stored block as this machine reads it (its timing, the shared sections' and
    #: its timing's environments), None: nothing stored.
    stored: MachineView | None = None
    #: The machine whose timing this run is (``--accelperf-machine``, or the host's
    #: default name; an ingested log's: the machine its environment names).
    machine: str = ""

    @property
    def throughput(self) -> CheckResult | None:
        return next((c for c in self.checks if c.metric == METRIC), None)

    def with_check(self, check: CheckResult) -> Evaluated:
        """This result with the check of ``check``'s metric replaced by it, in its place
        (added at the end when it had none)."""
        if not any(c.metric == check.metric for c in self.checks):
            return replace(self, checks=(*self.checks, check))
        return replace(self, checks=tuple(check if c.metric == check.metric else c
                                          for c in self.checks))

    def with_throughput(self, check: CheckResult | None, *, first: bool = False) -> Evaluated:
        """This result with its throughput check replaced by ``check`` (dropped when
        None), in its place; with ``first``, every throughput check is dropped and
        ``check`` goes before the others (where A/B mode shows its verdict)."""
        if first:
            others = tuple(c for c in self.checks if c.metric != METRIC)
            return replace(self, checks=(check, *others) if check is not None else others)
        current = self.throughput
        return replace(self, checks=tuple(
            c for c in ((check if c is current else c) for c in self.checks) if c is not None))


class Judge(Protocol):
    """One way to judge throughput: the evaluated result in, a new one out."""

    def __call__(self, evaluated: Evaluated, /) -> Evaluated: ...


class StoredBaseline:
    """The stored-baseline verdict stands, as :func:`~pytest_accelperf.checks.run_checks`
    gave it."""

    def __call__(self, evaluated: Evaluated) -> Evaluated:
        return evaluated


def _back_off(max_foreign_load: float) -> str:
    """Wait for a machine where other processes use at most ``max_foreign_load`` cores
    (:func:`~pytest_accelperf.stats.contention.wait_for_quiet`); what was waited, in words, or
    ``""`` when the machine was quiet at once."""
    waited, load = wait_for_quiet(max_foreign_load)
    if load is not None and waited >= 1.5:
        return (f"waited {waited:.0f} s for a quieter machine before re-measuring (then "
                f"other processes used {load.foreign_cores:.2f} cores)")
    return ""


def remeasure_until(first: Evaluated, remeasure: Callable[[], Evaluated], times: int,
                    max_foreign_load: float, settled: Callable[[Evaluated], bool]
                    ) -> tuple[list[Evaluated], list[str]]:
    """The one re-measurement loop of the judges: ``remeasure()`` up to ``times`` times,
    each after backing off for a quieter machine (:func:`_back_off`), until a measurement
    is ``settled``. Every measurement, ``first`` first, and the back-off notes."""
    seen = [first]
    backoff: list[str] = []
    for _ in range(times):
        note = _back_off(max_foreign_load)
        if note:
            backoff.append(note)
        seen.append(remeasure())
        if settled(seen[-1]):
            break
    return seen, backoff


#: The timing checks whose regression is measured again before it fails anything: the
#: step, and the making of its batch (its CPU time, and the time it waited).
CONFIRMED = ("throughput", "input", "input_wait")
#: How each names its ratios in the note of a re-measurement.
_RATIO_NAMES = {"throughput": "step-time ratio(s)", "input": "input CPU ratio(s)",
                "input_wait": "input wait ratio(s)"}


def _check(evaluated: Evaluated, metric: str) -> CheckResult | None:
    return next((c for c in evaluated.checks if c.metric == metric), None)


def _suspect_check(check: CheckResult | None) -> bool:
    """A regression, or a slowdown left ``inconclusive`` because its measurement was
    contaminated (another job's load, dispersed step times, a batch's memory served
    differently): worth measuring again."""
    if check is None:
        return False
    if check.verdict is Verdict.REGRESSION:
        return True
    return (check.verdict is Verdict.INCONCLUSIVE and bool(check.data.get("contaminated"))
            and check.data.get("measured_verdict") == Verdict.REGRESSION.value)


def _suspects(evaluated: Evaluated) -> tuple[str, ...]:
    """The metrics of :data:`CONFIRMED` whose check is suspect in ``evaluated``."""
    return tuple(m for m in CONFIRMED if _suspect_check(_check(evaluated, m)))


def _suspect(evaluated: Evaluated) -> bool:
    return bool(_suspects(evaluated))


def _ratios_of(metric: str, seen: Sequence[CheckResult]) -> str:
    ratios = [c.data.get("ratio") for c in seen]
    shown = ", ".join(f"{r:.2f}" for r in ratios if isinstance(r, float))
    return f"{_RATIO_NAMES.get(metric, 'ratio(s)')} {shown}" if shown else "no ratio"


def _notes(backoff: Sequence[str]) -> str:
    return "".join("; " + b for b in backoff)


@dataclass(frozen=True)
class Confirmation:
    """Re-measure an apparent timing regression; it stands only if confirmed.

    One slow measurement on a shared machine is weak evidence: another job may have taken
    the cores for exactly those seconds, or the allocator served a batch's memory afresh.
    So a ``regression`` of throughput or of the making of the batch (``input``,
    ``input_wait``: :data:`CONFIRMED`), or a slowdown left ``inconclusive`` because its
    measurement was contaminated (another job's load, step times far more dispersed than
    the baseline's, a batch's page faults unlike the baseline's), trains the case again
    (``remeasure``, up to ``times`` times, each after waiting for a machine where other
    processes use at most ``max_foreign_load`` cores); the first re-measurement in which
    none is suspect decides, and each check that was suspect is reported with a note of
    what the earlier measurements said. One that stays contaminated stays
    ``inconclusive``: never a verdict the evidence does not carry.
    """

    remeasure: Callable[[], Evaluated]
    times: int
    max_foreign_load: float

    def __call__(self, first: Evaluated) -> Evaluated:
        __tracebackhide__ = True
        suspects = _suspects(first)
        if not suspects:
            return first
        seen, backoff = remeasure_until(first, self.remeasure, self.times,
                                        self.max_foreign_load, lambda ev: not _suspect(ev))
        evaluated = seen[-1]
        for metric in CONFIRMED:
            earlier = [c for c in (_check(ev, metric) for ev in seen[:-1]) if c is not None]
            again = _check(evaluated, metric)
            if again is None or not any(_suspect_check(c) for c in earlier):
                continue
            evaluated = evaluated.with_check(self._noted(metric, earlier, again, backoff))
        return evaluated

    @staticmethod
    def _noted(metric: str, earlier: list[CheckResult], again: CheckResult,
               backoff: Sequence[str]) -> CheckResult:
        """``again``, the last measurement's ``metric`` check, with a note of what the
        earlier measurements said of it."""
        dirty = sum(1 for c in earlier if c.verdict is Verdict.INCONCLUSIVE)
        dirty_note = (f"; {dirty} of them not judged, contaminated" if dirty else "")
        ratios = [c.data.get("ratio") for c in earlier]
        key: Literal["unconfirmed", "remeasured", "confirmations"]
        if not _suspect_check(again):
            note = (f"re-measured: a first measurement looked like a regression, "
                    f"{_ratios_of(metric, earlier)}{dirty_note}; not confirmed")
            key = "unconfirmed"
        elif again.verdict is Verdict.INCONCLUSIVE:  # still contaminated: not judged
            note = (f"re-measured {len(earlier)} time(s), contaminated each time: "
                    f"{_ratios_of(metric, [*earlier, again])}")
            key = "remeasured"
        else:
            note = (f"confirmed by {len(earlier)} re-measurement(s): "
                    f"{_ratios_of(metric, [*earlier, again])}{dirty_note}")
            key, ratios = "confirmations", [*ratios, again.data.get("ratio")]
        data = again.data.copy()
        data[key] = ratios
        return replace(again, detail=f"{again.detail} ({note}{_notes(backoff)})", data=data)


@dataclass(frozen=True)
class Recording:
    """``--accelperf-update`` / ``--accelperf-add-session``: refuse a blind baseline.

    A recording too noisy to be a level (``noise(run)`` says why: step times far more
    dispersed than a quiet machine gives, or measured beside another job,
    :func:`~pytest_accelperf.checks.throughput.recording_noise`; never the drift probe's
    spread) trains the case again, up to ``times`` times (``--accelperf-confirm``), each
    after the same back-off as :class:`Confirmation`; the first quiet measurement is
    recorded. ``remeasure`` is the caller's: the runner's measures over
    :data:`RECORDING_WINDOWS` trainings, twice the measured steps
    (a longer window dilutes a burst of another job's work), and the note says how many
    steps it measured. One that stays noisy is recorded as the least dispersed of the
    measurements, and the caller stores it marked ``noisy``; ``recording_note`` says what
    happened.
    """

    remeasure: Callable[[], Evaluated]
    times: int
    max_foreign_load: float
    noise: Callable[[Run], str]

    def __call__(self, first: Evaluated) -> Evaluated:
        __tracebackhide__ = True
        why = self.noise(first.run)
        if not why or self.times < 1:
            return first
        seen, backoff = remeasure_until(first, self.remeasure, self.times,
                                        self.max_foreign_load,
                                        lambda ev: not self.noise(ev.run))
        n = len(seen) - 1
        longer = _steps_text(first, seen[1:])
        if not self.noise(seen[-1].run):
            return replace(seen[-1], recording_note=(
                f"re-measured before recording: the first measurement was too noisy to be a "
                f"baseline: {why}; measurement {n + 1} was not{longer}{_notes(backoff)}"))
        kept = min(range(len(seen)), key=lambda i: spread(list(seen[i].run.step_times)))
        return replace(seen[kept], recording_note=(
            f"still noisy after {n} re-measurement(s){longer}{_notes(backoff)}; recorded "
            f"measurement {kept + 1} of {n + 1}, the least dispersed"))


def _steps_text(first: Evaluated, again: Sequence[Evaluated]) -> str:
    """How many steps the re-measurements timed, when not as many as the first: e.g.
    ``" (re-measured over 60 measured steps, the first over 30)"``."""
    counts = sorted({len(ev.run.step_times) for ev in again})
    if not counts or counts == [len(first.run.step_times)]:
        return ""
    shown = "/".join(str(c) for c in counts)
    return (f" (re-measured over {shown} measured steps, the first over "
            f"{len(first.run.step_times)})")


@dataclass(frozen=True)
class ABComparison:
    """A/B mode: the throughput check becomes the paired comparison with the base revision,
    and the deterministic checks compare with the base arm's own record.

    ``comparison()`` is the session's A/B setup (made on first use); ``rounds(comparison)``
    measures this case's alternating rounds (under the host lock) and returns ``(status,
    why, measurement)``; a :class:`~pytest_accelperf.ab.CompareError` from either goes to
    the caller. A case the base revision lacks is ``new``; one that cannot be compared
    keeps its stored-baseline check, with a note; a run that did not finish is not
    compared.

    The program check compares the two arms' programs (:func:`~pytest_accelperf.ab.
    verdict.ab_program_check`); the memory, numerics, loss and input checks compare this run
    with the run the base arm trained once as a normal run (``measurement.base_run``,
    :func:`~pytest_accelperf.ab.verdict.ab_record_checks`) under ``tolerances`` (the
    case's) and ``loss_either_way``. Each of these, where the base arm has no record of it,
    keeps its stored-baseline check with a note of why
    (:func:`~pytest_accelperf.ab.verdict.record_not_compared`).
    """

    comparison: Callable[[], Comparison]
    rounds: Callable[[Comparison], tuple[str, str, ABMeasurement]]
    tolerance: float
    block: int
    max_foreign_load: float
    tolerances: Tolerances
    loss_either_way: bool = False
    #: The case's backend: only the framework packages it declares count in the stack.
    spec: BackendSpec | None = None

    @property
    def program_tolerance(self) -> float:
        return self.tolerances.program_tolerance

    def __call__(self, evaluated: Evaluated) -> Evaluated:
        __tracebackhide__ = True
        if evaluated.run.outcome != "ok":
            return evaluated
        comparison = self.comparison()
        status, why, measured = self.rounds(comparison)
        stored = evaluated.throughput
        check: CheckResult | None
        if status == "ready":
            check = ab_check(comparison.label, measured, evaluated.run.samples_per_step,
                             self.tolerance, self.block, max_foreign_load=self.max_foreign_load,
                             program_tolerance=self.program_tolerance,
                             stack=comparison.stack_change(self.spec),
                             stacks=comparison.stacks,
                             environment=comparison.base_env)
        elif status == "absent":
            check = new_in_head(comparison.label, why, stored)
        else:
            check = not_compared(comparison.label, why, stored)
        judged = evaluated.with_throughput(check, first=True)
        program = (ab_program_check(comparison.label, measured, self.program_tolerance)
                   if status == "ready" else None)
        if program is not None:
            judged = judged.with_check(program)
        return self._against_base_record(judged, comparison, measured)

    def _against_base_record(self, judged: Evaluated, comparison: Comparison,
                             measured: ABMeasurement) -> Evaluated:
        """``judged`` with its outcome, memory, numerics, loss, step-metric and batch
        (input) checks against the base arm's record; each the base arm could not judge
        keeps its stored-baseline check, with a note."""
        label = comparison.label
        ab = ab_record_checks(label, measured, judged.run, judged.block, self.tolerances,
                              loss_either_way=self.loss_either_way,
                              stack=tuple(comparison.stack_changes(self.spec)),
                              max_foreign_load=self.max_foreign_load)
        for result in ab.values():
            judged = judged.with_check(result)
        steps = set(judged.run.metrics or {})  # the step metrics, a check each
        for stored in list(judged.checks):  # what the base's record could not judge
            if ((stored.metric in RECORD_METRICS or stored.metric in steps)
                    and stored.metric not in ab):
                judged = judged.with_check(record_not_compared(label, measured, stored))
        return judged


#: What a re-measurement's run contributes besides its step, probe and input times: what
#: the step loop read while it measured them.
class _Timing(TypedDict):
    """The timing fields of a re-measured run besides its samples (taken from the first
    measurement, the loads pooled, the batch times summed)."""

    warmup_step_times: list[float] | None
    injected_slowdown: float | None
    step_load: Load | None
    batch_time: float | None

#: How many trainings a re-measurement of a recording too noisy to store pools
#: (:class:`Recording`): twice the measured steps, over twice the
#: window, so that a burst of another job's work weighs half as much in the step times'
#: spread. Each training keeps to the case's own steps (its data, its timeout).
RECORDING_WINDOWS = 2


def retimed(first: TrainResult, *again: TrainResult) -> TrainResult:
    """``first`` with the timing of ``again``, a re-measurement of the same case in this
    process (a throughput confirmation, a noisy recording measured again); several
    trainings of a re-measurement are one measurement over all their steps (their step,
    probe and input times one after the other, the machine's load over all of them).

    A re-measurement re-times the steps (and the making of their batches, timed beside
    them), and the load on the machine read while they were timed; everything else stays
    the first measurement's, the only true one: trained again
    in this process, the step finds its program in JAX's or inductor's in-memory cache (its
    "compile" is a lookup, 18 ms for a 2.9 s compile), and a step that keeps state of its
    own (nanoGPT's ``iter_num``, which drives its learning-rate schedule) trains on from
    where it stopped, so its loss curve and final parameters are not the first's. A
    re-measurement that did not finish is what it is.
    """
    if not again:
        raise ValueError("retimed needs a re-measurement")
    unfinished = next((a for a in again if a.run.outcome != "ok"), None)
    if unfinished is not None:
        return unfinished
    if first.run.outcome != "ok":
        first = again[0]
    runs = [a.run for a in again]
    timing = _Timing(warmup_step_times=runs[0].warmup_step_times,
                     injected_slowdown=runs[0].injected_slowdown,
                     step_load=runs[0].step_load, batch_time=runs[0].batch_time)
    loads = [r.step_load for r in runs if r.step_load is not None]
    if len(runs) > 1 and loads:
        timing["step_load"] = Load.pooled(loads)
    batch_times = [r.batch_time for r in runs if r.batch_time is not None]
    if len(runs) > 1 and len(batch_times) == len(runs):
        timing["batch_time"] = sum(batch_times)
    run = replace(first.run, step_times=[t for r in runs for t in r.step_times],
                  probe_times=[t for r in runs for t in r.probe_times],
                  probe_kind=runs[0].probe_kind,
                  inputs=InputSeries.joined([r.inputs for r in runs]),
                  trainer_times=([t for r in runs for t in r.trainer_times or ()]
                                 if all(r.trainer_times for r in runs) else None),
                  **timing)
    return replace(first, run=run)
