"""Hangs: a step that blocks past --accelperf-timeout is interrupted (or, where it cannot be,
the process ends cleanly with what was recorded), and the host lock says whom it waits for
and gives up after --accelperf-host-lock-timeout."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

import pytest
from conftest import Suite

from pytest_accelperf.gate import hangs
from pytest_accelperf.gate.hangs import (
    CaseTimeout,
    HostLockStuck,
    HostLockTimeout,
    case_alarm,
    host_lock,
)

needs_alarm = pytest.mark.skipif(not hasattr(signal, "setitimer"), reason="no SIGALRM timer")


class Mine(Exception):
    """What the test's own SIGALRM handler raises."""


def _mine(signum: int, frame: FrameType | None) -> None:
    raise Mine


@pytest.fixture
def own_handler() -> Iterator[None]:
    """A SIGALRM handler of the test's own (as pytest-timeout installs one), removed after."""
    previous = signal.signal(signal.SIGALRM, _mine)
    yield
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, previous)


# -- the alarm on its own ------------------------------------------------------------------

@needs_alarm
def test_alarm_interrupts_a_blocking_call_and_restores_the_handler(own_handler: None) -> None:
    start = time.monotonic()
    with pytest.raises(CaseTimeout) as info, case_alarm(0.2, grace=0.1) as alarm:
        time.sleep(30)
    assert time.monotonic() - start < 5
    assert alarm.armed and alarm.fired
    assert re.fullmatch(r"test_alarm_interrupts_a_blocking_call_and_restores_the_handler "
                        r"\(test_hangs\.py:\d+\)", info.value.where)
    assert signal.getsignal(signal.SIGALRM) is _mine
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


@needs_alarm
def test_an_earlier_alarm_of_someone_else_is_left_alone(own_handler: None) -> None:
    signal.setitimer(signal.ITIMER_REAL, 0.3)
    with pytest.raises(Mine), case_alarm(60) as alarm:
        assert not alarm.armed and "goes off sooner" in alarm.skipped
        time.sleep(30)


@needs_alarm
def test_a_later_alarm_of_someone_else_is_put_back(own_handler: None) -> None:
    signal.setitimer(signal.ITIMER_REAL, 30)
    with pytest.raises(CaseTimeout), case_alarm(0.2, grace=0.1) as alarm:
        assert alarm.armed
        time.sleep(30)
    assert signal.getsignal(signal.SIGALRM) is _mine
    assert 25 < signal.getitimer(signal.ITIMER_REAL)[0] <= 30


@needs_alarm
def test_a_finished_block_leaves_no_alarm_behind(own_handler: None) -> None:
    with case_alarm(0.2, grace=0.1) as alarm:
        pass
    assert alarm.armed and not alarm.fired
    time.sleep(0.5)  # the alarm would have gone off by now
    assert signal.getsignal(signal.SIGALRM) is _mine


def test_no_alarm_outside_the_main_thread() -> None:
    seen: list[hangs.Alarm] = []

    def body() -> None:
        with case_alarm(0.1, grace=0) as alarm:
            time.sleep(0.4)
        seen.append(alarm)

    thread = threading.Thread(target=body)
    thread.start()
    thread.join()
    assert not seen[0].armed and "main thread" in seen[0].skipped


@needs_alarm
def test_watchdog_reports_a_case_that_does_not_stop(own_handler: None) -> None:
    """A case that goes on after the interrupt (here: it swallows it; in life, a native call
    that never returns to Python) is handed to ``on_stuck``, from another thread."""
    stuck: list[tuple[bool, str]] = []
    with case_alarm(0.1, lambda a: stuck.append((a.fired, threading.current_thread().name)),
                    grace=0.1, native_grace=0.3):
        try:
            time.sleep(30)
        except CaseTimeout:
            time.sleep(1.0)
    assert stuck == [(True, "accelperf-watchdog")]


