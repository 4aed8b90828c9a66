"""Run a function in N processes, one per device, and turn whatever happens into an outcome.

The multi-process backends (DeepSpeed, torch DDP) train in ranks that this module starts,
watches and stops; the pytest process never joins the process group, so nothing a rank does
can hang or crash the session.

How a launch goes:

* The rank function and its arguments are serialized with ``cloudpickle`` into a payload
  file; ``N`` interpreters run ``python -m pytest_accelperf.backends.procs._rank`` on it, each in
  its own session (process group), with ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
  ``MASTER_ADDR``/``MASTER_PORT`` (a free local port), ``PYTHONPATH`` = this process's
  ``sys.path`` (so the test's own modules, like ``gpt``, import in the ranks),
  ``OMP_NUM_THREADS`` = cores / N unless set (N ranks must not each take every core), and
  ``TORCH_EXTENSIONS_DIR``: the user's, or by default a persistent cache,
  ``~/.cache/pytest-accelperf/torch_extensions`` (``$XDG_CACHE_HOME`` honoured), so that
  DeepSpeed's C++ ops compile once per machine rather than once per run; ``PATH`` with
  the interpreter's scripts directory on it, first when it was missing (the environment's
  ``ninja`` builds them).
* Each rank appends JSON lines to its own file: ``progress`` (the phase, the last step it
  finished, its peak memory so far), then ``result`` or ``error`` (exception type, message,
  traceback tail, whether it was an out-of-memory). Its stdout and stderr go to a log file.
* The parent polls. While it waits it follows rank 0's progress lines and shows them on
  pytest's terminal line (:mod:`pytest_accelperf.backends.measure.progress`), as a single-process
  backend does; only when that line is shown at all. All ranks exiting 0 is ``ok``. The
  first rank to exit non-zero (or be killed by a signal) ends the launch: the survivors,
  which would otherwise wait in a collective forever, are killed (``SIGKILL`` to their
  process groups) as soon as each has reported the steps the failed rank had finished (at
  most :data:`PEER_GRACE_S` later, so that nothing they did is lost) and the outcome is
  ``error`` (or ``oom`` when that rank reported running out of memory), with a message
  that names the rank, the exit code or signal, the last step it reported, and the tail
  of its traceback or stderr. Past the timeout every rank is killed and the outcome is
  ``timeout`` with the steps each rank had reported.

Pooled ranks: a launch given ``warm`` modules (multi-process torch cases on the CPU) runs in
a pool's *warm ranks* (:mod:`pytest_accelperf.backends.procs.rank_pool`): ``N`` interpreters that
imported those modules once for the session and fork one child per case; the child is the
rank above (same environment, files, progress, result and outcome), so only the
interpreter start and the imports are saved. Any outcome but ``ok`` kills the warm ranks
with the case, and the next case starts new ones.

A rank reports running out of memory by raising ``torch.OutOfMemoryError`` (CUDA) or
:class:`CapacityExceeded` (a declared CPU capacity overrun); before its first training step
that is, in the words of DeepSpeed's own benchmarks, "cannot even initialize model".
"""

from __future__ import annotations

import contextlib
import importlib
import os
import pickle
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypedDict, cast

from pytest_accelperf.backends.measure import progress as live_progress
from pytest_accelperf.backends.procs import rank_pool
from pytest_accelperf.backends.procs.events import (
    ErrorEvent,
    ProgressEvent,
    parse_events,
    progress_events,
)

#: Seconds between polls of the ranks.
POLL_S = 0.02
#: How long, at most, a launch waits for the cause when every failure seen so far looks
#: like a consequence of another rank's (a peer's socket closed under a collective): a
#: pooled rank's death reaches the launcher through its warm parent, after the peer's
#: error can (seen: "rank 0 raised ... Connection closed by peer" for a rank 1 killed).
CAUSE_GRACE_S = 2.0
#: How long, at most, a launch waits after a rank failed for the ranks still running to
#: report the steps the failed rank had finished: a survivor a little behind (under load,
#: between its last collective and its progress line) would otherwise lose its report of
#: them (seen: rank 1 killed after step 2, rank 0 stopped with steps 0-1 reported).
PEER_GRACE_S = 5.0
#: Characters of a failed rank's stderr (or traceback) quoted in the message.
TAIL_CHARS = 1200
#: Exit code a rank uses for an exception it reported in its file.
EXIT_RAISED = 17
#: Environment variable naming the persistent torch extensions cache.
EXTENSIONS_ENV = "TORCH_EXTENSIONS_DIR"

