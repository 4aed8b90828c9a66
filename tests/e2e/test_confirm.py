"""Drift correction, confirmation re-measurement, --accelperf-timeout and the max-batch search,
end to end through pytest (plus the search algorithm and its check on their own)."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import Suite, verdicts

from pytest_accelperf.backends.protocol import Fit
from pytest_accelperf.cases import Case
from pytest_accelperf.checks.base import Verdict
from pytest_accelperf.checks.max_batch import check_max_batch
from pytest_accelperf.maxbatch import MAX_PROBES, search_max_batch

# A torch MLP whose loss sleeps while a marker file says so ("SECONDS CALLS": sleep in the
# next CALLS calls of the loss, -1 for all): a slowdown that can be switched on for the first
# training of a case (24 calls: 2 counted for memory, 1 for FLOPs, 21 steps) and off for its
# re-measurement.
TORCH_TASK = '''
import os
import time
from pathlib import Path

import torch

from pytest_accelperf.torch import TorchTask

SLOW = Path(__file__).with_name("slow.flag")


def make_task(case):
    def make_model():
        # ~200 MFLOP a step: milliseconds, so that step times mean something under load
        return torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU(),
                                   torch.nn.Linear(512, 1))

    def loss_fn(model, batch):
        if SLOW.exists():
            seconds, calls = SLOW.read_text().split()
            if int(calls) != 0:
                time.sleep(float(seconds))
                SLOW.write_text(f"{seconds} {max(int(calls) - 1, -1)}")
        return torch.nn.functional.mse_loss(model(batch[0]), batch[1])

    def make_batch(step):
        g = torch.Generator().manual_seed(step)
        x = torch.randn(case.batch, 512, generator=g)
        return x, x.sum(dim=1, keepdim=True)

    return TorchTask(make_model=make_model, loss_fn=loss_fn, make_batch=make_batch,
                     make_optimizer=lambda p: torch.optim.SGD(p, lr=0.01))
'''

TORCH_SUITE = '''
from torchtask import make_task
from pytest_accelperf import cases

@cases(backend="torch", batch=[128], steps=20, warmup=1, accels=("cpu",), params=PARAMS)
def test_mlp(accelperf):
    accelperf.train(make_task(accelperf.case))
'''


def torch_suite(suite: Suite, params: dict[str, Any] | None = None) -> Suite:
    pytest.importorskip("torch")
    suite.pytester.makepyfile(torchtask=TORCH_TASK)
    suite.write(TORCH_SUITE.replace("PARAMS", repr(params or {})))
    return suite


# On a 2-core machine shared with other work (-n 2, other sessions) unchanged step times
# have moved 9x between a quiet recording and a loaded check, so these tests gate at 16x
# (tolerance 15) and make their slow steps slower than that.
TOLERANCE = "--accelperf-throughput-tolerance=15.0"


def faster_baseline(block: dict[str, Any]) -> None:
    """A baseline 1000x faster than anything this machine does now: every run regresses
    (10x was not enough: a baseline recorded while other jobs held the cores measured a
    step 5x slower than the check's run did, and the claimed 10x shrank to 2x)."""
    block["step_time"]["samples"] = [t / 1000 for t in block["step_time"]["samples"]]


def slow_flag(suite: Suite, seconds: float, calls: int = -1) -> None:
    (suite.pytester.path / "slow.flag").write_text(f"{seconds} {calls}")


def throughput(suite: Suite) -> dict[str, Any]:
    case = suite.report()["cases"][0]
    tp: dict[str, Any] = next(c for c in case["checks"] if c["metric"] == "throughput")
    return tp


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_unconfirmed_slowdown_passes_with_a_note(suite: Suite) -> None:
    torch_suite(suite)
    suite.run("--accelperf-update").assert_outcomes(passed=1)
    # The first training is slow, the re-measurement is not: at least 30x the recorded step
    # (500 ms is ~100x a quiet step; a baseline recorded while another xdist worker held
    # the cores measured 39 ms, and 500 ms was then only 13x, under the 16x gate).
    recorded = suite.load()["cases"]["test_mlp[torch-nomesh-b128]"]["step_time"]["median"]
    slow_flag(suite, max(0.5, 30 * recorded), calls=24)
    result = suite.run("--accelperf-json=report.json", TOLERANCE)
    result.assert_outcomes(passed=1)
    tp = throughput(suite)
    assert tp["verdict"] != "regression"
    assert "not confirmed" in tp["detail"]
    assert tp["data"]["unconfirmed"][0] > 1.5


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_persistent_slowdown_is_confirmed(suite: Suite) -> None:
    torch_suite(suite)
    suite.run("--accelperf-update").assert_outcomes(passed=1)
    suite.edit(faster_baseline)
    result = suite.run("--accelperf-json=report.json", TOLERANCE)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*throughput: slower*confirmed by 1 re-measurement*"])
    tp = throughput(suite)
    assert tp["verdict"] == "regression"
    assert len(tp["data"]["confirmations"]) == 2


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_confirm_zero_fails_on_the_first_measurement(suite: Suite) -> None:
    torch_suite(suite)
    suite.run("--accelperf-update").assert_outcomes(passed=1)
    suite.edit(faster_baseline)
    result = suite.run("--accelperf-json=report.json", TOLERANCE,
                       "--accelperf-confirm=0")
    result.assert_outcomes(failed=1)
    assert "confirm" not in throughput(suite)["detail"]


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_timeout_stops_the_case_and_the_session_goes_on(suite: Suite) -> None:
    torch_suite(suite)
    suite.pytester.makepyfile(test_after='''
        from torchtask import make_task
        from pytest_accelperf import cases

        @cases(backend="torch", batch=[16], steps=20, warmup=1, accels=("cpu",))
        def test_next(accelperf):
            accelperf.train(make_task(accelperf.case))
    ''')
    slow_flag(suite, 0.3)  # 21 steps x 0.3 s, against a 2 s timeout
    result = suite.run("--accelperf-json=report.json", "--accelperf-timeout=2",
                       "test_suite.py", "test_after.py")
    # test_after sleeps too (the flag stays): it times out as well, but it ran.
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(["*exceeded the 2 s timeout after * of 21 steps*"])
    report = suite.report()
    outcomes = {c["case_id"]: c["run"]["outcome"] for c in report["cases"]}
    assert outcomes == {"torch-nomesh-b128": "timeout", "torch-nomesh-b16": "timeout"}
    first = next(c for c in report["cases"] if c["case_id"] == "torch-nomesh-b128")
    assert 0 < len(first["run"]["losses"]) < 21


def test_probe_is_recorded_and_drift_correction_reported(suite: Suite) -> None:
    """The probe's times are stored beside the step times, and the throughput check says
    whether it corrected with them (it does not when the probe itself was unsteady: see
    tests/unit/checks/test_checks.py for the arithmetic on fixed numbers)."""
    suite.write()
    suite.run("--accelperf-update").assert_outcomes(passed=2)
    for block in suite.load()["cases"].values():
        assert block["probe"]["kind"] == "jax-cpu-matmul256x8"
        assert len(block["probe"]["samples"]) == len(block["step_time"]["samples"]) == 30
        assert all(t > 0 for t in block["probe"]["samples"])
    suite.run("--accelperf-json=report.json",
              "--accelperf-throughput-tolerance=100").assert_outcomes(passed=2)
    for case in suite.report()["cases"]:
        tp = next(c for c in case["checks"] if c["metric"] == "throughput")
        assert isinstance(tp["data"]["drift_corrected"], bool)
        marker = "drift-corrected by" if tp["data"]["drift_corrected"] else "raw step times"
        assert marker in tp["detail"]


MAXBATCH_SUITE = '''
from tinytask import make_task
from pytest_accelperf import Case, MaxBatchSearch, cases

@cases(Case(backend="jax", batch=64, mesh=MESH, steps=5, warmup=1,
            memory_capacity=CAPACITY, params={"dim": 256, "out": 256}))
def test_fit(accelperf):
    result = accelperf.train(make_task(accelperf.case),
                             max_batch=MaxBatchSearch(make_task, limit=1 << 14))
    found = result.run.max_batch
    print("MAXBATCH", found["value"], len(found["probes"]))
'''


def maxbatch_suite(suite: Suite, capacity: int, mesh: str = "None") -> Suite:
    suite.write(MAXBATCH_SUITE.replace("CAPACITY", str(capacity)).replace("MESH", mesh))
    return suite


def test_max_batch_is_searched_stored_and_gated(suite: Suite) -> None:
    maxbatch_suite(suite, 8 << 20)
    result = suite.run("--accelperf-update", "-s")
    result.assert_outcomes(passed=1)
    stored = suite.load()["cases"]["test_fit[jax-nomesh-b64]"]["max_batch"]
    value = stored["value"]
    assert value is not None and 64 <= value < 1 << 14
    fits = {b: ok for b, ok, _ in stored["probes"]}
    assert fits[value] is True and fits.get(value + 1, False) is False
    assert all(ok == (b <= value) for b, ok in fits.items())  # monotone, as searched
    assert all(need <= 8 << 20 for b, ok, need in stored["probes"] if ok)
    assert stored["capacity_bytes"] == 8 << 20

    result = suite.run("--accelperf-json=report.json")
    result.assert_outcomes(passed=1)
    assert verdicts(suite.report())["test_fit[jax-nomesh-b64]"]["max_batch"] == "pass"
    result.stdout.fnmatch_lines(["*max_batch*pass*"])

    # A baseline that fitted more: this run fits fewer, a regression naming both numbers.
    suite.edit(lambda b: b["max_batch"].update(value=value + 100))
    result = suite.run("--accelperf-json=report.json")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        f"*max_batch: the largest batch that fits in 8.00 MiB dropped from {value + 100} to "
        f"{value}*"])