# -- end to end: a step that blocks ----------------------------------------------------------

BLOCKING_SUITE = '''
import dataclasses
import time
from tinytask import make_task
from pytest_accelperf import cases

@cases(backend="jax", batch=[8], steps=10, warmup=1)
def test_blocks(accelperf):
    task = make_task(accelperf.case)
    inner = task.make_batch

    def make_batch(step):
        if step == 3:
            time.sleep(1000)  # a data source that never answers
        return inner(step)

    accelperf.train(dataclasses.replace(task, make_batch=make_batch))

@cases(backend="jax", batch=[8], steps=4, warmup=1, label="after")
def test_after(accelperf):
    accelperf.train(make_task(accelperf.case))
'''


#: The inner sessions' --accelperf-timeout. It bounds the whole case (compile and steps), and
#: three steps must clear it before the blocking one: at 3 s a loaded CI host ran one step.
TIMEOUT_S = 8


@pytest.mark.slow
@pytest.mark.timing
def test_a_step_blocked_in_python_times_out_and_the_session_goes_on(suite: Suite) -> None:
    suite.write(BLOCKING_SUITE)
    # A subprocess, so that a hang (the behaviour before) fails this test instead of
    # hanging it, and so that the alarm is the inner session's own.
    start = time.monotonic()
    result = suite.pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", f"--accelperf-timeout={TIMEOUT_S}", "--accelperf-update",
        "--accelperf-json=report.json", timeout=150)
    assert time.monotonic() - start < 100
    result.assert_outcomes(failed=1, passed=1)
    result.stdout.fnmatch_lines([
        "*not recorded as a baseline: the run ended with outcome timeout (exceeded the "
        f"{TIMEOUT_S} s timeout after 3 of 11 steps: a step "
        "blocked and was interrupted after * s, in make_batch (test_suite.py:13)*"])
    elapsed = re.search(r"interrupted after (\d+) s", result.stdout.str())
    assert (elapsed is not None
            and TIMEOUT_S <= int(elapsed.group(1)) <= TIMEOUT_S + hangs.ALARM_GRACE_S + 3)
    runs = {c["case_id"]: c["run"] for c in suite.report()["cases"]}
    blocked = runs["jax-nomesh-b8"]
    assert blocked["outcome"] == "timeout"
    assert len(blocked["losses"]) == 3 and blocked["loss_steps"] == [0, 1, 2]
    assert len(blocked["step_times"]) == 2  # steps 1 and 2; step 0 was warm-up
    assert runs["jax-nomesh-b8-after"]["outcome"] == "ok"
    assert list(suite.load()["cases"]) == ["test_after[jax-nomesh-b8-after]"]


# A step whose device computation runs for minutes, which XLA cannot cancel: "device" waits
# in jax's block_until_ready (interruptible, but the device stays busy), "native" in
# np.asarray, a native wait that never returns to Python before the computation ends.
NATIVE_SUITE = '''
import dataclasses
import jax
import jax.numpy as jnp
import numpy as np
from tinytask import make_task
from pytest_accelperf import cases

@jax.jit
def spin(n):
    return jax.lax.fori_loop(0, n, lambda i, v: jnp.sin(v) + 1e-3, jnp.ones((64,)))

@cases(backend="jax", batch=[8], steps=4, warmup=1, label="first")
def test_first(accelperf):
    accelperf.train(make_task(accelperf.case))

@cases(backend="jax", batch=[8], steps=10, warmup=1)
def test_spins(accelperf):
    task = make_task(accelperf.case)
    inner_batch, inner_loss = task.make_batch, task.loss_fn

    def make_batch(step):
        batch = inner_batch(step)
        if WHERE == "native" and step == 3:
            np.asarray(spin(2**30))
        batch["spin"] = np.full((8,), 2**30 if WHERE == "device" and step == 3 else 1,
                                np.int32)
        return batch

    def loss_fn(params, batch):
        x = jax.lax.fori_loop(0, batch["spin"].max(), lambda i, v: jnp.sin(v) + 1e-3,
                              jnp.ones((64,)))
        return inner_loss(params, batch) + 0.0 * x.sum()

    accelperf.train(dataclasses.replace(task, make_batch=make_batch, loss_fn=loss_fn))

@cases(backend="jax", batch=[8], steps=4, warmup=1, label="never")
def test_never(accelperf):
    accelperf.train(make_task(accelperf.case))
'''


