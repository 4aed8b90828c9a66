"""Multi-process torch training, the parent's side: DDP's and DeepSpeed's ranks launched,
and their run made of what they return.

A case with ``world_size = N`` trains a
:class:`~pytest_accelperf.backends.torch.rank_step.RankStep` (the user's ``build(rank)`` and loss;
a :class:`~pytest_accelperf.backends.torch.task.TorchTask` is converted to one) in ``N``
processes (gloo on the
CPU, nccl on CUDA, one GPU per rank), launched on this machine by
:mod:`pytest_accelperf.backends.procs.launch` or as Ray actors. Which engine wraps the model in
each rank is the plan's ``engine`` (a :class:`~.in_rank.RankEngine` class): DDP's
(:mod:`pytest_accelperf.backends.torch.ddp`) or DeepSpeed's
(:mod:`pytest_accelperf.backends.torch.deepspeed`); this module knows neither. :class:`TorchRanks`
is the :class:`~pytest_accelperf.backends.procs.ranks.RankTrainer` both of them declare.

This module is the parent process's code: it makes the plan (:func:`make_plan`), launches
the ranks or hands them to Ray (:class:`TorchRanks`), builds the run of what they returned
(:func:`build_run`) and trains the single-process reference (:func:`train_reference`). What
runs inside a rank (the plan it is shipped and :func:`~.in_rank.rank_main`, its loop) is
:mod:`pytest_accelperf.backends.torch.in_rank`.

Data parallel: ``step.make_batch(i)`` is the *global* batch of ``case.batch`` samples of
optimizer step ``i``, the one a single process would train on, and rank ``r`` trains on rows
``[r * b, (r + 1) * b)`` of every tensor in it (``b = case.batch / N``), cut into
``case.grad_accum`` consecutive micro-batches (``case.batch / (N * grad_accum)`` samples,
which must divide). Each micro-batch: ``loss_fn``, ``engine.backward``, ``engine.step``
(the engine steps the optimizer and the schedule at the last one). With a loss that is a
mean over the batch, gradients averaged over micro-batches and ranks are the gradients of
the global batch: the same training as one process (the reference).

What each rank measures, and how the run is assembled from it:

* ``step_times``: every rank times each measured step (forward, backward, optimizer step),
  starting together after a barrier and stopping after the device is synchronized. The
  run's ``step_times`` are rank 0's; ``extra["ranks"]`` keeps every rank's.
* ``losses``: the loss of the global batch at every step, i.e. the mean over ranks and
  micro-batches of the micro-batch losses (an all-reduce after the timer); ``metrics``:
  every other scalar ``loss_fn`` returns, averaged the same way, and the learning rate the
  step used (``lr``). A non-finite one ends the run
  as ``nan`` on every rank at the same step.
* ``probe_times``: after each measured step, every rank runs the drift probe
  (:func:`~pytest_accelperf.backends.torch.task.torch_probe`) at once, so the machine is as
  busy as during the step; rank 0's times are the run's.
* ``memory_per_device``: ``{"rank0": bytes, "rank1": bytes, ...}``. CUDA: each rank's
  ``torch.cuda.max_memory_allocated`` over the whole run. CPU (no allocator counter):
  ``MemTracker`` (live tensor storage bytes) in each rank over the engine's construction
  (model, optimizer, ZeRO partitions and buckets) and its first :data:`~.in_rank.MEMORY_STEPS`
  warm-up steps; those steps are never timed. A rank whose count exceeds the case's
  ``memory_capacity`` stops with the outcome ``oom`` at that step (before step 0: "cannot
  even initialize model").
* ``flops_per_step``: ``FlopCounterMode`` over the forward and backward of the first
  micro-batch of step 0 (a warm-up step) in every rank, times ``grad_accum``, summed over
  ranks.
* ``program``: the collectives each rank counted (:mod:`.torch.comm`), the FLOPs, and what
  rank 0 dispatched in the same counted call (:mod:`.torch.ops`: aten ops by dtype, the
  bytes they move, host syncs), times ``grad_accum``: the user's forward and backward and
  what the engine does inside ``backward`` on that micro-batch; the engine's optimizer
  step is not in it, nor, with ``grad_accum > 1``, the reduction the boundary micro-batch
  adds. Not counted for a compiled model (its eager ops are not what it runs).
* ``compile=True``: the model is compiled (``engine.compile()``) right after the
  :data:`~.in_rank.MEMORY_STEPS` counted steps, and the warm-up is one step longer, so the compile
  happens in an untimed step. The first steps run eager on purpose: MemTracker and
  FlopCounterMode are dispatch modes, and a model whose first compiled call meets one is
  skipped by dynamo for good ("non-infra torch dispatch mode present"), i.e. silently
  eager. The memory and FLOP counts are therefore the eager model's.
* Final parameters: gathered on rank 0 (for ZeRO-3 with ``GatheredParameters``), then
  ``params_fingerprint`` and, with ``case.reference``, a comparison with the same task
  trained in one process by plain torch on the full global batch (:func:`train_reference`,
  where rank 0 ran).

The warm-up is at least :data:`~.in_rank.MEMORY_STEPS` steps (``max(case.warmup, 2)``): the
CPU memory count and the FLOP count happen there. The reference trains as many steps.
"""


