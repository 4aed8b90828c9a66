"""The checks' typed read of a block (store/block.py's ``read``): every section made
directly, as ``model_construct`` makes it. Store files only: no training."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from pytest_accelperf.store import block as blocks
from pytest_accelperf.store.baselines import read as read_file
from pytest_accelperf.store.block import read_block
from pytest_accelperf.store.schema import block_model

REPO = Path(__file__).resolve().parents[3]


def _committed() -> list[dict[str, Any]]:
    found = []
    for path in sorted((REPO / "baselines").rglob("*.json")):
        loaded = read_file(path)
        assert not loaded.invalid
        found += list(loaded.cases.values())
    return found


def _same(a: object, b: object, where: str) -> None:
    """``a`` and ``b`` alike: each model of the same type with the same fields, fields
    set, extra keys and private attributes, all the way down."""
    if isinstance(a, BaseModel):
        assert type(a) is type(b), where
        assert isinstance(b, BaseModel)
        assert list(a.__dict__) == list(b.__dict__), where
        assert a.__pydantic_fields_set__ == b.__pydantic_fields_set__, where
        assert a.__pydantic_extra__ == b.__pydantic_extra__, where
        assert a.__pydantic_private__ == b.__pydantic_private__, where
        for name, value in a.__dict__.items():
            _same(value, b.__dict__[name], f"{where}.{name}")
    elif isinstance(a, dict):
        assert isinstance(b, dict) and list(a) == list(b), where
        for key, value in a.items():
            _same(value, b[key], f"{where}.{key}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _same(x, y, f"{where}[{i}]")
    else:
        assert a == b or (isinstance(a, float) and math.isnan(a) and math.isnan(b)), where


def test_each_section_is_what_model_construct_makes(monkeypatch: pytest.MonkeyPatch) -> None:
    found = _committed()
    assert len(found) > 50 and any(b.get("machines") for b in found)
    odd = {**found[0], "unknown": {"kept": [1]}, "step_time": {
        **found[0]["step_time"], "extra": "x"}}
    del odd["recorded_at"]  # a field left out: its default
    found.append(odd)
    model = block_model()
    direct = [read_block(b, model) for b in found]

    def slowly(model: type[BaseModel]) -> Any:
        def construct(values: dict[str, Any], extra: dict[str, Any], data: Any) -> BaseModel:
            out = model.model_construct(**values, **extra)
            if isinstance(out, blocks._Strict):
                out._json = data
            return out
        return construct

    monkeypatch.setattr(blocks, "_PLANS", {})
    monkeypatch.setattr(blocks, "_constructor", slowly)
    for i, (made, data) in enumerate(zip(direct, found, strict=True)):
        _same(made, read_block(data, model), f"block {i}")
    assert direct[-1].step_time is not None and direct[-1].step_time.to_json() == \
        odd["step_time"]
    assert direct[-1].recorded_at is None and direct[-1].to_json() == odd
