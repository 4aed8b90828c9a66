"""What the in-process torch backend reads of a step's program and memory, trained for real
on the CPU: the program record of an eager and a compiled step (dynamo's graphs, graph
breaks with their reasons, recompiles during training), a cold compile time for a compiled
case that follows an identical one, and live memory's growth per step (a leak).

Compiling costs seconds here (about 1.5 s a case, and the process's one-time inductor
start-up, about 7 s, once): the compiled cases are few and shared through module fixtures.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from conftest import spinning  # noqa: E402

from pytest_accelperf.backends.torch.backend import BACKEND  # noqa: E402
from pytest_accelperf.backends.torch.flops import count_step, count_step_flops  # noqa: E402
from pytest_accelperf.backends.torch.memory import (  # noqa: E402
    GROWTH_STEPS,
    MEMORY_STEPS,
    _CudaGrowth,
)
from pytest_accelperf.backends.torch.step_record import COMPILE_TIME_COVERS, eager_program  # noqa: E402
from pytest_accelperf.collect.cases import Case  # noqa: E402
from pytest_accelperf.provision.accel import Accelerator  # noqa: E402
from pytest_accelperf.records.program import changes, describe_changes  # noqa: E402
from pytest_accelperf.records.run import Run  # noqa: E402
from pytest_accelperf.torch import TorchStep  # noqa: E402

STEPS, WARMUP, BATCH, DIM = 4, 1, 64, 8
CPU = Accelerator(name="cpu", platform="cpu-x1", device_kind="cpu", device_count=1)
LEAK = 133_000  # bytes a leaking step keeps each step: 33,250 float32

# Dynamo, tracing the forward resumed after the `.item()` break, reads `.grad` of a
# non-leaf fake tensor and warns; the suite turns warnings into errors.
pytestmark = pytest.mark.filterwarnings(
    "ignore:The .grad attribute of a Tensor that is not a leaf Tensor:UserWarning")


def case(**kw: Any) -> Case:
    return Case(**{"backend": "torch", "batch": BATCH, "steps": STEPS, "warmup": WARMUP, **kw})


def make_batch(step: int, rows: int = BATCH) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    x = torch.randn(rows, DIM, generator=g)
    return {"x": x, "y": x[:, :2].sum(dim=1, keepdim=True)}


class Net(torch.nn.Module):
    """Two layers; ``item_branch`` adds a Python branch on a tensor's ``.item()`` in the
    forward, a graph break under torch.compile."""

    def __init__(self, item_branch: bool = False) -> None:
        super().__init__()
        self.inner = torch.nn.Linear(DIM, 32)
        self.out = torch.nn.Linear(32, 1)
        self.item_branch = item_branch

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.inner(x))
        if self.item_branch and h.abs().mean().item() > 100.0:
            h = h * 0.5
        out: torch.Tensor = self.out(h)
        return out


class Training:
    """A model, its optimizer and its step; ``compile`` steps through ``torch.compile``
    (FLOPs and memory counted over the eager step), ``leak`` keeps a detached 133 KB tensor
    each step, ``accum`` calls the model that many times a step (MemTracker refuses that:
    the profiler counts)."""

    def __init__(self, compile: bool = False, item_branch: bool = False, leak: bool = False,
                 accum: int = 1) -> None:
        torch.manual_seed(0)
        self.model = Net(item_branch)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-2)
        self.runnable: Any = torch.compile(self.model) if compile else self.model
        self.compile, self.leak, self.accum = compile, leak, accum
        self.kept: list[torch.Tensor] = []
        self.calls = 0

    def train(self, module: Any, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        self.calls += 1
        self.optimizer.zero_grad(set_to_none=True)
        total = torch.zeros(())
        for x, y in zip(batch["x"].chunk(self.accum), batch["y"].chunk(self.accum),
                        strict=True):
            loss = ((module(x) - y) ** 2).mean() / self.accum
            loss.backward()
            total += loss.detach()
        self.optimizer.step()
        if self.leak:  # a history kept by mistake: 133 KB more live every step
            self.kept.append(torch.full((LEAK // 4,), 1.0) * total.detach())
        return total

    def torch_step(self, batch: Callable[[int], Any] = make_batch) -> TorchStep:
        return TorchStep(step=lambda b: self.train(self.runnable, b), make_batch=batch,
                         model=self.model, compile=self.compile,
                         count_step=(lambda b: self.train(self.model, b)) if self.compile
                         else None)


def train(training: Training, batch: Callable[[int], Any] = make_batch, **kw: Any) -> Run:
    run = BACKEND.train(case(**kw), training.torch_step(batch), CPU).run
    assert run.outcome == "ok", run.message
    return run


@pytest.fixture(scope="module")
def eager() -> Run:
    """The eager case, trained once for the tests that read its record: its FLOPs, its
    memory's growth, and no compile load."""
    return train(Training())


