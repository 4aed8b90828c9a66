"""The MemTracker the torch backends count CPU memory with (``backends/torch/memory.py``):
the same device totals as torch's stock MemTracker, without its per-module peaks.

Counted on a real training step (a residual MLP with many modules, AdamW, a buffer the
forward pass updates): the peak over the first steps and the live bytes after each step
must be the same bytes, byte for byte, from both trackers.
"""

from __future__ import annotations

import gc
import weakref
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from pytest_accelperf.backends.torch import memory as torch_memory  # noqa: E402
from pytest_accelperf.backends.torch.memory import (  # noqa: E402
    device_total,
    memory_tracker,
)
from pytest_accelperf.torch import TorchStep  # noqa: E402

CPU = torch.device("cpu")
WIDTH, DEPTH, BATCH = 32, 6, 16


def make_batch(step: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    x = torch.randn(BATCH, WIDTH, generator=g)
    return {"x": x, "y": x.sum(dim=1, keepdim=True)}


def residual_mlp_step() -> TorchStep:
    torch.manual_seed(0)
    blocks = [torch.nn.Sequential(torch.nn.LayerNorm(WIDTH), torch.nn.Linear(WIDTH, 4 * WIDTH),
                                  torch.nn.GELU(), torch.nn.Linear(4 * WIDTH, WIDTH))
              for _ in range(DEPTH)]
    model = torch.nn.ModuleDict({"norm": torch.nn.BatchNorm1d(WIDTH),
                                 "blocks": torch.nn.ModuleList(blocks),
                                 "head": torch.nn.Linear(WIDTH, 1)})
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step(batch: dict[str, torch.Tensor]) -> dict[str, Any]:
        x = model["norm"](batch["x"])
        for block in model["blocks"]:
            x = x + block(x)
        loss = ((model["head"](x) - batch["y"]) ** 2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return {"loss": loss}

    return TorchStep(step=step, make_batch=make_batch, model=model, stateful=())


def test_the_totals_are_the_stock_trackers_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    step = residual_mlp_step()
    lean = torch_memory.cpu_memory(step, CPU, steps=4)
    monkeypatch.setattr(torch_memory, "memory_tracker",
                        lambda: memory_tracker(per_module=True))
    stock = torch_memory.cpu_memory(step, CPU, steps=4)
    assert lean.source == stock.source == "mem_tracker"
    assert lean.peak == stock.peak
    assert lean.live == stock.live
    # Against the analytic count: between steps (gradients set to None) what lives is the
    # parameters, AdamW's two moments of each, its step counter per parameter (a float32
    # scalar tensor) and the BatchNorm buffers, to the byte; activations on top at the peak.
    model = step.modules()[""]
    params = [p.numel() * p.element_size() for p in model.parameters()]
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    assert lean.live == [3 * sum(params) + 4 * len(params) + buffers] * 4
    assert lean.peak > lean.live[-1] + sum(params)  # the gradients, at least


def test_this_torch_gets_the_lean_tracker() -> None:
    """The lean tracker overrides a private method of torch's; the torch this project
    pins still has what it reads (else the stock tracker would be used, slower, silently)."""
    from torch.distributed._tools.mem_tracker import MemTracker

    tracker = memory_tracker()
    assert type(tracker) is not MemTracker and isinstance(tracker, MemTracker)
    assert device_total(tracker, "peak", CPU) is None  # nothing counted yet


def _live_tensor_bytes() -> int:
    """The storage bytes of every torch tensor alive in this process, after a collection.
    Plain tensors and parameters only (what a case's model, gradients and optimizer state
    are): not the data-less subclasses, such as the FakeTensors an earlier test's
    ``torch.compile`` left in the same worker, whose ``data_ptr`` raises or warns."""
    gc.collect()
    storages = {}
    for obj in gc.get_objects():
        # type(), not isinstance: a deprecated torch alias warns when asked its __class__
        if type(obj) in (torch.Tensor, torch.nn.Parameter) and not obj.is_meta:
            storage = obj.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values())


@pytest.mark.slow  # trains and counts two cases (5 s): not in the quick loop
def test_a_finished_case_leaves_no_tensor_alive() -> None:
    """Two cases trained in one process, as a session trains them: once the first case's
    result is dropped, none of its tensors is alive when the second starts. torch's
    MemTracker (the CPU memory count) kept the autograd graph of every counted step, and
    with it the model's parameters and gradients, alive for the rest of the process (a
    cycle through C++ that gc cannot see, :func:`.memory._releasing_class`); the other
    leftovers, garbage in reference cycles, are for :func:`.memory.fresh_peak` (the next
    test). One small step (a 6-block MLP,
    2 measured steps): fails on that tracker."""
    from pytest_accelperf.backends.torch.backend import BACKEND
    from pytest_accelperf.collect.cases import Case
    from pytest_accelperf.provision.accel import Accelerator

    accel = Accelerator(name="cpu", platform="cpu-x1", device_kind="cpu", device_count=1)
    case = Case(backend="torch", batch=BATCH, steps=2, warmup=0)
    before = _live_tensor_bytes()
    kept: list[weakref.ref[torch.Tensor]] = []
    for _ in range(2):
        step = residual_mlp_step()
        kept.extend(weakref.ref(p) for p in step.modules()[""].parameters())
        result = BACKEND.train(case, step, accel)
        assert result.run.outcome == "ok", result.run.message
        del step, result
        gc.collect()
        assert [ref for ref in kept if ref() is not None] == []
    assert _live_tensor_bytes() - before < 4096  # a few scalars at most


def test_fresh_peak_frees_the_garbage_of_earlier_cases() -> None:
    """A case's tensors held in a reference cycle (as a trainer and its module are) are
    freed before the next case counts, not whenever the cyclic gc next runs."""
    gc.disable()
    try:
        cycle: list[object] = [torch.zeros(1024)]
        cycle.append(cycle)
        ref = weakref.ref(cycle[0])
        del cycle
        assert ref() is not None  # garbage, not yet collected
        torch_memory.fresh_peak(CPU)
        assert ref() is None
    finally:
        gc.enable()