@pytest.mark.slow
@pytest.mark.timing
@pytest.mark.parametrize("where, why", [
    ("device", "a device computation of it, which cannot be cancelled, was still running "
               "(the next case would wait behind it)"),
    ("native", "it is inside a native call * that does not return to Python, where it "
               "cannot be interrupted"),
])
def test_a_step_that_cannot_be_interrupted_ends_the_process_cleanly(
        suite: Suite, where: str, why: str) -> None:
    suite.write(NATIVE_SUITE.replace("WHERE", repr(where)))
    start = time.monotonic()
    result = suite.pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", f"--accelperf-timeout={TIMEOUT_S}", "--accelperf-update",
        "--accelperf-json=report.json", timeout=150)
    assert time.monotonic() - start < 100
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stderr.fnmatch_lines([
        "accelperf: ERROR: test_suite.py::test_spins?jax-nomesh-b8?: exceeded the "
        f"{TIMEOUT_S} s timeout after 3 of 11 steps and could not be stopped: {why}, * s in. "
        "The pytest process was ended with what was recorded; the cases after this one did "
        "not run*",
        "accelperf: 2 case(s) on cpu-x8: * new, 1 error",
        "accelperf: baselines written to baselines/cpu-x8/test_suite.json",
    ])
    report = suite.report()
    assert report["exit_status"] == pytest.ExitCode.INTERRUPTED
    runs = {c["case_id"]: c["run"] for c in report["cases"]}
    assert set(runs) == {"jax-nomesh-b8-first", "jax-nomesh-b8"}  # test_never never ran
    assert runs["jax-nomesh-b8"]["outcome"] == "timeout"
    assert len(runs["jax-nomesh-b8"]["losses"]) == 3
    assert list(suite.load()["cases"]) == ["test_first[jax-nomesh-b8-first]"]


# -- the host lock ---------------------------------------------------------------------------

HOLDER = '''
import sys, time
from pathlib import Path
from pytest_accelperf.gate.hangs import host_lock

bound = float(sys.argv[3]) if len(sys.argv) > 3 else None  # its case's timeout
with host_lock("test_other.py::test_holder[jax-nomesh-b8]", None, print,
               directory=Path(sys.argv[1]), hold_timeout=bound):
    print("held", flush=True)
    time.sleep(float(sys.argv[2]))
'''


@pytest.fixture
def holder(tmp_path: Path) -> Iterator[tuple[Path, subprocess.Popen[str]]]:
    """Another process holding the host lock in ``tmp_path`` for 60 s."""
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path), "60"],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    yield tmp_path, proc
    proc.kill()
    proc.communicate()


def test_the_holder_names_itself_and_a_waiter_gives_up_naming_it(
        holder: tuple[Path, subprocess.Popen[str]], monkeypatch: pytest.MonkeyPatch) -> None:
    directory, proc = holder
    sidecar = json.loads((directory / f"{hangs.HOST_LOCK_NAME}.holder").read_text())
    assert sidecar["pid"] == proc.pid
    assert sidecar["case"] == "test_other.py::test_holder[jax-nomesh-b8]"
    monkeypatch.setattr(hangs, "NOTICE_AFTER_S", 0.3)
    said: list[str] = []
    start = time.monotonic()
    with pytest.raises(HostLockTimeout) as info, host_lock("mine", 1.5, said.append,
                                                           directory=directory):
        pytest.fail("the lock is held by the other process")
    assert 1.4 < time.monotonic() - start < 10
    holder_text = f"pid {proc.pid} (case test_other.py::test_holder[jax-nomesh-b8], holding it"
    assert len(said) == 1
    assert said[0].startswith(f"accelperf: mine is waiting for the CPU host lock "
                              f"{directory / hangs.HOST_LOCK_NAME}, held by {holder_text}")
    assert said[0].endswith("; giving up after 1.5 s")
    message = str(info.value)
    assert message.startswith(f"mine: gave up waiting for the CPU host lock "
                              f"{directory / hangs.HOST_LOCK_NAME} after 1.5 s: it is held "
                              f"by {holder_text}")
    assert "raise --accelperf-host-lock-timeout (0 waits forever)" in message


