"""The ``input_wait`` check: the time the thread making each step's batch was blocked, neither
on a CPU nor waiting for one.

The clock first (a sleep is measured as blocked, CPU work beside spinning processes is
not), then the rules on blocks, then real training: a JAX and a torch ``make_batch`` that
start sleeping (a slow disk) fail ``input_wait`` while ``input`` (CPU time) and
``throughput`` see nothing, and through pytest the table and the report say so.
"""

from __future__ import annotations

import multiprocessing
import statistics
import time
from collections.abc import Iterator
from typing import Any

from pytest_accelperf.provision.accel import prepare_environment

prepare_environment("cpu", 8)

import pytest  # noqa: E402

from pytest_accelperf.backends.measure.blocked import BlockedClock  # noqa: E402
from pytest_accelperf.backends.measure.loop import StepFns, run_steps  # noqa: E402
from pytest_accelperf.checks import Tolerances, Verdict, run_checks  # noqa: E402
from pytest_accelperf.checks.input_wait import check_input_wait  # noqa: E402
from pytest_accelperf.checks.summary import summarize  # noqa: E402
from pytest_accelperf.records.run import InputSeries, Run  # noqa: E402
from pytest_accelperf.records.verdict import CheckResult  # noqa: E402
from pytest_accelperf.store.schema import validate_block  # noqa: E402

if BlockedClock.open() is None:  # pragma: no cover - Linux counts it
    pytest.skip("this kernel does not count a thread's run-queue delay "
                "(/proc/thread-self/schedstat)", allow_module_level=True)

TOL = Tolerances()


def quiet(done: int, total: int, loss: float, seconds: float, measured: bool) -> None:
    pass


def spin(seconds: float) -> None:
    """Busy for ``seconds`` of this thread's CPU time, however loaded the machine."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def _spinner(stop: Any) -> None:
    while not stop.is_set():
        pass


@pytest.fixture
def spinning() -> Iterator[None]:
    """Three processes spinning on this machine's cores while the test measures."""
    ctx = multiprocessing.get_context("spawn")
    stop = ctx.Event()
    procs = [ctx.Process(target=_spinner, args=(stop,), daemon=True) for _ in range(3)]
    for p in procs:
        p.start()
    time.sleep(0.3)
    try:
        yield
    finally:
        stop.set()
        for p in procs:
            p.join(5)


def _loop(host: Any, steps: int = 8) -> Any:
    fns: StepFns[int, int] = StepFns(prepare=lambda i: i, run=lambda i, b: b,
                                     read=lambda h: (1.0, {}), host=host,
                                     put=lambda i, b: b)
    return run_steps(fns, warmup=1, steps=steps, report=quiet)


# -- the clock --------------------------------------------------------------------------------
@pytest.mark.timing
def test_a_sleep_is_blocked_and_cpu_work_beside_spinning_processes_is_not(
        spinning: None) -> None:
    """Beside three spinning processes on two cores, a batch function of 20 ms of CPU waits
    for a CPU (its wall time is longer than its CPU time) yet is blocked ~0 ms; the same
    with a 6 ms sleep is blocked ~6 ms: the run-queue delay is taken out, the sleep is not."""
    def busy_batch(i: int) -> int:
        spin(0.020)
        return i

    def sleepy_batch(i: int) -> int:
        spin(0.020)
        time.sleep(0.006)
        return i

    busy = _loop(busy_batch)
    assert len(busy.inputs.blocked_times) == len(busy.step_times) == 8
    waited = [w - c for w, c in zip(busy.inputs.wall_times, busy.inputs.times, strict=True)]
    assert statistics.median(waited) > 0.004, waited  # it did wait for a CPU
    assert statistics.median(busy.inputs.blocked_times) < 0.001, (busy.inputs.blocked_times,
                                                                 waited)
    sleepy = _loop(sleepy_batch)
    assert 0.0055 < statistics.median(sleepy.inputs.blocked_times) < 0.009, \
        sleepy.inputs.blocked_times


