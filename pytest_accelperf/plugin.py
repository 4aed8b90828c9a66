"""pytest entry point: options, markers, parametrization, fixtures, and the session hooks.

Flow: ``pytest_configure`` resolves the settings and sets the device environment before
any framework initializes; ``pytest_generate_tests`` turns ``@cases`` into items;
the ``accelerator`` fixture provisions devices once per process; the ``accelperf`` fixture
trains and checks; ``pytest_sessionfinish`` hands worker results to the controller (xdist)
or writes baselines and the JSON report; ``pytest_terminal_summary`` prints the table.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import sys
from collections.abc import Generator, Iterator
from typing import TYPE_CHECKING

import pytest

from pytest_accelperf import hookspecs
from pytest_accelperf.ab.arms import plugin_root
from pytest_accelperf.ab.tree import RevisionError, resolve, toplevel
from pytest_accelperf.backends import builtin
from pytest_accelperf.backends.measure import progress
from pytest_accelperf.backends.procs import rank_pool
from pytest_accelperf.backends.registry import BackendRegistry
from pytest_accelperf.backends.spec import BackendSpecError
from pytest_accelperf.checks.protocol import Check
from pytest_accelperf.checks.table import register, unregister
from pytest_accelperf.cluster import session as ray_session
from pytest_accelperf.collect.cases import MARKER, Case
from pytest_accelperf.envs import EnvError
from pytest_accelperf.envs.stack import check_python
from pytest_accelperf.errors import UserError, render
from pytest_accelperf.gate.options import Settings, add_options
from pytest_accelperf.gate.outputs import OUTPUT_LINES_KEY, write_json, write_outputs
from pytest_accelperf.gate.runner import CaseRunner
from pytest_accelperf.gate.session import AccelperfSession
from pytest_accelperf.provision.accel import (
    Accelerator,
    AcceleratorUnavailable,
    assign_worker_devices,
    jax_initialized_too_early,
    prepare_environment,
    provision,
)
from pytest_accelperf.provision.describe import environment
from pytest_accelperf.provision.targets import (
    TargetError,
    libtpu_missing,
    parse_target,
    provision_target,
)
from pytest_accelperf.provision.xdist_role import (
    WorkerData,
    XdistNode,
    is_worker,
    worker_count,
    worker_id,
)
from pytest_accelperf.records.environment import Environment
from pytest_accelperf.report.data import CaseRecord
from pytest_accelperf.report.html import ReportDependencyError, require_vega
from pytest_accelperf.report.junit import add_suite_properties, junit_properties
from pytest_accelperf.report.terminal import table_lines
from pytest_accelperf.report.writing import stream_fd
from pytest_accelperf.stats.contention import ROOT_ENV
from pytest_accelperf.store.baselines import BaselineError, validate_platform

if TYPE_CHECKING:
    from _pytest.terminal import TerminalReporter

SESSION_KEY = pytest.StashKey[AccelperfSession]()
_WORKER_KEY = "accelperf"


def pytest_addoption(parser: pytest.Parser) -> None:
    add_options(parser)


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    pluginmanager.add_hookspecs(hookspecs)




def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(cases): training cases of a test; use pytest_accelperf.cases(...) to set it",
    )
    # The built-in backends come in through pytest_accelperf_backends, as a conftest's do.
    if not config.pluginmanager.is_registered(builtin):
        config.pluginmanager.register(builtin, "accelperf-builtin-backends")
    try:
        settings = Settings.resolve(config.getoption, config.getini, config.rootpath,
                                    invocation_dir=config.invocation_params.dir)
    except UserError as exc:  # pytest prints a usage error as one line, exit status 4
        raise pytest.UsageError(render(exc)) from None
    prepare_environment(settings.accel, settings.cpu_devices)
    if settings.compare:
        # The pytest process trains each case once before its A/B workers prepare it, on
        # the same device: JAX's default of taking 75 % of its memory here would leave the
        # workers a quarter of it between them. The controller allocates as it goes too
        # (not its inductor pool: it compiles alone).
        from pytest_accelperf.ab.arms import shared_device_env

        for key, value in shared_device_env(settings.accel, os.environ).items():
            os.environ.setdefault(key, value)
    # What this session starts (ranks, a local Ray cluster) is its own work, not another
    # job's, when a measurement reads the machine's load (each xdist worker its own tree).
    os.environ[ROOT_ENV] = str(os.getpid())
    if is_worker(config):
        assign_worker_devices(settings.accel, worker_id(config), worker_count(config))
    if settings.html is not None and not is_worker(config):
        try:
            require_vega()
        except ReportDependencyError as exc:
            raise pytest.UsageError(f"--accelperf-html: {exc}") from None
    config.stash[SESSION_KEY] = AccelperfSession(settings=settings, config=config,
                                                 abort=functools.partial(_abort, config))


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    """``--accelperf-cluster=local``: the controller starts the session's Ray cluster
    before xdist starts its workers, which all submit to it (see :mod:`.cluster`)."""
    state = session.config.stash.get(SESSION_KEY, None)
    if state is not None:
        try:
            state.backends()  # the conftests loaded so far: a bad registration stops here
        except BackendSpecError as exc:
            raise pytest.UsageError(str(exc)) from None
        _register_checks(session.config)
        settings = state.settings
        if settings.ab:
            if settings.cluster:
                flag = ("--accelperf-compare" if settings.compare
                        else "--accelperf-compare-python")
                raise pytest.UsageError(
                    f"{flag} and --accelperf-cluster cannot be combined: A/B mode "
                    f"alternates two arms on this machine; drop one of them")
            try:
                if settings.compare:  # a bad ref stops here
                    resolve(session.config.rootpath, settings.compare)
                else:  # the working tree's files are copied as git sees them
                    toplevel(session.config.rootpath, "--accelperf-compare-python")
                if settings.compare_python:  # and a Python that cannot run a worker
                    check_python(settings.compare_python, plugin_root())
            except (RevisionError, EnvError) as exc:
                raise pytest.UsageError(str(exc)) from None
        ray_session.session_start(session.config, settings.cluster, is_worker(session.config))


def pytest_collection_finish(session: pytest.Session) -> None:
    _register_checks(session.config)  # those of the conftests collection loaded


#: The checks this session registered (``pytest_accelperf_checks``), removed at its end.
_CHECKS_KEY = pytest.StashKey[list[Check]]()


def _register_checks(config: pytest.Config) -> None:
    """Register in the table of checks what ``pytest_accelperf_checks`` implementations
    return that this session has not registered yet (a conftest deeper in the tree loads
    during collection); a metric another check has is a usage error."""
    mine = config.stash.setdefault(_CHECKS_KEY, [])
    known = {check.metric for check in mine}
    new = [check for found in config.hook.pytest_accelperf_checks(config=config)
           for check in found or () if check.metric not in known]
    try:
        register(*new)
    except ValueError as exc:
        raise pytest.UsageError(f"pytest_accelperf_checks: {exc}") from None
    mine.extend(new)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: XdistNode) -> None:
    """xdist controller: give each worker the address of the session's Ray cluster."""
    ray_session.configure_node(node.config, node)


