"""Hooks other plugins and conftest files can implement to extend pytest-accelperf."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pytest_accelperf.backends.spec import BackendSpec
    from pytest_accelperf.checks.protocol import Check
    from pytest_accelperf.provision.accel import Accelerator
    from pytest_accelperf.records.jsonvalue import JSONValue
    from pytest_accelperf.records.run import Run
    from pytest_accelperf.records.verdict import CheckResult, Tolerances
    from pytest_accelperf.store.block import Block


def pytest_accelperf_backends(config: pytest.Config) -> list[BackendSpec] | None:
    """Return the backends this conftest or plugin adds: a list of ``BackendSpec``.

    Every implementation's list is registered (the built-in backends come in the same way,
    from ``pytest_accelperf.backends.builtin``); a name registered twice differently is a
    usage error. Cases name a backend by its spec's ``name``::

        # conftest.py
        from pytest_accelperf.backends import BackendSpec

        def pytest_accelperf_backends(config):
            return [BackendSpec("numpy-sgd", module="numpy_sgd", requires=("numpy",),
                                install="pip install numpy", packages=("numpy",))]

    ``module`` names the module whose ``BACKEND`` trains (imported only when a case
    trains). A backend given as an object instead (``BackendSpec("numpy-sgd",
    backend=NumpySGD())``) trains in pytest's own processes (xdist workers included) but
    not on a Ray cluster or in A/B mode, whose workers import backends by module.
    """


@pytest.hookspec(firstresult=True)
def pytest_accelperf_platform(config: pytest.Config, accelerator: Accelerator) -> str | None:
    """Return the platform key baselines are stored under, or None for the default.

    Use it to share baselines between machines you know to be equivalent::

        # conftest.py
        def pytest_accelperf_platform(config, accelerator):
            if accelerator.device_kind.startswith("TPU v5"):
                return f"tpu-v5-x{accelerator.device_count}"
    """


def pytest_accelperf_environment(config: pytest.Config,
                                 accelerator: Accelerator) -> dict[str, JSONValue] | None:
    """Return extra entries for the environment fingerprint stored with baselines.

    Entries under ``packages`` take part in the throughput comparability check::

        # conftest.py
        def pytest_accelperf_environment(config, accelerator):
            return {"packages": {"libtpu": "0.0.21"}, "driver": "550.54"}
    """


def pytest_accelperf_checks(config: pytest.Config) -> list[Check] | None:
    """Return the checks this conftest or plugin adds: objects of the ``Check`` protocol
    (:mod:`pytest_accelperf.checks.protocol`; subclass ``BaseCheck`` for its defaults).

    They run after the built-in ones, for every case, and are everything a built-in check
    is: a row of the terminal table, a result in the reports, their ``record(run)``
    stored in the baseline block (validated by their ``section_models``), their failures
    judged, cleared by a baseline or not, and counted in the suite's verdict as they say.
    Registered for the session (:func:`pytest_accelperf.checks.table.register`); a metric
    that another check has is a usage error::

        # conftest.py
        from pytest_accelperf.checks import BaseCheck, CheckResult, Verdict

        class StepCount(BaseCheck):
            metric = "steps"
            sections = ("loss",)

            def check(self, given):
                # given.block and given.baseline are typed (pytest_accelperf.store.block.Block)
                if given.block.loss is None or given.baseline is None \
                        or given.baseline.loss is None:
                    return ()
                now, base = given.block.loss.steps, given.baseline.loss.steps
                verdict = Verdict.PASS if now == base else Verdict.REGRESSION
                return (CheckResult("steps", verdict, f"{now} steps, baseline {base}",
                                    baseline=base, now=now),)

        def pytest_accelperf_checks(config):
            return [StepCount()]
    """


def pytest_accelperf_extra_checks(run: Run, block: Block, baseline: Block | None,
                                  tolerances: Tolerances) -> list[CheckResult] | None:
    """Return additional checks of a run against its baseline block (a metric of your own;
    for a check with a section of the baseline block and a say in the table, see
    ``pytest_accelperf_checks``).

    ``block`` is what will be stored for this run; ``baseline`` the stored one (or None).
    Both are typed, as the checks of ``pytest_accelperf_checks`` read them
    (:class:`pytest_accelperf.store.block.Block`: ``block.compile_time``,
    ``baseline.step_time.median``; ``to_json()`` gives a block as JSON).
    A returned ``CheckResult`` with verdict ``regression`` fails the case::

        # conftest.py
        from pytest_accelperf import CheckResult, Verdict

        def pytest_accelperf_extra_checks(run, block, baseline, tolerances):
            if run.compile_time and run.compile_time > 60:
                return [CheckResult("compile_time", Verdict.REGRESSION,
                                    f"compile took {run.compile_time:.0f} s", now=run.compile_time,
                                    unit="s")]
            return None
    """
