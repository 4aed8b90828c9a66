"""Which xdist role this pytest process plays: the one place that reads ``workerinput``.

pytest-xdist gives each worker's config a ``workerinput`` dict (absent on the controller
and without xdist). Everything that behaves differently on a worker asks here.
"""

from __future__ import annotations

from typing import Protocol

import pytest

#: A worker's ``workerinput`` or ``workeroutput``: what execnet carries between the
#: controller and a worker (strings, numbers, and containers of them).
WorkerData = dict[str, object]


class _Gateway(Protocol):
    id: str


class XdistNode(Protocol):
    """What this plugin reads of xdist's ``WorkerController`` (the ``node`` of xdist's
    controller hooks; pytest-xdist ships no type information)."""

    config: pytest.Config
    workerinput: WorkerData
    gateway: _Gateway


def is_worker(config: pytest.Config) -> bool:
    """True in an xdist worker process."""
    return hasattr(config, "workerinput")


def worker_input(config: pytest.Config) -> WorkerData:
    """The worker's ``workerinput`` (empty on the controller or without xdist)."""
    data: WorkerData = getattr(config, "workerinput", None) or {}
    return data


def worker_id(config: pytest.Config) -> str:
    """``gw0``, ``gw1``, ... in a worker; ``main`` otherwise."""
    return str(worker_input(config).get("workerid", "main"))


def worker_count(config: pytest.Config) -> int:
    """How many xdist workers the session has (1 on the controller or without xdist)."""
    count = worker_input(config).get("workercount", 1)
    return int(count) if isinstance(count, int | str) else 1
