#!/usr/bin/env python
"""A benchmark of the baseline store at the size of a model zoo.

::

    python benchmarks/store.py [--modules 100] [--cases 100] [--repeat 3]
                               [--single 1000,4000] [--template FILE] [--leaf-samples K]
                               [--out DIR]

generates, in a temporary directory, a store of ``--modules`` module files of ``--cases``
cases each (default 100 x 100 = 10,000 cases) for platform ``cpu-x8``. Every block is a
real block of the committed store (by default the one with the most parameter leaves of
``baselines/cpu-x8/suites/``, or the first block of ``--template``), with its step times,
loss and parameter values varied per case so that no two blocks are equal. The files are
written as the plugin writes them (:meth:`BaselineFile.to_text`: sorted keys, indent 2).

It then times, ``--repeat`` times each (the table shows the median and the fastest):

* ``load + check``: a fresh :class:`~pytest_accelperf.baselines.BaselineStore` asked for
  every case (``store.get``): every file read, parsed and validated by the schema, in this
  process;
* ``accelperf baselines show``: the command, in a subprocess, over the whole store, with its
  peak resident memory; and ``accelperf --help``, the same interpreter start and imports
  without the store, to tell the store's share from the imports';
* ``one module of N cases``: :func:`pytest_accelperf.baselines.read` of one module file of
  each ``--single`` size, to show how a file's parse time grows with its cases.

``--leaf-samples K`` cuts each parameter leaf's fingerprint sample to its first K values
before the store is generated: what reading a store of more compact blocks would cost.

It prints a table and writes ``DIR/store-<time>.json`` (every time measured, the sizes, the
command, the machine and its load average).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import datetime as _dt
import functools
import json
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tabulate import tabulate

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from pytest_accelperf.baselines import (  # noqa: E402
    BaselineFile,
    BaselineStore,
    read,
)

PLATFORM = "cpu-x8"
TEMPLATES = ROOT / "baselines" / PLATFORM / "suites"


def template_block(path: Path | None) -> tuple[dict[str, Any], str]:
    """``(block, "file::case")``: the first block of ``path``, or the committed block with
    the most parameter leaves (then the largest) when ``path`` is None."""
    files = [path] if path is not None else sorted(TEMPLATES.rglob("*.json"))
    best: tuple[int, int, dict[str, Any], str] | None = None
    for file in files:
        cases = json.loads(file.read_text(encoding="utf-8"))["cases"]
        for key, block in cases.items():
            rank = (len(block.get("numerics") or {}), len(json.dumps(block)))
            if best is None or rank > best[:2]:
                shown = file.relative_to(ROOT) if file.is_relative_to(ROOT) else file
                best = (*rank, block, f"{shown}::{key}")
            if path is not None:
                break
    if best is None:
        raise SystemExit(f"no baseline block in {files}")
    return best[2], best[3]


def _scaled(values: Any, factor: float) -> Any:
    if isinstance(values, list):
        return [_scaled(v, factor) for v in values]
    if isinstance(values, float):
        return float(f"{values * factor:.7g}")
    return values


def vary(block: dict[str, Any], n: int) -> dict[str, Any]:
    """A copy of ``block`` for case ``n``: other step times, loss and parameter values,
    same shape (and still a valid baseline)."""
    out = copy.deepcopy(block)
    factor = 1.0 + ((n * 7919) % 1000) / 10_000  # 1.0000 .. 1.0999
    step = out.get("step_time")
    if isinstance(step, dict):
        step["samples"] = _scaled(step.get("samples"), factor)
        step["median"] = _scaled(step.get("median"), factor)
        if isinstance(out.get("samples_per_second"), float):
            out["samples_per_second"] = _scaled(out["samples_per_second"], 1 / factor)
    loss = out.get("loss")
    if isinstance(loss, dict):
        loss["checkpoints"] = [[s, _scaled(v, factor)] for s, v in loss.get("checkpoints", [])]
        loss["final"] = _scaled(loss.get("final"), factor)
    for leaf in (out.get("numerics") or {}).values():
        if isinstance(leaf, dict):
            for name in ("sample", "rms"):
                if name in leaf:
                    leaf[name] = _scaled(leaf[name], factor)
    out["recorded_at"] = f"2026-11-{1 + n % 28:02d}T{n % 24:02d}:00:00+00:00"
    return out


def module_file(root: Path, module: int, cases: int, block: dict[str, Any]) -> Path:
    """Write module ``module`` of ``cases`` cases as the plugin writes it; its path."""
    path = root / PLATFORM / "suites" / "zoo" / f"test_zoo_{module:03d}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    blocks = {f"test_model[torch-m{module:03d}-b{8 * (1 + c % 8)}-v{c:05d}]":
              vary(block, module * 100_003 + c) for c in range(cases)}
    path.write_text(BaselineFile(path, PLATFORM, blocks).to_text(), encoding="utf-8")
    return path


def generate(root: Path, modules: int, cases: int, block: dict[str, Any]) -> list[str]:
    """A store of ``modules`` x ``cases`` cases under ``root``; every node id."""
    nodeids = []
    for m in range(modules):
        path = module_file(root, m, cases, block)
        module = path.relative_to(root / PLATFORM).as_posix().removesuffix(".json")
        for key in json.loads(path.read_text(encoding="utf-8"))["cases"]:
            nodeids.append(f"{module}.py::{key}")
    return nodeids


def timed(fn: Callable[[], Any], repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def load_and_check(root: Path, nodeids: Sequence[str]) -> None:
    store = BaselineStore(root, PLATFORM)
    for nodeid in nodeids:
        if store.get(nodeid) is None:
            raise SystemExit(f"{nodeid}: not found in the generated store")


def accelperf_command() -> list[str]:
    script = Path(sys.executable).with_name("accelperf")
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "import sys; from pytest_accelperf.cli import main; "
                                  "sys.exit(main())"]


def run_command(argv: list[str]) -> tuple[float, float, str]:
    """``(wall seconds, peak RSS in MB, last line of stdout)`` of a subprocess."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate()
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{shlex.join(argv)} failed ({proc.returncode}):\n{err}")
    rss_mb = 0.0
    with contextlib.suppress(Exception):  # peak RSS of the child alone (Linux: KiB)
        import resource
        rss_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    lines = out.strip().splitlines()
    return wall, rss_mb, lines[-1] if lines else ""


