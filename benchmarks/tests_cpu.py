"""Where the plugin's own tests spend the machine: wall and CPU time of every test.

A pytest plugin and its summary. Loaded into a serial run of the tests, it reads the
machine's busy time (``/proc/stat``, every process, the ranks, Ray's workers and the
subprocess sessions a test starts included) around each test, and appends one JSON line
per test to ``$TESTS_CPU_OUT`` (default ``tests-cpu.jsonl``)::

    PYTHONPATH=benchmarks pytest tests/ -p no:xdist -p tests_cpu
    python benchmarks/tests_cpu.py tests-cpu.jsonl            # the summary

The figures are the machine's, not the test's alone: run it on a quiet machine, serially
(under xdist the other worker's work would count too). CPU time above the wall time means
the test kept more than one core busy (ranks, JAX's threads); well below it, the test
waited (a timeout, an injected sleep). docs/design.md ("Where the time goes") quotes a run.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_accelperf.stats.contention import _host_ticks

OUT_ENV = "TESTS_CPU_OUT"


def busy_seconds() -> float:
    """CPU seconds the machine has spent busy since boot, as the plugin's contention
    reading counts them (:mod:`pytest_accelperf.stats.contention`: user, nice, system,
    irq, softirq and steal of every CPU; guest time is inside user and nice already)."""
    ticks = _host_ticks()
    if ticks is None:
        raise pytest.UsageError("tests_cpu: /proc/stat cannot be read here (Linux only)")
    return ticks[0] / os.sysconf("SC_CLK_TCK")


def own_seconds() -> float:
    """CPU seconds of this process and of its children that have been waited for."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """One line per test: its node id, wall seconds, the machine's busy seconds and the
    test's own: user and system time of this process and of the children it waited for
    (its ranks and subprocess sessions, not a Ray cluster's daemons), which the other
    sessions on a shared machine do not inflate."""
    busy, started, own = busy_seconds(), time.monotonic(), own_seconds()
    try:
        return (yield)
    finally:
        line = {"id": item.nodeid, "wall": round(time.monotonic() - started, 3),
                "cpu": round(busy_seconds() - busy, 3),
                "own": round(own_seconds() - own, 3)}
        with open(os.environ.get(OUT_ENV, "tests-cpu.jsonl"), "a", encoding="utf-8") as f:
            f.write(json.dumps(line) + "\n")


def summary(path: Path, top: int) -> str:
    """The totals, the modules and the tests that cost most CPU, and the tests that wait."""
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()
            if line.strip()]
    wall, cpu = sum(r["wall"] for r in rows), sum(r["cpu"] for r in rows)
    own = sum(r.get("own", 0.0) for r in rows)
    out = [f"{len(rows)} tests: {wall:.0f} s wall, {cpu:.0f} s CPU "
           f"({cpu / wall if wall else 0:.2f} cores on average), {own:.0f} s of the tests' own",
           "", "modules by CPU:"]
    modules: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for r in rows:
        module = modules[r["id"].split("::")[0]]
        module[0] += r["wall"]
        module[1] += r["cpu"]
    for name, (w, c) in sorted(modules.items(), key=lambda kv: -kv[1][1])[:top]:
        out.append(f"  {w:7.1f} s wall {c:7.1f} s CPU  {name}")
    out += ["", "tests by CPU:"]
    for r in sorted(rows, key=lambda r: -r["cpu"])[:top]:
        out.append(f"  {r['wall']:7.1f} s wall {r['cpu']:7.1f} s CPU "
                   f"{r.get('own', 0.0):7.1f} s own  {r['id']}")
    waiting = [r for r in rows if r["wall"] > 3 and r["cpu"] < 0.6 * r["wall"]]
    out += ["", f"tests that mostly wait (over 3 s, under 0.6 cores): {len(waiting)}, "
                f"{sum(r['wall'] - r['cpu'] for r in waiting):.0f} s of waiting"]
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("path", type=Path, help="the JSON lines a run wrote")
    parser.add_argument("--top", type=int, default=20, help="rows per table (default 20)")
    ns = parser.parse_args()
    if not ns.path.is_file():
        parser.error(f"{ns.path}: no such file (run the tests with -p tests_cpu first)")
    print(summary(ns.path, ns.top))


if __name__ == "__main__":
    main()
