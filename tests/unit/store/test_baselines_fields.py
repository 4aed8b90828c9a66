"""``show`` and ``diff`` read the fields they show (store/fields.py): validated as the
schema validates them, the file around them checked as before; whole blocks are validated
by ``accelperf baselines check``, the gate and every writer, which still refuse what they
refused."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pytest_accelperf import cli
from pytest_accelperf.cli import baselines as command
from pytest_accelperf.cli.baselines import HEADLINE
from pytest_accelperf.store import schema
from pytest_accelperf.store.baselines import (
    BaselineError,
    BaselineFile,
    BaselineStore,
    InvalidBlockError,
    parse,
    read,
)
from pytest_accelperf.store.fields import Fields
from unit.store.test_baselines_scale import TEMPLATE

PLATFORM = "cpu-x2"
MODULE = "suites/test_m"


def _text(cases: dict[str, Any], **header: Any) -> str:
    data = {"schema_version": 1, "platform": PLATFORM, "cases": cases, **header}
    return json.dumps(data, indent=2, sort_keys=True)


def _cases(n: int = 3) -> dict[str, Any]:
    return {f"test_x[b{i}]": {**copy.deepcopy(TEMPLATE), "samples_per_second": 100.0 + i}
            for i in range(n)}


def _store(tmp_path: Path, text: str) -> Path:
    path = tmp_path / PLATFORM / f"{MODULE}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = cli.main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def _exact(text: str, fields: Fields) -> dict[str, Any] | BaselineError:
    """What the exact read gives for ``fields``: each valid block's fields, or the error."""
    try:
        loaded = parse(Path("m.json"), text, fields)
    except BaselineError as exc:
        return exc
    if loaded.invalid:
        return BaselineError("invalid")
    return {key: _only(block, fields) for key, block in loaded.cases.items()}


def _only(block: Any, fields: Fields) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for path in fields.paths:
        head, _, rest = path.partition(".")
        if head not in block:
            continue
        if not rest:
            out[head] = block[head]
        elif block[head] is None:
            out[head] = None
        elif rest in block[head]:
            out.setdefault(head, {})[rest] = block[head][rest]
        else:
            out.setdefault(head, {})
    return out


def test_the_fields_are_typed_as_the_block_declares_them() -> None:
    fields = Fields(("outcome", "step_time.median", "memory.peak"))
    good = {"outcome": "ok", "step_time": {"median": 0.1, "samples": "ignored"},
            "environment": "not read"}
    assert fields.invalid({"a": good}) == {}
    for bad, field in (({"outcome": "nan"}, "outcome"),
                       ({"outcome": "ok", "step_time": {"median": -1.0}}, "step_time.median"),
                       ({"outcome": "ok", "step_time": {"median": "0.1"}}, "step_time.median"),
                       ({"outcome": "ok", "step_time": {}}, "step_time.median"),
                       ({"outcome": "ok", "memory": {"peak": float("nan")}}, "memory.peak"),
                       ({"outcome": "ok", "memory": [1]}, "memory"),
                       ({"step_time": None}, "outcome")):
        found = fields.invalid({"a": good, "b": bad})
        assert list(found) == ["b"], bad
        lines = schema.error_lines(found["b"])
        assert ".".join(map(str, lines[0][0])) == field, (bad, lines)
    with pytest.raises(ValueError, match="no field 'nope'"):
        Fields(("step_time.nope",))
    with pytest.raises(ValueError, match="named whole and in part"):
        Fields(("loss", "loss.final"))


def test_a_clean_file_is_read_in_one_call_as_the_exact_read_reads_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = _text(_cases(20))
    path = _store(tmp_path, text)
    whole = []
    real = schema.invalid_blocks
    monkeypatch.setattr(schema, "invalid_blocks", lambda *a, **k: whole.append(1) or real(*a, **k))
    fast = read(path, PLATFORM, HEADLINE)
    assert not whole, "no whole-block validation for the fields of show"
    assert fast.fields is HEADLINE and not fast.invalid
    assert fast.cases == _exact(text, HEADLINE)
    assert fast.cases["test_x[b3]"]["samples_per_second"] == 103.0
    with pytest.raises(ValueError, match="cannot be written back"):
        fast.to_text()
    assert isinstance(read(path, PLATFORM).to_text(), str)  # a whole read still writes


#: Files that parse and validate as the fast read would not know: each is read the exact
#: way, which says what it says today.
SUSPECT = [
    ('{"schema_version": 1, "cases": {"a": %s, "a": %s}}', "duplicate key 'a' in cases"),
    ('{"schema_version": 1, "cases": {"a": %s}, "cases": {"b": %s}}', "duplicate key 'cases'"),
    ('{"schema_version": 1, "schema_version": 1, "cases": {"a": %s, "b": %s}}',
     "duplicate key 'schema_version'"),
    ('{"schema_version": true, "cases": {"a": %s, "b": %s}}', "schema_version is True"),
    ('{"schema_version": 1.0, "cases": {"a": %s, "b": %s}}', "schema_version is 1.0"),
    ('{"schema_version": 1, "platform": 3, "cases": {"a": %s, "b": %s}}', "not a baseline"),
    ('{"schema_version": 1, "x": NaN, "cases": {"a": %s, "b": %s}}', "not a baseline"),
    ('{"schema_version": 1, "x": 1, "x": 2, "cases": {"a": %s, "b": %s}}',
     "duplicate key 'x'"),
    ('\ufeff{"schema_version": 1, "cases": {"a": %s, "b": %s}}', "corrupt baseline file"),
    ('{"schema_version": 1, "cases": {"a": %s, "b": %s},}', "corrupt baseline file"),
    ('{"schema_version": 1, "cases": {"a": %s, "b": %s}} x', "corrupt baseline file"),
]


