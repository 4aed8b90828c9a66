"""The store at the size of a model zoo: reading a file is linear in its size.

No wall-time bound (the machine is shared): the tests count the work done (schema
validations, line computations, path resolutions) and compare the CPU time of files of N
and 4N cases, whose ratio a loaded machine changes far less than their absolute times.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from pytest_accelperf.store import baselines, jsonfile, schema
from pytest_accelperf.store import block as block_module
from pytest_accelperf.store.baselines import BaselineFile, BaselineStore, InvalidBlockError, parse
from pytest_accelperf.store.block import TIMING_SECTIONS, read_block
from pytest_accelperf.store.machines import view
from pytest_accelperf.store.schema import block_model

REPO = Path(__file__).resolve().parents[3]
PLATFORM = "cpu-x2"


def _template() -> dict[str, Any]:
    """A real block of the committed store, with a parameter fingerprint."""
    for path in sorted((REPO / "baselines").rglob("*.json")):
        for block in json.loads(path.read_text())["cases"].values():
            if block.get("numerics") and block.get("step_time"):
                # one machine's block (the other machines' timing, where the committed
                # store holds some, is added by the tests that want it: _machines)
                return {k: v for k, v in block.items() if k != "machines"}
    raise AssertionError("no committed block with a fingerprint and step times")


TEMPLATE = _template()


def _text(n: int, bad: dict[int, dict[str, Any]] | None = None) -> str:
    """A module file of ``n`` cases as the store writes it; case ``i`` in ``bad`` gets
    those fields (to make it invalid)."""
    cases = {}
    for i in range(n):
        block = {**TEMPLATE, "recorded_at": f"2026-11-23T00:00:{i % 60:02d}+00:00",
                 "samples_per_second": 1000.0 + i}
        block.update((bad or {}).get(i, {}))
        cases[f"test_model[torch-b8-v{i:05d}]"] = block
    return BaselineFile(Path("m.json"), PLATFORM, cases).to_text()


def _machines(block: dict[str, Any], k: int, i: int) -> dict[str, Any]:
    """``block`` with the timing of ``k - 1`` other machines beside its own (issue 46:
    timing per machine, store/machines.py), each its own step times and host."""
    if k <= 1:
        return block
    timing = {name: block[name] for name in TIMING_SECTIONS if name in block}
    others = {}
    for m in range(1, k):
        step = {**timing["step_time"], "samples": [t * (1 + m / 10 + i / 1e6)
                                                  for t in timing["step_time"]["samples"]]}
        others[f"runner-{m}"] = {**timing, "step_time": step, "recorded_at": block["recorded_at"],
                                 "environment": {**block["environment"], "cpu_isa": f"m{m}"}}
    return {**block, "machines": others}


def _text_of(n: int, machines: int) -> str:
    """A module file of ``n`` cases, each with the timing of ``machines`` machines."""
    cases = {}
    for i in range(n):
        block = {**TEMPLATE, "recorded_at": f"2026-11-23T00:00:{i % 60:02d}+00:00",
                 "samples_per_second": 1000.0 + i}
        cases[f"test_model[torch-b8-v{i:05d}]"] = _machines(block, machines, i)
    return BaselineFile(Path("m.json"), PLATFORM, cases).to_text()


def _count(monkeypatch: pytest.MonkeyPatch, module: Any, name: str) -> list[int]:
    calls = [0]
    real: Callable[..., Any] = getattr(module, name)

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, counted)
    return calls


def test_a_valid_file_is_validated_in_one_call_and_no_line_is_computed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    text = _text(200)
    one_by_one = _count(monkeypatch, schema, "validate_block")
    positions = _count(monkeypatch, jsonfile, "position")
    members = _count(monkeypatch, jsonfile, "members")
    lines = _count(monkeypatch, jsonfile, "line_column")
    loaded = parse(Path("m.json"), text)
    assert len(loaded.cases) == 200 and not loaded.invalid
    assert one_by_one[0] == 0, "a valid file is validated by one call over all its blocks"
    assert positions[0] == members[0] == lines[0] == 0, "no line is computed without error"


def test_invalid_blocks_are_located_in_one_pass_and_named_exactly(
        monkeypatch: pytest.MonkeyPatch) -> None:
    bad: dict[int, dict[str, Any]] = {17: {"outcome": "banana"}, 150: {"samples_per_second": -1.0},
           151: {"environment": []}}
    text = _text(200, bad)
    one_by_one = _count(monkeypatch, schema, "validate_block")
    members = _count(monkeypatch, jsonfile, "members")
    loaded = parse(Path("m.json"), text)
    assert sorted(loaded.invalid) == [f"test_model[torch-b8-v{i:05d}]" for i in sorted(bad)]
    assert len(loaded.cases) == 200 - len(bad)
    assert one_by_one[0] == len(bad), "only the invalid blocks are validated again"
    assert members[0] == 1, "the cases are walked once for all the errors"
    text_lines = text.splitlines()
    for i, field in ((17, "outcome"), (150, "samples_per_second"), (151, "environment")):
        message = loaded.invalid[f"test_model[torch-b8-v{i:05d}]"].message
        match = re.match(rf"m\.json:(\d+): case 'test_model\[torch-b8-v{i:05d}\]': invalid "
                         rf"baseline block: {field}: .+ Fix the block, or re-record", message)
        assert match, message
        assert f'"{field}":' in text_lines[int(match.group(1)) - 1], (field, match.group(1))
    # the errors are those validate_block gives the block alone
    key = "test_model[torch-b8-v00017]"
    with pytest.raises(ValidationError) as alone:
        schema.validate_block(json.loads(text)["cases"][key])
    assert baselines._shown(schema.error_lines(alone.value)) in loaded.invalid[key].message


def test_invalid_blocks_agrees_with_validate_block_on_every_block() -> None:
    cases: dict[str, Any] = {"ok": TEMPLATE, "nan": {**TEMPLATE, "mfu": float("nan")},
                             "list": [], "missing": {"outcome": "ok"},
                             "deep": {**TEMPLATE, "loss": {**TEMPLATE["loss"], "steps": -1}}}
    found = schema.invalid_blocks(cases)
    assert list(found) == ["nan", "list", "missing", "deep"]
    for key, exc in found.items():
        with pytest.raises(type(exc)) as alone:
            schema.validate_block(cases[key])
        assert schema.error_lines(alone.value) == schema.error_lines(exc)
    assert schema.invalid_blocks({"ok": TEMPLATE}) == {}


def _cpu_time(fn: Callable[[], Any], repeat: int = 3) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.thread_time()
        fn()
        best = min(best, time.thread_time() - t0)
    return best


@pytest.mark.parametrize("invalid", [False, True], ids=["valid", "with-invalid-blocks"])
@pytest.mark.timing
def test_parse_time_grows_linearly_with_the_cases(invalid: bool) -> None:
    n = 150
    small = _text(n, {n - 1: {"outcome": "banana"}} if invalid else None)
    large = _text(4 * n, {4 * n - 1: {"outcome": "banana"}} if invalid else None)
    path = Path("m.json")
    parse(path, small)  # warm caches (pydantic, the regex of the error walk)
    ratio = _cpu_time(lambda: parse(path, large)) / _cpu_time(lambda: parse(path, small))
    # Linear is 4; the quadratic line numbering this replaced was past 10 at these sizes.
    assert ratio < 8, f"4x the cases took {ratio:.1f}x the CPU time"


def test_a_store_resolves_each_module_path_once_for_reads(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / PLATFORM / "suites" / "m.json"
    path.parent.mkdir(parents=True)
    path.write_text(_text(50, {3: {"outcome": "banana"}}))
    store = BaselineStore(tmp_path, PLATFORM)
    resolved = _count(monkeypatch, BaselineStore, "path_for")
    nodeids = [f"suites/m.py::test_model[torch-b8-v{i:05d}]" for i in range(50)]
    for nodeid in nodeids:
        if nodeid.endswith("v00003]"):
            with pytest.raises(InvalidBlockError, match=r"m\.json:\d+: case "):
                store.get(nodeid)
        else:
            assert store.get(nodeid) is not None
    assert resolved[0] == 1
    # writes still check the path every time (a link made since is refused)
    store.write({nodeids[0]: TEMPLATE})
    assert resolved[0] == 2
    with pytest.raises(baselines.BaselineError, match="outside the pytest rootdir"):
        store.get("::test_model[x]")


def test_show_reads_the_store_one_file_at_a_time(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from pytest_accelperf import cli
    from pytest_accelperf.cli import baselines as command

    for platform in ("cpu-x2", "cpu-x1"):
        for module in ("b", "a"):
            path = tmp_path / platform / "suites" / f"{module}.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(_text(3))
    held: list[int] = []
    reads = _count(monkeypatch, command, "read")
    walk = command.iter_store(tmp_path, None, [])
    next(walk)
    assert reads[0] == 1, "the walk reads a file when it is asked for the next one"
    real_cells = command._shown_cells

    def cells(block: dict[str, Any]) -> Any:
        held.append(reads[0])
        return real_cells(block)

    monkeypatch.setattr(command, "_shown_cells", cells)
    assert cli.main(["baselines", "show", "--baselines", str(tmp_path)]) == 0
    # every file's rows are made before the next file is read
    assert held == [n for n in range(2, 6) for _ in range(3)]
    out = capsys.readouterr().out.splitlines()
    shown = [line.split()[:2] for line in out[2:-1] if line.startswith("cpu-")]
    assert shown == sorted(shown) and len(shown) == 12  # sorted as before: platform, case
    assert out[-1] == f"12 case(s) in {tmp_path}"


def test_show_lays_its_table_out_as_tabulate_did() -> None:
    """``accelperf baselines show`` formats its rows itself (tabulate took half its time
    over 10,000 cases), column for column as ``tabulate(..., disable_numparse=True)``."""
    from tabulate import tabulate

    from pytest_accelperf.cli.baselines import columns

    headers = ("platform", "case", "outcome", "throughput", "recorded")
    rows = [("cpu-x8", "suites/m.py::test_x[jax-mesh4x2-b64]", "ok", "1.01 k/s",
             "2026-11-22T01:25:31+00:00"),
            ("cpu", "m.py::t", "oom", "-", " padded "),  # cells are stripped, as tabulate's
            ("gpu-h100-80gb-x8", "", "ok", "12", "-")]
    assert columns(rows, headers) == tabulate(rows, headers=headers, disable_numparse=True)
    assert columns([], headers) == tabulate([], headers=headers, disable_numparse=True)
    assert not any(line.endswith(" ") for line in columns(rows, headers).splitlines())


def test_the_accelperf_command_starts_without_scipy() -> None:
    """SciPy (most of the start-up time) is imported when a statistic needs it, not by
    ``import pytest_accelperf`` or the ``accelperf baselines`` commands."""
    import subprocess
    import sys

    code = ("import sys, pytest_accelperf, pytest_accelperf.cli.baselines, "
            "pytest_accelperf.stats.bootstrap as s; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'scipy')); "
            "s.step_time_ratio([1.0, 1.1, 0.9, 1.05], [1.0, 1.0, 1.1, 0.95]); "
            "print('scipy.stats' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, cwd=REPO)
    assert done.stdout.splitlines() == ["[]", "True"], done.stdout + done.stderr


# -- timing per machine (issue 46): 5 machines' timing in every block -------------------------
@pytest.mark.timing
def test_a_file_of_five_machines_is_validated_in_one_call_and_read_linearly(
        monkeypatch: pytest.MonkeyPatch) -> None:
    n = 100
    small, large = _text_of(n, 5), _text_of(4 * n, 5)
    one_by_one = _count(monkeypatch, schema, "validate_block")
    lines = _count(monkeypatch, jsonfile, "line_column")
    loaded = parse(Path("m.json"), small)
    assert len(loaded.cases) == n and not loaded.invalid
    assert one_by_one[0] == lines[0] == 0
    assert all(len(b["machines"]) == 4 for b in loaded.cases.values())
    path = Path("m.json")
    ratio = _cpu_time(lambda: parse(path, large)) / _cpu_time(lambda: parse(path, small))
    assert ratio < 8, f"4x the cases took {ratio:.1f}x the CPU time"


def test_the_gate_reads_one_machines_view_as_a_block_of_one_machine(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A run reads its case as its machine sees it (get_view): the other machines'
    timing is validated with the file but never typed for the checks, so reading a block
    for the checks costs the same with 5 machines as with 1."""
    one = json.loads(_text_of(1, 1))["cases"]
    five = json.loads(_text_of(1, 5))["cases"]
    (b1,), (b5,) = one.values(), five.values()
    reads = _count(monkeypatch, block_module, "read")
    read_block(b1, block_model())
    alone = reads[0]
    mine = view(b5, "runner-3")
    assert not mine.new and "machines" not in mine.block
    read_block(mine.block, block_model())
    assert reads[0] - alone == alone, "one machine's view is read as a one-machine block"


@pytest.mark.timing
def test_show_over_five_machines_costs_about_their_bytes(tmp_path: Path) -> None:
    """``show`` reads the names of each block's machines (the headline of one machine with
    --machine): its read of a file grows with the file's bytes, not faster."""
    from pytest_accelperf.cli.baselines import SHOWN, SHOWN_MACHINES

    n = 200
    one, five = _text_of(n, 1).encode(), _text_of(n, 5).encode()
    SHOWN.read(one)
    for fields in (SHOWN, SHOWN_MACHINES):
        found = fields.read(five)
        assert found is not None and len(found) == n
        ratio = _cpu_time(lambda f=fields: f.read(five)) / _cpu_time(lambda: SHOWN.read(one))
        assert ratio < 2 * len(five) / len(one), (
            f"{fields.paths[-1]}: 5 machines took {ratio:.1f}x the CPU time of 1 for "
            f"{len(five) / len(one):.1f}x the bytes")
