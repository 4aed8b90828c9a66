"""What a check inherits: :class:`BaseCheck`, the defaults of the
:class:`~pytest_accelperf.checks.protocol.Check` protocol, which a check overrides where it
differs. (What a check gives, its :class:`~pytest_accelperf.records.verdict.CheckResult`
and :class:`~pytest_accelperf.records.verdict.Verdict`, are records:
:mod:`pytest_accelperf.records.verdict`.)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

from pytest_accelperf.checks.protocol import CheckInput, Kind, SubRow
from pytest_accelperf.records.run import Run
from pytest_accelperf.records.verdict import CheckResult


class BaseCheck:
    """The defaults of :class:`Check`: no tolerance, no section, cleared by a baseline,
    deterministic, the metric as its label, no rows of its own. A check subclasses it, sets
    what differs and writes :meth:`check`."""

    metric: str = ""
    tolerances: tuple[str, ...] = ()
    sections: tuple[str, ...] = ()
    section_models: Mapping[str, Any] = MappingProxyType({})
    cleared_by_a_baseline: bool = True
    #: The sentence of :meth:`not_cleared` where a baseline does not clear a failure.
    uncleared: str = ""
    kind: Kind = "deterministic"

    def check(self, given: CheckInput) -> Sequence[CheckResult]:
        return ()

    def record(self, run: Run) -> Mapping[str, object]:
        return {}

    def not_cleared(self, result: CheckResult) -> str | None:
        return None if self.cleared_by_a_baseline else self.uncleared

    def refuses_recording(self, result: CheckResult) -> str | None:
        return None

    def label(self, result: CheckResult) -> str:
        return result.metric

    def adjusted(self, result: CheckResult) -> bool:
        return False

    def sub_rows(self, result: CheckResult) -> Sequence[SubRow]:
        return ()

    def __repr__(self) -> str:
        return f"<check {self.metric}>"