def run_command_rss(argv: list[str]) -> tuple[float, float, str]:
    """:func:`run_command` in a fresh helper process, so that the peak RSS is this command's
    own and not the largest of every child so far."""
    code = (f"import json, sys; sys.path.insert(0, {str(HERE)!r}); import store; "
            f"print(json.dumps(store.run_command({argv!r})))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=False)
    if done.returncode != 0:
        raise SystemExit(done.stderr)
    wall, rss, last = json.loads(done.stdout.strip().splitlines()[-1])
    return float(wall), float(rss), str(last)


def _machine() -> dict[str, Any]:
    info: dict[str, Any] = {"cpus": os.cpu_count(), "platform": platform.platform(),
                            "python": platform.python_version()}
    with contextlib.suppress(OSError):
        info["loadavg"] = list(os.getloadavg())
    return info


def _write(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    tmp.replace(path)


def _sizes(text: str) -> list[int]:
    try:
        sizes = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated integers") \
            from None
    if any(s < 1 for s in sizes):
        raise argparse.ArgumentTypeError(f"{text!r}: sizes must be at least 1")
    return sizes


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: must be at least 1")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--modules", type=_positive, default=100,
                   help="module files in the generated store (default 100)")
    p.add_argument("--cases", type=_positive, default=100,
                   help="cases per module file (default 100)")
    p.add_argument("--repeat", type=_positive, default=3,
                   help="timings of each measurement (default 3; the median is reported)")
    p.add_argument("--single", type=_sizes, default=[1000, 4000],
                   help="sizes of the one-module files parsed alone (default 1000,4000; "
                        "empty to skip)")
    p.add_argument("--template", type=Path, default=None,
                   help="a baseline file whose first block is the template (default: the "
                        "committed block with the most parameter leaves)")
    p.add_argument("--leaf-samples", type=int, default=None, metavar="K",
                   help="keep only the first K values of each parameter leaf's fingerprint "
                        "sample (default: all, as recorded): what a more compact "
                        "fingerprint would cost to read")
    p.add_argument("--no-show", action="store_true",
                   help="do not time the accelperf command")
    p.add_argument("--keep", action="store_true", help="keep the generated store")
    p.add_argument("--out", default=str(HERE / "results"),
                   help="directory for the JSON results (default benchmarks/results)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ns = build_parser().parse_args(argv)
    block, source = template_block(ns.template)
    if ns.leaf_samples is not None:
        for leaf in (block.get("numerics") or {}).values():
            leaf["sample"] = leaf.get("sample", [])[:max(ns.leaf_samples, 0)]
        source += f" (samples cut to {ns.leaf_samples} per leaf)"
    block_bytes = len(json.dumps(block, indent=2, sort_keys=True))
    scratch = Path(tempfile.mkdtemp(prefix="accelperf-store-"))
    load_before = os.getloadavg()
    result: dict[str, Any] = {
        "command": shlex.join([Path(sys.executable).name, "benchmarks/store.py", *argv]),
        "machine": _machine(), "template": source, "block_bytes": block_bytes,
        "leaves": len(block.get("numerics") or {}), "modules": ns.modules,
        "cases": ns.cases, "repeat": ns.repeat, "times": {}}
    rows: list[list[str]] = []

    def row(name: str, times: list[float], extra: str = "") -> None:
        result["times"][name] = times
        rows.append([name, f"{statistics.median(times):.3f}", f"{min(times):.3f}", extra])

    try:
        root = scratch / "baselines"
        t0 = time.perf_counter()
        nodeids = generate(root, ns.modules, ns.cases, block)
        result["generate_s"] = time.perf_counter() - t0
        store_bytes = sum(p.stat().st_size for p in (root / PLATFORM).rglob("*.json"))
        result["store_bytes"] = store_bytes
        n = len(nodeids)
        row(f"load + check, {ns.modules} x {ns.cases} cases", timed(
            lambda: load_and_check(root, nodeids), ns.repeat),
            f"{store_bytes / 2**20:.0f} MiB of JSON")
        if not ns.no_show:
            cmd = accelperf_command()
            show = [[*cmd, "baselines", "show", "--baselines", str(root)]
                    for _ in range(ns.repeat)]
            runs = [run_command_rss(argv_) for argv_ in show]
            if not runs[0][2].startswith(f"{n} case(s)"):
                raise SystemExit(f"accelperf baselines show: unexpected output {runs[0][2]!r}")
            result["show_rss_mb"] = [r[1] for r in runs]
            row("accelperf baselines show", [r[0] for r in runs],
                f"peak RSS {max(r[1] for r in runs):.0f} MB")
            helps = [run_command_rss([*cmd, "--help"]) for _ in range(ns.repeat)]
            result["help_rss_mb"] = [r[1] for r in helps]
            row("accelperf --help (start + imports)", [r[0] for r in helps],
                f"peak RSS {max(r[1] for r in helps):.0f} MB")
        for size in ns.single:
            single = scratch / f"single-{size}"
            path = module_file(single, 0, size, block)
            row(f"one module of {size} cases",
                timed(functools.partial(read, path, PLATFORM), ns.repeat),
                f"{path.stat().st_size / 2**20:.1f} MiB")
    finally:
        if ns.keep:
            print(f"generated store kept in {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)
    load_after = os.getloadavg()
    result["loadavg_before"], result["loadavg_after"] = list(load_before), list(load_after)
    table = tabulate(rows, headers=["measurement", "median s", "fastest s", ""],
                     tablefmt="github")
    print(f"{result['command']}\n\ntemplate block: {source} ({result['leaves']} parameter "
          f"leaves, {block_bytes:,} bytes of JSON); load average {load_before[0]:.2f} before, "
          f"{load_after[0]:.2f} after\n\n{table}")
    out_dir = Path(ns.out).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"store-{_dt.datetime.now().strftime('%Y%m%d-%H%M%S')}.json"
    _write(path, result)
    print(f"raw results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
