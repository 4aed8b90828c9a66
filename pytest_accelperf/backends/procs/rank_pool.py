"""Warm ranks kept across the cases of a session: a multi-process case without the imports.

Launching a case's ranks fresh costs, per rank, a Python start and the import of torch (and
DeepSpeed): 8-11 s for two ranks on a 2-core machine, against 0.05-0.13 s a training step.
A :class:`RankPool` starts ``world_size`` *warm ranks* once and keeps them for every later
case with the same key (world size, device, the modules to import, the environment), and
for a case with no pool of its own whose modules are among an idle pool's (a DDP case in
DeepSpeed's warm ranks, which imported torch's modules too):

* A warm rank (``python -m pytest_accelperf.backends.procs._rank --warm MODULES RANK``) imports
  ``MODULES`` (torch, DeepSpeed, the rank loop) and waits on its stdin for cases. It never
  initializes a process group, touches a device or starts a thread.
* For each case the pool writes one JSON line to every warm rank (the case's directory, its
  environment: a fresh rendezvous port, ``sys.path``); the warm rank *forks*, and the child
  runs the case exactly as a freshly launched rank does (:func:`._rank.run_case`: the same
  payload, progress and result files, its own log) and exits. The warm rank reports the
  child's pid and exit status on its stdout and waits for the next case.

Why fork a child per case rather than run the case in the warm rank itself: nothing a case
does can reach the next one. The process group (``torch.distributed``, DeepSpeed's
``deepspeed.comm`` backend object and the collectives the comm counter wraps on it,
``deepspeed.utils.groups``), dynamo's caches and compile counters, the RNG, leaked tensors,
a patched module: all of it lives in the child and ends with it. Each case joins a new
process group on a new port, builds its engine from nothing, and is counted (MemTracker on
the CPU) in a process that holds only what the imports left, as a fresh rank's is. What the
pool saves is what every fresh rank repeats identically: starting the interpreter and
importing the frameworks.

Failure ends the group: when a case does not finish ``ok`` on every rank (a rank raised,
died, ran out of memory, or the case timed out), the pool kills every warm rank of the
group with its children (``SIGKILL`` to their process groups, as :mod:`.launch` does to
fresh ranks) and forgets it; the case fails as it would with fresh ranks, and the next case
starts new warm ranks. A warm rank that dies (its import failed, it was killed) fails the
case it was given, with its log.

Only CPU ranks are pooled: a CUDA process cannot fork once the driver is initialized, and
the frameworks' imports may initialize it. ``ACCELPERF_RANK_POOL=0`` turns pooling off
(every case launches fresh ranks). :func:`close_all` ends every pool; the plugin calls it
when pytest unconfigures, and ``atexit`` does otherwise. Every warm rank also dies with
the pytest process (``PR_SET_PDEATHSIG``), and a case's child with its warm rank.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from pytest_accelperf.backends.procs.events import PoolJob

#: Environment variable that turns pooling off when ``"0"`` (or ``"false"``, ``"no"``).
POOL_ENV = "ACCELPERF_RANK_POOL"
#: Variables of a rank's environment that are not part of a pool's key: they differ per
#: case (the port, the import path, pytest's current test) or are read only after the
#: imports (inductor's cache directory, which torch sets in the pytest process the first
#: time it compiles there; a gate benchmark's injected slowdown, read at each step). A
#: case's child gets the case's whole environment anyway.
PER_CASE_ENV = ("MASTER_PORT", "PYTHONPATH", "PYTEST_CURRENT_TEST", "TORCHINDUCTOR_CACHE_DIR",
                "TRITON_CACHE_DIR", "ACCELPERF_INJECT_SLOWDOWN")


def enabled(device: str) -> bool:
    """Whether ranks on ``device`` are pooled: CPU ranks, unless ``ACCELPERF_RANK_POOL=0``."""
    return device == "cpu" and os.environ.get(POOL_ENV, "1").lower() not in ("0", "false",
                                                                              "no", "off")


def pool_key(world_size: int, device: str, warm: tuple[str, ...],
             env: dict[str, str]) -> str:
    """The key of the pool that may run a case: what a warm rank's state depends on."""
    fixed = {k: v for k, v in env.items() if k not in PER_CASE_ENV}
    text = json.dumps([sys.executable, world_size, device, list(warm), sorted(fixed.items())])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass
