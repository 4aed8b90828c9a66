"""Bounds on the two ways one case can hold up a whole session.

**A step that blocks.** In-process backends check ``--accelperf-timeout`` at step
boundaries, so a step that never ends (a ``make_batch`` waiting on a dead data server, a
``time.sleep`` in the loss) would hang the session. :func:`case_alarm` arms ``SIGALRM`` a
little past the timeout, as pytest-timeout's ``signal`` method does: its handler raises
:class:`CaseTimeout` in the main thread, wherever Python code is running, and the case is
recorded as a ``timeout``. A handler can only run when the interpreter gets control back;
a native call that never returns (an XLA computation that spins, a C extension) does not
give it, so a watchdog thread ends the process cleanly a few seconds later (the caller's
``on_stuck``: write what was recorded, say why, exit). The alarm is armed only in the main
thread (Ray actors and A/B workers call backends elsewhere), never over an alarm that goes
off sooner (pytest-timeout's), and the handler and timer that were there are put back.
:func:`train_in_process` trains a case under them: an interrupted case becomes a
``timeout`` run with the steps it reported (:func:`interrupted_run`), one that cannot be
stopped the run that says why (:func:`stuck_run`).

**The host lock.** CPU cases of every session on a machine train one at a time
(:func:`host_lock`). A session that waits says for whom (pid and case, from a sidecar file
its holder writes) after :data:`NOTICE_AFTER_S`, and gives up after a bound
(``--accelperf-host-lock-timeout``) with an error naming the holder. It does not wait at all
for a holder known to be stuck (:func:`stuck_holder`): one that is stopped (Ctrl-Z), or that
has held the lock past its own case's timeout by more than :data:`STUCK_GRACE_S` (its own
alarm and watchdog end a case seconds after it). A holder that has exited holds nothing:
the lock is the kernel's, released with the process.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import signal
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import FrameType

import filelock

from pytest_accelperf.backends.measure import progress
from pytest_accelperf.backends.protocol import Backend, Task, TrainResult
from pytest_accelperf.collect.cases import Case
from pytest_accelperf.provision.accel import Accelerator
from pytest_accelperf.records.environment import Environment
from pytest_accelperf.records.run import Run

#: Seconds past ``--accelperf-timeout`` at which a blocked step is interrupted: the
#: backend's own check at the next step boundary comes first for a step that merely ends
#: late, and keeps everything it measured (parameters, memory) in the run.
ALARM_GRACE_S = 2.0
#: Seconds past the alarm after which a case still running is taken to be stuck in a
#: native call that the alarm cannot interrupt, and the process is ended.
NATIVE_GRACE_S = 5.0


class CaseTimeout(BaseException):
    """Raised by the alarm in the main thread when a case runs past its timeout.

    A ``BaseException``, as ``KeyboardInterrupt`` is, so that an ``except Exception`` in a
    task or a backend does not swallow it. ``where`` names the function (file:line) that
    was running when it was raised.
    """

    def __init__(self, timeout: float, where: str) -> None:
        super().__init__(f"ran past the {timeout:g} s timeout, interrupted in {where}")
        self.timeout = timeout
        self.where = where


@dataclass
class Alarm:
    """The state of one :func:`case_alarm`: whether it was armed, whether it went off."""

    timeout: float
    armed: bool = False
    fired: bool = False
    started: float = field(default_factory=time.monotonic)
    #: Why it was not armed, when it was not.
    skipped: str = ""
    _active: bool = False


def _frame_text(frame: FrameType | None) -> str:
    if frame is None:
        return "native code"
    code = frame.f_code
    return f"{code.co_name} ({Path(code.co_filename).name}:{frame.f_lineno})"


def _why_not_arm(delay: float) -> str:
    if not hasattr(signal, "setitimer"):
        return "this platform has no SIGALRM interval timer"
    if threading.current_thread() is not threading.main_thread():
        return "not in the main thread, where signal handlers run"
    if signal.getsignal(signal.SIGALRM) is None:
        return "a SIGALRM handler not installed from Python is in place"
    pending, _ = signal.getitimer(signal.ITIMER_REAL)
    if pending and pending <= delay:
        return f"another alarm (pytest-timeout's?) goes off sooner, in {pending:.0f} s"
    return ""


@contextlib.contextmanager
def watchdog(seconds: float, on_stuck: Callable[[], None] | None) -> Iterator[None]:
    """Call ``on_stuck()`` from a daemon thread if the block is still running after
    ``seconds``; the block's end waits for an ``on_stuck`` already running (which is
    expected to end the process). It runs only while the stuck call has released the GIL,
    as native waits (a device computation, I/O) do; nothing in Python can stop a call that
    holds it."""
    if on_stuck is None:
        yield
        return
    lock = threading.Lock()
    active = True

    def fire() -> None:
        with lock:
            if active:
                on_stuck()

    timer = threading.Timer(seconds, fire)
    timer.daemon = True
    timer.name = "accelperf-watchdog"
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        with lock:
            active = False


@contextlib.contextmanager
def case_alarm(timeout: float | None, on_stuck: Callable[[Alarm], None] | None = None, *,
               grace: float = ALARM_GRACE_S,
               native_grace: float = NATIVE_GRACE_S) -> Iterator[Alarm]:
    """Raise :class:`CaseTimeout` in the block once it has run ``timeout + grace`` seconds.

    Does nothing (``Alarm.armed`` is False, ``Alarm.skipped`` says why) without a timeout,
    outside the main thread, where the platform has no ``setitimer``, or when an alarm
    already set goes off sooner. Otherwise the SIGALRM handler and interval timer that were
    set are restored when the block ends, the timer with the time it has left.
    ``on_stuck(alarm)``, when given, runs in a watchdog thread if the block is still
    running ``native_grace`` seconds after the alarm: it is expected to end the process.
    """
    state = Alarm(timeout or 0.0)
    if not timeout:
        state.skipped = "no timeout"
        yield state
        return
    delay = timeout + grace
    state.skipped = _why_not_arm(delay)
    if state.skipped:
        yield state
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        if state._active and not state.fired:
            state.fired = True
            raise CaseTimeout(timeout, _frame_text(frame))

    previous = signal.getsignal(signal.SIGALRM)
    old_delay, old_interval = signal.getitimer(signal.ITIMER_REAL)
    state.started = time.monotonic()
    signal.signal(signal.SIGALRM, handler)
    state.armed = state._active = True
    stuck = functools.partial(on_stuck, state) if on_stuck is not None else None
    try:
        with watchdog(delay + native_grace, stuck):
            signal.setitimer(signal.ITIMER_REAL, delay)
            try:
                yield state
            finally:
                state._active = False
                signal.setitimer(signal.ITIMER_REAL, 0)
    finally:
        signal.signal(signal.SIGALRM, previous)
        if old_delay:
            left = old_delay - (time.monotonic() - state.started)
            signal.setitimer(signal.ITIMER_REAL, max(left, 1e-3), old_interval)


# -- a case trained in this process --------------------------------------------------------

#: Seconds the devices get to become idle after a case was interrupted mid-step.
SETTLE_S = 5.0
#: Why an interrupted case could not be stopped (see :func:`train_in_process`).
STUCK_NATIVE = ("it is inside a native call (a compile, a device wait, a C extension) that "
                "does not return to Python, where it cannot be interrupted")
STUCK_FIRED = "it went on after the interrupt (something caught CaseTimeout)"
STUCK_DEVICE = ("a device computation of it, which cannot be cancelled, was still running "
                "(the next case would wait behind it)")


def train_in_process(backend: Backend, case: Case, task: Task, accel: Accelerator, *,
                     timeout: float | None, environment: Environment,
                     on_stuck: Callable[[Run], None]) -> TrainResult:
    """Train ``case`` by ``backend.train`` in this process; a case that blocks past its
    timeout is interrupted (:func:`case_alarm`) and returned as a ``timeout`` run with the
    steps it reported before (:func:`interrupted_run`). Where the interrupted work goes on
    regardless (a device computation that cannot be cancelled, a native call that never
    returns to Python), the session cannot go on measuring: ``on_stuck(run)`` gets the run
    that says why (:func:`stuck_run`), from a watchdog thread or from this one, and is
    expected to end the process cleanly."""
    __tracebackhide__ = True
    started = time.monotonic()
    with progress.recording() as steps:

        def stuck(why: str) -> None:
            on_stuck(stuck_run(case, steps, why, time.monotonic() - started, accel,
                               timeout=timeout, environment=environment))

        try:
            with case_alarm(timeout, lambda alarm: stuck(
                    STUCK_FIRED if alarm.fired else STUCK_NATIVE)):
                result: TrainResult = backend.train(case, task, accel, timeout=timeout)
                return result
        except CaseTimeout as exc:
            where = exc.where
    run = interrupted_run(case, steps, where, time.monotonic() - started, accel,
                          timeout=timeout, environment=environment)
    settle = getattr(backend, "settle", None)
    if settle is not None:
        with watchdog(SETTLE_S + 2, lambda: stuck(STUCK_DEVICE)):
            idle = settle(accel, SETTLE_S)
        if not idle:
            stuck(STUCK_DEVICE)
    return TrainResult(run=run)


def interrupted_run(case: Case, steps: progress.StepRecord, where: str, elapsed: float,
                    accel: Accelerator, *, timeout: float | None,
                    environment: Environment) -> Run:
    """The ``timeout`` run of a case interrupted mid-step: the losses and step times
    it reported before (the backend never returned its own run)."""
    done = steps.first_training()
    # The backend's own count of steps (some warm up longer than the case asks).
    total = done[0][1] if done else case.warmup + case.steps
    warmup = total - case.steps
    timeout = timeout or 0.0
    return Run(
        case_id=case.id, outcome="timeout", samples_per_step=case.batch,
        n_devices=case.n_devices, peak_flops_per_device=accel.peak_flops,
        losses=[loss for _, _, loss, _ in done], loss_steps=[n - 1 for n, _, _, _ in done],
        step_times=[t for n, _, _, t in done if n > warmup],
        message=(f"exceeded the {timeout:g} s timeout after {len(done)} of {total} steps: "
                 f"a step blocked and was interrupted after {elapsed:.0f} s, in {where} "
                 f"(raise --accelperf-timeout, or give the case fewer steps; a step "
                 f"waiting on something that never comes needs fixing)"),
        environment=environment)


def stuck_run(case: Case, steps: progress.StepRecord, why: str, elapsed: float,
              accel: Accelerator, *, timeout: float | None,
              environment: Environment) -> Run:
    """The run of a case that could not be stopped (``why``): what it reported before, and
    a message saying that the process was ended with what was recorded."""
    done = steps.first_training()
    total = done[0][1] if done else case.warmup + case.steps
    run = interrupted_run(case, steps, "", elapsed, accel, timeout=timeout,
                          environment=environment)
    return replace(run, message=(
        f"exceeded the {timeout or 0.0:g} s timeout after {len(done)} of {total} steps and "
        f"could not be stopped: {why}, "
        f"{elapsed:.0f} s in. The pytest process was ended with what was recorded; the "
        f"cases after this one did not run (raise --accelperf-timeout, or give the case "
        f"fewer or shorter steps)"))


# -- the host lock ---------------------------------------------------------------------------

#: The directory of the host lock: ``/tmp`` itself, not ``$TMPDIR``. The lock must be one
#: file for every process on the machine, and sessions on one machine do run with different
#: ``$TMPDIR`` (a CI job's own, tox's, a user's shell): each would lock a file of its own
#: and train at the same time as the others. ``$TMPDIR`` only where ``/tmp`` is not
#: writable (or does not exist). ``$ACCELPERF_HOST_LOCK_DIR``, where set, names another
#: directory, for processes that are not measurements to compare with anyone's: the
#: plugin's own tests give each pytest-xdist worker a lock of its own (tests/conftest.py),
#: so that two workers' scratch sessions train side by side rather than one at a time.
HOST_LOCK_DIR = (Path(os.environ["ACCELPERF_HOST_LOCK_DIR"])
                 if os.environ.get("ACCELPERF_HOST_LOCK_DIR")
                 else Path("/tmp") if os.access("/tmp", os.W_OK | os.X_OK)
                 else Path(tempfile.gettempdir()))
HOST_LOCK_NAME = "accelperf-cpu-host.lock"
#: Seconds a case waits for the host lock before it says whom it waits for.
NOTICE_AFTER_S = 5.0
#: Seconds between two looks at who holds the lock, while waiting for it.
POLL_S = 1.0
#: Seconds past its own case's timeout after which a holder still holding the lock is
#: stuck: its alarm interrupts a case :data:`ALARM_GRACE_S` past the timeout, its watchdog
#: ends the process :data:`NATIVE_GRACE_S` later, a multi-process launch is killed at the
#: timeout and waited for 10 s; a minute is well past all of them.
STUCK_GRACE_S = 60.0


#: Bytes of a holder file read: it holds one short line of JSON; a larger one is not ours.
_HOLDER_BYTES = 4096
#: Linux's largest possible pid (the ceiling of ``kernel.pid_max``); past it, not a pid.
_PID_MAX = 2**22


class HostLockError(Exception):
    """The host lock could not be taken; the message names the lock and what to do."""


class HostLockTimeout(HostLockError):
    """The host lock was not free within ``--accelperf-host-lock-timeout``."""


class HostLockStuck(HostLockError):
    """The host lock is held by a process known to be stuck: not waited for."""


def holder_path(lock_path: Path) -> Path:
    """The sidecar file where the holder of a lock writes its pid and case."""
    return lock_path.with_name(lock_path.name + ".holder")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    except (OverflowError, ValueError):  # not a pid at all
        return False
    return True


@dataclass(frozen=True)
class Holder:
    """What a holder file says: ``pid`` and ``case``, since when (None where it does not
    say so sensibly), on which host, and the most its case may hold the lock: the case's
    timeout in seconds (None: not bounded, or not said)."""

    pid: int
    case: str
    since: float | None
    host: str
    timeout: float | None = None


def read_holder(lock_path: Path) -> Holder | str:
    """The holder that ``lock_path``'s sidecar file names, or why it names none (a file
    that is missing, unreadable or not what a holder writes). Anything may be in that file
    (a crash mid-write, another program, a hand edit): nothing in it raises here."""
    try:
        with holder_path(lock_path).open("rb") as f:
            raw = f.read(_HOLDER_BYTES)
    except FileNotFoundError:
        return "no holder file"
    except OSError as exc:
        return f"its holder file cannot be read: {exc.strerror or exc}"
    if not raw.strip():  # a holder between creating its file and writing it
        return "no holder file"
    try:
        data = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return f"its holder file is not JSON: {raw[:40]!r}"
    if not isinstance(data, dict):
        return f"its holder file is not what a holder writes: {raw[:40]!r}"
    pid, case, since = data.get("pid"), data.get("case"), data.get("since")
    # bool is an int to Python; pid 0 and negative pids name process groups to os.kill.
    if type(pid) is not int or not 0 < pid <= _PID_MAX or not isinstance(case, str):
        return f"its holder file is not what a holder writes: {raw[:40]!r}"
    started: float | None = None  # a time that cannot be when it took the lock: unknown
    if (isinstance(since, int | float) and not isinstance(since, bool)
            and math.isfinite(since) and 0 < since <= time.time() + 60):
        started = float(since)
    host, bound = data.get("host"), data.get("timeout")
    if isinstance(bound, bool) or not isinstance(bound, int | float) \
            or not math.isfinite(bound) or bound <= 0:
        bound = None
    return Holder(pid=pid, case=case if case.isprintable() else repr(case), since=started,
                  host=host if isinstance(host, str) else "",
                  timeout=float(bound) if bound is not None else None)


def lock_owners(lock_path: Path) -> set[int] | None:
    """The pids the kernel says hold a lock on ``lock_path`` (``/proc/locks``: the file's
    device and inode), or None where it cannot say (no ``/proc/locks``, no file)."""
    try:
        st = os.stat(lock_path)
        text = Path("/proc/locks").read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    where = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    owners: set[int] = set()
    for line in text.splitlines():
        # "1: FLOCK  ADVISORY  WRITE 8311 fe:00:2163306 0 EOF"; a process blocked waiting
        # for a lock is listed after its holder as "1: -> FLOCK ...", and holds nothing.
        parts = line.split()
        if len(parts) >= 6 and parts[1] != "->" and parts[5] == where and parts[4].isdigit():
            owners.add(int(parts[4]))
    return owners


def _state(pid: int) -> str:
    """The state letter of process ``pid`` (``/proc/<pid>/stat``: ``R``, ``S``, ``T`` for
    stopped...), ``""`` where it cannot be read."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    fields = text.rpartition(")")[2].split()  # after "pid (command name)", which may hold ")"
    return fields[0] if fields else ""


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def stuck_holder(lock_path: Path) -> str | None:
    """Why the holder of ``lock_path`` will not release it by itself, in words, or None
    (not known to be stuck: waiting is right).

    Only a holder that its file names on this host, and that the kernel confirms holds the
    lock (:func:`lock_owners`), is judged: it is stuck when it is stopped (``T``: Ctrl-Z,
    SIGSTOP, a debugger; it keeps the lock until resumed), or when it has held the lock
    past its own case's timeout by more than :data:`STUCK_GRACE_S` (what ends a case past
    its timeout, its alarm and watchdog, has not: the process hangs where they cannot
    reach). Anything that cannot be told for sure (another host, a holder file that names
    another process, no ``/proc``) is not stuck."""
    holder = read_holder(lock_path)
    if isinstance(holder, str) or holder.host != socket.gethostname():
        return None
    owners = lock_owners(lock_path)
    if owners is None or holder.pid not in owners:
        return None
    who = f"pid {holder.pid} (case {holder.case})"
    if _state(holder.pid) in ("T", "t"):
        return (f"{who} is stopped (Ctrl-Z, SIGSTOP or a debugger) and keeps it until it is "
                f"resumed: resume it (kill -CONT {holder.pid}) or end it (kill "
                f"{holder.pid})")
    if holder.timeout is not None and holder.since is not None:
        held = time.time() - holder.since
        if held > holder.timeout + STUCK_GRACE_S:
            return (f"{who} has held it for {_duration(held)}, past its case's "
                    f"{holder.timeout:g} s timeout (--accelperf-timeout), after which a "
                    f"case is ended within {STUCK_GRACE_S:g} s: it is stuck; end it (kill "
                    f"{holder.pid})")
    return None


