"""Every wait of A/B mode's prepare has a deadline (issue 38): a worker that never connects,
exits before connecting, or never answers ``prepare`` ends within it, and the message names
the worker (arm, pair, pid), the revision and the end of that worker's output. Real
processes throughout: the stand-in for a worker that never connects is a Python process
that prints and sleeps."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from multiprocessing.connection import Listener
from pathlib import Path

import pytest
from conftest import Suite

from pytest_accelperf.ab import CompareError, arms
from pytest_accelperf.ab.arms import log_tail, shared_device_env, start_arm
from pytest_accelperf.ab.tree import socket_dir
from pytest_accelperf.ab.worker import Setup


def _setup(tmp_path: Path, timeout: float) -> Setup:
    return Setup(arm="base", tree=str(tmp_path), head_root=str(tmp_path), sys_path=sys.path,
                 accel="cpu", cpu_devices=1, platform=None, pair=1, prepare_timeout=timeout)


def _start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: str,
           timeout: float) -> tuple[CompareError, float, Path]:
    """Start a stand-in worker running ``code`` and wait for it to connect."""
    monkeypatch.setattr(arms, "WORKER_COMMAND", (sys.executable, "-c", code))
    folder = socket_dir("accelperf-test-", "socket")
    listener = Listener(str(folder / "socket"), family="AF_UNIX", authkey=b"k" * 16)
    log = tmp_path / "base-1.log"
    t0 = time.monotonic()
    try:
        with pytest.raises(CompareError) as info:
            start_arm(_setup(tmp_path, timeout), listener, b"k" * 16, log, "main (0123456789)")
    finally:
        listener.close()
    return info.value, time.monotonic() - t0, log


def _pid(message: str) -> int:
    return int(message.split("pid ", 1)[1].split(",", 1)[0])


def test_a_worker_that_never_connects_is_stopped_at_the_deadline(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    code = ("import sys, time\nfor i in range(100):\n    print(f'initializing CUDA {i}', "
            "flush=True)\ntime.sleep(120)")
    error, took, log = _start(tmp_path, monkeypatch, code, timeout=2.0)
    message = str(error)
    assert took < 10
    assert message.startswith("the base worker (pair 1, pid ")
    assert ", revision main (0123456789)) did not connect within 2 s; it was stopped. " \
           f"Its output ({log}) ends:\n..." in message
    assert message.endswith("initializing CUDA 98\ninitializing CUDA 99")
    with pytest.raises(ProcessLookupError):  # killed and reaped
        os.kill(_pid(message), 0)


def test_a_worker_that_exits_before_connecting_is_named_at_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before, the accepting thread was joined without a bound after closing the
    listener, which does not wake it: a worker that died at start hung the session."""
    code = "import sys\nprint('ImportError: libcudart.so.12', flush=True)\nsys.exit(3)"
    error, took, log = _start(tmp_path, monkeypatch, code, timeout=60.0)
    assert took < 10
    assert str(error).endswith(f", revision main (0123456789)) exited (exit 3) before "
                               f"connecting. Its output ({log}) ends:\n"
                               f"ImportError: libcudart.so.12")


def test_the_tail_of_a_log(tmp_path: Path) -> None:
    log = tmp_path / "head-0.log"
    assert log_tail(log) == f"Its output ({log}) cannot be read."
    log.write_text("")
    assert log_tail(log) == f"It printed nothing ({log})."
    log.write_text("".join(f"line {i}\n" for i in range(1000)))
    tail = log_tail(log, chars=30)
    assert tail == f"Its output ({log}) ends:\n...line 997\nline 998\nline 999"


def test_workers_sharing_a_gpu_allocate_as_they_go_and_share_the_compile_cores() -> None:
    assert shared_device_env("gpu", {}, workers=10, cores=16) == {
        "XLA_PYTHON_CLIENT_PREALLOCATE": "false", "TORCHINDUCTOR_COMPILE_THREADS": "1"}
    assert shared_device_env("gpu", {"XLA_PYTHON_CLIENT_PREALLOCATE": "true",
                                     "TORCHINDUCTOR_COMPILE_THREADS": "4"}, workers=10) == {}
    assert shared_device_env("cpu", {}, workers=10, cores=16) == {}


HANGING = '''
import os
import sys
import time

from pytest_accelperf import cases
from tinytask import make_task

if os.environ.get("ACCELPERF_AB_PAIR") is not None:  # in an A/B worker: never prepares
    print("loading the dataset from a mount that does not answer", flush=True)
    time.sleep(600)


@cases(backend="jax", batch=[8], steps=4, warmup=1)
def test_hangs_in_the_workers(accelperf):
    accelperf.train(make_task(accelperf.case))
'''


def _git(path: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.email=ci@example.com", "-c", "user.name=ci", *args],
                   cwd=path, check=True, capture_output=True)


@pytest.mark.slow
def test_a_worker_that_never_answers_prepare_fails_the_case_within_the_deadline(
        suite: Suite) -> None:
    suite.write(textwrap.dedent(HANGING))
    path = suite.pytester.path
    _git(path, "init", "-q")
    _git(path, "add", "-A")
    _git(path, "commit", "-qm", "base")
    t0 = time.monotonic()
    result = suite.run("--accel=cpu", "--accelperf-cpu-devices=1",
                       "--accelperf-compare=HEAD", "--accelperf-compare-processes=1",
                       "--accelperf-compare-prepare-timeout=5", "--accelperf-json=report.json",
                       subprocess=True)
    took = time.monotonic() - t0
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert "A/B comparison with HEAD (" in out
    # the first base worker first finds the test ('locate', then trains the base
    # revision's record of the case): an import that hangs is caught there, within the
    # prepare deadline all the same
    result.stdout.fnmatch_lines([
        "*the base worker (pair 0, pid *, revision HEAD (*)) did not answer 'locate' within "
        "5 s; it was stopped. Its output (*base-0.log) ends:*",
        "*loading the dataset from a mount that does not answer*"])
    assert "Traceback" not in out
    assert took < 120, took


def test_the_prepare_deadline_must_be_positive(suite: Suite) -> None:
    suite.write()
    result = suite.run("--accelperf-compare-prepare-timeout=0")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--accelperf-compare-prepare-timeout=0: expected a number "
                                 "of seconds above 0*"])


def test_a_worker_whose_interpreter_is_gone_is_one_line(tmp_path: Path) -> None:
    """A/B's start once raised FileNotFoundError from Popen (a cached environment's
    bin/python removed); the cache checks its entries now, and the start says it in one
    line where an interpreter is gone all the same."""
    folder = socket_dir("accelperf-test-", "socket")
    listener = Listener(str(folder / "socket"), family="AF_UNIX", authkey=b"k" * 16)
    try:
        with pytest.raises(CompareError) as info:
            start_arm(_setup(tmp_path, 5.0), listener, b"k" * 16, tmp_path / "base-1.log",
                      "HEAD (0123456789)", python=str(tmp_path / "gone" / "bin" / "python"))
    finally:
        listener.close()
    assert str(info.value) == (f"the base worker (pair 1, revision HEAD (0123456789)) could "
                               f"not start {tmp_path}/gone/bin/python: No such file or "
                               f"directory")