from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, TypedDict, cast

import numpy as np
import torch

from pytest_accelperf.backends.measure.common import TaskError, fingerprint
from pytest_accelperf.backends.measure.data import expect
from pytest_accelperf.backends.measure.recording import RunBuilder
from pytest_accelperf.backends.procs.launch import LaunchResult, RankReport, launch
from pytest_accelperf.backends.procs.ranks import BlockControl, RankJob
from pytest_accelperf.backends.protocol import Fit, Task, TrainResult
from pytest_accelperf.backends.torch.comm import CommSummary, largest_over_ranks
from pytest_accelperf.backends.torch.in_rank import (
    MEMORY_STEPS,
    EngineFactory,
    RankPlan,
    RankReady,
    RankResult,
    rank_main,
)
from pytest_accelperf.backends.torch.ops import OpCounts
from pytest_accelperf.backends.torch.rank_step import RankStep, as_rank_step
from pytest_accelperf.backends.torch.task import TorchTask, to_device
from pytest_accelperf.collect.cases import Case
from pytest_accelperf.errors import ConfigError
from pytest_accelperf.provision.accel import Accelerator
from pytest_accelperf.records.program import ProgramRecord, program_record
from pytest_accelperf.records.run import OomRecord, Run
from pytest_accelperf.stats.contention import Load

#: What a pool's warm ranks import for every torch engine
#: (:mod:`pytest_accelperf.backends.procs.rank_pool`); the engine class adds its own.
WARM_MODULES = ("cloudpickle", "numpy", "torch", "torch.distributed",
                "torch.distributed._tools.mem_tracker", "torch.utils.flop_counter",
                "pytest_accelperf.backends.torch.in_rank")


def resolve_clip(case: Case, task: TorchTask | RankStep) -> float | None:
    """The gradient clipping of a multi-process case: ``case.grad_clip`` or
    ``task.grad_clip`` (the two must agree when both are set); None for no clipping."""
    if case.grad_clip is not None and task.grad_clip is not None \
            and case.grad_clip != task.grad_clip:
        raise ConfigError(f"{case.id}: case.grad_clip={case.grad_clip} and the task's "
                         f"grad_clip={task.grad_clip} disagree: set one of them")
    return case.grad_clip if case.grad_clip is not None else task.grad_clip


def micro_batch(case: Case) -> int:
    """Samples per rank and micro-batch: ``case.batch / (world_size * grad_accum)``, which
    must be a whole number (``case.batch`` is the global batch of one optimizer step)."""
    parts = case.world_size * case.grad_accum
    if case.batch % parts:
        how = (f"world_size={case.world_size} ranks" if case.grad_accum == 1 else
               f"world_size={case.world_size} ranks x grad_accum={case.grad_accum} "
               f"micro-batches")
        raise ConfigError(
            f"{case.id}: batch {case.batch} is the global batch, split evenly over {how}; "
            f"{case.batch} is not divisible by {parts}: use a batch that is a multiple of "
            f"{parts}")
    return case.batch // parts


