"""The examples in the package's docstrings are true."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = ["provision.accel", "collect.cases", "provision.describe", "stats.bootstrap",
           "stats.units", "backends.measure.common",
           "cluster.address", "checks.family", "ab.arms", "provision.targets",
           "bisection.search", "bisection.evidence", "ab.worker", "ab.verdict", "envs.uv",
           "envs.cache", "envs.releases", "envs.depfiles", "stats.median"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name: str) -> None:
    module = importlib.import_module(f"pytest_accelperf.{name}")
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
    assert result.attempted > 0, f"{name} has no docstring example: take it off MODULES"