def pytest_unconfigure(config: pytest.Config) -> None:
    ray_session.session_finish(config)  # a backstop: normally done in pytest_sessionfinish
    rank_pool.close_all()  # the session's warm ranks (multi-process cases) end with it
    if SESSION_KEY in config.stash:
        del config.stash[SESSION_KEY]
    unregister(*config.stash.get(_CHECKS_KEY, []))


def _skip_reason(case: Case, settings: Settings, backends: BackendRegistry) -> str | None:
    """Why ``case`` cannot run here (a framework not installed, another accelerator, a
    compile-only target its backend cannot be compiled for, libtpu missing), or None. An
    unknown backend is not a reason to skip: it is an error in the suite."""
    spec = backends[case.backend]
    reason = spec.unavailable_reason()
    if reason:
        return reason
    target, accel = settings.target, settings.accel
    if target:
        if not spec.compile_only:
            return (f"--accelperf-target={target} compiles JAX cases for a TPU that is not "
                    f"here; backend {case.backend!r} is not compiled ahead of time: run it "
                    f"with --accel")
        if "tpu" not in case.accels:
            return (f"case {case.id} runs on {', '.join(case.accels)} only: not compiled for "
                    f"--accelperf-target={target}")
        if case.world_size > 1:
            return (f"case {case.id} trains in {case.world_size} processes; a compile-only "
                    f"target compiles a one-process case over the slice's devices")
        return libtpu_missing(target)
    if accel != "auto" and accel not in case.accels:
        also = (", or compile it for a TPU on this host with "
                "--accelperf-target=tpu-v5e:2x4 (docs/compile-targets.md)"
                if "tpu" in case.accels and spec.compile_only else "")
        return (f"case {case.id} runs on {', '.join(case.accels)}, not --accel={accel}; "
                f"pass --accel={case.accels[0]}{also}")
    return None


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    marker = metafunc.definition.get_closest_marker(MARKER)
    if marker is None:
        return
    if "accelperf_case" not in metafunc.fixturenames:
        raise pytest.UsageError(
            f"{metafunc.definition.nodeid}: @cases needs the test to use the 'accelperf' fixture"
        )
    session = metafunc.config.stash[SESSION_KEY]
    try:
        backends = session.backends()  # the built-in ones and the conftests' loaded by now
        bad = ""
    except BackendSpecError as exc:  # a conftest below the rootdir's: a collection error
        bad = str(exc)
    if bad:
        pytest.fail(f"{metafunc.definition.nodeid}: {bad}", pytrace=False)
    unknown = sorted({c.backend for c in marker.kwargs["cases"] if c.backend not in backends})
    if unknown:
        # A typo must not pass as a skip with exit status 0: a collection error (exit 2),
        # shown without a traceback.
        pytest.fail(f"{metafunc.definition.nodeid}: unknown backend(s) "
                    f"{', '.join(map(repr, unknown))} in @cases; known: "
                    f"{', '.join(sorted(backends))}", pytrace=False)
    params = []
    for case in marker.kwargs["cases"]:
        reason = _skip_reason(case, session.settings, backends)
        marks = [pytest.mark.skip(reason=reason)] if reason else []
        params.append(pytest.param(case, id=case.id, marks=marks))
    metafunc.parametrize("accelperf_case", params)


