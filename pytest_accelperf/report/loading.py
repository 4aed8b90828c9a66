"""Reading a saved ``--accelperf-json`` report back, with errors that name the fix.

The report is validated by its schema (:class:`pytest_accelperf.store.schema.ReportFile`); an
error names the file, the line, the case and the field.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError

from pytest_accelperf.errors import UserError
from pytest_accelperf.records.jsonvalue import JSONValue
from pytest_accelperf.report.data import REPORT_SCHEMA_VERSION, CaseRecord, SessionReport
from pytest_accelperf.store import jsonfile
from pytest_accelperf.store.schema import ReportFile, error_lines, validate_block

_WRITE_ONE = "write one with pytest --accelperf-json=PATH"


class ReportFileError(UserError):
    """A report file that cannot be used; the message names the file and the fix."""


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ReportFileError(f"{path}: no such report; {_WRITE_ONE}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ReportFileError(f"{path}: cannot read the report: {exc}") from None


def load_report(path: Path) -> tuple[SessionReport, dict[str, JSONValue]]:
    """The report in ``path`` and its raw JSON (for fields the data classes do not keep)."""
    text = _read(path)
    try:
        data = jsonfile.loads(text)
    except jsonfile.JsonFileError as exc:
        raise ReportFileError(
            f"{path}:{exc.line}:{exc.column}: corrupt JSON report ({exc.msg}); pass the file "
            f"that pytest --accelperf-json wrote (a truncated CI artifact? download it again)"
        ) from None
    if not isinstance(data, dict) or not isinstance(data.get("cases"), list):
        raise ReportFileError(f"{path}: not an accelperf JSON report (no 'cases' list); "
                              f"{_WRITE_ONE}")
    version = data.get("schema_version")
    if version != REPORT_SCHEMA_VERSION or type(version) is not int:
        raise ReportFileError(f"{path}: report schema_version is {version!r}, this "
                              f"pytest-accelperf reads {REPORT_SCHEMA_VERSION}; re-run the "
                              f"session with this version, or use the matching one")
    try:
        ReportFile.model_validate(data)
    except ValidationError as exc:
        raise ReportFileError(_describe(path, text, data, exc)) from None
    try:
        report = SessionReport.from_json(data)
    except (KeyError, TypeError, ValueError) as exc:
        raise ReportFileError(f"{path}: malformed case in the report ({exc!r}); "
                              f"{_WRITE_ONE}") from None
    return report, data


def _describe(path: Path, text: str, data: dict[str, Any], exc: ValidationError) -> str:
    """The first invalid case (or field) of a report: file, line, case, fields, fix."""
    lines = error_lines(exc)
    loc = lines[0][0]
    line = jsonfile.locate(text, loc)
    where = ""
    if len(loc) >= 2 and loc[0] == "cases" and isinstance(loc[1], int):
        case = data["cases"][loc[1]]
        name = case.get("nodeid") if isinstance(case, dict) else None
        where = f"case {name if isinstance(name, str) else f'#{loc[1]}'}"
        missing = [str(err["loc"][2]) for err in exc.errors()
                   if err["type"] == "missing" and len(err["loc"]) == 3
                   and err["loc"][:2] == loc[:2]]
        if missing:
            return (f"{path}:{line}: {where} lacks {', '.join(missing)}; the report was "
                    f"edited or truncated: {_WRITE_ONE}")
        lines = [(at[2:] if at[:2] == loc[:2] else at, m) for at, m in lines]
        where += ": "
    shown = "; ".join(f"{jsonfile.field_path(at) or 'the case'}: {m}" if at else m
                      for at, m in lines)
    return (f"{path}:{line}: {where}{shown}; the report was edited or written by another "
            f"version: {_WRITE_ONE}")


def case_line(path: Path, index: int) -> int:
    """The line of the ``index``-th case of the report at ``path`` (for error messages)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return 1
    return jsonfile.locate(text, ["cases", index])


def check_stored_block(path: Path, index: int, record: CaseRecord) -> None:
    """A :class:`ReportFileError` naming the report, the line and the case where the block
    that the report's ``index``-th case stored (``record.block``) is not one the schema
    accepts, field by field, as the store's own read refuses it: a report is an input
    anyone can hand over (``accelperf baselines diff``, ``accelperf report``)."""
    if record.block is None:
        return
    try:
        validate_block(record.block)
    except ValidationError as exc:
        shown = "; ".join(f"{jsonfile.field_path(loc) or 'the block'}: {msg}" if loc else msg
                          for loc, msg in error_lines(exc))
        raise ReportFileError(
            f"{path}:{case_line(path, index)}: case {record.nodeid!r}: invalid baseline "
            f"block: {shown}; the report was edited or written by another version: "
            f"{_WRITE_ONE}") from None

