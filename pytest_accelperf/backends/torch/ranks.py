"""Multi-process torch training: the rank loop that DDP and DeepSpeed share.

A case with ``world_size = N`` trains a
:class:`~pytest_accelperf.backends.torch.rank_step.RankStep` (the user's ``build(rank)`` and loss;
a :class:`~pytest_accelperf.backends.torch.task.TorchTask` is converted to one) in ``N``
processes (gloo on the
CPU, nccl on CUDA, one GPU per rank), launched on this machine by
:mod:`pytest_accelperf.backends.procs.launch` or as Ray actors. Which engine wraps the model in
each rank is the plan's ``engine`` (a :class:`RankEngine` class): DDP's
(:mod:`pytest_accelperf.backends.torch.ddp`) or DeepSpeed's
(:mod:`pytest_accelperf.backends.torch.deepspeed`); this module knows neither. :class:`TorchRanks`
is the :class:`~pytest_accelperf.backends.procs.ranks.RankTrainer` both of them declare.

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
  (model, optimizer, ZeRO partitions and buckets) and its first :data:`MEMORY_STEPS`
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
  :data:`MEMORY_STEPS` counted steps, and the warm-up is one step longer, so the compile
  happens in an untimed step. The first steps run eager on purpose: MemTracker and
  FlopCounterMode are dispatch modes, and a model whose first compiled call meets one is
  skipped by dynamo for good ("non-infra torch dispatch mode present"), i.e. silently
  eager. The memory and FLOP counts are therefore the eager model's.
* Final parameters: gathered on rank 0 (for ZeRO-3 with ``GatheredParameters``), then
  ``params_fingerprint`` and, with ``case.reference``, a comparison with the same task
  trained in one process by plain torch on the full global batch (:func:`train_reference`,
  where rank 0 ran).

The warm-up is at least :data:`MEMORY_STEPS` steps (``max(case.warmup, 2)``): the CPU memory
count and the FLOP count happen there. The reference trains as many steps.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch

from pytest_accelperf.backends.measure.common import TaskError, describe, fingerprint
from pytest_accelperf.backends.measure.data import expect
from pytest_accelperf.backends.measure.loop import LoopResult, StepFns, load_json, run_steps
from pytest_accelperf.backends.procs.launch import (
    CapacityExceeded,
    LaunchResult,
    RankReport,
    launch,
)
from pytest_accelperf.backends.procs.ranks import BlockControl, RankJob, serve_blocks
from pytest_accelperf.backends.protocol import Fit, TrainResult
from pytest_accelperf.backends.torch.comm import largest_over_ranks
from pytest_accelperf.backends.torch.memory import device_total, memory_tracker, reset_cuda_peak
from pytest_accelperf.backends.torch.ops import OpCounter
from pytest_accelperf.backends.torch.rank_step import RankStep, as_rank_step
from pytest_accelperf.backends.torch.task import (
    TorchTask,
    as_tensors,
    flop_counter,
    map_batch,
    sync,
    to_device,
    torch_probe,
)
from pytest_accelperf.collect.cases import Case
from pytest_accelperf.errors import ConfigError
from pytest_accelperf.provision.accel import Accelerator
from pytest_accelperf.records.program import program_record
from pytest_accelperf.records.run import Run
from pytest_accelperf.stats.contention import Load

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

    from pytest_accelperf.backends.measure.probe import Probe
    from pytest_accelperf.backends.procs._rank import RankContext
    from pytest_accelperf.backends.torch.comm import CommCounter

GIB = 2**30
#: What a pool's warm ranks import for every torch engine
#: (:mod:`pytest_accelperf.backends.procs.rank_pool`); the engine class adds its own.
WARM_MODULES = ("cloudpickle", "numpy", "torch", "torch.distributed",
                "torch.distributed._tools.mem_tracker", "torch.utils.flop_counter",
                "pytest_accelperf.backends.torch.ranks")
#: Warm-up steps the CPU memory count covers (the first creates the optimizer state, the
#: second is the steady state with it); the multi-process warm-up is at least this long.
MEMORY_STEPS = 2


# -- what is shipped to the ranks ---------------------------------------------------------
class RankEngine(Protocol):
    """A wrapped model in one rank: what ``loss_fn`` is called with, and how to step;
    ``comm`` counts its collectives in the steps run inside :meth:`counting`."""

    model: Any
    comm: CommCounter

    def micro_step(self, boundary: bool) -> AbstractContextManager[object]:
        """The context of one micro-batch's forward and backward (DDP: ``no_sync`` unless
        ``boundary``, the last micro-batch of an optimizer step)."""

    def backward(self, loss: torch.Tensor) -> None:
        """Backward of one micro-batch's loss, scaled by ``1 / grad_accum``."""

    def step(self, boundary: bool) -> None:
        """After every micro-batch; at ``boundary``: clip (if asked), step the optimizer,
        then the scheduler, zero the gradients."""

    def lr(self) -> float:
        """The learning rate of the first parameter group (what the next step uses)."""

    def compile(self) -> None:
        """Compile the model with ``torch.compile`` (after the counted steps)."""

    def full_params(self, rank: int) -> dict[str, np.ndarray] | None:
        """The full final parameters on rank 0 (None elsewhere); a collective."""

    def describe(self) -> dict[str, Any]:
        """What the run's ``extra`` should say about the engine (its configuration)."""

    def counting(self) -> AbstractContextManager[object]:
        """The context of a step whose collectives the engine's
        :class:`~pytest_accelperf.backends.torch.comm.CommCounter` (``comm``) counts."""