def describe_holder(lock_path: Path) -> str:
    """Who holds the lock, as its sidecar file says: ``pid 123 (case ..., for 2 min)``."""
    holder = read_holder(lock_path)
    if holder == "no holder file":
        return ("a process that did not say who it is (a session of an older pytest-accelperf, "
                "or one that has only just taken the lock)")
    if isinstance(holder, str):
        return f"a process that did not say who it is ({holder})"
    if holder.host == socket.gethostname() and not _alive(holder.pid):
        return (f"a process that did not say who it is (the last holder recorded, pid "
                f"{holder.pid}, has exited)")
    if holder.since is None:
        return f"pid {holder.pid} (case {holder.case})"
    held = max(0.0, time.time() - holder.since)
    return f"pid {holder.pid} (case {holder.case}, holding it for {_duration(held)})"


@contextlib.contextmanager
def host_lock(case: str, timeout: float | None, notify: Callable[[str], None], *,
              directory: Path | None = None, hold_timeout: float | None = None
              ) -> Iterator[Path]:
    """Hold the host-wide lock for the block; yields its path.

    After :data:`NOTICE_AFTER_S` of waiting, ``notify`` gets one line naming the holder;
    past ``timeout`` seconds (None: wait forever) :class:`HostLockTimeout` is raised, and
    at once :class:`HostLockStuck` where the holder is known to be stuck
    (:func:`stuck_holder`, looked at every :data:`POLL_S` of the wait). While held, the
    sidecar file names this process, ``case`` and ``hold_timeout``: the most this block
    holds the lock (the case's timeout; None: not bounded).
    """
    path = (directory or HOST_LOCK_DIR) / HOST_LOCK_NAME
    # mode 0o666: the lock is shared by every user's sessions on the machine.
    lock = filelock.FileLock(path, mode=0o666)
    started = time.monotonic()

    def give_up() -> HostLockTimeout:
        return HostLockTimeout(
            f"{case}: gave up waiting for the CPU host lock {path} after {timeout:g} s: it is "
            f"held by {describe_holder(path)}. CPU cases of all sessions on this machine "
            f"train one at a time so that their step times are comparable. Wait for that "
            f"session, stop it if it is stuck, or raise --accelperf-host-lock-timeout (0 waits "
            f"forever)")

    def unusable(exc: OSError) -> HostLockError:
        return HostLockError(
            f"{case}: cannot take the CPU host lock {path}: {exc.strerror or exc}. Every "
            f"session on this machine locks that one file: make it a file this user can open "
            f"for writing (remove what is there; a session creates it again)")

    notice = NOTICE_AFTER_S if timeout is None else min(NOTICE_AFTER_S, timeout)
    wait = 0.0  # the first try does not wait: a stuck holder is not waited for at all
    noticed = False
    while True:
        try:
            lock.acquire(timeout=wait)
            break
        except filelock.Timeout:
            pass
        except OSError as exc:  # a directory, a symlink loop, another user's file: not a wait
            raise unusable(exc) from None
        stuck = stuck_holder(path)
        if stuck is not None:
            raise HostLockStuck(
                f"{case}: not waiting for the CPU host lock {path}: {stuck}. CPU cases of all "
                f"sessions on this machine train one at a time")
        waited = time.monotonic() - started
        if not noticed and waited >= notice:
            noticed = True
            notify(f"accelperf: {case} is waiting for the CPU host lock {path}, held by "
                   f"{describe_holder(path)}"
                   + (f"; giving up after {timeout:g} s" if timeout else ""))
        if timeout is not None and waited >= timeout:
            raise give_up()
        ends = [POLL_S] + ([notice - waited] if not noticed else []) \
            + ([timeout - waited] if timeout is not None else [])
        wait = max(0.0, min(ends))
    sidecar = holder_path(path)
    try:
        with contextlib.suppress(OSError):
            _write_holder(sidecar, case, hold_timeout)
        yield path
    finally:
        with contextlib.suppress(OSError):
            sidecar.unlink()
        lock.release()


def _write_holder(sidecar: Path, case: str, hold_timeout: float | None = None) -> None:
    text = json.dumps({"pid": os.getpid(), "case": case, "since": time.time(),
                       "host": socket.gethostname(), "timeout": hold_timeout})
    with contextlib.suppress(FileNotFoundError):
        sidecar.unlink()  # one left behind by a holder that was killed
    fd = os.open(sidecar, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
