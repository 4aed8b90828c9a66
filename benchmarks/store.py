#!/usr/bin/env python
"""A benchmark of the baseline store at the size of a model zoo.

::

    python benchmarks/store.py [--modules 100] [--cases 100] [--repeat 3]
                               [--format compact|legacy] [--single 1000,4000]
                               [--machines K] [--schema 2|3]
                               [--template FILE] [--leaf-samples K] [--out DIR]

generates, in a temporary directory, a store of ``--modules`` module files of ``--cases``
cases each (default 100 x 100 = 10,000 cases) for platform ``cpu-x8``. Every block is a
real block (by default the one with the most parameter leaves of
``benchmarks/store_templates/``, blocks as committed before the compact format, or the
largest block of ``--template``, e.g. ``baselines/cpu-x8/suites/jax/test_mesh_sweep.json``),
with its step times,
loss and parameter values varied per case so that no two blocks are equal. With
``--format compact`` (the default) the block is first put in the form this version records
(:func:`as_recorded`: the compact fingerprint, 4-digit samples); ``--format legacy`` keeps
it as committed before (RMS and 16 samples per leaf), the blocks a store written before
the compact format holds. The files are written as the plugin writes them
(:meth:`BaselineFile.to_text`: sorted keys, indent 2, numbers on one line).

It then times, ``--repeat`` times each (the table shows the median and the fastest):

* ``load + check``: a fresh :class:`~pytest_accelperf.store.baselines.BaselineStore` asked for
  every case (``store.get``): every file read, parsed and validated by the schema, in this
  process;
* ``accelperf baselines show``: the command, in a subprocess, over the whole store, with its
  peak resident memory, each run right after a plain ``json.load`` of every file of the
  store in this process (``json.load``), so that the two see the same machine: the table
  gives each one's ratio to ``json.load`` (the median of the runs' ratios); then
  ``accelperf baselines check`` (every block validated whole), and ``accelperf --help``, the
  same interpreter start without the store, to tell the store's share from the imports';
* ``orjson.loads of every file`` and ``the store's parse of every file``: the parser the
  store's read uses, alone, and the store's JSON read
  (:func:`pytest_accelperf.store.jsonfile.loads`, which also refuses a repeated key),
  without the schema's validation;
* ``one module of N cases``: :func:`pytest_accelperf.store.baselines.read` of one module file of
  each ``--single`` size, to show how a file's parse time grows with its cases.

``--schema 2`` writes the files as a version that wrote schema 2 did: each machine's entry
with its whole environment (a file of schema 3 holds the entries' environments once, under
``environments``: :func:`pytest_accelperf.store.machines.pack`).

``--machines K`` gives every block the timing of K machines (issue 46: timing is kept per
machine, :mod:`pytest_accelperf.store.machines`): its own, and K - 1 others' under
``machines``, each its own varied step, probe and input times and compile time in an
environment of its own; ``load + check`` then reads each case as the last of them does in a
run (``store.get_view`` and the checks' typed block of it), and a row ``load`` times the
store's part alone (``store.get_view`` of every case: every file read, parsed and
validated, without the checks' typing).

``--leaf-samples K`` (with ``--format legacy``) cuts each parameter leaf's fingerprint
sample to its first K values before the store is generated.

It prints a table and writes ``DIR/store-<time>.json`` (every time measured, the sizes, the
command, the machine and its load average).

``--sizes`` measures instead what a block costs, part by part, in the bytes of the file
(the block's lines as the store writes them, inside its file), before (``json.dumps``
with an indent of 2, the per-leaf fingerprint, 6-digit samples) and after (the compact
layout of :func:`pytest_accelperf.store.jsonfile.dumps`, the compact fingerprint, 4-digit
samples): for every block of ``benchmarks/store_templates/`` (one row per module, its
largest block), and for a synthetic model of ``--leaves`` leaves (default 100) with
``params/encoder/layer_3/attention/query/kernel``-style names, the rest of the block
being the largest torch block of the store. ``--detection`` prints what the numerics
check catches, before and after, on a small trained model and its perturbations
(:func:`detection`).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import datetime as _dt
import functools
import itertools
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

from pytest_accelperf.store.baselines import (  # noqa: E402
    SCHEMA_VERSION,
    BaselineFile,
    BaselineStore,
    read,
)
from pytest_accelperf.store.block import TIMING_SECTIONS, read_block  # noqa: E402
from pytest_accelperf.store.schema import block_model  # noqa: E402

PLATFORM = "cpu-x8"
#: Blocks as the suites recorded them before the compact format (commit 3c247ab): the
#: "before" of the size measurement, and the templates of the generated store. (The
#: committed baselines under baselines/ are compact now.)
TEMPLATES = ROOT / "benchmarks" / "store_templates"


def template_block(path: Path | None) -> tuple[dict[str, Any], str]:
    """``(block, "file::case")``: the largest block of ``path`` (bytes in its file), or the
    committed block with the most parameter leaves (then the largest) when ``path`` is
    None."""
    files = [path] if path is not None else sorted(TEMPLATES.rglob("*.json"))
    best: tuple[int, int, dict[str, Any], str] | None = None
    for file in files:
        cases = json.loads(file.read_text(encoding="utf-8"))["cases"]
        for key, block in cases.items():
            rank = (len(block.get("numerics") or {}), len(json.dumps(block)))
            if path is not None:  # the largest block of the file
                rank = (0, _in_file(block, compact_layout=True))
            if best is None or rank > best[:2]:
                shown = file.relative_to(ROOT) if file.is_relative_to(ROOT) else file
                best = (*rank, block, f"{shown}::{key}")
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
    numerics = out.get("numerics") or {}
    if isinstance(numerics.get("sketch"), list):  # the compact fingerprint
        numerics["sketch"] = _scaled(numerics["sketch"], factor)
    else:
        for leaf in numerics.values():
            if isinstance(leaf, dict):
                for name in ("sample", "rms"):
                    if name in leaf:
                        leaf[name] = _scaled(leaf[name], factor)
    out["recorded_at"] = f"2026-11-{1 + n % 28:02d}T{n % 24:02d}:00:00+00:00"
    return out


def with_machines(block: dict[str, Any], machines: int, n: int) -> dict[str, Any]:
    """``block`` with the timing of ``machines - 1`` other machines beside its own
    (``runner-1``, ...), each varied as :func:`vary` varies a case's."""
    if machines <= 1:
        return block
    others = {}
    for i in range(1, machines):
        other = vary(block, n * 31 + i)
        env = {**block["environment"], "cpu_isa": f"{block['environment'].get('cpu_isa')} m{i}"}
        entry = {"environment": env, "recorded_at": other["recorded_at"],
                 **{k: other[k] for k in TIMING_SECTIONS if k in other}}
        others[f"runner-{i}"] = entry
    return {**block, "machines": others}


