"""What runs inside a launched rank of a multi-process torch case (DDP, DeepSpeed).

This module is the rank's side: the code that a rank (a process launched by
:mod:`pytest_accelperf.backends.procs.launch`, a warm rank of a pool, or a Ray actor) runs,
and what it is shipped. The parent's side, which makes the plan, launches the ranks and
builds the run of what they return, is :mod:`pytest_accelperf.backends.torch.processes`, whose
docstring says what is measured and how the run is assembled; it imports this module, and
this module imports nothing of it.

:class:`RankPlan` is everything a rank is given (pickled by cloudpickle: the case, the
user's :class:`~pytest_accelperf.backends.torch.rank_step.RankStep`, the engine class, the
device type, the clipping); :func:`rank_main` is the function every rank runs: join the
process group, build the engine (a :class:`RankEngine`: DDP's in
:mod:`pytest_accelperf.backends.torch.ddp`, DeepSpeed's in
:mod:`pytest_accelperf.backends.torch.deepspeed`) inside the memory count, train its rows of
every global batch (:func:`micro_batches`) in the measured-step loop
(:func:`pytest_accelperf.backends.measure.loop.run_steps`), then return its result, or, in
A/B mode, train the blocks of steps its arm worker asks for.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypedDict

import numpy as np
import torch

from pytest_accelperf.backends.measure.common import TaskError, describe
from pytest_accelperf.backends.measure.loop import LoopResult, StepFns, load_json, run_steps
from pytest_accelperf.backends.procs.launch import CapacityExceeded
from pytest_accelperf.backends.procs.ranks import BlockControl, serve_blocks
from pytest_accelperf.backends.torch.memory import device_total, fresh_peak, memory_tracker
from pytest_accelperf.backends.torch.ops import OpCounter, OpCounts
from pytest_accelperf.backends.torch.rank_step import GroupSummary, RankStep
from pytest_accelperf.backends.torch.task import (
    as_tensors,
    flop_counter,
    map_batch,
    sync,
    to_device,
    torch_probe,
)
from pytest_accelperf.backends.types import Batch, Leaf
from pytest_accelperf.collect.cases import Case

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

    from torch.distributed._tools.mem_tracker import MemTracker

    from pytest_accelperf.backends.measure.probe import Probe
    from pytest_accelperf.backends.procs._rank import RankContext
    from pytest_accelperf.backends.torch.comm import CommCounter, CommSummary

#: Warm-up steps the CPU memory count covers (the first creates the optimizer state, the
#: second is the steady state with it); the multi-process warm-up is at least this long.
MEMORY_STEPS = 2


# -- what the ranks send back ------------------------------------------------------------
class EngineDescription(TypedDict, total=False):
    """What the run's ``extra["engine"]`` says about a rank's engine
    (:meth:`RankEngine.describe`): DDP's or DeepSpeed's, its optimizer and schedule, the
    steps it took, its parameter groups, whether it compiled; DeepSpeed's version, its
    configuration (DeepSpeed's own JSON) and what the plugin set in it."""

    engine: str
    deepspeed: str
    optimizer: str
    scheduler: str | None
    config: Mapping[str, object]
    plugin_set: dict[str, int]
    optimizer_steps: int
    micro_steps: int
    zero_init: bool
    compile: bool | str
    grad_clip: float | None
    param_groups: list[GroupSummary]
    compiled_graphs: int


class RankReady(TypedDict):
    """What an A/B rank sends its arm worker once warmed up (``("ready", ...)``,
    :func:`_serve_ab_blocks`): step 0's FLOPs and dispatched ops, its collectives, the
    engine and the memory peak; the group's program record is made of it
    (:meth:`~.torch.ranks.TorchRanks.block_program`)."""

    flops: float | None
    ops: OpCounts | None
    comm: CommSummary
    engine: EngineDescription
    peak_bytes: int | None


class RankResult(TypedDict, total=False):
    """What a rank returns from a run (:func:`rank_main`, pickled back to the launcher):
    its own loss per step, step 0's FLOPs and dispatched ops (rank 0, eager), what the
    loop measured, the memory peak, the engine, its collectives, the full parameters (rank
    0) and the wall clocks of its phases. :func:`~.torch.ranks.build_run` reads it; a rank
    that failed has none, so every key may be missing to a reader."""

    rank: int
    local_losses: list[float]
    flops: float | None
    ops: OpCounts | None
    step_times: list[float]
    probe_times: list[float]
    losses: list[float]
    metrics: dict[str, list[float]]
    nan_step: int | None
    batch_time: float
    step_load: dict[str, float | int]
    peak_bytes: int | None
    memory_source: str
    engine: EngineDescription
    comm: CommSummary
    probe_kind: str
    params: dict[str, np.ndarray] | None
    marks: dict[str, float]


class BlocksResult(TypedDict):
    """What an A/B rank returns when its worker stops it: the blocks it trained."""

    rank: int
    blocks: int


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

    def describe(self) -> EngineDescription:
        """What the run's ``extra`` should say about the engine (its configuration)."""

    def counting(self) -> AbstractContextManager[object]:
        """The context of a step whose collectives the engine's
        :class:`~pytest_accelperf.backends.torch.comm.CommCounter` (``comm``) counts."""


class EngineFactory(Protocol):
    """An engine class: joins the process group, then builds a rank's engine. A class
    attribute ``warm_modules`` (optional) names what a pool's warm ranks import for it,
    beyond :data:`~.torch.ranks.WARM_MODULES`."""

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


# -- a rank's batches ----------------------------------------------------------------------
def slice_batch(batch: Batch, rank: int, world_size: int, global_batch: int) -> Batch:
    """Rank ``rank``'s rows of every tensor of the global batch (dicts, namedtuples, tuples
    and lists kept).

    Tensors whose first dimension is the global batch are split; a scalar or any other
    tensor is given whole to every rank. (Also splits a rank's rows into micro-batches:
    ``slice_batch(rows, k, grad_accum, rows_per_rank)``.)
    """
    size = global_batch // world_size

    def rows(leaf: Leaf) -> Leaf:
        if isinstance(leaf, torch.Tensor) and leaf.dim() > 0 and leaf.shape[0] == global_batch:
            return leaf[rank * size:(rank + 1) * size]
        return leaf

    return map_batch(batch, rows)


def micro_batches(batch: Batch, rank: int, case: Case) -> list[Batch]:
    """Rank ``rank``'s micro-batches of the global batch of one step, in order: its rows
    ``[rank * B/N, (rank+1) * B/N)``, cut into ``case.grad_accum`` consecutive parts.
    Numpy arrays are made tensors first (:func:`.torch.task.as_tensors`, as DataLoader
    makes them): an array left one would be given whole to every rank."""
    mine = slice_batch(as_tensors(batch), rank, case.world_size, case.batch)
    rows = case.batch // case.world_size
    return [slice_batch(mine, k, case.grad_accum, rows) for k in range(case.grad_accum)]


# -- the rank's training --------------------------------------------------------------------
class _MemoryCounter:
    """A rank's peak memory: CUDA's allocator peak, or MemTracker's on the CPU while open."""

    def __init__(self, device: torch.device, capacity: int | None, enforce: bool) -> None:
        self.device = device
        self.capacity = capacity if enforce else None
        self.tracker: MemTracker | None = None
        self.source = "cuda_allocator" if device.type == "cuda" else "mem_tracker"
        self._closed_peak: int | None = None

    @contextmanager
    def counting(self) -> Iterator[None]:
        if self.device.type == "cuda":
            fresh_peak(self.device)
            yield
            return
        tracker = self.tracker = memory_tracker()
        with tracker:
            yield
        self._closed_peak = self._tracker_peak(tracker)

    def _tracker_peak(self, tracker: MemTracker) -> int:
        return device_total(tracker, "peak", self.device) or 0

    def step_done(self) -> None:
        if self.tracker is not None and self._closed_peak is None:
            self.tracker.reset_mod_stats()  # per-module stats refuse a second step otherwise

    def peak(self) -> int | None:
        if self.device.type == "cuda":
            return int(torch.cuda.max_memory_allocated(self.device))
        if self._closed_peak is not None:
            return self._closed_peak
        return self._tracker_peak(self.tracker) if self.tracker is not None else None

    def check(self) -> None:
        """Raise :class:`CapacityExceeded` when the peak so far exceeds the capacity."""
        peak = self.peak()
        if self.capacity and peak is not None and peak > self.capacity:
            raise CapacityExceeded(peak, self.capacity, self.source)


def rank_main(ctx: RankContext, plan: RankPlan,
              control: BlockControl | None = None) -> RankResult | BlocksResult:
    """One rank's training (the function :func:`~.procs.launch.launch` runs in every
    process), in the measured-step loop (:func:`.loop.run_steps`): every rank starts each
    step after a barrier and stops it after the device is synchronized; the all-reduce of
    the loss and metrics happens after the timer.

    With ``control`` (A/B mode, :meth:`~.torch.ranks.TorchRanks.block_job`) the rank first
    waits for its arm worker, builds the engine and warms up as a run does (one step
    longer, so that a step's collectives are counted), then trains the blocks of steps it
    is told to, with the same step functions (:func:`~.procs.ranks.serve_blocks`).

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


_Prepared = tuple[int, list[Batch]]
_Done = tuple[list[torch.Tensor], dict[str, torch.Tensor]]  # the losses, the metrics' sums


class _RankSteps:
    """The step functions of one rank's loop (:meth:`fns`) and what they record in
    ``out``, the start of the rank's result: its own loss per step, step 0's FLOPs and
    dispatched ops (rank 0, eager). ``window`` is the memory count's, closed after
    :data:`MEMORY_STEPS` steps."""

    def __init__(self, ctx: RankContext, plan: RankPlan, device: torch.device,
                 engine: RankEngine, counter: _MemoryCounter, window: ExitStack) -> None:
        self.ctx, self.plan, self.device = ctx, plan, device
        self.engine, self.counter, self.window = engine, counter, window
        self.out: RankResult = {"rank": ctx.rank, "local_losses": [], "flops": None}
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

    def after_step(self, i: int, done: object, measured: bool) -> None:
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
                     steps: _RankSteps, *, first: int) -> BlocksResult:
    """An A/B rank after its warm-up: what it measured of step 0 goes to its arm worker,
    then it trains the blocks it is told to (:func:`~.procs.ranks.serve_blocks`)."""
    engine, counter = steps.engine, steps.counter
    ready: RankReady = {"flops": steps.out["flops"], "ops": steps.out.get("ops"),
             "comm": engine.comm.summary(), "engine": engine.describe(),
             "peak_bytes": counter.peak()}
    blocks = serve_blocks(conn, fns, first=first, cycle=steps.plan.total_steps, ready=ready,
                          done=lambda n: ctx.progress(phase="blocks", step=n - 1))
    return {"rank": ctx.rank, "blocks": blocks}


def _rank_result(steps: _RankSteps, trained: LoopResult, probe: Probe | None,
                 marks: dict[str, float]) -> RankResult:
    """The rank's result: what the loop measured, the memory peak, the engine and its
    communication, and the full parameters (gathered by every rank, kept by rank 0)."""
    import torch.distributed as dist

    out, engine, counter = steps.out, steps.engine, steps.counter
    out["step_times"], out["probe_times"] = trained.step_times, trained.probe_times
    out["losses"], out["metrics"] = trained.losses, trained.metrics
    out["nan_step"] = trained.nan_step
    load = load_json(trained)
    out["batch_time"] = load["batch_time"]
    if "step_load" in load:
        out["step_load"] = load["step_load"]
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
