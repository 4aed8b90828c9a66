"""This process's connection to a Ray cluster (see :mod:`pytest_accelperf.cluster` for the
picture): the ``local`` cluster a session starts (its own temporary directory and token,
shut down at the end), a running cluster connected to as a driver, and the errors that say
what to do when neither works.
"""

from __future__ import annotations

import importlib
import logging
import os
import secrets
import shutil
import sys
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from pytest_accelperf.cluster.address import AddressError, Target, auto_target, probe, split_address
from pytest_accelperf.errors import UserError

#: The custom resource of a host whose CPU runs virtual devices (one per host).
HOST_RESOURCE = "accelperf_cpu_host"
#: Object store of a ``local`` cluster: runs and parameters are small.
LOCAL_OBJECT_STORE = 256 * 2**20
_TOKEN_VARS = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN")
#: Seconds Ray's own connect gets past ``--accelperf-cluster-wait``, once the address has
#: answered: a driver's start (its core worker, the cluster's node table) takes a few.
RAY_CONNECT_GRACE_S = 30.0


class ClusterError(UserError):
    """The cluster cannot run a case (infeasible resources, a platform mismatch, Ray
    missing); the message says what was asked, what exists, and what to do."""


def import_ray() -> ModuleType:
    """The ``ray`` module, or a ClusterError naming the extra to install."""
    try:
        return importlib.import_module("ray")
    except ImportError:
        raise ClusterError("--accelperf-cluster needs Ray, which is not installed: "
                           "pip install 'pytest-accelperf[ray]'") from None


def check_address(value: str) -> str:
    """``local``, ``auto`` or ``HOST:PORT`` (a GCS address; ``[IPV6]:PORT`` for an IPv6
    host; without a port, Ray's default 6379 is added); Ray Client (``ray://``) is
    refused: it is deprecated and drops connections under long calls."""
    value = value.strip()
    if value in ("local", "auto"):
        return value
    if value.startswith("ray://"):
        raise pytest.UsageError(
            f"--accelperf-cluster={value}: Ray Client (ray://) is not supported; pass the "
            f"cluster's GCS address (HOST:6379, what `ray start --head` prints) so pytest "
            f"connects as a driver")
    try:
        target = split_address(value)
    except AddressError as exc:
        raise pytest.UsageError(
            f"--accelperf-cluster={exc}; expected local (start a Ray cluster on this "
            f"machine for the session), auto, or HOST:PORT of a running cluster") from None
    return target.text


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
    def connect(cls, address: str, *, wait: float = 60.0) -> Cluster:
        """Connect to a running cluster as a driver (``auto``: the one ``ray start``
        started on this machine). A process already connected to it is reused as is.

        Before Ray is asked, the address is asked itself until it answers as a GCS does
        or ``wait`` seconds are spent (:func:`.address.probe`); Ray's own connect then
        gets ``wait`` + :data:`RAY_CONNECT_GRACE_S` seconds. Either failing is a
        ClusterError naming the option, the address and what was tried."""
        __tracebackhide__ = True  # the error says it all: no frame of ours in the report
        ray = import_ray()
        if ray.is_initialized():
            current = str(ray.get_runtime_context().gcs_address)
            if address in ("auto", current):
                return cls(address=current)
            raise ClusterError(f"--accelperf-cluster={address}: this process is already "
                               f"connected to the Ray cluster at {current}, not {address}")
        option = f"--accelperf-cluster={address}"
        target = _target(address)
        if target is not None:
            if target.source:
                option = f"{option} ({target.source})"
            _wait_for(target, wait, option)
        t0 = time.perf_counter()
        _init_within(ray, address, wait + RAY_CONNECT_GRACE_S, option,
                     target.text if target is not None else address)
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


