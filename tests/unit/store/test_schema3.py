"""Schema 3 of a baseline file (store/machines.py's pack and unpack): the environment of
each other machine's timing once per file, under ``environments``, the entry naming it by
its key; files of schema 1 and 2 read as they are; ``accelperf baselines rewrite``; and
``accelperf baselines diff`` machine by machine. Store files only: no training."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from pytest_accelperf import cli
from pytest_accelperf.cli.baselines import DIFFED, SHOWN, SHOWN_MACHINES
from pytest_accelperf.store.baselines import (
    SCHEMA_VERSION,
    BaselineError,
    BaselineFile,
    BaselineStore,
    InvalidBlockError,
    parse,
    read,
)
from pytest_accelperf.store.jsonfile import dumps
from pytest_accelperf.store.machines import merge, pack, unpack

REPO = Path(__file__).resolve().parents[3]
COMMITTED = REPO / "baselines" / "cpu-x8" / "suites" / "torch" / "test_deepspeed.json"
MODULE = "suites/torch/test_deepspeed"
PLATFORM = "cpu-x8"


def _blocks() -> dict[str, dict[str, Any]]:
    """The committed module's blocks, each with the timing of two more machines: ``ci``
    (one environment for every case) and ``laptop`` (its stack upgraded for the first
    case only: two environments)."""
    loaded = read(COMMITTED, PLATFORM)
    assert loaded.cases and not loaded.invalid
    out = {}
    for i, (key, block) in enumerate(sorted(loaded.cases.items())):
        block = copy.deepcopy(block)
        for name, isa, torch in (("ci", "avx avx2", "2.13.0+cpu"),
                                 ("laptop", "sse4_2", "2.14.0" if i == 0 else "2.13.0+cpu")):
            other = copy.deepcopy(block)
            other.pop("machines", None)
            other["environment"]["cpu_isa"] = isa
            other["environment"]["packages"]["torch"] = torch
            other["step_time"]["median"] *= 1.5
            found = merge(block, other, name, timing_only=True)
            assert found is not None
            block = found
        out[key] = block
    return out


def _v2_text(cases: dict[str, dict[str, Any]]) -> str:
    """``cases`` as a file of schema 2 held them: each entry with its environment."""
    return dumps({"cases": cases, "platform": PLATFORM, "schema_version": 2}) + "\n"


def test_each_environment_is_written_once_and_the_blocks_read_back_unchanged() -> None:
    blocks = _blocks()
    text = BaselineFile(Path("m.json"), PLATFORM, blocks).to_text()
    data = json.loads(text)
    assert data["schema_version"] == SCHEMA_VERSION == 3
    table = data["environments"]
    laptop = sorted(k for k in table if k.startswith("laptop~"))
    assert len(laptop) == 2 and "ci" in table and "laptop" not in table
    # the machines the committed blocks hold already (CI's host), one environment each
    committed = {n for b in blocks.values() for n in b["machines"]} - {"ci", "laptop"}
    assert committed and set(table) == {"ci", *laptop, *committed}
    for key, block in data["cases"].items():
        for name, entry in block["machines"].items():
            assert isinstance(entry["environment"], str)
            assert table[entry["environment"]] == blocks[key]["machines"][name]["environment"]
        # the block's own environment stays in the block
        assert block["environment"] == blocks[key]["environment"]
    loaded = parse(Path("m.json"), text)
    assert loaded.cases == blocks and not loaded.invalid
    # the same blocks, the same text (keys from names and hashes, not from an order)
    assert BaselineFile(Path("m.json"), PLATFORM, dict(reversed(blocks.items()))).to_text() \
        == text
    # it is the bytes that were repeated: a third less here, with 3 machines
    assert len(text) < 0.8 * len(_v2_text(blocks))


def test_a_schema_2_file_reads_as_the_same_blocks_and_shows_the_same_fields() -> None:
    blocks = _blocks()
    v2 = _v2_text(blocks)
    v3 = BaselineFile(Path("m.json"), PLATFORM, blocks).to_text()
    assert parse(Path("m.json"), v2).cases == parse(Path("m.json"), v3).cases == blocks
    for fields in (SHOWN, SHOWN_MACHINES, DIFFED):
        fast2, fast3 = fields.read(v2.encode()), fields.read(v3.encode())
        assert fast2 is not None and fast2 == fast3
        exact = parse(Path("m.json"), v3, fields)
        assert exact.cases and not exact.invalid
    shown = SHOWN.read(v3.encode())
    assert shown is not None
    assert {b["machines"]["ci"]["environment"]["host_cpu"] for b in shown.values()} == {
        "AMD EPYC"}
    # a key in a file of schema 2 is not a reference: the exact read names the entry
    data = json.loads(v3)
    data["schema_version"] = 2
    named = json.dumps(data)
    assert SHOWN.read(named.encode()) is None
    loaded = parse(Path("m.json"), named)
    assert not loaded.cases and len(loaded.invalid) == len(blocks)
    assert "machines.ci.environment: should be a JSON object (found 'ci')" in next(
        iter(loaded.invalid.values())).message


def test_an_entry_naming_an_environment_the_file_lacks_is_one_invalid_block(
        tmp_path: Path) -> None:
    blocks = _blocks()
    text = BaselineFile(Path("m.json"), PLATFORM, blocks).to_text()
    data = json.loads(text)
    bad = sorted(data["cases"])[1]
    data["cases"][bad]["machines"]["ci"]["environment"] = "gone"
    broken = dumps(data) + "\n"
    path = tmp_path / PLATFORM / f"{MODULE}.json"
    path.parent.mkdir(parents=True)
    path.write_text(broken)
    loaded = read(path, PLATFORM)
    assert sorted(loaded.invalid) == [bad] and len(loaded.cases) == len(blocks) - 1
    line = broken.splitlines().index('          "environment": "gone",') + 1
    assert loaded.invalid[bad].message.startswith(
        f"{path}:{line}: case {bad!r}: invalid baseline block: machines.ci.environment: "
        f"'gone' is not a key of the file's environments")
    assert loaded.invalid[bad].raw == data["cases"][bad]  # kept as it was read
    assert SHOWN.read(broken.encode()) is None  # show reads it the exact way, which names it
    store = BaselineStore(tmp_path, PLATFORM)
    with pytest.raises(InvalidBlockError, match="'gone' is not a key"):
        store.get_view(f"{MODULE}.py::{bad}", "ci")
    # a write of another case keeps the invalid block as it was, key and all
    other = sorted(blocks)[0]
    store.write({f"{MODULE}.py::{other}": {k: v for k, v in blocks[other].items()
                                            if k != "machines"}})
    again = json.loads(path.read_text())
    assert again["cases"][bad]["machines"]["ci"]["environment"] == "gone"


def test_an_invalid_environment_of_the_table_is_the_files_error() -> None:
    data = json.loads(BaselineFile(Path("m.json"), PLATFORM, _blocks()).to_text())
    data["environments"]["ci"]["device_count"] = "eight"
    text = dumps(data) + "\n"
    with pytest.raises(BaselineError, match=r"m.json:\d+: not a baseline file: "
                                            r"environments.ci.device_count"):
        parse(Path("m.json"), text)


def test_unpack_shares_one_environment_and_leaves_a_block_with_a_missing_key_whole() -> None:
    env = {"host_cpu": "X", "cpu_isa": "sse2"}
    cases: dict[str, Any] = {
        "a": {"machines": {"m": {"environment": "m"}, "n": {"environment": "m"}}},
        "b": {"machines": {"m": {"environment": "m"}, "n": {"environment": "lost"}}}}
    assert unpack(cases, {"m": env}) == {"b": ("n", "lost")}
    assert cases["a"]["machines"]["m"]["environment"] is env
    assert cases["a"]["machines"]["n"]["environment"] is env
    assert cases["b"]["machines"]["m"]["environment"] == "m"  # untouched
    # written back, each machine's environment is keyed by the machine
    packed, table = pack({"a": cases["a"]})
    assert table == {"m": env, "n": env} and packed["a"]["machines"]["n"]["environment"] == "n"
    assert cases["a"]["machines"]["n"]["environment"] is env  # the blocks are not changed


# -- accelperf baselines rewrite ---------------------------------------------------------------
def test_rewrite_writes_older_files_in_schema_3_and_nothing_else(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocks = _blocks()
    root = tmp_path / "baselines"
    old = root / PLATFORM / f"{MODULE}.json"
    old.parent.mkdir(parents=True)
    old.write_text(_v2_text(blocks))
    current = root / PLATFORM / "suites" / "current.json"
    current.write_text(BaselineFile(current, PLATFORM, blocks).to_text())
    before = current.stat().st_mtime_ns
    assert cli.main(["baselines", "rewrite", "--baselines", str(root), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines() == [f"would rewrite {old}", "1 of 2 file(s) would be rewritten in "
                                f"the format of schema 3 in {root}; their blocks unchanged"]
    assert json.loads(old.read_text())["schema_version"] == 2
    assert cli.main(["baselines", "rewrite", "--baselines", str(root)]) == 0
    assert capsys.readouterr().out.splitlines()[0] == f"rewrote {old}"
    assert json.loads(old.read_text())["schema_version"] == 3
    assert read(old, PLATFORM).cases == blocks
    assert current.stat().st_mtime_ns == before  # already in this format: not written
    assert cli.main(["baselines", "rewrite", "--baselines", str(root)]) == 0
    assert capsys.readouterr().out.startswith("0 of 2 file(s) rewritten")


def test_rewrite_leaves_a_file_that_does_not_parse_and_says_so(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "baselines"
    broken = root / PLATFORM / "suites" / "broken.json"
    broken.parent.mkdir(parents=True)
    broken.write_text('{"cases": {}, "schema_version": 2,')
    assert cli.main(["baselines", "rewrite", "--baselines", str(root)]) == 1
    err = capsys.readouterr().err
    assert f"{broken}:1:" in err and "corrupt baseline file" in err
    assert broken.read_text() == '{"cases": {}, "schema_version": 2,'


# -- accelperf baselines diff, machine by machine ----------------------------------------------
def _store_of(root: Path, blocks: dict[str, dict[str, Any]]) -> Path:
    path = root / PLATFORM / f"{MODULE}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(BaselineFile(path, PLATFORM, blocks).to_text())
    return root


def test_diff_compares_every_machines_timing_and_names_the_machine(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocks = _blocks()
    case = sorted(blocks)[0]
    changed = copy.deepcopy(blocks)
    changed[case]["machines"]["ci"]["step_time"]["median"] *= 2  # only ci's timing moved
    old = _store_of(tmp_path / "old", blocks)
    new = _store_of(tmp_path / "new", changed)
    assert cli.main(["baselines", "diff", str(old), str(new)]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if "step time" in line]
    assert len(rows) == 1 and "step time [ci]" in rows[0] and "+100.0%" in rows[0]
    assert out.rstrip().endswith(f"1 case(s) differ, {len(blocks) - 1} equal")
    # --machine: that machine's timing only; another machine's shows no change
    assert cli.main(["baselines", "diff", str(old), str(new), "--machine", "laptop"]) == 0
    assert capsys.readouterr().out.rstrip().endswith(f"0 case(s) differ, {len(blocks)} equal")
    assert cli.main(["baselines", "diff", str(old), str(new), "--machine", "../x"]) == 1
    assert "invalid machine name '../x'" in capsys.readouterr().err


def test_diff_of_blocks_of_one_machine_names_no_machine(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocks = {k: {f: v for f, v in b.items() if f != "machines"} for k, b in _blocks().items()}
    case = sorted(blocks)[0]
    changed = copy.deepcopy(blocks)
    changed[case]["step_time"]["median"] *= 2
    old = _store_of(tmp_path / "old", blocks)
    new = _store_of(tmp_path / "new", changed)
    assert cli.main(["baselines", "diff", str(old), str(new)]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if "step time" in line]
    assert len(rows) == 1 and " step time " in rows[0] and "step time [" not in rows[0]
