"""The store's one JSON read (store/jsonfile.loads) parses with orjson and gives exactly what
the standard parser gives, a repeated key still refused at its line; what orjson reads
otherwise (NaN, a lone surrogate, an integer beyond 64 bits, a colon written as an escape)
is read by the standard parser."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pytest_accelperf.store import jsonfile
from pytest_accelperf.store.baselines import BaselineError, read

ROOT = Path(__file__).resolve().parents[3]


def _standard(text: str) -> object:
    """What the read gave before orjson: the standard parser, a repeated key an error."""
    try:
        return json.loads(text, object_pairs_hook=jsonfile._pairs)
    except (json.JSONDecodeError, jsonfile._DuplicateKey) as exc:
        return type(exc)


def _read(text: str) -> object:
    try:
        return jsonfile.loads(text)
    except jsonfile.JsonFileError:
        return jsonfile.JsonFileError


def _same(got: object, want: object) -> None:
    """Equal, of the same types throughout (1 is not 1.0, -0.0 is not 0.0, nan is nan)."""
    if want is jsonfile._DuplicateKey or want is json.JSONDecodeError:
        assert got is jsonfile.JsonFileError
        return
    assert repr(got) == repr(want)


# -- JSON texts with repeated keys anywhere, keys and strings holding colons and escapes ----
_SCALARS = st.one_of(
    st.none(), st.booleans(),
    st.integers(-2**70, 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.00012345678901234568, 1e-7, 1e300, -0.0, 2**64, -2**63 - 1]),
    st.text(alphabet=st.sampled_from(['a', ':', '"', '\\', 'é', '\n', '\u003a', '0']),
            max_size=6),
)
_KEYS = st.sampled_from(["a", "b", "a:b", ":", "median", "é", "\x01", '"'])


@st.composite
def _texts(draw: st.DrawFn, depth: int = 0) -> str:
    """A JSON text as a person or a merge writes one: any spacing, ``ensure_ascii`` or not,
    an object's keys possibly repeated."""
    ascii_only = draw(st.booleans())
    space = draw(st.sampled_from(["", " ", "\n  "]))

    def scalar() -> str:
        return json.dumps(draw(_SCALARS), ensure_ascii=ascii_only)

    kind = draw(st.sampled_from(["scalar", "array", "object"]) if depth < 3 else st.just("scalar"))
    if kind == "scalar":
        return scalar()
    items = [draw(_texts(depth + 1)) for _ in range(draw(st.integers(0, 4)))]
    if kind == "array":
        return "[" + ("," + space).join(items) + "]"
    keys = [draw(_KEYS) for _ in items]
    return "{" + ("," + space).join(
        f"{json.dumps(k, ensure_ascii=ascii_only)}{space}:{space}{v}"
        for k, v in zip(keys, items, strict=True)) + "}"


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=_texts())
def test_the_read_is_the_standard_parsers_read(text: str) -> None:
    _same(_read(text), _standard(text))


@pytest.mark.parametrize("text", [
    '{"a": 1, "a": 2}',
    '{"a:b": 1, "a:b": 2}',  # the key's own colons are counted twice as well
    '{"x": ":", "y": {"k": [1, {"m": 0, "m": 0}]}}',
    '{"x": "\\u003a", "x": 1}',  # a colon written as an escape: the standard parser
    '{"a": NaN}', '[1e400]', '"\\ud800"', '[18446744073709551616]', '[-9223372036854775809]',
    '[0.00012345678901234568]', '{"big": 12345678901234567890123}', '\ufeff{}',
    '{"a": 1} x', '[1,]', '{"é:": "ü:"}',
])
def test_what_orjson_reads_otherwise_is_read_by_the_standard_parser(text: str) -> None:
    _same(_read(text), _standard(text))


def test_floats_read_as_the_standard_parser_reads_them() -> None:
    rng = random.Random(46)
    values = [rng.uniform(-1, 1) * 10.0 ** rng.randint(-320, 308) for _ in range(20_000)]
    texts = [repr(v) for v in values] + [
        f"{rng.randint(0, 10**17)}.{rng.randint(0, 10**30):030d}e{rng.randint(-330, 290)}"
        for _ in range(5_000)]
    text = "[" + ",".join(texts) + "]"
    assert jsonfile._fast(text) is not jsonfile._NOT_FAST
    _same(jsonfile.loads(text), json.loads(text))


def test_the_committed_baselines_are_read_by_orjson_as_the_standard_parser_reads_them(
) -> None:
    files = sorted((ROOT / "baselines").rglob("*.json"))
    assert files
    for path in files:
        text = path.read_text(encoding="utf-8")
        assert jsonfile._fast(text) is not jsonfile._NOT_FAST, path
        _same(jsonfile.loads(text), json.loads(text))


def test_a_repeated_key_is_still_one_line_naming_the_file_line_and_the_fix(
        tmp_path: Path) -> None:
    path = tmp_path / "cpu-x2" / "suites" / "test_m.json"
    path.parent.mkdir(parents=True)
    path.write_text('{\n  "cases": {},\n  "platform": "cpu-x2",\n  "cases": {},\n'
                    '  "schema_version": 3\n}\n', encoding="utf-8")
    with pytest.raises(BaselineError) as exc:
        read(path, "cpu-x2")
    message = str(exc.value)
    assert "\n" not in message
    assert message.startswith(f"{path}:4:3: corrupt baseline file: duplicate key 'cases'")
    assert "--accelperf-update" in message


def _nested(depth: int) -> Any:
    return [_nested(depth - 1)] if depth else 0


def test_deeper_than_orjson_goes_is_read_by_the_standard_parser() -> None:
    text = json.dumps(_nested(600))  # orjson dumps 254 levels at most
    _same(jsonfile.loads(text), json.loads(text))