LaunchOutcome = Literal["ok", "oom", "error", "timeout"]


class CapacityExceeded(MemoryError):
    """Raised in a rank whose counted peak memory exceeds the case's declared capacity: the
    CPU's stand-in for a CUDA out-of-memory error. Reported as the outcome ``oom``."""

    def __init__(self, required: int, capacity: int, source: str) -> None:
        self.required, self.capacity, self.source = required, capacity, source
        super().__init__(f"needs {required / 2**30:.3f} GiB ({source}) of "
                         f"{capacity / 2**30:.3f} GiB declared capacity")


def default_extensions_dir() -> Path:
    """Where torch C++ extensions (DeepSpeed's ops) are built and cached: ``$TORCH_EXTENSIONS_DIR``
    when set, else ``~/.cache/pytest-accelperf/torch_extensions``."""
    if os.environ.get(EXTENSIONS_ENV):
        return Path(os.environ[EXTENSIONS_ENV])
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "pytest-accelperf" / "torch_extensions"


def free_port() -> int:
    """A TCP port that was free on localhost a moment ago (the rendezvous port)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class LaunchTimings(TypedDict, total=False):
    """When a launch started and ended (``time.time()``) and the pool it ran in
    (:attr:`LaunchResult.timings`)."""

    start_wall: float
    end_wall: float
    pooled: bool
    pool_case: int
    pool_pids: list[int]


@dataclass
class RankReport:
    """What one rank left behind: its exit status, its last progress, its result or error."""

    rank: int
    returncode: int | None = None
    #: Its progress events merged, the later fields over the earlier ones.
    progress: ProgressEvent = field(default_factory=lambda: ProgressEvent())
    #: What the rank function returned (the backend's to read).
    result: Any = None
    error: ErrorEvent | None = None
    log_tail: str = ""
    #: Every progress event that named a step, in order (what a killed rank had done).
    steps: list[ProgressEvent] = field(default_factory=list)

    @property
    def step(self) -> int | None:
        """The last step this rank reported finished (None before its first)."""
        step = self.progress.get("step")
        return int(step) if step is not None else None

    @property
    def signal_name(self) -> str | None:
        if self.returncode is None or self.returncode >= 0:
            return None
        try:
            return signal.Signals(-self.returncode).name
        except ValueError:
            return f"signal {-self.returncode}"

    @property
    def is_oom(self) -> bool:
        return bool(self.error and self.error.get("oom"))

    def where(self, total_steps: int | None = None) -> str:
        """``"in step 3 (steps 0-2 had finished)"`` (``"of 5"`` after the range with
        ``total_steps``), or ``"while initializing"`` before the first reported step
        (steps count from 0, warm-up included); in A/B mode, which reports after each block
        of steps, ``"in a block of steps from step 3 on (steps 0-2 had finished)"``."""
        if self.progress.get("phase") == "blocks" and self.step is not None:  # A/B mode
            done = "step 0" if self.step == 0 else f"steps 0-{self.step}"
            return f"in a block of steps from step {self.step + 1} on ({done} had finished)"
        if self.step is None:
            phase = self.progress.get("phase", "starting")
            return ("while starting (before initializing)" if phase == "starting"
                    else "while initializing (before step 0)")
        done = "step 0" if self.step == 0 else f"steps 0-{self.step}"
        of = f" of {total_steps}" if total_steps is not None else ""
        return f"in step {self.step + 1} ({done}{of} had finished)"

    def add_progress(self, events: list[ProgressEvent]) -> None:
        """Take in ``progress`` events (as :meth:`ProgressTail.new` returns them)."""
        for event in events:
            self.progress.update(event)
            if "step" in event:
                self.steps.append(event)


@dataclass
class LaunchResult:
    """The outcome of a launch: one report per rank and, unless ``ok``, why not."""

    outcome: LaunchOutcome
    message: str
    ranks: list[RankReport]
    failed_rank: int | None = None
    elapsed: float = 0.0
    #: When the launch started and ended (``time.time()``, comparable with the ranks'
    #: clocks), whether it ran in a pool's warm ranks (``pooled``), the pool's count of
    #: cases so far (``pool_case``: 1 for the case that started it) and its warm ranks'
    #: pids (``pool_pids``).
    timings: LaunchTimings = field(default_factory=lambda: LaunchTimings())

    @property
    def failed(self) -> RankReport | None:
        return self.ranks[self.failed_rank] if self.failed_rank is not None else None


def _tail(text: str, n: int = TAIL_CHARS) -> str:
    text = text.strip()
    return text if len(text) <= n else "..." + text[-n:]


def _child_env(rank: int, world_size: int, port: int, device: str) -> dict[str, str]:
    env = dict(os.environ)
    paths = [p if p else os.getcwd() for p in sys.path]
    env.update({
        "RANK": str(rank), "WORLD_SIZE": str(world_size), "LOCAL_RANK": str(rank),
        "LOCAL_WORLD_SIZE": str(world_size), "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port), "PYTHONPATH": os.pathsep.join(paths),
        EXTENSIONS_ENV: str(default_extensions_dir()), "PYTHONUNBUFFERED": "1",
        "ACCELPERF_DEVICE": device,
    })
    if device == "cpu":
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // world_size)))
    # The interpreter's own scripts first, as an activated environment has them: torch
    # builds C++ extensions with the `ninja` it finds on PATH, and two ninjas (the
    # environment's, pip's 1.13, and the system's 1.11) hash a build's command lines
    # differently, so each took the other's build of a DeepSpeed op for stale and rebuilt
    # it in the shared cache (170-340 s of two cores; seen 2026-11-29 between a session
    # started from an activated venv and one started as .venv/bin/pytest).
    scripts = str(Path(sys.executable).parent)
    path = env.get("PATH", "")
    if scripts not in path.split(os.pathsep):
        env["PATH"] = os.pathsep.join(filter(None, (scripts, path)))
    return env


def _read_events(path: Path) -> list[tuple[str, dict[str, object]]]:
    """A rank's events file, as :func:`~.procs.events.parse_events` reads it."""
    if not path.exists():
        return []
    return list(parse_events(path.read_text(encoding="utf-8", errors="replace").splitlines()))