class EngineFactory(Protocol):
    """An engine class: joins the process group, then builds a rank's engine. A class
    attribute ``warm_modules`` (optional) names what a pool's warm ranks import for it,
    beyond :data:`WARM_MODULES`."""

    def __call__(self, plan: RankPlan, device: torch.device, rank: int) -> RankEngine: ...

    def init_distributed(self, backend: str) -> None:
        """Join the process group of the launched ranks with ``backend`` (gloo, nccl)."""


@dataclass(frozen=True)
class RankPlan:
    """Everything a rank needs, pickled by cloudpickle: the case, the user's
    :class:`~pytest_accelperf.backends.torch.rank_step.RankStep`, the engine class (it travels
    by reference: an importable class), the device type, the resolved clipping, and whether
    this is a training run or a memory probe of :data:`MEMORY_STEPS` steps (``fits``)."""

    engine: EngineFactory
    case: Case
    step: RankStep
    device: str
    grad_clip: float | None
    fits: bool = False

    @property
    def warmup(self) -> int:
        """Untimed steps: the case's, at least the counted ones (and the compile step)."""
        return max(self.case.warmup, MEMORY_STEPS + (1 if self.step.compile else 0))

    @property
    def total_steps(self) -> int:
        return MEMORY_STEPS if self.fits else self.warmup + self.case.steps

    @property
    def comm_steps(self) -> range:
        """The steps whose collectives are counted: every step after the
        :data:`MEMORY_STEPS` first (and after the compile step), warm-up and measured; none
        in a memory probe. The first two are not the steady state: step 0 creates the
        optimizer state and records ZeRO-3's parameter trace, and step 1 has ZeRO-3 check
        that trace against the other ranks (six broadcasts, once). Counting costs a timed
        step under a microsecond per collective (a Python wrapper that adds up tensor
        sizes, 0.7 µs measured; no synchronization, no timer): the suite's ZeRO-3 GPT step
        issues 55 collectives in about 0.19 s, 0.02 % of it."""
        if self.fits:
            return range(0)
        return range(MEMORY_STEPS + (1 if self.step.compile else 0), self.total_steps)


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


