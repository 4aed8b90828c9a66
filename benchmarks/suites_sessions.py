"""How often a clean tree fails the README's suites command, over many sessions.

Each session runs ``pytest suites/ --accel=cpu`` (the README's command, plus a JSON report)
in a fresh export of one commit (``git archive``), against the baselines committed with it,
and keeps its exit status, its verdicts by metric and the suite-level line. Nothing is
changed between sessions: every failing session is a false alarm.

    python benchmarks/suites_sessions.py --sessions 20

Results: ``benchmarks/results/suites-<stamp>.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from scipy.stats import binomtest
from tabulate import tabulate

ROOT = Path(__file__).resolve().parent.parent


def _load() -> float:
    return os.getloadavg()[0]


def _session(tree: Path, report: Path, extra: list[str]) -> dict[str, Any]:
    before = _load()
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "suites/", "--accel=cpu", "-q", "-p",
         "no:cacheprovider", f"--accelperf-json={report}", *extra],
        cwd=tree, capture_output=True, text=True, check=False,
        env={**os.environ, "COLUMNS": "400"})  # pytest's summary lines not cut short
    wall = time.monotonic() - t0
    verdicts: Counter[str] = Counter()
    failing: list[str] = []
    suite: dict[str, Any] | None = None
    if report.exists():
        data = json.loads(report.read_text())
        suite = data.get("suite")
        for case in data["cases"]:
            for check in case.get("checks", []):
                verdicts[check["verdict"]] += 1
                if check["verdict"] in ("regression", "improvement", "error"):
                    failing.append(f"{case['case_id']} {check['metric']}: {check['verdict']}")
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("accelperf: suite:")),
                None)
    tail = [ln for ln in proc.stdout.splitlines() if ln.startswith(("FAILED", "ERROR"))]
    return {"exit_status": proc.returncode, "wall_s": round(wall, 1),
            "load_before": round(before, 2), "load_after": round(_load(), 2),
            "verdicts": dict(verdicts), "failing_checks": failing, "failed_tests": tail,
            "suite_line": line, "suite": suite,
            "summary_line": proc.stdout.strip().splitlines()[-1] if proc.stdout else "",
            # what a failing session printed, to tell why (its end: the failures' summary)
            "output_tail": (proc.stdout + proc.stderr)[-20000:] if proc.returncode else ""}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=20)
    parser.add_argument("--ref", default="HEAD", help="the commit to export (default HEAD)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    ns, extra = parser.parse_known_args(argv)
    sha = subprocess.run(["git", "rev-parse", ns.ref], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout.strip()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="accelperf-suites-") as tmp:
        tree = Path(tmp) / "tree"
        tree.mkdir()
        archive = subprocess.run(["git", "archive", sha], cwd=ROOT, capture_output=True,
                                 check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
        for i in range(ns.sessions):
            row = _session(tree, Path(tmp) / f"report-{i}.json", extra)
            rows.append(row)
            print(f"session {i + 1}/{ns.sessions}: exit {row['exit_status']}, "
                  f"{row['wall_s']} s, load {row['load_before']}: {row['summary_line']}",
                  flush=True)
            _write(ns.out, stamp, sha, ns, extra, rows)
    return 0


def _write(out: Path, stamp: str, sha: str, ns: argparse.Namespace, extra: list[str],
           rows: list[dict[str, Any]]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    failed = sum(1 for r in rows if r["exit_status"] != 0)
    ci = binomtest(failed, len(rows)).proportion_ci(method="wilson")
    totals: Counter[str] = Counter()
    for r in rows:
        totals.update(r["verdicts"])
    command = " ".join(["python benchmarks/suites_sessions.py",
                        f"--sessions {ns.sessions}", *extra])
    summary: dict[str, Any] = {"sessions": len(rows), "failed": failed,
               "failure_rate_ci95": [ci.low, ci.high], "verdicts": dict(totals),
               "wall_s": [min(r["wall_s"] for r in rows), max(r["wall_s"] for r in rows)],
               "load_before": [min(r["load_before"] for r in rows),
                               max(r["load_before"] for r in rows)]}
    (out / f"suites-{stamp}.json").write_text(json.dumps(
        {"command": command, "commit": sha, "uname": os.uname().release,
         "summary": summary, "sessions": rows}, indent=1))
    table = [[i + 1, r["exit_status"], r["wall_s"], r["load_before"],
              ", ".join(f"{k} {v}" for k, v in sorted(r["verdicts"].items())),
              "; ".join(r["failing_checks"]) or "-"] for i, r in enumerate(rows)]
    (out / f"suites-{stamp}.md").write_text(
        f"`{command}` (commit {sha[:10]})\n\n"
        f"Clean-tree sessions of `pytest suites/ --accel=cpu`: {failed} of {len(rows)} failed "
        f"(95 % CI {ci.low:.0%} to {ci.high:.0%}); load average before a session "
        f"{summary['load_before'][0]} to {summary['load_before'][1]}; verdicts over all: "
        f"{', '.join(f'{k} {v}' for k, v in sorted(totals.items()))}\n\n"
        + tabulate(table, headers=["session", "exit", "wall s", "load", "verdicts",
                                   "failing checks"], tablefmt="github") + "\n")


if __name__ == "__main__":
    raise SystemExit(main())
