"""``accelperf bisect GOOD BAD -- NODEIDS`` (and ``accelperf bisect --package NAME LOW HIGH
-- NODEIDS``, over a package's releases): the command around the bisection
(:mod:`pytest_accelperf.bisection`): what it was given checked, each step printed as it
ends, SIGTERM taken as Ctrl-C (the worktrees removed), the result and its exit status."""

from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path
from types import FrameType
from typing import TextIO

from pytest_accelperf.bisection import show as bisect_show
from pytest_accelperf.bisection.commits import commit_range
from pytest_accelperf.bisection.driver import Points, Settings, Step, bisect
from pytest_accelperf.bisection.status import Status
from pytest_accelperf.bisection.trial import own_option
from pytest_accelperf.cli.common import CliError, write_file


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt  # SIGTERM as Ctrl-C: the worktrees are removed on the way out


def cmd_bisect(args: argparse.Namespace, out: TextIO) -> int:
    pytest_args = [*args.nodeids, *args.pytest_args]
    nodeids = []
    for arg in pytest_args:
        if arg.startswith("-"):
            break
        nodeids.append(arg)
    if not nodeids:
        raise CliError("no node ids: pass the tests to bisect after --, e.g. accelperf "
                       "bisect v1.0 main -- tests/test_perf.py::test_step --accel=cpu")
    clash = own_option(pytest_args)
    if clash:
        raise CliError(clash)
    if not 0 < args.tolerance < 1:
        raise CliError(f"--tolerance {args.tolerance:g}: a relative change between 0 and 1, "
                       f"such as 0.01")
    if args.budget is not None and not args.budget > 0:
        raise CliError(f"--budget {args.budget:g}: seconds of A/B measurement per case, more "
                       f"than 0, such as 20")
    settings = Settings(tuple(pytest_args), args.tolerance, args.budget)

    def announce(line: str) -> None:
        out.write(line + "\n")
        out.flush()

    points: Points | None = None
    if args.package:
        from pytest_accelperf.bisection.releases import Releases, release_range

        rng, pins = release_range(Path.cwd(), args.package, args.good, args.bad)
        out.write(bisect_show.start_line(rng, settings.args) + "\n")
        out.flush()
        points = Releases(rng, pins, settings, announce)
    else:
        rng = commit_range(Path.cwd(), args.good, args.bad)
        out.write(bisect_show.start_line(rng, settings.args) + "\n")
        out.flush()

    def progress(step: Step) -> None:
        out.write(bisect_show.step_line(step, rng) + "\n")
        out.flush()

    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        result = bisect(rng, settings, progress, points)
    except KeyboardInterrupt:
        print("accelperf bisect: interrupted; its worktrees were removed", file=sys.stderr)
        return int(Status.INTERRUPTED)
    finally:
        signal.signal(signal.SIGTERM, previous)
    out.write("\n" + bisect_show.render(result))
    if args.json is not None:
        write_file(args.json, json.dumps(result.to_json(), indent=2) + "\n", "--json")
    return int(result.status)
