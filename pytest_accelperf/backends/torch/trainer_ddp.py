"""A trainer that owns its loop (Lightning's ``Trainer.fit``, transformers'
``Trainer.train``) over DDP: a case with ``world_size = N`` trains in ``N`` ranks the
plugin launches (:mod:`pytest_accelperf.backends.procs.launch`, its warm rank pool; on
``--accelperf-cluster``, one Ray worker a rank), each running the trainer over the process
group the launch set up. :class:`TrainerRanks` is the
:class:`~pytest_accelperf.backends.procs.ranks.RankTrainer` the ``lightning`` and ``hf``
backends declare (:mod:`.lightning.ddp`, :mod:`.hf.ddp`).

Both trainers accept a process group launched outside them (torchrun's, SLURM's): every
rank gets the torchelastic-style environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``). Lightning's
``TorchElasticEnvironment`` reads it (the ``Trainer``'s settings for it are Lightning's
backend's own, :func:`~.lightning.fit.trainer_settings`); accelerate, under transformers'
``Trainer``, reads the same environment and wraps the model in DDP by itself. The user's
module, model and data go in unchanged; the trainer gives each rank its share of the data
through a ``DistributedSampler``, so the loader's batch is the per-device one
(``case.batch / (N * accumulation)``; checked on the first step, as in one process).

Each rank trains as its backend trains in one process (``BACKEND.train``: the counting
training, then the measured one, the fingerprint), inside
:func:`~.torch.launched.inside`, which counts the collectives of its counted step
(:class:`~.torch.launched.CollectiveMode`). The parent (:func:`build_run`) makes the case's
run of rank 0's, as the torch backend's DDP does:

* ``step_times``, ``probe_times``, the input and the trainer's own time: rank 0's; every
  rank's step times, probe times and losses under ``details["ranks"]``;
* ``losses``: per step the mean over ranks of each rank's loss (each trained an equal
  share of the global batch: the global batch's loss);
* ``memory_per_device``: ``{"rank0": bytes, "rank1": bytes}``, each rank's count;
* ``flops_per_step``: summed over ranks; ``program``: rank 0's ops, dtypes and host syncs
  (the trainer's own included), the FLOPs summed over ranks, and per kind of collective
  the largest count and payload over ranks (:func:`~.torch.comm.largest_over_ranks`);
* ``params_fingerprint``: rank 0's training state (DDP keeps the ranks' parameters equal).

On the CPU only (gloo); a case's ``reference`` and a maximum-batch search are refused.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypedDict, cast

from pytest_accelperf.backends.measure.common import TaskError
from pytest_accelperf.backends.measure.notes import say
from pytest_accelperf.backends.procs.ranks import RankJob
from pytest_accelperf.backends.protocol import Backend, Fit, Task, TrainResult
from pytest_accelperf.collect.cases import Case
from pytest_accelperf.errors import ConfigError
from pytest_accelperf.provision.accel import Accelerator
from pytest_accelperf.records.run import Outcome, Run

if TYPE_CHECKING:
    import numpy as np

    from pytest_accelperf.backends.procs._rank import RankContext
    from pytest_accelperf.backends.procs.launch import LaunchResult
    from pytest_accelperf.backends.torch.comm import CommSummary

#: What a pool's warm ranks import once for every trainer's DDP case; each trainer adds
#: its own (its library's import is most of a fresh rank's start).
WARM_MODULES = ("cloudpickle", "numpy", "torch", "torch.distributed",
                "torch.distributed._tools.mem_tracker", "torch.utils.flop_counter",
                "pytest_accelperf.backends.torch.launched")


@dataclass(frozen=True)
class TrainerPlan:
    """What every rank is shipped (cloudpickle): the module of the backend that trains
    (its ``BACKEND``), the case, the user's task, the session's accelerator (without its
    device objects) and the timeout."""

    backend: str
    case: Case
    task: object
    accel: Accelerator
    timeout: float | None


class RankOut(TypedDict):
    """What a rank returns: its run (its own view: its losses, memory, steps), rank 0's
    final parameters, the collectives of its counted step, and the lines saying what the
    gate set in the user's place."""

    rank: int
    run: Run
    params: dict[str, np.ndarray] | None
    comm: CommSummary
    notes: list[str]