def slice_batch(batch: Any, rank: int, world_size: int, global_batch: int) -> Any:
    """Rank ``rank``'s rows of every tensor of the global batch (dicts, namedtuples, tuples
    and lists kept).

    Tensors whose first dimension is the global batch are split; a scalar or any other
    tensor is given whole to every rank. (Also splits a rank's rows into micro-batches:
    ``slice_batch(rows, k, grad_accum, rows_per_rank)``.)
    """
    size = global_batch // world_size

    def rows(leaf: Any) -> Any:
        if isinstance(leaf, torch.Tensor) and leaf.dim() > 0 and leaf.shape[0] == global_batch:
            return leaf[rank * size:(rank + 1) * size]
        return leaf

    return map_batch(batch, rows)


def micro_batches(batch: Any, rank: int, case: Case) -> list[Any]:
    """Rank ``rank``'s micro-batches of the global batch of one step, in order: its rows
    ``[rank * B/N, (rank+1) * B/N)``, cut into ``case.grad_accum`` consecutive parts.
    Numpy arrays are made tensors first (:func:`.torch.task.as_tensors`, as DataLoader
    makes them): an array left one would be given whole to every rank."""
    mine = slice_batch(as_tensors(batch), rank, case.world_size, case.batch)
    rows = case.batch // case.world_size
    return [slice_batch(mine, k, case.grad_accum, rows) for k in range(case.grad_accum)]


# -- the rank side ------------------------------------------------------------------------
class _MemoryCounter:
    """A rank's peak memory: CUDA's allocator peak, or MemTracker's on the CPU while open."""

    def __init__(self, device: torch.device, capacity: int | None, enforce: bool) -> None:
        self.device = device
        self.capacity = capacity if enforce else None
        self.tracker: Any = None
        self.source = "cuda_allocator" if device.type == "cuda" else "mem_tracker"
        self._closed_peak: int | None = None

    @contextmanager
    def counting(self) -> Iterator[None]:
        if self.device.type == "cuda":
            reset_cuda_peak(self.device)
            yield
            return
        self.tracker = memory_tracker()
        with self.tracker:
            yield
        self._closed_peak = self._tracker_peak()

    def _tracker_peak(self) -> int:
        return device_total(self.tracker, "peak", self.device) or 0

    def step_done(self) -> None:
        if self.tracker is not None and self._closed_peak is None:
            self.tracker.reset_mod_stats()  # per-module stats refuse a second step otherwise

    def peak(self) -> int | None:
        if self.device.type == "cuda":
            return int(torch.cuda.max_memory_allocated(self.device))
        if self._closed_peak is not None:
            return self._closed_peak
        return self._tracker_peak() if self.tracker is not None else None

    def check(self) -> None:
        """Raise :class:`CapacityExceeded` when the peak so far exceeds the capacity."""
        peak = self.peak()
        if self.capacity and peak is not None and peak > self.capacity:
            raise CapacityExceeded(peak, self.capacity, self.source)


def rank_main(ctx: RankContext, plan: RankPlan,
              control: BlockControl | None = None) -> dict[str, Any]:
    """One rank's training (the function :func:`launch` runs in every process), in the
    measured-step loop (:func:`.loop.run_steps`): every rank starts each step after a
    barrier and stops it after the device is synchronized; the all-reduce of the loss and
    metrics happens after the timer.

    With ``control`` (A/B mode, :meth:`TorchRanks.block_job`) the rank first waits for its
    arm worker, builds the engine and warms up as a run does (one step longer, so that a
    step's collectives are counted), then trains the blocks of steps it is told to, with
    the same step functions (:func:`~.ranks.serve_blocks`).

    Its phases: join the process group (:func:`_join`); inside the memory count, build the
    engine (:func:`_build_engine`) and train (:class:`_RankSteps`, the step functions, for
    :func:`_step_counts` steps); then serve the A/B blocks (:func:`_serve_ab_blocks`) or
    gather the rank's result (:func:`_rank_result`)."""
    conn = control.connect(ctx.rank) if control is not None else None
    device, marks = _join(ctx, plan)
    counter = _MemoryCounter(device, plan.case.memory_capacity, enforce=not plan.fits)
    probe = None if plan.fits else torch_probe(device)  # its matrices are not the case's
    with ExitStack() as window:
        window.enter_context(counter.counting())
        engine = _build_engine(ctx, plan, device, counter, marks)
        steps = _RankSteps(ctx, plan, device, engine, counter, window)
        fns = steps.fns()
        warmup, measured = _step_counts(plan, blocks=conn is not None)
        trained = run_steps(fns, warmup=warmup, steps=measured, probe=probe,
                            report=steps.report, after_step=steps.after_step)
    if conn is not None:
        return _serve_ab_blocks(ctx, conn, fns, steps, first=warmup)
    marks["trained"] = time.time()
    return _rank_result(steps, trained, probe, marks)