def device_type(case: Case, accel: Accelerator) -> str:
    """``"cpu"`` or ``"cuda"`` for ``accel``; CUDA needs a GPU per rank."""
    if accel.name == "cpu":
        return "cpu"
    if accel.name == "gpu":
        count = torch.cuda.device_count()
        if count < case.world_size:
            raise ConfigError(
                f"{case.id} launches {case.world_size} ranks, one GPU each, but torch sees "
                f"{count} CUDA device(s): run it on a host with {case.world_size} GPUs, or "
                f"lower world_size")
        return "cuda"
    raise ConfigError(f"multi-process torch cases run on cpu or gpu, not {accel.name!r}: "
                     f"declare the case with accels=('cpu', 'gpu')")


def make_plan(engine: EngineFactory, case: Case, task: TorchTask | RankStep,
              accel: Accelerator, fits: bool = False) -> RankPlan:
    """The plan of ``case`` with ``engine`` for ``task`` (a :class:`RankStep`, or a
    :class:`TorchTask`, trained as its :func:`~.rank_step.from_task`); refuses a batch the
    ranks cannot split."""
    micro_batch(case)
    step = as_rank_step(task)
    return RankPlan(engine, case, step, device_type(case, accel), resolve_clip(case, step),
                    fits=fits)


class RankSummary(TypedDict):
    """One rank in ``Run.details["ranks"]``: what it measured and counted, from its result
    (:class:`~.torch.in_rank.RankResult`) or, for a rank that failed, its progress."""

    rank: int
    returncode: int | None
    step_times: list[float]
    probe_times: list[float]
    local_losses: list[float]
    peak_bytes: int | None
    flops: float | None
    comm: CommSummary | None


def _result(report: RankReport) -> RankResult:
    """What ``report``'s rank returned from a run (empty: it failed before returning)."""
    return cast(RankResult, report.result or {})


def _rank_summary(report: RankReport) -> RankSummary:
    res = _result(report)
    steps = report.steps
    return {
        "rank": report.rank,
        "returncode": report.returncode,
        "step_times": res.get("step_times", [s["time"] for s in steps if s.get("measured")]),
        "probe_times": res.get("probe_times", []),
        "local_losses": res.get("local_losses", []),
        "peak_bytes": res.get("peak_bytes", report.progress.get("peak_bytes")),
        "flops": res.get("flops"),
        "comm": res.get("comm"),
    }


class LaunchBreakdown(TypedDict, total=False):
    """:func:`launch_timings`, in ``Run.details["timings"]``: seconds per phase of a launch."""

    launch: float
    pooled: bool
    pool_case: int
    start: float
    join: float
    build: float
    train: float
    finish: float
    collect: float


#: The phases of a launch, in order (:class:`LaunchBreakdown`).
_Phase = Literal["start", "join", "build", "train", "finish", "collect"]
_PHASES: tuple[_Phase, ...] = ("start", "join", "build", "train", "finish", "collect")


def launch_timings(launched: LaunchResult, marks: dict[str, float] | None) -> LaunchBreakdown:
    """Where a launch's wall time went, in seconds, from rank 0's clock marks: ``start``
    (interpreter start and imports, or a warm rank's fork, and unpickling the task),
    ``join`` (joining the process group), ``build`` (the engine: model, optimizer, ZeRO
    partitions, under the memory count), ``train`` (warm-up and measured steps with their
    probes), ``finish`` (gathering the final parameters), ``collect`` (the launcher seeing
    the ranks end and reading their results); ``launch`` is the whole. ``pooled``: the
    ranks were a pool's (``pool_case``: the pool's count of cases so far, 1 for the case
    that started it)."""
    t = launched.timings
    out: LaunchBreakdown = {"launch": round(launched.elapsed, 3),
                            "pooled": bool(t.get("pooled")), "pool_case": t.get("pool_case", 0)}
    if marks and "start_wall" in t:
        # When each phase began; the last, when the launch ended.
        points = [t["start_wall"], marks.get("entered"), marks.get("joined"),
                  marks.get("built"), marks.get("trained"), marks.get("done"),
                  t.get("end_wall")]
        for name, (at, until) in zip(_PHASES, itertools.pairwise(points), strict=True):
            if at is not None and until is not None:
                out[name] = round(float(until) - float(at), 3)
    return out