def test_max_batch_grows_with_the_mesh(suite: Suite) -> None:
    """Sharding over 8 devices fits a larger global batch in the same per-device memory."""
    maxbatch_suite(suite, 8 << 20, mesh="(8, 1)")
    result = suite.run("--accelperf-update", "-s")
    result.assert_outcomes(passed=1)
    sharded = suite.load()["cases"]["test_fit[jax-mesh8x1-b64]"]["max_batch"]["value"]
    maxbatch_suite(suite, 8 << 20)
    suite.run("--accelperf-update").assert_outcomes(passed=1)
    single = suite.load()["cases"]["test_fit[jax-nomesh-b64]"]["max_batch"]["value"]
    assert sharded > 2 * single


# -- the search and its check on their own ------------------------------------------------

def linear(capacity: int, per_sample: int = 100) -> Any:
    return lambda c: Fit(c.batch * per_sample <= capacity, c.batch * per_sample, capacity)


@pytest.mark.parametrize("start, capacity, expected", [
    (8, 5000, 50), (8, 800, 8), (64, 5000, 50), (1, 100, 1), (8, 10**9, 1 << 16)])
def test_search_finds_the_largest_fitting_batch(start: int, capacity: int, expected: int) -> None:
    found = search_max_batch(Case(backend="jax", batch=start), linear(capacity))
    assert found.value == expected
    assert found.capacity_bytes == capacity
    assert len(found.probes) <= MAX_PROBES
    assert len({b for b, _, _ in found.probes}) == len(found.probes)  # nothing tried twice