def test_the_clock_is_the_calling_threads_and_none_without_schedstat(tmp_path: Any) -> None:
    with BlockedClock.open() as clock:  # type: ignore[union-attr]
        mark = clock.mark()
        time.sleep(0.003)
        assert 0.0025 < clock.since(mark) < 0.05
    assert BlockedClock.open(str(tmp_path / "nothing")) is None
    uncounted = tmp_path / "schedstat"
    uncounted.write_text("0 0 0\n")  # a kernel that counts nothing
    assert BlockedClock.open(str(uncounted)) is None


# -- the rules, on blocks ---------------------------------------------------------------------
def block(blocked: list[float] | None, steps: list[float],
          cpu: float = 0.0004) -> dict[str, Any]:
    out: dict[str, Any] = {"step_time": {"median": statistics.median(steps), "samples": steps},
                           "input": {"median": cpu, "samples": [cpu] * len(steps)}}
    if blocked is not None:
        out["input"]["blocked_median"] = statistics.median(blocked)
        out["input"]["blocked_samples"] = blocked
    return out


STEPS = [0.020 * (1 + 0.02 * ((i * 7) % 5 - 2)) for i in range(20)]
NONE = [0.0] * 12 + [0.00002] * 8   # a batch from memory: blocked 0-20 us


def verdict(now: dict[str, Any], base: dict[str, Any], **kw: Any) -> CheckResult:
    result = check_input_wait(now, base, TOL, **kw)
    assert result is not None
    return result


def test_a_new_wait_of_a_meaningful_share_fails_and_unchanged_passes() -> None:
    """A 4 ms read added to each step of 20 ms: 20 % of the step."""
    base = block(NONE, STEPS)
    slow = verdict(block([0.004 + 0.0001 * (i % 3) for i in range(20)], STEPS), base)
    assert slow.verdict is Verdict.REGRESSION, slow.detail
    assert slow.detail.startswith("blocked 4.1 ms per step making the batch (20.5% of the "
                                  "step), baseline 0 ms"), slow.detail
    assert "+4.1 ms a step" in slow.detail and "off the CPU and not waiting for one" in \
        slow.detail
    same = verdict(block(list(reversed(NONE)), STEPS), base)
    assert same.verdict is Verdict.PASS, same.detail


def test_a_wait_from_nothing_is_said_without_a_ratio_to_the_floor() -> None:
    """A baseline never blocked (median 0 s) has no level to be a multiple of: the
    samples' ratio is one to the 1e-7 s floor they are read at (a 20 ms sleep read
    ``200900.00x the baseline's`` and ``+20089900.0%`` in the table). The verdict stands,
    said ``from nothing``, with no change; a baseline that waited 0.1 ms keeps its ratio."""
    now = block([0.02 * (1 + 0.01 * (i % 3)) for i in range(20)], STEPS)
    never = verdict(now, block([0.0] * 20, STEPS))
    assert never.verdict is Verdict.REGRESSION and never.change is None, never
    assert "+20.2 ms a step, from nothing (the baseline's median is under the floor of " \
           "0.0001 ms; tolerance 50%); blocked: " in never.detail, never.detail
    assert "x the baseline's" not in never.detail
    assert never.data["ratio"] > 1e5  # the interval the verdict is read from is kept
    waited = verdict(now, block([0.0001] * 20, STEPS))
    assert waited.change is not None and 150 < waited.change < 250, waited
    assert "x the baseline's (95% CI " in waited.detail, waited.detail


def test_a_change_under_the_floor_is_not_judged() -> None:
    """0.3 ms more: under the 0.5 ms floor (and the 5 % of a 20 ms step, 1 ms)."""
    result = verdict(block([0.0003] * 20, STEPS), block(NONE, STEPS))
    assert result.verdict is Verdict.PASS
    assert "under the 5.0% of the 20 ms step from which it is judged" in result.detail


