#!/usr/bin/env python
"""A benchmark of the program check: false alarms on unchanged code, and which injected
program regressions it catches and names, next to the throughput check in the same runs.

::

    python benchmarks/program.py [--sessions 50] [--per-regression 3] [--load none,cpu]
                                 [--tests test_jax_step,test_torch_eager_gpt,...]
                                 [--regressions extra_matmul,precision,lost_sharding,...]
                                 [--tight-tolerance 0.05] [--steps 30] [--out DIR] [--keep]

copies ``benchmarks/program_suite/`` to a scratch directory (its own rootdir: 8 virtual CPU
devices, ``baselines/``), records every case's baseline there in one quiet session
(``--accelperf-update``), then runs, under every competing load (``none``, ``cpu``: the
gate benchmark's one-core numpy loop), ``--sessions`` N unchanged sessions and
``--per-regression`` K sessions of each injected regression, interleaved.

A *session* is one pytest process. An unchanged session runs all five cases of the suite
(``test_jax_sharded``: a JAX MLP on a 4x2 mesh, both parameters split over ``model``;
``test_jax_step``: the same MLP without a mesh; ``test_torch_compiled``: a torch MLP
through ``torch.compile``; ``test_torch_eager_gpt``: Hugging Face's GPT-2, eager, trained
by a nanoGPT-style loop of 4 micro-steps under bfloat16 autocast, fed by a generator;
``test_flax_bn``: a Flax CNN with BatchNorm trained as Flax's ImageNet example trains),
with ``ACCELPERF_BENCH_INJECT=none``. A regression's session
runs only the case its injection changes (``ACCELPERF_BENCH_INJECT=<name>``; see
``program_suite/inject.py``): the same files, whose code then behaves as a pull request
would make it. A *trial* is one case's checks in one session: an unchanged session gives
five trials, a regression's session one.

Per trial it records, from the session's ``--accelperf-json``: the program check's verdict
and message, the memory check's (the leak verdict), the throughput check's, the compile
check's, the input check's (the slow batch function: CPU time making each batch, outside
the step's timer), the numerics check's (the whole training state's fingerprint:
BatchNorm's running statistics), and the session's wall time. The host-side regressions
need ``pip install transformers`` (the eager GPT's model). The throughput tolerance alternates
between sessions: repetition r of every condition runs with the plugin's default (0.10)
when r is even and ``--tight-tolerance`` (0.05) when r is odd, so both tolerances see
every condition and the same machine states (one pytest session judges a case at one
tolerance; confirmation of a throughput regression, ``--accelperf-confirm=1``, is the
plugin's default in both).

It prints a table of false alarms over the unchanged trials (program, memory, throughput
at both tolerances, compile, input) with 95 % Clopper-Pearson intervals, and a table of the
injected regressions (caught by the program check, by throughput at each tolerance, by
memory, and whether the message names the change), and writes every raw trial to
``DIR/program-<time>.json`` (rewritten after every session) and the tables to
``DIR/program-<time>.md``.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import importlib.util
import json
import os
import shlex
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tabulate import tabulate

HERE = Path(__file__).resolve().parent


def _load(name: str, path: Path) -> Any:
    """A Python file as a module (benchmarks/ is not a package)."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


#: The gate benchmark: its session driver (``run_session``, ``Session``), competing load
#: (``competing_load``, ``LOADS``), Clopper-Pearson rates (``rate_ci``, ``_rate_text``) and
#: JSON writing, reused as they are.
gate = _load("accelperf_gate_benchmark", HERE / "gate.py")
LOADS: tuple[str, ...] = gate.LOADS
competing_load = gate.competing_load
parse_names = gate.parse_names
run_session = gate.run_session


def rate_ci(k: int, n: int) -> tuple[float, float]:
    """95 % Clopper-Pearson interval of ``k / n`` (the gate benchmark's)."""
    lo, hi = gate.rate_ci(k, n)
    return float(lo), float(hi)


def _rate_text(k: int, n: int) -> str:
    return str(gate._rate_text(k, n))


SUITE = HERE / "program_suite"
SUITE_MODULE = "test_program_cases.py"
TESTS = ("test_jax_sharded", "test_jax_step", "test_torch_compiled", "test_torch_eager_gpt",
         "test_flax_bn")
