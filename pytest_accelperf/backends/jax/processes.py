"""A JAX case over several processes ("hosts"): ``world_size`` processes joined by
``jax.distributed.initialize``, each with ``1 / world_size`` of the platform's devices, all
running the JAX backend's own training on the global mesh (multi-controller JAX).

This module is the JAX backend's ranks (``RANKS``, named by its spec): the plugin, not the
JAX backend, sends a ``world_size > 1`` case here (:mod:`pytest_accelperf.gate.routing`).
Without a cluster the processes are launched on this machine by
:mod:`pytest_accelperf.backends.procs.launch` (coordinator on 127.0.0.1); on a Ray cluster
(:mod:`pytest_accelperf.cluster`) they are actors, one per host. Either way each process
runs :func:`rank_main`: :func:`join`, then ``JaxBackend.train``, so a baseline recorded one
way is compared with a run taken the other. Each process reports its steps as it trains,
so a process that dies or is killed at the timeout leaves them behind. On ``cpu`` the
collectives between processes go over gloo (``jax_cpu_collectives_implementation``), and
the virtual devices are split:
``--accelperf-cpu-devices=8`` at ``world_size=2`` is 4 per process, 8 in the mesh.
"""

from __future__ import annotations

import importlib
import os
import re
from typing import TYPE_CHECKING, Any

from pytest_accelperf.backends.measure import progress
from pytest_accelperf.backends.procs.launch import LaunchResult
from pytest_accelperf.backends.procs.ranks import RankJob
from pytest_accelperf.backends.protocol import Fit, Task, TrainResult
from pytest_accelperf.collect.cases import Case
from pytest_accelperf.errors import ConfigError
from pytest_accelperf.provision.accel import Accelerator
from pytest_accelperf.records.run import Outcome, Run

if TYPE_CHECKING:
    import numpy as np

    from pytest_accelperf.backends.procs._rank import RankContext

_COUNT_FLAG = "--xla_force_host_platform_device_count"


def check_case(case: Case, accel: Accelerator) -> None:
    """Refuse what a multi-process JAX case cannot be, with the fix."""
    if case.reference:
        raise ConfigError(f"{case.id}: the single-device reference of a JAX case spanning "
                         f"{case.world_size} processes has no device every process shares; "
                         f"drop reference=True or world_size")
    if accel.device_count % case.world_size:
        raise ConfigError(f"{case.id}: the {accel.device_count} devices of {accel.platform} "
                         f"do not split over {case.world_size} processes; pass "
                         f"--accelperf-cpu-devices as a multiple of {case.world_size}")


def local_xla_flags(flags: str, devices: int) -> str:
    """``flags`` with this process's virtual CPU device count.

    >>> local_xla_flags("--xla_force_host_platform_device_count=8 --foo", 4)
    '--foo --xla_force_host_platform_device_count=4'
    """
    kept = re.sub(rf"{_COUNT_FLAG}=\S+", "", flags).split()
    return " ".join([*kept, f"{_COUNT_FLAG}={devices}"])


def join(coordinator: str, n_processes: int, process_id: int, accel: str,
         local_devices: int) -> None:
    """Make this (fresh) process ``process_id`` of ``n_processes``: its share of virtual
    devices on ``cpu``, gloo collectives, and ``jax.distributed.initialize``. Must run
    before anything initializes a jax backend in this process."""
    if accel == "cpu":
        os.environ["XLA_FLAGS"] = local_xla_flags(os.environ.get("XLA_FLAGS", ""),
                                                  local_devices)
        os.environ["JAX_PLATFORMS"] = "cpu"
    jax: Any = importlib.import_module("jax")  # untyped calls below
    if accel == "cpu":
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=coordinator, num_processes=n_processes,
                               process_id=process_id)


def train_here(case: Case, task: Task, accel: str, cpu_devices: int, platform: str | None,
               timeout: float | None) -> tuple[str, TrainResult]:
    """After :func:`join`: the JAX backend's training over the global devices, and the
    platform key this process sees."""
    from pytest_accelperf.backends.jax.backend import BACKEND
    from pytest_accelperf.provision.accel import provision

    acc = provision(accel, cpu_devices, platform)
    return acc.platform, BACKEND.train(case, task, acc, timeout=timeout)


class _RankSteps:
    """A progress sink (:mod:`pytest_accelperf.backends.measure.progress`) that reports
    each step the JAX backend trains as a launched rank's ``progress`` event."""

    def __init__(self, ctx: RankContext) -> None:
        self._ctx = ctx

    def update(self, done: int, total: int, loss: float, step_time: float) -> None:
        self._ctx.progress(phase="train", step=done - 1, total=total, loss=loss,
                           time=step_time)

    def close(self) -> None:
        pass


def rank_main(ctx: RankContext, case: Case, task: Task, accel: str, cpu_devices: int,
              platform: str | None, timeout: float | None
              ) -> tuple[str, TrainResult] | None:
    """One process of the case, launched here or a Ray actor (see :mod:`.launch`):
    process 0 returns the platform key it saw and its result, which is the run."""
    coordinator = f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
    ctx.progress(phase="init")
    join(coordinator, ctx.world_size, ctx.rank, accel, cpu_devices // ctx.world_size)
    with progress.reporting(_RankSteps(ctx)):
        seen, result = train_here(case, task, accel, cpu_devices, platform, timeout)
    return (seen, result) if ctx.rank == 0 else None


class JaxProcesses:
    """The JAX backend's :class:`~pytest_accelperf.backends.procs.ranks.RankTrainer`: every
    process runs :func:`rank_main`; process 0's result is the run."""

    def job(self, case: Case, task: Task, accel: Accelerator, *, cpu_devices: int,
            platform: str | None, timeout: float | None) -> RankJob:
        check_case(case, accel)
        return RankJob(rank_main, (case, task, accel.name, cpu_devices, platform, timeout),
                       total_steps=case.warmup + case.steps)

    def result(self, case: Case, task: Task, accel: Accelerator, job: RankJob,
               launched: LaunchResult, *, timeout: float | None) -> TrainResult:
        if launched.outcome != "ok":
            outcome: Outcome = "timeout" if launched.outcome == "timeout" else "error"
            done = [s for s in launched.ranks[0].steps if "loss" in s]  # what it reported
            return TrainResult(run=Run(
                case_id=case.id, outcome=outcome, message=launched.message,
                samples_per_step=case.batch, n_devices=case.n_devices,
                losses=[float(s["loss"]) for s in done],
                loss_steps=[int(s["step"]) for s in done]))
        _, result = launched.ranks[0].result
        assert isinstance(result, TrainResult)
        result.run = result.run.noted(processes=case.world_size)
        return result

    def reference(self, case: Case, task: Task, job: RankJob) -> dict[str, np.ndarray] | None:
        return None  # check_case refuses reference=True: no device every process shares

    def platform(self, launched: LaunchResult) -> str | None:
        if launched.outcome != "ok":
            return None
        seen, _ = launched.ranks[0].result
        return str(seen)

    def fits(self, case: Case, task: Task, accel: Accelerator, *,
             timeout: float | None = None) -> Fit:
        """The JAX backend's own answer (a compile and its memory analysis), here."""
        from pytest_accelperf.backends.jax.backend import BACKEND

        return BACKEND.fits(case, task, accel, timeout=timeout)


#: The JAX backend's ranks (its spec's ``ranks``).
RANKS = JaxProcesses()