def _join(ctx: RankContext, plan: RankPlan) -> tuple[torch.device, dict[str, float]]:
    """This rank's device, set, and the process group joined; the wall clocks of entering
    and of joining (comparable with the launcher's)."""
    device = (torch.device("cuda", ctx.local_rank) if plan.device == "cuda"
              else torch.device("cpu"))
    if device.type == "cuda":
        torch.cuda.set_device(device)
    marks = {"entered": time.time()}  # wall clocks, comparable with the launcher's
    ctx.progress(phase="init")
    plan.engine.init_distributed("nccl" if device.type == "cuda" else "gloo")
    marks["joined"] = time.time()
    return device, marks


def _build_engine(ctx: RankContext, plan: RankPlan, device: torch.device,
                  counter: _MemoryCounter, marks: dict[str, float]) -> RankEngine:
    """The engine over the user's model and optimizer, made inside the memory count: a rank
    that cannot even hold the model stops here (:class:`CapacityExceeded`)."""
    engine = plan.engine(plan, device, ctx.rank)
    counter.check()  # an overrun here: cannot even initialize the model
    marks["built"] = time.time()
    ctx.progress(phase="train", peak_bytes=counter.peak())
    return engine


def _step_counts(plan: RankPlan, *, blocks: bool) -> tuple[int, int]:
    """The warm-up and measured steps of the loop: a memory probe (``plan.fits``) only
    warms up; an A/B rank (``blocks``) warms up and takes one counted step, its blocks
    come later."""
    # A memory probe (fits) only warms up: none of its steps is measured.
    warmup = plan.total_steps if plan.fits else plan.warmup
    measured = plan.total_steps - warmup
    if blocks:  # A/B: the warm-up and one counted step; blocks come later
        warmup, measured = plan.warmup + 1, 0
    return warmup, measured


_Prepared = tuple[int, list[Any]]
_Done = tuple[list[Any], dict[str, Any]]


