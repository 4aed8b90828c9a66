"""``accelperf history changes DIR``: the change points of the run history, as a table or
JSON (the analysis is :mod:`pytest_accelperf.report.changes`); ``accelperf history publish``:
the history as a static site (:mod:`pytest_accelperf.report.site`)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from tabulate import tabulate

from pytest_accelperf.cli.common import CliError
from pytest_accelperf.report.changes import (
    ChangePoint,
    ChangesError,
    Detection,
    analyse,
    metric_order,
    since_order,
)
from pytest_accelperf.report.history import HistoryError


def change_rows(changes: Sequence[ChangePoint]) -> list[tuple[str, ...]]:
    """Table rows of change points: case (named once for its rows), metric, levels,
    change, commit range, how sure."""
    rows: list[tuple[str, ...]] = []
    last = None
    for c in sorted(changes, key=lambda c: (c.platform, c.nodeid, c.first_after.order,
                                            metric_order(c))):
        name = f"{c.platform}:{c.nodeid}" if c.platform else c.nodeid
        change = c.change
        rows.append((name if name != last else "", c.metric, c.levels(),
                     "" if change is None else f"{change * 100:+.1f}%", c.commits, c.sure))
        last = name
    return rows


def cmd_history_changes(args: argparse.Namespace, out: TextIO) -> int:
    if not 0 < args.max_pvalue < 1:
        raise CliError(f"--max-pvalue {args.max_pvalue}: a p-value between 0 and 1, such "
                       f"as 0.001")
    try:
        found = analyse(args.directory, args.platform, Detection(max_pvalue=args.max_pvalue))
        if not found.sessions:
            raise CliError(f"{args.directory}: no history lines"
                           f"{f' of platform {args.platform}' if args.platform else ''}; "
                           f"write them with pytest --accelperf-history={args.directory}")
        changes = found.changes
        if args.since is not None:
            cut = since_order(found.sessions, args.since, Path.cwd())
            changes = [c for c in changes if c.first_after.order > cut]
    except (HistoryError, ChangesError) as exc:
        raise CliError(str(exc)) from None
    if args.json:
        out.write(json.dumps([c.to_json() for c in changes], indent=2) + "\n")
        return 0
    if changes:
        out.write(tabulate(change_rows(changes),
                           headers=("case", "metric", "before → after", "change", "commits",
                                    "how sure"), disable_numparse=True) + "\n")
    since = f" since {args.since}" if args.since is not None else ""
    unchanged = sum(not c.significant for c in changes)
    measured = (f" (and {unchanged} unchanged level(s) measured across a stack change)"
                if unchanged else "")
    out.write(f"{len(changes) - unchanged} change point(s){measured}{since} in "
              f"{found.cases} case(s) over {len(found.sessions)} session(s) of "
              f"{args.directory}\n")
    return 0


def cmd_history_publish(args: argparse.Namespace, out: TextIO) -> int:
    from pytest_accelperf.report.site import SiteError, publish
    from pytest_accelperf.report.vegajs import ReportDependencyError

    try:
        done = publish(args.history, args.out, title=args.title)
    except (HistoryError, ChangesError, SiteError, ReportDependencyError) as exc:
        raise CliError(str(exc)) from None
    for skipped in done.skipped:
        out.write(f"accelperf: {skipped.line()}\n")
    out.write(f"published {done.cases} case(s) over {done.sessions} session(s) on "
              f"{done.machines} machine(s) to {done.out / 'index.html'} ({done.files} files, "
              f"{done.size / 2**20:.1f} MiB)\n")
    return 0