#: The plugin's default throughput tolerance, and the tight one of the comparison.
DEFAULT_TOLERANCE = 0.10
TIGHT_TOLERANCE = 0.05
SLOWDOWN_ENV = "ACCELPERF_INJECT_SLOWDOWN"  # the gate benchmark's; never set here
SESSION_TIMEOUT = 900.0


#: ``program_suite/inject.py``: the injections and the test each one changes.
INJECT = _load("accelperf_program_inject", SUITE / "inject.py")
INJECT_ENV: str = INJECT.ENV
STEPS_ENV: str = INJECT.STEPS_ENV
#: Injection -> the test whose code it changes.
TARGETS: dict[str, str] = dict(INJECT.INJECTIONS)
REGRESSIONS = tuple(TARGETS)
#: Injection -> (the check expected to catch it, words its message must contain to name
#: the change).
EXPECTED: dict[str, tuple[str, tuple[str, ...]]] = {
    "extra_matmul": ("program", ("FLOPs +", "dot")),
    "precision": ("program", ("dot[highest]",)),
    "lost_sharding": ("program", ("all-gather",)),
    "graph_break": ("program", ("graph breaks: 0 → ",)),
    "leak": ("memory", ("a leak", "live memory grew")),
    "slow_batch": ("input", ("CPU per step", "x the baseline's")),
    "item_sync": ("program", ("host syncs: 0 → 4 per step", "_local_scalar_dense")),
    "manual_attention": ("program", ("_scaled_dot_product_flash_attention", "bmm")),
    "autocast_off": ("program", ("matmul dtypes: bf16", "f32 0 → ")),
    "bn_momentum": ("numerics", ("batch_stats/",)),
}
#: The checks a trial records, and whether each reads wall-clock time (the target of the
#: host-side regressions: caught by a check that does not).
CHECKS = ("program", "memory", "numerics", "input", "throughput", "compile")
WALL_CLOCK = frozenset({"throughput", "compile"})


# --------------------------------------------------------------------------------------
# One session: its environment, its arguments, its trials


@dataclass(frozen=True)
class Condition:
    load: str
    inject: str  # "none" or one of REGRESSIONS
    suite: tuple[str, ...] = TESTS  # the tests of an unchanged session

    @property
    def label(self) -> str:
        return f"load={self.load} inject={self.inject}"

    @property
    def tests(self) -> tuple[str, ...]:
        return self.suite if self.inject == "none" else (TARGETS[self.inject],)


def tolerance_of(rep: int, tight: float) -> float:
    """The throughput tolerance of repetition ``rep``: the default on even, ``tight`` on odd.

    >>> [tolerance_of(r, 0.05) for r in range(3)]
    [0.1, 0.05, 0.1]
    """
    return DEFAULT_TOLERANCE if rep % 2 == 0 else tight


def schedule(loads: Sequence[str], sessions: int, per_regression: int,
             regressions: Sequence[str], tests: Sequence[str] = TESTS
             ) -> list[tuple[int, Condition]]:
    """Repetition ``r`` runs, in an order rotated by ``r``, every condition that still has
    repetitions: the unchanged one while ``r < sessions``, each regression while ``r <
    per_regression``; so the regressions come first, spread over the machine's states like
    the unchanged sessions, and an interrupted benchmark has measured all of them.

    >>> [(r, c.load, c.inject) for r, c in schedule(["none"], 2, 1, ["leak"])]
    [(0, 'none', 'none'), (0, 'none', 'leak'), (1, 'none', 'none')]
    """
    plan: list[tuple[int, Condition]] = []
    for r in range(max(sessions, per_regression)):
        conds = [Condition(load, inj, tuple(tests)) for load in loads
                 for inj, n in (("none", sessions), *((x, per_regression) for x in regressions))
                 if r < n]
        k = r % len(conds)
        plan.extend((r, c) for c in [*conds[k:], *conds[:k]])
    return plan