class WarmRank:
    """One warm rank: its process, and what it reported on its stdout."""

    rank: int
    proc: subprocess.Popen[bytes]
    log: Path
    _buffer: bytes = b""
    #: The pid of the child running the current case, once the warm rank reported it.
    child: int | None = None
    #: The current case's exit status, once reported (negative: killed by that signal).
    code: int | None = None

    def send(self, job: PoolJob) -> None:
        assert self.proc.stdin is not None
        self.child = self.code = None
        self.proc.stdin.write((json.dumps(job) + "\n").encode())
        self.proc.stdin.flush()

    def poll(self) -> int | None:
        """The case's exit status once known: reported by the warm rank, or the warm rank's
        own when it died (then the log of the case is the warm rank's, if the case has
        none)."""
        self._read()
        if self.code is not None:
            return self.code
        status = self.proc.poll()
        if status is not None:
            self._read()
            if self.code is None:
                self.code = status if status != 0 else 1  # it died without finishing
        return self.code

    def _read(self) -> None:
        out = self.proc.stdout
        if out is None:
            return
        try:
            chunk = os.read(out.fileno(), 65536)
        except BlockingIOError:
            return
        except OSError:
            return
        self._buffer += chunk
        *lines, self._buffer = self._buffer.split(b"\n")
        for line in lines:
            with contextlib.suppress(ValueError):
                event = json.loads(line)
                if event.get("event") == "started":
                    self.child = int(event["pid"])
                elif event.get("event") == "exit":
                    self.code = int(event["code"])

    def kill(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)  # the warm rank and its child
            except (ProcessLookupError, PermissionError):
                self.proc.kill()
        if self.child is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(self.child, signal.SIGKILL)


@dataclass
class RankPool:
    """``world_size`` warm ranks (see the module doc) for the cases of one key."""

    key: str
    world_size: int
    warm: tuple[str, ...]
    envs: list[dict[str, str]]
    directory: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(
        prefix="accelperf-pool-")))
    ranks: list[WarmRank] = field(default_factory=list)
    #: Cases this pool's ranks have run (finished or not).
    cases: int = 0
    busy: bool = False

    def start(self) -> None:
        for rank in range(self.world_size):
            log = self.directory / f"rank{rank}.warm.log"
            with log.open("wb") as err:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "pytest_accelperf.backends.procs._rank", "--warm",
                     ",".join(self.warm), str(rank)],
                    env=self.envs[rank], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                    stderr=err, start_new_session=True)
            assert proc.stdout is not None
            os.set_blocking(proc.stdout.fileno(), False)
            self.ranks.append(WarmRank(rank, proc, log))

    @property
    def pids(self) -> list[int]:
        """The warm ranks' pids (the same for every case the pool runs)."""
        return [r.proc.pid for r in self.ranks]

    def alive(self) -> bool:
        return bool(self.ranks) and all(r.proc.poll() is None for r in self.ranks)

    def submit(self, workdir: Path, envs: list[dict[str, str]]) -> None:
        """Have every warm rank fork a child that runs the case in ``workdir``."""
        self.cases += 1
        paths = envs[0].get("PYTHONPATH", "").split(os.pathsep)
        for r, rank in enumerate(self.ranks):
            try:
                rank.send({"workdir": str(workdir), "env": envs[r], "sys_path": paths})
            except (BrokenPipeError, OSError):
                rank.code = rank.proc.poll() or 1  # died before the case: fails it

    def poll(self) -> list[int | None]:
        return [r.poll() for r in self.ranks]

    def adopt_logs(self, workdir: Path) -> None:
        """A warm rank that died outside a case (while importing) has no case log: give the
        case its warm log, so the failure names what went wrong."""
        for rank in self.ranks:
            case_log = workdir / f"rank{rank.rank}.log"
            if rank.child is None and not case_log.exists() and rank.log.exists():
                shutil.copyfile(rank.log, case_log)

    def close(self) -> None:
        """Stop every warm rank (and any child still running) and remove the directory."""
        for rank in self.ranks:
            with contextlib.suppress(OSError):
                if rank.proc.stdin is not None:
                    rank.proc.stdin.close()  # a waiting warm rank exits on end of input
            rank.kill()
        deadline = time.monotonic() + 10
        for rank in self.ranks:
            with contextlib.suppress(subprocess.TimeoutExpired):
                rank.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            # The child is the warm rank's, not ours to reap: wait until it has exited.
            while rank.child is not None and _running(rank.child) \
                    and time.monotonic() < deadline:
                time.sleep(0.01)
            if rank.proc.stdout is not None:
                with contextlib.suppress(OSError):
                    rank.proc.stdout.close()
        self.ranks = []
        shutil.rmtree(self.directory, ignore_errors=True)


