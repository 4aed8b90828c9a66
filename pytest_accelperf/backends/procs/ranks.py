"""A backend's multi-process side: how a ``world_size > 1`` case trains in ranks.

A backend that can train a case over several processes names, in its
:class:`~pytest_accelperf.backends.spec.BackendSpec`, a module whose ``RANKS`` is a
:class:`RankTrainer`. The trainer only says *what* every process runs (a :class:`RankJob`)
and how the run is assembled from what they reported; *where* they run is not its
business. The plugin launches them on this machine (:func:`train_in_ranks`, through
:mod:`pytest_accelperf.backends.procs.launch`) or as Ray actors, one per host
(:mod:`pytest_accelperf.cluster.dispatch`), and hands the trainer the same
:class:`~pytest_accelperf.backends.procs.launch.LaunchResult` either way, so a baseline recorded
one way is compared with a run taken the other.

A trainer may also train a case in *blocks of steps on demand*, for A/B mode
(:mod:`pytest_accelperf.ab.rank_groups`): its ``block_job(case, task, accel, control)`` returns
the job of a long-lived group whose ranks build and warm up the engine as a run does, then
take orders through :class:`BlockControl` (:func:`serve_blocks`: "run n steps", timed by
the same loop as a run's, :func:`~pytest_accelperf.backends.measure.loop.time_block`), and its
``block_program(job, ready)`` makes the program record from what the ranks reported when
ready. A trainer without them (JAX over processes) keeps its cases out of A/B mode.

Framework-free: importing this module imports no ML framework.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from multiprocessing.connection import Connection, Listener
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from pytest_accelperf.backends.measure.loop import StepFns, time_block
from pytest_accelperf.backends.procs.launch import LaunchResult, launch
from pytest_accelperf.backends.protocol import Fit, Task, TrainResult
from pytest_accelperf.collect.cases import Case
from pytest_accelperf.provision.accel import Accelerator

if TYPE_CHECKING:
    import numpy as np


@dataclass(frozen=True)
class RankJob:
    """What every process of a case runs: ``fn(ctx, *args)``, where ``ctx`` is a
    :class:`~pytest_accelperf.backends.procs._rank.RankContext` and ``fn`` a module-level
    function (it travels by reference, pickled with ``cloudpickle``; ``args`` by value).

    ``device`` is ``"cpu"`` or ``"cuda"`` (one GPU per rank); ``total_steps`` the steps
    a rank reports, for messages ("in step 3 of 12"); ``plan`` is the trainer's own note,
    handed back to :meth:`RankTrainer.result` and :meth:`RankTrainer.reference`.
    ``warm`` names the modules a pool's warm ranks import once for every case of the
    session that names the same ones (:mod:`pytest_accelperf.backends.procs.rank_pool`: each case
    still runs in a process of its own, forked from them); None (the default) launches
    fresh ranks for every case, as a job whose ranks keep state that a fork cannot carry
    (threads, an initialized device) must.
    """

    fn: Callable[..., Any]
    args: tuple[Any, ...]
    device: str = "cpu"
    total_steps: int | None = None
    plan: Any = None
    warm: tuple[str, ...] | None = None


class RankTrainer(Protocol):
    """What the plugin needs of a backend's multi-process training (its spec's ``ranks``)."""

    def job(self, case: Case, task: Task, accel: Accelerator, *, cpu_devices: int,
            platform: str | None, timeout: float | None) -> RankJob:
        """The job of ``case``; refuses (``ValueError`` naming the fix) a case it cannot
        train, before anything is launched. ``cpu_devices`` and ``platform`` are the
        session's (``platform`` None: the ranks' devices decide it)."""

    def result(self, case: Case, task: Task, accel: Accelerator, job: RankJob,
               launched: LaunchResult, *, timeout: float | None) -> TrainResult:
        """The run, from what the ranks returned or reported before the launch ended
        (``launched.outcome`` other than ``ok`` is that run's outcome)."""

    def reference(self, case: Case, task: Task, job: RankJob) -> dict[str, np.ndarray] | None:
        """For a ``reference=True`` case that trained ``ok``: the final parameters of the
        same training in one process, or None when there is none. Runs where rank 0 ran
        (here, or in rank 0's Ray worker)."""

    def platform(self, launched: LaunchResult) -> str | None:
        """The platform key the ranks saw, when they provisioned devices themselves
        (checked against the session's on a cluster); None when they did not."""

    def fits(self, case: Case, task: Task, accel: Accelerator, *,
             timeout: float | None = None) -> Fit:
        """:meth:`Backend.fits <pytest_accelperf.backends.protocol.Backend.fits>` for a case
        trained in ranks."""


def train_in_ranks(trainer: RankTrainer, case: Case, task: Task, accel: Accelerator, *,
                   cpu_devices: int | None = None, platform: str | None = None,
                   timeout: float | None = None) -> TrainResult:
    """Train ``case`` in ``case.world_size`` processes launched on this machine.

    ``cpu_devices`` and ``platform`` default to ``accel``'s own: the ranks see this
    machine's devices under this session's platform key.
    """
    job = trainer.job(case, task, accel,
                      cpu_devices=accel.device_count if cpu_devices is None else cpu_devices,
                      platform=accel.platform if platform is None else platform,
                      timeout=timeout)
    launched = launch(job.fn, job.args, case.world_size, device=job.device, timeout=timeout,
                      total_steps=job.total_steps, warm=job.warm)
    result = trainer.result(case, task, accel, job, launched, timeout=timeout)
    if case.reference and result.run.outcome == "ok":
        result.reference_params = trainer.reference(case, task, job)
    return result


# -- blocks of steps on demand (A/B mode) ---------------------------------------------------
@dataclass(frozen=True)
class BlockControl:
    """How a rank of an A/B group takes its orders (it travels to the ranks in the job's
    arguments): rank ``r`` listens on ``directory/rank{r}.sock`` (a directory only the arm
    worker's user can enter) for the one connection of the arm worker, which must know
    ``authkey``."""

    directory: str
    authkey: bytes

    def socket(self, rank: int) -> Path:
        return Path(self.directory) / f"rank{rank}.sock"

    def connect(self, rank: int) -> Connection:
        """In rank ``rank``: wait for the arm worker's connection and say who this is
        (``("hello", rank, pid)``). A rank whose worker is gone dies with it
        (``PR_SET_PDEATHSIG``), so the wait needs no deadline."""
        listener = Listener(str(self.socket(rank)), family="AF_UNIX", authkey=self.authkey)
        try:
            conn = listener.accept()
        finally:
            listener.close()
        conn.send(("hello", rank, os.getpid()))
        return conn


def serve_blocks(conn: Connection, fns: StepFns[Any, Any], *, first: int, cycle: int,
                 ready: Mapping[str, object], done: Callable[[int], None] | None = None) -> int:
    """A rank of an A/B group after its warm-up: send ``("ready", ready)``, then for every
    ``("run", n)`` train steps ``first, first + 1, ...`` (batches modulo ``cycle``) with
    ``fns``, timed as in a run (:func:`~pytest_accelperf.backends.measure.loop.time_block`), and
    send ``("times", seconds)``; ``done(steps so far)`` is called once ready and after
    each block (the rank's progress report, for a failure's message). Returns the number
    of blocks at ``("stop",)``. Every rank
    gets every order, and the step's own barrier starts them together. A connection that
    closes (the worker is gone) raises ``EOFError``: the rank fails."""
    conn.send(("ready", ready))
    if done is not None:
        done(first)
    blocks = 0
    while True:
        order = conn.recv()
        if order[0] == "stop":
            conn.close()
            return blocks
        if order[0] != "run":
            raise ValueError(f"an A/B rank takes ('run', n) or ('stop',), not {order!r}")
        n = int(order[1])
        times, _ = time_block(fns, first, n, cycle)
        first += n
        blocks += 1
        conn.send(("times", times))
        if done is not None:
            done(first)