def test_beside_another_job_a_change_is_not_judged_and_a_pass_holds() -> None:
    loaded = "other processes used 1.50 of 2 cores on average"
    slow = verdict(block([0.004] * 20, STEPS), block(NONE, STEPS), loaded=loaded)
    assert slow.verdict is Verdict.INCONCLUSIVE and slow.data["measured_verdict"] == \
        "regression"
    assert slow.detail.startswith(f"not judged, measured beside another job: {loaded}")
    same = verdict(block(NONE, STEPS), block(NONE, STEPS), loaded=loaded)
    assert same.verdict is Verdict.PASS


def test_an_old_baseline_is_new_and_another_environment_incomparable() -> None:
    old = verdict(block([0.004] * 20, STEPS), block(None, STEPS))
    assert old.verdict is Verdict.NEW and "has no blocked input time" in old.detail
    other = verdict(block([0.004] * 20, STEPS), block(NONE, STEPS), comparable=False)
    assert other.verdict is Verdict.INCOMPARABLE
    assert check_input_wait(block(None, STEPS), block(NONE, STEPS), TOL) is None


def test_the_block_stores_the_blocked_samples_and_validates() -> None:
    run = Run(case_id="c", step_times=STEPS,
              inputs=InputSeries(times=[0.0004] * 20, wall_times=[0.0045] * 20,
                                 blocked_times=[0.004] * 20))
    stored = summarize(run).to_json()["input"]
    assert stored["blocked_median"] == 0.004 and len(stored["blocked_samples"]) == 20
    checked = validate_block(summarize(run).to_json()).input
    assert checked is not None and checked.blocked_samples == [0.004] * 20
    with pytest.raises(Exception, match="blocked_samples"):
        validate_block({**summarize(run).to_json(),
                        "input": {**stored, "blocked_samples": [-1.0]}})


# -- real training ----------------------------------------------------------------------------
def _sleepy_jax(sleep: float) -> Any:
    import jax
    import jax.numpy as jnp
    import numpy as np

    from pytest_accelperf.jax import JaxStep

    def init(key: jax.Array) -> dict[str, jax.Array]:
        return {"w": jnp.zeros((64, 1))}

    def train_step(state: Any, batch: Any) -> Any:
        loss, grad = jax.value_and_grad(
            lambda w: jnp.mean((batch["x"] @ w - batch["y"]) ** 2))(state["w"])
        return {"w": state["w"] - 0.01 * grad}, {"loss": loss}

    def make_batch(i: int) -> dict[str, Any]:
        time.sleep(sleep)  # a read from a slow disk: no CPU
        x = np.random.default_rng(i).normal(size=(256, 64)).astype(np.float32)
        return {"x": x, "y": x.sum(axis=1, keepdims=True)}

    return JaxStep(init, train_step, make_batch)


def _checks(now: Run, base: Run) -> dict[str, CheckResult]:
    return {c.metric: c for c in run_checks(now, None, summarize(base).to_json(), TOL,
                                            max_foreign_load=64.0)}


@pytest.mark.timing
def test_a_jax_make_batch_that_starts_sleeping_fails_input_wait_only() -> None:
    """nanoGPT's blind spot, found by trying bisect on it: a ``get_batch`` that waits on
    the disk used no more CPU, so ``input`` passed, and the step did not change, so
    ``throughput`` passed. 8 ms of sleep a batch."""
    pytest.importorskip("flax")
    from pytest_accelperf.backends.jax.backend import BACKEND
    from pytest_accelperf.collect.cases import Case
    from pytest_accelperf.provision.accel import provision

    accel = provision("cpu", 8)
    case = Case(backend="jax", batch=256, steps=12, warmup=1)
    base = BACKEND.train(case, _sleepy_jax(0.0), accel).run
    again = BACKEND.train(case, _sleepy_jax(0.0), accel).run
    slow = BACKEND.train(case, _sleepy_jax(0.008), accel).run
    assert len(base.inputs.blocked_times) == len(base.step_times) == 12
    unchanged = _checks(again, base)
    assert not unchanged["input_wait"].failed, unchanged["input_wait"].detail
    checks = _checks(slow, base)
    assert checks["input_wait"].verdict is Verdict.REGRESSION, checks["input_wait"].detail
    assert not checks["input"].failed, checks["input"].detail
    assert 0.007 < statistics.median(slow.inputs.blocked_times) < 0.012