#: The machine ``load + check`` reads each case as: the last of ``--machines``.
def reader(machines: int) -> str:
    return f"runner-{machines - 1}" if machines > 1 else ""


def module_file(root: Path, module: int, cases: int, block: dict[str, Any],
                machines: int = 1, schema: int = SCHEMA_VERSION) -> Path:
    """Write module ``module`` of ``cases`` cases as the plugin writes it (``schema`` 2:
    as a version that wrote schema 2 did, each machine's entry with its environment);
    its path."""
    path = root / PLATFORM / "suites" / "zoo" / f"test_zoo_{module:03d}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    blocks = {f"test_model[torch-m{module:03d}-b{8 * (1 + c % 8)}-v{c:05d}]":
              with_machines(vary(block, module * 100_003 + c), machines,
                            module * 100_003 + c) for c in range(cases)}
    if schema == 2:
        from pytest_accelperf.store import jsonfile
        text = jsonfile.dumps({"cases": blocks, "platform": PLATFORM,
                               "schema_version": 2}) + "\n"
    else:
        text = BaselineFile(path, PLATFORM, blocks).to_text()
    path.write_text(text, encoding="utf-8")
    return path


def generate(root: Path, modules: int, cases: int, block: dict[str, Any],
             machines: int = 1, schema: int = SCHEMA_VERSION) -> list[str]:
    """A store of ``modules`` x ``cases`` cases under ``root``; every node id."""
    nodeids = []
    for m in range(modules):
        path = module_file(root, m, cases, block, machines, schema)
        module = path.relative_to(root / PLATFORM).as_posix().removesuffix(".json")
        for key in json.loads(path.read_text(encoding="utf-8"))["cases"]:
            nodeids.append(f"{module}.py::{key}")
    return nodeids


