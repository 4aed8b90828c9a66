"""What an eager torch step dispatches (``pytest_accelperf.backends.torch.ops``) and how the
program check judges it: the three regressions users injected into nanoGPT's train.py that
passed every check before (a ``loss.item()`` per step, attention falling back from
``F.scaled_dot_product_attention`` to matmul-mask-softmax, autocast turned off), each a
verdict naming what changed; an unchanged step records the same program in two processes.

A one-block attention model of 2 x 16 tokens: each count costs milliseconds.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

from pytest_accelperf.backends.torch.backend import BACKEND  # noqa: E402
from pytest_accelperf.backends.torch.flops import count_step  # noqa: E402
from pytest_accelperf.backends.torch.ops import OpCounter, left_out, op_key, sync_kind  # noqa: E402
from pytest_accelperf.backends.torch.step_record import eager_program  # noqa: E402
from pytest_accelperf.backends.torch.stepper import TorchStepper  # noqa: E402
from pytest_accelperf.checks.program import check_program  # noqa: E402
from pytest_accelperf.collect.cases import Case  # noqa: E402
from pytest_accelperf.provision.accel import Accelerator  # noqa: E402
from pytest_accelperf.records.program import matmul_dtypes  # noqa: E402
from pytest_accelperf.records.verdict import Tolerances, Verdict  # noqa: E402
from pytest_accelperf.torch import TorchStep  # noqa: E402

CPU = Accelerator(name="cpu", platform="cpu-x1", device_kind="cpu", device_count=1)
TOL = Tolerances()
BATCH, T, D, HEADS = 2, 16, 16, 2
aten = torch.ops.aten


class Block(torch.nn.Module):
    """Causal self-attention and its output projection; ``manual`` writes the attention
    with matmuls, a mask and a softmax (the same FLOPs as the fused kernel)."""

    def __init__(self, manual: bool = False) -> None:
        super().__init__()
        self.qkv = torch.nn.Linear(D, 3 * D)
        self.proj = torch.nn.Linear(D, D)
        self.manual = manual

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = (t.view(BATCH, T, HEADS, D // HEADS).transpose(1, 2)
                   for t in self.qkv(x).split(D, dim=2))
        if self.manual:
            att = (q @ k.transpose(-2, -1)) * (D // HEADS) ** -0.5
            mask = torch.ones(T, T, dtype=torch.bool).tril()
            y = att.masked_fill(~mask, float("-inf")).softmax(dim=-1) @ v
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out: torch.Tensor = self.proj(y.transpose(1, 2).reshape(BATCH, T, D))
        return out


def make_batch(i: int) -> torch.Tensor:
    return torch.randn(BATCH, T, D, generator=torch.Generator().manual_seed(i))


def training(manual: bool = False, amp: bool = True, item: bool = False,
             optimizer: str = "SGD") -> TorchStep:
    """The step: bfloat16 autocast unless ``amp`` is off, ``loss.item()`` with ``item``."""
    torch.manual_seed(0)
    model = Block(manual)
    opt = getattr(torch.optim, optimizer)(model.parameters(), lr=1e-2)

    def step(x: torch.Tensor) -> dict[str, Any]:
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
            loss = model(x).float().pow(2).mean()
        loss.backward()
        opt.step()
        if item:
            loss_value = loss.item()  # a host sync a step
            return {"loss": loss, "value": loss_value}
        return {"loss": loss, "value": 0.0}

    return TorchStep(step=step, make_batch=make_batch, model=model, stateful=())


def program(**kw: Any) -> dict[str, Any]:
    counted = count_step(training(**kw), make_batch(0), torch.device("cpu"))
    return eager_program(counted.flops, counted.ops)


def judge(now: dict[str, Any], base: dict[str, Any]) -> tuple[Verdict, str]:
    result = check_program({"program": now}, {"program": base, "environment": {}}, TOL,
                           comparable=True)
    assert result is not None
    return result.verdict, result.detail


@pytest.fixture(scope="module")
def base() -> dict[str, Any]:
    return program()


#: The block's matrix products a step: the two projections forward, their weight gradients,
#: and the input gradient of the output projection (the input of qkv needs none).
MATMULS = 2 + 2 + 1


# -- the three regressions --------------------------------------------------------------------
def test_a_loss_item_per_step_is_a_host_sync_regression_naming_its_code(
        base: dict[str, Any]) -> None:
    now = program(item=True)
    assert base["host_syncs"] == 0 and now["host_syncs"] == 1
    verdict, detail = judge(now, base)
    assert verdict is Verdict.REGRESSION, detail
    assert detail.startswith(
        "host syncs: 0 → 1 per step (_local_scalar_dense at "
        "tests/unit/backends/torch/test_ops.py in training.step: loss_value = loss.item(): "
        "0 → 1)"), detail
    assert "ops: _local_scalar_dense[f32] 0 → 1" in detail
    # Without the fields (a baseline recorded before them) nothing is compared.
    verdict, _ = judge(now, {"source": "torch", "flops": base["flops"]})
    assert verdict is Verdict.PASS


def test_attention_written_with_matmuls_moves_more_bytes_and_names_the_ops(
        base: dict[str, Any]) -> None:
    now = program(manual=True)
    assert now["flops"] == base["flops"]  # the same FLOPs: FLOPs alone cannot see it
    assert now["bytes_accessed"] > 1.5 * base["bytes_accessed"]
    verdict, detail = judge(now, base)
    assert verdict is Verdict.REGRESSION, detail
    assert detail.startswith("bytes accessed: "), detail
    assert "FLOPs +0.0%" in detail
    ops = detail.split("ops: ", 1)[1]
    # The fused kernels went and the kernels that replace them came, first.
    for gone in ("_scaled_dot_product_flash_attention_for_cpu[bf16] 1 → 0",
                 "_scaled_dot_product_flash_attention_for_cpu_backward[bf16,f32] 1 → 0"):
        assert gone in ops, ops
    # Two products forward, two input gradients each backward; the mask forward and back.
    for came in ("bmm[bf16] 0 → 6", "masked_fill[bf16,b8] 0 → 2"):
        assert came in ops, ops


def test_autocast_off_is_a_regression_of_matmul_dtypes_and_on_an_improvement(
        base: dict[str, Any]) -> None:
    f32 = program(amp=False)
    assert matmul_dtypes(base["ops"]) == {"bf16": MATMULS}
    assert matmul_dtypes(f32["ops"]) == {"f32": MATMULS}
    verdict, detail = judge(f32, base)
    assert verdict is Verdict.REGRESSION, detail
    assert f"; matmul dtypes: bf16 {MATMULS} → 0, f32 0 → {MATMULS}; FLOPs +0.0%" in detail
    assert detail.startswith("bytes accessed: "), detail  # float32 operands: more bytes too
    # Back to bfloat16: narrower products, and fewer bytes (the casts cost less than the
    # float32 operands they replace in this block).
    verdict, detail = judge(base, f32)
    assert verdict is Verdict.IMPROVEMENT, detail
    assert f"matmul dtypes: bf16 0 → {MATMULS}, f32 {MATMULS} → 0" in detail, detail


def test_the_optimizers_step_counters_are_no_host_syncs() -> None:
    """AdamW reads each parameter's step counter with ``.item()``: a CPU tensor on every
    device, so never a wait; the ops still show it."""
    adamw = program(optimizer="AdamW")
    assert adamw["host_syncs"] == 0 and adamw["host_sync_sites"] == {}
    assert adamw["ops"]["_local_scalar_dense[f32]"] == 4  # qkv and proj: weight and bias


# -- the record of a run, of A/B mode, and in another process ---------------------------------
def test_a_run_and_the_ab_stepper_record_the_counted_step(base: dict[str, Any]) -> None:
    case = Case(backend="torch", batch=BATCH, steps=2, warmup=1)
    run = BACKEND.train(case, training(), CPU).run
    assert run.outcome == "ok", run.message
    assert run.program == base
    assert TorchStepper(case, training(), CPU).program == base


@pytest.mark.slow  # trains in another process (5 s): not in the quick loop
def test_the_same_step_gives_the_same_record_in_another_process(base: dict[str, Any]) -> None:
    script = textwrap.dedent(f"""
        import json, sys
        sys.path.insert(0, {str(Path(__file__).parents[3])!r})
        from unit.backends.torch import test_ops
        print(json.dumps(test_ops.program()))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         check=True, timeout=300)
    assert json.loads(out.stdout) == base
    verdict, detail = judge(json.loads(out.stdout), base)
    assert verdict is Verdict.PASS and "same program" in detail, detail