def rank_main(ctx: RankContext, plan: TrainerPlan) -> RankOut:
    """One rank (the function :func:`~.procs.launch.launch` runs in every process): its
    backend's own training, inside this rank's group."""
    import importlib

    from pytest_accelperf.backends.torch.launched import Launched, inside

    backend: Backend = importlib.import_module(plan.backend).BACKEND
    local = int(os.environ.get("LOCAL_WORLD_SIZE", ctx.world_size))
    # TorchElasticEnvironment's node rank (torchrun's GROUP_RANK; Ray: one rank a host)
    os.environ.setdefault("GROUP_RANK", str(ctx.rank // max(1, local)))
    ctx.progress(phase="train")
    with inside(Launched(ctx.rank, ctx.world_size, local)) as rank:
        result = backend.train(plan.case, plan.task, plan.accel, timeout=plan.timeout)
    return {"rank": ctx.rank, "run": result.run,
            "params": result.params if ctx.rank == 0 else None,
            "comm": rank.comm.summary(), "notes": list(result.notes)}


def _check(case: Case, accel: Accelerator) -> None:
    if accel.name != "cpu":
        raise ConfigError(f"{case.id}: a {case.backend} case of world_size > 1 trains over "
                          f"launched ranks on the CPU (gloo) only, not {accel.name!r}: run "
                          f"it with --accel=cpu, or with world_size=1")
    if case.reference:
        raise ConfigError(f"{case.id}: the {case.backend} backend has no single-device "
                          f"reference run: drop reference=True")
    parts = case.world_size * case.grad_accum
    if case.batch % parts:
        raise ConfigError(f"{case.id}: batch {case.batch} is the global batch, split over "
                          f"world_size={case.world_size} ranks x grad_accum="
                          f"{case.grad_accum}; use a multiple of {parts}")


def _mean_over_ranks(runs: list[Run]) -> list[float]:
    steps = min(len(r.losses) for r in runs)
    return [statistics.fmean(r.losses[i] for r in runs) for i in range(steps)]


class TrainerRankSummary(TypedDict):
    """One rank in ``Run.details["ranks"]`` of a trainer's case: what it measured and
    counted (as :class:`~pytest_accelperf.backends.torch.processes.RankSummary`, with the
    rank's outcome where that has its return code)."""

    rank: int
    outcome: Outcome
    step_times: list[float]
    probe_times: list[float]
    local_losses: list[float]
    peak_bytes: int | None
    flops: float | None
    comm: CommSummary


def _summary(out: RankOut) -> TrainerRankSummary:
    run = out["run"]
    return {"rank": out["rank"], "outcome": run.outcome, "step_times": run.step_times,
            "probe_times": run.probe_times, "local_losses": run.losses,
            "peak_bytes": next(iter(run.memory_per_device.values()), None),
            "flops": run.flops_per_step, "comm": out["comm"]}


def build_run(case: Case, launched: LaunchResult,
              engine: Mapping[str, object]) -> TrainResult:
    """The case's run of what its ranks returned (see the module docstring); a rank that
    raised the user's error (:class:`TaskError`, :class:`ConfigError`) raises it here, as
    one process would."""
    from pytest_accelperf.backends.torch.comm import largest_over_ranks
    from pytest_accelperf.backends.torch.processes import launch_timings

    failed = launched.failed
    if launched.outcome == "error" and failed is not None and failed.error:
        kind = failed.error.get("type")
        if kind in ("TaskError", "ConfigError"):
            error = TaskError if kind == "TaskError" else ConfigError
            raise error(f"{case.id} (rank {failed.rank}): {failed.error.get('message', '')}")
    outs = [cast("RankOut | None", r.result) for r in launched.ranks]
    if launched.outcome != "ok" or not all(outs):
        return TrainResult(run=Run(
            case_id=case.id, samples_per_step=case.batch, n_devices=case.world_size,
            outcome=launched.outcome if launched.outcome != "ok" else "error",
            message=launched.message or "a rank returned no result"))
    done = [o for o in outs if o is not None]
    runs = [o["run"] for o in done]
    zero = runs[0]
    bad = next((r for r in runs if r.outcome != "ok"), None)
    flops = [r.flops_per_step for r in runs]
    total = float(sum(f for f in flops if f)) if all(flops) else None
    program = zero.program
    if program is not None:
        collectives = largest_over_ranks([o["comm"]["collectives"] for o in done]) or {}
        program = cast(Any, {**program, "collectives": collectives})
        if total is not None:
            program["flops"] = total
    notes = list(done[0]["notes"])
    say(notes)  # rank 0's lines (said in its log), said again where the case trains
    per_rank = [o["comm"]["collectives"] or {} for o in done]
    run = dataclasses.replace(
        zero, n_devices=case.world_size, losses=_mean_over_ranks(runs),
        memory_per_device={f"rank{o['rank']}": int(v) for o in done
                           for v in o["run"].memory_per_device.values()},
        flops_per_step=total, program=program,
        outcome=bad.outcome if bad is not None else zero.outcome,
        message=bad.message if bad is not None else zero.message)
    run = run.noted(
        world_size=case.world_size,
        grad_accum=case.grad_accum,
        micro_batch=case.batch // (case.world_size * case.grad_accum),
        loss="mean over ranks of each rank's loss (the global batch's loss)",
        memory=f"per rank: the {case.backend} backend's count in each rank",
        engine=engine,
        launch_seconds=round(launched.elapsed, 3),
        timings=launch_timings(launched, None),
        ranks=[_summary(o) for o in done],
        comm={"counted_steps": [int(o["comm"]["steps"]) for o in done],
              "same_each_step": all(o["comm"]["same_each_step"] for o in done),
              "symmetric": all(c == per_rank[0] for c in per_rank),
              "record": "per kind, the largest count and payload bytes over ranks, of the "
                        "counted optimizer step, from the dispatcher's c10d ops"})
    return TrainResult(run=run, params=done[0]["params"] or {}, notes=notes)


@dataclass(frozen=True)
class TrainerRanks:
    """A trainer backend's :class:`~pytest_accelperf.backends.procs.ranks.RankTrainer` (its
    spec's ``ranks``): :func:`rank_main` in every rank, with ``backend`` (the module of its
    ``BACKEND``) and ``task_type`` (the task it trains); :func:`build_run` of what they
    return, with ``engine`` as the run's ``details["engine"]``. ``warm``: what a pool's
    warm ranks import beside :data:`WARM_MODULES`."""

    backend: str
    task_type: type
    engine: Mapping[str, object]
    warm: tuple[str, ...] = ()

    def job(self, case: Case, task: Task, accel: Accelerator, *, cpu_devices: int,
            platform: str | None, timeout: float | None) -> RankJob:
        if not isinstance(task, self.task_type):
            raise TaskError(f"the {case.backend} backend trains a {self.task_type.__name__}; "
                            f"got {type(task).__name__}")
        _check(case, accel)
        bare = Accelerator(name=accel.name, platform=accel.platform,
                           device_kind=accel.device_kind, device_count=accel.device_count,
                           memory_capacity=accel.memory_capacity, peak_flops=accel.peak_flops)
        plan = TrainerPlan(self.backend, case, task, bare, timeout)
        return RankJob(rank_main, (plan,), device="cpu", total_steps=case.warmup + case.steps,
                       plan=plan, warm=(*WARM_MODULES, *self.warm, self.backend))

    def result(self, case: Case, task: Task, accel: Accelerator, job: RankJob,
               launched: LaunchResult, *, timeout: float | None) -> TrainResult:
        return build_run(case, launched, self.engine)

    def reference(self, case: Case, task: Task, job: RankJob) -> dict[str, np.ndarray] | None:
        return None  # refused at job()

    def platform(self, launched: LaunchResult) -> str | None:
        return None  # the ranks take the devices they are given

    def fits(self, case: Case, task: Task, accel: Accelerator, *,
             timeout: float | None = None) -> Fit:
        raise ConfigError(f"{case.id}: the {case.backend} backend searches a maximum batch "
                          f"in one process only (world_size=1)")