def _leaves(block: dict[str, Any]) -> int:
    numerics = block.get("numerics") or {}
    sketch = numerics.get("sketch")
    return len(sketch) if isinstance(sketch, list) else len(numerics)


def timed(fn: Callable[[], Any], repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def load_and_check(root: Path, nodeids: Sequence[str], machine: str = "",
                   typed: bool = True) -> None:
    """Every case read as a run reads it: its block as ``machine`` reads it (its timing
    and the shared sections; every file read, parsed and validated), typed for the checks
    unless not ``typed``; without ``machine``, the block whole (``store.get``), as before
    machines were named."""
    store = BaselineStore(root, PLATFORM)
    for nodeid in nodeids:
        if machine:
            found = store.get_view(nodeid, machine)
            if found is None or found.new:
                raise SystemExit(f"{nodeid}: no timing of {machine} in the generated store")
            if typed:
                read_block(found.block, block_model())
        elif store.get(nodeid) is None:
            raise SystemExit(f"{nodeid}: not found in the generated store")


def plain_json_load(root: Path) -> None:
    """Every file of the store parsed by ``json.load``, as it is (no check of any kind):
    what the reads are compared with."""
    for path in sorted((root / PLATFORM).rglob("*.json")):
        with path.open("rb") as f:
            json.load(f)


def orjson_load(root: Path) -> None:
    """Every file of the store parsed by ``orjson.loads`` of its bytes (no check of any
    kind): the parser the store's read uses."""
    import orjson

    for path in sorted((root / PLATFORM).rglob("*.json")):
        orjson.loads(path.read_bytes())


def store_parse(root: Path) -> None:
    """Every file of the store parsed by the store's JSON read
    (:func:`pytest_accelperf.store.jsonfile.loads`: orjson, a repeated key refused), without
    the schema's validation."""
    from pytest_accelperf.store import jsonfile

    for path in sorted((root / PLATFORM).rglob("*.json")):
        jsonfile.loads(path.read_text(encoding="utf-8"))


def accelperf_command() -> list[str]:
    script = Path(sys.executable).with_name("accelperf")
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "import sys; from pytest_accelperf.cli import main; "
                                  "sys.exit(main())"]