def _running(pid: int) -> bool:
    """Whether ``pid`` is a process that has not exited (a zombie has)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return False


#: The live pools, one per (world size, device, warm modules); a new environment replaces
#: the pool of the old one.
_POOLS: dict[tuple[int, str, tuple[str, ...]], RankPool] = {}


def acquire(world_size: int, device: str, warm: tuple[str, ...],
            envs: list[dict[str, str]]) -> RankPool | None:
    """The idle live pool for this key, started now if there is none; None when the pool of
    this kind is busy (a launch inside a launch: the caller launches fresh ranks)."""
    slot = (world_size, device, warm)
    key = pool_key(world_size, device, warm, envs[0])
    pool = _POOLS.get(slot)
    if pool is not None and pool.busy:
        return None
    if pool is None:
        pool = _wider(world_size, device, warm, envs[0])
        if pool is not None:
            pool.busy = True
            return pool
    if pool is not None and (pool.key != key or not pool.alive()):
        discard(pool)
        pool = None
    if pool is None:
        pool = RankPool(key, world_size, warm, envs)
        _POOLS[slot] = pool
        pool.start()
    pool.busy = True
    return pool


def _wider(world_size: int, device: str, warm: tuple[str, ...],
           env: dict[str, str]) -> RankPool | None:
    """An idle live pool for the same world size, device and environment whose warm ranks
    imported ``warm`` and more (a DeepSpeed pool for a DDP case: torch's modules are among
    DeepSpeed's), or None. Its children run the case as a pool of ``warm`` alone would: the
    modules a case's code imports are already there in both, and the others are imported,
    not run."""
    for (size, kind, modules), pool in _POOLS.items():
        if (size, kind) == (world_size, device) and set(warm) < set(modules) \
                and not pool.busy and pool.key == pool_key(size, kind, modules, env) \
                and pool.alive():
            return pool
    return None


def release(pool: RankPool, ok: bool) -> None:
    """After a case: keep the pool for the next case when every rank finished it ``ok``;
    otherwise kill the group (the next case starts fresh warm ranks)."""
    pool.busy = False
    if not ok or not pool.alive():
        discard(pool)


def discard(pool: RankPool) -> None:
    for slot, live in list(_POOLS.items()):
        if live is pool:
            del _POOLS[slot]
    pool.close()


def live_pools() -> list[RankPool]:
    """The pools alive now (for tests and the cost benchmark)."""
    return list(_POOLS.values())


def close_all() -> None:
    """End every pool: the session is over."""
    for pool in list(_POOLS.values()):
        discard(pool)


atexit.register(close_all)
