"""Compact baseline blocks (issue 16, part 2): the stored parameter fingerprint is one
number per leaf, arrays of numbers take one line, and blocks recorded before still load
and check as they did."""

from __future__ import annotations

import copy
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pytest_accelperf.backends.measure.common import fingerprint
from pytest_accelperf.checks.numerics import check_numerics
from pytest_accelperf.records.fingerprint import compact, is_compact
from pytest_accelperf.records.verdict import Tolerances, Verdict
from pytest_accelperf.store.baselines import BaselineStore, check_block, read
from pytest_accelperf.store.schema import validate_block

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "benchmarks"))
import store as bench  # noqa: E402

TOL = Tolerances()
#: A block file as committed before the compact format (commit 3c247ab).
COMMITTED = REPO / "benchmarks" / "store_templates" / "torch" / "test_torch_gpt.json"


def _params(seed: int = 0) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    return {f"params/encoder/layer_{i}/{kind}": rng.standard_normal(shape).astype(np.float32)
            for i in range(3) for kind, shape in (("attention/query/kernel", (16, 16)),
                                                  ("attention/query/bias", (16,)))}


def _committed() -> tuple[str, dict[str, Any]]:
    cases = json.loads(COMMITTED.read_text())["cases"]
    key = sorted(k for k, b in cases.items() if b.get("numerics"))[0]
    return key, cases[key]


# -- the stored form -------------------------------------------------------------------------
def test_the_store_keeps_one_number_per_leaf_five_leaves_a_line(tmp_path: Path) -> None:
    fp = fingerprint(_params())
    block = {"outcome": "ok", "environment": {}, "numerics": fp,
             "step_time": {"median": 0.01, "samples": [0.01, 0.011, 0.0099]}}
    stored = check_block("m.py::t", block)
    assert is_compact(stored["numerics"]) and stored["numerics"] == compact(fp)
    assert len(stored["numerics"]["sketch"]) == 6 and len(stored["numerics"]["tags"]) == 12
    BaselineStore(tmp_path, "cpu").write({"m.py::t": block})
    text = (tmp_path / "cpu" / "m.json").read_text()
    lines = text.splitlines()
    at = lines.index('      "numerics": {')
    assert lines[at + 1] == '        "sketch": ['
    assert lines[at + 4] == '        ],'
    rows = [[float(v) for v in s.strip().rstrip(",").split(", ")] for s in lines[at + 2:at + 4]]
    assert [len(r) for r in rows] == [5, 1]  # 5 leaves a line, in path order
    assert rows[0] + rows[1] == stored["numerics"]["sketch"]
    assert all(s.startswith(" " * 10) and not s.startswith(" " * 11)
               for s in lines[at + 2:at + 4])
    assert '        "samples": [0.01, 0.011, 0.0099]' in lines  # numbers on one line
    assert json.loads(text)["cases"]["t"] == stored
    assert read(tmp_path / "cpu" / "m.json").cases["t"] == stored


def test_a_synthetic_100_leaf_block_is_at_most_4_kb() -> None:
    rows = bench.measure_sizes(100)
    synth = {part: (before, after) for name, _, part, before, after in rows
             if name.startswith("synthetic")}
    before, after = synth["total"]
    assert before > 60_000 and after <= 4_096, synth  # 63.7 KB -> 3.6 KB
    assert synth["numerics"][1] <= 1_700  # ~12 bytes per leaf, 5 leaves a line


def test_a_changed_leaf_changes_one_line_of_the_sketch() -> None:
    """Human-diffable: a diff of two fingerprints that differ in one leaf is one line,
    the line of that leaf's group of five."""
    import difflib

    from pytest_accelperf.store import jsonfile
    sketch = [round(0.1 + i / 1000, 6) for i in range(23)]
    moved = [*sketch[:12], 9.5, *sketch[13:]]
    old, new = (jsonfile.dumps({"numerics": {"sketch": s, "structure": "0" * 12,
                                             "tags": "00" * 23}}).splitlines()
                for s in (sketch, moved))
    changed = [line for line in difflib.unified_diff(old, new, lineterm="", n=0)
               if line[:1] in "+-" and not line.startswith(("+++", "---"))]
    assert changed == ["-      0.11, 0.111, 0.112, 0.113, 0.114,",  # leaves 11-15
                       "+      0.11, 0.111, 9.5, 0.113, 0.114,"]
    assert len(old) == 3 + 5 + 5  # 3 openings, 23 leaves in 5 lines, ], 2 keys, 2 closings


