"""``accelperf report REPORT``: a saved JSON report rendered as Markdown or HTML."""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from typing import TextIO

from pytest_accelperf.cli.common import CliError, write_file
from pytest_accelperf.report.history import HistoryError, read_history
from pytest_accelperf.report.html import ReportDependencyError, html_report
from pytest_accelperf.report.loading import ReportFileError, check_stored_block, load_report
from pytest_accelperf.report.markdown import markdown
from pytest_accelperf.store.baselines import case_key


def cmd_report(args: argparse.Namespace, out: TextIO) -> int:
    try:
        report, _ = load_report(args.report)
        for i, record in enumerate(report.records):  # what the renderings read is typed
            check_stored_block(args.report, i, record)
    except ReportFileError as exc:
        raise CliError(str(exc)) from None
    hint = None
    if report.acceptable:
        cases = " ".join(f"--case '{case_key(r.nodeid)}'" for r in report.acceptable[:5])
        hint = f"accelperf baselines accept {args.report} {cases}"
    wrote = False
    if args.markdown is not None:
        text = markdown(report, accept_hint=hint)
        if str(args.markdown) == "-":
            out.write(text)
        else:
            write_file(args.markdown, text, "--markdown")
            out.write(f"Markdown summary written to {args.markdown}\n")
        wrote = True
    if args.html is not None:
        history: Sequence[Mapping[str, object]] = []
        try:
            if args.history is not None:
                history = read_history(args.history, report.platform or None)
            text = html_report(report, history=history)
        except (HistoryError, ReportDependencyError) as exc:
            raise CliError(str(exc)) from None
        if str(args.html) == "-":
            out.write(text)
        else:
            write_file(args.html, text, "--html")
            out.write(f"HTML report written to {args.html}\n")
        wrote = True
    if not wrote:
        out.write(markdown(report, accept_hint=hint))
    return 0