def test_the_lock_is_taken_once_free_and_the_sidecar_removed(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch
                                                              ) -> None:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path), "1.5"],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    monkeypatch.setattr(hangs, "NOTICE_AFTER_S", 0.2)
    said: list[str] = []
    sidecar = tmp_path / f"{hangs.HOST_LOCK_NAME}.holder"
    with host_lock("mine", None, said.append, directory=tmp_path):  # None: wait forever
        assert json.loads(sidecar.read_text())["pid"] == os.getpid()
    assert not sidecar.exists()
    assert len(said) == 1 and "giving up" not in said[0]
    proc.communicate()


def test_a_dead_holders_sidecar_is_not_believed(tmp_path: Path) -> None:
    lock = tmp_path / hangs.HOST_LOCK_NAME
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    hangs.holder_path(lock).write_text(json.dumps({
        "pid": int(dead.stdout), "case": "old", "since": 0.0, "host": socket.gethostname()}))
    assert hangs.describe_holder(lock) == (
        f"a process that did not say who it is (the last holder recorded, pid "
        f"{int(dead.stdout)}, has exited)")


def test_a_killed_holder_frees_the_lock_at_once(tmp_path: Path) -> None:
    """The lock is the kernel's (flock): a holder killed with SIGKILL holds nothing, and its
    holder file, left behind, is replaced by the next holder's. (True before issue 30 too:
    kept as a guard, the lock being filelock's to implement.)"""
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path), "60"],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    proc.kill()
    proc.communicate()
    sidecar = tmp_path / f"{hangs.HOST_LOCK_NAME}.holder"
    assert json.loads(sidecar.read_text())["pid"] == proc.pid  # left behind
    said: list[str] = []
    start = time.monotonic()
    with host_lock("mine", 30, said.append, directory=tmp_path):
        assert time.monotonic() - start < 1
        assert json.loads(sidecar.read_text())["pid"] == os.getpid()
    assert said == []


def test_a_holder_file_that_is_garbage_names_nobody_and_breaks_nothing(
        holder: tuple[Path, subprocess.Popen[str]], monkeypatch: pytest.MonkeyPatch) -> None:
    """Anything may be in the holder file (a crash mid-write, another program): the wait
    goes on as the lock says, and the holder is not made up from it."""
    directory, proc = holder
    lock = directory / hangs.HOST_LOCK_NAME
    sidecar = hangs.holder_path(lock)
    here = socket.gethostname()
    # a pid too large for os.kill: the wait used to end in OverflowError, our traceback
    sidecar.write_text(f'{{"pid": 99999999999999999999, "case": "c", "since": 0, '
                       f'"host": "{here}"}}')
    monkeypatch.setattr(hangs, "NOTICE_AFTER_S", 0.2)
    said: list[str] = []
    with (pytest.raises(HostLockTimeout, match="held by a process that did not say who it is"),
          host_lock("mine", 0.6, said.append, directory=directory)):
        pytest.fail("the lock is held by the other process")
    assert len(said) == 1 and "did not say who it is" in said[0]
    nobody = {
        b"\xff\xfe": "its holder file is not JSON: b'\\xff\\xfe'",
        b"[" * 5000: "its holder file is not JSON: b'" + "[" * 40 + "'",  # too deep to parse
        b"[1]": "its holder file is not what a holder writes: b'[1]'",
        b'{"pid": true, "case": "c"}': "its holder file is not what a holder writes: "
                                       "b'{\"pid\": true, \"case\": \"c\"}'",
    }
    for pid in ("99999999999999999999", "-1", "0", "1e400"):
        text = f'{{"pid": {pid}, "case": "c", "since": 0, "host": "{here}"}}'.encode()
        nobody[text] = f"its holder file is not what a holder writes: {text[:40]!r}"
    for text, why in nobody.items():
        sidecar.write_bytes(text)
        assert hangs.describe_holder(lock) == f"a process that did not say who it is ({why})"
    for since in ("1e308", "-1e308", "NaN"):  # when it took the lock: not a time
        sidecar.write_text(f'{{"pid": {proc.pid}, "case": "c", "since": {since}, '
                           f'"host": "{here}"}}')
        assert hangs.describe_holder(lock) == f"pid {proc.pid} (case c)"