class ProgressTail:
    """The ``progress`` events a rank appends to its file (``phase``, ``step``, ``loss``,
    ...), read incrementally: each call parses only what was appended since the last, and
    a line still being written is kept for the next."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._offset = 0
        self._partial = b""

    def new(self) -> list[ProgressEvent]:
        """The events appended since the last call, in order."""
        try:
            with self._path.open("rb") as f:
                f.seek(self._offset)
                chunk = f.read()
        except OSError:
            return []  # not created yet
        self._offset += len(chunk)
        *lines, self._partial = (self._partial + chunk).split(b"\n")
        return progress_events(lines)


def show_latest_step(events: list[ProgressEvent], total_steps: int | None) -> None:
    """Put the last training step among ``events`` (``progress`` events, as a rank reports
    them) on the terminal progress line; ``total_steps`` defaults to the event's own
    ``total``. Nothing happens while no line is shown."""
    if not live_progress.active():
        return
    steps = [e for e in events if isinstance(e.get("step"), int)]
    if not steps:
        return
    latest = steps[-1]
    total = total_steps or latest.get("total")
    if total:
        with contextlib.suppress(TypeError, ValueError, KeyError):
            live_progress.step(latest["step"] + 1, int(total), float(latest["loss"]),
                               float(latest["time"]))


class _ProgressFollower:
    """Forwards the latest training step a rank appended to its file to the terminal
    progress line (only while one is shown)."""

    def __init__(self, path: Path, total_steps: int | None) -> None:
        self._tail = ProgressTail(path)
        self._total = total_steps

    def poll(self) -> None:
        if self._total and live_progress.active():
            show_latest_step(self._tail.new(), self._total)


def _collect(rank: int, workdir: Path, returncode: int | None) -> RankReport:
    report = RankReport(rank=rank, returncode=returncode)
    for kind, event in _read_events(workdir / f"rank{rank}.jsonl"):
        if kind == "progress":
            report.add_progress([cast(ProgressEvent, event)])
        elif kind == "error":
            report.error = cast(ErrorEvent, event)
    result_file = workdir / f"rank{rank}.result.pkl"
    if returncode == 0 and result_file.exists():
        with result_file.open("rb") as f:
            report.result = pickle.load(f)
    log = workdir / f"rank{rank}.log"
    if log.exists():
        report.log_tail = _tail(log.read_text(encoding="utf-8", errors="replace"))
    return report


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()


def _looks_secondary(report: RankReport) -> bool:
    """Whether a rank's failure looks like the consequence of another's (a peer's socket
    closing under a collective) rather than the cause."""
    text = " ".join(str(report.error.get(k, "")) for k in ("type", "message")) \
        if report.error else report.log_tail[-400:]
    hints = ("Connection closed by peer", "Connection reset", "Broken pipe", "gloo",
             "DistBackendError", "NCCL", "Socket Timeout", "connection refused")
    return any(h.lower() in text.lower() for h in hints)


def _culprit(failed: list[RankReport]) -> RankReport:
    """Of the ranks seen failing at the same poll, the one most likely to be the cause."""
    def order(r: RankReport) -> tuple[int, int, int, int]:
        return (0 if r.signal_name else 1, 0 if r.is_oom else 1,
                1 if _looks_secondary(r) else 0, r.rank)
    return min(failed, key=order)


def describe_failure(report: RankReport, total_steps: int | None = None) -> str:
    """A sentence on why rank ``report.rank`` failed, for the run's message."""
    where = report.where(total_steps)
    rank = f"rank {report.rank}"
    if report.is_oom and report.error:
        what = ("ran out of memory while initializing (cannot even initialize model)"
                if report.step is None else f"ran out of memory {where}")
        return f"{rank} {what}: {report.error.get('message', '')}"
    if report.error:
        tb = _tail(report.error.get("traceback", ""), TAIL_CHARS)
        return (f"{rank} raised {report.error.get('type')}: {report.error.get('message')} "
                f"({where}); the other rank(s) were stopped. Traceback (last lines):\n{tb}")
    if report.signal_name:
        how = f"was killed by {report.signal_name}"
        if report.signal_name == "SIGKILL":
            how += " (the kernel's out-of-memory killer, or someone, killed it)"
    else:
        how = f"exited with code {report.returncode}"
    tail = report.log_tail or "(nothing on stdout/stderr)"
    return (f"{rank} {how} {where}; the other rank(s) were stopped. Its output ended "
            f"with:\n{tail}")