@pytest.fixture(scope="session")
def accelerator(pytestconfig: pytest.Config) -> Accelerator:
    """The accelerator of this session (this xdist worker's own devices under ``-n``).

    Gives ``platform`` (``cpu-x8``), ``devices``, ``device_kind``, ``memory_capacity`` and
    ``peak_flops`` where known, and a mesh factory::

        def test_devices(accelerator):
            mesh = accelerator.mesh((4, 2))      # jax.sharding.Mesh, axes ("data", "model")
            assert mesh.size == 8
    """
    session = pytestconfig.stash[SESSION_KEY]
    if session.accelerator is None:
        settings = session.settings
        if settings.accel in ("cpu", "auto"):
            early = jax_initialized_too_early(settings.cpu_devices)
            if early:
                pytest.fail(early, pytrace=False)
        packages = session.backends().packages()
        if settings.target:
            acc = _provision_target(settings.target, settings.platform)
            packages = (*packages, "libtpu")  # its compiler made the program
        else:
            try:
                acc = provision(settings.accel, settings.cpu_devices, settings.platform)
            except AcceleratorUnavailable as exc:
                pytest.skip(str(exc))
        if settings.platform is None:
            custom = pytestconfig.hook.pytest_accelperf_platform(config=pytestconfig,
                                                                 accelerator=acc)
            if custom:
                try:
                    acc.platform = validate_platform(str(custom))
                except BaselineError as exc:
                    pytest.fail(f"the pytest_accelperf_platform hook returned {custom!r}: {exc}",
                                pytrace=False)
        env = environment(acc, packages)
        for extra in pytestconfig.hook.pytest_accelperf_environment(config=pytestconfig,
                                                                    accelerator=acc):
            env = env.with_added(extra or {})
        session.accelerator = acc
        session.environment = env
        session.report.accel = acc.name
        session.report.platform = acc.platform
        session.report.environment = env
        session.report.machine = session.machine
    return session.accelerator


def _provision_target(target: str, platform: str | None) -> Accelerator:
    """The compile-only devices of ``target``; without libtpu the case is skipped with the
    install line; a topology libtpu refuses ends the session (a usage error, one line)."""
    missing = libtpu_missing(target)
    if missing:
        pytest.skip(missing)
    try:
        return provision_target(parse_target(target), platform)
    except TargetError as exc:
        pytest.exit(render(exc), returncode=pytest.ExitCode.USAGE_ERROR)


@pytest.fixture
def accelperf_case() -> Case:
    """The case of the current item; parametrized by ``@cases``."""
    raise pytest.UsageError(
        "the accelperf fixture needs training cases: decorate the test with "
        "@pytest_accelperf.cases(backend=..., batch=[...])"
    )