def test_a_lock_path_that_is_no_lock_file_fails_the_case_at_once_naming_it(
        suite: Suite, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A directory where the lock file should be (or a symlink loop) is not a lock anyone
    holds: no wait, and one line naming the path, not a traceback."""
    locks = tmp_path / "locks"
    (locks / hangs.HOST_LOCK_NAME).mkdir(parents=True)
    monkeypatch.setattr(hangs, "HOST_LOCK_DIR", locks)
    suite.write('''
        from tinytask import make_task
        from pytest_accelperf import cases

        @cases(backend="jax", batch=[8], steps=3, warmup=1)
        def test_locked_out(accelperf):
            accelperf.train(make_task(accelperf.case))
    ''')
    result = suite.run("--accelperf-json=report.json")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["test_suite.py::test_locked_out?jax-nomesh-b8?: cannot take "
                                 "the CPU host lock *: Is a directory. Every session *"])
    assert "Traceback" not in result.stdout.str()
    assert "IsADirectoryError" not in result.stdout.str()
    (case,) = suite.report()["cases"]
    assert case["run"]["outcome"] == "error" and "cannot take" in case["error"]
    start = time.monotonic()
    with (pytest.raises(hangs.HostLockError) as info,
          host_lock("mine", 30, print, directory=locks)):
        pytest.fail("the lock was taken")
    assert time.monotonic() - start < 1
    assert str(info.value) == (
        f"mine: cannot take the CPU host lock {locks / hangs.HOST_LOCK_NAME}: Is a directory. "
        f"Every session on this machine locks that one file: make it a file this user can "
        f"open for writing (remove what is there; a session creates it again)")


@pytest.mark.skipif(not os.access("/tmp", os.W_OK), reason="no writable /tmp here")
def test_the_lock_lives_in_one_place_whatever_tmpdir_says() -> None:
    """Sessions with different $TMPDIR on one machine must still exclude each other; only
    $ACCELPERF_HOST_LOCK_DIR moves the lock (under xdist, this worker's own: conftest.py)."""
    code = "from pytest_accelperf.gate.hangs import HOST_LOCK_DIR; print(HOST_LOCK_DIR)"
    machine = {k: v for k, v in os.environ.items() if k != "ACCELPERF_HOST_LOCK_DIR"}
    dirs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           check=True, env={**machine, "TMPDIR": str(tmp)}).stdout.strip()
            for tmp in (Path.cwd(), Path.home())}
    assert dirs == {"/tmp"}
    moved = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           check=True, env={**machine, "ACCELPERF_HOST_LOCK_DIR": str(Path.home())})
    assert moved.stdout.strip() == str(Path.home())


