"""The case pipeline behind the ``accelperf`` fixture, one way:
measure -> evaluate -> judge -> record -> gate.

``CaseRunner`` is the thin object a test receives; it orchestrates, and each step's work is
another module's. It *measures* the case where its backend trains it
(:func:`pytest_accelperf.gate.routing.train`: this process, where
:mod:`pytest_accelperf.gate.hangs` interrupts a step that blocks; launched ranks; a Ray worker),
*evaluates* the run (every check against the stored baseline, the environment's
differences named where the throughput check is made), *judges* throughput by one of the
strategies of :mod:`pytest_accelperf.gate.judge` (the stored baseline, a confirmed
re-measurement, or A/B), each of which returns a new result and changes none, *records* the
result once in the session's report with what it stores
(:func:`pytest_accelperf.gate.policy.to_store`), and *gates*: fails the test with a
message that names the fix (:mod:`pytest_accelperf.report.failure`).

A case that ends early (its training raised, the host lock timed out, the stored baseline
is broken, the A/B comparison failed, a log could not be ingested) is recorded through the
same one function, :meth:`CaseRunner._fail`, and never twice.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, NoReturn

import pytest

from pytest_accelperf.ab import CompareError, EnvironmentSetupError
from pytest_accelperf.ab.rounds import ABMeasurement, Comparison
from pytest_accelperf.ab.tree import node_location
from pytest_accelperf.backends.local import fits as fits_where_it_trains
from pytest_accelperf.backends.measure.common import INJECT_ENV, injected_slowdown
from pytest_accelperf.backends.protocol import Fit, Task, TrainResult
from pytest_accelperf.backends.spec import BackendSpec
from pytest_accelperf.checks import run_checks
from pytest_accelperf.checks.scaling import Scaling, ScalingPoint
from pytest_accelperf.checks.summary import summarize
from pytest_accelperf.checks.throughput import recording_noise
from pytest_accelperf.cluster.session import cluster_for
from pytest_accelperf.collect.cases import Case
from pytest_accelperf.errors import AccelperfWarning, UserError, render
from pytest_accelperf.gate.explain import NOT_RETRAINED, explain, skipped, untraced
from pytest_accelperf.gate.hangs import HostLockError
from pytest_accelperf.gate.judge import (
    RECORDING_WINDOWS,
    ABComparison,
    Confirmation,
    Evaluated,
    Judge,
    Recording,
    StoredBaseline,
    retimed,
)
from pytest_accelperf.gate.maxbatch import MaxBatch, search_max_batch
from pytest_accelperf.gate.options import Settings
from pytest_accelperf.gate.policy import to_store
from pytest_accelperf.gate.routing import route
from pytest_accelperf.gate.routing import train as train_routed
from pytest_accelperf.gate.session import (
    AccelperfSession,
    exclusive_host,
    say,
    say_on_stderr,
)
from pytest_accelperf.provision.accel import Accelerator
from pytest_accelperf.provision.describe import PROGRAM_KEYS, differences, stack_changes
from pytest_accelperf.provision.device_errors import (
    DeviceError,
    broken_context_message,
    classify,
    release_device_memory,
)
from pytest_accelperf.provision.targets import NOT_RUN, not_run
from pytest_accelperf.provision.xdist_role import worker_id
from pytest_accelperf.records.environment import Environment
from pytest_accelperf.records.run import Explained, Run
from pytest_accelperf.records.verdict import CheckResult, Tolerances, Verdict
from pytest_accelperf.report.data import CaseRecord, baseline_view
from pytest_accelperf.report.failure import (
    accept_command,
    failure_message,
    no_baseline,
    not_recorded,
    other_environment,
)
from pytest_accelperf.store.baselines import BaselineError
from pytest_accelperf.store.block import Block, read_block
from pytest_accelperf.store.machines import MachineView, default_machine, other_host
from pytest_accelperf.store.schema import block_model


@dataclass
class MaxBatchSearch:
    """How :meth:`CaseRunner.train` searches the largest batch that fits.

    ``make_task(case)`` builds the task of a case at ``case.batch``; the search starts at
    ``start`` (default: the case's batch), never goes past ``limit``, and tries multiples
    of ``multiple_of`` only (default: the case's device count, so every device or rank
    gets a whole share).
    """

    make_task: Callable[[Case], Any]
    start: int | None = None
    limit: int = 1 << 16
    multiple_of: int | None = None


@dataclass
class CaseResult:
    """What ``accelperf.train`` returns: the run and the verdicts of its checks, and the
    final state of the training where the backend hands it back (the JAX backend: the
    step's state, or ``JaxStep.final`` of it; None otherwise), for an eval step or the
    test's own asserts.

    A compile-only case (``--accelperf-target``) executed no step: its ``run`` is a
    :class:`CompiledRun`, and a test that asks for what only steps give (``state``, the
    run's losses, metrics or step times, a ``loss`` or ``reference`` check) is skipped
    there with the reason, after the gate's verdicts were recorded; a regression has
    already failed it."""

    run: Run
    checks: list[CheckResult]
    state: Any = None

    def __getattribute__(self, name: str) -> object:
        if name == "state":
            skip_compile_only(object.__getattribute__(self, "run"), "the trained state")
        return object.__getattribute__(self, name)

    def check(self, metric: str) -> CheckResult:
        for c in self.checks:
            if c.metric == metric:
                return c
        if metric in NOT_RUN or metric not in ("outcome", "compile", "program", "memory"):
            skip_compile_only(self.run, f"the {metric!r} check")
        raise KeyError(f"no {metric!r} check; have {[c.metric for c in self.checks]}")


#: What only executed steps give: a compile-only case's run has none of it
#: (:class:`CompiledRun`).
STEP_FIELDS = frozenset({
    "step_times", "losses", "loss_steps", "metrics", "params_fingerprint", "probe_times",
    "inputs", "trainer_times",
    "memory_growth", "median_step_time",
    "samples_per_second", "mfu", "hfu", "final_loss"})


def skip_compile_only(run: Run, what: str) -> None:
    """Skip the test, naming ``what`` it asked for, when ``run`` is a compile-only case's
    (no step executed); else nothing."""
    target = run.compile_only
    if target:
        # Reported at the test (as a skip mark's is), not at this line of the plugin.
        raise pytest.skip.Exception(
            f"{run.case_id}: the test asks for {what}, which only executed steps give: "
            f"{not_run(str(target))}", _use_item_location=True)


class CompiledRun(Run):
    """The run a compile-only case hands its test (:class:`CaseResult`): what the compile
    gave (outcome, memory, FLOPs, program, compile time) reads as in any run; reading
    what only executed steps give (:data:`STEP_FIELDS`) skips the test, naming it."""

    def __getattribute__(self, name: str) -> object:
        if name in STEP_FIELDS:
            skip_compile_only(self, f"run.{name}")
        return super().__getattribute__(name)


class CaseRunner:
    """The ``accelperf`` fixture: train the current case and check it.

    Example (``suites/jax/test_mesh_sweep.py``)::

        from pytest_accelperf import cases
        from charlm import make_task

        @cases(backend="jax", mesh=[None, (4, 2), (8, 1)], batch=[32, 128, 512])
        def test_mesh_sweep(accelperf):
            result = accelperf.train(make_task(accelperf.case))
            assert result.run.outcome == "ok"
    """

    def __init__(self, session: AccelperfSession, item: pytest.Item, case: Case,
                 accelerator: Accelerator) -> None:
        self._session = session
        self._item = item
        self.case = case
        self.accelerator = accelerator
        #: The case's backend, as registered (``case.backend`` names it).
        self.spec: BackendSpec = session.backends()[case.backend]

    @property
    def settings(self) -> Settings:
        return self._session.settings

    def train(self, task: Task, *,
              max_batch: MaxBatchSearch | Callable[[Case], Any] | None = None) -> CaseResult:
        """Train ``task`` (e.g. a ``JaxTask``) as this case, check it, and gate on it.

        With ``max_batch`` (a :class:`MaxBatchSearch`, or just the ``make_task(case)`` it
        needs), the largest batch that fits is searched first and checked with the run.
        A throughput regression is re-measured (``--accelperf-confirm`` times) before it
        fails the test.
        """
        __tracebackhide__ = True
        if self.settings.update and injected_slowdown():
            pytest.fail(f"{INJECT_ENV} is set: a baseline recorded with an injected "
                        f"slowdown would be wrong; unset it to run --accelperf-update",
                        pytrace=False)
        broken = self._session.broken_device
        if broken is not None and route(self.spec, self.case, cluster=bool(
                self.settings.cluster)) == "in-process":
            run = Run(case_id=self.case.id, outcome="error",
                      message=broken_context_message(*broken),
                      environment=self._session.environment)
            self._fail(run, run.message, message=f"{self._item.nodeid} ({self.case.id}): "
                                                 f"{run.message}")
        found = self.search_max_batch(max_batch) if max_batch is not None else None

        first = self._train_once(task, found)
        evaluated = self._evaluate(first)

        def remeasure(trainings: int = 1) -> Evaluated:
            again: list[TrainResult] = []
            for _ in range(trainings):
                again.append(self._train_once(task, found))
                if again[-1].run.outcome != "ok":
                    break
            return self._evaluate(retimed(first, *again))

        judged = self._judged(self._judge(remeasure), evaluated)
        return self._finish(self._explained(judged, task))

    def _device_failed(self, run: Run, device: DeviceError) -> NoReturn:
        """A device error in a step (:mod:`pytest_accelperf.provision.device_errors`): the case
        fails
        with the device's message and its id. An out-of-memory's memory is given back for
        the next case; a sticky CUDA error marks this process's context broken, and its
        later in-process cases fail at once naming this one (:meth:`train`)."""
        __tracebackhide__ = True
        if device.sticky:
            self._session.broken_device = (self.case.id, device)
        else:
            release_device_memory()
        where = self.accelerator.device_kind
        what = ("a CUDA error that breaks the process's device context" if device.sticky
                else "out of device memory")
        run = replace(run, message=device.message)
        self._fail(run, device.message, chained=False,
                   message=f"{self._item.nodeid} ({self.case.id}): {what} on {where}: "
                           f"{device.message}")

    def _explained(self, ev: Evaluated, task: Task) -> Evaluated:
        """``ev`` with a profiler trace of a few more steps attached when it regressed
        (:mod:`pytest_accelperf.gate.explain`): only where the case trains in this process, never
        while recording, not under a compile-only target (no step can run), and not with
        ``--accelperf-explain=off``."""
        __tracebackhide__ = True
        settings = self.settings
        root = settings.explain_dir
        if (root is None or settings.update or settings.cluster or settings.target
                or not any(c.verdict is Verdict.REGRESSION for c in ev.checks)
                or route(self.spec, self.case, cluster=False) != "in-process"):
            return ev
        if ev.run.outcome in NOT_RETRAINED:  # it blocked once: it would block again
            return self._with_explanation(ev, skipped(ev.run.outcome, settings.timeout))
        with self._host():  # bounded by the case's timeout, as its training is
            found = explain(self.spec.load(), self.case, task, self.accelerator, root,
                            max_bytes=settings.explain_max_bytes, timeout=settings.timeout,
                            on_stuck=lambda why: self._explain_stuck(ev, why))
        return self._with_explanation(ev, found)

    @staticmethod
    def _with_explanation(ev: Evaluated, found: Explained) -> Evaluated:
        run = replace(ev.run, explain=found)
        return replace(ev, run=run)

    def _explain_stuck(self, ev: Evaluated, why: str) -> None:
        """The explanation could not be stopped (``why``): record the case as it was
        judged, with the note, and end the process as :meth:`_stuck` does. Called from the
        watchdog thread."""
        note = untraced(f"no trace: {why}; the pytest process was ended with what was "
                        f"recorded")
        self._record(self._with_explanation(ev, note).run, ev.checks, baseline=ev.baseline)
        message = f"{self._item.nodeid}: {note['note']}"
        if self._session.abort is not None:
            self._session.abort(message)
        say_on_stderr(f"accelperf: {message}")
        os._exit(int(pytest.ExitCode.INTERRUPTED))

    def skip_without_devices(self) -> None:
        """Skip a case that needs more accelerators than this host has (a 4x2 mesh, or two
        DeepSpeed ranks, on a one-GPU machine): the hardware is missing, not the suite
        wrong. On the CPU the devices are virtual and a flag sets their number, so there a
        mesh too large stays an error naming that flag; on a Ray cluster the cluster's
        devices count, not this host's."""
        accel, case = self.accelerator, self.case
        if accel.name == "cpu" or self.settings.cluster or case.backend == "external":
            return
        if case.n_devices > accel.device_count and accel.compile_only:
            pytest.skip(f"{case.id} needs {case.n_devices} devices; {accel.compile_only} has "
                        f"{accel.device_count}: compile it for a larger topology "
                        f"(--accelperf-target)")
        if case.n_devices > accel.device_count:
            pytest.skip(f"{case.id} needs {case.n_devices} devices; {accel.platform} has "
                        f"{accel.device_count}: run it on a host with {case.n_devices} or "
                        f"more, or on a Ray cluster (--accelperf-cluster)")

    def _judge(self, remeasure: Callable[[int], Evaluated]) -> Judge:
        """How this session judges the throughput of a trained case
        (:mod:`pytest_accelperf.gate.judge`). ``remeasure(n)`` trains the case ``n`` times
        more and measures over all of them (:func:`~pytest_accelperf.gate.judge.retimed`): a
        recording pools :data:`~pytest_accelperf.gate.judge.RECORDING_WINDOWS`, a confirmation
        one, as long as the baseline's."""
        settings = self.settings
        if settings.ab and not settings.update:
            return ABComparison(
                comparison=self._session.comparison, rounds=self._ab_rounds,
                tolerance=settings.compare_tolerance, block=settings.compare_block,
                max_foreign_load=settings.max_foreign_load, tolerances=self._tolerances(),
                loss_either_way=settings.loss_either_way, spec=self.spec)
        if settings.update:
            return Recording(lambda: remeasure(RECORDING_WINDOWS), settings.confirm,
                             settings.max_foreign_load, self._noise)
        if not settings.confirm:
            return StoredBaseline()
        return Confirmation(lambda: remeasure(1), settings.confirm, settings.max_foreign_load)

    def _noise(self, run: Run) -> str:
        """Why ``run`` is too noisy to record as a baseline, or ``""``
        (:func:`~pytest_accelperf.checks.throughput.recording_noise`)."""
        return recording_noise(run, self._tolerances(), self.settings.max_foreign_load)

    def _judged(self, judge: Judge, evaluated: Evaluated) -> Evaluated:
        """``judge(evaluated)``; an A/B comparison that cannot be made ends the case."""
        __tracebackhide__ = True
        try:
            return judge(evaluated)
        except CompareError as exc:
            label = self._session.comparison().label
            self._fail(evaluated.run, str(exc), checks=evaluated.checks,
                       message=f"{self._item.nodeid}: A/B comparison with {label} failed: "
                               f"{exc}", chained=not isinstance(exc, EnvironmentSetupError))

    def _ab_rounds(self, comparison: Comparison) -> tuple[str, str, ABMeasurement]:
        """This case's alternating rounds on the base revision and the working tree,
        holding the host as training does."""
        __tracebackhide__ = True
        settings = self.settings
        rel_file, qualname = node_location(self._item, comparison.root)
        with self._host(bounded=False):  # rounds and workers have bounds of their own
            return comparison.measure(self.case, rel_file, qualname, spec=self.spec,
                                      rounds=settings.compare_rounds,
                                      block=settings.compare_block,
                                      budget=settings.compare_budget,
                                      tolerance=settings.compare_tolerance,
                                      timeout=settings.timeout)

    def _tolerances(self) -> Tolerances:
        return self.settings.tolerances.merged(dict(self.case.tolerances))

    def search_max_batch(self, search: MaxBatchSearch | Callable[[Case], Any]) -> MaxBatch:
        """The largest batch of this case that fits (see :mod:`pytest_accelperf.gate.maxbatch`);
        not checked by itself: pass the search to :meth:`train` for that."""
        if not isinstance(search, MaxBatchSearch):
            search = MaxBatchSearch(search)
        make_task = search.make_task

        def fits(case: Case) -> Fit:
            with self._host():
                return fits_where_it_trains(self.spec, case, make_task(case), self.accelerator,
                                            timeout=self.settings.timeout)

        return search_max_batch(self.case, fits, start=search.start, limit=search.limit,
                                multiple_of=search.multiple_of or self.case.n_devices)

    def check(self, result: TrainResult) -> CaseResult:
        """Check a finished run against the baseline and fail the test on a regression."""
        __tracebackhide__ = True
        return self._finish(self._judged(StoredBaseline(), self._evaluate(result)))

    def ingest(self, source: str | os.PathLike[str] | Sequence[str], *,
               parser: str | Callable[[str, str], list[Run]], section: str | None = None,
               log: str | os.PathLike[str] | None = None) -> CaseResult:
        """Check a run measured outside the plugin, as :meth:`train` checks its own.

        ``source`` is a log file, or a command (a list of arguments) that is run first,
        holding the host like a training case; its stdout+stderr is the log unless ``log``
        names the file it writes. ``parser`` is ``"neuron"``, ``"hf-trainer"``,
        ``"cerebras"`` (:mod:`pytest_accelperf.ingest`) or a ``(text, source) -> runs``
        function; ``section`` picks one run of a log that holds several. The environment
        compared for throughput is the log's (its platform, device and compiler versions),
        not this machine's. A log that cannot be read fails the test naming file and line.
        """
        __tracebackhide__ = True
        from pytest_accelperf.ingest import IngestError, parse_file, run_command, select_run

        path: str | os.PathLike[str]
        if isinstance(source, str | os.PathLike):
            path = source
        else:
            workdir = Path(tempfile.mkdtemp(prefix="accelperf-ingest-"))
            with self._host():
                path, status, tail = run_command(source, log, workdir, self.settings.timeout)
            if status != 0:
                why = ("timed out" if status == -1 else f"exited with status {status}")
                run = Run(case_id=self.case.id, outcome="error",
                          message=f"command {list(source)} {why}")
                self._fail(run, run.message,
                           message=f"{self._item.nodeid}: {run.message}; its output ends:\n"
                                   f"{tail}")
        try:
            run = select_run(parse_file(path, parser), section, str(path))
        except IngestError as exc:
            self._fail(Run(case_id=self.case.id, outcome="error", message=str(exc)), str(exc),
                       message=f"{self._item.nodeid}: cannot ingest the log: {exc}")
        run = replace(run, case_id=self.case.id)
        environment = Environment.from_json({"source": "ingested", **run.environment.to_json()})
        return self._finish(self._judged(StoredBaseline(), self._evaluate(
            TrainResult(run=run), environment=environment)))

    def scaling(self, group: str, result: CaseResult | Run, *, x: float | None = None,
                expect: Scaling | None = None, points: int) -> CheckResult | None:
        """Add this case's throughput to the scaling series ``group`` (``points`` long).

        ``x`` defaults to the case's batch (``expect.axis == "batch"``) or its device count.
        When the group's last point arrives its shape is checked against ``expect``
        (:mod:`pytest_accelperf.checks.scaling`; default: linear, efficiency >= 0.8): the
        verdict joins this case's checks in the report, and a bent curve fails this test
        (except under ``--accelperf-update``). Returns that verdict, or None before.
        """
        __tracebackhide__ = True
        expect = expect or Scaling()
        run = result.run if isinstance(result, CaseResult) else result
        if x is None:
            x = self.case.batch if expect.axis == "batch" else self.case.n_devices
        point = ScalingPoint.from_run(x, run, self.case.id)
        verdict = self._session.scaling.add(group, point, expect, points)
        if verdict is None:
            return None
        for record in reversed(self._session.report.records):
            if record.nodeid == self._item.nodeid:
                record.checks.append(verdict)
                break
        if verdict.failed and not self.settings.update:
            pytest.fail(f"{self._item.nodeid}: scaling group {verdict.detail}", pytrace=False)
        return verdict

    def _train_once(self, task: Task, found: MaxBatch | None) -> TrainResult:
        __tracebackhide__ = True
        settings = self.settings
        try:
            ray_cluster = cluster_for(self._item.config, settings.cluster,
                                      settings.cluster_wait)
            result = train_routed(self.spec, self.case, task, self.accelerator,
                                  settings=settings, on_cluster=ray_cluster is not None,
                                  host=self._host, environment=self._session.environment,
                                  on_stuck=self._stuck)
        except Exception as exc:
            run = Run(case_id=self.case.id, outcome="error",
                      message=f"{type(exc).__name__}: {exc}",
                      environment=self._session.environment,
                      max_batch=found.to_json() if found else None)
            if isinstance(exc, UserError):  # the user's to fix: one line, no frame of ours
                self._fail(run, run.message, message=f"{self._item.nodeid}: {render(exc)}",
                           chained=False)
            device = classify(exc)
            if device is not None:  # the device's message and the case, no frame of ours
                self._device_failed(run, device)
            self._fail(run, run.message, reraise=exc)
        if found is not None:
            result.run = replace(result.run, max_batch=found.to_json())
        if injected_slowdown():
            result.run = replace(result.run, injected_slowdown=injected_slowdown())
        return result

    @contextlib.contextmanager
    def _host(self, *, bounded: bool = True) -> Iterator[None]:
        """The host lock around this case's training (CPU only); a wait past
        ``--accelperf-host-lock-timeout``, or for a holder known to be stuck, fails the
        test naming the lock's holder (the case is recorded as an error, without a
        traceback). ``bounded``: what runs under it ends within ``--accelperf-timeout``
        (the holder file says so, and a waiter takes a holder past it as stuck)."""
        __tracebackhide__ = True
        lock: AbstractContextManager[object] = exclusive_host(
            self.accelerator, case=self._item.nodeid, timeout=self.settings.host_lock_timeout,
            notify=lambda text: say(self._item.config, text),
            hold_timeout=self.settings.timeout if bounded else None)
        with contextlib.ExitStack() as stack:
            try:
                stack.enter_context(lock)
            except HostLockError as exc:  # a wait past the timeout, or a lock file unusable
                self._fail(Run(case_id=self.case.id, outcome="error", message=str(exc),
                               environment=self._session.environment), str(exc))
            yield

    def _stuck(self, run: Run) -> None:
        """The case could not be stopped (``run.message`` says why,
        :func:`~pytest_accelperf.gate.hangs.stuck_run`): record it and end the process with what
        was recorded; the cases after it cannot be measured on a busy machine. Called from
        a watchdog thread while the main thread is stuck, or from the main thread when the
        devices stayed busy."""
        # Not through _fail: this may run on a watchdog thread, and the process ends here.
        self._record(run, (), error=run.message)
        message = f"{self._item.nodeid}: {run.message}"
        if self._session.abort is not None:
            self._session.abort(message)
        say_on_stderr(f"accelperf: {message}")
        os._exit(int(pytest.ExitCode.INTERRUPTED))

    def _evaluate(self, result: TrainResult,
                  environment: Environment | None = None) -> Evaluated:
        """Every check of the run against the stored baseline; the environment a
        baseline from elsewhere differs in is named where the throughput check is made."""
        __tracebackhide__ = True
        session = self._session
        run = replace(result.run,
                      environment=session.environment if environment is None else environment)
        block = summarize(run)
        # An ingested log's timing is the machine's that the log names, not this host's.
        machine = (default_machine(environment.to_json()) if environment is not None
                   else session.machine)
        stored = self._stored_baseline(run, machine)
        baseline = read_block(stored.block, block_model()) if stored is not None else None
        known = session.backends().packages()
        env = run.environment.to_json()
        # Timing is this machine's own (store/machines.py): judged against the environment
        # it was recorded in; the shared sections against theirs.
        shared_env = stored.shared_env if stored is not None else {}
        timing_env = stored.timing_env if stored is not None else None
        if timing_env is not None and not self.settings.update:
            other = other_host(stored.machine, env, timing_env) if stored else ""
            if other:
                self._fail(run, other, chained=False,
                           message=f"{self._item.nodeid}: {other}")
        diffs = tuple(differences(env, timing_env, self.spec, known=known)
                      if timing_env is not None else [])
        shared_diffs = tuple(differences(env, shared_env, self.spec, known=known)
                             if stored is not None else [])
        program_diffs = tuple(differences(env, shared_env, self.spec, known=known,
                                          keys=PROGRAM_KEYS) if stored is not None else [])
        # The stack (an upgrade) is a change under test, judged and named, when the machine
        # is the same; on another machine nothing timed is compared anyway.
        stack = tuple(stack_changes(env, timing_env, self.spec, known=known)
                      if timing_env is not None and not diffs else [])
        shared_stack = tuple(stack_changes(env, shared_env, self.spec, known=known)
                             if stored is not None and not shared_diffs else [])
        tol = self._tolerances()
        checks = run_checks(run, block, baseline, tol, differences=diffs,
                            program_differences=program_diffs, stack=stack,
                            reference_params=result.reference_params, params=result.params,
                            loss_either_way=self.settings.loss_either_way,
                            max_foreign_load=self.settings.max_foreign_load,
                            shared_differences=shared_diffs, shared_stack=shared_stack,
                            machine_new=stored.machine if stored and stored.new else "")
        for extra in self._item.config.hook.pytest_accelperf_extra_checks(
                run=run, block=block, baseline=baseline, tolerances=tol):
            checks.extend(extra or [])
        return Evaluated(run, block, baseline, tuple(checks), diffs, stack=stack,
                         state=getattr(result, "state", None), stored=stored,
                         machine=machine)

    def _stored_baseline(self, run: Run, machine: str) -> MachineView | None:
        """This case's stored baseline as this machine reads it (None: nothing stored). A
        broken one ends the case (the run reported, nothing lost), unless
        ``--accelperf-update`` replaces it."""
        __tracebackhide__ = True
        try:
            return self._session.store(self.accelerator.platform).get_view(
                self._item.nodeid, machine)
        except BaselineError as exc:
            # An invalid block in a file that parsed: an update replaces it.
            if self.settings.update and exc.replaceable:
                return None
            # Report the run (nothing lost) but never store over a broken file.
            self._fail(run, str(exc), chained=False)

    def _finish(self, ev: Evaluated) -> CaseResult:
        """Record the judged result (the one record of a case that ran to the end) and
        gate on it."""
        __tracebackhide__ = True
        nodeid = self._item.nodeid
        if ev.diffs:
            warnings.warn(AccelperfWarning(other_environment(nodeid, ev.diffs)), stacklevel=3)
        stored = to_store(ev, update=self.settings.update,
                          add_session=self.settings.add_session, noise=self._noise)
        if stored.noisy:
            warnings.warn(AccelperfWarning(f"{nodeid}: {stored.noisy}"), stacklevel=3)
        elif stored.note:
            say(self._item.config, f"accelperf: {nodeid}: {stored.note}")
        self._record(ev.run, ev.checks, block=stored.block, baseline=ev.baseline)
        if stored.refused:
            pytest.fail(f"{nodeid}: no session added: {stored.refused}", pytrace=False)
        self._gate(ev.run, ev.checks, ev.baseline, stored.unstorable)
        run = ev.run
        if run.compile_only:
            run = CompiledRun(**{f.name: getattr(run, f.name) for f in fields(Run)})
        return CaseResult(run=run, checks=list(ev.checks), state=ev.state)

    def _fail(self, run: Run, error: str, *, message: str | None = None,
              checks: Sequence[CheckResult] = (), reraise: BaseException | None = None,
              chained: bool = True) -> NoReturn:
        """End the case early: record ``run`` with ``error`` (and the ``checks`` made so
        far), then fail the test with ``message`` (default: ``error``) and no traceback,
        or raise ``reraise`` as it is. ``chained=False`` hides the exception being
        handled, for a message that says it all."""
        __tracebackhide__ = True
        self._record(run, checks, error=error)
        if reraise is not None:
            raise reraise
        failure = pytest.fail.Exception(message if message is not None else error,
                                        pytrace=False)
        if chained:
            raise failure
        raise failure from None

    def _record(self, run: Run, checks: Sequence[CheckResult], *,
                block: dict[str, Any] | None = None, error: str | None = None,
                baseline: Block | None = None) -> None:
        """Add the case to the session's report: once per case, from :meth:`_finish`,
        :meth:`_fail` or :meth:`_stuck`."""
        self._session.report.add(CaseRecord(
            nodeid=self._item.nodeid, case_id=self.case.id, platform=self.accelerator.platform,
            run=run.to_json(), checks=list(checks), block=block, case=self.case.to_json(),
            error=error, worker=worker_id(self._item.config),
            baseline=baseline_view(baseline.to_json() if baseline is not None else None),
        ))

    def _gate(self, run: Run, checks: Sequence[CheckResult], baseline: Block | None,
              unstorable: str | None) -> None:
        """Fail the test where the case failed, saying what clears it
        (:mod:`pytest_accelperf.report.failure`)."""
        __tracebackhide__ = True
        nodeid = self._item.nodeid
        accept = self.accept_command()
        if self.settings.update:
            if unstorable is not None:
                pytest.fail(not_recorded(nodeid, unstorable), pytrace=False)
            return
        failed = [c for c in checks if c.failed]
        if failed:
            message = failure_message(nodeid, self.accelerator.platform, failed,
                                      has_baseline=baseline is not None,
                                      unstorable=unstorable, accept=accept,
                                      report=self.settings.json)
            explained = run.explain
            if explained:
                message += f"\nProfiler {explained['note']}"
            pytest.fail(message, pytrace=False)
        if baseline is None and not self.settings.ab:
            pytest.fail(no_baseline(nodeid, accept), pytrace=False)

    def accept_command(self) -> str:
        """The command that records this case's run as its baseline."""
        return accept_command(self._item.nodeid, target=self.settings.target,
                              accel=self.settings.accel)