@pytest.mark.timing
def test_a_torch_make_batch_that_starts_sleeping_fails_input_wait() -> None:
    torch = pytest.importorskip("torch")
    from pytest_accelperf.backends.torch.backend import BACKEND as TORCH
    from pytest_accelperf.collect.cases import Case
    from pytest_accelperf.provision.accel import Accelerator
    from pytest_accelperf.torch import TorchStep

    def make(sleep: float) -> TorchStep:
        torch.manual_seed(0)
        model = torch.nn.Linear(64, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

        def step(batch: Any) -> Any:
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(batch["x"]), batch["y"])
            loss.backward()
            optimizer.step()
            return loss

        def make_batch(i: int) -> dict[str, Any]:
            time.sleep(sleep)
            x = torch.randn(256, 64, generator=torch.Generator().manual_seed(i))
            return {"x": x, "y": x.sum(dim=1, keepdim=True)}

        return TorchStep(step, make_batch, model, stateful=())

    cpu = Accelerator(name="cpu", platform="cpu-x1", device_kind="cpu", device_count=1)
    case = Case(backend="torch", batch=256, steps=12, warmup=1)
    base = TORCH.train(case, make(0.0), cpu).run
    slow = TORCH.train(case, make(0.008), cpu).run
    checks = _checks(slow, base)
    assert checks["input_wait"].verdict is Verdict.REGRESSION, checks["input_wait"].detail
    assert not checks["input"].failed, checks["input"].detail


SLEEPY_SUITE = '''
import os, time
import numpy as np
import optax
from pytest_accelperf import cases
from pytest_accelperf.jax import JaxTask
import jax.numpy as jnp


def make_batch(step):
    time.sleep(float(os.environ.get("BATCH_SLEEP", "0")))  # a read from a slow disk
    x = np.random.default_rng(step).normal(size=(256, 64)).astype(np.float32)
    return {"x": x, "y": x.sum(axis=1, keepdims=True)}


@cases(backend="jax", batch=[256], steps=12, warmup=1)
def test_batch(accelperf):
    accelperf.train(JaxTask(init_params=lambda key: {"w": jnp.zeros((64, 1))},
                            loss_fn=lambda p, b: jnp.mean((b["x"] @ p["w"] - b["y"]) ** 2),
                            make_batch=make_batch, optimizer=optax.sgd(0.01)))
'''


@pytest.mark.slow
@pytest.mark.timing
def test_through_pytest_the_table_and_the_report_name_the_wait(
        suite: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("flax")
    suite.write(SLEEPY_SUITE)
    suite.run("--accelperf-update").assert_outcomes(passed=1)
    stored = next(iter(suite.load()["cases"].values()))["input"]
    assert len(stored["blocked_samples"]) == 12
    monkeypatch.setenv("BATCH_SLEEP", "0.008")
    result = suite.run("--accelperf-input-tolerance=0.5", "--accelperf-json=report.json")
    result.assert_outcomes(failed=1)
    row = next(line for line in result.outlines if line.lstrip().startswith("input_wait "))
    assert "REGRESSION" in row, row
    checks = {c["metric"]: c for c in suite.report()["cases"][0]["checks"]}
    assert checks["input_wait"]["verdict"] == "regression", checks["input_wait"]
    assert checks["input"]["verdict"] == "pass", checks["input"]