class _RankSteps:
    """The step functions of one rank's loop (:meth:`fns`) and what they record in
    ``out``, the start of the rank's result: its own loss per step, step 0's FLOPs and
    dispatched ops (rank 0, eager). ``window`` is the memory count's, closed after
    :data:`MEMORY_STEPS` steps."""

    def __init__(self, ctx: RankContext, plan: RankPlan, device: torch.device,
                 engine: RankEngine, counter: _MemoryCounter, window: ExitStack) -> None:
        self.ctx, self.plan, self.device = ctx, plan, device
        self.engine, self.counter, self.window = engine, counter, window
        self.out: dict[str, Any] = {"rank": ctx.rank, "local_losses": [], "flops": None}
        self.names: list[str] | None = None
        self.lrs: list[float] = []

    def fns(self) -> StepFns[_Prepared, _Done]:
        return StepFns(prepare=self.prepare, run=self.run, read=self.read,
                       sync=lambda: sync(self.device))

    def prepare(self, i: int) -> _Prepared:
        import torch.distributed as dist

        step, case = self.plan.step, self.plan.case
        micro = [to_device(m, self.device)
                 for m in micro_batches(step.make_batch(i), self.ctx.rank, case)]
        self.lrs.append(self.engine.lr())  # the rate this step uses (the schedule steps after it)
        dist.barrier()  # every rank starts the step together
        return i, micro

    def run(self, i: int, prepared: _Prepared) -> _Done:
        if i in self.plan.comm_steps:
            with self.engine.counting():
                return self._micro_steps(i, prepared)
        return self._micro_steps(i, prepared)

    def _micro_steps(self, i: int, prepared: _Prepared) -> _Done:
        step, engine, accum = self.plan.step, self.engine, self.plan.case.grad_accum
        losses: list[torch.Tensor] = []
        sums: dict[str, torch.Tensor] = {}
        for k, part in enumerate(prepared[1]):
            boundary = k == accum - 1
            with engine.micro_step(boundary):
                if i == 0 and k == 0:
                    # Rank 0 counts the dispatched ops of the same call (a compiled
                    # model's eager ops are not what it will run: not counted).
                    ops = (OpCounter(self.device) if self.ctx.rank == 0 and not step.compile
                           else None)
                    flops = flop_counter()
                    with ops or nullcontext(), flops:
                        loss, metrics = step.compute(engine.model, part)
                        engine.backward(loss)
                    self.out["flops"] = float(flops.get_total_flops()) * accum or None
                    self.out["ops"] = ops.record(times=accum) if ops is not None else None
                else:
                    loss, metrics = step.compute(engine.model, part)
                    engine.backward(loss)
            engine.step(boundary)
            if i < MEMORY_STEPS:
                self.counter.step_done()  # MemTracker takes one forward per module at a time
            losses.append(loss.detach())
            for key, value in metrics.items():
                sums[key] = sums.get(key, torch.zeros(())) + value
        return losses, sums

    def read(self, done: _Done) -> tuple[float, dict[str, float]]:
        import torch.distributed as dist

        step, accum = self.plan.step, self.plan.case.grad_accum
        losses, sums = done
        i = len(self.out["local_losses"])
        if self.names is None:
            self.names = sorted(sums)
        elif sorted(sums) != self.names:
            raise TaskError(f"RankStep.loss_fn {describe(step.loss_fn)} returned metrics "
                            f"{sorted(sums)} at step {i}, {self.names} before: return the "
                            f"same metrics every step")
        names = self.names
        local = torch.stack([x.reshape(()).float().cpu() for x in losses]).mean()
        # One all-reduce: the loss, then each metric, averaged over micro-batches.
        values = torch.stack([local, *[sums[n] / accum for n in names]]).to(self.device)
        dist.all_reduce(values)
        means = (values / self.ctx.world_size).cpu().tolist()
        self.out["local_losses"].append(float(local.item()))
        metrics = {name: float(v) for name, v in zip(names, means[1:], strict=True)}
        if step.lr_metric is not None:
            metrics[step.lr_metric] = self.lrs[i]
        return float(means[0]), metrics

    def after_step(self, i: int, done: Any, measured: bool) -> None:
        self.counter.check()
        if i == MEMORY_STEPS - 1:
            self.window.close()  # the CPU count ends with the memory steps
            if self.plan.step.compile and not self.plan.fits:
                self.engine.compile()  # compiled in the next (untimed) step

    def report(self, done: int, total: int, loss: float, seconds: float,
               measured: bool) -> None:
        self.ctx.progress(phase="train", step=done - 1, loss=loss, time=seconds,
                          measured=measured, peak_bytes=self.counter.peak())


