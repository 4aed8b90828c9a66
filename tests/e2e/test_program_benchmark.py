"""The program benchmark (benchmarks/program.py): its pieces, and end to end in its smallest
configuration, where every injected regression must be caught and named."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import without_hypothesis

ROOT = Path(__file__).resolve().parents[2]
PROGRAM = ROOT / "benchmarks" / "program.py"


def _program_module() -> Any:
    spec = importlib.util.spec_from_file_location("accelperf_program_benchmark", PROGRAM)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


bench = _program_module()


# -- the benchmark's pieces --------------------------------------------------------------


def test_every_injection_targets_a_test_of_the_suite() -> None:
    assert set(bench.TARGETS.values()) <= set(bench.TESTS)
    assert set(bench.EXPECTED) == set(bench.TARGETS) == set(bench.REGRESSIONS)
    assert bench.INJECT_ENV == "ACCELPERF_BENCH_INJECT"


def test_schedule_interleaves_and_puts_the_regressions_first() -> None:
    plan = bench.schedule(["none", "cpu"], 3, 1, ["leak", "precision"])
    assert len(plan) == 2 * 3 + 2 * 2
    first = [(c.load, c.inject) for r, c in plan if r == 0]
    assert sorted(first) == sorted((load, inj) for load in ("none", "cpu")
                                   for inj in ("none", "leak", "precision"))
    assert all(c.inject == "none" for r, c in plan if r > 0)
    later = [c.load for r, c in plan if r == 1]
    assert later == ["cpu", "none"]  # rotated by the repetition
    assert bench.Condition("none", "none").tests == bench.TESTS
    assert bench.Condition("cpu", "graph_break").tests == ("test_torch_compiled",)


def test_regressions_follow_the_tests(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        bench.main(["--tests", "test_jax_step", "--regressions", "graph_break"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "--regressions graph_break: their tests (test_torch_compiled) are not in --tests" \
        in err
    plan = bench.schedule(["none"], 1, 0, [], ["test_flax_bn"])
    assert [c.tests for _, c in plan] == [("test_flax_bn",)]


def test_throughput_tolerance_alternates() -> None:
    assert [bench.tolerance_of(r, 0.05) for r in range(4)] == [0.10, 0.05, 0.10, 0.05]


def test_session_env_sets_the_injection_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCELPERF_INJECT_SLOWDOWN", "0.5")
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    env = bench.session_env("leak", 7)
    assert env["ACCELPERF_BENCH_INJECT"] == "leak" and env["ACCELPERF_BENCH_STEPS"] == "7"
    assert "ACCELPERF_INJECT_SLOWDOWN" not in env and "PYTEST_XDIST_WORKER" not in env
    assert "ACCELPERF_BENCH_STEPS" not in bench.session_env("none", None)


def test_trials_are_read_from_the_report(tmp_path: Path) -> None:
    def check(metric: str, verdict: str, detail: str = "", **data: Any) -> dict[str, Any]:
        return {"metric": metric, "verdict": verdict, "detail": detail, "data": data}

    report = {"cases": [{
        "nodeid": "test_program_cases.py::test_jax_step[jax-nomesh-b128-step]",
        "case_id": "jax-nomesh-b128-step", "error": None, "run": {"outcome": "ok"},
        "checks": [check("program", "regression", "FLOPs +59.9%; ops: dot 5 → 8",
                         changes=[{"name": "flops", "baseline": 1.0, "now": 1.6}]),
                   check("memory", "pass"),
                   check("throughput", "inconclusive", ratio=1.2, ci=[0.9, 1.5], mdc=0.3),
                   check("loss", "regression")]}]}
    path = tmp_path / "accelperf.json"
    path.write_text(json.dumps(report))
    session = bench.gate.Session(rc=1, wall_s=3.0, output="", run_dir=tmp_path,
                                 test_wall_s={"test_jax_step[jax-nomesh-b128-step]": 2.0})
    step, torch_case = bench.parse_trials(path, session, ["test_jax_step",
                                                          "test_torch_compiled"])
    assert step["program"]["alarm"] is True and step["program"]["changes"][0]["name"] == "flops"
    assert step["memory"]["alarm"] is False and step["compile"]["verdict"] is None
    assert step["throughput"]["verdict"] == "inconclusive" and step["throughput"]["ratio"] == 1.2
    assert step["other_regressions"] == ["loss"] and step["wall_s"] == 2.0
    assert torch_case["error"] and torch_case["program"]["alarm"] is None  # not "no alarm"
    assert bench.named("extra_matmul", step["program"]["detail"])
    assert not bench.named("precision", step["program"]["detail"])


# -- end to end ------------------------------------------------------------------------

#: The end-to-end run's cases and regressions: the benchmark's harness, run through with
#: the checks that catch a regression without a clock (program: XLA and torch eager; input).
#: The Flax BatchNorm case and its momentum change (numerics, the same program) are left to
#: tests/unit/backends/jax/test_step.py: with them this one test took 425 s of a CI worker
#: (6 sessions). So is the slow batch (the input check, a timing: tests/unit/checks/
#: test_input.py): with it this test judged a measured time and took a fifth session (199 s
#: of CPU for five, 2026-11-29), and no check here needs a clock.
TESTS = ("test_jax_step", "test_torch_eager_gpt")
REGRESSIONS = ("precision", "item_sync")
#: Every session without the plugin's timing re-runs, which no assertion here reads (the
#: benchmark's own --pytest-args): no re-measurement (--accelperf-confirm=0: a recording
#: measured beside other work was trained again over twice the steps, a throughput
#: regression confirmed by another training) and no explanation (--accelperf-explain=off:
#: each injected regression trained 3 more steps under jax.profiler / torch.profiler for a
#: trace, and its FLOPs counted again). Each is a training of the eager GPT-2, whose every
#: step the memory count follows under torch.profiler: on a loaded machine (load 7-13)
#: the recording session took 217 s (199 s the GPT), the item_sync session over 240 s.
#: What is asserted (the program check's verdicts, each trial's checks present) does not
#: depend on them; the throughput check still gives every trial a verdict.
PYTEST_ARGS = "--accelperf-confirm=0 --accelperf-explain=off"


@pytest.mark.slow
def test_program_benchmark_end_to_end(tmp_path: Path) -> None:
    """The smallest benchmark on two of its cases (the JAX MLP, the eager GPT-2 of a
    nanoGPT-style loop): the baselines, one unchanged session (two trials) and one session
    of each of two injected regressions, no competing load, 5 measured steps. The program
    check passes the unchanged trials and catches (and names) the precision change (XLA)
    and the host sync (torch eager)."""
    for framework in ("torch", "transformers"):  # the eager GPT-2
        pytest.importorskip(framework)
    env = without_hypothesis({k: v for k, v in os.environ.items()
                              if k not in ("ACCELPERF_BENCH_INJECT", "ACCELPERF_INJECT_SLOWDOWN")})
    proc = subprocess.run(
        [sys.executable, str(PROGRAM), "--sessions", "1", "--per-regression", "1", "--load",
         "none", "--steps", "5", "--tests", ",".join(TESTS), "--regressions",
         ",".join(REGRESSIONS), f"--pytest-args={PYTEST_ARGS}", "--out", str(tmp_path)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [path] = tmp_path.glob("program-*.json")
    doc = json.loads(path.read_text())
    assert "benchmarks/program.py --sessions 1" in doc["command"]
    assert doc["record"]["rc"] == 0
    assert doc["config"]["regressions"] == list(REGRESSIONS)
    assert doc["config"]["pytest_args"] == PYTEST_ARGS.split()
    runs = doc["runs"]
    assert sorted(r["inject"] for r in runs) == sorted(["none", *REGRESSIONS])
    for run in runs:
        assert run["load"] == "none" and run["tolerance"] == 0.10 and run["wall_s"] > 0
        tests = [t["test"] for t in run["trials"]]
        assert tests == (list(TESTS) if run["inject"] == "none"
                         else [bench.TARGETS[run["inject"]]])
        for trial in run["trials"]:
            assert not trial["error"], trial
            assert trial["outcome"] == "ok"
            for check in ("program", "memory", "throughput", "numerics"):
                assert trial[check]["verdict"] is not None, (check, trial)
    unchanged = next(r for r in runs if r["inject"] == "none")
    for trial in unchanged["trials"]:
        assert trial["program"]["verdict"] == "pass", trial["program"]
    rows = {(r["regression"], r["load"]): r for r in doc["regressions"]}
    for inject in REGRESSIONS:
        check = bench.EXPECTED[inject][0]
        row = rows[(inject, "none")]
        assert row[check]["caught"] == row[check]["decided"] == 1, (inject, row)
        assert row[check]["named"] == 1, (inject, row[check]["messages"])
        assert rows[(inject, "all")]["trials"] == 1
    fa = {(r["load"], r["check"]): r for r in doc["false_alarms"]}
    assert fa[("none", "program")]["trials"] == len(TESTS)
    assert fa[("none", "program")]["alarms"] == 0
    assert fa[("none", "program")]["alarm_ci"][0] == 0.0
    assert "False alarms over the unchanged trials" in proc.stdout
    assert "| item_sync" in proc.stdout and "dot[highest]" in proc.stdout
    md = next(tmp_path.glob("program-*.md")).read_text()
    assert "benchmarks/program.py --sessions 1" in md
