"""The ``input`` check: what making each step's batch cost, timed apart from the step.

The rules on blocks (a meaningful share of the step, a 2x slower input, an old baseline, an
input-bound step), then real training: a JAX and a torch ``make_batch`` slowed 20x by a
CPU-bound busy loop fail the check while an unchanged rerun does not, and through pytest
the terminal table and the JSON report say so. The busy loop spins on the thread's own CPU
clock, so its cost does not depend on what else the machine runs.
"""

from __future__ import annotations

import json
import mmap
import re
import statistics
import time
from typing import Any

from pytest_accelperf.provision.accel import prepare_environment

prepare_environment("cpu", 8)

import pytest  # noqa: E402

# The JAX backend's own frameworks (pip install 'pytest-accelperf[jax]').
pytest.importorskip("flax")
pytest.importorskip("optax")
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from conftest import Suite  # noqa: E402

from pytest_accelperf.backends.jax.backend import BACKEND  # noqa: E402
from pytest_accelperf.checks import Tolerances, Verdict, run_checks  # noqa: E402
from pytest_accelperf.checks.input import MIN_SHARE, check_input  # noqa: E402
from pytest_accelperf.checks.summary import summarize  # noqa: E402
from pytest_accelperf.collect.cases import Case  # noqa: E402
from pytest_accelperf.jax import JaxStep  # noqa: E402
from pytest_accelperf.provision.accel import Accelerator, provision  # noqa: E402
from pytest_accelperf.records.run import InputSeries, Run  # noqa: E402
from pytest_accelperf.records.verdict import CheckResult  # noqa: E402
from pytest_accelperf.report.terminal import metric_label  # noqa: E402
from pytest_accelperf.stats.yardstick import KIND as YARDSTICK_KIND  # noqa: E402
from pytest_accelperf.store.schema import validate_block  # noqa: E402

TOL = Tolerances()


def block(inputs: list[float], steps: list[float], wall: float | None = None) -> dict[str, Any]:
    """The parts of a baseline block the check reads."""
    out: dict[str, Any] = {"step_time": {"median": statistics.median(steps), "samples": steps},
                           "input": {"median": statistics.median(inputs), "samples": inputs}}
    if wall is not None:
        out["input"]["wall_median"] = wall
    return out


def jitter(center: float, n: int = 30, spread: float = 0.03) -> list[float]:
    """``n`` samples within ``spread`` of ``center``, the same every call."""
    rng = np.random.default_rng(int(center * 1e9) % 2**32)
    return [center * (1 + spread * float(u)) for u in rng.uniform(-1, 1, n)]


# -- the rules, on blocks ---------------------------------------------------------------------
def test_a_meaningful_input_twice_as_slow_fails_and_unchanged_passes() -> None:
    steps = jitter(0.010)
    base = block(jitter(0.002), steps)  # 20 % of the step
    slower = check_input(block(jitter(0.004), steps), base, TOL)
    assert slower is not None and slower.verdict is Verdict.REGRESSION, slower
    assert slower.data["ratio"] == pytest.approx(2.0, rel=0.05)
    assert re.match(r"input 3\.9\d ms CPU per step \(39\.\d% of the step\), baseline "
                    r"1\.99 ms \(19\.9% of the step\): 1\.99x the baseline's, 95% CI ",
                    slower.detail), slower.detail
    same = check_input(block(jitter(0.002)[::-1], steps), base, TOL)
    assert same is not None and same.verdict is Verdict.PASS, same
    faster = check_input(block(jitter(0.0008), steps), base, TOL)
    assert faster is not None and faster.verdict is Verdict.IMPROVEMENT, faster


def test_a_small_share_is_not_judged_until_it_grows() -> None:
    """0.1 ms of a 30 ms step: twice as slow still passes, and says why; 4.7 ms (the
    issue's Flax batch function, 15 % of the step) is judged, and fails."""
    steps = jitter(0.030)
    base = block(jitter(0.0001), steps)
    small = check_input(block(jitter(0.0002), steps), base, TOL)
    assert small is not None and small.verdict is Verdict.PASS
    assert "too small a share of the step to judge" in small.detail, small.detail
    grown = check_input(block(jitter(0.0047), steps), base, TOL)
    assert grown is not None and grown.verdict is Verdict.REGRESSION, grown
    assert grown.data["share"] == pytest.approx(0.0047 / 0.030, rel=0.05)
    assert grown.data["share"] >= MIN_SHARE > grown.data["baseline_share"]


