#!/usr/bin/env python
"""The store's JSON read with orjson against the standard parser, in one process.

::

    python benchmarks/store_parser.py [--modules 100] [--cases 100] [--machines 5]
                                      [--rounds 4]

generates the store of ``benchmarks/store.py`` (the default template, compact, schema 3;
100 x 100 cases of 5 machines: 53.6 MB), then times, in alternating rounds so that both
sides see the same machine, the store's read as it is (*after*:
:func:`pytest_accelperf.store.jsonfile.loads` parses with orjson) and with orjson switched
off (*before*: ``jsonfile._fast`` answers "not fast" for every text, so every file goes to
the standard parser with its duplicate-key hook, the read before orjson was taken):

* ``jsonfile.loads of every file``: the parse alone (no schema);
* ``load``: a fresh ``BaselineStore`` asked for every case as the last machine reads it
  (``get_view``: every file read, parsed and validated by the schema);
* ``load + check``: the same, each case then typed for the checks (the gate's read);

and, for scale, ``json.load`` and ``orjson.loads`` of every file's bytes. Each line gives
the median wall and CPU seconds of the rounds and the fastest wall time.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import orjson

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import store as bench  # noqa: E402

from pytest_accelperf.store import jsonfile  # noqa: E402


def _standard(text: str) -> object:
    return jsonfile._NOT_FAST


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--modules", type=int, default=100)
    p.add_argument("--cases", type=int, default=100)
    p.add_argument("--machines", type=int, default=5)
    p.add_argument("--rounds", type=int, default=4)
    ns = p.parse_args(argv)
    block, _ = bench.template_block(None)
    block = bench.as_recorded(block)
    scratch = Path(tempfile.mkdtemp(prefix="accelperf-parser-"))
    root = scratch / "baselines"
    try:
        nodeids = bench.generate(root, ns.modules, ns.cases, block, ns.machines)
        files = sorted((root / bench.PLATFORM).rglob("*.json"))
        size = sum(f.stat().st_size for f in files)
        machine = bench.reader(ns.machines)
        fast = jsonfile._fast
        times: dict[str, list[tuple[float, float]]] = {}

        def run(name: str, fn: Callable[[], object]) -> None:
            gc.collect()
            cpu, wall = time.process_time(), time.perf_counter()
            fn()
            times.setdefault(name, []).append((time.perf_counter() - wall,
                                               time.process_time() - cpu))

        sides = [("before", _standard), ("after", fast)]
        load_before = os.getloadavg()[0]
        for r in range(ns.rounds):
            for side, parser in sides if r % 2 == 0 else sides[::-1]:
                jsonfile._fast = parser
                run(f"{side}: jsonfile.loads of every file", lambda: [
                    jsonfile.loads(f.read_text(encoding="utf-8")) for f in files])
                run(f"{side}: load", lambda: bench.load_and_check(
                    root, nodeids, machine, typed=False))
                run(f"{side}: load + check", lambda: bench.load_and_check(
                    root, nodeids, machine))
            jsonfile._fast = fast
            run("json.load of every file", lambda: [json.loads(f.read_bytes()) for f in files])
            run("orjson.loads of every file", lambda: [orjson.loads(f.read_bytes())
                                                       for f in files])
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"{len(nodeids)} cases x {ns.machines} machines, {size / 1e6:.1f} MB; {ns.rounds} "
          f"rounds; load average {load_before:.2f} before, {os.getloadavg()[0]:.2f} after\n")
    print(f"| {'measurement':38s} | wall median s | fastest s | CPU median s |")
    print(f"|{'-' * 40}|---------------|-----------|--------------|")
    for name in sorted(times):
        walls = [w for w, _ in times[name]]
        cpus = [c for _, c in times[name]]
        print(f"| {name:38s} | {statistics.median(walls):13.3f} | {min(walls):9.3f} | "
              f"{statistics.median(cpus):12.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
