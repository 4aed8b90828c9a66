"""The controller's side of an A/B worker (:mod:`pytest_accelperf.ab.worker`): start one
arm's process (``python -m pytest_accelperf.ab.worker``, told its setup through the
environment), wait for it to connect, ask it to do something and wait for the answer within
a deadline, and stop it. Every wait has a deadline: connecting and preparing a case get
``--accelperf-compare-prepare-timeout`` (:data:`PREPARE_TIMEOUT_S` by default), a block of
steps :data:`BLOCK_TIMEOUT_S`. A worker that dies or runs past its deadline (it is then
killed) is a :class:`~pytest_accelperf.ab.CompareError` that names the worker (its arm,
pair and pid), the revision it runs and the end of its output (:meth:`Arm.describe`).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from multiprocessing import AuthenticationError
from multiprocessing.connection import Connection, Listener
from pathlib import Path
from typing import Literal, overload

from pytest_accelperf.ab import CompareError
from pytest_accelperf.ab.worker import ADDRESS_ENV, AUTHKEY_ENV, PAIR_ENV, SETUP_ENV, Setup
from pytest_accelperf.records.jsonvalue import JSONValue
from pytest_accelperf.records.program import ProgramRecord

#: Seconds a worker may take to start and connect, and then to import a suite and build,
#: compile and warm up a case's step (``--accelperf-compare-prepare-timeout``'s default).
PREPARE_TIMEOUT_S = 600.0
#: Seconds one block of steps may take before the worker is declared hung.
BLOCK_TIMEOUT_S = 300.0
#: What starts an arm's process (run in the arm's tree, the plugin first on its path).
WORKER_COMMAND = (sys.executable, "-m", "pytest_accelperf.ab.worker")
#: The most of a worker's output a message quotes (its last lines).
TAIL_CHARS = 1200
#: Seconds a killed worker is waited for (it cannot refuse SIGKILL; a process stuck in the
#: kernel, in a GPU driver's call, may take a moment to go).
KILL_WAIT_S = 10.0


def log_tail(log: Path, chars: int = TAIL_CHARS) -> str:
    """The end of a worker's output, whole lines where they fit: ``Its output ends: ...``,
    or that it printed nothing."""
    try:
        text = log.read_text(errors="replace").strip()
    except OSError:
        return f"Its output ({log}) cannot be read."
    if not text:
        return f"It printed nothing ({log})."
    if len(text) > chars:
        text = text[-chars:]
        text = "..." + text[text.find("\n") + 1:] if "\n" in text[:-1] else "..." + text
    return f"Its output ({log}) ends:\n{text}"


def kill(proc: subprocess.Popen[bytes]) -> None:
    """End ``proc`` (SIGKILL) and reap it, waiting at most :data:`KILL_WAIT_S`."""
    if proc.poll() is None:
        proc.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=KILL_WAIT_S)


@dataclass
class Arm:
    """One arm's worker process, the connection to it, and the file its output goes to."""

    name: str
    proc: subprocess.Popen[bytes]
    conn: Connection
    log: Path
    #: The revision this arm runs, as messages name it (``origin/main (0123456789)``, or
    #: ``the working tree``).
    revision: str = ""
    #: The process pair this arm belongs to.
    pair: int = 0

    def describe(self) -> str:
        """``the base worker (pair 0, pid 123, revision origin/main (0123456789))``."""
        revision = f", revision {self.revision}" if self.revision else ""
        return f"the {self.name} worker (pair {self.pair}, pid {self.proc.pid}{revision})"

    # What each of the worker's ops answers (the methods of :class:`.worker.Worker`).
    @overload
    def call(self, timeout: float, op: Literal["stack"], *args: object) -> dict[str, str]: ...
    @overload
    def call(self, timeout: float, op: Literal["run"], *args: object) -> list[float]: ...
    @overload
    def call(self, timeout: float, op: Literal["program"],
             *args: object) -> ProgramRecord | None: ...
    @overload
    def call(self, timeout: float, op: Literal["pids"], *args: object) -> list[int]: ...
    @overload
    def call(self, timeout: float, op: Literal["prepare"], *args: object) -> tuple[str, str]: ...
    @overload
    def call(self, timeout: float, op: Literal["drop"], *args: object) -> None: ...
    @overload
    def call(self, timeout: float, op: Literal["record"],
             *args: object) -> tuple[dict[str, JSONValue] | None, str]: ...
    @overload
    def call(self, timeout: float, op: Literal["locate"], *args: object) -> tuple[str, str]: ...

    def call(self, timeout: float, op: str, *args: object) -> object:
        """Ask the worker to do ``op`` and wait (at most ``timeout`` seconds) for its
        answer."""
        __tracebackhide__ = True
        self.send(op, *args)
        return self.answer(timeout, op)

    def send(self, op: str, *args: object) -> None:
        """Ask the worker to do ``op``, without waiting: :meth:`answer` collects the reply
        (so that several workers can work at once)."""
        __tracebackhide__ = True
        try:
            self.conn.send((op, *args))
        except (OSError, BrokenPipeError):
            kill(self.proc)
            raise CompareError(f"{self.describe()} died (exit {self.proc.returncode}) before "
                               f"{op!r}. {self._tail()}") from None

    @overload
    def answer(self, timeout: float, op: Literal["prepare"]) -> tuple[str, str]: ...
    @overload
    def answer(self, timeout: float, op: str) -> object: ...

    def answer(self, timeout: float, op: str) -> object:
        """The worker's reply to the ``op`` sent last, within ``timeout`` seconds. A
        worker that does not answer in time is killed (its connection would otherwise
        hold a late reply for the next request); a worker that is gone or killed is
        :attr:`dead`, and the comparison starts another in its place for the next case."""
        __tracebackhide__ = True
        try:
            deadline = time.monotonic() + timeout
            while not self.conn.poll(0.2):
                if self.proc.poll() is not None:
                    raise EOFError
                if time.monotonic() > deadline:
                    kill(self.proc)
                    raise CompareError(f"{self.describe()} did not answer {op!r} within "
                                       f"{timeout:g} s; it was stopped. {self._tail()}")
            reply = self.conn.recv()
        except (EOFError, OSError, BrokenPipeError):
            kill(self.proc)
            raise CompareError(f"{self.describe()} died (exit {self.proc.returncode}) during "
                               f"{op!r}. {self._tail()}") from None
        if reply[0] == "error":
            if len(reply) > 3 and reply[3]:  # the worker's device is broken: not reused
                self.stop()
            raise CompareError(f"the {self.name} revision's worker (pair {self.pair}, pid "
                               f"{self.proc.pid}) failed in {op!r}: {reply[1]}\n{reply[2]}")
        return reply[1]

    @property
    def dead(self) -> bool:
        """Whether the process has exited (it died, or was stopped or killed)."""
        return self.proc.poll() is not None

    def _tail(self) -> str:
        return log_tail(self.log)

    def stop(self) -> None:
        try:
            if self.proc.poll() is None:
                self.conn.send(("stop",))
                self.proc.wait(timeout=10)
        except (OSError, EOFError, subprocess.TimeoutExpired):
            pass
        kill(self.proc)
        self.conn.close()