def test_a_change_that_costs_under_5_percent_of_the_step_is_not_judged() -> None:
    """9 % of a 20 ms step, 1.3x: sure (the interval is narrow) and past a 10 % tolerance, but
    it adds 2.7 % to the step (the size of the session-to-session noise of millisecond CPU
    times, measured up to 1.33x, and 2.7x below a millisecond): it passes, saying why.
    Twice as slow adds 9 %, and fails."""
    tight = Tolerances(input_tolerance=0.1)
    steps = jitter(0.020)
    base = block(jitter(0.0018), steps)
    noise = check_input(block(jitter(0.0018 * 1.3), steps), base, tight)
    assert noise is not None and noise.verdict is Verdict.PASS, noise
    assert noise.data["min_change_s"] == pytest.approx(0.001, rel=0.03)
    assert re.search(r"a change of 0\.5\d+ ms, under the 5\.0% of the (19\.\d+|20) ms step from "
                     r"which it is judged: too small a share of the step to judge$",
                     noise.detail), noise.detail
    doubled = check_input(block(jitter(0.0036), steps), base, tight)
    assert doubled is not None and doubled.verdict is Verdict.REGRESSION, doubled
    assert check_input(block(jitter(0.0036), steps), base, TOL).verdict is Verdict.REGRESSION


def test_a_baseline_without_input_times_is_new_never_a_failure() -> None:
    now = block(jitter(0.004), jitter(0.010))
    old = {"outcome": "ok", "step_time": now["step_time"]}
    result = check_input(now, old, TOL)
    assert result is not None and result.verdict is Verdict.NEW
    assert "has no input time" in result.detail
    first = check_input(now, None, TOL)
    assert first is not None and first.verdict is Verdict.NEW
    assert check_input({"step_time": now["step_time"]}, old, TOL) is None  # nothing timed


def test_another_environment_is_not_compared() -> None:
    result = check_input(block(jitter(0.004), jitter(0.01)), block(jitter(0.002), jitter(0.01)),
                         TOL, comparable=False)
    assert result is not None and result.verdict is Verdict.INCOMPARABLE


def test_input_bound_steps_are_counted_in_the_detail_the_data_and_the_table() -> None:
    """A step whose batch took longer to make than the step ran is input-bound, whatever
    the verdict; the table's metric says in how many steps."""
    steps = [0.001] * 10
    inputs = [0.002] * 8 + [0.0009] * 2
    result = check_input(block(inputs, steps, wall=0.0025), block(inputs, steps), TOL)
    assert result is not None and not result.failed
    assert result.data["input_bound_steps"] == 8 and result.data["steps"] == 10
    assert "input-bound: the batch took longer to make than the step in 8 of 10 steps" \
        in result.detail
    assert result.data["wait_median"] == pytest.approx(0.0025 - statistics.median(inputs))
    assert metric_label(result) == "input (bound 8/10)"
    assert json.loads(json.dumps(result.to_json()))["data"]["input_bound_steps"] == 8
    quick = check_input(block([0.0005] * 10, steps), None, TOL)
    assert quick is not None and quick.data["input_bound_steps"] == 0
    assert "input-bound" not in quick.detail and metric_label(quick) == "input"


def test_the_block_stores_the_samples_and_validates() -> None:
    run = Run(case_id="c", step_times=[0.01, 0.011, 0.012],
              inputs=InputSeries(times=[0.002, 0.0, 0.003], wall_times=[0.003, 0.001, 0.004]))
    stored = summarize(run).to_json()
    assert stored["input"] == {"median": 0.002, "samples": [0.002, 0.0, 0.003],
                               "wall_median": 0.003}
    validate_block({"outcome": "ok", "environment": {}, **stored})
    assert "input" not in summarize(Run(case_id="c", step_times=[0.01])).to_json()
    assert Run.from_json(json.loads(json.dumps(run.to_json()))).inputs.times == run.inputs.times


