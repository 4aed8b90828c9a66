"""The gate benchmark (benchmarks/gate.py) end to end, and the fault injection it relies on."""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import without_hypothesis

from pytest_accelperf.backends.measure.common import INJECT_ENV, injected_slowdown, stretch

ROOT = Path(__file__).resolve().parents[2]
GATE = ROOT / "benchmarks" / "gate.py"


def _gate_module() -> Any:
    spec = importlib.util.spec_from_file_location("accelperf_gate_benchmark", GATE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


gate = _gate_module()


# -- fault injection -------------------------------------------------------------------


@pytest.mark.timing
def test_stretch_makes_a_step_longer_by_the_fraction() -> None:
    for fraction in (0.0, 0.5, 1.0):
        t0 = time.perf_counter()
        time.sleep(0.05)
        t1 = time.perf_counter()
        end = stretch(t0, t1, fraction)
        # At least the asked-for length (it spins until then), and not much more (the
        # margin is for a descheduled spin on a busy machine), as the clock says too.
        assert end - t0 >= (t1 - t0) * (1 + fraction)
        assert end - t0 <= (t1 - t0) * (1 + fraction) + 0.03
        assert time.perf_counter() >= end
    t0 = time.perf_counter()
    assert stretch(t0, t0 + 1.0, 0.0) == t0 + 1.0  # no injection: the end time as given


@pytest.mark.parametrize("value", ["abc", "-0.1", "nan", "inf", "11", "5%"])
def test_injected_slowdown_rejects_garbage(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(INJECT_ENV, value)
    with pytest.raises(ValueError, match=INJECT_ENV) as info:
        injected_slowdown()
    assert repr(value) in str(info.value)
    assert "unset it" in str(info.value)


def test_injected_slowdown_reads_the_fraction(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(INJECT_ENV, raising=False)
    assert injected_slowdown() == 0.0
    monkeypatch.setenv(INJECT_ENV, " 0.05 ")
    assert injected_slowdown() == 0.05
    monkeypatch.setenv(INJECT_ENV, "")
    assert injected_slowdown() == 0.0


# -- the benchmark's pieces --------------------------------------------------------------


def test_schedule_interleaves_conditions() -> None:
    conds = [gate.Condition("none", s) for s in (0.0, 0.1, 0.5)]
    plan = gate.schedule(conds, 3)
    assert [r for r, _ in plan] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert [c.slowdown for _, c in plan] == [0.0, 0.1, 0.5, 0.1, 0.5, 0.0, 0.5, 0.0, 0.1]


def test_pytest_benchmark_alarm_is_read_from_its_output() -> None:
    output = ("----\nPerformance has regressed:\n\ttest_step_benchmark (0001_baseline) - Field "
              "'median' has failed PercentageRegressionCheck: 41.7 > 5.0\n----\n")
    assert gate.pb_alarms(output) == [
        "test_step_benchmark (0001_baseline) - Field 'median' has failed "
        "PercentageRegressionCheck: 41.7 > 5.0"]
    assert gate.pb_alarms("2 passed in 9.86s\n") == []


def test_pytest_benchmark_outcome(tmp_path: Path) -> None:
    def bench_json(path: Path, median: float) -> None:
        stats = {"median": median, "rounds": 3, "iterations": 1, "total": 3 * median,
                 "data": [median] * 3}
        path.write_text(json.dumps({"benchmarks": [
            {"name": "test_step_benchmark", "stats": stats, "extra_info": {"lock_wait_s": 0.5}}]}))

    bench_json(tmp_path / "base.json", 0.010)
    bench_json(tmp_path / "pb.json", 0.012)
    fired = ("Performance has regressed:\n\ttest_step_benchmark (0001_baseline) - Field "
             "'median' has failed PercentageRegressionCheck: 20.0 > 5.0\n")
    session = gate.Session(rc=1, wall_s=9.0, output=fired, run_dir=tmp_path,
                           test_wall_s={"test_step_benchmark": 4.0})
    out = gate.parse_pytest_benchmark(session, tmp_path / "base.json")
    assert out["alarm"] is True and out["verdict"] == "regression"
    assert out["ratio"] == 1.2 and out["wall_s"] == 4.0 and out["lock_wait_s"] == 0.5
    session.output = "1 passed"
    assert gate.parse_pytest_benchmark(session, tmp_path / "base.json")["alarm"] is False
    (tmp_path / "pb.json").unlink()  # the test did not run: no verdict, not "no alarm"
    out = gate.parse_pytest_benchmark(session, tmp_path / "base.json")
    assert out["alarm"] is None and out["verdict"] == "error"


def test_clopper_pearson_interval() -> None:
    lo, hi = gate.rate_ci(0, 10)
    assert lo == 0.0 and 0.30 < hi < 0.31  # 1 - 0.025 ** (1 / 10)
    lo, hi = gate.rate_ci(10, 10)
    assert 0.69 < lo < 0.70 and hi == 1.0


def test_competing_load_is_stopped_on_error() -> None:
    """Also with JAX's backends up (its at-fork handler installed, as in any xdist worker
    that ran a JAX case): starting the load runs no at-fork handler, which warns under
    ``-W error`` (the CI failure a ``preexec_fn`` caused)."""
    jax = pytest.importorskip("jax")
    jax.devices()
    with pytest.raises(RuntimeError, match="boom"), gate.competing_load("cpu") as pid:
        assert pid is not None
        os.kill(pid, 0)  # running
        raise RuntimeError("boom")
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        pytest.fail(f"the load process {pid} is still running")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_competing_load_dies_with_a_killed_benchmark(tmp_path: Path) -> None:
    """SIGKILL the benchmark (no finally runs): the kernel still stops its load."""
    code = (f"import importlib.util, os, signal, sys\n"
            f"spec = importlib.util.spec_from_file_location('g', {str(GATE)!r})\n"
            f"g = importlib.util.module_from_spec(spec); sys.modules['g'] = g\n"
            f"spec.loader.exec_module(g)\n"
            f"with g.competing_load('cpu') as pid:\n"
            f"    print(pid, flush=True)\n"
            f"    os.kill(os.getpid(), signal.SIGKILL)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == -9, proc.stderr
    pid = int(proc.stdout.split()[0])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    os.kill(pid, 9)
    pytest.fail(f"the load process {pid} outlived the killed benchmark")


# -- end to end ------------------------------------------------------------------------


#: Measured steps of each session of the end-to-end run.
STEPS = 10


@pytest.mark.slow
@pytest.mark.timing
def test_gate_benchmark_end_to_end(tmp_path: Path) -> None:
    """One run each of no slowdown and a 4x slowdown, no load: the JSON has every run's
    outcome, and accelperf flags the 4x slowdown (50 % flaked twice in ~27 runs on a
    loaded machine: a stored baseline is hours, and machine states, away). The accelperf
    arm only: the project's environment has no pytest-benchmark (see
    gate.pytest_benchmark_path), and three sessions of one arm stay under a minute; the
    other arm's parsing is tested above. 10 measured steps a session (the benchmark's
    --steps), not 40: a 4x slowdown of ~10 ms steps is far past the 3 % tolerance either
    way, and the steps (40 ms each when slowed, trained twice when a regression is
    confirmed) held the host lock."""
    arms = ["accelperf"]
    env = {k: v for k, v in os.environ.items() if k != INJECT_ENV}
    # Beside the other xdist worker the step times are dispersed and the worker's CPU time
    # is foreign load: the recording would be stored marked noisy and every verdict against
    # it inconclusive, as it should on a shared machine. This test is about the benchmark's
    # plumbing, so its sessions (which inherit this environment) take any spread and load.
    # No profiler trace of the flagged regression (--accelperf-explain=off): 3 more steps
    # under jax.profiler, 9 s of the session's CPU, and nothing here reads it.
    env["PYTEST_ADDOPTS"] = ("--accelperf-max-probe-spread=1000 --accelperf-max-step-spread=1000 "
                             "--accelperf-max-foreign-load=64 --accelperf-explain=off")
    env = without_hypothesis(env)
    proc = subprocess.run(
        [sys.executable, str(GATE), "--runs", "1", "--slowdowns", "0,3", "--load", "none",
         "--steps", str(STEPS), "--arms", ",".join(arms), "--no-install", "--baseline-sessions",
         "2", "--out", str(tmp_path)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [path] = tmp_path.glob("gate-*.json")
    doc = json.loads(path.read_text())
    assert "benchmarks/gate.py --runs 1" in doc["command"]
    assert doc["config"]["arms"] == arms
    assert doc["record"]["stored"]["rc"] == 0
    # --baseline-sessions 2: the baseline is recorded, then one more session is added to it
    assert doc["config"]["baseline_sessions"] == 2
    assert doc["record"]["stored-session2"]["rc"] == 0
    assert "added baseline session 2 (stored)" in proc.stdout
    runs = doc["runs"]
    assert [(r["load"], r["slowdown"]) for r in runs] == [("none", 0.0), ("none", 3.0)]
    for run in runs:
        assert set(run["arms"]) == set(arms)
        assert run["session_wall_s"] > 0
        ap = run["arms"]["accelperf"]
        assert ap["verdict"] in ("pass", "regression", "inconclusive", "improvement"), ap
        assert ap["injected_slowdown"] == run["slowdown"]
        assert ap["wall_s"] > 0 and ap["measure_s"] > 0 and len(ap["step_times"]) == STEPS
    flagged = runs[1]["arms"]["accelperf"]
    assert flagged["verdict"] == "regression" and flagged["alarm"] is True, (
        flagged["detail"], flagged["unconfirmed"], flagged["raw_ratio"])
    # A margin on measured time (1.28 was seen beside CI's background jobs): marked
    # ``timing``, this test runs in CI's phase alone on the machine.
    assert flagged["ratio"] > 1.5
    rows = {(s["slowdown"], s["arm"]): s for s in doc["summary"]}
    assert rows[(3.0, "accelperf")]["alarms"] == 1
    assert rows[(3.0, "accelperf")]["alarm_ci"][1] == 1.0
    assert "load: none" in proc.stdout and "accelperf alarms [95% CI]" in proc.stdout
    assert "benchmarks/gate.py --runs 1" in next(tmp_path.glob("gate-*.md")).read_text()


@pytest.mark.slow
@pytest.mark.timing
def test_gate_benchmark_ab_mode(tmp_path: Path) -> None:
    """The A/B mode of the benchmark: a git repository whose working tree makes one case's
    step three times as slow as the base revision's, measured with --accelperf-compare."""
    env = {k: v for k, v in os.environ.items() if k != INJECT_ENV}
    # No profiler trace of the 2x case's regression: nothing here reads it.
    env["PYTEST_ADDOPTS"] = "--accelperf-explain=off"
    env = without_hypothesis(env)
    proc = subprocess.run(
        [sys.executable, str(GATE), "ab", "--runs", "1", "--slowdowns", "0,2", "--load",
         "none", "--ab-budget", "3", "--ab-tolerance", "0.2", "--ab-max-foreign-load", "64",
         "--ab-processes", "3", "--out", str(tmp_path)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [path] = tmp_path.glob("ab-*.json")
    results = {r["slowdown"]: r for r in json.loads(path.read_text())["results"]}
    # 3 process pairs, not 2: with 2 the between-process interval has 1 degree of freedom
    # (Student's t of 12.7), and in CI under -n 2 a 2x slowdown came out 0.68-5.1, inconclusive.
    # A 200 % slowdown, not 100 %: with 3 pairs in CI under -n 2 a 2x slowdown came out
    # 1.19-3.49 against a tolerance of 1.2, inconclusive (stop 40's CI). The test is about
    # the A/B wiring, not the resolving power, which benchmarks/gate.py ab measures.
    assert results[2.0]["verdict"] == "regression", results
    # A 200 % slowdown: the paired ratio is about 3. Under xdist the other worker shares the
    # two cores and the injected work stretches with it (2.78 seen in CI for a 2x), so the
    # upper bound only catches a ratio counted twice.
    assert 2.2 < results[2.0]["ratio"] < 6.0
    assert results[0.0]["verdict"] != "regression", results
    assert results[2.0]["processes"] == 3 and results[2.0]["within_sd"] is not None
    assert "A/B alarms [95% CI]" in proc.stdout


@pytest.mark.parametrize("workload", ["jax", "zero2", "gpt", "flax"])
def test_ab_repo_of_each_workload(tmp_path: Path, workload: str) -> None:
    """``--workload``'s repository, without running its session: the workload's files and
    the cases' module in the base commit with every slowdown 0, the working tree with the
    slowdowns (its only change)."""
    root = tmp_path / "repo"
    gate._ab_repo(root, [0.0, 0.05], 2, workload)
    spec = gate.AB_WORKLOADS[workload]
    for _, dest in spec.files:
        assert (root / dest).is_file(), dest
    test = root / spec.test_path
    source = test.read_text()
    ast.parse(source)
    if workload == "zero2":
        assert spec.test_path == "torch/test_ab.py"
        assert (root / "jax/data/tiny_corpus.txt").stat().st_size > 1000
        assert 'backend="deepspeed", zero_stage=2' in source and "world_size=2" in source
        assert "from gpt import make_task" in source
    elif workload == "gpt":
        assert 'backend="torch", model="gpt"' in source and "world_size" not in source
    elif workload == "flax":
        assert "from flax_cases import bn_cnn" in source and (root / "flax_cases.py").is_file()
    else:
        assert "from steptask import CASE, make_task" in source

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True,
                              check=True).stdout

    module = str(test.parent.relative_to(root) / "slowdowns.py")
    base: dict[str, Any] = {}
    exec(git("show", f"HEAD:{module}"), base)
    head: dict[str, Any] = {}
    exec((root / module).read_text(), head)
    assert base["ORDER"] == head["ORDER"] == ["s0000", "s0050"]
    assert base["REPS"] == head["REPS"] == 2
    assert base["SLOWDOWN"] == {"s0000": 0.0, "s0050": 0.0}
    assert head["SLOWDOWN"] == {"s0000": 0.0, "s0050": 0.05}
    assert git("status", "--porcelain").split() == ["M", module]
    assert git("show", "HEAD:" + spec.test_path) == source


def test_ab_case_result_and_summary() -> None:
    """A report's case as a result row (slowdown from the id's end; no throughput check:
    ``error``), and the table's false-verdict count: everything but pass/inconclusive."""
    def case(label: str, verdict: str | None, ratio: float = 1.0) -> dict[str, Any]:
        checks = [] if verdict is None else [
            {"metric": "throughput", "verdict": verdict, "detail": "d",
             "data": {"mode": "ab", "ratio": ratio, "ci": [0.9, 1.1], "rounds": 4,
                      "seconds": 4.0, "load": {"foreign_cores": 0.1}}}]
        return {"case_id": f"deepspeed-gpt-zero2-b8-{label}", "checks": checks}

    rows = [{"workload": "zero2", "load": "none", "wall_s": 9.0,
             **gate.ab_case_result(c, [0.0, 0.02])}
            for c in (case("s0000-r0", "pass", 1.01), case("s0000-r1", "improvement", 0.95),
                      case("s0000-r2", "regression", 1.04), case("s0000-r3", None),
                      case("s0020-r0", "inconclusive", 1.02))]
    assert [(r["slowdown"], r["rep"], r["verdict"]) for r in rows] == [
        (0.0, 0, "pass"), (0.0, 1, "improvement"), (0.0, 2, "regression"), (0.0, 3, "error"),
        (0.02, 0, "inconclusive")]
    assert rows[0]["foreign_cores"] == 0.1 and rows[0]["compared"] is True
    [zero, two] = gate.ab_summary(rows, "zero2", ["none"], [0.0, 0.02])
    assert zero["workload"] == "zero2" and zero["runs"] == 4
    assert zero["A/B alarms [95% CI]"].startswith("1/4 ")
    assert zero["improvement"].startswith("1/4 ")
    assert zero["not pass/inconclusive [95% CI]"].startswith("3/4 ")
    assert zero["median ratio"] == "1.010" and zero["median abs(ratio-1)"] == "0.040"
    assert two["not pass/inconclusive [95% CI]"].startswith("0/1 ")


def test_ab_rows_say_what_the_rounds_only_interval_would_have_said() -> None:
    """Each A/B result keeps its rounds and what the statistic before issue 24 (an interval
    over the rounds alone) says of them: the comparison the A/A self-test reports."""
    offset = {"base": [[1.0, 1.0, 1.01]] * 6, "head": [[1.03, 1.03, 1.04]] * 6}
    case = {"case_id": "jax-mlp-nomesh-b256-s0000-r0", "checks": [
        {"metric": "throughput", "verdict": "inconclusive", "detail": "d",
         "data": {"mode": "ab", "ratio": 1.03, "ci": [0.9, 1.2], "tolerance": 0.01,
                  "blocks": offset, "pairs": [0, 0, 1, 1, 2, 2], "processes": 3}}]}
    row = {"workload": "jax", "load": "none", "wall_s": 1.0, "session": 0,
           **gate.ab_case_result(case, [0.0])}
    assert row["rounds_only"]["verdict"] == "regression"  # 3 % with a zero-width interval
    assert row["pairs"] == [0, 0, 1, 1, 2, 2] and row["blocks"] == offset
    [summary] = gate.ab_summary([row], "jax", ["none"], [0.0])
    assert summary["rounds-only interval: regression"].startswith("1/1 ")
    assert summary["not pass/inconclusive [95% CI]"].startswith("0/1 ")