def test_real_blocks_shrink_and_what_the_checks_need_is_kept() -> None:
    _, block = _committed()
    for leaf in block["numerics"].values():
        leaf["sketch"] = 0.0
    after = bench.compacted(block)
    assert bench.part_sizes(after, True)["total"] * 5 < bench.part_sizes(block, False)["total"]
    assert len(after["step_time"]["samples"]) == len(block["step_time"]["samples"])
    assert after["step_time"]["samples"] == pytest.approx(block["step_time"]["samples"],
                                                          rel=5e-4)
    assert after["loss"] == block["loss"] and after["memory"] == block["memory"]


# -- detection power -------------------------------------------------------------------------
def test_the_sketch_catches_what_the_samples_caught_and_names_the_leaf() -> None:
    rows = {what: (leaf, before, after) for what, leaf, before, after in bench.detection()}
    for what in ("same run again", "arithmetic in float64 (rounding only)",
                 "noise 1e-6 relative on every leaf"):
        assert rows[what][1:] == ("pass", "pass"), what  # no false alarm
    for what in ("learning rate x1.001", "learning rate x1.01", "another init seed"):
        assert rows[what][2].startswith("regression: params/"), what
    for what in ("gradient sign flipped in one leaf", "one leaf negated",
                 "one leaf scaled x1.001", "one leaf: two rows swapped",
                 "one leaf transposed (same shape)", "one element +rms, elsewhere"):
        leaf, before, after = rows[what]
        assert before == after == f"regression: {leaf}", what


def test_a_change_anywhere_in_a_large_leaf_moves_the_sketch_not_the_rms() -> None:
    rng = np.random.default_rng(3)
    w = rng.standard_normal((512, 512)).astype(np.float32)
    base = {"numerics": fingerprint({"w": w})}
    caught = {"before": 0, "after": 0}
    legacy = {"w": {k: v for k, v in base["numerics"]["w"].items() if k != "sketch"}}
    for where in rng.integers(0, w.size, 20):
        changed = w.copy()
        changed.flat[where] += 3 * float(np.sqrt(np.mean(w.astype(np.float64) ** 2)))
        now = {"numerics": fingerprint({"w": changed})}
        for name, stored in (("before", legacy), ("after", compact(base["numerics"]))):
            r = check_numerics(now, {"numerics": stored}, TOL)
            caught[name] += r is not None and r.verdict is Verdict.REGRESSION
    assert caught["after"] >= 15 and caught["before"] <= 2, caught


# -- structure --------------------------------------------------------------------------------
def test_a_structure_change_names_the_runs_leaves() -> None:
    params = _params()
    base = {"numerics": compact(fingerprint(params))}
    reshaped = {**params, "params/encoder/layer_1/attention/query/kernel":
                params["params/encoder/layer_1/attention/query/kernel"].reshape(256)}
    r = check_numerics({"numerics": fingerprint(reshaped)}, base, TOL)
    assert r is not None and r.verdict is Verdict.REGRESSION
    assert r.detail == ("parameter structure changed: params/encoder/layer_1/attention/query/"
                        "kernel (256,) float32: name, shape or dtype changed")
    fewer = {k: v for k, v in params.items() if k != "params/encoder/layer_1/attention/query/bias"}
    fewer["params/head/kernel"] = np.ones((2, 2), np.float32)
    r = check_numerics({"numerics": fingerprint(fewer)}, base, TOL)
    assert r is not None and r.verdict is Verdict.REGRESSION
    assert "added params/head/kernel (2, 2) float32" in r.detail
    assert ("removed 1 leaf (after params/encoder/layer_0/attention/query/kernel, before "
            "params/encoder/layer_1/attention/query/kernel)") in r.detail


def test_two_compact_fingerprints_compare_by_position() -> None:
    params = _params()
    base = {"numerics": compact(fingerprint(params))}
    key = sorted(params)[2]
    now = compact(fingerprint({**params, key: -params[key]}))
    r = check_numerics({"numerics": now}, base, TOL)
    assert r is not None and r.verdict is Verdict.REGRESSION
    assert r.detail.startswith("leaf 3 of 6 differs from the baseline fingerprint")


# -- migration: blocks recorded before -------------------------------------------------------
def test_a_committed_block_loads_and_checks_as_before(tmp_path: Path) -> None:
    key, block = _committed()
    path = tmp_path / "cpu-x8" / "suites" / "torch" / "test_torch_gpt.json"
    path.parent.mkdir(parents=True)
    shutil.copy(COMMITTED, path)
    store = BaselineStore(tmp_path, "cpu-x8")
    nodeid = f"suites/torch/test_torch_gpt.py::{key}"
    read = store.get(nodeid)
    assert read is not None
    stored = read.to_json()
    assert stored == block and not is_compact(stored["numerics"])
    validate_block(stored)
    # this run computes RMS and samples as it did: the old block is checked with them
    now = {"numerics": {p: {**leaf, "sketch": 0.25} for p, leaf in block["numerics"].items()}}
    r = check_numerics(now, stored, TOL)
    assert r is not None and r.verdict is Verdict.PASS, r.detail
    leaf = sorted(block["numerics"])[4]
    now["numerics"][leaf]["sample"][3] += 0.5
    r = check_numerics(now, stored, TOL)
    assert r is not None and r.verdict is Verdict.REGRESSION
    assert r.detail.startswith(f"{leaf} differs from the baseline fingerprint")
    # a compact fingerprint against it is incomparable, not a crash or a pass
    r = check_numerics({"numerics": compact(now["numerics"])}, stored, TOL)
    assert r is not None and r.verdict is Verdict.INCOMPARABLE