@pytest.mark.parametrize(("layout", "error"), SUSPECT)
def test_what_the_fast_read_does_not_know_is_read_the_exact_way(
        layout: str, error: str) -> None:
    block = json.dumps(TEMPLATE)
    text = layout % (block, block)
    assert HEADLINE.read(text.encode()) is None
    with pytest.raises(BaselineError, match=re.escape(error)):
        parse(Path("m.json"), text, HEADLINE)


def test_a_value_not_shown_is_not_validated_by_show_but_is_by_check_and_the_gate(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A block whose program is not an object: ``show`` (which does not read it) lists
    it; ``check`` and a run reading it for judging refuse it, one line naming the file,
    the line, the case and the field. (``show`` reads the environment's host CPU, to name
    the machine of a block's timing: an environment that is not an object is refused by
    ``show`` too.)"""
    cases = _cases()
    cases["test_x[b1]"]["program"] = "cpu"
    path = _store(tmp_path, _text(cases))
    root = str(tmp_path)
    status, out, _ = _run(capsys, "baselines", "show", "--baselines", root)
    assert status == 0 and out.splitlines()[-1] == f"3 case(s) in {root}"
    line = next(i for i, t in enumerate(path.read_text().splitlines(), 1)
                if '"program": "cpu"' in t)
    message = (f"{path}:{line}: case 'test_x[b1]': invalid baseline block: program: "
               f"should be a JSON object (found 'cpu'). Fix the block, or re-record the case "
               f"with --accelperf-update (which replaces an invalid block and keeps the "
               f"file's other cases)")
    status, out, err = _run(capsys, "baselines", "check", "--baselines", root)
    assert (status, out, err.splitlines()) == (1, "", [f"accelperf: error: {message}"])
    store = BaselineStore(tmp_path, PLATFORM)
    with pytest.raises(InvalidBlockError) as exc:
        store.get(f"{MODULE}.py::test_x[b1]")
    assert str(exc.value) == message
    assert store.get(f"{MODULE}.py::test_x[b0]") is not None
    # a field show reads is refused by show too, as before
    cases["test_x[b2]"]["step_time"]["median"] = -1.0
    _store(tmp_path, _text(cases))
    status, _, err = _run(capsys, "baselines", "show", "--baselines", root)
    assert status == 1
    assert re.fullmatch(r"accelperf: error: \S+:\d+: case 'test_x\[b2\]': invalid baseline "
                        r"block: step_time.median: Input should be greater than 0 \(found "
                        r"-1.0\)\. Fix the block.*", err.strip()), err
    status, out, _ = _run(capsys, "baselines", "check", "--baselines", root)
    assert status == 1


def test_check_passes_a_valid_store(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _store(tmp_path, _text(_cases(4)))
    status, out, _ = _run(capsys, "baselines", "check", "--baselines", str(tmp_path))
    assert (status, out) == (0, f"4 case(s) in 1 file(s) valid in {tmp_path}\n")


def test_show_over_the_fields_is_what_show_over_whole_blocks_was(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    cases = _cases(5)
    cases["test_x[b4]"].pop("loss")
    cases["test_x[b3]"]["step_time"] = None
    _store(tmp_path, _text(cases))
    argv = ("baselines", "show", "--baselines", str(tmp_path))
    fast = _run(capsys, *argv)
    monkeypatch.setattr(command, "HEADLINE", None)  # whole blocks, as before
    assert _run(capsys, *argv) == fast


_BLOCK = {"outcome": "ok", "samples_per_second": 10.5, "recorded_at": "2026-11-01T00:00:00",
          "step_time": {"median": 0.25, "samples": [0.25]}, "loss": {"final": 1.5},
          "memory": {"peak": 3, "per_device": {"cpu:0": 3}}, "environment": {"a": "b"}}
_SMALL = _text({"test_x[a]": _BLOCK, "test_x[b]": {**_BLOCK, "compile_time": 2}})


@st.composite
def _damaged(draw: st.DrawFn) -> str:
    text = _SMALL
    for _ in range(draw(st.integers(1, 3))):
        at = draw(st.integers(0, len(text)))
        op = draw(st.sampled_from(["insert", "delete", "replace"]))
        piece = draw(st.sampled_from(['"', ",", ":", "{", "}", "]", "1", "-1", "NaN", "1e999",
                                      "true", "null", '"a"', '"outcome": "ok", ',
                                      '"test_x[a]": {}, ', "\\", "\\u003a", "\x00", " ",
                                      "\ud800", "\ufeff"]))
        end = at + draw(st.integers(1, 6))
        text = (text[:at] + piece + text[at:] if op == "insert" else
                text[:at] + text[end:] if op == "delete" else text[:at] + piece + text[end:])
    return text


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=_damaged())
def test_the_fast_read_accepts_only_what_the_exact_read_accepts_and_reads_it_alike(
        text: str) -> None:
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError:
        return  # a lone surrogate cannot be in a file's bytes
    fast = HEADLINE.read(data)
    if fast is None:
        return
    exact = _exact(text, HEADLINE)
    if isinstance(exact, BaselineError) and re.search(r"duplicate key '[^']*' in cases\.",
                                                        str(exact)):
        return  # a key repeated inside a block: left to the exact read (fields.py, docs)
    assert fast == exact


def test_a_partial_read_is_never_written_by_the_store(tmp_path: Path) -> None:
    bf = BaselineFile(tmp_path / "m.json", PLATFORM, {"a": {"outcome": "ok"}}, fields=HEADLINE)
    with pytest.raises(ValueError, match="cannot be written back"):
        bf.to_text()