def ranks_program(engine: Mapping[str, object], flops: list[float | None],
                  comms: list[CommSummary | None],
                  ops: OpCounts | None = None) -> ProgramRecord | None:
    """The program record (:mod:`pytest_accelperf.records.program`) of a case's ranks: the FLOPs
    of a step summed over ranks, per kind of collective the largest count and bytes over
    ranks, and ``ops``, what rank 0 dispatched per step
    (:meth:`.torch.ops.OpCounter.record`; None for a compiled model); None unless every
    rank counted its collectives in some step. ``engine`` is rank 0's ``describe()``."""
    if not comms or not all(comms) or not comms[0] or not comms[0]["steps"]:
        return None
    collectives = largest_over_ranks([c["collectives"] or {} for c in comms if c]) or {}
    source = "deepspeed" if engine.get("engine") == "deepspeed" else "ddp"
    total = float(sum(f for f in flops if f)) if flops and all(flops) else None
    if ops is None:
        return program_record(source, flops=total, collectives=collectives)
    return program_record(source, flops=total, collectives=collectives, **ops)


def build_run(case: Case, task: Task, accel: Accelerator, plan: RankPlan,
              launched: LaunchResult, timeout: float | None
              ) -> tuple[Run, dict[str, np.ndarray]]:
    """The run of a launch (complete, or what the ranks reported before it ended) and
    rank 0's final parameters (empty unless it finished). A rank that raised a
    :class:`TaskError` (the user's function is at fault) raises it here, as the in-process
    backends do."""
    failed = launched.failed
    if launched.outcome == "error" and failed is not None and failed.error \
            and failed.error.get("type") == "TaskError":
        raise TaskError(f"{case.id} (rank {failed.rank}): {failed.error.get('message', '')}")
    step = plan.step
    draft = RunBuilder(case.id, samples_per_step=case.batch,
                       tokens_per_step=(case.batch * step.tokens_per_sample
                                        if step.tokens_per_sample else None),
                       n_devices=case.world_size, peak_flops_per_device=accel.peak_flops)
    ranks = [_rank_summary(r) for r in launched.ranks]
    zero = launched.ranks[0]
    res = _result(zero)
    losses = res.get("losses", [s["loss"] for s in zero.steps])
    draft.losses(losses, list(range(len(losses))))
    draft.rank_times(
        metrics={str(k): [float(x) for x in v][:len(losses)]
                 for k, v in (res.get("metrics") or {}).items()},
        step_times=ranks[0]["step_times"], probe_times=ranks[0]["probe_times"],
        probe_kind=res.get("probe_kind", ""),
        load=Load.from_json(res["step_load"]) if isinstance(res.get("step_load"), dict)
        else None)  # rank 0's loop, whose times are the run's
    draft.memory({f"rank{r['rank']}": int(r["peak_bytes"]) for r in ranks
                  if r["peak_bytes"] is not None},
                 "cuda_allocator" if plan.device == "cuda" else "mem_tracker")
    flops = [r["flops"] for r in ranks]
    engine = res.get("engine", {})
    draft.detail(
        world_size=case.world_size,
        grad_accum=case.grad_accum,
        micro_batch=micro_batch(case),
        loss=("mean over ranks of each rank's micro-batch loss (the global batch's loss)"
              if case.grad_accum == 1 else
              f"mean over ranks and {case.grad_accum} micro-batches of the micro-batch "
              f"losses (the global batch's loss)"),
        memory=("per rank: MemTracker peak of live tensor bytes over construction and the "
                f"first {MEMORY_STEPS} warm-up steps" if plan.device == "cpu" else
                "per rank: torch.cuda.max_memory_allocated over the run"),
        engine=engine,
        launch_seconds=round(launched.elapsed, 3),
        timings=launch_timings(launched, res.get("marks")),
        ranks=ranks)
    comms = [c for c in (r["comm"] for r in ranks) if c]
    program = ranks_program(engine, flops, [r.get("comm") for r in ranks], res.get("ops"))
    draft.counted(flops=float(sum(f for f in flops if f)) if flops and all(flops) else None,
                  program=program)
    if program is not None:
        per_rank = [c["collectives"] or {} for c in comms]
        draft.detail(comm={
            "counted_steps": [int(i) for i in plan.comm_steps],
            "same_each_step": all(c["same_each_step"] for c in comms),
            "symmetric": all(c == per_rank[0] for c in per_rank),
            "record": "per kind, the largest count and bytes over ranks (each rank's in "
                      "extra['ranks'][r]['comm']); bytes are a rank's payload (see "
                      "pytest_accelperf.backends.torch.comm)",
        })
    params: dict[str, np.ndarray] = {}
    if launched.outcome != "ok":
        oom: OomRecord | None = None
        if launched.outcome == "oom" and failed is not None and failed.error:
            err = failed.error
            required, capacity = err.get("required"), err.get("capacity")
            if isinstance(required, int) and isinstance(capacity, int):  # CapacityExceeded
                oom = {"required_bytes": required, "capacity_bytes": capacity,
                       "exceeded_by_bytes": required - capacity,
                       "source": str(err.get("source", "")), "rank": failed.rank,
                       "step": failed.step}
        draft.failed(launched.outcome, launched.message, oom=oom)
        return draft.build(), params
    kept = res.get("params")
    if kept:
        params = kept
        draft.fingerprint(fingerprint(params))
    nan_step = res.get("nan_step")
    if nan_step is not None:
        draft.failed("nan", f"loss is {losses[-1]} at step {int(nan_step)} (mean over ranks)",
                     nan_step=int(nan_step))
    return draft.build(), params