def _serve_ab_blocks(ctx: RankContext, conn: Connection, fns: StepFns[_Prepared, _Done],
                     steps: _RankSteps, *, first: int) -> dict[str, Any]:
    """An A/B rank after its warm-up: what it measured of step 0 goes to its arm worker,
    then it trains the blocks it is told to (:func:`~.ranks.serve_blocks`)."""
    engine, counter = steps.engine, steps.counter
    ready = {"flops": steps.out["flops"], "ops": steps.out.get("ops"),
             "comm": engine.comm.summary(), "engine": engine.describe(),
             "peak_bytes": counter.peak()}
    blocks = serve_blocks(conn, fns, first=first, cycle=steps.plan.total_steps, ready=ready,
                          done=lambda n: ctx.progress(phase="blocks", step=n - 1))
    return {"rank": ctx.rank, "blocks": blocks}


def _rank_result(steps: _RankSteps, trained: LoopResult, probe: Probe | None,
                 marks: dict[str, float]) -> dict[str, Any]:
    """The rank's result: what the loop measured, the memory peak, the engine and its
    communication, and the full parameters (gathered by every rank, kept by rank 0)."""
    import torch.distributed as dist

    out, engine, counter = steps.out, steps.engine, steps.counter
    out.update(step_times=trained.step_times, probe_times=trained.probe_times,
               losses=trained.losses, metrics=trained.metrics, nan_step=trained.nan_step,
               **load_json(trained))
    out["peak_bytes"] = counter.peak()
    out["memory_source"] = counter.source
    out["engine"] = engine.describe()
    out["comm"] = engine.comm.summary()
    out["probe_kind"] = probe.kind if probe is not None else ""
    dist.barrier()
    out["params"] = None if steps.plan.fits else engine.full_params(steps.ctx.rank)
    dist.barrier()
    marks["done"] = time.time()
    out["marks"] = marks
    return out


# -- the parent side ----------------------------------------------------------------------
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


def _rank_summary(report: RankReport) -> dict[str, Any]:
    res = report.result or {}
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


def launch_timings(launched: LaunchResult, marks: dict[str, float] | None) -> dict[str, Any]:
    """Where a launch's wall time went, in seconds, from rank 0's clock marks: ``start``
    (interpreter start and imports, or a warm rank's fork, and unpickling the task),
    ``join`` (joining the process group), ``build`` (the engine: model, optimizer, ZeRO
    partitions, under the memory count), ``train`` (warm-up and measured steps with their
    probes), ``finish`` (gathering the final parameters), ``collect`` (the launcher seeing
    the ranks end and reading their results); ``launch`` is the whole. ``pooled``: the
    ranks were a pool's (``pool_case``: the pool's count of cases so far, 1 for the case
    that started it)."""
    t = launched.timings
    out: dict[str, Any] = {"launch": round(launched.elapsed, 3),
                           "pooled": bool(t.get("pooled")), "pool_case": t.get("pool_case", 0)}
    if marks and "start_wall" in t:
        points = [("start", t["start_wall"]), ("join", marks.get("entered")),
                  ("build", marks.get("joined")), ("train", marks.get("built")),
                  ("finish", marks.get("trained")), ("collect", marks.get("done")),
                  ("", t.get("end_wall"))]
        for (name, at), (_, until) in itertools.pairwise(points):
            if at is not None and until is not None:
                out[name] = round(float(until) - float(at), 3)
    return out


def ranks_program(engine: dict[str, Any], flops: list[float | None],
                  comms: list[dict[str, Any] | None],
                  ops: dict[str, Any] | None = None) -> dict[str, Any] | None:
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
    return program_record(source, flops=total, collectives=collectives, **(ops or {}))


