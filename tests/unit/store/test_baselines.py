"""The baseline store on its own: paths, merge, atomic writes, corrupt files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_accelperf.store.baselines import BaselineError, BaselineStore, case_key, module_key
from pytest_accelperf.store.block import Block


def block(value: int) -> dict[str, object]:
    return {"outcome": "ok", "environment": {}, "value": value}


def test_keys() -> None:
    nodeid = "suites/jax/test_mesh_sweep.py::test_mesh_sweep[jax-mesh4x2-b128]"
    assert module_key(nodeid) == "suites/jax/test_mesh_sweep"
    assert case_key(nodeid) == "test_mesh_sweep[jax-mesh4x2-b128]"


def test_write_merges_and_keeps_other_cases(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path, "cpu-x8")
    store.write({"m.py::a": block(1), "m.py::b": block(2)})
    fresh = BaselineStore(tmp_path, "cpu-x8")
    fresh.write({"m.py::b": block(3)})
    data = json.loads((tmp_path / "cpu-x8" / "m.json").read_text())
    assert data["cases"] == {"a": block(1), "b": block(3)}
    stored = BaselineStore(tmp_path, "cpu-x8").get("m.py::b")
    assert isinstance(stored, Block) and stored.to_json() == block(3)
    assert BaselineStore(tmp_path, "cpu-x8").get("m.py::zzz") is None
    assert [p.name for p in (tmp_path / "cpu-x8").iterdir()] == ["m.json"], "no temp/lock left"


def test_corrupt_file_is_never_overwritten(tmp_path: Path) -> None:
    path = tmp_path / "cpu-x8" / "m.json"
    path.parent.mkdir(parents=True)
    path.write_text('{\n  "cases": {,\n}\n')
    store = BaselineStore(tmp_path, "cpu-x8")
    with pytest.raises(BaselineError, match=r"m.json:2:\d+: corrupt baseline file"):
        store.get("m.py::a")
    with pytest.raises(BaselineError, match="corrupt"):
        store.write({"m.py::a": block(1), "other.py::b": block(2)})
    assert path.read_text() == '{\n  "cases": {,\n}\n'
    # the other module's file was still written: nothing else is lost
    assert (tmp_path / "cpu-x8" / "other.json").exists()


def test_block_without_required_keys(tmp_path: Path) -> None:
    path = tmp_path / "p" / "m.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"schema_version": 1, "cases": {"a": {"outcome": "ok"}}},
                               indent=2))
    with pytest.raises(BaselineError, match=r"m.json:4: case 'a': invalid baseline block: "
                                            r"environment: missing \(a required field\)"):
        BaselineStore(tmp_path, "p").get("m.py::a")


def test_nan_is_refused_rather_than_written_as_invalid_json(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path, "p")
    with pytest.raises(BaselineError, match=r"m.py::a: not stored as a baseline: invalid "
                                            r"block: x: Input should be a finite number"):
        store.write({"m.py::a": {"outcome": "ok", "environment": {}, "x": float("nan")},
                     "m.py::b": block(1)})
    # the other case was written: one invalid block loses nothing else
    assert json.loads((tmp_path / "p" / "m.json").read_text())["cases"] == {"b": block(1)}


def test_a_block_that_is_not_json_is_refused(tmp_path: Path) -> None:
    with pytest.raises(BaselineError, match=r"m.py::a: not stored: the block is not JSON"):
        BaselineStore(tmp_path, "p").write({"m.py::a": {"outcome": "ok", "environment": {},
                                                        "when": object()}})
    assert not (tmp_path / "p" / "m.json").exists()


def test_removing_every_case_deletes_the_file_and_keeps_invalid_blocks_of_others(
        tmp_path: Path) -> None:
    path = tmp_path / "p" / "m.json"
    path.parent.mkdir(parents=True)
    broken = {"outcome": "banana", "environment": {}}
    path.write_text(json.dumps({"schema_version": 1, "cases": {"a": block(1), "z": broken}}))
    store = BaselineStore(tmp_path, "p")
    assert store.remove(["m.py::a"]) == [path]
    assert json.loads(path.read_text())["cases"] == {"z": broken}
    assert store.remove(["m.py::z"]) == [path]
    assert not path.exists()