# -- what is counted ----------------------------------------------------------------------------
def test_views_and_profiler_markers_are_left_out_copies_and_in_place_ops_kept() -> None:
    for op in (aten.view.default, aten.t.default, aten.expand.default, aten.detach.default,
               aten.transpose.int, aten.split.Tensor, aten._unsafe_view.default,
               torch.ops.profiler._record_function_exit._RecordFunction):
        assert left_out(op), op
    for op in (aten._to_copy.default, aten.copy_.default, aten.clone.default,
               aten.add_.Tensor, aten.zeros.default, aten.mm.default):
        assert not left_out(op), op
    x = torch.ones(4, 4)
    assert op_key("mm", [x.bfloat16(), x.bfloat16()]) == "mm[bf16]"
    assert op_key("embedding", [x, torch.zeros(2, dtype=torch.long)]) == "embedding[f32,i64]"
    assert op_key("zeros", []) == "zeros"
    counter = OpCounter(torch.device("cpu"))
    with counter:
        (x.t() @ x).add_(1.0)
    # mm reads 2 x 64 bytes and writes 64; add_ reads and writes its 64.
    assert counter.ops == {"mm[f32]": 1, "add_[f32]": 1}
    assert counter.bytes == 3 * 64 + 2 * 64


def test_the_bytes_of_a_linear_regression_step_are_its_operands_and_results() -> None:
    """Linear(8, 1) on 8 rows, SGD: every op's tensor inputs and outputs, float32 (4 bytes;
    x is 8 x 8, the weight 1 x 8, the bias, predictions, errors and gradients 8 x 1)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(8, 8)

    def step(batch: torch.Tensor) -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        loss = ((model(batch) - batch.sum(1, keepdim=True)) ** 2).mean()
        loss.backward()
        opt.step()
        return loss

    counted = count_step(TorchStep(step, lambda i: x, model, stateful=()), x,
                         torch.device("cpu"))
    forward = ((256 + 32)  # sum(x, 1): x in, y out
               + (4 + 256 + 32 + 32)  # addmm(bias, x, weight.t()): predictions out
               + 3 * 32 + 2 * 32  # sub: error out; pow: its square
               + (32 + 4))  # mean: the loss
    backward = ((4 + 4)  # ones_like(loss)
                + 2 * 32  # div: the mean's gradient, spread over the 8 rows
                + 2 * 32 + 2 * 32 + 3 * 32  # pow's: error ** 1, times 2, times the gradient
                + (32 + 256 + 32)  # mm: the weight's gradient
                + (32 + 4))  # sum: the bias's gradient
    sgd = 3 * 32 + 3 * 4  # add_(param, grad, alpha=-lr), weight and bias
    assert counted.ops["bytes_accessed"] == forward + backward + sgd == 1568
    assert sum(counted.ops["ops"].values()) == 14


def test_data_dependent_shapes_and_reads_are_host_syncs() -> None:
    cpu = torch.device("cpu")
    x, mask = torch.arange(6.0), torch.tensor([True, False] * 3)
    counter = OpCounter(cpu)
    with counter:
        x[mask], x[torch.tensor([0, 2])], x.nonzero(), bool(x.sum() > 0)
        torch.masked_select(x, mask), x.unique()
    kinds = sorted(site.split(" at ")[0] for site in counter.sync_sites)
    assert kinds == ["_local_scalar_dense", "_unique2", "index with a bool mask",
                     "masked_select", "nonzero"], counter.sync_sites
    assert sync_kind(aten.repeat_interleave.Tensor, (torch.tensor([1, 2]),),
                     {"output_size": 3}, None, cpu) is None


def test_a_copy_to_the_cpu_is_a_host_sync_only_from_a_device() -> None:
    """The classifier alone: this machine has no accelerator, so a meta tensor stands in
    for one (a real device-to-host copy is not exercised here)."""
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    on_device, on_host = torch.empty(4, device="meta"), torch.empty(4)
    to_copy, copy_ = aten._to_copy.default, aten.copy_.default
    assert sync_kind(to_copy, (on_device,), {"device": cpu}, on_host, cuda) == "copy to cpu"
    assert sync_kind(copy_, (on_host, on_device), {}, on_host, cuda) == "copy to cpu"
    assert sync_kind(copy_, (on_host, on_device, True), {}, on_host, cuda) is None
    assert sync_kind(to_copy, (on_device,), {"non_blocking": True}, on_host, cuda) is None
    assert sync_kind(to_copy, (on_host,), {}, on_host, cpu) is None
    assert sync_kind(copy_, (on_device, on_host), {}, on_device, cuda) is None
    # On an accelerator, a CPU tensor's value is read without waiting; a device's is not.
    scalar = aten._local_scalar_dense.default
    assert sync_kind(scalar, (torch.ones(()),), {}, 1.0, cuda) is None
    assert sync_kind(scalar, (torch.ones((), device="meta"),), {}, 1.0, cuda) == (
        "_local_scalar_dense")


# -- through pytest ---------------------------------------------------------------------------
SUITE = '''
import torch
from pytest_accelperf import cases
from pytest_accelperf.torch import TorchStep


@cases(backend="torch", batch=[8], steps=2, warmup=1, accels=("cpu",))
def test_linear(accelperf):
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(batch):
        opt.zero_grad(set_to_none=True)
        loss = ((model(batch["x"]) - batch["y"]) ** 2).mean()
        loss.backward()
        opt.step()
        {debug}
        return loss

    def make_batch(i):
        x = torch.randn(8, 8, generator=torch.Generator().manual_seed(i))
        return {{"x": x, "y": x.sum(1, keepdim=True)}}

    accelperf.train(TorchStep(step, make_batch, model, stateful=()))
'''


def test_a_loss_item_fails_the_gate_against_the_stored_baseline(suite: Any) -> None:
    suite.write(SUITE.format(debug="pass"))
    suite.run("--accel=cpu", "--accelperf-update").assert_outcomes(passed=1)
    stored = next(iter(suite.load()["cases"].values()))["program"]
    assert stored["host_syncs"] == 0 and matmul_dtypes(stored["ops"]) == {"f32": 2}
    suite.write(SUITE.format(debug='print("loss", loss.item())'))
    result = suite.run("--accel=cpu", "--accelperf-json=report.json")
    result.assert_outcomes(failed=1)
    checks = {c["metric"]: c for c in suite.report()["cases"][0]["checks"]}
    assert checks["program"]["verdict"] == "regression"
    assert checks["program"]["detail"].startswith(
        'host syncs: 0 → 1 per step (_local_scalar_dense at test_suite.py in '
        'test_linear.step: print("loss", loss.item()): 0 → 1)'), checks["program"]["detail"]
