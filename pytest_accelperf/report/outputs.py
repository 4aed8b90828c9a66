"""The files a session writes besides the JSON report: history, Markdown, HTML.

Called once, on the controller, at the end of the session, after the runs of every xdist
worker were merged. A file that cannot be written is a session error (shown in the summary,
exit status 1), never a traceback.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

import pytest

from pytest_accelperf.baselines import atomic_write
from pytest_accelperf.options import Settings
from pytest_accelperf.report.data import SessionReport
from pytest_accelperf.report.history import HistoryError, append_history, read_history
from pytest_accelperf.report.html import ReportDependencyError, html_report
from pytest_accelperf.report.markdown import markdown

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
    when one is written, else the re-run with ``--accelperf-update``; None when there is
    none (a reference, A/B or leak failure is not offered for acceptance)."""
    regressed = report.acceptable
    if not regressed:
        return None
    named = regressed[:_MAX_NAMED]
    more = " …" if len(regressed) > len(named) else ""
    if settings.json is not None:
        cases = " ".join(f"--case {shlex.quote(r.nodeid.split('::', 1)[-1])}" for r in named)
        return (f"accelperf baselines accept {shlex.quote(shown(settings.json, rootdir))} "
                f"{cases}{more}")
    nodeids = " ".join(shlex.quote(r.nodeid) for r in named)
    return f"pytest {nodeids}{more} --accel={settings.accel} --accelperf-update"


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, text)
    # atomic_write's temporary file is private (0600); a report is for sharing.
    umask = os.umask(0)
    os.umask(umask)
    path.chmod(0o666 & ~umask)


def write_outputs(report: SessionReport, settings: Settings, rootdir: Path) -> list[str]:
    """Write what ``settings`` asks for; the lines to print. Failures go to
    ``report.errors``."""
    lines: list[str] = []
    if settings.history is not None:
        try:
            for path in append_history(settings.history, report, cwd=rootdir):
                lines.append(f"accelperf: history appended to {shown(path, rootdir)}")
        except OSError as exc:
            report.errors.append(f"--accelperf-history: cannot append to "
                                 f"{settings.history}: {exc}")
    if settings.markdown is not None:
        text = markdown(report, accept_hint=accept_hint(report, settings, rootdir))
        try:
            _write(settings.markdown, text)
            lines.append(f"accelperf: Markdown summary written to "
                         f"{shown(settings.markdown, rootdir)}")
            summary = os.environ.get("GITHUB_STEP_SUMMARY")
            if summary:
                with open(summary, "a", encoding="utf-8") as fh:
                    fh.write(text + "\n")
                lines.append(f"accelperf: Markdown summary appended to {summary}")
        except OSError as exc:
            report.errors.append(f"--accelperf-markdown: cannot write {settings.markdown}: "
                                 f"{exc}")
    if settings.html is not None:
        try:
            history = []
            if settings.history is not None and settings.history.is_dir():
                history = read_history(settings.history, report.platform or None)
            text = html_report(report, history=history,
                               threshold=settings.tolerances.throughput_tolerance)
            _write(settings.html, text)
            lines.append(f"accelperf: HTML report written to {shown(settings.html, rootdir)}")
        except (OSError, HistoryError, ReportDependencyError) as exc:
            report.errors.append(f"--accelperf-html: cannot write {settings.html}: {exc}")
    return lines