def session_env(inject: str, steps: int | None) -> dict[str, str]:
    """This environment, with the injection (and the steps) of one session; not an xdist
    worker's variables (a test of this benchmark may run under -n)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTEST_XDIST_", "PYTEST_CURRENT_TEST"))
           and k not in (SLOWDOWN_ENV, INJECT_ENV, STEPS_ENV)}
    env[INJECT_ENV] = inject
    if steps is not None:
        env[STEPS_ENV] = str(steps)
    return env


def test_ids(tests: Sequence[str]) -> list[str]:
    return [f"{SUITE_MODULE}::{t}" for t in tests]


def _check(checks: dict[str, Any], metric: str) -> dict[str, Any]:
    """A check's verdict, message and alarm (``regression``); None verdict when absent."""
    c = checks.get(metric)
    if c is None:
        return {"verdict": None, "alarm": None, "detail": None}
    return {"verdict": c.get("verdict"), "alarm": c.get("verdict") == "regression",
            "detail": c.get("detail")}


def parse_trials(report_path: Path, session: Any, tests: Sequence[str]
                 ) -> list[dict[str, Any]]:
    """One trial per test of the session (a ``gate.Session``), from its JSON report; a
    test without a case in the report is a trial with an ``error`` and no verdicts."""
    by_test: dict[str, dict[str, Any]] = {}
    if report_path.is_file():
        report = json.loads(report_path.read_text(encoding="utf-8"))
        for case in report.get("cases") or []:
            name = str(case.get("nodeid", "")).split("::")[-1].split("[")[0]
            by_test[name] = case
    trials = []
    for test in tests:
        case = by_test.get(test)
        if case is None:
            trials.append({"test": test, "error": "no case in the accelperf JSON report "
                           "(the session did not get that far)", "program": _check({}, ""),
                           **{c: _check({}, "") for c in CHECKS if c != "program"}})
            continue
        checks = {c["metric"]: c for c in case.get("checks") or []}
        run = case.get("run") or {}
        tp = _check(checks, "throughput")
        tp_data = (checks.get("throughput") or {}).get("data") or {}
        tp.update({"ratio": tp_data.get("ratio"), "ci": tp_data.get("ci"),
                   "mdc": tp_data.get("mdc"), "tolerance": tp_data.get("tolerance"),
                   "confirmations": tp_data.get("confirmations"),
                   "unconfirmed": tp_data.get("unconfirmed")})
        prog = _check(checks, "program")
        prog_data = (checks.get("program") or {}).get("data") or {}
        prog["changes"] = prog_data.get("changes")
        record = prog_data.get("program") or run.get("program") or {}
        # What the message leaves out: dynamo's reasons for a break, and for a recompile.
        prog["break_reasons"] = record.get("break_reasons")
        prog["recompile_reasons"] = (run.get("extra") or {}).get("recompile_reasons")
        mem = _check(checks, "memory")
        mem["growth"] = run.get("memory_growth")
        inp = _check(checks, "input")
        inp_data = (checks.get("input") or {}).get("data") or {}
        inp.update({"ratio": inp_data.get("ratio"), "share": inp_data.get("share")})
        trial: dict[str, Any] = {
            "test": test, "case_id": case.get("case_id"), "error": case.get("error"),
            "outcome": run.get("outcome"), "program": prog, "memory": mem, "throughput": tp,
            "compile": _check(checks, "compile"), "input": inp,
            "numerics": _check(checks, "numerics"),
            "other_regressions": sorted(m for m, c in checks.items()
                                        if c.get("verdict") == "regression"
                                        and m not in CHECKS),
            "wall_s": session.test_wall_s.get(case.get("nodeid", "").split("::")[-1]),
        }
        trials.append(trial)
    return trials


def named(inject: str, detail: str | None) -> bool:
    """Whether a message names the injected change (every expected word in it)."""
    return bool(detail) and all(w in (detail or "") for w in EXPECTED[inject][1])


# --------------------------------------------------------------------------------------
# Tables

#: The arms of the false-alarm table: (label, check, tolerance or None for any).
def arms(tight: float) -> list[tuple[str, str, float | None]]:
    return [("program", "program", None), ("memory (leak, peak)", "memory", None),
            (f"throughput, tolerance {DEFAULT_TOLERANCE:g}", "throughput", DEFAULT_TOLERANCE),
            (f"throughput, tolerance {tight:g}", "throughput", tight),
            ("compile time", "compile", None), ("input", "input", None),
            ("numerics (state fingerprint)", "numerics", None)]


