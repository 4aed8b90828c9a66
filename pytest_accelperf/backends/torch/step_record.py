"""What the in-process torch step's program does: the ``Run.program`` record of an eager or
a ``torch.compile``-d step, and a cold compile to time.

An eager step's record (``source="torch"``) is its FLOPs and what its counting step
dispatched (:mod:`.torch.ops`: the aten ops by dtype, the bytes they move, the host syncs
with their sites). A compiled step's (``source="torch.compile"``) is its FLOPs and what
dynamo made of it, read from dynamo's own accounting, never timed, so unchanged code gives
the same record on every run (the ops its eager counting step dispatches are not what the
compiled graphs run, so they are not part of it):

``graphs``
    the FX graphs dynamo compiled during the compile step (step 0):
    ``torch._dynamo.utils.counters["stats"]["unique_graphs"]``, counted over that step.
``graph_breaks`` and ``break_reasons``
    the graph breaks of the compile step: the entries dynamo appended to
    ``torch._dynamo.utils.graph_break_reasons`` (one per break, with the user's frame;
    it also holds the breaks on a data-dependent branch, which
    ``counters["graph_break"]`` leaves out). A reason is the first line of dynamo's
    message and where the break is, by function and source text
    (:mod:`pytest_accelperf.records.sites`): ``Call to `torch._dynamo.graph_break()`
    (tests/unit/backends/torch/test_program.py in Net.forward: if x.sum().item() > 0:)``.
``recompiles``
    the frames dynamo compiled after the compile step, through the end of the run (a
    guard that failed on a new shape or a changed Python value, or a code path first
    taken then): ``counters["frames"]["total"]``, counted from the end of step 0. Why
    each recompiled is kept apart (:attr:`DynamoWatch.recompile_reasons`, from
    ``torch._dynamo.utils.get_compilation_metrics()``).
``recompile_causes``
    one line per step that compiled again, naming the input that changed: the batch
    leaves whose shape, dtype or value differ from the step before's (``step 3:
    make_batch make_batch (suites/x.py:12) changed batch leaf 'x' float32[64, 8] →
    float32[32, 8]``), read from each batch as it is made (its shapes, not its data),
    else dynamo's guard that failed. Shown beside a change of ``recompiles``, not
    compared; left out when nothing compiled again.

All three are differences of counts taken around the steps, so whatever else the process
compiled before does not count. :func:`cold_compile` makes step 0's wall time the cold
compile of this case alone (see :data:`COMPILE_TIME_COVERS`).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator
from typing import Any

import torch

from pytest_accelperf.backends.torch.ops import OpCounts
from pytest_accelperf.backends.torch.task import leaves_with_paths
from pytest_accelperf.backends.types import Batch
from pytest_accelperf.records.program import ProgramRecord, program_record
from pytest_accelperf.records.sites import code_site

#: What a compiled case's ``compile_time`` covers (``Run.compile_time_covers``).
COMPILE_TIME_COVERS = (
    "dynamo trace + AOTAutograd + inductor compile of forward and backward + one execution "
    "of step 0, caches cold (dynamo reset, a fresh inductor cache directory); the process's "
    "one-time inductor start-up (imports, CPU ISA probe) done before, untimed")

#: Device types whose one-time compiler start-up this process has done (:func:`_prime`).
_PRIMED: set[str] = set()


def eager_program(flops: float | None, ops: OpCounts | None = None) -> ProgramRecord:
    """The record of an eager step: its FLOPs and ``ops``, what its counting step
    dispatched (:meth:`.torch.ops.OpCounter.record`)."""
    if ops is None:
        return program_record("torch", flops=flops)
    return program_record("torch", flops=flops, **ops)


def _fresh_inductor_cache() -> contextlib.AbstractContextManager[Any]:
    """Inductor with empty caches: a new cache directory (its on-disk FX-graph,
    AOTAutograd, C++ and Triton caches) and its in-memory caches cleared
    (``torch._inductor.utils.fresh_cache``, named ``fresh_inductor_cache`` before torch
    2.8). ``torch.compiler.config.force_disable_caches`` alone is not enough: inductor
    still loads a C++ kernel it finds compiled on disk or in memory."""
    from torch._inductor import utils

    fresh: Callable[[], contextlib.AbstractContextManager[Any]] | None = getattr(
        utils, "fresh_cache", None) or getattr(utils, "fresh_inductor_cache", None)
    return fresh() if fresh is not None else contextlib.nullcontext()


def _prime(device: torch.device) -> None:
    """Pay the process's one-time compiler start-up on ``device``'s type once, untimed:
    importing inductor, probing the CPU's vector ISA (it builds test programs: 5 s on
    this project's CI machine), the first Triton launch. Without it the first compiled
    case of a session reports seconds more than the same case run later, and a
    compile time would depend on which cases ran before it."""
    if device.type in _PRIMED:
        return

    def tiny(x: torch.Tensor) -> torch.Tensor:
        return (x.sin() * 2).sum()

    x = torch.ones(8, device=device, requires_grad=True)
    with _fresh_inductor_cache():
        torch.compile(tiny)(x).backward()  # type: ignore[no-untyped-call]  # untyped in torch
    torch._dynamo.reset()
    _PRIMED.add(device.type)


@contextlib.contextmanager
def cold_compile(device: torch.device) -> Iterator[None]:
    """Within the block, a ``torch.compile``-d step compiles cold, as the first compile of
    a fresh process would, less the process's one-time start-up (:func:`_prime`):
    ``torch._dynamo.reset()`` drops the code dynamo compiled before (without it a case
    after an identical one reused its graphs and reported 0.001 s), and inductor runs with
    a fresh cache directory and cleared in-memory caches (without it a reset case hit
    the FX-graph and AOTAutograd caches: 0.05 s instead of about 1.5 s)."""
    _prime(device)
    torch._dynamo.reset()
    with _fresh_inductor_cache():
        yield


def _counter(group: str, name: str) -> int:
    from torch._dynamo.utils import counters

    return int(counters[group][name])


def _break_count() -> int:
    from torch._dynamo.utils import graph_break_reasons

    return len(graph_break_reasons)


def break_reason(reason: object) -> str:
    """A dynamo ``GraphCompileReason`` as one line: the first line of its message and
    where in the user's code it broke, keyed by the code, not its line
    (:func:`~pytest_accelperf.records.sites.code_site`)."""
    lines = str(getattr(reason, "reason", reason)).strip().splitlines()
    text = lines[0].strip() if lines else "graph break"
    stack = list(getattr(reason, "user_stack", None) or [])
    if not stack:
        return text
    frame = stack[-1]
    site = code_site(str(getattr(frame, "filename", "?")), getattr(frame, "lineno", None),
                     str(getattr(frame, "name", "?")))
    return f"{text} ({site})"


def _compilations() -> list[Any]:
    """The compilation records dynamo holds now (told apart by identity: compile ids start
    over after ``torch._dynamo.reset()``, so an id can repeat among them; holding them
    keeps their identities from being reused)."""
    from torch._dynamo.utils import get_compilation_metrics

    return list(get_compilation_metrics())


#: What a step's batch is to dynamo's guards, leaf by leaf: ``(path, shape, dtype)`` of a
#: tensor, ``(path, None, value)`` of a Python number or string (dynamo specializes on
#: it), ``(path, None, type name)`` of anything else.
BatchSignature = tuple[tuple[str, tuple[int, ...] | None, Any], ...]


def batch_signature(batch: Batch) -> BatchSignature:
    """The :data:`BatchSignature` of ``batch``: tuples of shapes, dtypes and small values,
    never the tensors' data (a few microseconds a step)."""
    out: list[tuple[str, tuple[int, ...] | None, Any]] = []
    for path, leaf in leaves_with_paths(batch):
        if isinstance(leaf, torch.Tensor):
            out.append((path, tuple(leaf.shape), leaf.dtype))
        elif isinstance(leaf, int | float | str) and len(repr(leaf)) <= 40:
            out.append((path, None, leaf))
        else:
            out.append((path, None, type(leaf).__name__))
    return tuple(out)


