#!/usr/bin/env python
"""The plugin's own cost per case: where a case's wall time goes besides its training.

::

    python benchmarks/cost.py [--runs 1] [--pool on,off] [--kinds jax,torch,deepspeed]
                              [--out benchmarks/results]

runs a few real cases of the project's suites through pytest (one pytest session per kind
and pool setting, ``--accel=cpu``, ``--accelperf-json``), in the repository, as a user
would run them:

* ``jax``: ``suites/jax/test_mesh_sweep.py``, no mesh and mesh 4x2 at batch 16 (40 steps);
* ``torch``: ``suites/torch/test_torch_gpt.py``, the eager GPT at batch 8 (20 steps);
* ``deepspeed``: ``suites/torch/test_deepspeed.py``, ZeRO 0, 1 and 2 at world size 2
  (10 steps each); with ``--pool on`` (the default) the session's cases share a pool of
  warm ranks (:mod:`pytest_accelperf.backends.rank_pool`), with ``off``
  (``ACCELPERF_RANK_POOL=0``) every case launches fresh ranks, as before the pool.

Each case's wall time (pytest's own setup + call + teardown durations of the test, from
``benchmarks/cost_suite/costprobe.py``, a plugin loaded with ``-p costprobe``) is broken
into:

* ``lock``: waiting for the CPU host lock, i.e. for other sessions' cases on this machine
  (zero on a quiet machine; left out of the share);
* ``compile``: ``run.compile_time``;
* ``steps``: the measured steps, ``sum(run.step_times)``;
* ``confirm``: re-measuring an apparent throughput regression (``--accelperf-confirm``),
  waiting for a quiet machine included;
* ``plugin``: the rest, what the plugin costs: probing the device, counting memory,
  fingerprinting, building the task, warm-up steps, the drift probe after every step,
  launching ranks, the checks and the reports. For a multi-process case the rest is split
  further from ``run.extra["timings"]`` (rank 0's clock marks): ``start`` (interpreter
  start and imports, or a warm rank's fork), ``join`` (the process group), ``build`` (the
  engine, under the memory count), ``unmeasured`` (the training loop's time outside the
  measured steps: warm-up steps, drift probes), ``end`` (gathering the parameters,
  collecting the results), and ``outside`` (everything outside the launch: the checks,
  the reports, the reference training).

``share`` is ``plugin / (wall - lock)``. The table is printed (markdown) and every raw
number written to ``OUT/cost-<time>.json``, with the load average before and after each
session.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PROBE_DIR = Path(__file__).resolve().parent / "cost_suite"

#: The cases of each kind: (suite file, test ids).
KINDS: dict[str, tuple[str, list[str]]] = {
    "jax": ("suites/jax/test_mesh_sweep.py",
            ["test_mesh_sweep[jax-nomesh-b16]", "test_mesh_sweep[jax-mesh4x2-b16]"]),
    "torch": ("suites/torch/test_torch_gpt.py", ["test_torch_gpt[torch-nomesh-b8]"]),
    "deepspeed": ("suites/torch/test_deepspeed.py",
                  ["test_zero[deepspeed-gpt-w2-zero0-b4]", "test_zero[deepspeed-gpt-w2-zero1-b4]",
                   "test_zero[deepspeed-gpt-w2-zero2-b4]"]),
}
#: Kinds whose cases train in ranks (the pool setting applies).
MULTI = ("deepspeed",)


def run_session(kind: str, pool: str, scratch: Path) -> dict[str, Any]:
    """One pytest session of ``kind``'s cases; its report, probe data and loads."""
    suite, tests = KINDS[kind]
    report = scratch / f"{kind}-{pool}.json"
    probe = scratch / f"{kind}-{pool}.probe.json"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(PROBE_DIR), env.get("PYTHONPATH", "")])
    env["ACCELPERF_COST_OUT"] = str(probe)
    env["ACCELPERF_RANK_POOL"] = "1" if pool == "on" else "0"
    cmd = [sys.executable, "-m", "pytest", *[f"{suite}::{t}" for t in tests], "--accel=cpu",
           "-q", "-p", "no:cacheprovider", "-p", "costprobe", f"--accelperf-json={report}"]
    load_before = os.getloadavg()
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                          check=False)
    wall = time.monotonic() - t0
    load_after = os.getloadavg()
    if not report.exists() or not probe.exists():
        raise RuntimeError(f"{kind} ({pool}): no report; pytest said:\n"
                           f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return {"kind": kind, "pool": pool, "command": " ".join(cmd), "exit_status": proc.returncode,
            "process_seconds": wall, "load_before": load_before, "load_after": load_after,
            "report": json.loads(report.read_text()), "probe": json.loads(probe.read_text())}


def case_rows(session: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per case of a session: its wall time broken down (see the module doc)."""
    rows = []
    nodes = session["probe"]["nodes"]
    for case in session["report"]["cases"]:
        run = case.get("run") or {}
        node = nodes.get(case["nodeid"], {})
        wall = node.get("setup", 0.0) + node.get("call", 0.0) + node.get("teardown", 0.0)
        lock = node.get("lock_wait", 0.0)
        compile_s = float(run.get("compile_time") or 0.0)
        steps = float(sum(run.get("step_times") or []))
        confirm = node.get("confirmation", 0.0)
        net = wall - lock
        plugin = net - compile_s - steps - confirm
        row: dict[str, Any] = {
            "kind": session["kind"], "pool": session["pool"], "case": case["case_id"],
            "outcome": run.get("outcome"), "wall": wall, "lock": lock, "compile": compile_s,
            "steps": steps, "confirm": confirm, "plugin": plugin,
            "share": plugin / net if net > 0 else None}
        timings = (run.get("extra") or {}).get("timings")
        if timings:
            launch = float(timings.get("launch", 0.0))
            row["launch"] = {
                "start": timings.get("start"), "join": timings.get("join"),
                "build": timings.get("build"),
                "unmeasured": (timings["train"] - steps) if "train" in timings else None,
                "end": (timings.get("finish", 0.0) + timings.get("collect", 0.0)),
                "outside": net - launch - confirm, "launch": launch,
                "pool_case": timings.get("pool_case"), "pooled": timings.get("pooled")}
        rows.append(row)
    return rows


def _f(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def table(rows: list[dict[str, Any]]) -> str:
    head = ("| kind | pool | case | wall s | lock s | compile s | steps s | confirm s | "
            "plugin s | plugin share | launch: start / join / build / unmeasured / end / "
            "outside s |")
    lines = [head, "|" + "---|" * 11]
    for r in rows:
        launch = r.get("launch")
        split = (" / ".join(_f(launch.get(k)) for k in ("start", "join", "build", "unmeasured",
                                                        "end", "outside"))
                 + (f" (pool case {launch['pool_case']})" if launch.get("pooled") else "")
                 if launch else "")
        lines.append(f"| {r['kind']} | {r['pool'] if r['kind'] in MULTI else '-'} | "
                     f"{r['case']} | {_f(r['wall'])} | {_f(r['lock'])} | {_f(r['compile'])} | "
                     f"{_f(r['steps'])} | {_f(r['confirm'])} | {_f(r['plugin'])} | "
                     f"{_f(100 * r['share'], 0) + ' %' if r['share'] is not None else '-'} | "
                     f"{split} |")
    return "\n".join(lines)


def summary(rows: list[dict[str, Any]]) -> str:
    """Median share of plugin time per (kind, pool), and the cases' mean wall time."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["kind"], r["pool"] if r["kind"] in MULTI else "-"), []).append(r)
    lines = ["| kind | pool | cases | median plugin share | mean wall s (lock excluded) |",
             "|---|---|---|---|---|"]
    for (kind, pool), rs in groups.items():
        shares = [r["share"] for r in rs if r["share"] is not None]
        walls = [r["wall"] - r["lock"] for r in rs]
        lines.append(f"| {kind} | {pool} | {len(rs)} | "
                     f"{_f(100 * statistics.median(shares), 0) if shares else '-'} % | "
                     f"{_f(statistics.mean(walls))} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1, help="sessions of each kind and pool")
    parser.add_argument("--pool", default="on,off", help="pool settings for multi-process "
                        "kinds: on, off or both (on,off)")
    parser.add_argument("--kinds", default=",".join(KINDS), help="comma-separated kinds")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args(argv)
    kinds = [k for k in args.kinds.split(",") if k]
    pools = [p for p in args.pool.split(",") if p]
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / f"cost-{stamp}.json"
    sessions: list[dict[str, Any]] = []
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="accelperf-cost-") as tmp:
        for rep in range(args.runs):
            for kind in kinds:
                for pool in (pools if kind in MULTI else ["on"]):
                    session = run_session(kind, pool, Path(tmp))
                    session["repetition"] = rep
                    sessions.append(session)
                    new = case_rows(session)
                    rows.extend(new)
                    print(f"{kind} pool={pool}: {len(new)} case(s), exit "
                          f"{session['exit_status']}, {session['process_seconds']:.1f} s, load "
                          f"{session['load_before'][0]:.2f} -> {session['load_after'][0]:.2f}",
                          flush=True)
                    out.write_text(json.dumps({"sessions": sessions, "rows": rows}, indent=1,
                                              default=str))
    print()
    print(table(rows))
    print()
    print(summary(rows))
    print(f"\nraw numbers: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