# -- real training ----------------------------------------------------------------------------
def spin(seconds: float) -> None:
    """Busy for ``seconds`` of this thread's CPU time, however loaded the machine."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_the_loop_times_making_the_batch_not_moving_it() -> None:
    """``host`` (the user's data work) is the input; ``put`` (the transfer, whose wait spins
    the thread under load) is not, and neither is a backend's undivided ``prepare``."""
    from pytest_accelperf.backends.measure.loop import StepFns, run_steps

    def quiet(done: int, total: int, loss: float, seconds: float, measured: bool) -> None:
        pass

    fns: StepFns[int, int] = StepFns(prepare=lambda i: i, run=lambda i, b: b,
                                     read=lambda h: (1.0, {}),
                                     host=lambda i: spin(0.002) or i,
                                     put=lambda i, b: spin(0.010) or b)
    out = run_steps(fns, warmup=1, steps=3, report=quiet)
    assert len(out.inputs.times) == len(out.inputs.wall_times) == 3
    assert all(0.002 <= t < 0.010 for t in out.inputs.times), out.inputs.times
    assert out.batch_time >= 4 * 0.012
    undivided = run_steps(StepFns(prepare=lambda i: i, run=lambda i, b: b,
                                  read=lambda h: (1.0, {})), warmup=0, steps=3, report=quiet)
    assert undivided.inputs.times == [] and len(undivided.step_times) == 3


@pytest.fixture(scope="module")
def accel() -> Accelerator:
    return provision("cpu", 8)


def jax_step(cost: float) -> JaxStep:
    """A linear regression whose make_batch costs ``cost`` CPU seconds a batch."""

    def init(key: jax.Array) -> dict[str, jax.Array]:
        return {"w": jnp.zeros((8, 1))}

    def train_step(state: Any, batch: Any) -> Any:
        loss, grad = jax.value_and_grad(
            lambda w: jnp.mean((batch["x"] @ w - batch["y"]) ** 2))(state["w"])
        return {"w": state["w"] - 0.1 * grad}, {"loss": loss}

    def make_batch(i: int) -> dict[str, np.ndarray]:
        spin(cost)
        x = np.random.default_rng(i).normal(size=(16, 8)).astype(np.float32)
        return {"x": x, "y": x.sum(axis=1, keepdims=True)}

    return JaxStep(init, train_step, make_batch)


def input_verdict(now: Run, base: Run) -> CheckResult:
    checks = run_checks(now, None, summarize(base).to_json(), TOL)
    return next(c for c in checks if c.metric == "input")


@pytest.mark.timing
def test_a_jax_make_batch_20x_slower_fails_and_an_unchanged_rerun_does_not(
        accel: Accelerator) -> None:
    """The issue's miss: the batch is made outside the step's timer, so a slower batch
    function left every check passing. 2 ms of CPU a batch, then 40 ms."""
    case = Case(backend="jax", batch=16, steps=10, warmup=1)
    base = BACKEND.train(case, jax_step(0.002), accel).run
    again = BACKEND.train(case, jax_step(0.002), accel).run
    slow = BACKEND.train(case, jax_step(0.040), accel).run
    assert len(base.inputs.times) == len(base.step_times) == 10
    assert min(base.inputs.times) >= 0.002  # the spin is inside what is measured
    unchanged = input_verdict(again, base)
    assert not unchanged.failed, unchanged.detail
    slower = input_verdict(slow, base)
    assert slower.verdict is Verdict.REGRESSION, slower.detail
    assert slower.data["ratio"] > 10 and slower.data["input_bound_steps"] == 10, slower.data
    # The throughput check cannot see it: the step itself did not change.
    assert statistics.median(slow.step_times) < 0.040


@pytest.mark.timing
def test_a_torch_make_batch_20x_slower_fails() -> None:
    torch = pytest.importorskip("torch")
    from pytest_accelperf.backends.torch.backend import BACKEND as TORCH
    from pytest_accelperf.torch import TorchStep

    def make(cost: float) -> TorchStep:
        torch.manual_seed(0)
        model = torch.nn.Linear(8, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

        def step(batch: Any) -> Any:
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(batch["x"]), batch["y"])
            loss.backward()
            optimizer.step()
            return loss

        def make_batch(i: int) -> dict[str, Any]:
            spin(cost)
            x = torch.randn(16, 8, generator=torch.Generator().manual_seed(i))
            return {"x": x, "y": x.sum(dim=1, keepdim=True)}

        return TorchStep(step, make_batch, model, stateful=())

    cpu = Accelerator(name="cpu", platform="cpu-x1", device_kind="cpu", device_count=1)
    case = Case(backend="torch", batch=16, steps=10, warmup=1)
    base = TORCH.train(case, make(0.002), cpu).run
    slow = TORCH.train(case, make(0.040), cpu).run
    assert len(base.inputs.times) == len(base.step_times) == 10
    assert input_verdict(slow, base).verdict is Verdict.REGRESSION


