"""A/B mode for cases trained in ranks (DDP, DeepSpeed): one arm's long-lived rank group.

A single-process case is trained in blocks inside the arm worker itself; a case with
``world_size`` ranks cannot be (its engine lives in ``world_size`` processes joined in a
process group). So for such a case the arm worker starts a group of ranks of its own,
from its revision's files, and keeps it for the whole comparison of the case
(:class:`RankGroupStepper`):

* The group is launched as a run's ranks are (:func:`~pytest_accelperf.backends.procs.launch.
  start_group`: gloo on the CPU, one thread per core and rank, forked from the worker's
  own pool of warm ranks where the backend pools them), with the job of the backend's
  :class:`~pytest_accelperf.backends.procs.ranks.RankTrainer` ``block_job``. Each rank waits for
  the worker's connection on a socket of its own (:class:`~pytest_accelperf.backends.
  ranks.BlockControl`), builds the engine and warms up exactly as in a run, and reports
  ready.
* :meth:`RankGroupStepper.run` sends every rank "run ``n`` steps"; they train them with the
  run's own step functions and loop (:func:`~pytest_accelperf.backends.procs.ranks.
  serve_blocks`: each step starts after a barrier and ends synchronized) and send back
  their step times; the block's times are rank 0's, as a run's are. Between blocks the
  ranks wait on their sockets, using no CPU while the other arm is measured.
* :meth:`RankGroupStepper.close` (the case is done) tells the ranks to stop and waits for
  them; any that do not exit are killed with the group.

A rank that dies or raises, or a group that does not answer within
:data:`PREPARE_S` / :data:`BLOCK_S`, ends the whole group at once (``SIGKILL`` to every
rank, as a failed launch is ended) and raises :class:`RankGroupError` naming the rank, the
step and the tail of its output: the arm worker reports it, and only this case's
comparison fails. The ranks also die with their arm worker (``PR_SET_PDEATHSIG``).

The ranks import the plugin from where the arm worker has it (the working tree's, in both
arms: a directory holding only a link to it comes first on their ``PYTHONPATH``);
everything else, the suite's model and training code included, from the arm's own
``sys.path``.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import secrets
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from multiprocessing.connection import Client, Connection, wait
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, Protocol

from pytest_accelperf.ab.tree import socket_dir
from pytest_accelperf.backends.procs.launch import LaunchResult, RankGroup, start_group
from pytest_accelperf.backends.procs.ranks import BlockControl

if TYPE_CHECKING:
    from pytest_accelperf.backends.procs.ranks import RankJob
    from pytest_accelperf.backends.protocol import Task
    from pytest_accelperf.collect.cases import Case
    from pytest_accelperf.provision.accel import Accelerator
    from pytest_accelperf.records.program import ProgramRecord

#: Seconds a group may take to start, build its engine and warm up, by default (the worker
#: passes 90 % of ``--accelperf-compare-prepare-timeout``: below the controller's deadline
#: for a whole ``prepare``, so the worker answers with the reason first).
PREPARE_S = 540.0
#: Seconds one block may take (below the controller's 300 s).
BLOCK_S = 240.0
#: Seconds the ranks get to exit after "stop" before they are killed.
STOP_S = 30.0
#: Seconds between checks of the ranks' health while waiting for them.
POLL_S = 0.2


class RankGroupError(RuntimeError):
    """A rank of an A/B group died, raised or hung; the group was ended."""


_SHIM: list[Path] = []


def plugin_shim() -> Path:
    """A directory holding only ``pytest_accelperf`` (a link to this process's plugin), for
    the front of the ranks' ``PYTHONPATH``: the base revision's tree may hold a plugin of
    its own, and the ranks must run the same one as the arm worker. One per process, for
    its lifetime (a pool's warm ranks keep the path they were started with)."""
    if not _SHIM:
        shim = Path(tempfile.mkdtemp(prefix="accelperf-ab-plugin-"))
        (shim / "pytest_accelperf").symlink_to(Path(__file__).resolve().parents[1],
                                               target_is_directory=True)
        atexit.register(shutil.rmtree, shim, ignore_errors=True)
        _SHIM.append(shim)
    return _SHIM[0]


class BlockTrainer(Protocol):
    """What a backend's ``RankTrainer`` has beyond the protocol when its ranks train a case
    in blocks of steps on demand (the torch backend's)."""

    def block_job(self, case: Case, task: Task, accel: Accelerator,
                  control: BlockControl) -> RankJob: ...

    def block_program(self, job: RankJob,
                      messages: Sequence[object]) -> ProgramRecord | None: ...


class RankGroupStepper:
    """One case's ranks in one arm, trained in blocks of steps on demand (see the module
    doc). ``trainer`` is the backend's :class:`~pytest_accelperf.backends.procs.ranks.
    RankTrainer` (with ``block_job`` and ``block_program``); ``task`` the case's task as
    this arm's test function built it. Raises :class:`RankGroupError` when the group
    fails to start (nothing is left running)."""

    def __init__(self, trainer: BlockTrainer, case: Case, task: Task, accel: Accelerator,
                 prepare_s: float = PREPARE_S) -> None:
        self._case = case
        self._dir = socket_dir("accelperf-ab-ranks-", "rank999.sock")
        self._conns: list[Connection] = []
        self._group: RankGroup | None = None
        #: The ranks' process ids (what the contention reading must not count as foreign).
        self.pids: list[int] = []
        #: The group's program record (:mod:`pytest_accelperf.records.program`), or None.
        self.program: ProgramRecord | None = None
        try:
            control = BlockControl(str(self._dir), secrets.token_bytes(16))
            job = trainer.block_job(case, task, accel, control)
            paths = [str(plugin_shim()), *(p or os.getcwd() for p in sys.path)]
            self._group = start_group(job.fn, job.args, case.world_size,
                                      workdir=self._dir / "launch", device=job.device,
                                      warm=job.warm,  # blocks go on past a run's steps
                                      env={"PYTHONPATH": os.pathsep.join(paths)})
            deadline = time.monotonic() + prepare_s
            self._connect(control, deadline)
            ready = self._gather("ready", deadline, "building the engine and warming up")
            self.program = trainer.block_program(job, ready)
        except BaseException:
            self.close()
            raise

    def run(self, n: int) -> list[float]:
        """Train ``n`` more steps in every rank; rank 0's step times in seconds."""
        for conn in self._conns:
            self._send(conn, ("run", n))
        times: list[list[float]] = self._gather("times", time.monotonic() + BLOCK_S,
                                                f"a block of {n} steps")
        return [float(t) for t in times[0]]

    def close(self) -> LaunchResult | None:
        """Stop the ranks (killed if they do not exit within :data:`STOP_S`) and remove the
        group's files; returns how the group ended (None if it never started)."""
        for conn in self._conns:
            with contextlib.suppress(OSError, ValueError):
                conn.send(("stop",))
        result = self._group.wait(STOP_S) if self._group is not None else None
        for conn in self._conns:
            conn.close()
        self._conns = []
        shutil.rmtree(self._dir, ignore_errors=True)
        return result

    # -- waiting on the ranks, watching their health -------------------------------------
    def _connect(self, control: BlockControl, deadline: float) -> None:
        """Connect to every rank's socket as it appears, and read its hello."""
        conns: dict[int, Connection] = {}
        while len(conns) < self._case.world_size:
            for rank in range(self._case.world_size):
                path = control.socket(rank)
                if rank not in conns and path.exists():
                    try:
                        conn = Client(str(path), family="AF_UNIX", authkey=control.authkey)
                    except (OSError, EOFError):
                        continue  # bound, not yet listening (or gone): next poll
                    conns[rank] = conn
                    hello = self._receive(conn, deadline, "starting")
                    self.pids.append(int(hello[2]))
            if len(conns) < self._case.world_size:
                self._check(deadline, "starting")
                time.sleep(POLL_S / 4)
        self._conns = [conns[r] for r in range(self._case.world_size)]

    def _gather(self, kind: str, deadline: float, doing: str) -> list[Any]:
        """Every rank's next message, which must be ``(kind, payload)``: the payloads."""
        out: dict[int, Any] = {}
        while len(out) < len(self._conns):
            pending = [c for r, c in enumerate(self._conns) if r not in out]
            for conn in wait(pending, timeout=POLL_S):
                assert isinstance(conn, Connection)
                message = self._receive(conn, deadline, doing)
                if message[0] != kind:
                    self._fail(f"a rank answered {message[0]!r} where {kind!r} was due")
                out[self._conns.index(conn)] = message[1]
            if len(out) < len(self._conns):
                self._check(deadline, doing)
        return [out[r] for r in range(len(self._conns))]

    def _receive(self, conn: Connection, deadline: float, doing: str) -> tuple[Any, ...]:
        """The next message of a rank, by ``deadline`` (past it the group is ended); a rank
        that is gone raises (see :meth:`_check`)."""
        try:
            while not conn.poll(POLL_S):
                self._check(deadline, doing)
            message: tuple[Any, ...] = conn.recv()
            return message
        except (EOFError, OSError):  # the rank is gone: say how, once the launcher knows
            self._check(time.monotonic() + 10, doing, wait_for_exit=True)
            self._fail(f"a rank closed its connection while {doing}")

    def _send(self, conn: Connection, message: tuple[Any, ...]) -> None:
        try:
            conn.send(message)
        except OSError:
            self._check(time.monotonic() + 10, "taking its orders", wait_for_exit=True)
            self._fail("a rank closed its connection")

    def _check(self, deadline: float, doing: str, wait_for_exit: bool = False) -> None:
        """Raise :class:`RankGroupError` (the group ended) when a rank has failed, or past
        ``deadline``. With ``wait_for_exit``, wait until ``deadline`` for a rank that is
        going away to be seen exiting."""
        assert self._group is not None
        while True:
            if self._group.failed():
                result = self._group.wait(0)
                raise RankGroupError(f"{self._case.id}: {result.message}")
            if time.monotonic() > deadline:
                if wait_for_exit:
                    return
                self._fail(f"the ranks did not finish {doing} in time")
            if not wait_for_exit:
                return
            time.sleep(POLL_S / 4)

    def _fail(self, why: str) -> NoReturn:
        """End the group (what has not exited is killed) and raise with ``why``."""
        assert self._group is not None
        result = self._group.wait(0)
        if result.outcome in ("error", "oom"):
            raise RankGroupError(f"{self._case.id}: {result.message}")
        where = ", ".join(f"rank {r.rank}: {r.where()}" for r in result.ranks)
        raise RankGroupError(f"{self._case.id}: {why} ({where}); all {len(result.ranks)} "
                             f"ranks were killed")