def launch(fn: Callable[..., Any], args: tuple[Any, ...], world_size: int, *,
           device: str = "cpu", timeout: float | None = None,
           total_steps: int | None = None, keep_dir: Path | None = None,
           warm: tuple[str, ...] | None = None) -> LaunchResult:
    """Run ``fn(ctx, *args)`` in ``world_size`` processes and report how it went.

    ``fn`` gets a :class:`pytest_accelperf.backends.procs._rank.RankContext` (rank, world size,
    ``progress(**fields)`` to report) and returns a picklable result (rank ``r``'s is
    ``ranks[r].result``). ``device`` is ``"cpu"`` or ``"cuda"`` (ranks use ``LOCAL_RANK`` as
    the CUDA device index). ``timeout`` bounds the whole launch, process start included.
    ``total_steps`` only makes messages read "after step 3 of 12". The temporary directory
    is removed afterwards unless ``keep_dir`` names one to use instead.

    ``warm`` (module names) lets the case run in a pool's warm ranks that imported them
    (:mod:`pytest_accelperf.backends.procs.rank_pool`: each case in a child forked for it, the
    same files and outcomes; CPU only, ``ACCELPERF_RANK_POOL=0`` turns it off); None
    launches fresh interpreters.
    """
    try:
        cloudpickle: Any = importlib.import_module("cloudpickle")  # untyped
    except ImportError:
        raise ImportError("multi-process cases ship their task to the ranks with cloudpickle, "
                          "which is not installed: pip install 'pytest-accelperf[torch]' "
                          "(or pip install cloudpickle)") from None

    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if keep_dir is not None:
        keep_dir.mkdir(parents=True, exist_ok=True)
        return _launch_in(keep_dir, cloudpickle.dumps((fn, args)), world_size, device,
                          timeout, total_steps, warm)
    with tempfile.TemporaryDirectory(prefix="accelperf-launch-") as tmp:
        return _launch_in(Path(tmp), cloudpickle.dumps((fn, args)), world_size, device,
                          timeout, total_steps, warm)


