"""The rank pool: warm ranks reused across cases, each case in a process of its own.

The launcher-level tests use framework-free rank functions
(tests/unit/backends/procs/test_launch.py's) and a pool whose warm ranks import ``json``
only, so each start costs a Python start. One test trains real DeepSpeed cases (two ZeRO
stages back to back in the same warm ranks) and compares them with fresh ranks.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("cloudpickle")

from pytest_accelperf.backends.procs import rank_pool
from pytest_accelperf.backends.procs.launch import LaunchResult, launch
from unit.backends.procs.test_launch import ranks_fn

WARM = ("json",)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not yet reaped) is not alive
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def _case_pids(result: LaunchResult) -> list[int]:
    return [int(r.progress["pid"]) for r in result.ranks]


@pytest.fixture(autouse=True)
def no_pools() -> Any:
    rank_pool.close_all()
    yield
    rank_pool.close_all()


def test_a_second_case_reuses_the_warm_ranks_in_a_fresh_child() -> None:
    first = launch(ranks_fn, ("ok",), 2, timeout=60, warm=WARM)
    second = launch(ranks_fn, ("ok",), 2, timeout=60, warm=WARM)
    assert first.outcome == second.outcome == "ok", (first.message, second.message)
    assert first.timings["pooled"] and second.timings["pooled"]
    assert (first.timings["pool_case"], second.timings["pool_case"]) == (1, 2)
    warm = first.timings["pool_pids"]
    assert second.timings["pool_pids"] == warm and all(_alive(p) for p in warm)
    # Each case ran in a child of its own (what it did cannot reach the next case) ...
    assert set(_case_pids(first)).isdisjoint(_case_pids(second))
    assert not set(warm) & set(_case_pids(first) + _case_pids(second))
    # ... with the case's own environment: a fresh rendezvous port, its rank.
    envs = [r.result["env"] for r in second.ranks]
    assert [e["RANK"] for e in envs] == ["0", "1"]
    assert envs[0]["MASTER_PORT"] != first.ranks[0].result["env"]["MASTER_PORT"]
    rank_pool.close_all()
    assert not any(_alive(p) for p in warm + _case_pids(second))


@pytest.mark.parametrize("mode", ["raise", "kill"])
def test_a_failing_rank_fails_only_its_case_and_the_next_starts_fresh(mode: str) -> None:
    ok = launch(ranks_fn, ("ok",), 2, timeout=60, warm=WARM)
    failed = launch(ranks_fn, (mode,), 2, timeout=60, total_steps=5, warm=WARM)
    after = launch(ranks_fn, ("ok",), 2, timeout=60, warm=WARM)
    assert ok.outcome == "ok" and after.outcome == "ok", after.message
    assert failed.outcome == "error" and failed.failed_rank == 1
    expected = ("rank 1 raised ValueError: boom from the task" if mode == "raise"
                else "rank 1 was killed by SIGKILL")
    assert failed.message.startswith(expected), failed.message
    assert "in step 3 (steps 0-2 of 5 had finished)" in failed.message
    # The failed case ran in the same warm ranks; they were killed with the survivor ...
    warm = ok.timings["pool_pids"]
    assert failed.timings["pool_pids"] == warm
    assert not any(_alive(p) for p in warm + _case_pids(failed))
    # ... and the next case started new ones.
    assert after.timings["pool_case"] == 1 and set(after.timings["pool_pids"]).isdisjoint(warm)


@pytest.mark.slow  # its 5 s timeout is what it checks: not in the quick loop
def test_a_hung_case_times_out_and_its_warm_ranks_are_killed() -> None:
    launch(ranks_fn, ("ok",), 2, timeout=60, warm=WARM)  # the warm ranks are up
    t0 = time.monotonic()
    result = launch(ranks_fn, ("hang",), 2, timeout=5, warm=WARM)
    assert time.monotonic() - t0 < 30
    assert result.outcome == "timeout"
    assert "rank 1: in step 3 (steps 0-2 had finished)" in result.message
    assert not any(_alive(p) for p in result.timings["pool_pids"] + _case_pids(result))
    assert rank_pool.live_pools() == []


def test_a_warm_import_that_fails_is_left_to_the_cases() -> None:
    warm = ("no_such_module_accelperf", "json")
    result = launch(ranks_fn, ("ok",), 2, timeout=60, warm=warm)
    assert result.outcome == "ok" and result.timings["pooled"], result.message
    assert launch(ranks_fn, ("ok",), 2, timeout=60, warm=warm).timings["pool_case"] == 2


def test_a_warm_rank_that_died_fails_the_case_naming_it() -> None:
    first = launch(ranks_fn, ("ok",), 2, timeout=60, warm=WARM)
    pool = rank_pool.live_pools()[0]
    pool.busy = True  # taken, so that acquire does not replace it; then killed
    pool.ranks[1].proc.kill()
    pool.ranks[1].proc.wait()
    pool.busy = False
    pool.alive = lambda: True  # type: ignore[method-assign]  # as if it died just now
    result = launch(ranks_fn, ("ok",), 2, timeout=60, warm=WARM)
    assert result.outcome == "error" and result.failed_rank == 1
    assert "rank 1 was killed by SIGKILL" in result.message
    assert not any(_alive(p) for p in first.timings["pool_pids"])
    assert rank_pool.live_pools() == []


def test_pooling_is_off_with_the_variable_and_for_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(rank_pool.POOL_ENV, "0")
    result = launch(ranks_fn, ("ok",), 2, timeout=60, warm=WARM)
    assert result.outcome == "ok" and not result.timings["pooled"]
    assert rank_pool.live_pools() == []
    monkeypatch.delenv(rank_pool.POOL_ENV)
    assert rank_pool.enabled("cpu") and not rank_pool.enabled("cuda")


def test_a_changed_environment_gets_new_warm_ranks(monkeypatch: pytest.MonkeyPatch) -> None:
    first = launch(ranks_fn, ("ok",), 2, timeout=60, warm=WARM)
    monkeypatch.setenv("ACCELPERF_TEST_POOL_KEY", "1")  # read at import, for all we know
    second = launch(ranks_fn, ("ok",), 2, timeout=60, warm=WARM)
    assert second.timings["pool_case"] == 1
    assert not any(_alive(p) for p in first.timings["pool_pids"])
    assert len(rank_pool.live_pools()) == 1


def test_a_case_whose_modules_a_wider_pool_imported_runs_there() -> None:
    """A case with no pool of its own runs in an idle pool whose warm ranks imported its
    modules and more (a DDP case in DeepSpeed's), not in new warm ranks; a case that needs
    a module the pool did not import, or another environment, gets its own."""
    wide = launch(ranks_fn, ("ok",), 2, timeout=60, warm=("json", "csv"))
    narrow = launch(ranks_fn, ("ok",), 2, timeout=60, warm=WARM)
    assert wide.outcome == narrow.outcome == "ok", narrow.message
    assert narrow.timings["pool_pids"] == wide.timings["pool_pids"]
    assert narrow.timings["pool_case"] == 2
    other = launch(ranks_fn, ("ok",), 2, timeout=60, warm=("json", "decimal"))
    assert other.timings["pool_case"] == 1 and len(rank_pool.live_pools()) == 2


POOLED_SESSION = '''
import json
import os
import sys

sys.path.insert(0, {tests!r})
from test_launch import ranks_fn

from pytest_accelperf.backends.procs.launch import launch


def test_pooled():
    for _ in range(2):
        result = launch(ranks_fn, ("ok",), 2, timeout=60, warm=("json",))
        assert result.outcome == "ok", result.message
    with open("pids.json", "w") as f:
        json.dump(result.timings["pool_pids"] + [r.progress["pid"] for r in result.ranks], f)
'''


def test_the_session_end_stops_the_warm_ranks(pytester: pytest.Pytester) -> None:
    tests = str(Path(__file__).parent)
    pytester.makepyfile(test_pooled=POOLED_SESSION.format(tests=tests))
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=1)
    import json

    pids = json.loads((pytester.path / "pids.json").read_text())
    assert len(pids) == 4 and rank_pool.live_pools() == []
    assert not any(_alive(p) for p in pids)


# -- real DeepSpeed cases ------------------------------------------------------------------
@pytest.mark.slow
def test_two_zero_stages_in_the_same_warm_ranks_equal_fresh_ranks(
        monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("deepspeed")
    from pytest_accelperf.backends.torch.deepspeed import BACKEND
    from pytest_accelperf.collect.cases import Case
    from pytest_accelperf.provision.accel import Accelerator

    sys.path.insert(0, str(Path(__file__).resolve().parents[4] / "suites" / "torch"))
    from gpt import make_task

    cpu = Accelerator(name="cpu", platform="cpu-x1", device_kind="cpu", device_count=1)
    buckets = {"zero_optimization": {
        "reduce_bucket_size": 50_000, "allgather_bucket_size": 50_000,
        "stage3_prefetch_bucket_size": 50_000, "stage3_param_persistence_threshold": 1_000}}

    def train(stage: int) -> Any:
        case = Case(backend="deepspeed", zero_stage=stage, batch=8, steps=2, warmup=2,
                    world_size=2, params={"ds_config": buckets})
        return BACKEND.train(case, make_task(case), cpu, timeout=600).run

    monkeypatch.setenv(rank_pool.POOL_ENV, "0")
    fresh = [train(3), train(1)]
    monkeypatch.delenv(rank_pool.POOL_ENV)
    pooled = [train(3), train(1)]  # ZeRO-3 first: its partitioned state must not leak
    assert [r.details["timings"]["pooled"] for r in fresh + pooled] == [False] * 2 + [True] * 2
    assert [r.details["timings"]["pool_case"] for r in pooled] == [1, 2]
    for a, b in zip(fresh, pooled, strict=True):
        assert a.outcome == b.outcome == "ok", (a.message, b.message)
        assert a.losses == b.losses
        assert a.memory_per_device == b.memory_per_device
        assert a.program == b.program and a.program is not None
        assert a.params_fingerprint == b.params_fingerprint
        assert a.flops_per_step == b.flops_per_step
        assert a.details["engine"]["config"] == b.details["engine"]["config"]
    # The second pooled case skipped the interpreter start and the imports.
    assert pooled[1].details["timings"]["start"] < fresh[1].details["timings"]["start"]