def test_search_keeps_to_multiples_of_the_world_size() -> None:
    found = search_max_batch(Case(backend="deepspeed", batch=6, world_size=2),
                             linear(5100), multiple_of=2)
    assert found.value == 50
    assert all(b % 2 == 0 for b, _, _ in found.probes)


def test_search_when_nothing_fits() -> None:
    found = search_max_batch(Case(backend="jax", batch=8), linear(50))
    assert found.value is None
    assert [b for b, _, _ in found.probes] == [8, 4, 2, 1]


def test_search_rejects_bad_bounds() -> None:
    with pytest.raises(ValueError, match="multiple_of"):
        search_max_batch(Case(backend="jax", batch=8), linear(10), multiple_of=0)


def block(value: int | None, capacity: int = 1 << 30, probes: Any = ()) -> dict[str, Any]:
    return {"max_batch": {"value": value, "capacity_bytes": capacity, "multiple_of": 1,
                          "probes": [list(p) for p in probes]}}


@pytest.mark.parametrize("now, base, verdict", [
    (48, 48, Verdict.PASS), (40, 48, Verdict.REGRESSION), (64, 48, Verdict.IMPROVEMENT),
    (None, 8, Verdict.REGRESSION)])
def test_max_batch_check(now: int | None, base: int, verdict: Verdict) -> None:
    result = check_max_batch(block(now, probes=[(64, False, 2**31)]), block(base))
    assert result is not None and result.verdict is verdict
    if verdict is Verdict.REGRESSION:
        assert f"dropped from {base} to {now or 0}" in result.detail
        assert "batch 64 does not fit" in result.detail


def test_max_batch_check_other_capacity_is_incomparable() -> None:
    result = check_max_batch(block(48, capacity=1 << 30), block(48, capacity=1 << 31))
    assert result is not None and result.verdict is Verdict.INCOMPARABLE
    assert "1.00 GiB" in result.detail and "2.00 GiB" in result.detail
    assert check_max_batch({}, block(48)) is None
    new = check_max_batch(block(48), None)
    assert new is not None and new.verdict is Verdict.NEW
