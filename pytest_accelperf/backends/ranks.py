"""A backend's multi-process side: how a ``world_size > 1`` case trains in ranks.

A backend that can train a case over several processes names, in its
:class:`~pytest_accelperf.backends.spec.BackendSpec`, a module whose ``RANKS`` is a
:class:`RankTrainer`. The trainer only says *what* every process runs (a :class:`RankJob`)
and how the run is assembled from what they reported; *where* they run is not its
business. The plugin launches them on this machine (:func:`train_in_ranks`, through
:mod:`pytest_accelperf.backends.launch`) or as Ray actors, one per host
(:mod:`pytest_accelperf.cluster.dispatch`), and hands the trainer the same
:class:`~pytest_accelperf.backends.launch.LaunchResult` either way, so a baseline recorded
one way is compared with a run taken the other.

Framework-free: importing this module imports no ML framework.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from pytest_accelperf.accel import Accelerator
from pytest_accelperf.backends.base import Fit, TrainResult
from pytest_accelperf.backends.launch import LaunchResult, launch
from pytest_accelperf.cases import Case


@dataclass(frozen=True)
class RankJob:
    """What every process of a case runs: ``fn(ctx, *args)``, where ``ctx`` is a
    :class:`~pytest_accelperf.backends._rank.RankContext` and ``fn`` a module-level
    function (it travels by reference, pickled with ``cloudpickle``; ``args`` by value).

    ``device`` is ``"cpu"`` or ``"cuda"`` (one GPU per rank); ``total_steps`` the steps
    a rank reports, for messages ("in step 3 of 12"); ``plan`` is the trainer's own note,
    handed back to :meth:`RankTrainer.result` and :meth:`RankTrainer.reference`.
    ``warm`` names the modules a pool's warm ranks import once for every case of the
    session that names the same ones (:mod:`pytest_accelperf.backends.rank_pool`: each case
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

    def job(self, case: Case, task: Any, accel: Accelerator, *, cpu_devices: int,
            platform: str | None, timeout: float | None) -> RankJob:
        """The job of ``case``; refuses (``ValueError`` naming the fix) a case it cannot
        train, before anything is launched. ``cpu_devices`` and ``platform`` are the
        session's (``platform`` None: the ranks' devices decide it)."""

    def result(self, case: Case, task: Any, accel: Accelerator, job: RankJob,
               launched: LaunchResult, *, timeout: float | None) -> TrainResult:
        """The run, from what the ranks returned or reported before the launch ended
        (``launched.outcome`` other than ``ok`` is that run's outcome)."""

    def reference(self, case: Case, task: Any, job: RankJob) -> dict[str, Any] | None:
        """For a ``reference=True`` case that trained ``ok``: the final parameters of the
        same training in one process, or None when there is none. Runs where rank 0 ran
        (here, or in rank 0's Ray worker)."""

    def platform(self, launched: LaunchResult) -> str | None:
        """The platform key the ranks saw, when they provisioned devices themselves
        (checked against the session's on a cluster); None when they did not."""

    def fits(self, case: Case, task: Any, accel: Accelerator, *,
             timeout: float | None = None) -> Fit:
        """:meth:`Backend.fits <pytest_accelperf.backends.base.Backend.fits>` for a case
        trained in ranks."""


def train_in_ranks(trainer: RankTrainer, case: Case, task: Any, accel: Accelerator, *,
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