def _decided(trials: Sequence[dict[str, Any]], check: str) -> list[dict[str, Any]]:
    return [t for t in trials if t[check]["alarm"] is not None]


def false_alarm_rows(runs: Sequence[dict[str, Any]], loads: Sequence[str],
                     tight: float) -> list[dict[str, Any]]:
    """Per load and arm, over the unchanged sessions' trials: trials, alarms, inconclusive,
    errors."""
    rows = []
    for load in [*loads, "all"]:
        mine = [(r, t) for r in runs if r["inject"] == "none" and (load == "all"
                                                                   or r["load"] == load)
                for t in r["trials"]]
        for label, check, tol in arms(tight):
            trials = [t for r, t in mine if tol is None or r["tolerance"] == tol]
            decided = _decided(trials, check)
            alarms = sum(1 for t in decided if t[check]["alarm"])
            rows.append({
                "load": load, "check": label, "trials": len(trials),
                "sessions": len({r["index"] for r, t in mine
                                 if tol is None or r["tolerance"] == tol}),
                "alarms": alarms, "decided": len(decided),
                "alarm_ci": list(rate_ci(alarms, len(decided))) if decided else None,
                "inconclusive": sum(1 for t in trials
                                    if t[check]["verdict"] == "inconclusive"),
                "errors": len(trials) - len(decided),
                "alarm_cases": sorted({t["test"] for t in decided if t[check]["alarm"]}),
            })
    return rows


def regression_rows(runs: Sequence[dict[str, Any]], regressions: Sequence[str],
                    loads: Sequence[str], tight: float) -> list[dict[str, Any]]:
    """Per injected regression and load: how often each check caught it, and the program
    (or memory, or input) check's messages."""
    rows = []
    for inject in regressions:
        for load in [*loads, "all"]:
            trials = [(r, t) for r in runs if r["inject"] == inject
                      and (load == "all" or r["load"] == load) for t in r["trials"]]
            if not trials:
                continue
            row: dict[str, Any] = {"regression": inject, "case": TARGETS[inject],
                                   "load": load, "trials": len(trials)}
            for check in ("program", "memory", "input", "numerics"):
                decided = [t for _, t in trials if t[check]["alarm"] is not None]
                row[check] = {"caught": sum(1 for t in decided if t[check]["alarm"]),
                              "decided": len(decided),
                              "named": sum(1 for t in decided
                                           if t[check]["alarm"]
                                           and named(inject, t[check]["detail"])),
                              "messages": sorted({t[check]["detail"] for t in decided
                                                  if t[check]["alarm"]})}
            for tol in (DEFAULT_TOLERANCE, tight):
                decided = [t for r, t in trials if r["tolerance"] == tol
                           and t["throughput"]["alarm"] is not None]
                row[f"throughput@{tol:g}"] = {
                    "caught": sum(1 for t in decided if t["throughput"]["alarm"]),
                    "decided": len(decided),
                    "inconclusive": sum(1 for t in decided
                                        if t["throughput"]["verdict"] == "inconclusive"),
                    "ratios": [t["throughput"]["ratio"] for t in decided]}
            rows.append(row)
    return rows


def _frac(k: int, n: int) -> str:
    return "-" if n == 0 else f"{k}/{n}"


