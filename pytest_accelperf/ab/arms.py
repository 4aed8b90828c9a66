"""The controller's side of an A/B worker (:mod:`pytest_accelperf.ab.worker`): start one
arm's process (``python -m pytest_accelperf.ab.worker``, told its setup through the
environment), wait for it to connect, ask it to do something and wait for the answer within
a deadline, and stop it. A worker that dies or hangs is a :class:`~pytest_accelperf.ab.
CompareError` that quotes the end of its output.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from multiprocessing.connection import Connection, Listener
from pathlib import Path
from typing import Any

import pytest_accelperf
from pytest_accelperf.ab import CompareError
from pytest_accelperf.ab.worker import ADDRESS_ENV, AUTHKEY_ENV, PAIR_ENV, SETUP_ENV, Setup

#: Seconds a worker may take to start, import a suite and compile a case's step.
PREPARE_TIMEOUT_S = 600.0
#: Seconds one block of steps may take before the worker is declared hung.
BLOCK_TIMEOUT_S = 300.0
#: What starts an arm's process (run in the arm's tree, the plugin first on its path).
WORKER_COMMAND = (sys.executable, "-m", "pytest_accelperf.ab.worker")


@dataclass
class Arm:
    """One arm's worker process, the connection to it, and the file its output goes to."""

    name: str
    proc: subprocess.Popen[bytes]
    conn: Connection
    log: Path

    def call(self, timeout: float, op: str, *args: Any) -> Any:
        """Ask the worker to do ``op`` and wait (at most ``timeout`` seconds) for its
        answer."""
        __tracebackhide__ = True
        self.send(op, *args)
        return self.answer(timeout, op)

    def send(self, op: str, *args: Any) -> None:
        """Ask the worker to do ``op``, without waiting: :meth:`answer` collects the reply
        (so that several workers can work at once)."""
        __tracebackhide__ = True
        try:
            self.conn.send((op, *args))
        except (OSError, BrokenPipeError):
            code = self.proc.poll()
            raise CompareError(f"the {self.name} worker (pid {self.proc.pid}) died (exit "
                               f"{code}) before {op!r}. {self._tail()}") from None

    def answer(self, timeout: float, op: str) -> Any:
        """The worker's reply to the ``op`` sent last, within ``timeout`` seconds."""
        __tracebackhide__ = True
        try:
            deadline = time.monotonic() + timeout
            while not self.conn.poll(0.2):
                if self.proc.poll() is not None:
                    raise EOFError
                if time.monotonic() > deadline:
                    raise CompareError(f"the {self.name} worker (pid {self.proc.pid}) did not "
                                       f"answer {op!r} within {timeout:g} s; it was stopped. "
                                       f"{self._tail()}")
            reply = self.conn.recv()
        except (EOFError, OSError, BrokenPipeError):
            code = self.proc.poll()
            raise CompareError(f"the {self.name} worker (pid {self.proc.pid}) died (exit "
                               f"{code}) during {op!r}. {self._tail()}") from None
        if reply[0] == "error":
            raise CompareError(f"the {self.name} revision's worker failed in {op!r}: "
                               f"{reply[1]}\n{reply[2]}")
        return reply[1]

    def _tail(self) -> str:
        try:
            text = self.log.read_text(errors="replace").strip()
        except OSError:
            return ""
        return f"Its output ends: {text[-800:]}" if text else ""

    def stop(self) -> None:
        try:
            if self.proc.poll() is None:
                self.conn.send(("stop",))
                self.proc.wait(timeout=10)
        except (OSError, EOFError, subprocess.TimeoutExpired):
            pass
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.conn.close()


def _accept(listener: Listener, proc: subprocess.Popen[bytes], arm: str,
            log: Path) -> Connection:
    """The worker's connection, or a CompareError when it dies before connecting."""
    box: dict[str, Any] = {}

    def accept() -> None:
        try:
            box["conn"] = listener.accept()
        except OSError as exc:  # the listener was closed
            box["error"] = exc

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    deadline = time.monotonic() + PREPARE_TIMEOUT_S
    while thread.is_alive():
        thread.join(0.2)
        if proc.poll() is not None and thread.is_alive():
            listener.close()
            thread.join()
            raise CompareError(f"the {arm} worker exited ({proc.returncode}) before "
                               f"connecting: {log.read_text(errors='replace')[-800:]}")
        if time.monotonic() > deadline:
            proc.kill()
            listener.close()
            raise CompareError(f"the {arm} worker did not connect within "
                               f"{PREPARE_TIMEOUT_S:g} s")
    if "conn" not in box:
        raise CompareError(f"the {arm} worker could not connect: {box.get('error')}")
    conn: Connection = box["conn"]
    return conn


#: What JAX does with an accelerator's memory at start-up: it takes 75 % of it at once.
_JAX_MEMORY_ENV = ("XLA_PYTHON_CLIENT_PREALLOCATE", "XLA_PYTHON_CLIENT_MEM_FRACTION",
                   "XLA_PYTHON_CLIENT_ALLOCATOR")


def shared_device_env(accel: str, environ: Mapping[str, str]) -> dict[str, str]:
    """The environment that lets every A/B worker share one accelerator: all of them (two
    per process pair) run on the same GPU, and JAX's default of taking 75 % of the device's
    memory when a process starts fits one worker, not ten (on an H100 the comparison never
    got past preparing its cases). Workers then allocate as they go, in both arms alike;
    where the user set any of JAX's memory variables, theirs stand and nothing is added.

    >>> shared_device_env("gpu", {})
    {'XLA_PYTHON_CLIENT_PREALLOCATE': 'false'}
    >>> shared_device_env("gpu", {"XLA_PYTHON_CLIENT_MEM_FRACTION": ".1"})
    {}
    >>> shared_device_env("cpu", {})
    {}
    """
    if accel in ("cpu", "external") or any(name in environ for name in _JAX_MEMORY_ENV):
        return {}
    return {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}


def plugin_root() -> str:
    """The folder the plugin's package is in: first on every worker's ``PYTHONPATH``, so
    that both arms, in whatever environment, run this plugin."""
    return str(Path(pytest_accelperf.__file__).resolve().parents[1])


def start_arm(setup: Setup, listener: Listener, authkey: bytes, log: Path,
              python: str | None = None) -> Arm:
    """Start the worker process of ``setup.arm`` in its tree, its output going to ``log``,
    and wait until it connects to ``listener``. The plugin is imported from where this
    process has it, in both arms; everything else from the arm's ``sys.path``. ``python``:
    the interpreter of another environment (default: this one's), whose own site-packages
    then replace this one's on the worker's path (``Setup.env_path``)."""
    env = {**os.environ, ADDRESS_ENV: str(listener.address), AUTHKEY_ENV: authkey.hex(),
           SETUP_ENV: json.dumps(setup.__dict__), "PYTHONPATH": plugin_root(),
           PAIR_ENV: str(setup.pair), **shared_device_env(setup.accel, os.environ)}
    if python is not None:  # not this environment's: its own variables would point here
        for name in ("VIRTUAL_ENV", "PYTHONHOME", "CONDA_PREFIX"):
            env.pop(name, None)
    command = list(WORKER_COMMAND) if python is None else [python, *WORKER_COMMAND[1:]]
    with log.open("wb") as out:
        proc = subprocess.Popen(command, cwd=setup.tree, env=env,
                                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
    conn = _accept(listener, proc, setup.arm, log)
    return Arm(setup.arm, proc, conn, log)
