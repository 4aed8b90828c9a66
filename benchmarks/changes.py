#!/usr/bin/env python
"""How good change points over the history are, replayed over this machine's real noise,
beside the rule the HTML report used before (issue 27); and how long 100,000 lines take.

::

    python benchmarks/changes.py detection [--history DIR|FILE ...] [--gate FILE ...]
                                           [--series 300] [--sessions 100] [--out DIR]
    python benchmarks/changes.py scale [--cases 1000] [--sessions 100] [--template FILE]
                                       [--repeat 3] [--keep DIR]
    python benchmarks/changes.py example DIR [--history DIR|FILE ...]

``detection`` builds series of ``--sessions`` sessions and runs them through
:func:`pytest_accelperf.report.changes.find_changes` (the code ``accelperf history
changes`` runs) and through ``step_changes``, the rule the HTML report used before (copied
below as it was at 8d62874: a session more than a threshold away from the median of the 5
before it, at 5 % and at the default 10 %).

The noise is recorded, not drawn from a distribution:

* timing: the residuals of real sessions around their series' level,
  ``log(value / median of its series)``, resampled with replacement. Two sources, kept
  apart: the sessions of ``--history`` (lines of ``pytest suites/jax --accel=cpu
  --accelperf-history``: each case's samples/s over the sessions, this shared 2-core
  machine as it is, other jobs running) and of ``--gate`` (``benchmarks/gate.py``
  results: each session's median step time of one JAX step, per invocation, load and
  injected slowdown);
* deterministic fields: each case's recorded FLOPs, bytes accessed, peak memory and final
  loss over the ``--history`` sessions, resampled the same way (they repeat exactly, so
  the replayed series are the recorded values).

Each series is flat (``--series`` of them: false change points per 100 sessions) or has a
step of 2, 5 or 10 % planted at a session drawn from 20..80 (slower for timing, more for
the deterministic fields). A planted step is found when a change point of the right
direction lies within 2 sessions of it (exactly at it, for the deterministic fields);
any other change point is false. Both are counted per method and noise source, and
written with the command, the machine and its load to ``DIR/changes-<time>.json``
(Markdown beside it).

``scale`` writes a history of ``--cases`` x ``--sessions`` lines (each a copy of a real
line of ``--template``, default the first ok line of ``--history``, its numbers varied)
and times ``accelperf history changes`` on it in a fresh process, end to end, ``--repeat``
times each way: ``cold, one session less`` (the history without its last session, no
cache of its points), ``appended`` (the last session appended: only its lines validated,
the rest read from the cache), ``warm`` (the file as cached) and ``cold`` (the cache
deleted: every line validated, the cache written); and its parts in this one (validating
every line, reading the cache, finding), with the load average before each run and
before and after all. ``--keep DIR`` writes the history to ``DIR/history`` and keeps it
(to compare the command's output before and after a change), instead of to a temporary
directory.

``example`` writes the history the docs show ``accelperf history changes`` on (docs/cli.md,
docs/reports.md): 40 sessions of the recorded ``--history``'s cases, one real line each
copied per session (with the machine and stack hashes this version writes), its samples/s
multiplied by recorded ``--gate`` residuals; from session 15 one case's FLOPs 50 % more,
from session 25 another case 10 % slower, from session 32 jax and jaxlib 0.10.3 on the
same machine (a stack change), a third case 8 % slower under it.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import itertools
import json
import math
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tabulate import tabulate

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))

from pytest_accelperf.provision.describe import case_stack, machine  # noqa: E402
from pytest_accelperf.report.changes import Detection, find_changes  # noqa: E402
from pytest_accelperf.report.history import fingerprint_hash  # noqa: E402
from pytest_accelperf.report.points import Point, cache_path, load_points  # noqa: E402
from pytest_accelperf.store.schema import ProgramRecord  # noqa: E402

STEPS = (0.02, 0.05, 0.10)
OLD_THRESHOLDS = (0.05, 0.10)
DETERMINISTIC = ("FLOPs", "bytes accessed", "peak memory", "final loss")


# -- the rule before (report/history.py at 8d62874, verbatim but for the names) ------------------
@dataclass(frozen=True)
class StepChange:
    nodeid: str
    before: float
    after: float
    commit_before: str | None
    commit: str | None
    time: str


def step_changes(entries: list[dict[str, Any]], threshold: float,
                 window: int = 5) -> list[StepChange]:
    """Steps in samples/s along each case's history: each entry against the median of up to
    ``window`` entries before it (same environment fingerprint), counting only entries since
    the last step, so a new level is reported once, where it began."""
    by_case: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for e in entries:
        if isinstance(e.get("samples_per_second"), (int, float)):
            by_case.setdefault((e["nodeid"], str(e.get("fingerprint"))), []).append(e)
    out: list[StepChange] = []
    for (nodeid, _), seq in sorted(by_case.items()):
        start = 0
        for i in range(1, len(seq)):
            previous = seq[max(start, i - window):i]
            before = statistics.median(float(p["samples_per_second"]) for p in previous)
            after = float(seq[i]["samples_per_second"])
            if before > 0 and abs(after / before - 1) > threshold:
                out.append(StepChange(nodeid, before, after, previous[-1].get("commit"),
                                      seq[i].get("commit"), str(seq[i].get("time", ""))))
                start = i
    return out


# -- the recorded noise ----------------------------------------------------------------------------
def _history_lines(paths: Sequence[Path]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for path in paths:
        files = sorted(path.glob("*.jsonl")) if path.is_dir() else [path]
        for f in files:
            out.extend(json.loads(x) for x in f.read_text().splitlines() if x.strip())
    return out


def _residuals(groups: dict[Any, list[float]]) -> list[float]:
    """``log(value / median of its group)`` of every value of the groups of 3 or more."""
    out: list[float] = []
    for values in groups.values():
        vs = [v for v in values if v and v > 0]
        if len(vs) >= 3:
            med = statistics.median(vs)
            out.extend(math.log(v / med) for v in vs)
    return out


def history_noise(lines: list[dict[str, Any]]) -> tuple[list[float], dict[str, list[list[float]]]]:
    """Timing residuals of the recorded sessions (samples/s per case and fingerprint), and
    ``{field: [each case's recorded values]}`` of the deterministic fields."""
    timing: dict[Any, list[float]] = {}
    fields: dict[str, dict[str, list[float]]] = {f: {} for f in DETERMINISTIC}
    for e in lines:
        key = (e["nodeid"], e.get("fingerprint"))
        if isinstance(e.get("samples_per_second"), (int, float)):
            timing.setdefault(key, []).append(float(e["samples_per_second"]))
        program = e.get("program") or {}
        for name, value in (("FLOPs", program.get("flops")),
                            ("bytes accessed", program.get("bytes_accessed")),
                            ("peak memory", e.get("peak_memory")),
                            ("final loss", e.get("final_loss"))):
            if isinstance(value, (int, float)):
                fields[name].setdefault(e["nodeid"], []).append(float(value))
    kept = {name: [v for v in by_case.values() if len(v) >= 2]
            for name, by_case in fields.items()}
    return _residuals(timing), kept


def gate_noise(paths: Sequence[Path]) -> list[float]:
    """Timing residuals of ``benchmarks/gate.py`` sessions: each session's median step
    time, grouped by invocation, load and injected slowdown."""
    groups: dict[Any, list[float]] = {}
    for path in paths:
        data = json.loads(path.read_text())
        for run in data.get("runs") or []:
            for arm, a in (run.get("arms") or {}).items():
                if isinstance(a, dict) and isinstance(a.get("median_step_s"), (int, float)):
                    key = (path.name, arm, run.get("load"), a.get("injected_slowdown"))
                    groups.setdefault(key, []).append(float(a["median_step_s"]))
    return _residuals(groups)


def spread(residuals: Sequence[float]) -> dict[str, float]:
    xs = sorted(abs(math.expm1(r)) for r in residuals)
    return {"n": len(xs), "median |dev|": xs[len(xs) // 2],
            "p90 |dev|": xs[int(0.9 * (len(xs) - 1))], "max |dev|": xs[-1]}


# -- replay ----------------------------------------------------------------------------------
@dataclass
class Tally:
    sessions: int = 0
    false: int = 0
    planted: int = 0
    found: int = 0
    #: flat series with a change point of the direction looked for within 2 sessions of a
    #: session drawn as a step's would be: what "found" is worth by chance alone
    by_chance: int = 0

    def per100(self) -> float:
        return 100 * self.false / self.sessions if self.sessions else math.nan

    def share(self) -> str:
        return f"{self.found}/{self.planted} {100 * self.found / self.planted:.0f}%" \
            if self.planted else "-"


def _commit(i: int) -> str:
    return f"{i:040x}"


def _points(nodeid: str, values: Sequence[float], kind: str) -> list[Point]:
    """A case's sessions as the change-point code reads them, ``values`` in the field
    ``kind`` names."""
    out = []
    for i, v in enumerate(values):
        program: ProgramRecord | None = None
        throughput = memory = loss = None
        if kind == "timing":
            throughput = v
        elif kind == "peak memory":
            memory = v
        elif kind == "final loss":
            loss = v
        else:
            program = (ProgramRecord(source="xla", flops=v) if kind == "FLOPs"
                       else ProgramRecord(source="xla", bytes_accessed=v))
        out.append(Point(f"2026-01-01T{i:05d}", f"s{i:04d}", "cpu", nodeid, _commit(i),
                         False, "f", throughput, None, memory, loss, program))
    return out


def replay(kind: str, draw: Callable[[random.Random], list[float]], *, series: int,
           sessions: int, seed: int, detections: dict[str, Detection]
           ) -> dict[str, dict[str, Tally]]:
    """``{method: {"flat" or step: Tally}}`` over ``series`` flat series and as many per
    step size, for the change points (at each of ``detections``) and for the rule before
    at each threshold."""
    rng = random.Random(seed)
    methods = [*detections, *(f"step_changes {t:.0%}" for t in OLD_THRESHOLDS)]
    out = {m: {c: Tally() for c in ("flat", *map(str, STEPS))} for m in methods}
    exact = kind != "timing"
    for condition in ("flat", *STEPS):
        for k in range(series):
            values = draw(rng)[:sessions]
            at = None
            if condition != "flat":
                at = rng.randint(20, 80)
                factor = 1 + float(condition) if exact else 1 / (1 + float(condition))
                values = values[:at] + [v * factor for v in values[at:]]
            nodeid = f"m.py::t[{kind}-{condition}-{k}]"
            points = _points(nodeid, values, kind)
            found: dict[str, list[tuple[int, float]]] = {
                name: [(int(c.first_after.session[1:]), c.change or 0.0)
                       for c in find_changes(points, detection)]
                for name, detection in detections.items()}
            entries = [{"nodeid": nodeid, "session": f"s{i:04d}", "commit": _commit(i),
                        "time": f"{i:05d}", "fingerprint": "f", "samples_per_second": v}
                       for i, v in enumerate(values)]
            for t in OLD_THRESHOLDS:
                found[f"step_changes {t:.0%}"] = [
                    (int(str(c.commit), 16), c.after / c.before - 1)
                    for c in step_changes(entries, t)]
            for method, hits in found.items():
                tally = out[method][str(condition)]
                tally.sessions += len(values)
                hit = None
                if at is None:
                    where = rng.randint(20, 80)
                    want = 1 if exact else -1
                    tally.by_chance += any(abs(h[0] - where) <= (0 if exact else 2)
                                           and math.copysign(1, h[1]) == want for h in hits)
                else:
                    tally.planted += 1
                    near = 0 if exact else 2
                    want = 1 if exact else -1  # more FLOPs/memory/loss; less throughput
                    hit = next((h for h in hits if abs(h[0] - at) <= near
                                and math.copysign(1, h[1]) == want), None)
                    tally.found += hit is not None
                tally.false += sum(h is not hit for h in hits)
    return out


def _timing_draw(residuals: Sequence[float], sessions: int
                 ) -> Callable[[random.Random], list[float]]:
    def draw(rng: random.Random) -> list[float]:
        return [1000.0 * math.exp(rng.choice(residuals)) for _ in range(sessions)]
    return draw


def _recorded_draw(cases: Sequence[Sequence[float]], sessions: int
                   ) -> Callable[[random.Random], list[float]]:
    def draw(rng: random.Random) -> list[float]:
        recorded = rng.choice(cases)
        return [rng.choice(recorded) for _ in range(sessions)]
    return draw


def cmd_detection(args: argparse.Namespace) -> dict[str, Any]:
    lines = _history_lines(args.history)
    history_timing, recorded = history_noise(lines)
    gate = gate_noise(args.gate)
    detections = {"change points (p ≤ 0.001, the default)": Detection(),
                  "change points (--max-pvalue 0.0001)": Detection(max_pvalue=1e-4)}
    sources: dict[str, tuple[str, Callable[[random.Random], list[float]]]] = {}
    if gate:
        sources["timing, gate.py sessions"] = ("timing", _timing_draw(gate, args.sessions))
    if history_timing:
        sources["timing, suites/jax sessions"] = ("timing",
                                                  _timing_draw(history_timing, args.sessions))
    for name in DETERMINISTIC:
        if recorded[name]:
            sources[f"{name}, suites/jax sessions"] = (
                name, _recorded_draw(recorded[name], args.sessions))
    results: dict[str, Any] = {}
    for i, (source, (kind, draw)) in enumerate(sources.items()):
        t0 = time.perf_counter()
        tallies = replay(kind, draw, series=args.series, sessions=args.sessions,
                         seed=args.seed + i, detections=detections)
        results[source] = {m: {c: vars(t) for c, t in by.items()}
                           for m, by in tallies.items()}
        print(f"{source}: {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    repeats = {name: _repeat_share(cases) for name, cases in recorded.items() if cases}
    return {"noise": {"timing, gate.py sessions": spread(gate) if gate else None,
                      "timing, suites/jax sessions": spread(history_timing)
                      if history_timing else None,
                      "deterministic, consecutive sessions equal": repeats,
                      "history sessions": len({e["session"] for e in lines}),
                      "history cases": len({e["nodeid"] for e in lines}),
                      "gate files": [p.name for p in args.gate]},
            "detections": {name: vars(d) for name, d in detections.items()},
            "series": args.series, "sessions": args.sessions, "results": results}


def _repeat_share(cases: Sequence[Sequence[float]]) -> str:
    pairs = [(a, b) for c in cases for a, b in itertools.pairwise(c)]
    return f"{sum(a == b for a, b in pairs)}/{len(pairs)}"


def detection_table(result: dict[str, Any]) -> str:
    rows = []
    for source, by_method in result["results"].items():
        for method, by in by_method.items():
            flat = by["flat"]
            false = sum(t["false"] for t in by.values())
            sessions = sum(t["sessions"] for t in by.values())
            rows.append([source, method,
                         f"{100 * flat['false'] / flat['sessions']:.2f}",
                         f"{100 * false / sessions:.2f}",
                         f"{100 * flat['by_chance'] / result['series']:.0f} %",
                         *(f"{by[str(s)]['found']}/{by[str(s)]['planted']} "
                           f"({100 * by[str(s)]['found'] / by[str(s)]['planted']:.0f} %)"
                           for s in STEPS)])
    return tabulate(rows, headers=["series (noise)", "method",
                                   "false / 100 sessions (flat)", "(all series)",
                                   "found by chance",
                                   *(f"found {s:.0%}" for s in STEPS)],
                    tablefmt="github", disable_numparse=True)


# -- scale --------------------------------------------------------------------------------------
def _current(e: dict[str, Any]) -> dict[str, Any]:
    """A history line as this version writes it: with the hashes of its machine and of its
    case's stack (lines recorded before they were have only the fingerprint)."""
    env = e.get("environment") or {}
    e["machine"] = fingerprint_hash(machine(env))
    e["stack"] = fingerprint_hash(case_stack(env, (e.get("case") or {}).get("backend")))
    return e


def _template(args: argparse.Namespace) -> dict[str, Any]:
    lines = _history_lines([args.template] if args.template else args.history)
    for e in lines:
        if e.get("outcome") == "ok" and e.get("samples_per_second"):
            return _current(e)
    raise SystemExit("no ok history line to copy: pass --template FILE or --history DIR")


def _command(hist: Path) -> dict[str, Any]:
    """One run of ``accelperf history changes`` on ``hist`` in a fresh process: wall and CPU
    seconds, the load average (1 min) before it, its last line."""
    load = os.getloadavg()[0]
    t0, r0 = time.perf_counter(), os.times()
    done = subprocess.run([sys.executable, "-m", "pytest_accelperf.cli", "history", "changes",
                           str(hist)], capture_output=True, text=True, check=True, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    wall, r1 = time.perf_counter() - t0, os.times()
    cpu = (r1.children_user - r0.children_user) + (r1.children_system - r0.children_system)
    return {"wall_s": round(wall, 3), "cpu_s": round(cpu, 3), "load_1min": round(load, 2),
            "last_line": done.stdout.strip().splitlines()[-1]}


def cmd_scale(args: argparse.Namespace) -> dict[str, Any]:
    template = _template(args)
    rng = random.Random(args.seed)
    with contextlib.ExitStack() as stack:
        tmp = args.keep or stack.enter_context(
            tempfile.TemporaryDirectory(prefix="accelperf-changes-"))
        hist = Path(tmp) / "history"
        hist.mkdir(parents=True, exist_ok=True)
        path = hist / "cpu-x8.jsonl"
        cache = cache_path(path)
        commits = [f"{rng.getrandbits(160):040x}" for _ in range(args.sessions)]
        last: list[str] = []  # the last session's lines, appended in each repeat
        with path.open("w") as f:
            for s in range(args.sessions):
                moment = _dt.datetime(2026, 1, 1, tzinfo=_dt.timezone.utc) + _dt.timedelta(
                    hours=s)
                for c in range(args.cases):
                    e = dict(template)
                    e.update(session=f"{moment:%Y%m%dT%H%M%SZ}-{s:08x}",
                             time=moment.isoformat(), commit=commits[s],
                             nodeid=f"{template['nodeid'].split('[')[0]}[case{c:04d}]",
                             case_id=f"case{c:04d}")
                    slow = 1.1 if c % 10 == 0 and s >= args.sessions * 3 // 5 else 1.0
                    sps = template["samples_per_second"] * math.exp(rng.gauss(0, 0.03)) / slow
                    e["samples_per_second"] = sps
                    e["median_step_time"] = template["median_step_time"] * \
                        template["samples_per_second"] / sps
                    text = json.dumps(e, sort_keys=True) + "\n"
                    if s == args.sessions - 1:
                        last.append(text)
                    else:
                        f.write(text)
        head = path.stat().st_size
        lines = args.cases * args.sessions
        load_before = os.getloadavg()
        runs: dict[str, list[dict[str, Any]]] = {
            "cold, one session less": [], "appended": [], "warm": [], "cold": []}
        for _ in range(args.repeat):
            os.truncate(path, head)  # the history without its last session, no cache
            cache.unlink(missing_ok=True)
            runs["cold, one session less"].append(_command(hist))
            with path.open("a") as f:  # the last session appended: its lines validated
                f.write("".join(last))
            runs["appended"].append(_command(hist))
            runs["warm"].append(_command(hist))  # as it was: nothing validated
            cache.unlink(missing_ok=True)
            runs["cold"].append(_command(hist))  # every line validated, the cache written
        size = path.stat().st_size
        code = ("import time; t=time.perf_counter(); import pytest_accelperf.cli.history, "
                "ruptures, scipy.stats; print(time.perf_counter()-t)")
        imports = float(subprocess.run([sys.executable, "-c", code], capture_output=True,
                                       text=True, check=True, cwd=REPO).stdout)
        import ruptures  # noqa: F401  (imported before the parts are timed: imports_s)
        import scipy.stats  # noqa: F401

        w0, c0 = time.perf_counter(), time.process_time()
        points = load_points(hist, cache=False)
        w1, c1 = time.perf_counter(), time.process_time()
        cached = load_points(hist)
        w2, c2 = time.perf_counter(), time.process_time()
        changes = find_changes(points)
        w3, c3 = time.perf_counter(), time.process_time()
        assert cached == points
        parts = {"read_and_validate_s": round(w1 - w0, 3),
                 "read_and_validate_cpu_s": round(c1 - c0, 3),
                 "read_from_cache_s": round(w2 - w1, 3),
                 "read_from_cache_cpu_s": round(c2 - c1, 3),
                 "find_s": round(w3 - w2, 3), "find_cpu_s": round(c3 - c2, 3),
                 "change_points": len(changes), "cache_bytes": cache.stat().st_size}
        load_after = os.getloadavg()
    return {"lines": lines, "bytes": size, "bytes_per_line": size // lines,
            "cases": args.cases, "sessions": args.sessions,
            "accelperf history changes": runs,
            "imports_s": round(imports, 3), "in_process": parts,
            "loadavg_before": list(load_before), "loadavg_after": list(load_after)}


# -- example ------------------------------------------------------------------------------------
def cmd_example(args: argparse.Namespace) -> dict[str, Any]:
    lines = _history_lines(args.history)
    firsts: dict[str, dict[str, Any]] = {}
    for e in lines:
        if e.get("outcome") == "ok" and e.get("samples_per_second"):
            firsts.setdefault(e["nodeid"], e)
    residuals = gate_noise(args.gate)
    rng = random.Random(args.seed)
    commits = [f"{rng.getrandbits(160):040x}" for _ in range(40)]
    cases = sorted(firsts)[:4]
    out: list[str] = []
    for s in range(40):
        moment = _dt.datetime(2026, 11, 1, tzinfo=_dt.timezone.utc) + _dt.timedelta(hours=6 * s)
        for k, nodeid in enumerate(cases):
            e = json.loads(json.dumps(firsts[nodeid]))
            e.update(session=f"{moment:%Y%m%dT%H%M%SZ}-{s:08x}", time=moment.isoformat(),
                     commit=commits[s], dirty=False)
            sps = e["samples_per_second"] * math.exp(rng.choice(residuals))
            if k == 1 and s >= 25:
                sps /= 1.10
            if k == 0 and s >= 15 and e.get("program"):
                e["program"]["flops"] *= 1.5
            if s >= 32:  # a jax upgrade on the same machine, the third case slower under it
                e["environment"]["packages"].update(jax="0.10.3", jaxlib="0.10.3")
                e["fingerprint"] = fingerprint_hash(e["environment"])
                if k == 2:
                    sps /= 1.08
            _current(e)
            e["median_step_time"] = e["median_step_time"] * e["samples_per_second"] / sps
            e["samples_per_second"] = sps
            out.append(json.dumps(e, sort_keys=True))
    args.directory.mkdir(parents=True, exist_ok=True)
    (args.directory / "cpu-x8.jsonl").write_text("\n".join(out) + "\n")
    print(f"wrote {len(out)} lines to {args.directory / 'cpu-x8.jsonl'}; commits "
          f"{commits[14][:9]}..{commits[15][:9]} (FLOPs), {commits[24][:9]}.."
          f"{commits[25][:9]} (slower)")
    return {}


# -- main ---------------------------------------------------------------------------------------
def _machine() -> dict[str, Any]:
    info: dict[str, Any] = {"cpus": os.cpu_count(), "platform": platform.platform(),
                            "python": platform.python_version()}
    with contextlib.suppress(OSError):
        info["loadavg"] = list(os.getloadavg())
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        info["uptime"] = subprocess.run(["uptime"], capture_output=True, text=True,
                                        check=False).stdout.strip()
    return info


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", choices=("detection", "scale", "example"))
    p.add_argument("directory", type=Path, nargs="?", help="example: where to write")
    p.add_argument("--history", type=Path, action="append", default=[],
                   help="recorded --accelperf-history directories or .jsonl files")
    p.add_argument("--gate", type=Path, action="append", default=[],
                   help="benchmarks/gate.py results (default: benchmarks/results/gate-*.json)")
    p.add_argument("--series", type=int, default=300, help="series per condition")
    p.add_argument("--sessions", type=int, default=100, help="sessions per series")
    p.add_argument("--cases", type=int, default=1000, help="scale: cases")
    p.add_argument("--repeat", type=int, default=3, help="scale: runs of the command")
    p.add_argument("--template", type=Path, help="scale: a history file to copy a line of")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--keep", type=Path, metavar="DIR",
                   help="scale: write the history to DIR/history and keep it (default: a "
                        "temporary directory, deleted)")
    p.add_argument("--out", type=Path, default=HERE / "results")
    args = p.parse_args(argv)
    if not args.gate:
        args.gate = sorted((HERE / "results").glob("gate-*.json"))
    if args.mode == "example":
        if args.directory is None:
            p.error("example: pass the directory to write the history to")
        cmd_example(args)
        return 0
    started = _dt.datetime.now(_dt.timezone.utc)
    machine = _machine()
    result = cmd_detection(args) if args.mode == "detection" else cmd_scale(args)
    result.update(command=" ".join(["python", "benchmarks/changes.py", *sys.argv[1:]]),
                  machine=machine, machine_after=_machine(),
                  started=started.isoformat(timespec="seconds"),
                  finished=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"))
    args.out.mkdir(parents=True, exist_ok=True)
    stem = f"changes-{args.mode}-{started:%Y%m%d-%H%M%S}"
    path = args.out / f"{stem}.json"
    path.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    if args.mode == "detection":
        text = f"`{result['command']}`\n\n{detection_table(result)}\n"
        (args.out / f"{stem}.md").write_text(text)
        print(text)
        print(json.dumps(result["noise"], indent=1))
    else:
        print(json.dumps({k: v for k, v in result.items() if k != "machine_after"}, indent=1))
    print(f"raw results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