def run_command(argv: list[str]) -> tuple[float, float, str, float]:
    """``(wall seconds, peak RSS in MB, last line of stdout, CPU seconds)`` of a
    subprocess (its user and system time: what a loaded machine inflates least)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate()
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{shlex.join(argv)} failed ({proc.returncode}):\n{err}")
    rss_mb = cpu = 0.0
    with contextlib.suppress(Exception):  # peak RSS of the child alone (Linux: KiB)
        import resource
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        rss_mb, cpu = usage.ru_maxrss / 1024, usage.ru_utime + usage.ru_stime
    lines = out.strip().splitlines()
    return wall, rss_mb, lines[-1] if lines else "", cpu


def run_command_rss(argv: list[str]) -> tuple[float, float, str, float]:
    """:func:`run_command` in a fresh helper process, so that the peak RSS is this command's
    own and not the largest of every child so far."""
    code = (f"import json, sys; sys.path.insert(0, {str(HERE)!r}); import store; "
            f"print(json.dumps(store.run_command({argv!r})))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=False)
    if done.returncode != 0:
        raise SystemExit(done.stderr)
    wall, rss, last, cpu = json.loads(done.stdout.strip().splitlines()[-1])
    return float(wall), float(rss), str(last), float(cpu)


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


# -- block sizes -------------------------------------------------------------------------------
def _in_file(block: dict[str, Any], compact_layout: bool) -> int:
    """Bytes ``block`` takes in its module file (its lines at their depth, with the case
    key), as the store writes it (``compact_layout``) or as ``json.dumps(indent=2)`` did."""
    from pytest_accelperf.store import jsonfile

    def text(cases: dict[str, Any]) -> str:
        data = {"cases": cases, "platform": PLATFORM, "schema_version": 1}
        return (jsonfile.dumps(data) if compact_layout
                else json.dumps(data, indent=2, sort_keys=True))

    return len(text({"test_model[torch-b8]": block})) - len(text({}))


def compacted(block: dict[str, Any]) -> dict[str, Any]:
    """``block`` as this version records it: the compact fingerprint (when it has a
    sketch per leaf), step-time and probe samples at 4 significant digits, empty fields
    left out (:func:`pytest_accelperf.checks.summary.summarize`)."""
    from pytest_accelperf.checks.summary import _OMITTED_WHEN_EMPTY, SAMPLE_DIGITS
    from pytest_accelperf.stats.units import round_sig
    from pytest_accelperf.store.baselines import check_block

    out = copy.deepcopy(block)
    for part in ("step_time", "probe"):
        if isinstance(out.get(part), dict):
            out[part]["samples"] = [round_sig(t, SAMPLE_DIGITS) for t in out[part]["samples"]]
    for key in _OMITTED_WHEN_EMPTY:
        if out.get(key) in (None, ""):
            out.pop(key, None)
    return check_block("m.py::test", out)


def as_recorded(block: dict[str, Any]) -> dict[str, Any]:
    """``block`` in the form this version records (:func:`compacted`). A block recorded
    before has no sketch per leaf, which the compact fingerprint needs: each leaf gets a
    stand-in one (spread over -1 .. 1 by the leaf's place, so the stored values differ from
    leaf to leaf as a real model's do); a compact block is only re-rounded."""
    out = copy.deepcopy(block)
    numerics = out.get("numerics")
    if isinstance(numerics, dict) and not isinstance(numerics.get("sketch"), list):
        for i, path in enumerate(sorted(numerics)):
            if isinstance(numerics[path], dict):
                numerics[path]["sketch"] = ((i * 37) % 101) / 50 - 1
    return compacted(out)


def part_sizes(block: dict[str, Any], compact_layout: bool) -> dict[str, int]:
    """``{part: bytes in the file}`` of each top-level key of ``block``, and ``total``."""
    out = {key: _in_file({key: value}, compact_layout) - _in_file({}, compact_layout)
           for key, value in block.items()}
    out["total"] = _in_file(block, compact_layout)
    return out


def synthetic_fingerprint(leaves: int, seed: int = 0) -> dict[str, Any]:
    """The per-leaf fingerprint (with sketches) of a model of ``leaves`` leaves named as a
    transformer's (``params/encoder/layer_3/attention/query/kernel``), of random values."""
    import numpy as np

    from pytest_accelperf.backends.measure.common import fingerprint
    rng = np.random.default_rng(seed)
    kinds = [("attention/query/kernel", (64, 64)), ("attention/query/bias", (64,)),
             ("attention/key/kernel", (64, 64)), ("attention/key/bias", (64,)),
             ("attention/value/kernel", (64, 64)), ("attention/value/bias", (64,)),
             ("attention/out/kernel", (64, 64)), ("attention/out/bias", (64,)),
             ("mlp/dense_in/kernel", (64, 256)), ("mlp/dense_in/bias", (256,)),
             ("mlp/dense_out/kernel", (256, 64)), ("mlp/dense_out/bias", (64,)),
             ("layer_norm_1/scale", (64,)), ("layer_norm_1/bias", (64,)),
             ("layer_norm_2/scale", (64,)), ("layer_norm_2/bias", (64,))]
    flat: dict[str, Any] = {}
    layer = 0
    while len(flat) < leaves:
        for kind, shape in kinds:
            if len(flat) == leaves:
                break
            scale = 10.0 ** rng.uniform(-3, 0)
            flat[f"params/encoder/layer_{layer}/{kind}"] = (
                rng.standard_normal(shape) * scale).astype(np.float32)
        layer += 1
    return fingerprint(flat)


def measure_sizes(leaves: int) -> list[list[Any]]:
    """Rows ``[block, leaves, part, bytes before, bytes after]``: real blocks, then the
    synthetic model of ``leaves`` leaves."""
    rows: list[list[Any]] = []

    def add(name: str, before_block: dict[str, Any], after_block: dict[str, Any]) -> None:
        before, after = part_sizes(before_block, False), part_sizes(after_block, True)
        n = len(before_block.get("numerics") or {})
        for part in sorted(before, key=lambda k: (k == "total", -before[k])):
            if part == "total" or before[part] >= 60:
                rows.append([name, n, part, before[part], after.get(part, 0)])

    torch_template: dict[str, Any] | None = None
    for file in sorted(TEMPLATES.rglob("*.json")):
        cases = json.loads(file.read_text(encoding="utf-8"))["cases"]
        key, block = max(cases.items(), key=lambda kv: len(json.dumps(kv[1])))
        numerics = block.get("numerics") or {}
        # A committed block has no sketch: the after form gets the compact fingerprint of
        # a model of the same leaves (the sketch does not change the size).
        after = copy.deepcopy(block)
        for leaf in (after.get("numerics") or {}).values():
            leaf["sketch"] = 0.5
        add(f"{file.relative_to(TEMPLATES).with_suffix('')}::{key}", block, compacted(after))
        if "torch" in str(file) and numerics and (
                torch_template is None or len(json.dumps(block)) > len(json.dumps(torch_template))):
            torch_template = block
    if torch_template is not None:
        synth = {**copy.deepcopy(torch_template), "numerics": synthetic_fingerprint(leaves)}
        before = copy.deepcopy(synth)
        for leaf in before["numerics"].values():
            del leaf["sketch"]
        add(f"synthetic {leaves}-leaf model", before, compacted(synth))
    return rows


# -- detection power ------------------------------------------------------------------------
def _train(lr: float = 0.05, steps: int = 30, seed: int = 0, *, flip: str = "",
           dtype: Any = None) -> dict[str, Any]:
    """A 3-layer MLP trained with SGD on fixed data (numpy, float32): ``{path: array}``.
    ``flip`` negates that leaf's gradient (a sign bug in one leaf's update); ``dtype``
    runs the arithmetic in that dtype (float64: another rounding)."""
    import numpy as np
    dt = np.dtype(dtype or np.float32)
    rng = np.random.default_rng(seed)
    sizes = [32, 64, 64, 10]
    params = {}
    for i, (a, b) in enumerate(itertools.pairwise(sizes)):
        params[f"params/mlp/dense_{i}/kernel"] = (rng.standard_normal((a, b)) / np.sqrt(a))
        params[f"params/mlp/dense_{i}/bias"] = np.zeros(b)
    params = {k: v.astype(dt) for k, v in params.items()}
    x = rng.standard_normal((128, 32)).astype(dt)
    y = rng.integers(0, 10, 128)
    for _ in range(steps):
        hs = [x]
        for i in range(3):
            layer = f"params/mlp/dense_{i}"
            h = hs[-1] @ params[f"{layer}/kernel"] + params[f"{layer}/bias"]
            hs.append(np.tanh(h) if i < 2 else h)
        logits = hs[-1] - hs[-1].max(axis=1, keepdims=True)
        p = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
        g = p.copy()
        g[np.arange(len(y)), y] -= 1
        g /= len(y)
        for i in reversed(range(3)):
            gk, gb = hs[i].T @ g, g.sum(axis=0)
            if i:
                g = (g @ params[f"params/mlp/dense_{i}/kernel"].T) * (1 - hs[i] ** 2)
            for name, grad in ((f"params/mlp/dense_{i}/kernel", gk),
                               (f"params/mlp/dense_{i}/bias", gb)):
                sign = -1.0 if name == flip else 1.0
                params[name] = (params[name] - lr * sign * grad).astype(dt)
    return {k: v.astype(np.float32) for k, v in params.items()}


def perturbations() -> list[tuple[str, str | None, dict[str, Any]]]:
    """``(what, the leaf it changes or None, parameters)`` of each perturbed run of
    :func:`_train` (the first, unperturbed, is the baseline's)."""
    import numpy as np
    base = _train()
    k1 = "params/mlp/dense_1/kernel"

    def edited(leaf: str, fn: Callable[[Any], Any]) -> dict[str, Any]:
        out = {k: v.copy() for k, v in base.items()}
        out[leaf] = fn(out[leaf]).astype(np.float32)
        return out

    def one(v: Any, where: int, by: float) -> Any:
        v = v.copy()
        v.flat[where] += by
        return v

    rms = float(np.sqrt(np.mean(base[k1].astype(np.float64) ** 2)))
    return [
        ("same run again", None, _train()),
        ("arithmetic in float64 (rounding only)", None, _train(dtype=np.float64)),
        ("learning rate x1.001", None, _train(lr=0.05 * 1.001)),
        ("learning rate x1.01", None, _train(lr=0.05 * 1.01)),
        ("another init seed", None, _train(seed=1)),
        ("gradient sign flipped in one leaf", "params/mlp/dense_2/bias",
         _train(flip="params/mlp/dense_2/bias")),
        ("one leaf negated", k1, edited(k1, lambda v: -v)),
        ("one leaf scaled x1.001", k1, edited(k1, lambda v: v * 1.001)),
        ("one leaf: two rows swapped", k1, edited(k1, lambda v: v[[1, 0, *range(2, 64)]])),
        ("one leaf transposed (same shape)", k1, edited(k1, lambda v: v.T)),
        ("one element +rms, at a sampled position", k1, edited(k1, lambda v: one(v, 0, rms))),
        ("one element +rms, elsewhere", k1, edited(k1, lambda v: one(v, 1001, rms))),
        ("one element +0.1 rms, elsewhere", k1, edited(k1, lambda v: one(v, 1001, 0.1 * rms))),
        ("one element +0.01 rms, elsewhere", k1,
         edited(k1, lambda v: one(v, 1001, 0.01 * rms))),
        ("noise 1e-6 relative on every leaf", None,
         {k: (v * (1 + 1e-6 * np.random.default_rng(7).standard_normal(v.shape)))
          .astype(np.float32) for k, v in base.items()}),
    ]


def detection(cross: bool = False) -> list[list[str]]:
    """Rows ``[perturbation, verdict before, verdict after]``: the numerics check of each
    perturbed run against the unperturbed baseline, with the per-leaf fingerprint of
    before (RMS + 16 samples) and the compact one (one sketch value per leaf). A verdict
    reads ``regression: <leaf it names>`` or ``pass``; ``cross`` uses the
    cross-environment tolerance."""
    from pytest_accelperf.backends.measure.common import fingerprint
    from pytest_accelperf.checks.numerics import check_numerics
    from pytest_accelperf.records.fingerprint import compact
    from pytest_accelperf.records.verdict import Tolerances
    base_fp = fingerprint(_train())
    legacy = {p: {k: v for k, v in leaf.items() if k != "sketch"} for p, leaf in base_fp.items()}
    rows = []
    for what, leaf, params in perturbations():
        now = {"numerics": fingerprint(params)}
        shown = []
        for baseline in (legacy, compact(base_fp)):
            r = check_numerics(now, {"numerics": baseline}, Tolerances(),
                               same_environment=not cross)
            assert r is not None
            named = r.detail.split(" differs", 1)[0] if r.verdict.value == "regression" else ""
            mark = "" if leaf is None or named in ("", leaf) else " (another leaf)"
            shown.append(f"{r.verdict.value}: {named}{mark}" if named else r.verdict.value)
        rows.append([what, leaf or "(all)", *shown])
    return rows


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
                   help="a baseline file whose largest block is the template (default: the "
                        "committed block with the most parameter leaves)")
    p.add_argument("--format", choices=("compact", "legacy"), default="compact",
                   help="the form of the generated blocks: compact (default), as this "
                        "version records them (the compact fingerprint, 4-digit samples), "
                        "or legacy, the template as committed before the compact format "
                        "(a per-leaf fingerprint of RMS and 16 samples, 6-digit samples)")
    p.add_argument("--machines", type=_positive, default=1, metavar="K",
                   help="every block holds the timing of K machines (default 1)")
    p.add_argument("--schema", type=int, choices=(2, SCHEMA_VERSION), default=SCHEMA_VERSION,
                   help=f"write the files as schema 2 (each machine's entry with its "
                        f"environment) or {SCHEMA_VERSION} (default: the entries' "
                        f"environments once per file)")
    p.add_argument("--leaf-samples", type=int, default=None, metavar="K",
                   help="keep only the first K values of each parameter leaf's fingerprint "
                        "sample (default: all, as recorded): what a more compact "
                        "fingerprint would cost to read")
    p.add_argument("--sizes", action="store_true",
                   help="measure the bytes of each part of a block, before and after the "
                        "compact form, instead of timing the store")
    p.add_argument("--leaves", type=_positive, default=100,
                   help="leaves of the synthetic model of --sizes (default 100)")
    p.add_argument("--detection", action="store_true",
                   help="print what the numerics check catches, before and after the "
                        "compact fingerprint, instead of timing the store")
    p.add_argument("--no-show", action="store_true",
                   help="do not time the accelperf command")
    p.add_argument("--no-check", action="store_true",
                   help="do not time accelperf baselines check (a version without it)")
    p.add_argument("--keep", action="store_true", help="keep the generated store")
    p.add_argument("--out", default=str(HERE / "results"),
                   help="directory for the JSON results (default benchmarks/results)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ns = build_parser().parse_args(argv)
    if ns.sizes or ns.detection:
        print(shlex.join([Path(sys.executable).name, "benchmarks/store.py", *argv]) + "\n")
    if ns.sizes:
        print(tabulate(measure_sizes(ns.leaves), tablefmt="github", headers=[
            "block", "leaves", "part", "bytes before", "bytes after"]) + "\n")
    if ns.detection:
        for cross in (False, True):
            tol = "cross-environment" if cross else "same-environment"
            print(tabulate(detection(cross), tablefmt="github", headers=[
                f"perturbation ({tol} tolerance)", "leaf changed",
                "before: RMS + 16 samples", "after: 1 sketch value"]) + "\n")
    if ns.sizes or ns.detection:
        return 0
    block, source = template_block(ns.template)
    if ns.leaf_samples is not None:
        if ns.format != "legacy":
            raise SystemExit("--leaf-samples cuts the samples of a legacy fingerprint: "
                             "pass --format legacy with it")
        for leaf in (block.get("numerics") or {}).values():
            leaf["sample"] = leaf.get("sample", [])[:max(ns.leaf_samples, 0)]
        source += f" (samples cut to {ns.leaf_samples} per leaf)"
    leaves = _leaves(block)
    if ns.format == "compact":
        block = as_recorded(block)
    block_bytes = _in_file(block, compact_layout=True)
    scratch = Path(tempfile.mkdtemp(prefix="accelperf-store-"))
    load_before = os.getloadavg()
    result: dict[str, Any] = {
        "command": shlex.join([Path(sys.executable).name, "benchmarks/store.py", *argv]),
        "machine": _machine(), "template": source, "block_bytes": block_bytes,
        "format": ns.format, "leaves": leaves, "modules": ns.modules,
        "cases": ns.cases, "machines": ns.machines, "schema": ns.schema,
        "repeat": ns.repeat, "times": {}}
    rows: list[list[str]] = []
    plain: list[float] = []

    def row(name: str, times: list[float], extra: str = "",
            ratios: list[float] | None = None) -> None:
        result["times"][name] = times
        ratio = f"{statistics.median(ratios):.2f}" if ratios else ""
        if ratios:
            result.setdefault("ratio_to_json_load", {})[name] = ratios
        rows.append([name, f"{statistics.median(times):.3f}", f"{min(times):.3f}", ratio,
                     extra])

    try:
        root = scratch / "baselines"
        t0 = time.perf_counter()
        nodeids = generate(root, ns.modules, ns.cases, block, ns.machines, ns.schema)
        result["generate_s"] = time.perf_counter() - t0
        store_bytes = sum(p.stat().st_size for p in (root / PLATFORM).rglob("*.json"))
        result["store_bytes"] = store_bytes
        n = len(nodeids)
        over = f" x {ns.machines} machines" if ns.machines > 1 else ""
        if ns.machines > 1:  # the store's read of every case, then with the checks' typing
            row(f"load, {ns.modules} x {ns.cases} cases{over}", timed(
                lambda: load_and_check(root, nodeids, reader(ns.machines), typed=False),
                ns.repeat), f"schema {ns.schema}")
        row(f"load + check, {ns.modules} x {ns.cases} cases{over}", timed(
            lambda: load_and_check(root, nodeids, reader(ns.machines)), ns.repeat),
            f"{store_bytes / 2**20:.0f} MiB of JSON ({store_bytes / 1e6:.1f} MB)")
        row("orjson.loads of every file (no check)", timed(lambda: orjson_load(root),
                                                          ns.repeat))
        row("the store's parse of every file (jsonfile.loads)",
            timed(lambda: store_parse(root), ns.repeat), "orjson, no repeated key")
        if not ns.no_show:
            cmd = accelperf_command()
            show = [*cmd, "baselines", "show", "--baselines", str(root)]
            runs = []
            plain_cpu: list[float] = []
            for _ in range(ns.repeat):  # each show right after a json.load of the same files
                cpu0 = time.process_time()
                plain.extend(timed(lambda: plain_json_load(root), 1))
                plain_cpu.append(time.process_time() - cpu0)
                runs.append(run_command_rss(show))
            result["json_load_cpu_s"] = plain_cpu
            if not runs[0][2].startswith(f"{n} case(s)"):
                raise SystemExit(f"accelperf baselines show: unexpected output {runs[0][2]!r}")
            result["show_rss_mb"] = [r[1] for r in runs]
            result["show_cpu_s"] = [r[3] for r in runs]
            row("json.load of every file (no check)", plain,
                f"CPU {statistics.median(plain_cpu):.3f} s", [1.0] * len(plain))
            row("accelperf baselines show", [r[0] for r in runs],
                f"peak RSS {max(r[1] for r in runs):.0f} MB, CPU "
                f"{statistics.median(r[3] for r in runs):.3f} s",
                [r[0] / p for r, p in zip(runs, plain, strict=True)])
            checks = []
            for _ in range(0 if ns.no_check else ns.repeat):
                before = timed(lambda: plain_json_load(root), 1)[0]
                checks.append((run_command_rss([*cmd, "baselines", "check", "--baselines",
                                                str(root)]), before))
            if checks:
                row("accelperf baselines check (whole blocks)", [c[0] for c, _ in checks],
                    f"peak RSS {max(c[1] for c, _ in checks):.0f} MB",
                    [c[0] / p for c, p in checks])
            helps = [run_command_rss([*cmd, "--help"]) for _ in range(ns.repeat)]
            result["help_rss_mb"] = [r[1] for r in helps]
            result["help_cpu_s"] = [r[3] for r in helps]
            row("accelperf --help (start + imports)", [r[0] for r in helps],
                f"peak RSS {max(r[1] for r in helps):.0f} MB, CPU "
                f"{statistics.median(r[3] for r in helps):.3f} s")
        for size in ns.single:
            single = scratch / f"single-{size}"
            path = module_file(single, 0, size, block, ns.machines, ns.schema)
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
    table = tabulate(rows, headers=["measurement", "median s", "fastest s", "x json.load", ""],
                     tablefmt="github", disable_numparse=True)
    print(f"{result['command']}\n\ntemplate block: {source}, {ns.format} ({leaves} parameter "
          f"leaves, {block_bytes:,} bytes in its file); load average {load_before[0]:.2f} before, "
          f"{load_after[0]:.2f} after\n\n{table}")
    out_dir = Path(ns.out).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"store-{_dt.datetime.now().strftime('%Y%m%d-%H%M%S')}.json"
    _write(path, result)
    print(f"raw results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
