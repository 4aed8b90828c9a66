"""Drift correction, confirmation re-measurement, --accelperf-timeout and the max-batch search,
end to end through pytest (plus the search algorithm and its check on their own)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conftest import Suite, recorded_once

# A torch MLP whose loss sleeps while a marker file says so ("SECONDS CALLS": sleep in the
# next CALLS calls of the loss, -1 for all): a slowdown that can be switched on for the first
# training of a case (:func:`calls_per_training`) and off for its re-measurement.
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

@cases(backend="torch", batch=[128], steps=STEPS, warmup=1, accels=("cpu",), params=PARAMS)
def test_mlp(accelperf):
    accelperf.train(make_task(accelperf.case))
'''


def torch_suite(suite: Suite, params: dict[str, Any] | None = None, steps: int = 20) -> Suite:
    pytest.importorskip("torch")
    suite.pytester.makepyfile(torchtask=TORCH_TASK)
    suite.write(TORCH_SUITE.replace("PARAMS", repr(params or {})).replace("STEPS", str(steps)))
    return suite


@pytest.fixture(scope="module")
def torch_recording(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the 20-step torch suite's baselines are kept once recorded."""
    return tmp_path_factory.mktemp("torch-recording") / "baselines"


@pytest.fixture
def torch_recorded(suite: Suite, torch_recording: Path) -> Suite:
    """The 20-step torch suite with its baselines recorded once for the module's tests
    (:func:`conftest.recorded_once`)."""
    return recorded_once(torch_suite(suite), torch_recording, passed=1)


def calls_per_training(steps: int) -> int:
    """Calls of the loss in one training of the suite's case: 4 while its memory is counted
    (mem_tracker), 1 while its FLOPs are, then the warm-up step and the measured ones."""
    return 4 + 1 + 1 + steps


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


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.timing
def test_unconfirmed_slowdown_passes_with_a_note(suite: Suite) -> None:
    # 10 measured steps, not 20: every call of the first training sleeps (16 calls, not
    # 24 of 26), and they were most of this test's time (over 12 s) and all of it held the
    # host lock. A median over 10 sleeping steps is still 30x the recorded one or more.
    torch_suite(suite, steps=10)
    suite.run("--accelperf-update").assert_outcomes(passed=1)
    # The first training is slow, the re-measurement is not: at least 30x the recorded step
    # (500 ms is ~100x a quiet step; a baseline recorded while another xdist worker held
    # the cores measured 39 ms, and 500 ms was then only 13x, under the 16x gate).
    recorded = suite.load()["cases"]["test_mlp[torch-nomesh-b128]"]["step_time"]["median"]
    slow_flag(suite, max(0.5, 30 * recorded), calls=calls_per_training(10))
    result = suite.run("--accelperf-json=report.json", TOLERANCE)
    result.assert_outcomes(passed=1)
    tp = throughput(suite)
    assert tp["verdict"] != "regression"
    assert "not confirmed" in tp["detail"]
    assert tp["data"]["unconfirmed"][0] > 1.5


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_persistent_slowdown_is_confirmed(torch_recorded: Suite) -> None:
    suite = torch_recorded
    suite.edit(faster_baseline)
    result = suite.run("--accelperf-json=report.json", TOLERANCE)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*throughput: slower*confirmed by 1 re-measurement*"])
    tp = throughput(suite)
    assert tp["verdict"] == "regression"
    assert len(tp["data"]["confirmations"]) == 2


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_confirm_zero_fails_on_the_first_measurement(torch_recorded: Suite) -> None:
    suite = torch_recorded
    suite.edit(faster_baseline)
    result = suite.run("--accelperf-json=report.json", TOLERANCE,
                       "--accelperf-confirm=0")
    result.assert_outcomes(failed=1)
    assert "confirm" not in throughput(suite)["detail"]


@pytest.mark.slow
def test_probe_is_recorded_and_drift_correction_reported(recorded: Suite) -> None:
    """The probe's times are stored beside the step times, and the throughput check says
    whether it corrected with them (it does not when the probe itself was unsteady: see
    tests/unit/checks/test_checks.py for the arithmetic on fixed numbers)."""
    suite = recorded
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


# -- the search and its check on their own ------------------------------------------------