def _target(address: str) -> Target | None:
    """Where ``ray.init(address=address)`` will connect, where that is cheap to know."""
    if address == "local":
        return None
    if address != "auto":
        return split_address(address)
    try:  # Ray's own path of its current-cluster file (it follows RAY_TMPDIR and TMPDIR)
        utils = importlib.import_module("ray._common.utils")
        current: Path | None = Path(utils.get_ray_address_file(None))
    except Exception:  # a private function of Ray's: without it, RAY_ADDRESS alone
        current = None
    try:
        target = auto_target(os.environ, current)
    except AddressError as exc:
        raise ClusterError(f"--accelperf-cluster=auto: RAY_ADDRESS is not an address "
                           f"({exc})") from None
    if target is not None and os.environ.get("RAY_ADDRESS", "").startswith("ray://"):
        raise ClusterError(
            f"--accelperf-cluster=auto ({target.source}): Ray Client (ray://) is not "
            f"supported; set RAY_ADDRESS to the cluster's GCS address (HOST:6379, what "
            f"`ray start --head` prints), or unset it")
    return target


def _wait_for(target: Target, wait: float, option: str) -> None:
    """Return once ``target`` answers as a GCS does; a ClusterError after ``wait`` s."""
    __tracebackhide__ = True
    silence = probe(target, wait)
    if silence is None:
        return
    tried = f"{silence.tries} {'try' if silence.tries == 1 else 'tries'} in {wait:g} s"
    if silence.answered:
        raise ClusterError(
            f"{option}: {target.text} is not a Ray GCS: {silence.reason}"
            f"{'' if silence.final else f' ({tried})'}; pass the GCS address that "
            f"'ray start --head' prints (port 6379 by default), not the dashboard's, the Ray "
            f"Client's or another service's")
    if silence.final:
        raise ClusterError(f"{option}: {silence.reason}; pass the host name or IP address "
                           f"of the Ray head")
    raise ClusterError(
        f"{option}: no answer from {target.text} ({silence.reason}, {silence.tries} "
        f"{'try' if silence.tries == 1 else 'tries'}) for {wait:g} s "
        f"(--accelperf-cluster-wait); is a Ray head running there? Start one with "
        f"'ray start --head' or pass --accelperf-cluster=local")


class _NotInMainThread(logging.Filter):
    """Drops Ray's warning that a driver started outside the main thread sets no SIGTERM
    handler: :func:`_init_within` does that on purpose, and pytest has its own."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "SIGTERM handler is not set" not in record.getMessage()


def _init_within(ray: ModuleType, address: str, seconds: float, option: str, shown: str) -> None:
    """``ray.init(address=address)``, given up after ``seconds``.

    Ray retries a GCS that does not answer its RPCs for many minutes (the probe only saw
    that something greets as gRPC does), so the connect runs in a thread of its own and
    this one stops waiting for it at the deadline. A connect given up on may go on in
    that (daemon) thread; the session never uses it, and it ends with the process.
    """
    __tracebackhide__ = True
    box: dict[str, BaseException] = {}
    done = threading.Event()
    quiet = _NotInMainThread()
    ray_log = logging.getLogger("ray._private.worker")

    def connect() -> None:
        try:
            ray.init(address=address, log_to_driver=False, configure_logging=False)
        except BaseException as exc:  # handed to the waiting thread, which raises it
            box["error"] = exc
        finally:
            done.set()

    ray_log.addFilter(quiet)
    try:
        thread = threading.Thread(target=connect, name="accelperf-ray-connect", daemon=True)
        thread.start()
        finished = done.wait(seconds)
    finally:
        ray_log.removeFilter(quiet)
    if not finished:
        raise ClusterError(
            f"{option}: {shown} answers, but Ray did not connect to it within {seconds:g} s; "
            f"is it the GCS address that 'ray start --head' printed, of a cluster this "
            f"machine can reach?")
    exc = box.get("error")
    if exc is None:
        return
    if not isinstance(exc, Exception):
        raise exc  # KeyboardInterrupt, SystemExit: not a connection's failure
    text = str(exc).strip()
    first = text.splitlines()[0] if text else type(exc).__name__
    hint = ""
    if "auth" in text.lower() or "token" in text.lower():
        hint = (" The cluster uses token authentication: give this process its token "
                "as RAY_AUTH_TOKEN (or RAY_AUTH_TOKEN_PATH, or ~/.ray/auth_token; "
                "`ray get-auth-token` on the head prints it).")
    raise ClusterError(f"{option}: cannot connect to the Ray cluster at {shown}: {first}."
                       f"{hint}") from exc


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