@pytest.fixture
def accelperf(request: pytest.FixtureRequest, accelperf_case: Case,
              accelerator: Accelerator) -> Iterator[CaseRunner]:
    """Train the current case and check it against its baseline.

    ::

        from pytest_accelperf import cases
        from pytest_accelperf.backends.jax.backend import JaxTask

        @cases(backend="jax", mesh=[None, (4, 2)], batch=[32, 128])
        def test_sweep(accelperf):
            task = JaxTask(init_params=..., loss_fn=..., make_batch=..., optimizer=...)
            result = accelperf.train(task)      # fails the test on a regression
            print(result.run.samples_per_second, result.check("throughput").verdict)
    """
    session = request.config.stash[SESSION_KEY]
    runner = CaseRunner(session, request.node, accelperf_case, accelerator)
    runner.skip_without_devices()  # whichever way the test trains (train, check, a backend)
    yield runner


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A case whose test failed after training is not recorded as a baseline.

    Before the report is built, the case's metrics and verdicts become the item's
    ``user_properties``: pytest's ``--junitxml`` writes them as ``<property>`` entries, and
    under xdist they travel to the controller inside the serialized report.
    """
    if call.when == "call":
        state = item.config.stash.get(SESSION_KEY, None)
        mine = [r for r in state.report.records if r.nodeid == item.nodeid] if state else []
        if mine:
            item.user_properties.extend(junit_properties(mine[-1]))
    report = yield
    if report.failed and call.excinfo is not None and isinstance(call.excinfo.value, UserError):
        report.longrepr = _user_error_line(item.nodeid, call.excinfo.value)
    if report.when == "call" and report.failed:
        state = item.config.stash.get(SESSION_KEY, None)
        for record in state.report.records if state else []:
            if record.nodeid == item.nodeid:
                record.block = None
    return report


def _user_error_line(nodeid: str, exc: BaseException) -> str:
    """A :class:`UserError` as a failure reads: the node, then the error's own line(s)."""
    return f"{nodeid}: {render(exc)}" if nodeid else render(exc)


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(
    collector: pytest.Collector,
) -> Generator[None, pytest.CollectReport, pytest.CollectReport]:
    """A :class:`UserError` raised while collecting (a ``Case`` field, ``@cases`` in a test
    module) is a collection error of one line naming the user's file and line, not a
    traceback through this plugin."""
    report = yield
    call = report.__dict__.get("call")
    excinfo = getattr(call, "excinfo", None)
    if report.failed and excinfo is not None and isinstance(excinfo.value, UserError):
        report.longrepr = _user_error_line(collector.nodeid, excinfo.value)
    return report


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    """Show the progress of a training case on the terminal line while it runs."""
    sink = (progress.terminal_progress(item.config)
            if "accelperf" in getattr(item, "fixturenames", ()) else None)
    if sink is None:
        return (yield)
    with progress.reporting(sink):
        return (yield)


@pytest.hookimpl(tryfirst=True)  # before --junitxml writes its file (suite properties)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    ray_session.session_finish(config)  # every case has trained: stop or disconnect Ray
    state = config.stash.get(SESSION_KEY, None)
    if state is None:
        return
    kept = state.close(interrupted=exitstatus == pytest.ExitCode.INTERRUPTED)  # A/B workers
    if kept is not None:
        terminal = config.pluginmanager.get_plugin("terminalreporter")
        line = (f"accelperf: interrupted during an A/B comparison; what its workers printed "
                f"is kept in {kept}/ (base-<pair>.log, head-<pair>.log)")
        if terminal is not None:
            terminal.write_line(line)
    if is_worker(config):
        workeroutput: WorkerData = getattr(config, "workeroutput")
        workeroutput[_WORKER_KEY] = json.dumps({
            "records": [r.to_json() for r in state.report.records],
            "accel": state.report.accel,
            "platform": state.report.platform,
            "machine": state.report.machine,
            "environment": state.report.environment.to_json(),
        })
        return
    session.exitstatus = _write_results(config, state, session.exitstatus)


