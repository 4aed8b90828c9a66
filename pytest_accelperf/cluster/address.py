"""What a cluster address names, and whether anything answers there, asked before Ray is.

Ray's own connect to an address where nothing listens does not fail: it retries the GCS
for minutes (20 tries of about 40 s each in Ray 2.60), printing at most a C++ warning
that pytest captures, so a mistyped ``--accelperf-cluster`` looked like a hang. So
:mod:`.connection` first asks the address itself, with a short deadline per try, again
and again until ``--accelperf-cluster-wait`` is spent (a head that is still starting is
waited for): a TCP connection, then the HTTP/2 greeting that every gRPC server (the GCS
is one) answers with its SETTINGS frame. What did not answer is then named in one line.

This module imports neither Ray nor anything of the plugin's.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

#: The GCS port ``ray start --head`` listens on unless given ``--port``.
DEFAULT_GCS_PORT = 6379
#: The Ray Client server's default port (``ray://HOST``).
DEFAULT_CLIENT_PORT = 10001
#: Seconds one try may take: to connect (a host that drops packets, behind a firewall,
#: answers nothing at all) and to be greeted back (a gRPC server answers at once; one that
#: stays silent is not a GCS, or is stuck, which is no better). Cut to what is left of
#: the wait.
TRY_S = 5.0
#: Seconds between tries.
RETRY_S = 0.5
#: The HTTP/2 client connection preface and an empty SETTINGS frame (RFC 9113, 3.4):
#: what a gRPC client sends first, and what any HTTP/2 server answers with a SETTINGS
#: frame of its own. Plain text: a GCS with TLS (``RAY_USE_TLS``) is only asked for TCP.
_H2_HELLO = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
_H2_SETTINGS = 0x04


class AddressError(ValueError):
    """An address that names no host and port; the message says how to write one."""


@dataclass(frozen=True)
class Target:
    """Where an address points: ``host`` (an IPv6 address without its brackets), ``port``,
    and ``source``, what named it when not the option itself (``RAY_ADDRESS``, Ray's
    current-cluster file)."""

    host: str
    port: int
    source: str = ""

    @property
    def text(self) -> str:
        """``host:port``, an IPv6 host in brackets as Ray writes it."""
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def split_address(value: str) -> Target:
    """The host and port of a GCS address: ``HOST:PORT``, ``[IPV6]:PORT``, or without a
    port (Ray's default, 6379); ``ray://`` addresses (the Ray Client server) default to
    10001.

    >>> split_address("10.0.0.2").text, split_address("[::1]:7000").text
    ('10.0.0.2:6379', '[::1]:7000')
    >>> split_address("ray://head").text
    'head:10001'
    """
    text = value.strip()
    default = DEFAULT_GCS_PORT
    if text.startswith("ray://"):
        text, default = text[len("ray://"):].rstrip("/"), DEFAULT_CLIENT_PORT
    if text.startswith("["):
        host, bracket, rest = text[1:].partition("]")
        if not bracket or not host or (rest and not rest.startswith(":")):
            raise AddressError(f"{value}: an IPv6 address is written [ADDRESS]:PORT, "
                               f"e.g. [::1]:{DEFAULT_GCS_PORT}")
        port_text = rest[1:] if rest else ""
    elif text.count(":") > 1:
        raise AddressError(f"{value}: write an IPv6 address in brackets, "
                           f"[ADDRESS]:PORT (e.g. [::1]:{DEFAULT_GCS_PORT})")
    else:
        host, colon, port_text = text.partition(":")
        if not host or (colon and not port_text):
            raise AddressError(f"{value}: expected HOST:PORT (or HOST, for port {default})")
    if not port_text:
        return Target(host, default)
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise AddressError(f"{value}: the port must be a number from 1 to 65535")
    return Target(host, int(port_text))


def auto_target(environ: Mapping[str, str], current_cluster: Path | None) -> Target | None:
    """What ``ray.init(address="auto")`` will connect to, where that is cheap to know:
    ``RAY_ADDRESS``, else the address in ``current_cluster``, Ray's file of the cluster
    ``ray start`` started last on this machine; None where neither says (Ray then looks for
    a GCS among this machine's processes, or fails at once)."""
    named = environ.get("RAY_ADDRESS", "").strip()
    if named and named not in ("auto", "local"):
        target = split_address(named)
        return Target(target.host, target.port, f"RAY_ADDRESS={named}")
    if current_cluster is None:
        return None
    try:
        written = current_cluster.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None
    try:
        target = split_address(written)
    except AddressError:
        return None  # not ours to judge: Ray reads it and says what it thinks
    return Target(target.host, target.port, f"{current_cluster} says {written}")


@dataclass(frozen=True)
class Silence:
    """Why an address did not answer as a GCS does: the last try's ``reason``, whether
    something there answered (``answered``: it listens, but it is not a GCS), whether the
    tries stopped before the wait because another could not help (``final``), the
    ``tries`` made and the ``seconds`` spent."""

    reason: str
    answered: bool
    final: bool
    tries: int
    seconds: float


def _try_once(target: Target, seconds: float, greet: bool) -> tuple[str, bool, bool] | None:
    """One try: None when ``target`` answers as a gRPC server does, else ``(reason,
    answered, final)``; ``final`` when trying again cannot help (a host name that does
    not resolve, a server that answers in another protocol)."""
    try:
        socket.getaddrinfo(target.host, target.port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        final = exc.errno != socket.EAI_AGAIN  # a typo does not resolve later
        return f"cannot resolve host {target.host!r}: {exc.strerror}", False, final
    started = time.monotonic()
    try:
        sock = socket.create_connection((target.host, target.port), timeout=seconds)
    except ConnectionRefusedError:  # what a head that is still starting says, too
        return "connection refused", False, False
    except TimeoutError:
        return f"no answer to a connection within {seconds:.3g} s", False, False
    except OSError as exc:
        return (exc.strerror or str(exc)).lower(), False, False
    with sock:
        if not greet:
            return None
        answer = b""
        try:
            sock.sendall(_H2_HELLO)
            while len(answer) < 9:  # a frame header: length (3), type (1), flags, stream
                sock.settimeout(max(0.05, seconds - (time.monotonic() - started)))
                chunk = sock.recv(64)
                if not chunk:
                    break
                answer += chunk
        except TimeoutError:
            if not answer:
                return (f"it accepted the connection but said nothing within "
                        f"{seconds:.3g} s"), True, False
        except OSError as exc:
            return f"it accepted the connection, then {exc.strerror or exc}", True, False
    if len(answer) >= 4 and answer[3] == _H2_SETTINGS:
        return None
    if not answer:
        return "it accepted the connection and closed it without a word", True, False
    # Another protocol (a dashboard's HTTP/1, Redis): asking again gets the same answer.
    return f"it answered {answer[:40]!r}, not as a gRPC server does", True, True


def probe(target: Target, wait: float, *, greet: bool | None = None,
          sleep: Callable[[float], None] = time.sleep) -> Silence | None:
    """Ask ``target`` until it answers as a gRPC server (a Ray GCS) does or ``wait``
    seconds are spent; None when it answered, else what the last try found. ``greet``
    (default: unless ``RAY_USE_TLS`` is set) sends the HTTP/2 greeting after connecting."""
    if greet is None:
        greet = os.environ.get("RAY_USE_TLS", "0").strip().lower() not in ("1", "true")
    started = time.monotonic()
    deadline = started + max(0.0, wait)
    tries = 0
    while True:
        tries += 1
        # Each try gets its own short deadline, cut to what is left of the wait (but never
        # to nothing: a wait of 0 still asks once, and the last try is a real one).
        left = deadline - time.monotonic()
        outcome = _try_once(target, max(0.2, min(TRY_S, left)), greet)
        if outcome is None:
            return None
        reason, answered, final = outcome
        left = deadline - time.monotonic()
        if final or left <= 0:
            return Silence(reason, answered, final, tries, time.monotonic() - started)
        sleep(min(RETRY_S, left))