def train_reference(case: Case, task: TorchTask | RankStep,
                    plan: RankPlan) -> dict[str, np.ndarray]:
    """The same training in this process, plain torch, full global batch: same seed, same
    build, same batches, same clipping and schedule, the same number of optimizer steps
    (the multi-process warm-up included). With a loss that is a mean over the batch, one
    step on the global batch is the step that ``grad_accum`` micro-batches on ``world_size``
    ranks accumulate."""
    step = as_rank_step(task)
    device = torch.device("cuda", 0) if plan.device == "cuda" else torch.device("cpu")
    torch.manual_seed(step.seed)
    built = step.built(0, config_optimizer=True)
    model = built.model.to(device)
    optimizer = built.optimizer
    if optimizer is None:
        raise TaskError(f"{case.id}: the reference trains the model with plain torch, which "
                        f"needs its optimizer, and {step.label} leaves it to DeepSpeed's "
                        f"config: build it in build() to compare with a reference, or set "
                        f"reference=False")
    torch.manual_seed(step.seed)
    for i in range(plan.total_steps):
        batch = to_device(step.make_batch(i), device)
        optimizer.zero_grad(set_to_none=True)
        loss, _ = step.compute(model, batch)
        loss.backward()  # type: ignore[no-untyped-call]  # untyped in torch
        if plan.grad_clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), plan.grad_clip)
        optimizer.step()
        if built.scheduler is not None:
            built.scheduler.step()
    return step.params_of(model)