SLOW_SUITE = '''
import os, time
import numpy as np
import optax
from pytest_accelperf import cases
from pytest_accelperf.jax import JaxTask
import jax.numpy as jnp


def make_batch(step):
    end = time.thread_time() + float(os.environ.get("BATCH_COST", "0.002"))
    while time.thread_time() < end:  # a batch function's CPU work
        pass
    x = np.random.default_rng(step).normal(size=(16, 8)).astype(np.float32)
    return {"x": x, "y": x.sum(axis=1, keepdims=True)}


@cases(backend="jax", batch=[16], steps=10, warmup=1)
def test_batch(accelperf):
    accelperf.train(JaxTask(init_params=lambda key: {"w": jnp.zeros((8, 1))},
                            loss_fn=lambda p, b: jnp.mean((b["x"] @ p["w"] - b["y"]) ** 2),
                            make_batch=make_batch, optimizer=optax.sgd(0.1)))
'''


@pytest.mark.slow
@pytest.mark.timing
def test_through_pytest_the_table_and_the_report_name_the_slow_input(
        suite: Suite, monkeypatch: pytest.MonkeyPatch) -> None:
    suite.write(SLOW_SUITE)
    suite.run("--accelperf-update").assert_outcomes(passed=1)
    stored = next(iter(suite.load()["cases"].values()))["input"]
    assert len(stored["samples"]) == 10 and stored["median"] >= 0.002
    monkeypatch.setenv("BATCH_COST", "0.040")
    result = suite.run("--accelperf-input-tolerance=0.5", "--accelperf-json=report.json")
    result.assert_outcomes(failed=1)
    row = next(line for line in result.outlines if line.lstrip().startswith("input ("))
    assert row.split()[:3] == ["input", "(bound", "10/10)"] and "REGRESSION" in row, row
    check = next(c for c in suite.report()["cases"][0]["checks"] if c["metric"] == "input")
    assert check["verdict"] == "regression" and check["data"]["input_bound_steps"] == 10
    assert "input-bound" in check["detail"]



def test_tenths_of_a_millisecond_of_input_are_never_judged() -> None:
    """Seen on unchanged code (tests/unit/test_accel.py's torch case, a 0.6 ms step): the
    thread's CPU time for its batch went 0.028 -> 0.073 ms between two processes, 2.6x and
    11.6 % of the step, and failed the case at tolerance 0.5. A change under 0.5 ms is
    not judged, whatever share of the step it is."""
    steps = jitter(0.0006)
    base = block(jitter(0.000028), steps)
    now = check_input(block(jitter(0.000073), steps), base, TOL)
    assert now is not None and now.verdict is Verdict.PASS, now
    assert "under the 0.5 ms from which an input change is judged" in now.detail


# -- evidence before a verdict (issue 48) -----------------------------------------------------
def evidence(inputs: list[float], steps: list[float], *, wall: float | None = None,
             faults: float | None = None, yardstick: float | None = None,
             queued: float | None = None) -> dict[str, Any]:
    """A block with the evidence the check weighs beside the input's CPU time."""
    out = block(inputs, steps, wall)
    extra = {"fault_median": faults, "yardstick_median": yardstick, "queued_median": queued,
             "yardstick_kind": YARDSTICK_KIND if yardstick is not None else None}
    out["input"].update({k: v for k, v in extra.items() if v is not None})
    return out


#: The issue's case: 1.54 ms of CPU a batch of an 80 ms step, then 5.56 ms (3.61x).
STEPS_80 = jitter(0.080)


def test_inflated_cpu_time_that_the_wall_time_does_not_show_is_not_judged() -> None:
    """A CPU time 3.6x the baseline's with no other evidence (the wall time as it was):
    a thread's CPU time is part of its wall time, so the change is not believed."""
    base = evidence(jitter(0.00154), STEPS_80, wall=0.0060)
    now = check_input(evidence(jitter(0.00556), STEPS_80, wall=0.0061), base, TOL)
    assert now is not None and now.verdict is Verdict.INCONCLUSIVE, now
    assert now.detail.startswith("not judged: its wall time did not move with it (6 ms → "
                                 "6.1 ms a batch, against +4.0"), now.detail
    assert now.data["measured_verdict"] == "regression" and now.data["contaminated"]
    # the wall time that moved with it: judged
    moved = check_input(evidence(jitter(0.00556), STEPS_80, wall=0.0100), base, TOL)
    assert moved is not None and moved.verdict is Verdict.REGRESSION, moved


