#!/usr/bin/env python
"""Lightning's own examples under the gate, with the regressions its users hit planted
(issue 45): which check catches each, and whether it does so without a clock.

::

    python benchmarks/lightning_trials.py [--unchanged 2] [--trials precision_off,...]
                                          [--out benchmarks/results] [--keep]

copies ``benchmarks/lightning_suite/`` (Lightning's demo ``LightningTransformer`` and its
README's autoencoder, see its module docstring) to a scratch directory, records both cases'
baselines there in one session (``--accelperf-update``), then runs ``--unchanged`` sessions
of the code as written and one session of each planted regression
(``ACCELPERF_TRIAL=<name>``), each a fresh pytest process at the suite's tolerance (0.5 for
throughput). It prints, per session and case, every check's verdict, marking the clockless
ones (program, memory, numerics, loss, outcome: the same on any machine) apart from the
timed ones (throughput, input, input_wait), and writes the table and every session's JSON
report to ``DIR/lightning-trials-<time>.{md,json}``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SUITE = HERE / "lightning_suite"
TRIALS = ("precision_off", "log_sync_dist", "debug_item", "grad_clip", "no_accumulation")
#: The checks that need no clock: their verdicts are the same on any machine and load.
CLOCKLESS = ("outcome", "program", "memory", "numerics", "loss", "lr")


def session(root: Path, trial: str, *extra: str) -> dict[str, object]:
    report = root / f"report-{trial}-{time.time_ns()}.json"
    env = dict(os.environ, ACCELPERF_TRIAL=trial)
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:xdist",
                           f"--accelperf-json={report}", *extra],
                          cwd=root, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    data: dict[str, object] = (json.loads(report.read_text()) if report.exists()
                               else {"cases": []})
    return {"trial": trial, "exit": proc.returncode, "wall_s": round(wall, 1),
            "load": os.getloadavg()[0], "report": data,
            "tail": proc.stdout[-2000:] if proc.returncode not in (0, 1) else ""}


def rows(result: dict[str, object]) -> list[tuple[str, str, str, str]]:
    """(trial, case, failed clockless checks, failed timed checks) per case."""
    out = []
    report = result["report"]
    assert isinstance(report, dict)
    for case in report.get("cases", []):
        failed = [(c["metric"], c["verdict"]) for c in case.get("checks", [])
                  if c["verdict"] == "regression"]
        clockless = ", ".join(m for m, _ in failed if m in CLOCKLESS) or "-"
        timed = ", ".join(m for m, _ in failed if m not in CLOCKLESS) or "-"
        name = str(case.get("case_id", "?")).removeprefix("lightning-")
        out.append((str(result["trial"]), name, clockless, timed))
    return out


def table(results: list[dict[str, object]]) -> str:
    lines = ["| trial | case | clockless checks that failed | timed checks that failed |",
             "| --- | --- | --- | --- |"]
    lines += [f"| {a} | {b} | {c} | {d} |" for r in results for a, b, c, d in rows(r)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--unchanged", type=int, default=2)
    parser.add_argument("--trials", default=",".join(TRIALS))
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("--keep", action="store_true", help="keep the scratch directory")
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="accelperf-lightning-trials-"))
    shutil.copytree(SUITE, root, dirs_exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    args.out.mkdir(parents=True, exist_ok=True)
    results = []
    try:
        recorded = session(root, "none", "--accelperf-update")
        if recorded["exit"] != 0:
            print(recorded["tail"], file=sys.stderr)
            return 1
        plan = ["none"] * args.unchanged + [t for t in args.trials.split(",") if t]
        for trial in plan:
            results.append(session(root, trial))
            r = results[-1]
            print(f"{trial}: exit {r['exit']} in {r['wall_s']} s (load {r['load']:.1f})",
                  flush=True)
            (args.out / f"lightning-trials-{stamp}.json").write_text(json.dumps(results))
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    text = table(results)
    print(text)
    (args.out / f"lightning-trials-{stamp}.md").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
