"""``accelperf``: the baseline store and saved reports, from the command line.

::

    accelperf baselines show [PATTERN ...]          what is stored, one row per case
    accelperf baselines check                       every block validated whole
    accelperf baselines diff OLD NEW                two stores, or a JSON report against a store
    accelperf baselines accept REPORT --case PAT    store cases of a CI report without re-running
    accelperf baselines prune [PYTEST ARGS ...]     drop cases that are no longer collected
    accelperf report REPORT --markdown/--html PATH  render a saved JSON report
    accelperf history changes DIR [--since REF]     change points over the run history
    accelperf history publish HISTORY... --out DIR  the run history as a static site
    accelperf bisect GOOD BAD -- NODEIDS [ARGS]     the first commit that made the cases worse
    accelperf bisect --package NAME LOW HIGH -- ... the first release of NAME that did
    accelperf schema baseline|report|history        the JSON Schema of a block, report or line

Paths are relative to the current directory. Node ids and baseline files are keyed relative
to the pytest rootdir; ``prune`` takes the node ids and that rootdir from a collection it runs
(``pytest --collect-only``), so it works from any directory. The store defaults to
``[tool.accelperf] baselines`` of ``./pyproject.toml``, else ``baselines/``. Everything
written goes through the store (:mod:`pytest_accelperf.store.baselines`): validated by the schema,
locked, atomic, inside the store. Exit status: 0 done, 1 an error (the message names the
file, line, case and fix), 2 a usage error; ``bisect`` has three more (its ``--help``).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TextIO

from pytest_accelperf.bisection.status import Status
from pytest_accelperf.errors import UserError, render
from pytest_accelperf.report.detection import MAX_PVALUE

# The parser is this module's; each command is a module of its own (baselines, report,
# history, bisect, schema; common for what they share), named by its subparser's ``func``
# as "MODULE:FUNCTION" and imported only when that command runs: a command pays for its
# own imports, and --help for argparse's. The parser's defaults come from light modules
# (report.detection, bisection.status), not from the commands'.

#: The end of ``accelperf bisect --help``: its exit statuses.
BISECT_EPILOG = f"""\
exit status: {Status.FOUND.value} the first bad commit was found; 1 an error in what was given \
(an unknown ref, GOOD not an ancestor of BAD, no node ids, a GOOD or BAD whose session does \
not run; with --package, a release that does not exist, a backwards range, no network, LOW's \
or HIGH's environment that cannot be built); 2 a usage error; {Status.BAD_NOT_BAD.value} BAD \
is not worse than GOOD (or only on \
a check the search cannot follow, such as the parameter fingerprint, which it names); \
{Status.GOOD_ALREADY_BAD.value} GOOD is already worse (BAD is faster); \
{Status.NOT_FOUND.value} not found: only commits that could not be tested are left between \
the last good and the first bad one (all are named, with the command that bisects only \
them); {Status.INTERRUPTED.value} interrupted \
(the worktrees are removed)."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="accelperf",
        description="pytest-accelperf: inspect, compare, accept and prune baselines; render "
                    "saved reports. Run it in the pytest rootdir.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def store_arg(p: argparse.ArgumentParser) -> None:
        p.add_argument("--baselines", type=Path, metavar="DIR",
                       help="the baseline store (default: [tool.accelperf] baselines of "
                            "./pyproject.toml, else baselines/)")

    base = sub.add_parser("baselines", help="show, check, diff, accept, prune or rewrite "
                                            "stored baselines")
    bsub = base.add_subparsers(dest="action", required=True, metavar="ACTION")

    show = bsub.add_parser("show", help="list stored cases with their headline numbers, and "
                                        "the machines whose timing the store keeps")
    store_arg(show)
    show.add_argument("--platform", help="only this platform (e.g. cpu-x8)")
    show.add_argument("--machine", help="show this machine's timing (default: the timing of "
                                        "the machine that recorded each block)")
    show.add_argument("patterns", nargs="*", metavar="PATTERN",
                      help="only cases matching (node id, test[case] or case id; * and ? "
                           "are wildcards)")
    show.set_defaults(func="baselines:cmd_show")

    check = bsub.add_parser("check", help="validate every block of the store whole, as the "
                                          "gate and the writers do (show and diff validate "
                                          "only the fields they show)")
    store_arg(check)
    check.add_argument("--platform", help="only this platform (e.g. cpu-x8)")
    check.set_defaults(func="baselines:cmd_check")

    diff = bsub.add_parser("diff", help="compare two stores, or a JSON report with a store")
    diff.add_argument("old", type=Path, metavar="OLD", help="a store directory or JSON report")
    diff.add_argument("new", type=Path, metavar="NEW", help="a store directory or JSON report")
    diff.add_argument("--platform", help="only this platform")
    diff.add_argument("--machine", help="compare this machine's timing (default: every "
                                        "machine's, each named; a report's machine's)")
    diff.set_defaults(func="baselines:cmd_diff")

    rewrite = bsub.add_parser("rewrite", help="write every file of the store in this "
                                              "version's format, its blocks unchanged")
    store_arg(rewrite)
    rewrite.add_argument("--platform", help="only this platform")
    rewrite.add_argument("--dry-run", action="store_true", help="say what would be rewritten")
    rewrite.set_defaults(func="baselines:cmd_rewrite")

    accept = bsub.add_parser("accept", help="store cases of a JSON report as baselines, "
                                            "without re-running them")
    accept.add_argument("report", type=Path, metavar="REPORT",
                        help="a report written by pytest --accelperf-json")
    accept.add_argument("--case", action="append", default=[], metavar="PATTERN",
                        help="a case to accept (repeatable; node id, test[case] or case id; "
                             "* and ? are wildcards)")
    accept.add_argument("--all", action="store_true", help="accept every case of the report")
    accept.add_argument("--dry-run", action="store_true", help="say what would be written")
    accept.add_argument("--machine", help="the machine whose timing the cases are stored as "
                                          "(default: the report's, --accelperf-machine or "
                                          "the name derived from the host it ran on)")
    store_arg(accept)
    accept.set_defaults(func="baselines:cmd_accept")

    prune = bsub.add_parser("prune", help="drop stored cases that pytest no longer collects")
    store_arg(prune)
    prune.add_argument("--platform", help="only this platform")
    prune.add_argument("--nodeids", type=Path, metavar="FILE",
                       help="node ids, one a line (pytest --collect-only -q output; - for "
                            "stdin), instead of collecting")
    prune.add_argument("--dry-run", action="store_true", help="say what would be dropped")
    prune.add_argument("pytest_args", nargs="*", metavar="PYTEST_ARG",
                       help="passed to pytest --collect-only -q (e.g. suites/)")
    prune.set_defaults(func="baselines:cmd_prune")

    report = sub.add_parser("report", help="render a saved JSON report as Markdown or HTML")
    report.add_argument("report", type=Path, metavar="REPORT",
                        help="a report written by pytest --accelperf-json")
    report.add_argument("--markdown", type=Path, metavar="PATH",
                        help="write the Markdown summary here (- for stdout)")
    report.add_argument("--html", type=Path, metavar="PATH",
                        help="write the HTML report with plots here (- for stdout; needs "
                             "the report extra)")
    report.add_argument("--history", type=Path, metavar="DIR",
                        help="the --accelperf-history directory, for the trend plots and "
                             "their change points")
    report.set_defaults(func="report:cmd_report")

    history = sub.add_parser("history", help="change points over the --accelperf-history "
                                             "of runs")
    hsub = history.add_subparsers(dest="action", required=True, metavar="ACTION")
    changes = hsub.add_parser(
        "changes", help="list each change point: case, metric, before → after, the commit "
                        "range it lies in, and how sure",
        description="Change points of each case's throughput (step time), program fields "
                    "(FLOPs, bytes, collectives, callbacks, syncs, graphs, recompiles), peak "
                    "memory and final loss over the sessions of an --accelperf-history "
                    "directory, per environment fingerprint. A deterministic field's change "
                    "is exact; a measured one must hold 3 sessions and pass the "
                    "Mann-Whitney U test at --max-pvalue. The numbers of each file's lines "
                    "are cached in DIR/.accelperf-cache: a file only appended to has its new "
                    "lines validated, one edited is validated again in full.")
    changes.add_argument("directory", type=Path, metavar="DIR",
                         help="the --accelperf-history directory")
    changes.add_argument("--since", metavar="REF",
                         help="only change points after the first session of commit REF (a "
                              "commit, its prefix, or a ref git resolves here) or after the "
                              "date REF (2026-11-20, 2026-11-20T14:00)")
    changes.add_argument("--platform", help="only this platform's file (DIR/PLATFORM.jsonl)")
    changes.add_argument("--max-pvalue", type=float, default=MAX_PVALUE, metavar="P",
                         help=f"the largest p-value of a measured change (default "
                              f"{MAX_PVALUE})")
    changes.add_argument("--json", action="store_true",
                         help="print the change points as JSON")
    changes.set_defaults(func="history:cmd_history_changes")
    publish = hsub.add_parser(
        "publish", help="the history as a static site: an index of cases and a page of "
                        "plots for each",
        description="Publish the --accelperf-history of runs as one static folder that "
                    "works opened from disk and served (a CI artifact, GitHub Pages): an "
                    "index of every case (a sparkline of its step time, its latest verdict "
                    "and machine) and a page for each case: step time over the sessions "
                    "with each session's 95% interval as a band, compile time, memory per "
                    "device, FLOPs, bytes and host syncs, the final loss; change points "
                    "(with the accelperf bisect command of their range), stack changes and "
                    "machine changes marked; filters for machine and branch. The plots are "
                    "Vega-Lite, its JavaScript written once into the folder (vega.js), never "
                    "loaded from the network. A line that is not JSON or of another schema "
                    "version is skipped and counted. DIR is refused when it exists, is not "
                    "empty, and is not a site this command made (.accelperf-site.json).")
    publish.add_argument("history", nargs="+", type=Path, metavar="HISTORY",
                         help="an --accelperf-history directory, or one of its .jsonl files")
    publish.add_argument("--out", type=Path, required=True, metavar="DIR",
                         help="the site's folder (new, empty, or a site published before)")
    publish.add_argument("--title", default="accelperf history",
                         help="the index's title (default: accelperf history)")
    publish.set_defaults(func="history:cmd_history_publish")

    bis = sub.add_parser(
        "bisect", help="the first commit between GOOD and BAD that made the cases worse",
        usage="accelperf bisect [-h] [--tolerance T] [--budget S] [--json PATH]\n"
              "                        GOOD BAD -- NODEID [NODEID ...] [PYTEST_ARG ...]\n"
              "       accelperf bisect --package NAME [options] LOW HIGH -- NODEID ...",
        description="Bisect the commits of GOOD..BAD on BAD's first-parent line, each "
                    "tested in a git worktree of its own (removed at the end, also on "
                    "Ctrl-C; the working tree, index and branches are not touched) by "
                    "running pytest NODEIDS PYTEST_ARGS there. GOOD's session records a "
                    "baseline; where BAD's compiled program (FLOPs, bytes, collectives, host "
                    "syncs, matmul dtypes, graph breaks, the compiler's memory plan) is "
                    "worse than GOOD's, the search is on those fields (exact: one session "
                    "per commit); where the programs agree, on A/B mode's timing "
                    "(--accelperf-compare=GOOD in each commit's worktree); where the step "
                    "times agree too but BAD's input or input_wait check (the making of the "
                    "batch, timed apart from the step) regressed, on that check's interval "
                    "in a session against GOOD's recording. A commit whose "
                    "session does not collect, import or run, or whose A/B interval cannot "
                    "tell which side of halfway it is on, is skipped as git bisect skip "
                    "does. Prints the first bad "
                    "commit, the evidence of each step, and the command that reproduces "
                    "the last decisive comparison. With --package NAME, LOW and HIGH are "
                    "releases of NAME and the range is the releases between them on the "
                    "index: the working tree's code runs under each release, in an "
                    "environment of its own from the environment cache (this one's "
                    "packages with the release pinned; jaxlib follows jax), searched "
                    "as commits are (LOW records, the program first, A/B mode against "
                    "LOW's interpreter where the programs agree); it prints the first bad "
                    "release, its program against the release before it, and how to go "
                    "on to the commits.",
        epilog=BISECT_EPILOG)
    bis.add_argument("good", metavar="GOOD", help="a commit without the regression (an "
                                                  "ancestor of BAD on its first-parent line); "
                                                  "with --package, a release (LOW)")
    bis.add_argument("bad", metavar="BAD", help="a commit with it; with --package, a later "
                                                "release (HIGH)")
    bis.add_argument("--package", metavar="NAME",
                     help="bisect NAME's releases from GOOD to BAD (e.g. --package jax "
                          "0.8.3 0.10.2), the code held at the working tree's")
    bis.add_argument("nodeids", nargs="*", metavar="NODEID",
                     help="the tests to run at each commit, after --, then any pytest "
                          "arguments (--accel=cpu, -k EXPR, ...)")
    bis.add_argument("--tolerance", type=float, default=0.01, metavar="T",
                     help="A/B mode's tolerance when comparing BAD with GOOD (default "
                          "0.01); a commit between is bad when its interval lies above the "
                          "ratio halfway from GOOD to BAD's, good when below")
    bis.add_argument("--budget", type=float, metavar="S",
                     help="seconds of A/B measurement per case and commit (default: A/B "
                          "mode's, 20)")
    bis.add_argument("--json", type=Path, metavar="PATH",
                     help="also write the result (first bad commit, every step) as JSON")
    bis.set_defaults(func="bisect:cmd_bisect", pytest_args=[])

    schema = sub.add_parser("schema", help="print the JSON Schema of a baseline block, a "
                                           "JSON report or a history line")
    schema.add_argument("kind", choices=("baseline", "report", "history"),
                        help="baseline: one case's block in a baseline file; report: a "
                             "--accelperf-json report; history: one line of "
                             "--accelperf-history")
    schema.set_defaults(func="schema:cmd_schema")
    return parser


def _command(func: str) -> Callable[[argparse.Namespace, TextIO], int]:
    """The function a subparser's ``func`` ("MODULE:FUNCTION") names, its module imported."""
    module, name = func.split(":")
    command: Callable[[argparse.Namespace, TextIO], int] = getattr(
        importlib.import_module(f"{__name__}.{module}"), name)
    return command


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """Entry point of the ``accelperf`` console script; returns the exit status."""
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    after: list[str] = []
    if argv[:1] == ["bisect"] and "--" in argv:
        # What follows -- is pytest's, options included (argparse mishandles -- after an
        # option of a subcommand).
        cut = argv.index("--")
        argv, after = argv[:cut], argv[cut + 1:]
    args = parser.parse_args(argv)
    if after:
        args.pytest_args = after
    stream = out if out is not None else sys.stdout
    command = _command(args.func)
    try:
        status: int = command(args, stream)
    except UserError as exc:  # CliError, and any other mistake in what was given
        print(f"accelperf: error: {render(exc)}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # `accelperf baselines show | head`: the reader had enough
        # Python flushes stdout again at exit and would report the pipe a second time.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    return status