def test_cpu_time_that_moved_with_the_page_faults_is_not_judged() -> None:
    """The same batch function, its memory served afresh by the kernel (2,006 page faults a
    batch) against reused (30): the CPU time the faults cost is the allocator's state."""
    base = evidence(jitter(0.00154), STEPS_80, faults=30)
    now = check_input(evidence(jitter(0.00556), STEPS_80, faults=2006), base, TOL)
    assert now is not None and now.verdict is Verdict.INCONCLUSIVE, now
    assert ("the batch's memory came from the kernel differently: 30 page faults a batch in "
            "the baseline, 2,006 now") in now.detail, now.detail
    assert "; measured: input 5.6" in now.detail and "3.67x the baseline" in now.detail
    # as many faults as the baseline's (within 25 %): judged
    same = check_input(evidence(jitter(0.00556), STEPS_80, faults=2100),
                       evidence(jitter(0.00154), STEPS_80, faults=2006), TOL)
    assert same is not None and same.verdict is Verdict.REGRESSION, same
    # a baseline recorded before faults were counted, against a run that faulted
    old = check_input(evidence(jitter(0.00556), STEPS_80, faults=2006),
                      evidence(jitter(0.00154), STEPS_80), TOL)
    assert old is not None and old.verdict is Verdict.INCONCLUSIVE, old
    assert "the baseline counted none" in old.detail and "--accelperf-update" in old.detail


def test_the_ratio_is_corrected_by_the_threads_yardstick() -> None:
    """A thread that computed 3.6x slower as a whole (its yardstick too) passes; a batch
    function 3.9x slower at the same yardstick fails, and says it was corrected."""
    base = evidence(jitter(0.00154), STEPS_80, yardstick=0.0003)
    slowed = check_input(evidence(jitter(0.00556), STEPS_80, yardstick=0.00108), base, TOL)
    assert slowed is not None and slowed.verdict is Verdict.PASS, slowed
    assert slowed.data["yardstick_ratio"] == pytest.approx(3.6)
    planted = check_input(evidence(jitter(0.00604), STEPS_80, yardstick=0.00031), base, TOL)
    assert planted is not None and planted.verdict is Verdict.REGRESSION, planted
    assert "(corrected for this thread's speed: its yardstick took 1.03x the baseline's CPU " \
           "time)" in planted.detail, planted.detail
    # a yardstick of another kind does not compare
    other = evidence(jitter(0.00154), STEPS_80, yardstick=0.0003)
    other["input"]["yardstick_kind"] = "another"
    assert check_input(evidence(jitter(0.00556), STEPS_80, yardstick=0.00108), other,
                       TOL).verdict is Verdict.REGRESSION  # type: ignore[union-attr]


def test_company_without_a_yardstick_to_correct_by_is_not_judged() -> None:
    base = evidence(jitter(0.00154), STEPS_80)
    loaded = "other processes used 0.90 of 2 cores on average while the steps were measured"
    now = check_input(evidence(jitter(0.00556), STEPS_80), base, TOL, loaded=loaded)
    assert now is not None and now.verdict is Verdict.INCONCLUSIVE, now
    assert now.detail.startswith(f"not judged: measured beside another job: {loaded}, and "
                                 f"the baseline has no yardstick"), now.detail
    queued = check_input(evidence(jitter(0.00556), STEPS_80, queued=0.002), base, TOL)
    assert queued is not None and queued.verdict is Verdict.INCONCLUSIVE, queued
    assert "this thread waited 2 ms a batch for a CPU while it made it (3" in queued.detail
    # with a yardstick on both sides, company is corrected for, and a slower batch judged
    base_y = evidence(jitter(0.00154), STEPS_80, yardstick=0.0003)
    judged = check_input(evidence(jitter(0.00556), STEPS_80, yardstick=0.0003), base_y, TOL,
                         loaded=loaded)
    assert judged is not None and judged.verdict is Verdict.REGRESSION, judged


def test_the_block_stores_the_evidence_and_validates() -> None:
    run = Run(case_id="c", step_times=[0.01, 0.011, 0.012],
              inputs=InputSeries(times=[0.002, 0.001, 0.003], queued_times=[0.0, 0.001, 0.0],
                                 faults=[10, 12, 2000],
                                 yardstick_times=[0.0003, 0.0004, 0.0003]))
    stored = summarize(run).to_json()["input"]
    assert (stored["queued_median"], stored["fault_median"], stored["yardstick_median"],
            stored["yardstick_kind"]) == (0.0, 12.0, 0.0003, YARDSTICK_KIND)
    validate_block({"outcome": "ok", "environment": {}, "input": stored})
    back = Run.from_json(json.loads(json.dumps(run.to_json())))
    assert back.inputs == run.inputs