class _Fresh:
    """The ranks of one launch: ``world_size`` new interpreters."""

    def __init__(self, workdir: Path, envs: list[dict[str, str]]) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []
        for rank, env in enumerate(envs):
            with (workdir / f"rank{rank}.log").open("wb") as log:
                self.procs.append(subprocess.Popen(
                    [sys.executable, "-m", "pytest_accelperf.backends.procs._rank",
                     str(workdir), str(rank)],
                    env=env, stdin=subprocess.DEVNULL,
                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True))

    def poll(self) -> list[int | None]:
        return [p.poll() for p in self.procs]

    def end(self, ok: bool) -> None:
        for p in self.procs:
            _kill_group(p)
        for p in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):  # SIGKILL not delivered
                p.wait(timeout=10)


class _Pooled:
    """The ranks of one launch: children of a pool's warm ranks (kept when ``ok``)."""

    def __init__(self, pool: rank_pool.RankPool, workdir: Path,
                 envs: list[dict[str, str]]) -> None:
        self.pool = pool
        self.workdir = workdir
        pool.submit(workdir, envs)
        self.pids, self.case = pool.pids, pool.cases

    def poll(self) -> list[int | None]:
        return self.pool.poll()

    def end(self, ok: bool) -> None:
        if not ok:
            self.pool.adopt_logs(self.workdir)
        rank_pool.release(self.pool, ok)


def _start(workdir: Path, world_size: int, device: str, port: int,
           warm: tuple[str, ...] | None, env: dict[str, str]) -> _Fresh | _Pooled:
    envs = [{**_child_env(rank, world_size, port, device), **env}
            for rank in range(world_size)]
    if warm is not None and rank_pool.enabled(device):
        pool = rank_pool.acquire(world_size, device, warm, envs)
        if pool is not None:
            return _Pooled(pool, workdir, envs)
    return _Fresh(workdir, envs)


def _launch_in(workdir: Path, payload: bytes, world_size: int, device: str,
               timeout: float | None, total_steps: int | None,
               warm: tuple[str, ...] | None = None) -> LaunchResult:
    group = RankGroup(workdir, payload, world_size, device, total_steps, warm)
    return group.wait(timeout, follow=True)


