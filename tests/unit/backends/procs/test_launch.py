"""The multi-process launcher: results collected, and every way a rank can fail an outcome.

The rank functions here import no framework (a rank that "waits in a collective" sleeps),
so each launch costs a Python start, not a torch import; real collectives are exercised by
tests/unit/backends/torch/test_deepspeed.py.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("cloudpickle")

from pytest_accelperf.backends.procs._rank import RankContext
from pytest_accelperf.backends.procs.launch import (
    CapacityExceeded,
    _child_env,
    default_extensions_dir,
    launch,
)


def ranks_fn(ctx: RankContext, mode: str, fail_rank: int = 1, fail_step: int = 3) -> Any:
    """Five "steps"; rank ``fail_rank`` misbehaves at ``fail_step`` as ``mode`` says while
    the others go on to wait forever, as ranks blocked in a collective would."""
    ctx.progress(phase="train", pid=os.getpid())
    _wait_for_peers(ctx)
    for step in range(5):
        if ctx.rank == fail_rank and step == fail_step:
            if mode == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            if mode == "raise":
                raise ValueError("boom from the task")
            if mode == "exit":
                os._exit(3)
            if mode == "hang":
                time.sleep(3600)
            if mode == "oom":
                raise CapacityExceeded(5 * 2**20, 2**20, "mem_tracker")
            if mode == "late_kill":  # the cause, seen after its consequence
                time.sleep(0.5)
                os.kill(os.getpid(), signal.SIGKILL)
        if mode == "lagging_survivor" and ctx.rank == fail_rank and step == fail_step:
            os.kill(os.getpid(), signal.SIGKILL)
        if mode == "lagging_survivor" and ctx.rank != fail_rank and step == fail_step - 1:
            time.sleep(1.0)  # between its last collective and its progress line
        if mode == "late_kill" and ctx.rank != fail_rank and step == fail_step:
            raise RuntimeError("[gloo/transport/tcp/pair.cc:553] Connection closed by peer")
        ctx.progress(step=step)
    if mode != "ok" and ctx.rank != fail_rank:
        time.sleep(3600)  # a survivor: only the launcher can end it
    return {"rank": ctx.rank, "world": ctx.world_size,
            "env": {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK",
                                                   "MASTER_PORT", "TORCH_EXTENSIONS_DIR")}}


def _wait_for_peers(ctx: RankContext) -> None:
    """Until every rank has started (reported its pid), as a collective would."""
    while not all('"pid"' in p.read_text() for p in
                  (ctx.workdir / f"rank{r}.jsonl" for r in range(ctx.world_size))
                  if p.exists()) or len(list(ctx.workdir.glob("rank*.jsonl"))) < ctx.world_size:
        time.sleep(0.01)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_results_and_environment_of_every_rank() -> None:
    result = launch(ranks_fn, ("ok",), 3, timeout=60)
    assert result.outcome == "ok", result.message
    assert [r.result["rank"] for r in result.ranks] == [0, 1, 2]
    envs = [r.result["env"] for r in result.ranks]
    assert [e["RANK"] for e in envs] == ["0", "1", "2"] == [e["LOCAL_RANK"] for e in envs]
    assert {e["WORLD_SIZE"] for e in envs} == {"3"}
    assert len({e["MASTER_PORT"] for e in envs}) == 1
    assert envs[0]["TORCH_EXTENSIONS_DIR"] == str(default_extensions_dir())
    assert all(r.step == 4 and r.returncode == 0 for r in result.ranks)


def test_ranks_find_the_interpreters_own_ninja_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """Torch builds DeepSpeed's ops with the ``ninja`` on PATH; the system's (1.11) and the
    environment's (pip's 1.13) each took the other's build for stale, so a session started
    without activating its environment rebuilt the shared cache's ops."""
    scripts = str(Path(sys.executable).parent)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    assert _child_env(0, 2, 1234, "cpu")["PATH"] == f"{scripts}{os.pathsep}/usr/bin:/bin"
    activated = f"/usr/local/bin{os.pathsep}{scripts}{os.pathsep}/usr/bin"
    monkeypatch.setenv("PATH", activated)
    assert _child_env(0, 2, 1234, "cpu")["PATH"] == activated  # left as the user has it


def test_sigkilled_rank_is_an_error_and_the_survivors_are_killed() -> None:
    t0 = time.monotonic()
    result = launch(ranks_fn, ("kill",), 2, timeout=60, total_steps=5)
    assert time.monotonic() - t0 < 40  # not the 60 s timeout: the death ends the launch
    assert result.outcome == "error"
    assert result.failed_rank == 1
    assert result.message.startswith("rank 1 was killed by SIGKILL")
    assert "in step 3 (steps 0-2 of 5 had finished)" in result.message
    survivor = result.ranks[0].progress["pid"]
    assert not _alive(survivor)


def test_a_survivor_behind_the_killed_rank_reports_the_steps_it_finished() -> None:
    """Seen in CI: rank 1 killed after step 2, rank 0 stopped before it had reported
    step 2 (a survivor a little behind, under load), so the run lost a loss. The launch
    waits, briefly (PEER_GRACE_S), for a survivor to report the steps the failed rank had
    finished, and stops it then, not at the timeout."""
    t0 = time.monotonic()
    result = launch(ranks_fn, ("lagging_survivor",), 2, timeout=60, total_steps=5)
    assert time.monotonic() - t0 < 40
    assert result.outcome == "error" and result.failed_rank == 1, result.message
    assert "in step 3 (steps 0-2 of 5 had finished)" in result.message
    survivor = result.ranks[0]
    # (Here no collective holds it back, so it may report more before it is stopped.)
    assert [e["step"] for e in survivor.steps][:3] == [0, 1, 2]
    assert not _alive(survivor.progress["pid"])


