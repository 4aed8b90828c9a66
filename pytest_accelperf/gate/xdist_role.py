"""Which xdist role this pytest process plays: the one place that reads ``workerinput``.

pytest-xdist gives each worker's config a ``workerinput`` dict (absent on the controller
and without xdist). Everything that behaves differently on a worker asks here.
"""

from __future__ import annotations

from typing import Any

import pytest


def is_worker(config: pytest.Config) -> bool:
    """True in an xdist worker process."""
    return hasattr(config, "workerinput")


def worker_input(config: pytest.Config) -> dict[str, Any]:
    """The worker's ``workerinput`` (empty on the controller or without xdist)."""
    data: dict[str, Any] = getattr(config, "workerinput", None) or {}
    return data


def worker_id(config: pytest.Config) -> str:
    """``gw0``, ``gw1``, ... in a worker; ``main`` otherwise."""
    return str(worker_input(config).get("workerid", "main"))