def test_the_loop_counts_the_faults_and_times_the_yardstick() -> None:
    """A batch function that maps 4 MiB afresh each batch faults about 1,024 times; the
    yardstick runs once per measured step, outside the input's window."""
    from pytest_accelperf.backends.measure.loop import StepFns, run_steps

    def fresh(i: int) -> int:
        with mmap.mmap(-1, 4 << 20) as buffer:  # mapped afresh, as a large malloc can be
            for page in range(0, len(buffer), mmap.PAGESIZE):
                buffer[page] = 1  # first touch: a fault
            return len(buffer) + i

    out = run_steps(StepFns(prepare=lambda i: i, run=lambda i, b: b, read=lambda h: (1.0, {}),
                            host=fresh, put=lambda i, b: b),
                    warmup=1, steps=4, report=lambda *a: None)
    if out.inputs.faults:  # Linux counts them per thread
        assert statistics.median(out.inputs.faults) >= 512, out.inputs.faults
    assert len(out.inputs.yardstick_times) == 4 and min(out.inputs.yardstick_times) > 0


def test_an_input_regression_is_measured_again_before_it_fails() -> None:
    """One measurement is never enough: a regression that a second training does not show
    passes (the detail says so), one that it shows too stands, and one set aside for its
    page faults is measured again as well."""
    from pytest_accelperf.gate.judge import Confirmation, Evaluated
    from pytest_accelperf.store.block import read_block

    base = evidence(jitter(0.00154), STEPS_80, wall=0.002, faults=30)

    def evaluated(cpu: float, faults: float = 30) -> Evaluated:
        now = evidence(jitter(cpu), STEPS_80, wall=cpu + 0.0005, faults=faults)
        check = check_input(now, base, TOL)
        assert check is not None
        return Evaluated(run=Run(case_id="c"), block=read_block(now), baseline=read_block(base),
                         checks=(check,))

    def confirm(first: Evaluated, *again: Evaluated) -> CheckResult:
        left, calls = list(again), []

        def remeasure() -> Evaluated:
            calls.append(1)
            return left.pop(0)

        out = Confirmation(remeasure, times=len(again), max_foreign_load=64.0)(first)
        assert len(calls) == len(again) - len(left)
        return next(c for c in out.checks if c.metric == "input")

    cleared = confirm(evaluated(0.00556), evaluated(0.00154))
    assert cleared.verdict is Verdict.PASS, cleared
    assert cleared.detail.endswith("(re-measured: a first measurement looked like a regression, "
                                   "input CPU ratio(s) 3.67; not confirmed)"), cleared.detail
    stands = confirm(evaluated(0.00656), evaluated(0.00656))
    assert stands.verdict is Verdict.REGRESSION and stands.data["confirmations"], stands
    assert "(confirmed by 1 re-measurement(s): input CPU ratio(s) 4.30, 4.30)" in stands.detail
    faulted = confirm(evaluated(0.00556, faults=2006), evaluated(0.00154))
    assert faulted.verdict is Verdict.PASS and "1 of them not judged, contaminated" in \
        faulted.detail, faulted.detail


def test_a_step_the_machine_slowed_does_not_raise_the_floor_once_corrected() -> None:
    """Beside a competing job nanoGPT's 21 ms step took 65 ms: the longer step put a planted
    3 ms under the 5 % floor. With both runs' yardsticks the session's slowing is accounted
    for, and the floor is the baseline's step's; without them it stays the longer step's."""
    base = evidence(jitter(0.00123), jitter(0.0214), yardstick=0.0003)
    now = evidence(jitter(0.00434), jitter(0.0646), yardstick=0.0003)
    caught = check_input(now, base, TOL)
    assert caught is not None and caught.verdict is Verdict.REGRESSION, caught
    assert caught.data["min_change_s"] == pytest.approx(0.05 * 0.0214, rel=0.05)
    bare = check_input(evidence(jitter(0.00434), jitter(0.0646)),
                       evidence(jitter(0.00123), jitter(0.0214)), TOL)
    assert bare is not None and bare.verdict is Verdict.PASS, bare
    assert "under the 5.0% of the 64.6 ms step" in bare.detail
