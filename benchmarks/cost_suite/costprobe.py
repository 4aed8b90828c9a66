"""A pytest plugin that times what ``benchmarks/cost.py`` needs and the plugin does not say.

Loaded with ``-p costprobe`` (this directory on ``PYTHONPATH``); writes, at the end of the
session, ``$ACCELPERF_COST_OUT`` (JSON): per test node id its ``setup``, ``call`` and
``teardown`` durations as pytest measured them, the seconds it waited for the CPU host lock
(other sessions' cases: not the plugin's cost, and zero on a quiet machine), and the
seconds spent confirming a throughput regression (``--accelperf-confirm``: the
re-measurement's training and the wait for a quiet machine before it); and the session's
own wall time. It wraps two names of the plugin in place (``session.host_lock``,
``runner.Confirmation``); a missing one is skipped (then reported as 0).

With ``$ACCELPERF_COST_STEPS`` set to a number, every collected case trains that many
measured steps instead of its own (the case in the test's parameters is replaced by a
copy with ``steps`` changed; its id, and so the baseline it is compared with, stay).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import time
from collections.abc import Iterator
from typing import Any

import pytest

_NODES: dict[str, dict[str, float]] = {}
_CURRENT: list[str] = []
_STARTED = time.monotonic()


def _node() -> dict[str, float]:
    nodeid = _CURRENT[-1] if _CURRENT else "<session>"
    return _NODES.setdefault(nodeid, {"setup": 0.0, "call": 0.0, "teardown": 0.0,
                                      "lock_wait": 0.0, "confirmation": 0.0})


def _wrap_host_lock() -> None:
    try:
        from pytest_accelperf.gate import session
    except ImportError:
        return
    inner = getattr(session, "host_lock", None)
    if inner is None:
        return

    @contextlib.contextmanager
    def timed_lock(*args: Any, **kwargs: Any) -> Iterator[Any]:
        t0 = time.monotonic()
        with inner(*args, **kwargs) as held:
            _node()["lock_wait"] += time.monotonic() - t0
            yield held

    session.host_lock = timed_lock  # type: ignore[attr-defined]


def _wrap_confirmation() -> None:
    try:
        from pytest_accelperf.gate import runner
    except ImportError:
        return
    base = getattr(runner, "Confirmation", None)
    if base is None:
        return

    class TimedConfirmation(base):  # type: ignore[misc, valid-type]
        def __call__(self, first: Any) -> Any:
            t0 = time.monotonic()
            try:
                return super().__call__(first)
            finally:
                _node()["confirmation"] += time.monotonic() - t0

    runner.Confirmation = TimedConfirmation  # type: ignore[attr-defined]


def pytest_configure(config: pytest.Config) -> None:
    _wrap_host_lock()
    _wrap_confirmation()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    steps = os.environ.get("ACCELPERF_COST_STEPS", "").strip()
    if not steps:
        return
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", None)
        if params is not None and "accelperf_case" in params:
            params["accelperf_case"] = dataclasses.replace(params["accelperf_case"],
                                                           steps=int(steps))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    _CURRENT.append(item.nodeid)
    try:
        return (yield)
    finally:
        _CURRENT.pop()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _NODES.setdefault(report.nodeid, {"setup": 0.0, "call": 0.0, "teardown": 0.0,
                                      "lock_wait": 0.0, "confirmation": 0.0})
    _NODES[report.nodeid][report.when] += float(report.duration)


def pytest_unconfigure(config: pytest.Config) -> None:
    out = os.environ.get("ACCELPERF_COST_OUT")
    if out:
        with open(out, "w", encoding="utf-8") as f:
            json.dump({"session_seconds": time.monotonic() - _STARTED, "nodes": _NODES}, f,
                      indent=1)
