"""Where --accelperf-cluster connects (``cluster/address.py``): what ``auto`` reads, and the
probe that waits for a head still starting and names a service of another protocol at once.
Real sockets on 127.0.0.1; no Ray."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

from pytest_accelperf.cluster.address import Target, auto_target, probe, split_address


def _free_port() -> int:
    """A port of 127.0.0.1 where nothing listens (it was free a moment ago)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_what_auto_connects_to(tmp_path: Path) -> None:
    written = tmp_path / "ray_current_cluster"
    assert auto_target({}, written) is None  # Ray looks for itself; nothing cheap to ask
    written.write_text("10.0.0.3:6380\n")
    assert auto_target({}, written) == Target("10.0.0.3", 6380,
                                              f"{written} says 10.0.0.3:6380")
    assert auto_target({"RAY_ADDRESS": "[::1]:7000"}, written) == Target(
        "::1", 7000, "RAY_ADDRESS=[::1]:7000")
    assert auto_target({"RAY_ADDRESS": "auto"}, None) is None
    assert split_address("ray://head").port == 10001  # the Ray Client server's default


SETTINGS_FRAME = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"  # what a gRPC server greets with


def test_a_head_that_is_still_starting_is_waited_for() -> None:
    port = _free_port()
    started = threading.Event()

    def start_late() -> None:  # the GCS port opens 1.5 s after the first try
        time.sleep(1.5)
        with socket.create_server(("127.0.0.1", port)) as server:
            started.set()
            conn, _ = server.accept()
            with conn:
                conn.recv(64)
                conn.sendall(SETTINGS_FRAME)

    threading.Thread(target=start_late, daemon=True).start()
    t0 = time.monotonic()
    assert probe(Target("127.0.0.1", port), 10) is None
    assert started.is_set() and 1.5 <= time.monotonic() - t0 < 5


def test_another_protocol_is_not_asked_again() -> None:
    """A service that answers in another protocol (here HTTP/1) will not become a GCS:
    it is named at once, with the start of what it said, and not asked for the wait."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        def answer() -> None:
            conn, _ = server.accept()
            with conn:
                conn.recv(64)
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")

        threading.Thread(target=answer, daemon=True).start()
        t0 = time.monotonic()
        silence = probe(Target("127.0.0.1", server.getsockname()[1]), 30)
    assert time.monotonic() - t0 < 5
    assert silence is not None and silence.answered and silence.final and silence.tries == 1
    assert silence.reason == ("it answered b'HTTP/1.1 400 Bad Request\\r\\n\\r\\n', not as a "
                              "gRPC server does")