def build_run(case: Case, task: Any, accel: Accelerator, plan: RankPlan,
              launched: LaunchResult, timeout: float | None) -> tuple[Run, dict[str, Any]]:
    """The run of a launch (complete, or what the ranks reported before it ended) and
    rank 0's final parameters (empty unless it finished). A rank that raised a
    :class:`TaskError` (the user's function is at fault) raises it here, as the in-process
    backends do."""
    failed = launched.failed
    if launched.outcome == "error" and failed is not None and failed.error \
            and failed.error.get("type") == "TaskError":
        raise TaskError(f"{case.id} (rank {failed.rank}): {failed.error.get('message', '')}")
    step = plan.step
    run = Run(case_id=case.id, samples_per_step=case.batch,
              tokens_per_step=(case.batch * step.tokens_per_sample
                               if step.tokens_per_sample else None),
              n_devices=case.world_size, peak_flops_per_device=accel.peak_flops)
    ranks = [_rank_summary(r) for r in launched.ranks]
    zero = launched.ranks[0]
    res = zero.result or {}
    run.losses = res.get("losses", [s["loss"] for s in zero.steps])
    run.loss_steps = list(range(len(run.losses)))
    run.metrics = {str(k): [float(x) for x in v][:len(run.losses)]
                   for k, v in (res.get("metrics") or {}).items()}
    run.step_times = ranks[0]["step_times"]
    run.probe_times = ranks[0]["probe_times"]
    run.probe_kind = res.get("probe_kind", "")
    run.memory_per_device = {f"rank{r['rank']}": int(r["peak_bytes"]) for r in ranks
                             if r["peak_bytes"] is not None}
    run.memory_source = "cuda_allocator" if plan.device == "cuda" else "mem_tracker"
    flops = [r["flops"] for r in ranks]
    run.flops_per_step = float(sum(flops)) if flops and all(flops) else None
    run.extra = {
        "world_size": case.world_size,
        "grad_accum": case.grad_accum,
        "micro_batch": micro_batch(case),
        "loss": ("mean over ranks of each rank's micro-batch loss (the global batch's loss)"
                 if case.grad_accum == 1 else
                 f"mean over ranks and {case.grad_accum} micro-batches of the micro-batch "
                 f"losses (the global batch's loss)"),
        "memory": ("per rank: MemTracker peak of live tensor bytes over construction and the "
                   f"first {MEMORY_STEPS} warm-up steps" if plan.device == "cpu" else
                   "per rank: torch.cuda.max_memory_allocated over the run"),
        "engine": res.get("engine", {}),
        "launch_seconds": round(launched.elapsed, 3),
        "timings": launch_timings(launched, res.get("marks")),
        "ranks": ranks,
    }
    if isinstance(res.get("step_load"), dict):  # rank 0's loop, whose times are the run's
        run.step_load = Load.from_json(res["step_load"])
    comms = [r["comm"] for r in ranks if r.get("comm")]
    run.program = ranks_program(run.extra["engine"], flops, [r.get("comm") for r in ranks],
                                res.get("ops"))
    if run.program is not None:
        per_rank = [c["collectives"] or {} for c in comms]
        run.extra["comm"] = {
            "counted_steps": [int(i) for i in plan.comm_steps],
            "same_each_step": all(c["same_each_step"] for c in comms),
            "symmetric": all(c == per_rank[0] for c in per_rank),
            "record": "per kind, the largest count and bytes over ranks (each rank's in "
                      "extra['ranks'][r]['comm']); bytes are a rank's payload (see "
                      "pytest_accelperf.backends.torch.comm)",
        }
    params: dict[str, Any] = {}
    if launched.outcome != "ok":
        run.outcome, run.message = launched.outcome, launched.message
        if launched.outcome == "oom" and failed is not None and failed.error:
            err = failed.error
            if "required" in err and "capacity" in err:
                run.oom = {"required_bytes": err["required"], "capacity_bytes": err["capacity"],
                           "exceeded_by_bytes": err["required"] - err["capacity"],
                           "source": err.get("source", ""), "rank": failed.rank,
                           "step": failed.step}
        return run, params
    if res.get("params"):
        params = res["params"]
        run.params_fingerprint = fingerprint(params)
    if res.get("nan_step") is not None:
        run.outcome, run.nan_step = "nan", int(res["nan_step"])
        run.message = f"loss is {run.losses[-1]} at step {run.nan_step} (mean over ranks)"
    return run, params


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
    built = step.built(0)
    model = built.model.to(device)
    optimizer = built.optimizer
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
    :class:`RankStep` (or a :class:`TorchTask`, converted) trained by :func:`rank_main` in
    every rank with ``engine``. ``check(case, step)`` refuses what the engine cannot train
    (before any launch)."""

    engine: EngineFactory
    check: Callable[[Case, RankStep], None] | None = None

    def plan(self, case: Case, task: TorchTask | RankStep, accel: Accelerator,
             fits: bool = False) -> RankPlan:
        step = as_rank_step(task)
        if self.check is not None:
            self.check(case, step)
        plan = make_plan(self.engine, case, step, accel, fits=fits)
        expect(step.make_batch, plan.total_steps)  # data given as an iterable: refused now
        return plan

    def job(self, case: Case, task: TorchTask | RankStep, accel: Accelerator, *, cpu_devices: int,
            platform: str | None, timeout: float | None) -> RankJob:
        plan = self.plan(case, task, accel)
        return RankJob(rank_main, (plan,), device=plan.device, total_steps=plan.total_steps,
                       plan=plan, warm=self.warm_modules())

    def block_job(self, case: Case, task: TorchTask | RankStep, accel: Accelerator,
                  control: BlockControl) -> RankJob:
        """The job of an A/B group (:mod:`pytest_accelperf.ab.ranks`): :func:`rank_main`
        with ``control``, so that the ranks build and warm up the engine as a run does,
        then train blocks of steps on demand."""
        plan = self.plan(case, task, accel)
        return RankJob(rank_main, (plan, control), device=plan.device,
                       total_steps=plan.total_steps, plan=plan, warm=self.warm_modules())

    def block_program(self, job: RankJob, ready: list[dict[str, Any]]) -> dict[str, Any] | None:
        """The program record of an A/B group, from what its ranks reported when ready
        (as :func:`build_run` makes a run's)."""
        return ranks_program(ready[0].get("engine") or {}, [r.get("flops") for r in ready],
                             [r.get("comm") for r in ready], ready[0].get("ops"))

    def warm_modules(self) -> tuple[str, ...]:
        """What a pool's warm ranks import for this engine's cases (everything a rank
        imports before its first step that does not depend on the case)."""
        return WARM_MODULES + tuple(getattr(self.engine, "warm_modules", ()))

    def result(self, case: Case, task: Any, accel: Accelerator, job: RankJob,
               launched: LaunchResult, *, timeout: float | None) -> TrainResult:
        run, params = build_run(case, task, accel, job.plan, launched, timeout)
        return TrainResult(run=run, params=params)

    def reference(self, case: Case, task: Any, job: RankJob) -> dict[str, Any]:
        reference: dict[str, Any] = train_reference(case, job.plan.step, job.plan)
        return reference

    def platform(self, launched: LaunchResult) -> str | None:
        return None  # the ranks take the devices they are given; they provision nothing

    def fits(self, case: Case, task: TorchTask | RankStep, accel: Accelerator, *,
             timeout: float | None = None) -> Fit:
        """Whether ``case`` fits: :data:`MEMORY_STEPS` real steps in every rank, the largest
        rank's peak against ``case.memory_capacity`` (CPU: required) or the GPU's capacity.
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
        peaks = [int(r.result["peak_bytes"]) for r in launched.ranks]
        capacity = case.memory_capacity
        if capacity is None:
            capacity = int(torch.cuda.get_device_properties(0).total_memory)
        worst = max(range(len(peaks)), key=lambda r: peaks[r])
        source = "mem_tracker" if plan.device == "cpu" else "cuda allocator"
        return Fit(peaks[worst] <= capacity, peaks[worst], int(capacity),
                   f"rank {worst} peak ({source})")
