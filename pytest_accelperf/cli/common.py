"""What several ``accelperf`` commands share: the error they report, and reading and
writing the files they are given."""

from __future__ import annotations

from pathlib import Path

from pytest_accelperf.errors import UserError, render
from pytest_accelperf.report.writing import OutputError, write_output


class CliError(UserError):
    """A failure to report as ``accelperf: error: ...`` with exit status 1."""


def read_file(path: Path) -> str:
    """The text of a file the user named; a CliError naming it where it cannot be read."""
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc}") from None


def write_file(path: Path, text: str, option: str) -> None:
    """The writer of a session's reports (:mod:`pytest_accelperf.report.writing`), so that
    a path means the same to ``accelperf report`` as to pytest's options: a device, FIFO or
    descriptor written in place, a file atomically."""
    try:
        write_output(path, text, option=option)
    except OutputError as exc:
        raise CliError(render(exc)) from None