def test_a_case_that_waits_too_long_fails_naming_the_holder(
        suite: Suite, holder: tuple[Path, subprocess.Popen[str]],
        monkeypatch: pytest.MonkeyPatch) -> None:
    directory, proc = holder
    monkeypatch.setattr(hangs, "HOST_LOCK_DIR", directory)
    monkeypatch.setattr(hangs, "NOTICE_AFTER_S", 0.5)
    suite.write('''
        from tinytask import make_task
        from pytest_accelperf import cases

        @cases(backend="jax", batch=[8], steps=3, warmup=1)
        def test_waits(accelperf):
            accelperf.train(make_task(accelperf.case))
    ''')
    result = suite.run("--accelperf-host-lock-timeout=2", "--accelperf-json=report.json")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        f"accelperf: test_suite.py::test_waits?jax-nomesh-b8? is waiting for the CPU host "
        f"lock {directory}*, held by pid {proc.pid} (case test_other.py::test_holder*); "
        f"giving up after 2 s",
        f"test_suite.py::test_waits?jax-nomesh-b8?: gave up waiting for the CPU host lock "
        f"* after 2 s: it is held by pid {proc.pid} *--accelperf-host-lock-timeout*",
    ])
    assert "Traceback" not in result.stdout.str()
    (case,) = suite.report()["cases"]
    assert case["run"]["outcome"] == "error" and "gave up waiting" in case["error"]


