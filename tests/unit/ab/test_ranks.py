"""--accelperf-compare=GIT_REF for cases trained in ranks: DDP and DeepSpeed ZeRO-2, each
arm with a group of real ranks of its own (gloo, two ranks), trained in alternating blocks
(pytest_accelperf.ab.rank_groups); a rank that dies fails only its case, and leaves nothing
running."""

from __future__ import annotations

import os
import subprocess
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import Suite

pytest.importorskip("cloudpickle")
torch = pytest.importorskip("torch")

from pytest_accelperf import Case  # noqa: E402
from pytest_accelperf.ab.rank_groups import RankGroupError, RankGroupStepper  # noqa: E402
from pytest_accelperf.backends.procs import rank_pool  # noqa: E402
from pytest_accelperf.provision.accel import Accelerator  # noqa: E402
from pytest_accelperf.torch import TorchTask  # noqa: E402

MODEL = '''
import os
import signal
import time

import torch

from pytest_accelperf.torch import TorchTask


def make_task(case, spin=0.0, die_in_head_at=None):
    """A small MLP. ``spin``: seconds each micro-batch's forward spins (a slower step);
    ``die_in_head_at``: rank 1 of the head arm's A/B group kills itself at that call."""
    calls = [0]

    def make_model():
        return torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.Tanh(),
                                   torch.nn.Linear(256, 8))

    def make_batch(step):
        x = torch.randn(case.batch, 64, generator=torch.Generator().manual_seed(step))
        return {"x": x, "y": x[:, :8]}

    def loss_fn(model, batch):
        calls[0] += 1
        if (die_in_head_at == calls[0] and os.environ.get("RANK") == "1"
                and '"arm": "head"' in os.environ.get("ACCELPERF_AB_SETUP", "")):
            os.kill(os.getpid(), signal.SIGKILL)
        end = time.perf_counter() + spin
        while time.perf_counter() < end:
            pass
        return torch.nn.functional.mse_loss(model(batch["x"]), batch["y"])

    return TorchTask(make_model=make_model, make_optimizer=lambda p: torch.optim.SGD(p, lr=0.01),
                     loss_fn=loss_fn, make_batch=make_batch)
'''

CASES = '''
from rankmodel import make_task
from pytest_accelperf import Case, cases

# memory_tolerance 0.5: ZeRO-2's peak on rank 0 of this tiny model is 259 KiB or, in some
# runs of the same code, 64 KiB more (+24.7 %; DeepSpeed's peaks are not repeatable,
# docs/backends.md), which A/B mode's memory check against the base arm's run would call a
# regression at the default 10 %.
COMMON = dict(batch=8, steps=4, warmup=2, world_size=2, accels=("cpu",),
              tolerances={"memory_tolerance": 0.5})
SPIN = 0.0


@cases(Case(backend="torch", label="ddp", **COMMON),
       Case(backend="deepspeed", zero_stage=2, label="zero2", **COMMON))
def test_NAME(accelperf):
    accelperf.train(make_task(accelperf.case, spin=SPIN))
'''

DIES = '''
from rankmodel import make_task
from pytest_accelperf import Case, cases


@cases(Case(backend="torch", label="dies", batch=8, steps=4, warmup=2, world_size=2,
            accels=("cpu",)))
def test_dies(accelperf):
    accelperf.train(make_task(accelperf.case, die_in_head_at=8))
'''

#: Tolerance 30 %: the slowed cases are 2-6x slower; the unchanged ones must not reach it
#: even beside other tests (the contamination bound is off so that a slowdown is judged).
#: Budget 2 s a case: at 4 every case ran to the budget (24-60 rounds, holding the host
#: lock), and the slowed ZeRO-2 case's interval was 2.26-4.10 over 24 rounds; at 2, 3.01-4.48
#: over 18 (DDP: 8.5-12.6 over 24; the unchanged ones 0.98 and 1.01, pass). The fewest, 6
#: rounds, are still a round of each order in each of the 3 process pairs.
#: Three pairs, though each builds every case's rank group in both its workers (60 ranks,
#: each importing torch and DeepSpeed): one pair (20 ranks, half the test's own CPU, 137-142
#: s against 283) measured the unchanged ZeRO-2 case at 1.28, 1.16 and then 0.46, an
#: "improvement" (2026-11-30, load 7): a ZeRO-2 process's own speed varies that much, and
#: only an interval over pairs carries it (0.88, 0.46-1.66, inconclusive, over three).
ARGS = ("--accel=cpu", "--accelperf-cpu-devices=1", "--accelperf-compare=HEAD",
        "--accelperf-compare-rounds=6", "--accelperf-compare-budget=2",
        "--accelperf-compare-processes=3", "--accelperf-compare-tolerance=0.3",
        "--accelperf-max-foreign-load=64", "--accelperf-json=report.json",
        "--accelperf-timeout=300")