# -- the program record -----------------------------------------------------------------------
def test_an_eager_step_records_its_flops(eager: Run) -> None:
    run = eager
    flops = count_step_flops(Training().torch_step(), make_batch(0))
    counted = count_step(Training().torch_step(), make_batch(0), torch.device("cpu"))
    # Its FLOPs and what the same counted step dispatched (tests/unit/backends/torch/test_ops.py).
    assert run.program == eager_program(flops, counted.ops)
    assert run.program["host_syncs"] == 0 and run.program["ops"]["addmm[f32]"] == 2
    # Forward and weight gradients of both layers, the input gradient of the second only.
    assert run.flops_per_step == flops == 2 * BATCH * (2 * (DIM * 32 + 32) + 32)


@pytest.fixture(scope="module")
def compiled() -> list[Run]:
    """The same compiled case trained twice, one after the other, in this process: the
    second beside a process spinning on one core (the compile-load test's busy case, which
    was a third training of it)."""
    quiet = train(Training(compile=True))
    with spinning():
        busy = train(Training(compile=True))
    return [quiet, busy]


@pytest.fixture(scope="module")
def broken() -> Run:
    """The compiled case with an ``.item()`` branch in the forward."""
    return train(Training(compile=True, item_branch=True))


@pytest.mark.slow
def test_what_the_machine_did_while_the_step_compiled_is_recorded(
        compiled: list[Run], eager: Run) -> None:
    """A compile is one sample: what other processes used of the machine while step 0
    compiled is recorded (from ``/proc``), for the compile check to leave a change made
    beside another job unjudged. Quiet, then beside a process spinning on one core."""
    for run in compiled:
        load = run.compile_load
        assert load is not None
        assert load.seconds >= 0.8 * (run.compile_time or 0) > 0
        assert load.foreign_cores >= 0
    busy = compiled[1]  # trained beside the spinning core
    assert busy.compile_load is not None
    assert busy.compile_load.foreign_cores > 0.5  # the spinning core
    assert eager.compile_load is None  # an eager step compiles nothing


@pytest.mark.slow  # torch.compile of the step: 23 s of setup
def test_a_compiled_step_records_dynamos_graphs(compiled: list[Run]) -> None:
    first, second = compiled
    assert first.program is not None
    assert first.program["source"] == "torch.compile"
    assert first.program["graphs"] == 1
    assert first.program["graph_breaks"] == 0 and first.program["break_reasons"] == []
    assert first.program["recompiles"] == 0
    assert first.program["flops"] == first.flops_per_step  # of the eager count_step
    # Unchanged code: the same record, nothing to report.
    assert second.program == first.program
    assert changes(first.program, second.program, 0.0) == []
    assert describe_changes(first.program, second.program, 0.0) == []


@pytest.mark.slow  # torch.compile of the step: 23 s of setup
def test_a_graph_break_is_counted_with_its_reason(compiled: list[Run], broken: Run) -> None:
    before, after = compiled[0].program, broken.program
    assert before is not None and after is not None
    assert after["graph_breaks"] >= 1 and after["graphs"] >= 2
    (reason,) = after["break_reasons"]
    assert reason.startswith("Unsupported Tensor.item() call"), reason
    # Where it broke, by function and source text: not the line, which moves with any
    # line added above it.
    assert reason.endswith(" (tests/unit/backends/torch/test_program.py in Net.forward: "
                           "if self.item_branch and h.abs().mean().item() > 100.0:)"), reason
    found = {c.name: (c.baseline, c.now) for c in changes(before, after, 0.0)}
    assert found["graph_breaks"] == (0, after["graph_breaks"])
    assert f"graph breaks: 0 → 1 per step ({reason})" in describe_changes(before, after, 0.0)


