"""Session state behind the ``accelperf`` fixture, and what a case holds while it trains.

``AccelperfSession`` lives under a ``StashKey`` on the config (one per process: the
controller and each xdist worker have their own): the settings, the report every case is
recorded in, the baseline stores, the backends, the A/B setup. The case pipeline itself,
``CaseRunner``, is in :mod:`pytest_accelperf.gate.runner`. Here too: the host lock a CPU case
trains under (:func:`exclusive_host`) and how to say something while a test runs.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from pytest_accelperf.ab.rounds import Comparison
from pytest_accelperf.backends.registry import BackendRegistry
from pytest_accelperf.checks.recordable import shared_unchanged
from pytest_accelperf.checks.scaling import ScalingCollector
from pytest_accelperf.gate.hangs import host_lock
from pytest_accelperf.gate.options import Settings
from pytest_accelperf.provision.accel import Accelerator
from pytest_accelperf.provision.device_errors import DeviceError
from pytest_accelperf.provision.xdist_role import is_worker
from pytest_accelperf.records.environment import Environment
from pytest_accelperf.report.data import SessionReport
from pytest_accelperf.store.baselines import BaselineError, BaselineStore
from pytest_accelperf.store.machines import default_machine


@dataclass
class AccelperfSession:
    settings: Settings
    config: pytest.Config
    report: SessionReport = field(default_factory=SessionReport)
    accelerator: Accelerator | None = None
    environment: Environment = field(default_factory=lambda: Environment.from_json({}))
    scaling: ScalingCollector = field(default_factory=ScalingCollector)
    _stores: dict[tuple[Path, str], BaselineStore] = field(default_factory=dict)
    _comparison: Comparison | None = None
    #: Ends the process after a case got stuck where it cannot be interrupted (set by the
    #: plugin: writes what was recorded, says why, exits); called from a watchdog thread.
    abort: Callable[[str], None] | None = None
    #: The case whose CUDA error (a sticky one) broke this process's device context, and
    #: that error: later in-process cases fail at once
    #: (:mod:`pytest_accelperf.provision.device_errors`).
    broken_device: tuple[str, DeviceError] | None = None

    def comparison(self) -> Comparison:
        """The session's A/B setup (``--accelperf-compare``, ``--accelperf-compare-python``),
        made on first use."""
        if self._comparison is None:
            s = self.settings
            self._comparison = Comparison(s.compare, self.config.rootpath, s.accel,
                                          s.cpu_devices, s.platform,
                                          processes=s.compare_pairs,
                                          python=s.compare_python,
                                          notify=functools.partial(say, self.config),
                                          prepare_timeout=s.compare_prepare_timeout,
                                          hook_packages=self._hook_packages())
        return self._comparison

    def _hook_packages(self) -> list[str]:
        """The packages the ``pytest_accelperf_environment`` hook added to the session's
        environment: those no backend declares."""
        packages = self.environment.to_json().get("packages")
        known = self.backends().packages()
        return sorted(k for k in (packages if isinstance(packages, dict) else {})
                      if k not in known)

    def backends(self) -> BackendRegistry:
        """The backends of this session: what every ``pytest_accelperf_backends``
        implementation returns, the built-in ones (:mod:`.backends.builtin`) and those of
        the conftests loaded so far. Asked afresh each time (a conftest deeper in the tree
        loads during collection); a registration that cannot be used raises
        :class:`~pytest_accelperf.backends.spec.BackendSpecError`."""
        return BackendRegistry.from_hook(
            self.config.hook.pytest_accelperf_backends(config=self.config))

    def close(self, *, interrupted: bool = False) -> Path | None:
        """Stop what the session started (A/B workers). After an interrupt, their output
        is kept: the folder it is in is returned."""
        kept = None
        if self._comparison is not None:
            kept = self._comparison.close(keep_logs=interrupted)
            self._comparison = None
        return kept

    @property
    def machine(self) -> str:
        """The machine whose timing this session judges and records
        (``--accelperf-machine``, else the default name of the host its environment
        names: :func:`pytest_accelperf.store.machines.default_machine`)."""
        if self.settings.machine:
            return self.settings.machine
        env = self.environment.to_json() or self.report.environment.to_json()
        return default_machine(env)

    def store(self, platform: str) -> BaselineStore:
        key = (self.settings.baselines, platform)
        if key not in self._stores:
            self._stores[key] = BaselineStore(self.settings.baselines, platform)
        return self._stores[key]

    def blocks_to_write(self) -> dict[str, dict[str, Mapping[str, object]]]:
        """``{platform: {nodeid: block}}`` of the cases whose baselines should be written."""
        out: dict[str, dict[str, Mapping[str, object]]] = {}
        for record in self.report.records:
            if record.block is not None:
                out.setdefault(record.platform, {})[record.nodeid] = record.block
        return out

    def write_baselines(self) -> None:
        """Write the collected blocks, once, on the controller, each as the machine's it
        names (the session's, :attr:`machine`; an ingested log's own): a case whose shared
        sections were judged unchanged (or that added a session) writes only
        this machine's timing into a block another machine recorded
        (:func:`pytest_accelperf.store.machines.merge`)."""
        timing_only = {r.nodeid for r in self.report.records if r.block is not None and (
            self.settings.add_session or shared_unchanged(r.checks))}
        for platform, blocks in sorted(self.blocks_to_write().items()):
            try:
                paths = self.store(platform).write(blocks, timing_only=timing_only)
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


def exclusive_host(accelerator: Accelerator, *, case: str = "", timeout: float | None = None,
                   notify: Callable[[str], None] | None = None,
                   hold_timeout: float | None = None) -> AbstractContextManager[object]:
    """A host-wide lock around the training of a case where devices share the host's cores.

    Virtual CPU devices are not independent hardware: two xdist workers (or two sessions)
    training at once would each measure half a machine, and their step times would not be
    comparable with a baseline recorded alone. So on ``cpu`` cases train one at a time per
    host; on GPUs and TPUs each worker owns its devices and no lock is taken, and neither
    for a compile-only target (``--accelperf-target``), which times no step: its compile
    time is judged with the load other processes put on the machine meanwhile
    (:mod:`pytest_accelperf.checks.compile_time`). A wait says whom it waits for and ends
    after ``timeout`` seconds, at once where the holder is known to be stuck;
    ``hold_timeout`` is the most this holder keeps it (the case's timeout, that a waiter
    judges it by; None: not bounded) (:func:`pytest_accelperf.gate.hangs.host_lock`).
    """
    if accelerator.name != "cpu":
        return contextlib.nullcontext()
    return host_lock(case or f"pid {os.getpid()}", timeout, notify or say_on_stderr,
                     hold_timeout=hold_timeout)


def say_on_stderr(text: str) -> None:
    """Write ``text`` as one line on stderr, now."""
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


def say(config: pytest.Config, text: str) -> None:
    """Show ``text`` on a line of its own now, while a test runs: on pytest's terminal
    (output capture suspended), or on stderr where there is no terminal reporter (an
    xdist worker)."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    capture = config.pluginmanager.get_plugin("capturemanager")
    with (capture.global_and_fixture_disabled() if capture is not None
          else contextlib.nullcontext()):
        if reporter is None or is_worker(config):
            say_on_stderr(text)
        else:
            reporter.ensure_newline()
            reporter.write_line(text, yellow=True)



