"""Reports: the session's data (data.py) and its renderings (terminal, JSON)."""

from pytest_accelperf.report.data import CaseRecord, SessionReport

__all__ = ["CaseRecord", "SessionReport"]
