"""The files a session writes: the JSON report, history, Markdown, HTML, the step summary.

Called once, on the controller, at the end of the session, after the runs of every xdist
worker were merged. Every file goes through :mod:`pytest_accelperf.report.writing` (what
is at the path decides how it is written); one that cannot be written is a session error
naming its option, path and OS error (shown in the summary, exit status 1), never a
traceback, and never a silent pass.
"""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path

import pytest

from pytest_accelperf.errors import render
from pytest_accelperf.gate.options import Settings
from pytest_accelperf.report.data import SessionReport
from pytest_accelperf.report.history import HistoryError, append_history, read_history
from pytest_accelperf.report.html import ReportDependencyError, html_report
from pytest_accelperf.report.markdown import markdown
from pytest_accelperf.report.writing import (
    OutputError,
    append_output,
    readable_back,
    write_output,
)

#: Lines the terminal summary prints about the files written ("... written to ...").
OUTPUT_LINES_KEY = pytest.StashKey[list[str]]()

#: Regressed cases named one by one in the accept command of the Markdown summary.
_MAX_NAMED = 5


def shown(path: Path, rootdir: Path) -> str:
    try:
        return str(path.relative_to(rootdir))
    except ValueError:
        return str(path)


def accept_hint(report: SessionReport, settings: Settings, rootdir: Path) -> str | None:
    """The command that accepts this session's regressions that a baseline clears
    (:attr:`SessionReport.acceptable`): ``accelperf baselines accept`` on the JSON report
    when one is written to a file it can be read back from, else the re-run with
    ``--accelperf-update``; None when there is none (a reference, A/B or leak failure is
    not offered for acceptance)."""
    regressed = report.acceptable
    if not regressed:
        return None
    named = regressed[:_MAX_NAMED]
    more = " …" if len(regressed) > len(named) else ""
    if settings.json is not None and readable_back(settings.json):
        cases = " ".join(f"--case {shlex.quote(r.nodeid.split('::', 1)[-1])}" for r in named)
        return (f"accelperf baselines accept {shlex.quote(shown(settings.json, rootdir))} "
                f"{cases}{more}")
    nodeids = " ".join(shlex.quote(r.nodeid) for r in named)
    return f"pytest {nodeids}{more} --accel={settings.accel} --accelperf-update"


def write_outputs(report: SessionReport, settings: Settings, rootdir: Path) -> list[str]:
    """Write what ``settings`` asks for besides the JSON report; the lines to print.
    Failures go to ``report.errors``."""
    lines: list[str] = []
    if settings.history is not None:
        try:
            for path in append_history(settings.history, report, cwd=rootdir):
                lines.append(f"accelperf: history appended to {shown(path, rootdir)}")
        except OutputError as exc:
            report.errors.append(render(exc))
    if settings.markdown is not None:
        text = markdown(report, accept_hint=accept_hint(report, settings, rootdir))
        try:
            write_output(settings.markdown, text, option="--accelperf-markdown")
            lines.append(f"accelperf: Markdown summary written to "
                         f"{shown(settings.markdown, rootdir)}")
        except OutputError as exc:
            report.errors.append(render(exc))
        # The step summary is an output of its own: one failing does not skip the other,
        # and its error names the variable, not --accelperf-markdown.
        summary = os.environ.get("GITHUB_STEP_SUMMARY")
        if summary:
            try:
                append_output(Path(summary), text + "\n", option="$GITHUB_STEP_SUMMARY")
                lines.append(f"accelperf: Markdown summary appended to {summary}")
            except OutputError as exc:
                report.errors.append(render(exc))
    if settings.html is not None:
        try:
            history = []
            if settings.history is not None and settings.history.is_dir():
                history = read_history(settings.history, report.platform or None)
            text = html_report(report, history=history)
            write_output(settings.html, text, option="--accelperf-html")
            lines.append(f"accelperf: HTML report written to {shown(settings.html, rootdir)}")
        except OutputError as exc:
            report.errors.append(render(exc))
        except (HistoryError, ReportDependencyError) as exc:
            report.errors.append(f"--accelperf-html: cannot write {settings.html}: {exc}")
    return lines


def write_json(report: SessionReport, path: Path, exitstatus: int) -> list[str]:
    """Write the JSON report, which records ``exitstatus``; the line to print. A failure
    goes to ``report.errors``: the caller must then fail the session. The report it did
    not write cannot record that, so it is written last, after every other output's error
    is in it."""
    text = json.dumps(report.to_json(int(exitstatus)), indent=2, sort_keys=True,
                      default=str) + "\n"
    try:
        write_output(path, text, option="--accelperf-json")
    except OutputError as exc:
        report.errors.append(render(exc))
        return []
    return [f"accelperf: JSON report written to {path}"]