def _write_results(config: pytest.Config, state: AccelperfSession, exitstatus: int) -> int:
    """Controller: write the baselines (``--accelperf-update``) and the reports; the exit
    status, made a failure when the session has errors of its own, a report that could not
    be written among them."""
    state.report.update = state.settings.update
    if state.settings.update:
        state.write_baselines()
    report = state.report
    if not (report.records or report.errors):
        return exitstatus
    add_suite_properties(config, report)
    settings = state.settings
    if any(stream_fd(p) in (1, 2) for p in (settings.json, settings.markdown, settings.html)
           if p is not None):
        # A report on pytest's own stdout or stderr starts on a line of its own, not after
        # the progress line's "[100%]" that pytest ends later. ensure_newline() alone does
        # not do it after a line of ours (say(): a wait for the host lock) was written
        # mid-run: the reporter then believes its line was ended, and the progress of the
        # tests after it was left open; the writer knows what is on its line.
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.ensure_newline()
            writer = config.get_terminal_writer()
            if writer.width_of_current_line:
                writer.line()
    with _capture_suspended(config):
        lines = write_outputs(report, settings, config.rootpath)
        if report.errors and exitstatus == pytest.ExitCode.OK:
            exitstatus = pytest.ExitCode.TESTS_FAILED
        if settings.json is not None:
            # Last, with the exit status the session has so far: the report records every
            # other output's failure. If the report itself cannot be written, the session
            # fails below; nothing was written that could disagree with that.
            lines[:0] = write_json(report, settings.json, exitstatus)
    config.stash[OUTPUT_LINES_KEY] = lines
    if report.errors and exitstatus == pytest.ExitCode.OK:
        exitstatus = pytest.ExitCode.TESTS_FAILED
    return exitstatus


@contextlib.contextmanager
def _capture_suspended(config: pytest.Config) -> Iterator[None]:
    """pytest's capture off while the reports are written: a report to ``-``,
    ``/dev/stdout`` or ``/dev/stderr`` is written to descriptor 1 or 2, which must be the
    terminal, pipe or file the session was started with, not the capture's temporary file.
    pytest suspends its global capture between tests, so at the end of the session this
    is a safeguard against a plugin that resumed it."""
    capture = config.pluginmanager.get_plugin("capturemanager")
    if capture is None:  # -p no:capture
        yield
        return
    with capture.global_and_fixture_disabled():
        yield


def _abort(config: pytest.Config, message: str) -> None:
    """End the process after a case got stuck where it cannot be interrupted (called from
    the watchdog thread of :func:`pytest_accelperf.gate.hangs.case_alarm` while the main thread
    is still stuck): say why, write what was recorded (baselines under
    ``--accelperf-update``, the reports, the summary table), exit with status 2
    (interrupted). pytest's own end of session cannot run: its thread is the stuck one."""
    status = pytest.ExitCode.INTERRUPTED
    capture = config.pluginmanager.get_plugin("capturemanager")
    if capture is not None:
        with contextlib.suppress(Exception):  # ending anyway: say what we can
            capture.suspend_global_capture(in_=True)
    lines = [f"accelperf: ERROR: {message}"]
    try:
        state = config.stash.get(SESSION_KEY, None)
        if state is not None and not is_worker(config):
            state.close()
            _write_results(config, state, status)
            lines += table_lines(state.report)
            lines += [f"accelperf: ERROR: {err}" for err in state.report.errors]
            written: list[str] = config.stash.get(OUTPUT_LINES_KEY, [])
            lines.extend(written)
    except Exception as exc:  # ending anyway: say what went wrong
        lines.append(f"accelperf: could not write the reports: {type(exc).__name__}: {exc}")
    finally:
        sys.stderr.write("\n" + "\n".join(lines) + "\n")
        sys.stderr.flush()
        sys.stdout.flush()
        os._exit(int(status))


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: XdistNode, error: object) -> None:
    """xdist controller: merge a worker's runs and verdicts into the session report."""
    state = node.config.stash.get(SESSION_KEY, None)
    payload = getattr(node, "workeroutput", {}).get(_WORKER_KEY)
    if state is None or payload is None:
        if state is not None and error:
            state.report.errors.append(f"xdist worker {node.gateway.id} went down: {error}")
        return
    data = json.loads(payload)
    for raw in data["records"]:
        state.report.add(CaseRecord.from_json(raw))
    report = state.report
    report.accel = report.accel or data["accel"]
    report.platform = report.platform or data["platform"]
    report.machine = report.machine or str(data.get("machine") or "")
    if not report.environment.to_json():
        report.environment = Environment.from_json(data["environment"])


def pytest_terminal_summary(terminalreporter: TerminalReporter, exitstatus: int,
                            config: pytest.Config) -> None:
    state = config.stash.get(SESSION_KEY, None)
    if state is None or is_worker(config):
        return
    lines = table_lines(state.report)
    if not lines and not state.report.errors:
        return
    terminalreporter.write_sep("=", "accelperf")
    for line in lines:
        terminalreporter.write_line(line)
    for err in state.report.errors:
        terminalreporter.write_line(f"accelperf: ERROR: {err}", red=True)
    for line in config.stash.get(OUTPUT_LINES_KEY, []):
        terminalreporter.write_line(line)
