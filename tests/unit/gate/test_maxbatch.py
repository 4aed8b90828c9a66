"""The max-batch search algorithm on its own (pytest_accelperf/gate/maxbatch.py)."""

from __future__ import annotations

from typing import Any

import pytest

from pytest_accelperf.backends.protocol import Fit
from pytest_accelperf.collect.cases import Case
from pytest_accelperf.gate.maxbatch import MAX_PROBES, search_max_batch


def linear(capacity: int, per_sample: int = 100) -> Any:
    return lambda c: Fit(c.batch * per_sample <= capacity, c.batch * per_sample, capacity)


@pytest.mark.parametrize("start, capacity, expected", [
    (8, 5000, 50), (8, 800, 8), (64, 5000, 50), (1, 100, 1), (8, 10**9, 1 << 16)])
def test_search_finds_the_largest_fitting_batch(start: int, capacity: int, expected: int) -> None:
    found = search_max_batch(Case(backend="jax", batch=start), linear(capacity))
    assert found.value == expected
    assert found.capacity_bytes == capacity
    assert len(found.probes) <= MAX_PROBES
    assert len({b for b, _, _ in found.probes}) == len(found.probes)  # nothing tried twice


def test_search_keeps_to_multiples_of_the_world_size() -> None:
    found = search_max_batch(Case(backend="deepspeed", batch=6, world_size=2),
                             linear(5100), multiple_of=2)
    assert found.value == 50
    assert all(b % 2 == 0 for b, _, _ in found.probes)


def test_search_when_nothing_fits() -> None:
    found = search_max_batch(Case(backend="jax", batch=8), linear(50))
    assert found.value is None
    assert [b for b, _, _ in found.probes] == [8, 4, 2, 1]


def test_search_rejects_bad_bounds() -> None:
    with pytest.raises(ValueError, match="multiple_of"):
        search_max_batch(Case(backend="jax", batch=8), linear(10), multiple_of=0)
