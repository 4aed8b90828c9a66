"""Reports: the session data (data.py); terminal, Markdown, JUnit, HTML and history views."""

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pytest_accelperf.report.data import CaseRecord, SessionReport

#: The session data is imported when first asked for, not by every import of a module of
#: this package: ``report.data`` brings the check table, the checks and numpy (0.25 s), which
#: neither ``backends.measure.progress`` nor ``accelperf``'s parser (``report.detection``) needs.
_LAZY = {"CaseRecord": "pytest_accelperf.report.data",
         "SessionReport": "pytest_accelperf.report.data"}


def __getattr__(name: str) -> object:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'pytest_accelperf.report' has no attribute {name!r}")


__all__ = ["CaseRecord", "SessionReport"]