class RankGroup:
    """The ranks of one launch while they run: started here (fresh or from a pool's warm
    ranks), watched with :meth:`poll`, and ended by :meth:`wait`, which returns the
    :class:`LaunchResult`. :func:`launch` waits at once; A/B mode
    (:func:`start_group`) keeps a group running and talks to its ranks meanwhile."""

    def __init__(self, workdir: Path, payload: bytes, world_size: int, device: str,
                 total_steps: int | None, warm: tuple[str, ...] | None = None,
                 env: dict[str, str] | None = None) -> None:
        (workdir / "payload.pkl").write_bytes(payload)
        default_extensions_dir().mkdir(parents=True, exist_ok=True)
        self.workdir, self.world_size, self.total_steps = workdir, world_size, total_steps
        self._start = time.monotonic()
        self._wall_start = time.time()
        self._ranks = _start(workdir, world_size, device, free_port(), warm, env or {})
        self._result: LaunchResult | None = None

    def poll(self) -> list[int | None]:
        """Each rank's exit status so far (None: running)."""
        return self._ranks.poll()

    def failed(self) -> bool:
        """Whether a rank has exited other than 0 (or been killed)."""
        return any(c not in (None, 0) for c in self.poll())

    def wait(self, timeout: float | None, follow: bool = False) -> LaunchResult:
        """Wait until every rank has exited, one fails, or ``timeout`` seconds pass (from
        now), then end the group (a survivor of a failure, or every rank past the timeout,
        is killed; pooled ranks are kept only when every rank exited 0) and report. With
        ``follow``, rank 0's progress goes to the terminal progress line meanwhile."""
        if self._result is not None:
            return self._result
        deadline = time.monotonic() + timeout if timeout is not None else None
        codes: list[int | None] = [None] * self.world_size
        failed: list[int] = []
        timed_out = False
        try:
            follower = _ProgressFollower(self.workdir / "rank0.jsonl",
                                         self.total_steps if follow else None)
            while True:
                follower.poll()
                codes = self._ranks.poll()
                failed = [r for r, c in enumerate(codes) if c not in (None, 0)]
                if failed:
                    codes, failed = self._await_cause(codes, failed)
                    self._await_peers(codes, failed)
                    break
                if all(c == 0 for c in codes):
                    break
                if deadline is not None and time.monotonic() > deadline:
                    timed_out = True
                    break
                time.sleep(POLL_S)
        finally:
            self._ranks.end(ok=not failed and not timed_out and all(c == 0 for c in codes))
        self._result = self._report(codes, failed, timed_out, timeout)
        return self._result

    def _await_cause(self, codes: list[int | None], failed: list[int]
                     ) -> tuple[list[int | None], list[int]]:
        """The exit codes once the cause of a failure is seen: at once when a failed rank
        looks like one (:func:`_looks_secondary`), else polled for up to
        :data:`CAUSE_GRACE_S` while another rank may still report it."""
        deadline = time.monotonic() + CAUSE_GRACE_S
        while (all(_looks_secondary(_collect(r, self.workdir, codes[r])) for r in failed)
               and any(c is None for c in codes) and time.monotonic() < deadline):
            time.sleep(POLL_S)
            codes = self._ranks.poll()
            failed = [r for r, c in enumerate(codes) if c not in (None, 0)]
        return codes, failed

    def _await_peers(self, codes: list[int | None], failed: list[int]) -> None:
        """Poll for up to :data:`PEER_GRACE_S` while a rank still running has reported
        fewer steps than the failed ranks had finished: what it had done is kept."""
        def step(report: RankReport) -> int:
            return -1 if report.step is None else report.step
        done = max(step(_collect(r, self.workdir, codes[r])) for r in failed)
        # Each survivor's progress file read incrementally, not its whole log each poll.
        tails = {r: (ProgressTail(self.workdir / f"rank{r}.jsonl"), RankReport(rank=r))
                 for r, c in enumerate(codes) if c is None}
        deadline = time.monotonic() + PEER_GRACE_S
        while done >= 0 and time.monotonic() < deadline:
            polled = self._ranks.poll()
            for tail, report in tails.values():
                report.add_progress(tail.new())
            tails = {r: t for r, t in tails.items() if polled[r] is None and step(t[1]) < done}
            if not tails:
                return
            time.sleep(POLL_S)

    def _report(self, codes: list[int | None], failed: list[int], timed_out: bool,
                timeout: float | None) -> LaunchResult:
        world_size, workdir = self.world_size, self.workdir
        elapsed = time.monotonic() - self._start
        # Codes as first seen: the survivors' SIGKILL is ours, not their failure.
        reports = [_collect(r, workdir, codes[r]) for r in range(world_size)]
        pooled = self._ranks if isinstance(self._ranks, _Pooled) else None
        timings: LaunchTimings = {"start_wall": self._wall_start, "end_wall": time.time(),
                                  "pooled": pooled is not None,
                                  "pool_case": pooled.case if pooled is not None else 0,
                                  "pool_pids": pooled.pids if pooled is not None else []}
        if timed_out:
            steps = ", ".join(f"rank {r.rank}: {r.where()}" for r in reports)
            return LaunchResult("timeout", f"exceeded the {timeout:g} s timeout ({steps}); "
                                f"all {world_size} ranks were killed", reports,
                                elapsed=elapsed, timings=timings)
        if failed:
            culprit = _culprit([reports[r] for r in failed])
            outcome: LaunchOutcome = "oom" if culprit.is_oom else "error"
            return LaunchResult(outcome, describe_failure(culprit, self.total_steps), reports,
                                failed_rank=culprit.rank, elapsed=elapsed, timings=timings)
        return LaunchResult("ok", "", reports, elapsed=elapsed, timings=timings)


def start_group(fn: Callable[..., Any], args: tuple[Any, ...], world_size: int, *,
                workdir: Path, device: str = "cpu", total_steps: int | None = None,
                warm: tuple[str, ...] | None = None,
                env: dict[str, str] | None = None) -> RankGroup:
    """Start ``fn(ctx, *args)`` in ``world_size`` processes, as :func:`launch` does, and
    return at once: the caller talks to the ranks (A/B mode's blocks of steps,
    :mod:`pytest_accelperf.ab.rank_groups`) and ends the group with :meth:`RankGroup.wait`.
    ``workdir`` is the caller's (kept); ``env`` is added to every rank's environment."""
    cloudpickle: Any = importlib.import_module("cloudpickle")  # untyped
    workdir.mkdir(parents=True, exist_ok=True)
    return RankGroup(workdir, cloudpickle.dumps((fn, args)), world_size, device, total_steps,
                     warm, env)