# -- a holder known to be stuck is not waited for ----------------------------------------------
def _hold(directory: Path, seconds: float, bound: float | None = None
          ) -> subprocess.Popen[str]:
    """Another process holding the host lock in ``directory`` for ``seconds``, its holder
    file saying that its case may hold it ``bound`` seconds."""
    args = [sys.executable, "-c", HOLDER, str(directory), str(seconds)]
    proc = subprocess.Popen(args + ([str(bound)] if bound is not None else []),
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def test_a_stopped_holder_is_not_waited_for(tmp_path: Path) -> None:
    """A session suspended with Ctrl-Z keeps the lock until it is resumed: a waiter names
    it and what to do at once, instead of waiting out its timeout."""
    proc = _hold(tmp_path, 60)
    try:
        lock = tmp_path / hangs.HOST_LOCK_NAME
        assert hangs.lock_owners(lock) == {proc.pid}  # the kernel's word, not the file's
        assert hangs.stuck_holder(lock) is None  # running: waited for
        os.kill(proc.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 10  # a signal is delivered soon, not at once
        while hangs._state(proc.pid) != "T" and time.monotonic() < deadline:
            time.sleep(0.01)
        start = time.monotonic()
        said: list[str] = []
        with pytest.raises(HostLockStuck) as info, host_lock("mine", 30, said.append,
                                                             directory=tmp_path):
            pytest.fail("the lock is held by the stopped process")
        assert time.monotonic() - start < 1
        assert said == []
        assert str(info.value) == (
            f"mine: not waiting for the CPU host lock {lock}: pid {proc.pid} (case "
            f"test_other.py::test_holder[jax-nomesh-b8]) is stopped (Ctrl-Z, SIGSTOP or a "
            f"debugger) and keeps it until it is resumed: resume it (kill -CONT {proc.pid}) "
            f"or end it (kill {proc.pid}). CPU cases of all sessions on this machine train "
            f"one at a time")
        os.kill(proc.pid, signal.SIGCONT)
        assert hangs.stuck_holder(lock) is None
    finally:
        proc.kill()
        proc.communicate()


def test_a_holder_past_its_case_timeout_is_stuck_and_one_within_it_is_waited_for(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A holder whose case may hold the lock 1 s (its --accelperf-timeout) still holding it
    past that and the grace its own alarm and watchdog need is stuck: a waiter that was
    waiting stops at the next look, one that comes later does not wait at all. A holder
    within its bound is waited for, up to --accelperf-host-lock-timeout."""
    monkeypatch.setattr(hangs, "STUCK_GRACE_S", 1.0)
    monkeypatch.setattr(hangs, "POLL_S", 0.2)
    lock = tmp_path / hangs.HOST_LOCK_NAME
    within = _hold(tmp_path, 60, bound=600)
    try:
        assert json.loads(hangs.holder_path(lock).read_text())["timeout"] == 600
        with pytest.raises(HostLockTimeout), host_lock("mine", 2.5, print, directory=tmp_path):
            pytest.fail("the lock is held")
    finally:
        within.kill()
        within.communicate()
    proc = _hold(tmp_path, 60, bound=1)
    try:
        start = time.monotonic()
        with pytest.raises(HostLockStuck) as info, host_lock("mine", 30, print,
                                                             directory=tmp_path):
            pytest.fail("the lock is held by the stuck process")
        waited = time.monotonic() - start
        assert 1.5 < waited < 10  # 1 s of bound, 1 s of grace; not the 30 s of the wait
        assert str(info.value).startswith(
            f"mine: not waiting for the CPU host lock {lock}: pid {proc.pid} (case "
            f"test_other.py::test_holder[jax-nomesh-b8]) has held it for ")
        assert (f", past its case's 1 s timeout (--accelperf-timeout), after which a case is "
                f"ended within 1 s: it is stuck; end it (kill {proc.pid})") in str(info.value)
        start = time.monotonic()
        with pytest.raises(HostLockStuck), host_lock("later", 30, print, directory=tmp_path):
            pytest.fail("the lock is held by the stuck process")
        assert time.monotonic() - start < 1
    finally:
        proc.kill()
        proc.communicate()


def test_a_holder_file_naming_a_process_that_holds_no_lock_is_not_stuck(
        holder: tuple[Path, subprocess.Popen[str]]) -> None:
    """A holder file left behind (its pid since reused by another process, here this one)
    says nothing about who holds the lock now: only the kernel's owner is judged."""
    directory, proc = holder
    lock = directory / hangs.HOST_LOCK_NAME
    hangs.holder_path(lock).write_text(json.dumps({
        "pid": os.getpid(), "case": "old", "since": 1.0, "timeout": 1.0,
        "host": socket.gethostname()}))
    assert hangs.lock_owners(lock) == {proc.pid}
    assert hangs.stuck_holder(lock) is None
    with pytest.raises(HostLockTimeout), host_lock("mine", 0.5, print, directory=directory):
        pytest.fail("the lock is held by the other process")
    hangs.holder_path(lock).write_text(json.dumps({
        "pid": proc.pid, "case": "c", "since": 1.0, "timeout": 1.0, "host": "elsewhere"}))
    assert hangs.stuck_holder(lock) is None  # another host's pid means nothing here


def test_a_session_s_holder_file_says_its_case_timeout(
        suite: Suite, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What a waiter judges a holder by: a session's holder file carries its
    --accelperf-timeout (read here by a command that runs holding the lock, as a training
    does)."""
    locks = tmp_path / "locks"
    locks.mkdir()
    monkeypatch.setattr(hangs, "HOST_LOCK_DIR", locks)
    suite.write(f'''
        import json
        from pathlib import Path
        from pytest_accelperf import Run, cases

        def parse(text, source):
            Path("holder.json").write_text(text)
            return [Run(case_id="x", samples_per_step=8, step_times=[0.01] * 5,
                        losses=[1.0] * 5, loss_steps=list(range(5)))]

        @cases(backend="external", batch=[8])
        def test_holder(accelperf):
            accelperf.ingest(["cat", "{locks / hangs.HOST_LOCK_NAME}.holder"], parser=parse)
    ''')
    suite.run("--accelperf-update", "--accelperf-timeout=77").assert_outcomes(passed=1)
    holder = json.loads((suite.pytester.path / "holder.json").read_text())
    assert holder["timeout"] == 77 and holder["pid"] == os.getpid()
    assert holder["case"] == "test_suite.py::test_holder[external-nomesh-b8]"