def _leaf_text(shape: tuple[int, ...] | None, what: object) -> str:
    if shape is None:
        return repr(what) if isinstance(what, int | float | str) else str(what)
    return f"{str(what).removeprefix('torch.')}{list(shape)}"


def batch_change(before: BatchSignature, after: BatchSignature) -> str | None:
    """The leaves that differ from ``before`` to ``after``, in words (``batch leaf 'x'
    float32[64, 8] → float32[32, 8], ...``); None when the batches agree."""
    if [leaf[0] for leaf in before] != [leaf[0] for leaf in after]:
        return (f"the batch's leaves {[leaf[0] for leaf in before]} → "
                f"{[leaf[0] for leaf in after]}")[:300]
    changed = [f"batch leaf {path or '(the whole batch)'!r} {_leaf_text(s0, w0)} → "
               f"{_leaf_text(s1, w1)}"
               for (path, s0, w0), (_, s1, w1) in zip(before, after, strict=True)
               if (s0, w0) != (s1, w1)]
    return ", ".join(changed) or None


class DynamoWatch:
    """Dynamo's accounting over one compiled run (see the module docstring): made right
    before the compile step (after :func:`cold_compile` reset dynamo), shown each step's
    batch (:meth:`batch`, as it is made), told when each step is done (:meth:`after_step`,
    the measured-step loop's hook), read at the end (:meth:`record`).

    ``batch_source`` names what makes the batches (``make_batch make_batch
    (suites/x.py:12)``, or the data: :func:`~.data.source_label`): a recompile at a step
    whose batch changed names it, the step and each leaf that changed, before → after
    (:attr:`recompile_causes`)."""

    def __init__(self, batch_source: str = "make_batch") -> None:
        self._graphs0 = _counter("stats", "unique_graphs")
        self._breaks0 = _break_count()
        self._frames1: int | None = None
        self._frames_last = 0  # frames compiled by the end of the last step
        self._seen: list[Any] = []
        self._batches: tuple[BatchSignature | None, BatchSignature | None] = (None, None)
        self._source = batch_source
        self.graphs = 0
        self.break_reasons: list[str] = []
        #: Why dynamo compiled again, one line per step that did (see :meth:`_cause`).
        self.recompile_causes: list[str] = []

    def batch(self, i: int, batch: Batch) -> None:
        """The batch of step ``i``, before the step runs: its signature is kept beside the
        previous step's, what a recompile at this step is explained with."""
        self._batches = (self._batches[1], batch_signature(batch))

    def after_step(self, i: int, handle: object = None, measured: bool = False) -> None:
        """After step ``i`` (``run_steps``' ``after_step``): at the end of step 0, read
        what compiling it made; after a later step that compiled a frame, why."""
        if self._frames1 is None:
            if i != 0:
                return
            from torch._dynamo.utils import graph_break_reasons

            self.graphs = _counter("stats", "unique_graphs") - self._graphs0
            self.break_reasons = [break_reason(r) for r in graph_break_reasons[self._breaks0:]]
            self._frames1 = self._frames_last = _counter("frames", "total")
            self._seen = _compilations()
            return
        frames = _counter("frames", "total")  # a dict lookup: cheap on every step
        if frames > self._frames_last:
            self.recompile_causes.append(self._cause(i))
        self._frames_last = frames

    def _cause(self, i: int) -> str:
        """Why step ``i`` compiled again: the batch leaves that changed since the step
        before (and the function that made them), else dynamo's guard that failed."""
        before, now = self._batches
        changed = batch_change(before, now) if before is not None and now is not None else None
        if changed:
            return f"step {i}: {self._source} changed {changed}"
        new = [m for m in _compilations() if not any(m is seen for seen in self._seen)]
        self._seen.extend(new)
        # The first line of each (the guard, and the user's line it guards), without the
        # compile id of the guard set ("0/0: "), which says nothing to the user.
        reasons = [re.sub(r"^\d+/\d+:\s*", "", " ".join(
            (str(m.recompile_reason or "").strip().splitlines() or [""])[0].split()))[:200]
                   for m in new]
        why = "; ".join(r for r in reasons if r) or "a frame compiled again"
        return f"step {i}: {why} (the batch did not change)"

    @property
    def recompiles(self) -> int:
        """Frames dynamo compiled after the compile step (0 before it ended)."""
        if self._frames1 is None:
            return 0
        return _counter("frames", "total") - self._frames1

    @property
    def recompile_reasons(self) -> list[str]:
        """Why each frame compiled after step 0 was compiled: dynamo's recompile reason
        (the guard that failed), first line, or the frame's name where it was new."""
        if self._frames1 is None:
            return []
        from torch._dynamo.utils import get_compilation_metrics

        out = []
        for m in get_compilation_metrics():
            if any(m is seen for seen in self._seen):
                continue
            why = " ".join(str(m.recompile_reason or "").strip().splitlines()[:1]).split()
            out.append(f"{m.compile_id} {m.co_name}: "
                       f"{' '.join(why) if why else 'first compile of this frame'}")
        return out

    def record(self, flops: float | None) -> ProgramRecord:
        """The ``Run.program`` record of the compiled step."""
        return program_record("torch.compile", flops=flops, graphs=self.graphs,
                              graph_breaks=len(self.break_reasons),
                              break_reasons=list(self.break_reasons),
                              recompiles=self.recompiles,
                              recompile_causes=list(self.recompile_causes) or None)
