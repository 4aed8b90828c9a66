"""Reports: the session data (data.py); terminal, Markdown, JUnit, HTML and history views."""

from pytest_accelperf.report.data import CaseRecord, SessionReport

__all__ = ["CaseRecord", "SessionReport"]
