"""The ``external`` backend: cases whose runs are measured outside the plugin.

A case declared with ``backend="external"`` is checked from a log through
``accelperf.ingest(path_or_command, parser=...)`` (:mod:`pytest_accelperf.ingest`); it
imports no framework, so it never skips for one. ``accelperf.train`` has nothing to train.
"""

from __future__ import annotations

from pytest_accelperf.backends.protocol import Fit, Task, TrainResult
from pytest_accelperf.collect.cases import Case
from pytest_accelperf.provision.accel import Accelerator

_HOW = ("backend 'external' measures nothing itself: check the case with "
        "accelperf.ingest(path_or_command, parser=...)")


class ExternalBackend:
    name = "external"

    def unavailable_reason(self) -> str | None:
        return None

    def train(self, case: Case, task: Task, accel: Accelerator, *,
              timeout: float | None = None) -> TrainResult:
        raise TypeError(f"{case.id}: {_HOW}")

    def fits(self, case: Case, task: Task, accel: Accelerator, *,
             timeout: float | None = None) -> Fit:
        raise TypeError(f"{case.id}: {_HOW}; it has no maximum batch to search")


BACKEND = ExternalBackend()