def render(doc: dict[str, Any]) -> str:
    cfg = doc["config"]
    tight = cfg["tight_tolerance"]
    fa = [[r["load"], r["check"], r["sessions"], r["trials"],
           _rate_text(r["alarms"], r["decided"]), r["inconclusive"] or "",
           r["errors"] or ""] for r in doc["false_alarms"]]
    text = [f"False alarms over the unchanged trials ({len(cfg['tests'])} cases per session; "
            "throughput's tolerance alternates between sessions)\n",
            tabulate(fa, headers=["load", "check", "sessions", "trials", "alarms [95% CI]",
                                  "inconclusive", "errors"], tablefmt="github")]
    rg = []
    for r in doc["regressions"]:
        expected = EXPECTED[r["regression"]][0]
        p, m, n, q = r["program"], r["memory"], r["input"], r["numerics"]
        t0, t1 = r[f"throughput@{DEFAULT_TOLERANCE:g}"], r[f"throughput@{tight:g}"]
        rg.append([r["regression"], r["case"], r["load"], r["trials"],
                   _frac(p["caught"], p["decided"])
                   + (f" (named {p['named']})" if expected == "program" else ""),
                   _frac(m["caught"], m["decided"])
                   + (f" (named {m['named']})" if expected == "memory" else ""),
                   _frac(n["caught"], n["decided"])
                   + (f" (named {n['named']})" if expected == "input" else ""),
                   _frac(q["caught"], q["decided"])
                   + (f" (named {q['named']})" if expected == "numerics" else ""),
                   _frac(t0["caught"], t0["decided"])
                   + (f", {t0['inconclusive']} inconcl." if t0["inconclusive"] else ""),
                   _frac(t1["caught"], t1["decided"])
                   + (f", {t1['inconclusive']} inconcl." if t1["inconclusive"] else "")])
    text += ["\nInjected regressions: sessions that caught it (caught/trials; named: the "
             "message names the change)\n",
             tabulate(rg, headers=["regression", "case", "load", "trials", "program",
                                   "memory", "input", "numerics",
                                   f"throughput {DEFAULT_TOLERANCE:g}",
                                   f"throughput {tight:g}"], tablefmt="github")]
    text.append("\nMessages (of the check expected to catch each; program, memory, input and "
                "numerics read no wall-clock time):\n")
    for r in doc["regressions"]:
        if r["load"] != "all":
            continue
        check = EXPECTED[r["regression"]][0]
        msgs = r[check]["messages"] or ["(not caught)"]
        for msg in msgs:
            text.append(f"- {r['regression']} ({check}): {msg}")
    walls = doc["session_walls"]
    text.append("\nSession wall time, median [min-max] s: " + "; ".join(
        f"{k} {v['median']:.1f} [{v['min']:.1f}-{v['max']:.1f}] (n={v['n']})"
        for k, v in walls.items()))
    return "\n".join(text)


