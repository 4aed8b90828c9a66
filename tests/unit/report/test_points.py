"""The points of a history (report/points.py): the cache beside each file gives exactly the
points the lines give, and is not used where the file is not as it cached; program records
read as dicts (schema.ProgramRecord) are validated as Program validates them, and give the
change points that comparing Program models gave."""

from __future__ import annotations

import itertools
import json
import os
import random
from pathlib import Path
from typing import Any

import pytest
from pydantic import TypeAdapter, ValidationError

from pytest_accelperf.records.program import AMOUNTS, COUNTS
from pytest_accelperf.report.changes import exact_changes, find_changes
from pytest_accelperf.report.history import HistoryError
from pytest_accelperf.report.points import (
    Point,
    PointsCache,
    cache_path,
    load_points,
    points_of,
)
from pytest_accelperf.store.schema import HistoryNumbers, Program, ProgramRecord
from unit.report.test_changes import PROGRAM, line, noisy, write


def varied(n: int, *, seed: int = 0, cases: int = 3) -> list[dict[str, Any]]:
    """History lines of ``cases`` cases over ``n`` sessions, every field varied: program
    records changing, absent and null, fields missing, two fingerprints."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        for c in range(cases):
            program: dict[str, Any] | None = dict(PROGRAM, flops=rng.choice([2e9, 2e9, 3e9]),
                                                  graphs=rng.choice([None, 1]))
            if rng.random() < 0.2:
                program = None
            e = line(i, nodeid=f"m.py::t[c{c}]", sps=rng.choice([1000.0, 990.5, None]),
                     fingerprint=rng.choice(["f1", "f1", "f2"]), program=program,
                     memory=rng.choice([7.5e6, None]), loss=rng.choice([2.404, 2.5]))
            if rng.random() < 0.1:
                del e["program"]
            if rng.random() < 0.1:
                e["commit"] = None
            e["platform"] = rng.choice(["cpu-x8", None])
            out.append(e)
    return out


def as_text(lines: list[dict[str, Any]]) -> str:
    return "".join(json.dumps(e) + "\n" for e in lines)


@pytest.fixture
def validated(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """The lines validated from now on (HistoryNumbers' JSON validation, spied on)."""
    seen: list[bytes] = []
    real = HistoryNumbers.model_validate_json

    def spy(raw: bytes) -> HistoryNumbers:
        seen.append(raw)
        return real(raw)

    monkeypatch.setattr(HistoryNumbers, "model_validate_json", spy)
    return seen


def fresh(directory: Path) -> list[Point]:
    return load_points(directory, cache=False)


def same(a: list[Point], b: list[Point]) -> bool:
    """Equal, and of the same types (a float is not an int)."""
    return a == b and repr(a) == repr(b)


# -- the cache ---------------------------------------------------------------------------------
def test_the_cache_gives_the_points_the_lines_give(tmp_path: Path,
                                                   validated: list[bytes]) -> None:
    hist = write(tmp_path / "h", varied(30))
    expected = fresh(hist)
    assert len(expected) == 90 and len(validated) == 90
    assert not cache_path(hist / "cpu-x8.jsonl").exists()  # cache=False writes none
    assert same(load_points(hist), expected)  # validates every line, writes the cache
    assert cache_path(hist / "cpu-x8.jsonl").is_file() and len(validated) == 180
    assert same(load_points(hist), expected)  # from the cache: nothing validated
    assert len(validated) == 180


def test_lines_appended_are_the_only_ones_validated(tmp_path: Path,
                                                    validated: list[bytes]) -> None:
    lines = varied(40)
    hist = write(tmp_path / "h", lines[:60])
    load_points(hist)
    with (hist / "cpu-x8.jsonl").open("a") as f:
        f.write(as_text(lines[60:]))
    validated.clear()
    assert same(load_points(hist), fresh(hist))
    assert len(validated) == 60 + 120  # the 60 appended, then the fresh read's 120
    validated.clear()
    assert same(load_points(hist), fresh(hist)) and len(validated) == 120  # 0 + 120


def test_a_few_lines_appended_are_validated_again_rather_than_the_cache_rewritten(
        tmp_path: Path, validated: list[bytes]) -> None:
    """A session appended to a long history is under a tenth of its lines: the cache is
    not rewritten for it (0.15 s for 100,000 lines), its lines are validated on each read
    until the lines after the cache are more than a tenth of those in it."""
    lines = varied(40)  # 120 lines
    hist = write(tmp_path / "h", lines[:100])
    path = hist / "cpu-x8.jsonl"
    load_points(hist)
    written = cache_path(path).read_bytes()
    with path.open("a") as f:
        f.write(as_text(lines[100:105]))  # 5 lines: 5 % of the 100 cached
    for _ in range(2):
        validated.clear()
        assert same(load_points(hist), fresh(hist))
        assert len(validated) == 5 + 105  # the 5 after the cache, then the fresh read
        assert cache_path(path).read_bytes() == written
    with path.open("a") as f:
        f.write(as_text(lines[105:]))  # 20 after the cache: more than a tenth
    validated.clear()
    assert same(load_points(hist), fresh(hist)) and len(validated) == 20 + 120
    cache = PointsCache.model_validate_json(cache_path(path).read_bytes())
    assert (cache.lines, cache.covered) == (120, path.stat().st_size)
    validated.clear()
    assert same(load_points(hist), fresh(hist)) and len(validated) == 120  # 0 + 120


@pytest.mark.parametrize("edit", ["same size", "same size, old times", "truncated",
                                  "replaced", "shorter, then appended"])
def test_a_file_not_only_appended_to_is_read_again(tmp_path: Path, edit: str) -> None:
    lines = varied(20)
    hist = write(tmp_path / "h", lines)
    path = hist / "cpu-x8.jsonl"
    load_points(hist)
    text, st = path.read_text(), path.stat()
    if edit.startswith("same size"):  # a number edited in place: 1000.0 -> 1001.0
        assert "1000.0" in text
        path.write_text(text.replace("1000.0", "1001.0", 1))
        if edit.endswith("old times"):
            os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # the change time moves
    elif edit == "truncated":
        path.write_text(as_text(lines[:30]))
    elif edit == "replaced":
        other = write(tmp_path / "other", varied(20, seed=9))
        os.replace(other / "cpu-x8.jsonl", path)
    else:
        path.write_text(as_text(lines[3:30]) + as_text(varied(5, seed=5)))
    assert path.read_text() != text
    assert same(load_points(hist), fresh(hist))
    assert same(load_points(hist), fresh(hist))  # and the cache rewritten for it


def test_the_digest_guards_a_file_whose_stat_is_not_as_cached(tmp_path: Path) -> None:
    # the stat recorded no longer matching (any write), the first bytes are compared by
    # CRC-32: an edit within them is found even where the size is as it was
    hist = write(tmp_path / "h", varied(10))
    path = hist / "cpu-x8.jsonl"
    load_points(hist)
    path.write_bytes(path.read_bytes().replace(b"s0001", b"s0077", 1))
    points = load_points(hist)
    assert "s0077" in {p.session for p in points} and same(points, fresh(hist))


def test_a_last_line_without_its_newline_is_read_but_not_cached(
        tmp_path: Path, validated: list[bytes]) -> None:
    lines = varied(10)
    hist = write(tmp_path / "h", lines[:20])
    path = hist / "cpu-x8.jsonl"
    with path.open("a") as f:
        f.write(json.dumps(lines[20]))  # being appended: no newline yet
    assert same(load_points(hist), fresh(hist))
    cache = PointsCache.model_validate_json(cache_path(path).read_bytes())
    assert (cache.lines, len(cache.time), cache.covered) == (20, 20, path.read_text().rfind(
        "\n") + 1)
    validated.clear()
    assert same(load_points(hist), fresh(hist))
    assert len(validated) == 1 + 21  # only the last line, then the fresh read
    with path.open("a") as f:
        f.write("\n" + as_text(lines[21:]))
    assert same(load_points(hist), fresh(hist))


def test_an_invalid_line_after_the_cached_ones_is_named_by_its_line(tmp_path: Path) -> None:
    hist = write(tmp_path / "h", varied(5))
    path = hist / "cpu-x8.jsonl"
    with path.open("a") as f:
        f.write("\n  \n")  # blank lines count
    load_points(hist)
    with path.open("a") as f:
        f.write(json.dumps(line(7)) + "\n" + '{"nodeid": "a", "session": 5}\n')
    with pytest.raises(HistoryError, match=r"cpu-x8\.jsonl:19: not a history entry "
                                           r"\(session: Input should be a valid string"):
        load_points(hist)
    with pytest.raises(HistoryError, match=r"cpu-x8\.jsonl:19: "):
        fresh(hist)


@pytest.mark.parametrize("damage", [
    "not JSON", "another version", "an index past its table", "columns of two lengths",
    "a program record that is not one", "empty"])
def test_a_cache_that_is_not_valid_is_ignored_and_rewritten(
        tmp_path: Path, damage: str, validated: list[bytes]) -> None:
    hist = write(tmp_path / "h", varied(10))
    path = hist / "cpu-x8.jsonl"
    load_points(hist)
    where = cache_path(path)
    body = json.loads(where.read_text())
    if damage == "not JSON":
        where.write_text(where.read_text()[:-10])
    elif damage == "empty":
        where.write_text("")
    else:
        if damage == "another version":
            body["version"] = "0-0"
        elif damage == "an index past its table":
            body["nodeid"][4] = len(body["strings"])
        elif damage == "columns of two lengths":
            body["loss"].pop()
        else:
            body["programs"][0]["flops"] = -1
        where.write_text(json.dumps(body))
    validated.clear()
    assert same(load_points(hist), fresh(hist)) and len(validated) == 60
    validated.clear()
    assert same(load_points(hist), fresh(hist)) and len(validated) == 30  # rewritten


def test_a_cache_that_cannot_be_written_is_not(tmp_path: Path) -> None:
    hist = write(tmp_path / "h", varied(5))
    (hist / ".accelperf-cache").write_text("a file where the cache directory would be")
    assert same(load_points(hist), fresh(hist))
    assert sorted(p.name for p in hist.iterdir()) == [".accelperf-cache", "cpu-x8.jsonl"]


def test_the_cache_is_not_a_history_file(tmp_path: Path) -> None:
    hist = write(tmp_path / "h", varied(5))
    load_points(hist)
    assert [p.name for p in hist.glob("*.jsonl")] == ["cpu-x8.jsonl"]
    assert sorted(p.name for p in (hist / ".accelperf-cache").iterdir()) == [
        "cpu-x8.jsonl.points.json"]


# -- program records as dicts ------------------------------------------------------------------
def _schema(of: dict[str, Any]) -> dict[str, Any]:
    """A JSON Schema without what tells a model from a TypedDict: titles, descriptions, the
    unknown keys (kept by Program, skipped by ProgramRecord) and the names of definitions."""
    text = json.dumps(of).replace("CollectiveRecord", "Collective").replace(
        "ProgramRecord", "Program")

    def strip(x: Any) -> Any:
        if isinstance(x, dict):
            return {k: strip(v) for k, v in x.items()
                    if k not in ("title", "description", "additionalProperties", "default")}
        if isinstance(x, list):
            return [strip(v) for v in x]
        return x

    out = dict(strip(json.loads(text)))
    out["$defs"].pop("JsonValue", None)  # the type of Program's unknown keys
    return out


def test_a_program_record_has_the_fields_and_types_of_program() -> None:
    assert _schema(TypeAdapter(ProgramRecord).json_schema()) == _schema(
        Program.model_json_schema())
    assert list(ProgramRecord.__annotations__) == list(Program.model_fields)


def _records(n: int, seed: int) -> list[dict[str, Any]]:
    """Program records, valid and not: each field a valid value, absent, null or (one time
    in 15) one of the wrong values of its type."""
    rng = random.Random(seed)

    def pick(good: list[Any], bad: list[Any]) -> Any:
        return rng.choice(bad if rng.random() < 1 / 15 else good)

    number = ([0, 1, 2.5, 3e9, None], [-1, "1", True, float("nan")])
    count = ([0, 1, 7, None], [-1, 1.5, 2.0, "3", False])
    out = []
    for _ in range(n):
        r: dict[str, Any] = {}
        if rng.random() < 0.97:
            r["source"] = pick(["xla", "torch", "torch.compile", "deepspeed", "ddp"],
                               ["tpu", 1, None])
        for name in AMOUNTS:
            if rng.random() < 0.6:
                r[name] = pick(*number)
        for name in COUNTS:
            if rng.random() < 0.4:
                r[name] = pick(*count)
        if rng.random() < 0.5:
            r["collectives"] = pick(
                [None, {}, {"all-reduce": {"count": 4, "bytes": 1 << 20}},
                 {"all-reduce": {"count": rng.choice([0, 1, 7]), "bytes": 64},
                  "all-gather": {"count": 2, "bytes": 1 << 18}}],
                [[1], {"all-reduce": {"count": 4}}, {"x": 5},
                 {"all-reduce": {"count": pick(*count), "bytes": 64}}])
        for name, good, bad in (("global_flops", [True, False, None], [1]),
                                ("ops", [{"dot": 3}, {}], [{"dot": -1}, []]),
                                ("host_sync_sites", [{"a.py:3": 2}], [{"a": "b"}]),
                                ("break_reasons", [["x"], []], [[1], "x"]),
                                ("unknown key", [1, [1, {"a": None}], "x"], [])):
            if rng.random() < 0.1:
                r[name] = pick(good, bad or good)
        out.append(r)
    return out


def test_a_program_record_is_valid_where_program_is_with_the_same_first_error() -> None:
    adapter = TypeAdapter(ProgramRecord)
    valid = 0
    for r in _records(3000, seed=1):
        raw = json.dumps(r)
        try:
            model: Program | None = Program.model_validate_json(raw)
        except ValidationError as exc:
            model, first = None, exc.errors(include_url=False)[0]
        try:
            record = adapter.validate_json(raw)
        except ValidationError as exc:
            assert model is None, raw
            mine = exc.errors(include_url=False)[0]
            assert (mine["loc"], mine["msg"]) == (first["loc"], first["msg"]), raw
        else:
            assert model is not None, raw
            assert record == model.model_dump(exclude_unset=True, exclude={
                *(model.__pydantic_extra__ or {})}), raw
            valid += 1
    assert 300 < valid < 2700  # both kinds were tried


def _model_program_changes(models: list[Program | None]) -> list[tuple[str, int, float, float]]:
    """The program change points of one series as the finder found them at 005424e, on
    Program models: ``(metric, index of the first session after, before, after)``."""
    def values(p: Program) -> dict[str, float]:
        out = {label: float(getattr(p, name)) for name, (label, _) in AMOUNTS.items()
               if getattr(p, name) is not None}
        for kind, c in (p.collectives or {}).items():
            out[f"{kind} count"], out[f"{kind} bytes"] = float(c.count), float(c.bytes)
        out.update({label: float(getattr(p, name)) for name, label in COUNTS.items()
                    if getattr(p, name) is not None})
        return out

    present = [(i, m) for i, m in enumerate(models) if m is not None]
    if not any(a != b for (_, a), (_, b) in itertools.pairwise(present)):
        return []
    kinds = {k for _, m in present for k in m.collectives or ()}
    tables = []
    for _, m in present:
        table = values(m)
        if m.collectives is not None:
            for kind in kinds:
                table.setdefault(f"{kind} count", 0.0)
                table.setdefault(f"{kind} bytes", 0.0)
        tables.append(table)
    out = []
    for name in {k for t in tables for k in t}:
        column = [t.get(name) for t in tables]
        for at in exact_changes(column):
            before = next(v for v in reversed(column[:at]) if v is not None)
            out.append((name, present[at][0], before, column[at]))
    return sorted(out)


A, B = {**PROGRAM, "flops": 1e9}, {**PROGRAM, "flops": 2e9, "graphs": 2}
PATTERNS = {  # series of program records: 0 absent, 1 A, 2 B
    "alternating": [1, 2] * 8, "one other in the middle": [1] * 7 + [2] + [1] * 7,
    "absent between two": [1, 1, 0, 0, 2, 2, 0, 1], "the first absent": [0, 2, 2, 1],
    "one record": [1], "none": [0, 0, 0]}


@pytest.mark.parametrize("seed", [*range(40), *PATTERNS])
def test_program_change_points_are_those_that_comparing_models_gave(seed: int | str) -> None:
    if isinstance(seed, str):
        series: list[dict[str, Any] | None] = [[None, A, B][k] for k in PATTERNS[seed]]
    else:
        rng = random.Random(seed)
        pool = [r for r in _records(400, seed=100 + seed) if _valid(r)][:6]
        pool += [dict(pool[0]), {**pool[0], "graphs": None}, {**pool[0], "unknown key": 3}]
        series = [rng.choice(pool) if rng.random() < 0.9 else None for _ in range(30)]
        if seed % 2:  # the same records, mostly runs of one
            series = sorted(series, key=lambda s: json.dumps(s, sort_keys=True))
    series = [None if s is None else json.loads(json.dumps(s)) for s in series]
    lines = [line(i, sps=None, memory=None, loss=None) for i in range(len(series))]
    for e, s in zip(lines, series, strict=True):
        e["program"] = s
    points = points_of(lines)
    assert [p.program for p in points] == [
        None if s is None else TypeAdapter(ProgramRecord).validate_python(s) for s in series]
    models = [None if p.program is None else Program.model_validate(p.program)
              for p in points]
    found = sorted((c.metric, int(c.first_after.session[1:]), c.before, c.after)
                   for c in find_changes(points))
    assert found == _model_program_changes(models)


def _valid(r: dict[str, Any]) -> bool:
    try:
        Program.model_validate_json(json.dumps(r))
    except ValidationError:
        return False
    return True


def test_equal_records_read_from_the_cache_are_one_object(tmp_path: Path) -> None:
    hist = write(tmp_path / "h", [line(i, sps=v) for i, v in enumerate(noisy(20, seed=1))])
    load_points(hist)
    cached = load_points(hist)
    assert len({id(p.program) for p in cached}) == 1
    assert cached == fresh(hist) and find_changes(cached) == find_changes(fresh(hist))