def _git(path: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.email=ci@example.com", "-c", "user.name=ci", *args],
                   cwd=path, check=True, capture_output=True)


def _left_running(marker: str) -> list[str]:
    """Processes whose environment mentions ``marker`` (the scratch repository: every rank,
    warm rank and arm worker of its session has it on its PYTHONPATH or as its cwd)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            environ = (proc / "environ").read_bytes()
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = (proc / "stat").read_text().rsplit(")", 1)[-1].split()[0]
        except OSError:
            continue
        if marker.encode() in environ and state != "Z":
            found.append(f"{proc.name}: {cmdline[:200]}")
    return found


@pytest.mark.slow
@pytest.mark.timing
def test_ddp_and_zero2_against_the_base_in_their_own_rank_groups(suite: Suite) -> None:
    pytest.importorskip("deepspeed")  # the zero2 cases (the inner session skips them)
    path = suite.pytester.path
    (path / "rankmodel.py").write_text(textwrap.dedent(MODEL))
    for name in ("same", "slow"):
        suite.write(CASES.replace("NAME", name), name=f"test_{name}")
    suite.write(DIES, name="test_dies")
    _git(path, "init", "-q")
    _git(path, "add", "-A")
    _git(path, "commit", "-qm", "base")
    slow = path / "test_slow.py"
    slow.write_text(slow.read_text().replace("SPIN = 0.0", "SPIN = 0.01"))

    result = suite.run(*ARGS, subprocess=True)
    checks: dict[str, dict[str, Any]] = {}
    for case in suite.report()["cases"]:
        checks[case["nodeid"]] = {c["metric"]: c for c in case["checks"]}
    ids = sorted(checks)
    assert len(ids) == 5, ids

    for case_id in ids:
        if "dies" in case_id:
            continue
        check = checks[case_id]["throughput"]
        data = check["data"]
        assert data.get("mode") == "ab", (case_id, check["detail"])
        assert len(data["blocks"]["base"]) == len(data["blocks"]["head"]) >= 6
        assert data["load"] is not None and data["program_diff"] == [], check["detail"]
        if "same" in case_id:  # unchanged: never a regression
            assert check["verdict"] in ("pass", "inconclusive"), (case_id, check["detail"])
            assert 0.6 < data["ratio"] < 1.5, (case_id, check["detail"])
        else:  # the working tree spins 10 ms in every forward
            assert check["verdict"] == "regression", (case_id, check["detail"])
            assert data["ratio"] > 1.5, (case_id, check["detail"])
    # Memory, numerics and loss against the base arm's own run of the case, trained there
    # in ranks of its own as a run's are (issue 37): the same training in both revisions.
    # (Memory's verdict is not asserted: ZeRO-2's peak moves between runs, see COMMON.)
    for case_id in ids:
        if "dies" in case_id:
            continue
        for metric in ("memory", "numerics", "loss"):
            check = checks[case_id][metric]
            assert check["data"].get("mode") == "ab", (case_id, check["detail"])
            if metric != "memory":
                assert check["verdict"] == "pass", (case_id, check["detail"])
    source = {i: checks[i]["throughput"]["data"]["blocks"] for i in ids if "dies" not in i}
    assert all(len(b["base"][0]) == 5 for b in source.values())  # blocks of 5 steps

    # Rank 1 of the head arm's group died in its first block: that case fails, naming it,
    # and the cases after it were compared by the same two arm workers.
    result.stdout.fnmatch_lines(["*A/B comparison with HEAD * failed*rank 1 was killed by "
                                 "SIGKILL*"])
    result.assert_outcomes(passed=2, failed=3)
    # Nothing of the session is left running: workers, their ranks, warm ranks.
    deadline = time.monotonic() + 10
    while _left_running(str(path)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _left_running(str(path))
    # DeepSpeed's C++ ops came from the machine's cache (tests/conftest.py), not a build in
    # this scratch HOME: compiling deepspeed_shm_comm here took minutes of both cores, in a
    # case that held the host lock meanwhile.
    assert not (path / ".cache" / "pytest-accelperf" / "torch_extensions").exists()


CPU = Accelerator(name="cpu", platform="cpu-x1", device_kind="cpu", device_count=1)


def _task(case: Case, die_at: int | None = None) -> TorchTask:
    calls = [0]

    def make_model() -> Any:
        return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(),
                                   torch.nn.Linear(32, 4))

    def make_batch(step: int) -> dict[str, Any]:
        x = torch.randn(case.batch, 16, generator=torch.Generator().manual_seed(step))
        return {"x": x, "y": x[:, :4]}

    def loss_fn(model: Any, batch: dict[str, Any]) -> Any:
        calls[0] += 1
        if calls[0] == die_at and os.environ.get("RANK") == "1":
            os.kill(os.getpid(), 9)
        return torch.nn.functional.mse_loss(model(batch["x"]), batch["y"])

    return TorchTask(make_model=make_model, make_optimizer=lambda p: torch.optim.SGD(p, lr=0.1),
                     loss_fn=loss_fn, make_batch=make_batch)


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.slow
def test_a_rank_group_trains_blocks_and_a_dead_rank_ends_it() -> None:
    """The arm worker's side, in this process: a DDP group of two ranks builds, warms up,
    trains blocks on demand; a rank killed in a block ends the group (its peer and the warm
    ranks too) with a message naming it."""
    from pytest_accelperf.backends.torch.ddp import RANKS

    rank_pool.close_all()
    case = Case(backend="torch", batch=8, steps=4, warmup=2, world_size=2, accels=("cpu",))
    try:
        group = RankGroupStepper(RANKS, case, _task(case), CPU)
        assert len(group.pids) == 2 and all(_alive(p) for p in group.pids)
        assert group.program is not None and group.program["source"] == "ddp"
        assert group.program["collectives"]["all_reduce"]["count"] == 1
        times = [group.run(4) for _ in range(3)]
        assert all(len(t) == 4 and all(0 < s < 5 for s in t) for t in times)
        ended = group.close()
        assert ended is not None and ended.outcome == "ok", ended.message
        assert not any(_alive(p) for p in group.pids)
        if rank_pool.enabled("cpu"):  # a group that ended well leaves its warm ranks
            assert rank_pool.live_pools()

        dying = RankGroupStepper(RANKS, case, _task(case, die_at=8), CPU)  # 3 warm-up steps
        warm = [p for pool in rank_pool.live_pools() for p in pool.pids]
        with pytest.raises(RankGroupError, match=r"rank 1 was killed by SIGKILL \(.*\) in a "
                                                 r"block of steps from step 3 on \(steps 0-2 "
                                                 r"had finished\)"):
            for _ in range(3):
                dying.run(5)
        assert not any(_alive(p) for p in dying.pids + warm)
        assert not rank_pool.live_pools()
        dying.close()  # after a failure: nothing to stop, no error
    finally:
        rank_pool.close_all()


def test_a_test_that_trains_its_case_itself_is_not_compared(tmp_path: Path) -> None:
    """suites/torch/test_deepspeed.py's test_ddp trains with train_ddp and passes the run to
    accelperf.check: nothing to rebuild in an arm, so the case keeps its stored check."""
    from pytest_accelperf.ab.worker import Setup, Worker
    from pytest_accelperf.backends.builtin import SPECS

    (tmp_path / "test_own.py").write_text(textwrap.dedent('''
        def test_own(accelperf):
            accelperf.check(train_it_myself(accelperf.case, timeout=accelperf.settings.timeout))
    '''))
    worker = Worker(Setup(arm="head", tree=str(tmp_path), head_root=str(tmp_path),
                          sys_path=[str(tmp_path)], accel="cpu", cpu_devices=1, platform=None))
    spec = next(s for s in SPECS if s.name == "torch")
    case = Case(backend="torch", batch=8, world_size=2, accels=("cpu",))
    status, why = worker.prepare("k", "test_own.py", "test_own", case, spec)
    assert status == "unsupported"
    assert "this test used accelperf.check before that" in why
    assert "train the case with accelperf.train(task) to compare it" in why
    assert not worker.steppers