@pytest.mark.slow
def test_a_shape_that_changes_at_a_measured_step_recompiles(compiled: list[Run]) -> None:
    def fewer_rows_from_step_3(step: int) -> dict[str, torch.Tensor]:
        return make_batch(step, BATCH if step < 3 else BATCH // 2)

    run = train(Training(compile=True), batch=fewer_rows_from_step_3)
    assert run.program is not None and compiled[0].program is not None
    assert run.program["recompiles"] >= 1
    assert run.program["graphs"] == compiled[0].program["graphs"]  # step 0 is the same
    (why, *_) = run.details["recompile_reasons"]
    assert "size mismatch at index 0. expected 64, actual 32" in why, why
    assert [c.name for c in changes(compiled[0].program, run.program, 0.0)] == ["recompiles"]
    # The input that changed, at the step it changed: named in the record and in the
    # check's verdict (before, only the count moved: 'recompiles: 0 → 1 per step').
    line = fewer_rows_from_step_3.__code__.co_firstlineno
    cause = (f"step 3: make_batch fewer_rows_from_step_3 "
             f"(tests/unit/backends/torch/test_program.py:{line}) "
             f"changed batch leaf 'x' float32[{BATCH}, {DIM}] → float32[{BATCH // 2}, {DIM}], "
             f"batch leaf 'y' float32[{BATCH}, 1] → float32[{BATCH // 2}, 1]")
    assert run.program["recompile_causes"] == [cause]
    (said, _flops) = describe_changes(compiled[0].program, run.program, 0.0)
    assert said.startswith(f"recompiles: 0 → {run.program['recompiles']} per step ({cause}; "
                           f"one compiled graph serves batches of one shape: a fixed batch "
                           f"size (drop_last=True for a loader)"), said
    assert "recompile_causes" not in compiled[0].program  # nothing compiled again


@pytest.mark.slow
def test_a_python_int_that_changes_recompiles() -> None:
    """A Python number the forward reads, changed at a measured step: its guard fails."""
    training = Training(compile=True)
    model = training.model
    scaled = torch.compile(lambda x, k: model(x) * k)
    trained = [0]  # the compiled step runs in training only: count_step counts

    def step(batch: dict[str, torch.Tensor]) -> torch.Tensor:
        k = 1 if trained[0] < 3 else 2  # from step 3, the first measured step but one
        trained[0] += 1
        return training.train(lambda x: scaled(x, k), batch)

    run = BACKEND.train(case(), TorchStep(step, make_batch, model, compile=True,
                                          count_step=lambda b: training.train(model, b)),
                        CPU).run
    assert run.outcome == "ok", run.message
    assert run.program is not None and run.program["recompiles"] >= 1, run.program
    assert run.program["graph_breaks"] == 0
    # No batch leaf changed: the cause is dynamo's guard that failed, at its step.
    (cause,) = run.program["recompile_causes"]
    assert cause.startswith("step 3: k == 1 # ") and cause.endswith(
        "(the batch did not change)"), cause
    assert "batch leaf" not in cause and "\n" not in cause, cause


# -- a cold compile ---------------------------------------------------------------------------
@pytest.mark.slow  # torch.compile of the step: 23 s of setup
def test_a_compiled_case_after_an_identical_one_compiles_cold(compiled: list[Run]) -> None:
    first, second = (r.compile_time for r in compiled)
    assert first is not None and second is not None
    # Before dynamo was reset and inductor's caches emptied the second reported 0.001 s.
    assert second >= 0.3 * first, (first, second)
    assert compiled[1].compile_time_covers == COMPILE_TIME_COVERS
    assert "caches cold" in COMPILE_TIME_COVERS


# -- live memory's growth ---------------------------------------------------------------------
def test_a_leak_of_133_kb_a_step_is_read() -> None:
    training = Training(leak=True)
    run = train(training)
    growth = run.memory_growth
    assert growth is not None and growth["source"] == "mem_tracker" == run.memory_source
    assert growth["bytes_per_step"] == pytest.approx(LEAK, rel=0.1)
    assert growth["steps"] == GROWTH_STEPS
    assert growth["after_steps"] - growth["after_warmup"] == GROWTH_STEPS * growth[
        "bytes_per_step"]
    # The counting steps ran the step 2 + 2 + 1 more times (memory, growth, FLOPs), undone.
    assert training.calls == WARMUP + STEPS + MEMORY_STEPS + GROWTH_STEPS + 1
    assert len(training.kept) == training.calls  # the step's own list is not undone


def test_a_normal_step_does_not_grow(eager: Run) -> None:
    run = eager
    growth = run.memory_growth
    assert growth is not None and growth["source"] == "mem_tracker"
    assert abs(growth["bytes_per_step"]) < 1024
    assert growth["bytes_per_step"] == 0  # MemTracker counts tensors' storages exactly
    assert growth["after_warmup"] > 0


def test_the_profiler_reads_a_leak_where_mem_tracker_cannot() -> None:
    """Gradient accumulation calls the model twice a step: the profiler counts, its
    allocations net of frees at the end of each counted step."""
    leaking = train(Training(leak=True, accum=2))
    steady = train(Training(accum=2))
    assert leaking.memory_source == "profiler" == steady.memory_source
    assert leaking.memory_growth is not None and steady.memory_growth is not None
    assert leaking.memory_growth["source"] == "profiler"
    assert leaking.memory_growth["bytes_per_step"] == pytest.approx(LEAK, rel=0.1)
    assert abs(steady.memory_growth["bytes_per_step"]) < 1024


def test_cuda_growth_reads_the_allocator_after_the_warmup_and_the_last_step(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """On CUDA the allocator's live bytes after the warm-up and after the last measured
    step (no GPU here: the allocator's count is replaced by one that grows 100 bytes a
    step)."""
    allocated = iter(range(1000, 10_000, 100))
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: next(allocated))
    growth = _CudaGrowth(torch.device("cuda", 0), warmup=2)
    for i in range(2 + 3):
        growth.after_step(i, None, i >= 2)
    assert growth.record() == {"bytes_per_step": 100.0, "steps": 3, "after_warmup": 1000,
                               "after_steps": 1300, "source": "cuda_allocator"}
