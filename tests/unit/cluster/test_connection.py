"""Connecting to a Ray cluster (``cluster/connection.py``): the address values, and Ray's own
connect bounded where an address is not a Ray GCS. Each connect runs in a fresh process."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator

import pytest

from pytest_accelperf.cluster.connection import check_address
from unit.cluster.test_address import SETTINGS_FRAME, _free_port

pytestmark = pytest.mark.skipif(importlib.util.find_spec("ray") is None,
                                reason="needs ray: pip install 'pytest-accelperf[ray]'")


def test_address_values() -> None:
    assert check_address("local") == "local"
    assert check_address("10.0.0.2:6379") == "10.0.0.2:6379"
    with pytest.raises(pytest.UsageError, match=r"Ray Client \(ray://\) is not supported"):
        check_address("ray://10.0.0.2:10001")
    # no port: Ray's default GCS port, which Ray itself would not add
    assert check_address("somewhere") == "somewhere:6379"
    assert check_address("[::1]") == "[::1]:6379"
    assert check_address("[fe80::1]:7000") == "[fe80::1]:7000"
    with pytest.raises(pytest.UsageError, match=r"=::1:6379: write an IPv6 address in "
                                                r"brackets.*expected local"):
        check_address("::1:6379")
    for bad in ("somewhere:", "somewhere:x", "somewhere:0", "somewhere:70000", ":6379",
                "[::1]6379"):
        with pytest.raises(pytest.UsageError, match=f"--accelperf-cluster={re.escape(bad)}: "):
            check_address(bad)


def _connect_in_subprocess(address: str, *, wait: float, grace: float = 30.0,
                           env: dict[str, str] | None = None) -> tuple[float, str]:
    """``Cluster.connect(address, wait=wait)`` in a fresh process (this one may be connected
    to the module's cluster already): seconds it took, and the ClusterError's message."""
    code = textwrap.dedent('''
        import inspect, sys, time
        from pytest_accelperf.cluster import connection
        connection.RAY_CONNECT_GRACE_S = float(sys.argv[3])
        # The code before the probe had no wait: call it as it can be called.
        kw = ({"wait": float(sys.argv[2])}
              if "wait" in inspect.signature(connection.Cluster.connect).parameters else {})
        t0 = time.monotonic()
        try:
            connection.Cluster.connect(sys.argv[1], **kw)
        except connection.ClusterError as exc:
            print(f"{time.monotonic() - t0:.2f}", exc, sep="\\n")
        else:
            print("connected")
    ''')
    done = subprocess.run([sys.executable, "-c", code, address, str(wait), str(grace)],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, **(env or {})})
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 2, done.stdout + done.stderr
    return float(lines[0]), lines[1]


@pytest.fixture
def listener() -> Iterator[tuple[socket.socket, list[socket.socket]]]:
    """A TCP server on every interface (Ray connects to this host's address, not to
    127.0.0.1) that accepts and says nothing; the connections it accepted."""
    server = socket.create_server(("", 0))
    accepted: list[socket.socket] = []

    def serve() -> None:
        with contextlib.suppress(OSError):
            while True:
                accepted.append(server.accept()[0])

    threading.Thread(target=serve, daemon=True).start()
    yield server, accepted
    server.close()
    for conn in accepted:
        conn.close()


@pytest.mark.slow  # a subprocess that imports Ray and waits out a bound
def test_an_address_that_accepts_and_says_nothing_is_not_waited_on(
        listener: tuple[socket.socket, list[socket.socket]]) -> None:
    port = listener[0].getsockname()[1]
    seconds, message = _connect_in_subprocess(f"127.0.0.1:{port}", wait=2)
    assert re.fullmatch(re.escape(
        f"--accelperf-cluster=127.0.0.1:{port}: 127.0.0.1:{port} is not a Ray GCS: it "
        f"accepted the connection but said nothing within ") + r"[\d.]+ s \(\d tr(y|ies) in 2 s\)"
        + re.escape("; pass the GCS address that 'ray start --head' prints (port 6379 by "
                    "default), not the dashboard's, the Ray Client's or another service's"),
        message), message
    assert 1.9 <= seconds < 10


@pytest.mark.slow  # a subprocess that imports Ray and waits out a bound
def test_rays_own_connect_is_bounded_where_the_address_greets_as_grpc_does(
        listener: tuple[socket.socket, list[socket.socket]]) -> None:
    """Past the probe (something answers the HTTP/2 greeting), Ray's connect can still
    wait for minutes on a server that never answers its calls: it gets a deadline."""
    server, accepted = listener
    port = server.getsockname()[1]

    def greet() -> None:  # answer every connection's greeting with a SETTINGS frame
        greeted: set[int] = set()
        while server.fileno() != -1:
            for conn in list(accepted):
                if id(conn) not in greeted:
                    greeted.add(id(conn))
                    with contextlib.suppress(OSError):
                        conn.sendall(SETTINGS_FRAME)
            time.sleep(0.05)

    threading.Thread(target=greet, daemon=True).start()
    seconds, message = _connect_in_subprocess(f"127.0.0.1:{port}", wait=1, grace=3)
    assert message == (
        f"--accelperf-cluster=127.0.0.1:{port}: 127.0.0.1:{port} answers, but Ray did not "
        f"connect to it within 4 s; is it the GCS address that 'ray start --head' printed, "
        f"of a cluster this machine can reach?")
    assert 3.9 <= seconds < 12
    assert len(accepted) >= 2  # the probe's, and Ray's own


@pytest.mark.slow  # a subprocess that imports Ray and waits out a bound
def test_auto_asks_what_ray_address_names() -> None:
    port = _free_port()
    seconds, message = _connect_in_subprocess(
        "auto", wait=1, env={"RAY_ADDRESS": f"127.0.0.1:{port}"})
    assert message.startswith(
        f"--accelperf-cluster=auto (RAY_ADDRESS=127.0.0.1:{port}): no answer from "
        f"127.0.0.1:{port} (connection refused, ")
    assert seconds < 10