def session_walls(runs: Sequence[dict[str, Any]]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    groups: dict[str, list[float]] = {}
    for r in runs:
        kind = "unchanged" if r["inject"] == "none" else "regression"
        groups.setdefault(f"{kind}/{r['load']}", []).append(r["wall_s"])
    for key, values in sorted(groups.items()):
        out[key] = {"median": statistics.median(values), "min": min(values),
                    "max": max(values), "n": len(values)}
    return out


# --------------------------------------------------------------------------------------
# The benchmark


def plugin_source(env: dict[str, str]) -> dict[str, Any]:
    """Which ``pytest_accelperf`` the sessions import (``PYTHONPATH`` may name a snapshot),
    and its git commit: a ``COMMIT`` file beside the package, else ``git rev-parse HEAD``
    of the tree holding it, with whether the package differs from it there."""
    import subprocess

    found = subprocess.run(
        [sys.executable, "-c", "import importlib.util as u; "
         "print(u.find_spec('pytest_accelperf').submodule_search_locations[0])"],
        env=env, cwd=tempfile.gettempdir(), capture_output=True, text=True, check=False)
    path = Path(found.stdout.strip()) if found.returncode == 0 else None
    out: dict[str, Any] = {"path": str(path) if path else None}
    if path is None:
        return out
    stamp = path.parent / "COMMIT"
    if stamp.is_file():
        out["commit"] = stamp.read_text(encoding="utf-8").strip()
        out["modified"] = False
        return out
    head = subprocess.run(["git", "-C", str(path.parent), "rev-parse", "HEAD"],
                          capture_output=True, text=True, check=False)
    if head.returncode == 0:
        out["commit"] = head.stdout.strip()
        diff = subprocess.run(["git", "-C", str(path.parent), "diff", "--quiet", "HEAD", "--",
                               path.name], capture_output=True, check=False)
        out["modified"] = diff.returncode != 0
    return out


def prepare_workdir(workdir: Path) -> None:
    """A fresh copy of ``benchmarks/program_suite`` (its own rootdir)."""
    shutil.copytree(SUITE, workdir, ignore=shutil.ignore_patterns(
        "__pycache__", "baselines", ".pytest_cache"))


def summarize(doc: dict[str, Any]) -> None:
    cfg = doc["config"]
    doc["false_alarms"] = false_alarm_rows(doc["runs"], cfg["loads"], cfg["tight_tolerance"])
    doc["regressions"] = regression_rows(doc["runs"], cfg["regressions"], cfg["loads"],
                                         cfg["tight_tolerance"])
    doc["session_walls"] = session_walls(doc["runs"])


def run_benchmark(ns: argparse.Namespace, argv: Sequence[str]) -> int:
    out_dir = Path(ns.out).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    json_path, md_path = out_dir / f"program-{stamp}.json", out_dir / f"program-{stamp}.md"
    workdir = Path(tempfile.mkdtemp(prefix="accelperf-program-")) / "suite"
    prepare_workdir(workdir)
    extra = shlex.split(ns.pytest_args or "")
    command = shlex.join([Path(sys.executable).name, *argv])
    plan = schedule(ns.load, ns.sessions, ns.per_regression, ns.regressions, ns.tests)
    doc: dict[str, Any] = {
        "command": command, "argv": list(argv), "cwd": os.getcwd(),
        "started": _dt.datetime.now().isoformat(timespec="seconds"),
        "config": {"sessions": ns.sessions, "per_regression": ns.per_regression,
                   "loads": ns.load, "regressions": ns.regressions, "steps": ns.steps,
                   "default_tolerance": DEFAULT_TOLERANCE,
                   "tight_tolerance": ns.tight_tolerance, "pytest_args": extra,
                   "workdir": str(workdir), "tests": list(ns.tests), "targets": TARGETS},
        "machine": gate._machine(), "plugin": plugin_source(session_env("none", None)),
        "record": {}, "runs": [],
    }
    keep = ns.keep
    print(f"plugin: {doc['plugin']}", flush=True)
    print(f"program benchmark: {len(plan)} sessions ({ns.sessions} unchanged and "
          f"{ns.per_regression} per regression, per load {', '.join(ns.load)}); scratch "
          f"suite {workdir}", flush=True)
    t_start = time.monotonic()
    try:
        rec = run_session(workdir, workdir / "runs" / "record", test_ids(ns.tests),
                          ["--accelperf-update",
                           f"--accelperf-json={workdir / 'record.json'}", *extra],
                          session_env("none", ns.steps), SESSION_TIMEOUT)
        doc["record"] = {"rc": rec.rc, "wall_s": round(rec.wall_s, 3),
                         "test_wall_s": rec.test_wall_s, "loadavg": list(os.getloadavg())}
        print(f"recorded baselines: {rec.wall_s:.1f} s, exit {rec.rc}", flush=True)
        if rec.rc != 0:
            keep = True
            print(rec.output[-4000:], file=sys.stderr)
            print(f"recording the baselines failed (exit {rec.rc}); output in {rec.run_dir}",
                  file=sys.stderr)
            return 1
        for i, (rep, cond) in enumerate(plan):
            tol = tolerance_of(rep, ns.tight_tolerance)
            run_dir = workdir / "runs" / f"{i:04d}"
            args = [f"--accelperf-json={run_dir / 'accelperf.json'}",
                    f"--accelperf-throughput-tolerance={tol:g}", *extra]
            load_before = os.getloadavg()[0]
            with competing_load(cond.load):
                sess = run_session(workdir, run_dir, test_ids(cond.tests), args,
                                   session_env(cond.inject, ns.steps), SESSION_TIMEOUT)
            trials = parse_trials(run_dir / "accelperf.json", sess, cond.tests)
            record: dict[str, Any] = {
                "index": i, "rep": rep, "load": cond.load, "inject": cond.inject,
                "tolerance": tol, "rc": sess.rc, "timed_out": sess.timed_out,
                "wall_s": round(sess.wall_s, 3), "loadavg_before": load_before,
                "waited_for_host_lock": "waiting for the CPU host lock" in sess.output,
                "trials": trials}
            if any(t.get("error") for t in trials) or sess.rc not in (0, 1):
                record["output_tail"] = sess.output[-3000:]
            doc["runs"].append(record)
            gate._write(json_path, doc)
            brief = "  ".join(
                f"{t['test'].removeprefix('test_')}: program={t['program']['verdict']} "
                f"memory={t['memory']['verdict']} throughput={t['throughput']['verdict']}"
                for t in trials)
            print(f"[{i + 1}/{len(plan)}] {cond.label} tol={tol:g}: {brief}  "
                  f"{sess.wall_s:.1f} s", flush=True)
    except KeyboardInterrupt:
        print("interrupted: the sessions so far are in the results below", file=sys.stderr)
    finally:
        doc["finished"] = _dt.datetime.now().isoformat(timespec="seconds")
        doc["wall_s"] = round(time.monotonic() - t_start, 1)
        doc["loadavg_end"] = list(os.getloadavg())
        summarize(doc)
        gate._write(json_path, doc)
        text = render(doc)
        header = (f"`{command}`\n\n{len(doc['runs'])} sessions (+1 recording) in "
                  f"{doc['wall_s'] / 60:.1f} min; load average at the start "
                  f"{doc['machine'].get('loadavg', ['?'])[0]}, at the end "
                  f"{doc['loadavg_end'][0]:.2f}")
        md_path.write_text(f"{header}\n\n{text}\n", encoding="utf-8")
        print(f"\n{header}\n\n{text}\n\nraw results: {json_path}\ntables: {md_path}")
        if not keep:
            shutil.rmtree(workdir.parent, ignore_errors=True)
        else:
            print(f"scratch suite kept: {workdir}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="benchmarks/program.py", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="See benchmarks/README.md (Program mode) for what each number means.")
    p.add_argument("--sessions", type=int, default=50, metavar="N",
                   help="unchanged sessions per load (default 50)")
    p.add_argument("--per-regression", type=int, default=3, metavar="K",
                   help="sessions of each injected regression per load (default 3)")
    p.add_argument("--load", type=parse_names(LOADS), default=list(LOADS),
                   help="competing load conditions: none, cpu (default none,cpu)")
    p.add_argument("--tests", type=parse_names(TESTS), default=list(TESTS),
                   help=f"the suite's tests of an unchanged session (default all: "
                        f"{','.join(TESTS)})")
    p.add_argument("--regressions", type=parse_names(REGRESSIONS), default=None,
                   help=f"injected regressions (default: every one whose test is in "
                        f"--tests: {','.join(REGRESSIONS)})")
    p.add_argument("--tight-tolerance", type=float, default=TIGHT_TOLERANCE,
                   help=f"the throughput tolerance of odd repetitions (default "
                        f"{TIGHT_TOLERANCE:g}; even ones use the plugin's "
                        f"{DEFAULT_TOLERANCE:g})")
    p.add_argument("--steps", type=int, default=None,
                   help="measured steps of every case (default: the suite's, 30)")
    p.add_argument("--pytest-args", default="",
                   help="extra arguments for every session (one shell-quoted string)")
    p.add_argument("--out", default=str(HERE / "results"),
                   help="directory for the JSON and Markdown results (default "
                        "benchmarks/results)")
    p.add_argument("--keep", action="store_true", help="keep the scratch suite and outputs")
    return p


def _terminated(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    signal.signal(signal.SIGTERM, _terminated)
    parser = build_parser()
    ns = parser.parse_args(argv)
    if ns.sessions < 0 or ns.per_regression < 0 or ns.sessions + ns.per_regression == 0:
        parser.error("--sessions and --per-regression must be >= 0, and not both 0")
    if ns.regressions is None:
        ns.regressions = [r for r in REGRESSIONS if TARGETS[r] in ns.tests]
    outside = [r for r in ns.regressions if TARGETS[r] not in ns.tests]
    if outside:
        parser.error(f"--regressions {','.join(outside)}: their tests "
                     f"({', '.join(sorted({TARGETS[r] for r in outside}))}) are not in "
                     f"--tests; add them there")
    return run_benchmark(ns, ["benchmarks/program.py", *argv])


if __name__ == "__main__":
    sys.exit(main())
