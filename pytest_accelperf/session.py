"""Session state and the per-case runner behind the ``accelperf`` fixture.

``AccelperfSession`` lives under a ``StashKey`` on the config (one per process: the
controller and each xdist worker have their own). ``CaseRunner`` is the thin object a test
receives: it trains the case through its backend, checks the run against the stored
baseline, records the result, and fails the test with a message that names the fix.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import warnings
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from filelock import FileLock

from pytest_accelperf.accel import Accelerator
from pytest_accelperf.backends.base import TrainResult, get_backend
from pytest_accelperf.baselines import BaselineError, BaselineStore
from pytest_accelperf.cases import Case
from pytest_accelperf.checks import run_checks
from pytest_accelperf.checks.base import CheckResult, Verdict
from pytest_accelperf.fingerprint import differences
from pytest_accelperf.options import Settings
from pytest_accelperf.report.data import CaseRecord, SessionReport
from pytest_accelperf.run import Run
from pytest_accelperf.summary import summarize

#: Outcomes never stored as a baseline: they are failures, not expectations.
_UNRECORDABLE = ("nan", "error", "timeout")


class AccelperfWarning(UserWarning):
    """A warning of pytest-accelperf (e.g. a baseline from another environment)."""


@dataclass
class AccelperfSession:
    settings: Settings
    config: pytest.Config
    report: SessionReport = field(default_factory=SessionReport)
    accelerator: Accelerator | None = None
    environment: dict[str, Any] = field(default_factory=dict)
    _stores: dict[tuple[Path, str], BaselineStore] = field(default_factory=dict)

    def store(self, platform: str) -> BaselineStore:
        key = (self.settings.baselines, platform)
        if key not in self._stores:
            self._stores[key] = BaselineStore(self.settings.baselines, platform)
        return self._stores[key]

    def blocks_to_write(self) -> dict[str, dict[str, dict[str, Any]]]:
        """``{platform: {nodeid: block}}`` of the cases whose baselines should be written."""
        out: dict[str, dict[str, dict[str, Any]]] = {}
        for record in self.report.records:
            if record.block is not None:
                out.setdefault(record.platform, {})[record.nodeid] = record.block
        return out

    def write_baselines(self) -> None:
        """Write the collected blocks, once, on the controller."""
        for platform, blocks in sorted(self.blocks_to_write().items()):
            try:
                paths = self.store(platform).write(blocks)
            except BaselineError as exc:
                self.report.errors.append(str(exc))
                continue
            rootdir = self.config.rootpath
            for p in paths:
                try:
                    shown = str(p.relative_to(rootdir))
                except ValueError:
                    shown = str(p)
                self.report.written.append(shown)


@dataclass
class CaseResult:
    """What ``accelperf.train`` returns: the run and the verdicts of its checks."""

    run: Run
    checks: list[CheckResult]

    def check(self, metric: str) -> CheckResult:
        for c in self.checks:
            if c.metric == metric:
                return c
        raise KeyError(f"no {metric!r} check; have {[c.metric for c in self.checks]}")


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

    @property
    def settings(self) -> Settings:
        return self._session.settings

    def train(self, task: Any) -> CaseResult:
        """Train ``task`` (e.g. a ``JaxTask``) as this case, check it, and gate on it."""
        __tracebackhide__ = True
        backend = get_backend(self.case.backend).load()
        try:
            with exclusive_host(self.accelerator):
                result = backend.train(self.case, task, self.accelerator)
        except Exception as exc:
            run = Run(case_id=self.case.id, outcome="error",
                      message=f"{type(exc).__name__}: {exc}",
                      environment=self._session.environment)
            self._record(run, [], error=run.message)
            raise
        return self.check(result)

    def check(self, result: TrainResult) -> CaseResult:
        """Check a finished run against the baseline and fail the test on a regression."""
        __tracebackhide__ = True
        session, case = self._session, self.case
        run = result.run
        run.environment = dict(session.environment)
        block = summarize(run)
        nodeid = self._item.nodeid
        platform = self.accelerator.platform
        try:
            baseline = session.store(platform).get(nodeid)
        except BaselineError as exc:
            # Report the run (nothing lost) but never store over a broken file.
            self._record(run, [], error=str(exc))
            pytest.fail(str(exc), pytrace=False)
        diffs = (differences(run.environment, baseline["environment"], case.backend)
                 if baseline else [])
        tol = self.settings.tolerances.merged(dict(case.tolerances))
        checks = run_checks(run, block, baseline, tol, comparable=not diffs,
                            reference_params=result.reference_params, params=result.params)
        if diffs:
            note = "; ".join(diffs)
            for c in checks:
                if c.verdict is Verdict.INCOMPARABLE and c.metric == "throughput":
                    c.detail = f"baseline recorded in another environment ({note})"
            warnings.warn(AccelperfWarning(
                f"{nodeid}: baseline from another environment ({note}); throughput not "
                f"compared, other checks still apply. Re-record on this machine with "
                f"--accelperf-update"), stacklevel=2)
        for extra in self._item.config.hook.pytest_accelperf_extra_checks(
                run=run, block=block, baseline=baseline, tolerances=tol):
            checks.extend(extra or [])
        storable = run.outcome not in _UNRECORDABLE
        self._record(run, checks, block=block if self.settings.update and storable else None)
        self._gate(run, checks, baseline, storable)
        return CaseResult(run=run, checks=checks)

    def _record(self, run: Run, checks: list[CheckResult], *, block: dict[str, Any] | None = None,
                error: str | None = None) -> None:
        self._session.report.add(CaseRecord(
            nodeid=self._item.nodeid, case_id=self.case.id, platform=self.accelerator.platform,
            run=run.to_json(), checks=checks, block=block, case=self.case.to_json(),
            error=error, worker=_worker_id(self._item.config),
        ))

    def _gate(self, run: Run, checks: list[CheckResult], baseline: dict[str, Any] | None,
              storable: bool) -> None:
        __tracebackhide__ = True
        accept = self.accept_command()
        if self.settings.update:
            if not storable:
                pytest.fail(f"{self._item.nodeid}: not recorded as a baseline: {run.message}",
                            pytrace=False)
            return
        failed = [c for c in checks if c.failed]
        if failed:
            lines = [f"{self._item.nodeid}: {len(failed)} regression(s) against the "
                     f"{self.accelerator.platform} baseline:"]
            lines += [f"  {c.metric}: {c.detail}" for c in failed]
            lines.append(f"If this change is intended, accept it with:\n  {accept}")
            pytest.fail("\n".join(lines), pytrace=False)
        if baseline is None:
            pytest.fail(
                f"{self._item.nodeid}: no baseline; run with --accelperf-update to record it:\n"
                f"  {accept}", pytrace=False)

    def accept_command(self) -> str:
        accel = self.settings.accel
        return f"pytest '{self._item.nodeid}' --accel={accel} --accelperf-update"


def exclusive_host(accelerator: Accelerator) -> AbstractContextManager[object]:
    """A host-wide lock around the training of a case where devices share the host's cores.

    Virtual CPU devices are not independent hardware: two xdist workers (or two sessions)
    training at once would each measure half a machine, and their step times would not be
    comparable with a baseline recorded alone. So on ``cpu`` cases train one at a time per
    host; on GPUs and TPUs each worker owns its devices and no lock is taken.
    """
    if accelerator.name != "cpu":
        return contextlib.nullcontext()
    path = os.path.join(tempfile.gettempdir(), "accelperf-cpu-host.lock")
    return FileLock(path)


def _worker_id(config: pytest.Config) -> str:
    workerinput = getattr(config, "workerinput", None)
    return str(workerinput["workerid"]) if workerinput else "main"
