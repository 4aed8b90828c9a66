"""Hooks other plugins and conftest files can implement to extend pytest-accelperf."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from pytest_accelperf.accel import Accelerator
    from pytest_accelperf.checks.base import CheckResult, Tolerances
    from pytest_accelperf.run import Run


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
                                 accelerator: Accelerator) -> dict[str, Any] | None:
    """Return extra entries for the environment fingerprint stored with baselines.

    Entries under ``packages`` take part in the throughput comparability check::

        # conftest.py
        def pytest_accelperf_environment(config, accelerator):
            return {"packages": {"libtpu": "0.0.21"}, "driver": "550.54"}
    """


def pytest_accelperf_extra_checks(run: Run, block: dict[str, Any],
                                  baseline: dict[str, Any] | None,
                                  tolerances: Tolerances) -> list[CheckResult] | None:
    """Return additional checks of a run against its baseline block (a metric of your own).

    ``block`` is what will be stored for this run; ``baseline`` the stored one (or None).
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
