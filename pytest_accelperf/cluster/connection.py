"""This process's connection to a Ray cluster (see :mod:`pytest_accelperf.cluster` for the
picture): the ``local`` cluster a session starts (its own temporary directory and token,
shut down at the end), a running cluster connected to as a driver, and the errors that say
what to do when neither works.
"""

from __future__ import annotations

import importlib
import os
import secrets
import shutil
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from typing import Any

import pytest

from pytest_accelperf.errors import UserError

#: The custom resource of a host whose CPU runs virtual devices (one per host).
HOST_RESOURCE = "accelperf_cpu_host"
#: Object store of a ``local`` cluster: runs and parameters are small.
LOCAL_OBJECT_STORE = 256 * 2**20
_TOKEN_VARS = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN")


class ClusterError(UserError):
    """The cluster cannot run a case (infeasible resources, a platform mismatch, Ray
    missing); the message says what was asked, what exists, and what to do."""


def import_ray() -> Any:
    """The ``ray`` module, or a ClusterError naming the extra to install."""
    try:
        return importlib.import_module("ray")
    except ImportError:
        raise ClusterError("--accelperf-cluster needs Ray, which is not installed: "
                           "pip install 'pytest-accelperf[ray]'") from None


def check_address(value: str) -> str:
    """``local``, ``auto`` or ``HOST:PORT`` (a GCS address); Ray Client (``ray://``) is
    refused: it is deprecated and drops connections under long calls."""
    value = value.strip()
    if value in ("local", "auto"):
        return value
    if value.startswith("ray://"):
        raise pytest.UsageError(
            f"--accelperf-cluster={value}: Ray Client (ray://) is not supported; pass the "
            f"cluster's GCS address (HOST:6379, what `ray start --head` prints) so pytest "
            f"connects as a driver")
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit():
        raise pytest.UsageError(
            f"--accelperf-cluster={value}: expected local (start a Ray cluster on this "
            f"machine for the session), auto, or HOST:PORT of a running cluster")
    return value


@dataclass
class Cluster:
    """This process's connection to a Ray cluster (and the cluster, when it started it)."""

    address: str
    owned: bool = False
    connected: bool = False
    temp_dir: str | None = None
    start_seconds: float = 0.0
    _env_before: dict[str, str | None] = field(default_factory=dict)

    @classmethod
    def start_local(cls) -> Cluster:
        """Start a Ray cluster on this machine for this session: no dashboard, its own
        temporary directory, one ``accelperf_cpu_host``, and (unless ``RAY_AUTH_MODE`` is
        set) token authentication with a fresh token in ``RAY_AUTH_TOKEN``, which this
        process's children (xdist workers) inherit and nothing is written to ``~/.ray``."""
        ray = import_ray()
        before = {k: os.environ.get(k) for k in _TOKEN_VARS}
        if "RAY_AUTH_MODE" not in os.environ:
            os.environ["RAY_AUTH_MODE"] = "token"
            os.environ["RAY_AUTH_TOKEN"] = secrets.token_hex(32)
            _refresh_ray_config()
        temp_dir = tempfile.mkdtemp(prefix="accelperf-ray-")
        t0 = time.perf_counter()
        try:
            with warnings.catch_warnings():
                # Ray starts its daemons with subprocess + preexec_fn, which runs JAX's
                # at-fork hook when JAX is already imported: its "os.fork() was called"
                # warning is about a fork that execs at once, and under -W error (pytest's
                # filterwarnings) it would surface as an unraisable exception.
                warnings.filterwarnings("ignore", message=r"os\.fork\(\) was called",
                                        category=RuntimeWarning)
                ray.init(address="local", include_dashboard=False, num_cpus=os.cpu_count(),
                         resources={HOST_RESOURCE: 1}, object_store_memory=LOCAL_OBJECT_STORE,
                         log_to_driver=False, configure_logging=False, _temp_dir=temp_dir)
        except BaseException:
            _restore_env(before)
            shutil.rmtree(temp_dir, ignore_errors=True)
            raise
        address = str(ray.get_runtime_context().gcs_address)
        return cls(address=address, owned=True, connected=True, temp_dir=temp_dir,
                   start_seconds=time.perf_counter() - t0, _env_before=before)

    @classmethod
    def connect(cls, address: str) -> Cluster:
        """Connect to a running cluster as a driver (``auto``: the one ``ray start``
        started on this machine). A process already connected to it is reused as is."""
        ray = import_ray()
        if ray.is_initialized():
            current = str(ray.get_runtime_context().gcs_address)
            if address in ("auto", current):
                return cls(address=current)
            raise ClusterError(f"this process is already connected to the Ray cluster at "
                               f"{current}, not {address}")
        t0 = time.perf_counter()
        try:
            ray.init(address=address, log_to_driver=False, configure_logging=False)
        except Exception as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            hint = ""
            if "auth" in str(exc).lower() or "token" in str(exc).lower():
                hint = (" The cluster uses token authentication: give this process its token "
                        "as RAY_AUTH_TOKEN (or RAY_AUTH_TOKEN_PATH, or ~/.ray/auth_token; "
                        "`ray get-auth-token` on the head prints it).")
            raise ClusterError(f"cannot connect to the Ray cluster at {address}: {first}."
                               f"{hint}") from exc
        return cls(address=str(ray.get_runtime_context().gcs_address), connected=True,
                   start_seconds=time.perf_counter() - t0)

    def stop(self) -> None:
        """Disconnect; a cluster this process started is shut down with it (exactly that
        one: its processes are this process's children), and its directory removed."""
        if self.connected:
            ray = import_ray()
            ray.shutdown()
            self.connected = False
        if self.owned:
            _restore_env(self._env_before)
            if self.temp_dir:
                shutil.rmtree(self.temp_dir, ignore_errors=True)
            self.owned = False


def _refresh_ray_config() -> None:
    """Ray reads ``RAY_AUTH_MODE`` into its C++ config when imported; a process that
    imported it before the mode was set must reload that config (what Ray's own
    ``_enable_token_auth`` does)."""
    raylet: Any = importlib.import_module("ray._raylet")
    raylet.Config.initialize("")


def _restore_env(before: dict[str, str | None]) -> None:
    changed = False
    for key, value in before.items():
        if os.environ.get(key) != value:
            changed = True
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    if changed and "ray" in sys.modules:
        _refresh_ray_config()