def test_writing_a_new_case_keeps_the_old_blocks_as_they_were(tmp_path: Path) -> None:
    path = tmp_path / "cpu-x8" / "suites" / "torch" / "test_torch_gpt.json"
    path.parent.mkdir(parents=True)
    shutil.copy(COMMITTED, path)
    old = json.loads(path.read_text())["cases"]
    fresh = {"outcome": "ok", "environment": {}, "numerics": fingerprint(_params())}
    BaselineStore(tmp_path, "cpu-x8").write({"suites/torch/test_torch_gpt.py::test_new": fresh})
    text = path.read_text()
    cases = json.loads(text)["cases"]
    assert {k: v for k, v in cases.items() if k != "test_new"} == old  # values unchanged
    assert is_compact(cases["test_new"]["numerics"])
    assert len(text) < COMMITTED.stat().st_size  # the layout alone: numbers on one line
    assert read(path).cases == cases


def test_an_invalid_compact_fingerprint_is_named(tmp_path: Path) -> None:
    block = check_block("m.py::t", {"outcome": "ok", "environment": {},
                                    "numerics": fingerprint(_params())})
    bad = copy.deepcopy(block)
    bad["numerics"]["tags"] = bad["numerics"]["tags"][:-2]
    path = tmp_path / "cpu" / "m.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"schema_version": 1, "cases": {"t": bad}}, indent=2))
    with pytest.raises(Exception, match=r"case 't': invalid baseline block: numerics: .*"
                                        r"5 tag\(s\) of 2 hex digits for 6 sketch value"):
        BaselineStore(tmp_path, "cpu").get("m.py::t")


def test_the_store_benchmark_generates_either_form_and_both_read(tmp_path: Path) -> None:
    """``benchmarks/store.py --format compact`` (the default: blocks as this version records
    them) and ``--format legacy`` (as committed before) both make stores that read back,
    every block valid, the values varied from case to case."""
    legacy, _ = bench.template_block(None)
    recorded = bench.as_recorded(legacy)
    assert is_compact(recorded["numerics"]) and not is_compact(legacy["numerics"])
    assert len(recorded["numerics"]["sketch"]) == len(legacy["numerics"]) == 30
    assert len(set(recorded["numerics"]["sketch"])) > 20  # leaves differ, as a model's do
    for name, block in (("compact", recorded), ("legacy", legacy)):
        path = bench.module_file(tmp_path / name, 0, 3, block)
        loaded = read(path, bench.PLATFORM)
        assert len(loaded.cases) == 3 and not loaded.invalid, name
        first, second = list(loaded.cases.values())[:2]
        assert first["numerics"] != second["numerics"], name
    assert (bench._in_file(recorded, compact_layout=True) * 5
            < bench._in_file(legacy, compact_layout=True))


def test_a_suite_baseline_reads_as_committed_and_rewrites_5_leaves_a_line(
        tmp_path: Path) -> None:
    """The committed suite baselines (compact fingerprints, written a leaf a line before the
    sketch took 5 a line) read as they are, every block valid; the same file in a layout of
    a number a line reads the same; a write lays the sketch out 5 a line, no value changed."""
    from pytest_accelperf.store.baselines import parse

    committed = REPO / "baselines" / "cpu-x8" / "suites" / "torch" / "test_torch_gpt.json"
    text = committed.read_text()
    loaded = read(committed, "cpu-x8")
    assert loaded.cases and not loaded.invalid
    sketches = [b["numerics"]["sketch"] for b in loaded.cases.values() if b.get("numerics")]
    assert sketches and all(len(s) == 30 for s in sketches)
    spread = json.dumps(json.loads(text), indent=2, sort_keys=True) + "\n"
    assert '        "sketch": [\n          ' in spread  # a leaf a line
    old = parse(tmp_path / "m.json", spread)
    assert old.cases == loaded.cases and not old.invalid
    rewritten = old.to_text()
    assert rewritten == loaded.to_text() and json.loads(rewritten) == json.loads(text)
    assert len(rewritten) < len(spread)
    lines = rewritten.splitlines()
    at = lines.index('        "sketch": [')
    assert [len(line.split(", ")) for line in lines[at + 1:at + 7]] == [5] * 6
    assert lines[at + 7] == "        ],"
