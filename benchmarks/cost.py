#!/usr/bin/env python
"""The plugin's own cost per case: where a case's wall time goes besides its training.

::

    python benchmarks/cost.py [--runs 1] [--pool on,off] [--kinds jax,torch,deepspeed]
                              [--steps N] [--out benchmarks/results]

runs a few real cases of the project's suites through pytest (one pytest session per kind
and pool setting, ``--accel=cpu``, ``--accelperf-json``), in the repository, as a user
would run them:

* ``jax``: ``suites/jax/test_mesh_sweep.py``, no mesh and mesh 4x2 at batch 16 (40 steps);
* ``torch``: ``suites/torch/test_torch_gpt.py``, the eager GPT at batch 32, then at batch 8
  (20 steps each);
* ``deepspeed``: ``suites/torch/test_deepspeed.py``, ZeRO 0, 1 and 2 at world size 2
  (10 steps each); with ``--pool on`` (the default) the session's cases share a pool of
  warm ranks (:mod:`pytest_accelperf.backends.procs.rank_pool`), with ``off``
  (``ACCELPERF_RANK_POOL=0``) every case launches fresh ranks, as before the pool.

``--steps N`` runs the same cases with ``N`` measured steps instead of the suite's
(``costprobe`` replaces each case's ``steps`` at collection; the suites are unchanged):
the plugin's share of a case with a realistic number of steps. The suite's baselines
were recorded with its own steps, so each such session is run twice: once untimed with
``--accelperf-update`` into a scratch store, then measured against that store (a gated
run that compares, as a real one does).

Each case's wall time (pytest's own setup + call + teardown durations of the test, from
``benchmarks/cost_suite/costprobe.py``, a plugin loaded with ``-p costprobe``) is broken
into:

* ``lock``: waiting for the CPU host lock, i.e. for other sessions' cases on this machine
  (zero on a quiet machine; left out of the share);
* ``compile``: ``run.compile_time``;
* ``trace``: JAX, the one trace of the user's step (``run.extra["trace_time"]``), made
  before the timed lowering, which reuses it: what ``jax.jit``'s first call costs in any
  training script, so not the plugin's;
* ``steps``: the measured steps, ``sum(run.step_times)``;
* ``batches``: an in-process case's batches made and moved to the device, every step
  (``run.extra["batch_time"]``): the user's ``make_batch`` and the transfer, which any
  training loop does too, so not the plugin's;
* ``confirm``: re-measuring an apparent throughput regression (``--accelperf-confirm``),
  waiting for a quiet machine included;
* ``build``: an in-process case's own model, optimizer and task built into the step the
  backend trains (``run.extra["phases"]["build"]``: ``TorchTask.to_step``,
  ``JaxTask.to_step``): the user's code, which a training script runs too (a process's
  first ``torch.optim`` optimizer imports ``torch._dynamo``, about a second), so not
  the plugin's;
* ``plugin``: the rest, what the plugin costs: probing the device, counting memory,
  fingerprinting, warm-up steps, the drift probes, launching ranks,
  the checks and the reports. For an in-process case it is split further from
  ``run.extra["phases"]`` (:class:`pytest_accelperf.backends.measure.common.Phases`): ``memory``
  (torch on CPU: the counted steps), ``flops`` (torch: the counted step), ``check``
  (JAX: the init's abstract trace, the shardings, checking what the step returns: the
  compile phase less the step's trace, lowering and compile),
  ``program`` (JAX: the program record and the memory analysis), ``probe`` (making the
  drift probe), ``loop`` (the training loop outside the measured steps, the batches and the
  compile: warm-up steps, the drift probes (after every measured step, every k-th past
  100: ``loop.MAX_PROBES``), reading the loss), ``fingerprint``,
  ``reference`` and ``other`` (the rest: the runner, the checks, the reports, pytest's
  fixtures). For a multi-process case the rest is split
  further from ``run.details["timings"]`` (rank 0's clock marks): ``start`` (interpreter
  start and imports, or a warm rank's fork), ``join`` (the process group), ``build`` (the
  engine, under the memory count), ``unmeasured`` (the training loop's time outside the
  measured steps: warm-up steps, drift probes), ``end`` (gathering the parameters,
  collecting the results), and ``outside`` (everything outside the launch: the checks,
  the reports, the reference training).

``share`` is ``plugin / (wall - lock)``. The cases of a session run in the order listed:
the first (``#`` 1) also pays what a process pays once, on its first case (importing
``scipy.stats`` for the first throughput check, about 0.5 s; jax, to find the devices, in a
torch session's fixture; the first use of MemTracker), so the summary gives the median
share of the later cases apart: the plugin's cost per case. The table is printed
(markdown) and every raw number written to ``OUT/cost-<time>.json``, with the load average
before and after each session.
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
    "torch": ("suites/torch/test_torch_gpt.py",
              ["test_torch_gpt[torch-nomesh-b32]", "test_torch_gpt[torch-nomesh-b8]"]),
    "deepspeed": ("suites/torch/test_deepspeed.py",
                  ["test_zero[deepspeed-gpt-w2-zero0-b4]", "test_zero[deepspeed-gpt-w2-zero1-b4]",
                   "test_zero[deepspeed-gpt-w2-zero2-b4]"]),
}
#: Kinds whose cases train in ranks (the pool setting applies).
MULTI = ("deepspeed",)


def run_session(kind: str, pool: str, scratch: Path, steps: int | None = None
                ) -> dict[str, Any]:
    """One pytest session of ``kind``'s cases (``steps`` measured steps each, default the
    suite's); its report, probe data and loads."""
    suite, tests = KINDS[kind]
    report = scratch / f"{kind}-{pool}.json"
    probe = scratch / f"{kind}-{pool}.probe.json"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(PROBE_DIR), env.get("PYTHONPATH", "")])
    env["ACCELPERF_COST_OUT"] = str(probe)
    env["ACCELPERF_RANK_POOL"] = "1" if pool == "on" else "0"
    env.pop("ACCELPERF_COST_STEPS", None)
    if steps is not None:
        env["ACCELPERF_COST_STEPS"] = str(steps)
    cmd = [sys.executable, "-m", "pytest", *[f"{suite}::{t}" for t in tests], "--accel=cpu",
           "-q", "-p", "no:cacheprovider", "-p", "costprobe", f"--accelperf-json={report}"]
    if steps is not None:  # baselines of N steps first, in a scratch store (untimed)
        store = scratch / f"store-{kind}-{pool}-{steps}"
        cmd.append(f"--accelperf-baselines={store}")
        subprocess.run([*cmd, "--accelperf-update"], cwd=ROOT, env=env, capture_output=True,
                       text=True, check=False)
        report.unlink(missing_ok=True)
    load_before = os.getloadavg()
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                          check=False)
    wall = time.monotonic() - t0
    load_after = os.getloadavg()
    if not report.exists() or not probe.exists():
        raise RuntimeError(f"{kind} ({pool}): no report; pytest said:\n"
                           f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return {"kind": kind, "pool": pool, "steps": steps, "command": " ".join(cmd),
            "exit_status": proc.returncode,
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
        order = list(nodes).index(case["nodeid"]) + 1 if case["nodeid"] in nodes else None
        extra = run.get("extra") or {}
        phases = extra.get("phases")
        build = float(phases.get("build", 0.0)) if phases else 0.0
        trace = float(extra.get("trace_time") or 0.0)  # JAX: jit's one trace of the step
        batches = float(extra.get("batch_time") or 0.0) if phases else 0.0
        plugin = net - compile_s - trace - steps - confirm - build - batches
        row: dict[str, Any] = {
            "kind": session["kind"], "pool": session["pool"], "case": case["case_id"],
            "order": order, "outcome": run.get("outcome"),
            "n_steps": len(run.get("step_times") or []),
            "wall": wall, "lock": lock, "build": build, "compile": compile_s, "trace": trace,
            "batches": batches, "steps": steps,
            "confirm": confirm, "plugin": plugin, "share": plugin / net if net > 0 else None}
        if phases:
            row["phases"] = phase_split(phases, extra, compile_s + trace, steps + batches,
                                        net - confirm)
        timings = extra.get("timings")
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


#: The plugin's parts of an in-process case (:func:`phase_split`), in the table's order.
PHASES = ("memory", "flops", "check", "program", "probe", "loop", "fingerprint", "reference",
          "other")


def phase_split(phases: dict[str, float], extra: dict[str, Any], compile_s: float,
                steps: float, net: float) -> dict[str, float]:
    """An in-process case's plugin time by part (the module doc), from its
    ``run.extra["phases"]``; ``net`` is its wall time less lock and confirmation. The
    parts and ``build``, ``compile`` (with JAX's trace of the step) and ``steps`` (with the
    batches) add up to ``net``."""
    if "compile" in phases:  # JAX: the step's trace and compile are inside the compile phase
        trace = float(extra.get("trace_time") or 0.0)
        step_part = float((extra.get("compile_time_parts") or {}).get("step", compile_s))
        check = phases["compile"] - step_part - trace
        compile_in_train = compile_s - step_part - trace  # the init's compile
    else:  # torch: a compiled step's compile is its first warm-up step, in the loop
        check, compile_in_train = 0.0, compile_s
    named = {"memory": phases.get("memory", 0.0), "flops": phases.get("flops", 0.0),
             "check": check, "program": phases.get("program", 0.0),
             "probe": phases.get("probe", 0.0),
             "loop": phases.get("train", 0.0) - steps - compile_in_train,
             "fingerprint": phases.get("fingerprint", 0.0),
             "reference": phases.get("reference", 0.0)}
    accounted = sum(named.values()) + phases.get("build", 0.0) + compile_s + steps
    return {**named, "other": net - accounted}


def _f(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def table(rows: list[dict[str, Any]]) -> str:
    head = ("| kind | pool | case | # | measured steps | wall s | lock s | build s | "
            "compile s | trace s | batches s | steps s | confirm s | plugin s | plugin share | "
            "launch: start / join / build / unmeasured / end / outside s |")
    lines = [head, "|" + "---|" * 17]
    for r in rows:
        launch = r.get("launch")
        split = (" / ".join(_f(launch.get(k)) for k in ("start", "join", "build", "unmeasured",
                                                        "end", "outside"))
                 + (f" (pool case {launch['pool_case']})" if launch.get("pooled") else "")
                 if launch else "")
        lines.append(f"| {r['kind']} | {r['pool'] if r['kind'] in MULTI else '-'} | "
                     f"{r['case']} | {r.get('order') or '-'} | {r.get('n_steps', '-')} | "
                     f"{_f(r['wall'])} | "
                     f"{_f(r['lock'])} | {_f(r.get('build'))} | {_f(r['compile'])} | "
                     f"{_f(r.get('trace'))} | {_f(r.get('batches'))} | {_f(r['steps'])} | "
                     f"{_f(r['confirm'])} | "
                     f"{_f(r['plugin'])} | "
                     f"{_f(100 * r['share'], 0) + ' %' if r['share'] is not None else '-'} | "
                     f"{split} |")
    return "\n".join(lines)


def phase_table(rows: list[dict[str, Any]]) -> str:
    """The plugin time of the in-process cases by part (:func:`phase_split`)."""
    lines = ["| kind | case | # | measured steps | plugin s | "
             + " | ".join(f"{p} s" for p in PHASES) + " |", "|" + "---|" * (5 + len(PHASES))]
    for r in rows:
        split = r.get("phases")
        if split:
            lines.append(f"| {r['kind']} | {r['case']} | {r.get('order') or '-'} | "
                         f"{r.get('n_steps', '-')} | "
                         f"{_f(r['plugin'])} | "
                         + " | ".join(_f(split[p], 3) for p in PHASES) + " |")
    return "\n".join(lines) if len(lines) > 2 else ""


def _median_share(rows: list[dict[str, Any]]) -> str:
    shares = [r["share"] for r in rows if r["share"] is not None]
    return f"{_f(100 * statistics.median(shares), 0)} %" if shares else "-"


def summary(rows: list[dict[str, Any]]) -> str:
    """Median share of plugin time per (kind, pool), of all cases and of the cases after
    the first of their session, and the cases' mean wall time."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["kind"], r["pool"] if r["kind"] in MULTI else "-"), []).append(r)
    lines = ["| kind | pool | cases | median plugin share | median share, cases after a "
             "session's first | mean wall s (lock excluded) |", "|---|---|---|---|---|---|"]
    for (kind, pool), rs in groups.items():
        walls = [r["wall"] - r["lock"] for r in rs]
        later = [r for r in rs if (r.get("order") or 1) > 1]
        lines.append(f"| {kind} | {pool} | {len(rs)} | {_median_share(rs)} | "
                     f"{_median_share(later)} | {_f(statistics.mean(walls))} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1, help="sessions of each kind and pool")
    parser.add_argument("--pool", default="on,off", help="pool settings for multi-process "
                        "kinds: on, off or both (on,off)")
    parser.add_argument("--kinds", default=",".join(KINDS), help="comma-separated kinds")
    parser.add_argument("--steps", type=int, default=None,
                        help="run every case with this many measured steps instead of the "
                        "suite's, the share at a realistic length (each session recorded "
                        "first into a scratch baseline store, untimed, then measured "
                        "against it)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args(argv)
    kinds = [k for k in args.kinds.split(",") if k]
    pools = [p for p in args.pool.split(",") if p]
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        parser.error(f"unknown kind(s) {', '.join(unknown)}: choose from {', '.join(KINDS)}")
    if args.steps is not None and args.steps < 3:
        parser.error(f"--steps {args.steps}: at least 3 measured steps (the throughput "
                     f"check's minimum)")
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / f"cost-{stamp}.json"
    sessions: list[dict[str, Any]] = []
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="accelperf-cost-") as tmp:
        for rep in range(args.runs):
            for kind in kinds:
                for pool in (pools if kind in MULTI else ["on"]):
                    session = run_session(kind, pool, Path(tmp), args.steps)
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
    split = phase_table(rows)
    if split:
        print()
        print(split)
    print()
    print(summary(rows))
    print(f"\nraw numbers: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