@dataclass(frozen=True)
class TorchRanks:
    """The :class:`~pytest_accelperf.backends.procs.ranks.RankTrainer` of a torch engine: a
    :class:`RankStep` (or a :class:`TorchTask`, converted) trained by :func:`~.in_rank.rank_main` in
    every rank with ``engine``. ``check(case, step)`` refuses what the engine cannot train
    (before any launch)."""

    engine: EngineFactory
    check: Callable[[Case, RankStep], None] | None = None

    def plan(self, case: Case, task: Task, accel: Accelerator,
             fits: bool = False) -> RankPlan:
        step = as_rank_step(task)
        if self.check is not None:
            self.check(case, step)
        plan = make_plan(self.engine, case, step, accel, fits=fits)
        expect(step.make_batch, plan.total_steps)  # data given as an iterable: refused now
        return plan

    def job(self, case: Case, task: Task, accel: Accelerator, *, cpu_devices: int,
            platform: str | None, timeout: float | None) -> RankJob:
        plan = self.plan(case, task, accel)
        return RankJob(rank_main, (plan,), device=plan.device, total_steps=plan.total_steps,
                       plan=plan, warm=self.warm_modules())

    def block_job(self, case: Case, task: Task, accel: Accelerator,
                  control: BlockControl) -> RankJob:
        """The job of an A/B group (:mod:`pytest_accelperf.ab.rank_groups`):
        :func:`~.in_rank.rank_main` with ``control``, so that the ranks build and warm up
        the engine as a run does, then train blocks of steps on demand."""
        plan = self.plan(case, task, accel)
        return RankJob(rank_main, (plan, control), device=plan.device,
                       total_steps=plan.total_steps, plan=plan, warm=self.warm_modules())

    def block_program(self, job: RankJob, messages: Sequence[object]) -> ProgramRecord | None:
        """The program record of an A/B group, from what its ranks reported when ready
        (their :class:`~.torch.in_rank.RankReady` messages; as :func:`build_run` makes a
        run's)."""
        ready = cast(list[RankReady], list(messages))
        return ranks_program(ready[0].get("engine") or {}, [r.get("flops") for r in ready],
                             [r.get("comm") for r in ready], ready[0].get("ops"))

    def warm_modules(self) -> tuple[str, ...]:
        """What a pool's warm ranks import for this engine's cases (everything a rank
        imports before its first step that does not depend on the case)."""
        return WARM_MODULES + tuple(getattr(self.engine, "warm_modules", ()))

    def result(self, case: Case, task: Task, accel: Accelerator, job: RankJob,
               launched: LaunchResult, *, timeout: float | None) -> TrainResult:
        run, params = build_run(case, task, accel, job.plan, launched, timeout)
        return TrainResult(run=run, params=params)

    def reference(self, case: Case, task: Task, job: RankJob) -> dict[str, np.ndarray]:
        return train_reference(case, job.plan.step, job.plan)

    def platform(self, launched: LaunchResult) -> str | None:
        return None  # the ranks take the devices they are given; they provision nothing

    def fits(self, case: Case, task: Task, accel: Accelerator, *,
             timeout: float | None = None) -> Fit:
        """Whether ``case`` fits: :data:`~.in_rank.MEMORY_STEPS` real steps in every rank, the
        largest rank's peak against ``case.memory_capacity`` (CPU: required) or the GPU's capacity.
        A CUDA out-of-memory error in any rank is "does not fit"; any other failure
        raises."""
        plan = self.plan(case, task, accel, fits=True)
        if plan.device == "cpu" and not case.memory_capacity:
            raise ConfigError(f"{case.id}: the CPU has no memory counter to search a maximum "
                             f"batch against; declare memory_capacity on the case")
        launched = launch(rank_main, (plan,), case.world_size, device=plan.device,
                          timeout=timeout, total_steps=plan.total_steps,
                          warm=self.warm_modules())
        if launched.outcome == "oom":
            return Fit(False, None, case.memory_capacity, launched.message)
        if launched.outcome != "ok":
            raise RuntimeError(f"{case.id} at batch {case.batch}: {launched.message}")
        # A probe's ranks count their memory (the peak is an int).
        peaks = [int(cast(int, _result(r)["peak_bytes"])) for r in launched.ranks]
        capacity = case.memory_capacity
        if capacity is None:
            capacity = int(torch.cuda.get_device_properties(0).total_memory)
        worst = max(range(len(peaks)), key=lambda r: peaks[r])
        source = "mem_tracker" if plan.device == "cpu" else "cuda allocator"
        return Fit(peaks[worst] <= capacity, peaks[worst], int(capacity),
                   f"rank {worst} peak ({source})")