def _accept(listener: Listener, proc: subprocess.Popen[bytes], who: str, log: Path,
            timeout: float) -> Connection:
    """The worker's connection, within ``timeout`` seconds; a worker that exits first, or
    is not connected by then (it is killed), is a :class:`CompareError` naming ``who``
    and quoting its output.

    ``Listener.accept`` has no timeout and closing the listener does not wake it (Linux),
    so it runs in a thread, and a wait that ends without a connection wakes that thread
    with a connection of its own, which fails its handshake: nothing is left blocked."""
    box: dict[str, Connection | BaseException] = {}

    def accept() -> None:
        try:
            box["conn"] = listener.accept()
        except (OSError, EOFError, AuthenticationError) as exc:
            box["error"] = exc

    thread = threading.Thread(target=accept, daemon=True, name=f"accelperf-accept-{proc.pid}")
    thread.start()
    deadline = time.monotonic() + timeout
    why = ""
    while thread.is_alive():
        thread.join(0.2)
        if not thread.is_alive():
            break
        if proc.poll() is not None:
            why = f"exited (exit {proc.returncode}) before connecting"
        elif time.monotonic() > deadline:
            why = f"did not connect within {timeout:g} s; it was stopped"
        else:
            continue
        kill(proc)
        _wake(listener, thread)
        raise CompareError(f"{who} {why}. {log_tail(log)}")
    if "conn" not in box:
        kill(proc)
        raise CompareError(f"{who} could not connect ({box.get('error')!r}). {log_tail(log)}")
    conn = box["conn"]
    assert isinstance(conn, Connection)
    return conn


def _wake(listener: Listener, thread: threading.Thread) -> None:
    """End the thread blocked in ``listener.accept()``: connect to the listener and hang
    up, so that its accept returns and its handshake fails."""
    address = listener.address
    if isinstance(address, str):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(2.0)
            with contextlib.suppress(OSError):
                sock.connect(address)
    thread.join(5.0)


