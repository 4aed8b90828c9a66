"""The input check's false-alarm rate and its power, over many sessions (issue 48).

``benchmarks/input_suite/`` holds held-out-style cases: a Flax CNN trained by the guides'
``train_step`` with an ImageNet-example-style numpy pipeline (no mesh and a mesh of 8, the
issue's ``mesh8x1``), and nanoGPT's loop with its ``get_batch``. Each case is declared twice,
``same`` and ``planted``; the planted one spins ``--plant-ms`` of its thread's CPU time
in its batch function during the sessions (not while recording). So every session judges
unchanged code and a planted slowdown side by side, each against baselines of the same code.

    python benchmarks/input_sessions.py --sessions 40            # record once, then 40
    python benchmarks/input_sessions.py --sessions 40 --keep     # against the last recording

Every other session runs beside a competing job: a numpy matrix product in a loop on one
thread (one of this machine's two cores, all the time). What counts:

- a false alarm: an ``input`` or ``input_wait`` verdict of a ``same`` case that fails
  (``regression``; an ``improvement`` is no failure, but it is counted too);
- a catch: the ``planted`` case's ``input`` verdict is ``regression``.

Results: ``benchmarks/results/input-<stamp>.{json,md}``.
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
from collections import Counter
from pathlib import Path
from typing import Any

from tabulate import tabulate

ROOT = Path(__file__).resolve().parent.parent
SUITE = ROOT / "benchmarks" / "input_suite"
COMPETITOR = ("import numpy as np\n"
              "a = np.random.default_rng(0).random((800, 800))\n"
              "while True:\n"
              "    a @ a\n")


def _load() -> float:
    return os.getloadavg()[0]


def _pytest(tree: Path, *args: str, plant_ms: float, report: Path | None = None
            ) -> subprocess.CompletedProcess[str]:
    extra = [f"--accelperf-json={report}"] if report is not None else []
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *extra, *args],
        cwd=tree, capture_output=True, text=True, check=False,
        env={**os.environ, "ACCELPERF_PLANT_MS": str(plant_ms), "COLUMNS": "400"})


def _session(tree: Path, report: Path, plant_ms: float, competing: bool) -> dict[str, Any]:
    before = _load()
    rival = (subprocess.Popen([sys.executable, "-c", COMPETITOR],
                              env={**os.environ, "OPENBLAS_NUM_THREADS": "1",
                                   "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})
             if competing else None)
    try:
        if rival is not None:
            time.sleep(1.0)  # the competitor at full speed before the session starts
        t0 = time.monotonic()
        proc = _pytest(tree, plant_ms=plant_ms, report=report)
        wall = time.monotonic() - t0
    finally:
        if rival is not None:
            rival.kill()
            rival.wait()
    out: dict[str, Any] = {"competing": competing, "exit_status": proc.returncode,
                           "wall_s": round(wall, 1), "load_before": round(before, 2),
                           "load_after": round(_load(), 2), "cases": {}}
    if not report.exists():
        out["error"] = (proc.stdout + proc.stderr)[-2000:]
        return out
    for case in json.loads(report.read_text())["cases"]:
        checks = {c["metric"]: c for c in case.get("checks", [])}
        out["cases"][case["case_id"]] = {
            metric: {"verdict": checks[metric]["verdict"], "detail": checks[metric]["detail"],
                     "ratio": checks[metric].get("data", {}).get("ratio"),
                     "measured_verdict": checks[metric].get("data", {}).get("measured_verdict")}
            for metric in ("input", "input_wait", "throughput") if metric in checks}
    return out


def _summary(sessions: list[dict[str, Any]], plant_ms: float) -> tuple[str, dict[str, Any]]:
    rows = []
    totals: dict[str, Any] = {}
    for competing in (False, True):
        group = [s for s in sessions if s["competing"] == competing and "error" not in s]
        verdicts: Counter[str] = Counter()
        false_alarms, improvements, caught, planted, missed = 0, 0, 0, 0, []
        for s in group:
            for case_id, checks in s["cases"].items():
                if case_id.endswith("-same"):
                    for metric in ("input", "input_wait"):
                        verdict = checks.get(metric, {}).get("verdict")
                        if verdict:
                            verdicts[f"{metric}:{verdict}"] += 1
                        false_alarms += verdict == "regression"
                        improvements += verdict == "improvement"
                elif case_id.endswith("-planted") and "input" in checks:
                    planted += 1
                    if checks["input"]["verdict"] == "regression":
                        caught += 1
                    else:
                        missed.append(f"{case_id}: {checks['input']['verdict']}: "
                                      f"{checks['input']['detail']}")
        loads = [s["load_before"] for s in group] + [s["load_after"] for s in group]
        name = "beside a competing job" if competing else "no competing job"
        totals[name] = {"sessions": len(group), "false_alarms": false_alarms,
                        "improvements": improvements, "caught": caught, "planted": planted,
                        "verdicts": dict(verdicts), "missed": missed}
        rows.append([name, len(group), f"{min(loads, default=0):.1f}-{max(loads, default=0):.1f}",
                     false_alarms, improvements, f"{caught}/{planted}",
                     ", ".join(f"{k} {v}" for k, v in sorted(verdicts.items()))])
    table = tabulate(rows, headers=["sessions", "n", "load", "false alarms (same: input, "
                                    "input_wait regression)", "improvements (same)",
                                    f"planted {plant_ms:g} ms caught", "same cases' verdicts"],
                     tablefmt="github")
    return table, totals


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=40)
    parser.add_argument("--plant-ms", type=float, default=3.0)
    parser.add_argument("--keep", action="store_true",
                        help="judge against the suite's last recording (benchmarks/results/"
                             "input-suite-baselines), not a new one")
    parser.add_argument("--combine", nargs="+", type=Path, metavar="JSON",
                        help="summarize the sessions of these results files, run nothing")
    args = parser.parse_args()
    if args.combine:
        combine(args.combine)
        return
    results = ROOT / "benchmarks" / "results"
    results.mkdir(exist_ok=True)
    kept = results / "input-suite-baselines"
    with tempfile.TemporaryDirectory(prefix="accelperf-input-") as scratch:
        tree = Path(scratch) / "suite"
        shutil.copytree(SUITE, tree, ignore=shutil.ignore_patterns("baselines", "__pycache__"))
        if args.keep and kept.exists():
            shutil.copytree(kept, tree / "baselines")
        else:
            print(f"recording (load {_load():.1f}) ...", flush=True)
            proc = _pytest(tree, "--accelperf-update", plant_ms=0.0)
            if proc.returncode != 0:
                sys.exit(f"recording failed:\n{proc.stdout[-3000:]}{proc.stderr[-2000:]}")
            shutil.rmtree(kept, ignore_errors=True)
            shutil.copytree(tree / "baselines", kept)
        sessions: list[dict[str, Any]] = []
        stamp = time.strftime("%Y%m%d-%H%M%S")
        partial = results / f"input-{stamp}.json"
        for i in range(args.sessions):
            competing = i % 2 == 1
            session = _session(tree, Path(scratch) / f"report-{i}.json", args.plant_ms,
                               competing)
            sessions.append(session)
            partial.write_text(json.dumps(  # after every session: a stopped run keeps them
                {"plant_ms": args.plant_ms, "sessions": sessions}, indent=1))
            same = {k: v.get("input", {}).get("verdict") for k, v in session["cases"].items()}
            print(f"session {i + 1}/{args.sessions} competing={competing} "
                  f"load {session['load_before']}-{session['load_after']} "
                  f"{session['wall_s']} s: {same}", flush=True)
    table, totals = _summary(sessions, args.plant_ms)
    partial.write_text(json.dumps(
        {"plant_ms": args.plant_ms, "totals": totals, "sessions": sessions}, indent=1))
    partial.with_suffix(".md").write_text(table + "\n")
    print(table)


def combine(paths: list[Path]) -> None:
    """The summary of several runs' sessions (``--combine``): runs side by side on one
    machine, or a run stopped before its last session."""
    sessions = [s for p in paths for s in json.loads(p.read_text())["sessions"]]
    plant = json.loads(paths[0].read_text())["plant_ms"]
    print(_summary(sessions, plant)[0])


if __name__ == "__main__":
    main()
