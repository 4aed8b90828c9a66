"""Baselines validated by one schema: every invalid block is an error that names the file,
the line, the case, the field and the fix; never a traceback, never a gate switched off.

The property test mutates valid blocks at random and asserts that each mutation yields a
verdict from every check, or that clear error.
"""

from __future__ import annotations

import copy
import json
import math
import re
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from conftest import Suite
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pytest_accelperf.checks import run_checks
from pytest_accelperf.checks.outcome import FAILED_OUTCOMES
from pytest_accelperf.checks.summary import summarize, with_added_session
from pytest_accelperf.cli import main
from pytest_accelperf.cli.baselines import _fmt, _headline
from pytest_accelperf.collect.cases import Case
from pytest_accelperf.provision.describe import differences
from pytest_accelperf.records.run import OUTCOMES, Run
from pytest_accelperf.records.verdict import Tolerances
from pytest_accelperf.report.loading import ReportFileError, load_report
from pytest_accelperf.store.baselines import (
    BaselineError,
    BaselineStore,
    InvalidBlockError,
    check_block,
    parse,
    read,
)
from pytest_accelperf.store.schema import RECORDED_OUTCOMES, json_schema, validate_block
from unit.report.test_reports import make_run

REPO = Path(__file__).parents[3]
NODEID = "suites/test_m.py::test_sweep[jax-nomesh-b64]"
KEY = "test_sweep[jax-nomesh-b64]"


def _run(**overrides: Any) -> Run:
    run = make_run(Case(backend="jax", batch=64), step_time=0.01)
    return replace(run, **{
        "params_fingerprint": {"w": {"shape": [4, 2], "dtype": "float32", "rms": 0.5,
                                     "sample": [0.1, -0.2, 0.3, 0.4]},
                               "b": {"shape": [2], "dtype": "float32", "rms": 0.01,
                                     "sample": [0.01, -0.01]}},
        "max_batch": {"value": 48, "capacity_bytes": 1 << 30, "multiple_of": 2,
                      "limit": 4096, "probes": [[64, False, 2 << 30], [48, True, 1 << 29]]},
        **overrides})


def _with_sessions(block: dict[str, Any]) -> dict[str, Any]:
    block = copy.deepcopy(block)
    block["step_time"]["sessions"] = [{"median": 0.0101, "probe_median": 0.002},
                                      {"median": 0.0099, "probe_median": 0.002},
                                      {"median": 0.0100, "probe_median": 0.00201}]
    return block


NOW = _run()
OOM = _run(outcome="oom", message="out of memory", step_times=[], losses=[], loss_steps=[],
           probe_times=[], oom={"required_bytes": 3 << 30, "capacity_bytes": 1 << 30})
VALID_BLOCKS = [summarize(NOW).to_json(), _with_sessions(summarize(NOW).to_json()),
                summarize(OOM).to_json()]


def _file(block: Any, *, other: Any = None) -> str:
    cases = {KEY: block, **({"test_sweep[other]": other} if other is not None else {})}
    return json.dumps({"schema_version": 1, "platform": "cpu-x2", "cases": cases}, indent=2,
                      sort_keys=True)


def _store(tmp_path: Path, text: str | bytes) -> tuple[BaselineStore, Path]:
    path = tmp_path / "cpu-x2" / "suites" / "test_m.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return BaselineStore(tmp_path, "cpu-x2"), path


def test_recorded_outcomes_are_the_run_outcomes_less_the_failures() -> None:
    assert set(RECORDED_OUTCOMES) == set(OUTCOMES) - set(FAILED_OUTCOMES)


def test_blocks_the_plugin_writes_are_valid() -> None:
    for block in VALID_BLOCKS:
        validate_block(block)
        assert check_block(NODEID, block) == json.loads(json.dumps(block))
    # no step times (an ingested log without them): no step_time, rather than an empty one
    block = summarize(_run(step_times=[], probe_times=[])).to_json()
    assert "step_time" not in block
    validate_block(block)