def test_a_peers_connection_error_seen_first_does_not_hide_the_killed_rank() -> None:
    """Seen in A/B mode: rank 1 was killed, but rank 0's 'Connection closed by peer'
    reached the launcher first (a pooled rank's death comes through its warm parent) and
    was reported as the failure. A failure that looks like a consequence waits, briefly,
    for its cause."""
    result = launch(ranks_fn, ("late_kill",), 2, timeout=60, total_steps=5)
    assert result.outcome == "error"
    assert result.failed_rank == 1, result.message
    assert result.message.startswith("rank 1 was killed by SIGKILL")


def test_exit_code_is_reported() -> None:
    result = launch(ranks_fn, ("exit",), 2, timeout=60)
    assert result.outcome == "error"
    assert result.message.startswith("rank 1 exited with code 3 in step 3")


def test_raising_rank_reports_its_exception_and_traceback() -> None:
    result = launch(ranks_fn, ("raise", 0, 2), 2, timeout=60)
    assert result.outcome == "error"
    assert result.failed_rank == 0
    assert "rank 0 raised ValueError: boom from the task" in result.message
    assert "in ranks_fn" in result.message  # the traceback's last lines


def test_capacity_overrun_is_oom_naming_rank_and_step() -> None:
    result = launch(ranks_fn, ("oom",), 2, timeout=60)
    assert result.outcome == "oom"
    assert result.message.startswith("rank 1 ran out of memory in step 3")
    assert "needs 0.005 GiB (mem_tracker) of 0.001 GiB declared capacity" in result.message
    err = result.ranks[1].error
    assert err is not None and (err["required"], err["capacity"]) == (5 * 2**20, 2**20)


def test_oom_before_the_first_step_cannot_even_initialize() -> None:
    result = launch(ranks_fn, ("oom", 1, 0), 2, timeout=60)
    assert result.outcome == "oom"
    assert "cannot even initialize model" in result.message


@pytest.mark.slow
def test_hung_rank_times_out_and_everything_is_killed() -> None:
    t0 = time.monotonic()
    # The timeout bounds the launch from process start: 3 s was too short for two Python
    # starts while the other xdist worker compiled DeepSpeed ops (neither rank had reached
    # step 0), so it leaves the ranks room to reach the hang first.
    result = launch(ranks_fn, ("hang",), 2, timeout=12)
    assert 12 <= time.monotonic() - t0 < 45  # the timeout, plus a loaded machine's kill
    assert result.outcome == "timeout"
    assert result.message.startswith("exceeded the 12 s timeout (rank 0: ")
    assert "rank 1: in step 3 (steps 0-2 had finished)" in result.message
    assert not any(_alive(r.progress["pid"]) for r in result.ranks)


def training_fn(ctx: RankContext, steps: int) -> None:
    """Ranks that train ``steps`` "steps" of 50 ms each, reporting each as DDP's do."""
    for step in range(steps):
        time.sleep(0.05)
        ctx.progress(phase="train", step=step, loss=10.0 - step + ctx.rank, time=0.05)


class RecordingSink:
    def __init__(self) -> None:
        self.updates: list[tuple[int, int, float, float]] = []
        self.closed = False

    def update(self, done: int, total: int, loss: float, step_time: float) -> None:
        self.updates.append((done, total, loss, step_time))

    def close(self) -> None:
        self.closed = True


def test_rank_zero_progress_reaches_the_terminal_line() -> None:
    """A multi-process case shows its progress live, as a single-process one does: rank
    0's steps, in order, while the ranks run (the last may land after they exit)."""
    from pytest_accelperf.backends.measure import progress

    with progress.reporting(RecordingSink()) as sink:
        assert isinstance(sink, RecordingSink)
        result = launch(training_fn, (20,), 2, timeout=60, total_steps=20)
    assert result.outcome == "ok", result.message
    assert sink.updates, "no progress was shown while the ranks trained"
    done = [u[0] for u in sink.updates]
    assert done == sorted(done) and done[0] >= 1 and done[-1] <= 20
    assert all(total == 20 for _, total, _, _ in sink.updates)
    assert all(loss == 10.0 - (d - 1) for d, _, loss, _ in sink.updates)  # rank 0's loss


def test_progress_follower_keeps_a_half_written_line(tmp_path: Any) -> None:
    from pytest_accelperf.backends.measure import progress
    from pytest_accelperf.backends.procs.launch import _ProgressFollower

    events = tmp_path / "rank0.jsonl"
    follower = _ProgressFollower(events, total_steps=8)
    with progress.reporting(RecordingSink()) as sink:
        assert isinstance(sink, RecordingSink)
        follower.poll()  # no file yet: nothing, no error
        events.write_text('{"event": "progress", "phase": "init"}\n'
                          '{"event": "progress", "step": 2, "loss": 1.5, "time": 0.2}\n'
                          '{"event": "progress", "step": 3, "lo')
        follower.poll()
        assert sink.updates == [(3, 8, 1.5, 0.2)]
        with events.open("a") as f:
            f.write('ss": 1.25, "time": 0.25}\n')
        follower.poll()
        assert sink.updates[-1] == (4, 8, 1.25, 0.25)
        follower.poll()  # nothing new: nothing shown again
        assert len(sink.updates) == 2
