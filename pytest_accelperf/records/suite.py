"""The session as one verdict, as JSON: what :class:`pytest_accelperf.checks.family.SuiteVerdict`
writes into a report, declared once. The report's schema makes its models of these
(:mod:`pytest_accelperf.store.schema`: ``ReportSuite`` and the models inside it), so that
the writer and the reader cannot drift apart.
"""

from __future__ import annotations

from typing import TypedDict


class TestedJson(TypedDict):
    """:meth:`pytest_accelperf.checks.family.Tested.to_json` (read back as
    :class:`pytest_accelperf.store.schema.ReportTested`)."""

    nodeid: str
    metric: str
    ratio: float
    ci: list[float]
    confidence: float
    df: int | None
    p_value: float
    q_value: float


class TallyJson(TypedDict):
    """:meth:`pytest_accelperf.checks.family.Tally.to_json` (read back as
    :class:`pytest_accelperf.store.schema.ReportTally`)."""

    checks: int
    regressions: int
    by_metric: dict[str, int]


class StatisticalJson(TypedDict):
    """The ``statistical`` part of :meth:`pytest_accelperf.checks.family.SuiteVerdict.to_json`."""

    checks: int
    set_aside: int
    regressions: int
    expected_false: float
    at_least: int
    p_at_least: float
    fdr: float
    held: list[TestedJson]
    not_held: list[TestedJson]


class SuiteJson(TypedDict):
    """:meth:`pytest_accelperf.checks.family.SuiteVerdict.to_json` (read back as
    :class:`pytest_accelperf.store.schema.ReportSuite`)."""

    cases: int
    regressed: int
    statistical: StatisticalJson
    other_timing: TallyJson
    deterministic: TallyJson