#: What JAX does with an accelerator's memory at start-up: it takes 75 % of it at once.
_JAX_MEMORY_ENV = ("XLA_PYTHON_CLIENT_PREALLOCATE", "XLA_PYTHON_CLIENT_MEM_FRACTION",
                   "XLA_PYTHON_CLIENT_ALLOCATOR")


def shared_device_env(accel: str, environ: Mapping[str, str], workers: int = 1,
                      cores: int | None = None) -> dict[str, str]:
    """The environment that lets ``workers`` A/B workers share one accelerator and the
    host's ``cores``: all of them (two per process pair) run on the same GPU.

    - JAX's default of taking 75 % of the device's memory when a process starts fits one
      worker, not ten (the second blocks or fails for memory); workers allocate as they go
      instead, in both arms alike. Where the user set any of JAX's memory variables, theirs
      stand.
    - torch.compile's inductor compiles in a pool of one process per core in *each*
      worker: ten workers preparing a compiled case at once start ten such pools (160
      processes importing torch on a 16-core host). Each worker's pool gets its share of
      the cores instead, unless the user set ``TORCHINDUCTOR_COMPILE_THREADS``. (The
      program inductor generates does not depend on it.)

    On the CPU nothing is added: there is no device memory, and the host lock and the
    thread settings of the session already share the cores.

    >>> shared_device_env("gpu", {})
    {'XLA_PYTHON_CLIENT_PREALLOCATE': 'false'}
    >>> shared_device_env("gpu", {"XLA_PYTHON_CLIENT_MEM_FRACTION": ".1"})
    {}
    >>> shared_device_env("gpu", {}, workers=6, cores=16)
    {'XLA_PYTHON_CLIENT_PREALLOCATE': 'false', 'TORCHINDUCTOR_COMPILE_THREADS': '2'}
    >>> shared_device_env("cpu", {}, workers=6, cores=16)
    {}
    """
    if accel in ("cpu", "external"):
        return {}
    env: dict[str, str] = {}
    if not any(name in environ for name in _JAX_MEMORY_ENV):
        env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    if workers > 1 and "TORCHINDUCTOR_COMPILE_THREADS" not in environ:
        cores = cores if cores is not None else (os.cpu_count() or 1)
        env["TORCHINDUCTOR_COMPILE_THREADS"] = str(max(1, cores // workers))
    return env


def plugin_root() -> str:
    """The folder the plugin's package is in: first on every worker's ``PYTHONPATH``, so
    that both arms, in whatever environment, run this plugin."""
    return str(Path(__file__).resolve().parents[2])


def start_arm(setup: Setup, listener: Listener, authkey: bytes, log: Path,
              revision: str = "", workers: int = 2, python: str | None = None) -> Arm:
    """Start the worker process of ``setup.arm`` in its tree, its output going to ``log``,
    and wait (at most ``setup.prepare_timeout`` seconds) until it connects to ``listener``.
    The plugin is imported from where this process has it, in both arms; everything else
    from the arm's ``sys.path``. ``revision`` names the arm's revision in messages;
    ``workers`` is how many workers share the device (:func:`shared_device_env`).
    ``python``: the interpreter of another environment (default: this one's), whose own
    site-packages then replace this one's on the worker's path (``Setup.env_path``)."""
    env = {**os.environ, ADDRESS_ENV: str(listener.address), AUTHKEY_ENV: authkey.hex(),
           SETUP_ENV: json.dumps(setup.__dict__), "PYTHONPATH": plugin_root(),
           PAIR_ENV: str(setup.pair), **shared_device_env(setup.accel, os.environ, workers)}
    if python is not None:  # not this environment's: its own variables would point here
        for name in ("VIRTUAL_ENV", "PYTHONHOME", "CONDA_PREFIX"):
            env.pop(name, None)
    command = list(WORKER_COMMAND) if python is None else [python, *WORKER_COMMAND[1:]]
    revision_text = f", revision {revision}" if revision else ""
    with log.open("wb") as out:
        try:
            proc = subprocess.Popen(command, cwd=setup.tree, env=env, stdin=subprocess.DEVNULL,
                                    stdout=out, stderr=subprocess.STDOUT)
        except OSError as exc:  # its interpreter is gone: one line, not a traceback
            raise CompareError(f"the {setup.arm} worker (pair {setup.pair}{revision_text}) "
                               f"could not start {command[0]}: {exc.strerror}") from None
    who = f"the {setup.arm} worker (pair {setup.pair}, pid {proc.pid}{revision_text})"
    conn = _accept(listener, proc, who, log, setup.prepare_timeout)
    return Arm(setup.arm, proc, conn, log, revision=revision, pair=setup.pair)
