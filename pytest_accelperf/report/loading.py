"""Reading a saved ``--accelperf-json`` report back, with errors that name the fix."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pytest_accelperf.report.data import REPORT_SCHEMA_VERSION, SessionReport

_WRITE_ONE = "write one with pytest --accelperf-json=PATH"


class ReportFileError(Exception):
    """A report file that cannot be used; the message names the file and the fix."""


def load_report(path: Path) -> tuple[SessionReport, dict[str, Any]]:
    """The report in ``path`` and its raw JSON (for fields the data classes do not keep)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ReportFileError(f"{path}: no such report; {_WRITE_ONE}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ReportFileError(f"{path}: cannot read the report: {exc}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ReportFileError(
            f"{path}:{exc.lineno}:{exc.colno}: corrupt JSON report ({exc.msg}); pass the file "
            f"that pytest --accelperf-json wrote (a truncated CI artifact? download it again)"
        ) from None
    if not isinstance(data, dict) or not isinstance(data.get("cases"), list):
        raise ReportFileError(f"{path}: not an accelperf JSON report (no 'cases' list); "
                              f"{_WRITE_ONE}")
    version = data.get("schema_version")
    if version != REPORT_SCHEMA_VERSION:
        raise ReportFileError(f"{path}: report schema_version is {version!r}, this "
                              f"pytest-accelperf reads {REPORT_SCHEMA_VERSION}; re-run the "
                              f"session with this version, or use the matching one")
    for i, case in enumerate(data["cases"]):
        missing = [k for k in ("nodeid", "case_id", "platform", "run", "checks")
                   if not isinstance(case, dict) or k not in case]
        if missing:
            name = case.get("nodeid", f"#{i}") if isinstance(case, dict) else f"#{i}"
            raise ReportFileError(f"{path}: case {name} lacks {', '.join(missing)}; the "
                                  f"report was edited or truncated: {_WRITE_ONE}")
    try:
        report = SessionReport.from_json(data)
    except (KeyError, TypeError, ValueError) as exc:
        raise ReportFileError(f"{path}: malformed case in the report ({exc!r}); "
                              f"{_WRITE_ONE}") from None
    return report, data