def test_the_checked_in_store_loads_and_shows(capsys: pytest.CaptureFixture[str]) -> None:
    files = sorted((REPO / "baselines").rglob("*.json"))
    assert files
    for path in files:
        loaded = read(path)
        assert loaded.cases and not loaded.invalid, path
    assert main(["baselines", "show", "--baselines", str(REPO / "baselines")]) == 0
    assert re.search(r"\n\d+ case\(s\) in ", capsys.readouterr().out)


def _set(path: tuple[str | int, ...], value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(block: dict[str, Any]) -> None:
        target: Any = block
        for part in path[:-1]:
            target = target[part]
        target[path[-1]] = value
    return edit


#: (edit of a valid block, field named in the error, text of the error, text on the line the
#: error names). Each of these crashed every run with a traceback, or switched a gate off
#: with exit status 0.
INVALID = [
    (_set(("step_time", "samples"), "fast"), "step_time.samples", "valid list", '"samples"'),
    (_set(("loss",), [1.0, 2.0]), "loss", "JSON object", '"loss"'),
    (_set(("environment",), "cpu"), "environment", "JSON object", '"environment"'),
    (_set(("memory", "per_device"), [1, 2]), "memory.per_device", "JSON object",
     '"per_device"'),
    (_set(("loss", "checkpoints"), [[1.0]]), "loss.checkpoints[0][1]", "missing", "["),
    (_set(("loss", "checkpoints"), 3), "loss.checkpoints", "valid list", '"checkpoints"'),
    (_set(("memory", "per_device", "cpu:0"), math.nan), "memory.per_device.cpu:0",
     "finite number", '"cpu:0": NaN'),
    (_set(("step_time", "samples", 2), -0.01), "step_time.samples[2]", "greater than 0",
     "-0.01"),
    (_set(("step_time", "samples", 0), math.nan), "step_time.samples[0]", "finite number",
     "NaN"),
    (_set(("step_time", "samples"), []), "step_time.samples", "at least 1 item",
     '"samples": []'),
    (_set(("loss", "checkpoints", 3, 1), math.nan), "loss.checkpoints[3][1]",
     "finite number", "NaN"),
    (_set(("outcome",), "banana"), "outcome", "'ok' or 'oom'", '"banana"'),
    (_set(("outcome",), "timeout"), "outcome", "'ok' or 'oom'", '"timeout"'),
    (_set(("samples_per_step",), "64"), "samples_per_step", "valid integer", '"64"'),
    (_set(("numerics", "w", "sample", 1), math.inf), "numerics.w.sample[1]", "finite number",
     "Infinity"),
    (_set(("max_batch", "value"), 4.5), "max_batch.value", "valid integer", "4.5"),
    (_set(("probe", "samples", 0), 0), "probe.samples[0]", "greater than 0", "0,"),
]


@pytest.mark.parametrize(("edit", "field", "why", "on_line"), INVALID,
                         ids=[f"{f}:{w}" for _, f, w, _ in INVALID])
def test_invalid_block_is_an_error_naming_file_line_case_field_and_fix(
        tmp_path: Path, edit: Callable[[dict[str, Any]], None], field: str, why: str,
        on_line: str) -> None:
    block = copy.deepcopy(VALID_BLOCKS[0])
    edit(block)
    text = _file(block)
    store, path = _store(tmp_path, text)
    with pytest.raises(InvalidBlockError) as exc:
        store.get(NODEID)
    message = str(exc.value)
    match = re.match(rf"{re.escape(str(path))}:(\d+): case '{re.escape(KEY)}': invalid "
                     rf"baseline block: {re.escape(field)}: [^;]*{re.escape(why)}", message)
    assert match, message
    assert "re-record the case with --accelperf-update" in message
    line = text.splitlines()[int(match.group(1)) - 1]
    assert on_line in line, (line, field)  # the line of the field (of a list's element)
    assert exc.value.replaceable
    # the same block is refused by the write path (one implementation)
    with pytest.raises(BaselineError, match=rf"{re.escape(NODEID)}: not stored as a baseline: "
                                            rf"invalid block: {re.escape(field)}: "):
        check_block(NODEID, block)


def test_block_that_is_not_an_object(tmp_path: Path) -> None:
    store, path = _store(tmp_path, _file([1, 2]))
    with pytest.raises(InvalidBlockError, match=rf"{re.escape(str(path))}:\d+: case "
                                                rf"'{re.escape(KEY)}': invalid baseline block: "
                                                rf"should be a JSON object"):
        store.get(NODEID)


def test_duplicate_case_keys_are_a_parse_error_at_the_second(tmp_path: Path) -> None:
    block = json.dumps(VALID_BLOCKS[0])
    text = ('{"schema_version": 1, "platform": "cpu-x2", "cases": {\n'
            f'  "{KEY}": {block},\n'
            f'  "{KEY}": {block}\n'
            "}}\n")
    store, path = _store(tmp_path, text)
    with pytest.raises(BaselineError) as exc:
        store.get(NODEID)
    assert not exc.value.replaceable  # the file is ambiguous: an update must not rewrite it
    assert str(exc.value).startswith(f"{path}:3:3: corrupt baseline file: duplicate key "
                                     f"'{KEY}' in cases")
    with pytest.raises(BaselineError, match="duplicate key"):
        store.write({NODEID: VALID_BLOCKS[0]})
    assert path.read_text() == text


def test_duplicate_key_inside_a_block_names_its_path(tmp_path: Path) -> None:
    text = _file(VALID_BLOCKS[0]).replace('"median": 0.0', '"median": 1.0, "median": 0.0', 1)
    store, path = _store(tmp_path, text)
    with pytest.raises(BaselineError, match=rf"{re.escape(str(path))}:\d+:\d+: corrupt "
                                            rf"baseline file: duplicate key 'median' in "
                                            rf"cases.{re.escape(KEY)}.step_time"):
        store.get(NODEID)


def test_a_directory_or_bytes_that_are_not_utf8_are_errors(tmp_path: Path) -> None:
    store, path = _store(tmp_path, b'{"schema_version": 1,\n "cases": {"\xff": {}}}')
    with pytest.raises(BaselineError, match=rf"{re.escape(str(path))}:2: corrupt baseline "
                                            rf"file: not UTF-8 \(byte 0xff at offset 34\)"):
        store.get(NODEID)
    path.unlink()
    path.mkdir()
    fresh = BaselineStore(tmp_path, "cpu-x2")
    with pytest.raises(BaselineError, match="a directory where the baseline file should be"):
        fresh.get(NODEID)
    with pytest.raises(BaselineError, match="a directory where the baseline file should be"):
        fresh.write({NODEID: VALID_BLOCKS[0]})
    assert path.is_dir()


def test_update_replaces_an_invalid_block_and_keeps_the_rest(tmp_path: Path) -> None:
    broken = copy.deepcopy(VALID_BLOCKS[0])
    broken["step_time"]["samples"] = [math.nan, 0.01]
    other = copy.deepcopy(VALID_BLOCKS[0])
    other["outcome"] = "banana"  # another invalid block: not ours to replace
    store, path = _store(tmp_path, _file(broken, other=other))
    with pytest.raises(InvalidBlockError):
        store.get(NODEID)
    store.write({NODEID: VALID_BLOCKS[1]})
    data = json.loads(path.read_text())
    assert data["cases"][KEY] == json.loads(json.dumps(VALID_BLOCKS[1]))
    assert data["cases"]["test_sweep[other]"] == other  # kept exactly as it was
    stored = BaselineStore(tmp_path, "cpu-x2").get(NODEID)
    assert stored is not None and stored.to_json() == data["cases"][KEY]


def test_unknown_keys_are_kept(tmp_path: Path) -> None:
    block = copy.deepcopy(VALID_BLOCKS[0])
    block["from_the_future"] = {"x": [1, "two"]}
    block["step_time"]["p90"] = 0.02
    text = json.loads(_file(block))
    text["written_by"] = "pytest-accelperf 9.0"
    store, path = _store(tmp_path, json.dumps(text))
    stored = store.get(NODEID)
    assert stored is not None and stored.to_json() == block  # the unknown keys too
    store.write({"suites/test_m.py::test_sweep[new]": VALID_BLOCKS[2]})
    data = json.loads(path.read_text())
    assert data["cases"][KEY] == block and data["written_by"] == "pytest-accelperf 9.0"


def test_header_errors_are_parse_errors(tmp_path: Path) -> None:
    text = '{\n  "schema_version": 1,\n  "platform": "cpu-x2",\n  "cases": [1]\n}\n'
    store, path = _store(tmp_path, text)
    with pytest.raises(BaselineError, match=rf"{re.escape(str(path))}:4: not a baseline file: "
                                            rf"cases: should be a JSON object") as exc:
        store.get(NODEID)
    assert not exc.value.replaceable
    with pytest.raises(BaselineError):
        store.write({NODEID: VALID_BLOCKS[0]})
    assert path.read_text() == text
    _store(tmp_path, text.replace('"schema_version": 1', '"schema_version": true'))
    with pytest.raises(BaselineError, match=r":2: schema_version is True"):
        BaselineStore(tmp_path, "cpu-x2").get(NODEID)


def test_json_schema_is_emitted(capsys: pytest.CaptureFixture[str]) -> None:
    schema = json_schema("baseline")
    assert {"outcome", "environment", "step_time", "loss", "memory", "numerics"} <= set(
        schema["properties"])
    assert main(["schema", "report"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert "cases" in report["properties"]


# -- an invalid block through pytest --------------------------------------------------------
SMALL = '''
from tinytask import make_task
from pytest_accelperf import cases

@cases(backend="jax", batch=[16, 32], steps=4, warmup=1)
def test_small(accelperf):
    accelperf.train(make_task(accelperf.case))
'''


@pytest.mark.slow
def test_run_fails_on_an_invalid_block_and_update_repairs_it(suite: Suite) -> None:
    suite.write(SMALL)
    suite.run("--accelperf-update").assert_outcomes(passed=2)
    data = suite.load()
    data["cases"]["test_small[jax-nomesh-b16]"]["step_time"]["samples"] = "fast"
    data["cases"]["test_small[jax-nomesh-b32]"]["loss"]["checkpoints"][0][1] = math.nan
    suite.baseline_path().write_text(json.dumps(data, indent=2, sort_keys=True))
    result = suite.run()
    result.assert_outcomes(failed=2)
    out = result.stdout.str()
    path = suite.baseline_path()
    line = next(i for i, text in enumerate(path.read_text().splitlines(), 1)
                if '"samples": "fast"' in text)
    assert (f"{path}:{line}: case 'test_small[jax-nomesh-b16]': invalid baseline block: "
            f"step_time.samples: Input should be a valid list (found 'fast'). Fix the block, "
            f"or re-record the case with --accelperf-update") in out
    assert ("case 'test_small[jax-nomesh-b32]': invalid baseline block: "
            "loss.checkpoints[0][1]: Input should be a finite number (found nan)") in out
    assert "Traceback" not in out and "another exception occurred" not in out
    # the update replaces the invalid blocks of a file that parses
    suite.run("--accelperf-update", "-k", "b16").assert_outcomes(passed=1)
    repaired = suite.load()["cases"]
    assert isinstance(repaired["test_small[jax-nomesh-b16]"]["step_time"]["samples"], list)
    assert "NaN" in suite.baseline_path().read_text()  # the other one, untouched
    suite.run("--accelperf-update").assert_outcomes(passed=2)
    suite.run().assert_outcomes(passed=2)


# -- the property: a verdict or that clear error, never another exception --------------------
_SCALARS = (st.none() | st.booleans() | st.integers(-(10 ** 20), 10 ** 20)
            | st.floats(allow_nan=True, allow_infinity=True)
            | st.sampled_from([0, -1, 0.0, -0.0, 1e-300, 1e300, 2 ** 63, "", "ok", "oom"])
            | st.text(max_size=4))
_JSON = st.recursive(_SCALARS, lambda inner: st.lists(inner, max_size=3)
                     | st.dictionaries(st.text(max_size=4), inner, max_size=3), max_leaves=6)


def _paths(node: Any, prefix: tuple[str | int, ...] = ()) -> list[tuple[str | int, ...]]:
    out = [prefix]
    if isinstance(node, dict):
        for key, value in node.items():
            out.extend(_paths(value, (*prefix, key)))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            out.extend(_paths(value, (*prefix, i)))
    return out


@st.composite
def _mutated(draw: st.DrawFn) -> Any:
    block: Any = copy.deepcopy(draw(st.sampled_from(VALID_BLOCKS)))
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(_paths(block)))
        if not path:
            block = draw(_JSON)
            continue
        parent: Any = block
        for part in path[:-1]:
            parent = parent[part]
        op = draw(st.sampled_from(["replace", "replace", "delete", "add"]))
        if op == "delete":
            del parent[path[-1]]
        elif op == "add" and isinstance(parent, dict):
            parent[draw(st.text(max_size=8))] = draw(_JSON)
        elif op == "add":
            parent.insert(draw(st.integers(0, len(parent))), draw(_JSON))
        else:
            parent[path[-1]] = draw(_JSON)
    return block


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(block=_mutated())
def test_a_mutated_block_gives_a_verdict_or_a_clear_error(block: Any) -> None:
    path = Path("baselines/cpu-x2/suites/test_m.json")
    loaded = parse(path, _file(block))
    if KEY in loaded.invalid:
        message = loaded.invalid[KEY].message
        assert re.match(rf"{re.escape(str(path))}:\d+: case '{re.escape(KEY)}': invalid "
                        rf"baseline block: .+\. Fix the block, or re-record the case with "
                        rf"--accelperf-update", message, re.S), message
        with pytest.raises(BaselineError, match="not stored as a baseline: invalid block"):
            check_block(NODEID, block)
        return
    baseline = loaded.cases[KEY]
    assert check_block(NODEID, baseline) == baseline  # what reads back also writes
    for now in (NOW, OOM):
        diffs = differences(now.environment.to_json(), baseline["environment"], "jax")
        checks = run_checks(now, summarize(now), baseline, Tolerances(), comparable=not diffs)
        assert checks and all(c.verdict.value for c in checks)
        try:
            with_added_session(baseline, now, diffs)
        except ValueError as exc:
            assert "--accelperf-update" in str(exc) or "environment" in str(exc)
    for _, value, unit in _headline(baseline):  # accelperf baselines show / diff
        _fmt(value, unit)


# -- the JSON report -----------------------------------------------------------------------
def _report(tmp_path: Path, edit: Callable[[dict[str, Any]], None]) -> Path:
    from unit.report.test_reports import synthetic_report
    data = json.loads(json.dumps(synthetic_report().to_json(1), default=str))
    edit(data)
    path = tmp_path / "r.json"
    path.write_text(json.dumps(data, indent=2))
    return path


@pytest.mark.parametrize(("edit", "message"), [
    (_set(("cases", 2, "checks", 0, "verdict"), "banana"),
     r"case suites/test_m.py::test_sweep\[.*\]: checks\[0\].verdict: Input should be "
     r"'pass', .* \(found 'banana'\)"),
    (_set(("cases", 0, "run", "step_times"), "fast"),
     r"case suites/test_m.py::test_sweep\[.*\]: run.step_times: Input should be a valid "
     r"list \(found 'fast'\)"),
    (_set(("cases", 1, "platform"), 8), r"case .*: platform: Input should be a valid string"),
    (_set(("update",), "yes"), r"update: Input should be a valid boolean"),
])
def test_report_fields_are_validated(tmp_path: Path, edit: Callable[[dict[str, Any]], None],
                                     message: str) -> None:
    path = _report(tmp_path, edit)
    with pytest.raises(ReportFileError, match=rf"{re.escape(str(path))}:\d+: {message}"):
        load_report(path)


def test_report_with_a_duplicate_key_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    path.write_text('{"schema_version": 1,\n "cases": [], "cases": []}')
    with pytest.raises(ReportFileError, match=r"r.json:2:15: corrupt JSON report \(duplicate "
                                              r"key 'cases'"):
        load_report(path)
