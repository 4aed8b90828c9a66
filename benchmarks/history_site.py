"""How long ``accelperf history publish`` takes, and how large the site is, at scale.

    python benchmarks/history_site.py [--sessions 1000] [--cases 50] [--keep DIR] [--no-browser]

Generates a history of SESSIONS sessions x CASES cases (lines as pytest --accelperf-history
writes them: a jax case's environment, program record, step-time interval and memory per
device; 2 machines, 2 branches, a jax upgrade at 70 % of the sessions, a 10 % slowdown of
every tenth case at 60 %, the FLOPs of every fifth case 50 % up at 40 %), publishes it in a
fresh process (three times: with no bundle of the plotting library cached, then cached, as
on any run after the first, then over its own site), and reports the wall and CPU time (the
machine is shared: at load 4 on 2 cores the wall time is twice the CPU time), the site's
size, and the time its index takes
to load in headless Chromium (navigation start to the load event, from the page's own
Performance API), with the load average (``uptime``) beside each. Prints JSON; writes it to
benchmarks/results/site-<time>.json too.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pytest_accelperf.provision.describe import case_stack, machine  # noqa: E402
from pytest_accelperf.report.history import fingerprint_hash  # noqa: E402

ENV: dict[str, Any] = {
    "accel": "cpu", "cpu_isa": "avx avx2 f16c fma sse4_2", "device_count": 8,
    "device_kind": "cpu", "host_cpu": "AMD EPYC", "libraries": {},
    "packages": {"flax": "0.12.8", "jax": "0.10.2", "jaxlib": "0.10.2", "numpy": "2.4.6",
                 "optax": "0.2.8"},
    "platform": "cpu-x8", "python": "3.11.7"}


def _line(rng: random.Random, s: int, c: int, sessions: int, commit: str, moment: _dt.datetime,
          host: int, branch: str) -> dict[str, Any]:
    env = json.loads(json.dumps(ENV))
    if host:
        env["cpu_isa"] += " avx_vnni"
    if s >= sessions * 7 // 10:
        env["packages"].update(jax="0.10.3", jaxlib="0.10.3")
    case = {"backend": "jax", "batch": 64 * (1 + c % 4), "mesh": [4, 2], "steps": 20}
    step = 0.02 * (1 + c % 7) * (0.9 if host else 1.0)
    if c % 10 == 0 and s >= sessions * 6 // 10:
        step *= 1.10
    step *= math.exp(rng.gauss(0, 0.03))
    flops = 3.5e8 * (1 + c % 5) * (1.5 if c % 5 == 0 and s >= sessions * 4 // 10 else 1.0)
    half = step * 0.02
    return {
        "schema_version": 1, "session": f"{moment:%Y%m%dT%H%M%SZ}-{s:08x}",
        "time": moment.isoformat(), "commit": commit, "dirty": False, "update": False,
        "platform": "cpu-x8", "branch": branch,
        "nodeid": f"suites/jax/test_sweep.py::test_sweep[jax-case{c:03d}]",
        "case_id": f"jax-case{c:03d}", "case": case, "outcome": "ok",
        "verdict": "pass", "checks": {"throughput": "pass", "loss": "pass"},
        "samples_per_second": case["batch"] / step, "median_step_time": step,
        "step_time_interval": [step - half, step + half * 1.3],
        "peak_memory": 7.5e6 * (1 + c % 3), "mfu": None,
        "compile_time": 2.0 + rng.random() * 0.3, "final_loss": 2.404 + 0.001 * (c % 9),
        "memory_per_device": {f"cpu{d}": 7.5e6 * (1 + c % 3) - d * 1e4 for d in range(8)},
        "fingerprint": fingerprint_hash(env), "machine": fingerprint_hash(machine(env)),
        "stack": fingerprint_hash(case_stack(env, "jax")), "environment": env,
        "program": {"source": "xla", "flops": flops, "bytes_accessed": flops / 30,
                    "host_syncs": 0, "collectives": {}}}


def generate(directory: Path, sessions: int, cases: int, seed: int = 0) -> Path:
    """Write the history (see the module) to ``directory/cpu-x8.jsonl``."""
    rng = random.Random(seed)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "cpu-x8.jsonl"
    start = _dt.datetime(2026, 1, 1, tzinfo=_dt.timezone.utc)
    with path.open("w") as f:
        for s in range(sessions):
            commit = f"{rng.getrandbits(160):040x}"
            moment = start + _dt.timedelta(hours=s)
            host = s % 3 == 2  # a second runner takes every third session
            branch = "main" if s % 4 else "feature"
            f.writelines(json.dumps(_line(rng, s, c, sessions, commit, moment, host, branch))
                         + "\n" for c in range(cases))
    return path


def _uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True,
                          check=False).stdout.strip()


def _publish(hist: Path, out: Path, env: dict[str, str]) -> dict[str, Any]:
    load = _uptime()
    t0, r0 = time.perf_counter(), os.times()
    done = subprocess.run([sys.executable, "-m", "pytest_accelperf.cli", "history", "publish",
                           str(hist), "--out", str(out)], capture_output=True, text=True,
                          env=env, check=False)
    wall, r1 = time.perf_counter() - t0, os.times()
    cpu = (r1.children_user - r0.children_user) + (r1.children_system - r0.children_system)
    if done.returncode:
        raise SystemExit(done.stderr or done.stdout)
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    return {"wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "bytes": size,
            "files": sum(1 for _ in out.rglob("*.*")), "uptime_before": load,
            "last_line": done.stdout.strip().splitlines()[-1]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sessions", type=int, default=1000)
    p.add_argument("--cases", type=int, default=50)
    p.add_argument("--keep", type=Path, help="keep the history and the site here")
    p.add_argument("--no-browser", action="store_true", help="skip the Chromium timing")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="accelperf-site-") as tmp:
        root = args.keep or Path(tmp)
        hist = root / "history"
        t0 = time.perf_counter()
        path = generate(hist, args.sessions, args.cases)
        result: dict[str, Any] = {
            "sessions": args.sessions, "cases": args.cases,
            "history_bytes": path.stat().st_size,
            "generate_s": round(time.perf_counter() - t0, 2)}
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        cold = dict(env, XDG_CACHE_HOME=str(root / "cache"))  # no bundle of vega yet
        result["publish_cold_cache"] = _publish(hist, root / "site-cold", cold)
        result["publish"] = _publish(hist, root / "site", cold)  # the bundle cached now
        result["publish_again"] = _publish(hist, root / "site", cold)  # over its own site
        if not args.no_browser:
            from pytest_accelperf.report.browser import chromium, load_page

            browser = chromium()
            if browser is None:
                result["index_load"] = "chromium not installed (apt-get install chromium)"
            else:
                loads = []
                for _ in range(3):
                    load = _uptime()
                    page = load_page(browser, root / "site" / "index.html", root / "profile")
                    loads.append({"load_event_ms": page.load_ms, "drawn_ms": page.drawn_ms,
                                  "console_errors": page.errors, "uptime_before": load})
                result["index_load"] = loads
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    out = REPO / "benchmarks" / "results" / f"site-{stamp}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
