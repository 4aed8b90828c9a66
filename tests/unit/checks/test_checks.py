"""Every verdict of every check, on runs built by hand and baselines edited to disagree."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from pytest_accelperf.checks import NO_BASELINE, run_checks
from pytest_accelperf.checks.convergence import check_convergence
from pytest_accelperf.checks.memory import check_memory
from pytest_accelperf.checks.numerics import ReferenceParams, check_numerics, check_reference
from pytest_accelperf.checks.outcome import check_outcome
from pytest_accelperf.checks.summary import summarize
from pytest_accelperf.checks.throughput import check_throughput, spread
from pytest_accelperf.records.environment import Environment
from pytest_accelperf.records.fingerprint import compact
from pytest_accelperf.records.run import Run
from pytest_accelperf.records.verdict import CheckResult, Tolerances, Verdict
from pytest_accelperf.stats.units import fmt_bytes

MiB = 2**20
GiB = 2**30
TOL = Tolerances()


def noisy(n: int, center: float, noise: float, seed: int) -> list[float]:
    rng = np.random.default_rng(seed)
    return [float(x) for x in center * np.abs(1 + noise * rng.standard_normal(n))]


def fingerprint() -> dict[str, Any]:
    return {
        "params/b": {"shape": [8], "dtype": "float32", "rms": 0.01, "sample": [0.01, -0.02]},
        "params/w": {"shape": [32, 8], "dtype": "float32", "rms": 0.5,
                     "sample": [0.1, -0.2, 0.3, 0.4]},
    }


def make_run(**overrides: Any) -> Run:
    """A finished two-device run: 30 step times of ~10 ms (2% noise), 100 decreasing losses."""
    fields: dict[str, Any] = {
        "case_id": "jax-mesh2x1-b32",
        "samples_per_step": 32,
        "n_devices": 2,
        "step_times": noisy(30, 0.010, 0.02, seed=0),
        "compile_time": 0.5,
        "losses": [2.0 * 0.98**i for i in range(100)],
        "loss_steps": list(range(100)),
        "memory_per_device": {"cpu:0": 100 * MiB, "cpu:1": 120 * MiB},
        "memory_source": "memory_analysis",
        "params_fingerprint": fingerprint(),
        "environment": Environment.from_json({"host_cpu": "Test CPU"}),
    }
    fields.update(overrides)
    return Run(**fields)


def oom_run(**overrides: Any) -> Run:
    fields: dict[str, Any] = {
        "outcome": "oom", "message": "predicted out of memory",
        "step_times": [], "losses": [], "loss_steps": [], "params_fingerprint": {},
        "memory_per_device": {"cpu:0": 100 * MiB, "cpu:1": 120 * MiB},
        "oom": {"required_bytes": int(20.93 * GiB), "capacity_bytes": int(15.48 * GiB)},
    }
    fields.update(overrides)
    return make_run(**fields)


def stored(run: Run) -> dict[str, Any]:
    """The baseline block of ``run`` as it comes back from the JSON file."""
    block: dict[str, Any] = json.loads(json.dumps(summarize(run).to_json()))
    return block


def edited(run: Run, fn: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    block = stored(run)
    fn(block)
    return block


def checks(run: Run, baseline: dict[str, Any] | None, tol: Tolerances = TOL,
           **kwargs: Any) -> dict[str, CheckResult]:
    kwargs.setdefault("comparable", True)
    results = run_checks(run, summarize(run), baseline, tol, **kwargs)
    assert len({r.metric for r in results}) == len(results), "one result per metric"
    for r in results:
        assert r.detail, f"{r.metric} has no detail"
        json.dumps(r.to_json())  # reports stay JSON
    return {r.metric: r for r in results}


# -- run_checks: the set of checks --------------------------------------------------------

def test_identical_run_passes_every_check() -> None:
    run = make_run()
    got = checks(run, stored(run))
    assert list(got) == ["outcome", "throughput", "loss", "compile", "memory", "numerics"]
    assert {m: r.verdict for m, r in got.items()} == dict.fromkeys(got, Verdict.PASS)
    assert got["outcome"].detail == "finished as in the baseline"


def test_no_baseline_is_new_for_every_metric() -> None:
    got = checks(make_run(), None)
    assert list(got) == ["outcome", "throughput", "loss", "compile", "memory", "numerics"]
    for r in got.values():
        assert r.verdict is Verdict.NEW
        assert r.detail == NO_BASELINE == "no baseline; run with --accelperf-update to record it"
    assert got["throughput"].now == pytest.approx(make_run().samples_per_second)
    assert got["loss"].now == pytest.approx(2.0 * 0.98**99)
    assert got["memory"].now == 120 * MiB


def test_block_is_computed_when_not_given() -> None:
    run = make_run()
    results = run_checks(run, None, stored(run), TOL, comparable=True)
    assert {r.verdict for r in results} == {Verdict.PASS}


def test_checks_never_mutate_their_inputs() -> None:
    run = make_run()
    cases = [
        (make_run(), stored(run)),
        (make_run(step_times=noisy(30, 0.02, 0.02, seed=1)), stored(run)),
        (oom_run(), stored(oom_run())),
        (make_run(outcome="nan", nan_step=3), stored(run)),
        (make_run(), None),
    ]
    params = {"w": np.ones((4, 2), np.float32)}
    reference = {"w": np.full((4, 2), 1.1, np.float32)}
    for now, baseline in cases:
        block = summarize(now).to_json()
        before = (copy.deepcopy(now), copy.deepcopy(block), copy.deepcopy(baseline))
        run_checks(now, block, baseline, TOL, comparable=True, params=params,
                   reference_params=reference)
        assert (now, block, baseline) == before
    assert np.array_equal(params["w"], np.ones((4, 2))) and reference["w"][0, 0] == np.float32(1.1)


# -- outcome ------------------------------------------------------------------------------

def test_both_out_of_memory_passes_with_the_numbers() -> None:
    got = checks(oom_run(), stored(oom_run()))
    assert list(got) == ["outcome", "memory"]
    out = got["outcome"]
    assert out.verdict is Verdict.PASS
    assert out.detail == "out of memory as in the baseline: needs 20.93 GiB of 15.48 GiB"
    assert out.unit == "bytes" and out.now == out.baseline == int(20.93 * GiB)
    assert got["memory"].verdict is Verdict.PASS


@pytest.mark.parametrize(("outcome", "message", "words"), [
    ("oom", "predicted out of memory", "out of memory: needs 20.93 GiB of 15.48 GiB where the "
                                       "baseline fit in memory"),
    ("error", "RuntimeError: boom", "failed with an error where the baseline finished "
                                    "(RuntimeError: boom)"),
    ("timeout", "exceeded 600 s", "timed out where the baseline finished (exceeded 600 s)"),
    ("nan", "loss is nan", "loss became nan at step 17 where the baseline finished"),
])
def test_a_failure_against_a_finished_baseline_is_a_regression(
        outcome: str, message: str, words: str) -> None:
    kwargs: dict[str, Any] = {"outcome": outcome, "message": message}
    if outcome == "nan":
        kwargs["nan_step"] = 17
    now = oom_run(**kwargs) if outcome == "oom" else make_run(**kwargs, memory_per_device={})
    got = checks(now, stored(make_run()))
    assert got["outcome"].verdict is Verdict.REGRESSION
    assert words in got["outcome"].detail
    assert "throughput" not in got and "numerics" not in got


def test_fitting_where_the_baseline_ran_out_of_memory_is_an_improvement() -> None:
    got = checks(make_run(), stored(oom_run()))
    assert got["outcome"].verdict is Verdict.IMPROVEMENT
    assert "out of memory: needs 20.93 GiB of 15.48 GiB" in got["outcome"].detail
    assert got["outcome"].baseline == int(20.93 * GiB) and got["outcome"].now is None
    # The OOM baseline has no step times, loss or fingerprint: nothing to compare yet.
    for metric in ("throughput", "loss", "numerics"):
        assert got[metric].verdict is Verdict.NEW
        assert "the baseline (out of memory) has no" in got[metric].detail
    assert got["memory"].verdict is Verdict.PASS


def test_failing_where_the_baseline_ran_out_of_memory_is_a_regression() -> None:
    got = checks(make_run(outcome="timeout", message="exceeded 600 s"), stored(oom_run()))
    assert got["outcome"].verdict is Verdict.REGRESSION
    assert got["outcome"].detail.startswith("timed out; the baseline: out of memory")


def test_out_of_memory_without_a_baseline_is_new() -> None:
    got = checks(oom_run(), None)
    assert list(got) == ["outcome", "memory"]
    assert {r.verdict for r in got.values()} == {Verdict.NEW}
    assert got["outcome"].now == int(20.93 * GiB)


def test_a_failure_without_a_baseline_never_passes() -> None:
    got = checks(make_run(outcome="error", message="ValueError: x", memory_per_device={}), None)
    assert got["outcome"].verdict is Verdict.REGRESSION
    assert "ValueError: x" in got["outcome"].detail


def test_a_baseline_that_records_a_failure_is_incomparable() -> None:
    baseline = edited(oom_run(), lambda b: b.update(outcome="error"))
    result = check_outcome(oom_run(), summarize(oom_run()), baseline)
    assert result.verdict is Verdict.INCOMPARABLE
    assert "re-record" in result.detail


# -- NaN ----------------------------------------------------------------------------------

@pytest.mark.parametrize("has_baseline", [True, False])
def test_nan_loss_is_a_regression_naming_the_step(has_baseline: bool) -> None:
    losses = [1.0] * 17 + [float("nan")] * 3
    run = make_run(outcome="nan", message="loss is nan at step 17", nan_step=17,
                   losses=losses, loss_steps=list(range(20)))
    got = checks(run, stored(make_run()) if has_baseline else None)
    assert list(got) == ["outcome", "loss", "memory"]
    assert got["loss"].verdict is Verdict.REGRESSION
    assert got["loss"].detail == "loss is nan at step 17"
    assert got["loss"].data["nan_step"] == 17
    assert got["outcome"].verdict is Verdict.REGRESSION


def test_nan_step_is_found_in_the_losses_when_not_given() -> None:
    run = make_run(outcome="nan", losses=[1.0, 0.9, float("inf")], loss_steps=[10, 11, 12])
    result = check_convergence(run, summarize(run), None, TOL)
    assert result is not None and result.detail == "loss is inf at step 12"


# -- throughput ---------------------------------------------------------------------------

def test_throughput_pass_shows_samples_per_second() -> None:
    base = make_run()
    now = make_run(step_times=noisy(30, 0.010, 0.02, seed=1))
    r = checks(now, stored(base))["throughput"]
    assert r.verdict is Verdict.PASS
    assert r.unit == "samples/s"
    assert r.baseline == pytest.approx(base.samples_per_second, rel=1e-5)
    assert r.now == pytest.approx(now.samples_per_second)
    assert r.now is not None and r.baseline is not None
    assert r.change == pytest.approx(r.now / r.baseline - 1)
    assert r.detail.startswith("within tolerance: step time ")
    assert set(r.data) >= {"ratio", "ci", "mdc", "tolerance", "n"}
    assert r.data["n"] == {"now": 30, "baseline": 30}


def test_twice_as_slow_is_a_regression_at_tolerance_half() -> None:
    base = make_run(step_times=noisy(30, 0.010, 0.10, seed=2))
    now = make_run(step_times=noisy(30, 0.020, 0.10, seed=3))
    r = checks(now, stored(base), Tolerances(throughput_tolerance=0.5))["throughput"]
    assert r.verdict is Verdict.REGRESSION
    low, high = r.data["ci"]
    assert 1 < low <= r.data["ratio"] <= high
    assert r.change is not None and r.change == pytest.approx(-0.5, abs=0.1)
    tp = (1 / r.data["ratio"] - 1) * 100
    pct = f"slower: step time {(r.data['ratio'] - 1) * 100:.1f}% longer, throughput {tp:+.1f}%"
    assert r.detail == (f"{pct} (95% CI of step-time ratio {low:.2f}\u2013{high:.2f}, "
                        f"tolerance 50%)")


def test_three_times_as_fast_is_an_improvement() -> None:
    base = make_run()
    now = make_run(step_times=[t / 3 for t in base.step_times])
    r = checks(now, stored(base), Tolerances(throughput_tolerance=0.5))["throughput"]
    assert r.verdict is Verdict.IMPROVEMENT
    assert r.detail.startswith("step time 66.7% shorter, throughput +200.0% (95% CI of step")
    assert r.change == pytest.approx(2.0, rel=1e-3)


def test_noise_beyond_tolerance_is_inconclusive() -> None:
    rng = np.random.default_rng(4)
    base = make_run(step_times=[float(x) for x in rng.lognormal(np.log(0.01), 0.8, 10)])
    now = make_run(step_times=[float(x) for x in rng.lognormal(np.log(0.01), 0.8, 10)])
    r = checks(now, stored(base))["throughput"]
    assert r.verdict is Verdict.INCONCLUSIVE
    assert r.detail.startswith("noise too large to resolve ±10%: smallest detectable change "
                               f"here is ±{r.data['mdc'] * 100:.1f}%")
    assert r.data["mdc"] > 0.10


def test_another_environment_is_incomparable() -> None:
    base = make_run()
    now = make_run(step_times=[t / 10 for t in base.step_times])
    r = checks(now, stored(base), comparable=False)["throughput"]
    assert r.verdict is Verdict.INCOMPARABLE
    assert r.detail.startswith("baseline recorded in another environment")
    assert "ratio" not in r.data


def test_a_different_batch_is_incomparable() -> None:
    r = checks(make_run(samples_per_step=64), stored(make_run()))["throughput"]
    assert r.verdict is Verdict.INCOMPARABLE
    assert "32 samples per step, this run 64" in r.detail


def test_too_few_step_times_are_inconclusive() -> None:
    r = checks(make_run(step_times=[0.01, 0.01]), stored(make_run()))["throughput"]
    assert r.verdict is Verdict.INCONCLUSIVE
    assert "at least 3" in r.detail


def test_unknown_batch_shows_step_time() -> None:
    base = make_run(samples_per_step=0)
    r = checks(make_run(samples_per_step=0), stored(base))["throughput"]
    assert r.unit == "s" and r.now == pytest.approx(make_run().median_step_time)


def test_no_step_times_anywhere_means_no_throughput_check() -> None:
    run = make_run(step_times=[])
    assert check_throughput(run, summarize(run), stored(run), TOL) is None


# -- convergence --------------------------------------------------------------------------

def scale_checkpoints(factor: float, *, from_step: float = 0.0,
                      final: float | None = None) -> Callable[[dict[str, Any]], None]:
    def edit(block: dict[str, Any]) -> None:
        loss = block["loss"]
        loss["checkpoints"] = [[s, v * factor if s >= from_step else v]
                               for s, v in loss["checkpoints"]]
        if final is not None:
            loss["final"] *= final
    return edit


def test_loss_within_band_passes() -> None:
    run = make_run()
    r = check_convergence(run, summarize(run), edited(run, scale_checkpoints(1.04)), TOL)
    assert r is not None and r.verdict is Verdict.PASS
    assert r.detail.startswith("all 10 checkpoints within the band (rtol 5%, atol 0.001)")
    assert r.baseline == r.now == pytest.approx(2.0 * 0.98**99)
    assert len(r.data["checkpoints"]) == 10


def test_loss_above_band_is_a_regression_at_the_first_step() -> None:
    run = make_run()
    baseline = edited(run, scale_checkpoints(0.5, from_step=59))
    r = check_convergence(run, summarize(run), baseline, TOL)
    assert r is not None and r.verdict is Verdict.REGRESSION
    assert r.detail.startswith("loss at step 59 is ")
    assert "above the baseline's" in r.detail and "(rtol 5%, atol 0.001)" in r.detail
    assert r.data["step"] == 59


def test_final_loss_above_band_is_a_regression() -> None:
    run = make_run()
    r = check_convergence(run, summarize(run), edited(run, scale_checkpoints(1.0, final=0.8)),
                          TOL)
    assert r is not None and r.verdict is Verdict.REGRESSION
    assert r.detail.startswith("final loss is ")


def test_lower_final_loss_is_an_improvement() -> None:
    run = make_run()
    r = check_convergence(run, summarize(run), edited(run, scale_checkpoints(1.0, final=1.5)),
                          TOL)
    assert r is not None and r.verdict is Verdict.IMPROVEMENT
    assert r.change == pytest.approx(1 / 1.5 - 1, rel=1e-4)


def test_lower_loss_part_way_that_ends_in_the_band_passes() -> None:
    run = make_run()
    r = check_convergence(run, summarize(run), edited(run, scale_checkpoints(2.0)), TOL)
    assert r is not None and r.verdict is Verdict.PASS


def test_band_is_atol_plus_rtol_times_baseline() -> None:
    run = make_run(losses=[1.0] * 10)
    tol = Tolerances(loss_rtol=0.1, loss_atol=0.05)  # band 0.15 around 1.0
    inside = edited(run, scale_checkpoints(1 / 1.14, final=1 / 1.14))
    outside = edited(run, scale_checkpoints(1 / 1.16))
    for baseline, verdict in ((inside, Verdict.PASS), (outside, Verdict.REGRESSION)):
        r = check_convergence(run, summarize(run), baseline, tol)
        assert r is not None and r.verdict is verdict


def test_a_different_curve_length_is_incomparable() -> None:
    run = make_run()
    shorter = make_run(losses=run.losses[:50], loss_steps=run.loss_steps[:50])
    r = check_convergence(run, summarize(run), stored(shorter), TOL)
    assert r is not None and r.verdict is Verdict.INCOMPARABLE
    assert r.detail == "loss curve has 100 steps, baseline 50; re-record with --accelperf-update"


def test_shifted_checkpoint_steps_are_incomparable() -> None:
    run = make_run()
    shifted = make_run(loss_steps=[s + 1 for s in run.loss_steps])
    r = check_convergence(run, summarize(run), stored(shifted), TOL)
    assert r is not None and r.verdict is Verdict.INCOMPARABLE
    assert "differ from the baseline's" in r.detail


def test_no_losses_anywhere_means_no_loss_check() -> None:
    run = make_run(losses=[], loss_steps=[])
    assert check_convergence(run, summarize(run), stored(run), TOL) is None


# -- memory -------------------------------------------------------------------------------

def scale_memory(factors: dict[str, float]) -> Callable[[dict[str, Any]], None]:
    def edit(block: dict[str, Any]) -> None:
        mem = block["memory"]
        mem["per_device"] = {k: int(v * factors.get(k, 1.0)) for k, v in mem["per_device"].items()}
        mem["peak"] = max(mem["per_device"].values())
    return edit


def memory(baseline: dict[str, Any] | None, run: Run | None = None,
           tol: Tolerances = TOL) -> CheckResult:
    run = run or make_run()
    result = check_memory(summarize(run), baseline, tol)
    assert result is not None
    return result


def test_memory_within_tolerance_passes() -> None:
    r = memory(edited(make_run(), scale_memory({"cpu:1": 1 / 1.05})))
    assert r.verdict is Verdict.PASS
    assert r.detail == "peak memory within 10% on all 2 devices (largest change +5.0% on cpu:1)"
    assert r.data["per_device"]["cpu:0"] == {"baseline": 100 * MiB, "now": 100 * MiB,
                                             "ratio": 1.0}


def test_memory_growth_on_one_device_is_a_regression_naming_it() -> None:
    # cpu:0 doubles but stays below cpu:1: the peak over devices would hide it.
    r = memory(edited(make_run(), scale_memory({"cpu:0": 0.5})))
    assert r.verdict is Verdict.REGRESSION
    assert r.detail == ("peak memory on cpu:0 is 100.00 MiB, baseline 50.00 MiB (+100.0%, "
                        "tolerance 10%); 1 of 2 devices over: cpu:0")
    assert r.data["device"] == "cpu:0"
    assert r.baseline == r.now == 120 * MiB


def test_memory_regression_names_the_worst_device() -> None:
    r = memory(edited(make_run(), scale_memory({"cpu:0": 0.8, "cpu:1": 0.5})))
    assert r.verdict is Verdict.REGRESSION
    assert r.detail.startswith("peak memory on cpu:1 is 120.00 MiB, baseline 60.00 MiB")
    assert "2 of 2 devices over: cpu:0, cpu:1" in r.detail


def test_memory_shrinking_everywhere_is_an_improvement() -> None:
    r = memory(edited(make_run(), scale_memory({"cpu:0": 2.0, "cpu:1": 1.5})))
    assert r.verdict is Verdict.IMPROVEMENT
    assert r.detail.startswith("peak memory down by at least 33.3% on all 2 devices (least on "
                               "cpu:1: 120.00 MiB, baseline 180.00 MiB; tolerance 10%)")
    assert r.change == pytest.approx(120 / 200 - 1, rel=1e-6)  # peak over devices


def test_memory_shrinking_on_one_device_only_passes() -> None:
    r = memory(edited(make_run(), scale_memory({"cpu:0": 2.0})))
    assert r.verdict is Verdict.PASS


def test_different_devices_are_incomparable() -> None:
    wider = make_run(memory_per_device={f"cpu:{i}": 100 * MiB for i in range(8)})
    r = memory(stored(make_run()), wider)
    assert r.verdict is Verdict.INCOMPARABLE
    assert "only now: cpu:2, cpu:3, cpu:4, cpu:5, … (6 in all)" in r.detail


def test_a_different_memory_source_is_incomparable() -> None:
    r = memory(stored(make_run(memory_source="memory_stats")))
    assert r.verdict is Verdict.INCOMPARABLE
    assert "memory_analysis" in r.detail and "memory_stats" in r.detail


def test_memory_new_and_absent() -> None:
    assert memory(None).verdict is Verdict.NEW
    none = make_run(memory_per_device={})
    assert check_memory(summarize(none), stored(none), TOL) is None
    r = memory(stored(none))
    assert r.verdict is Verdict.NEW and "has no memory record" in r.detail
    r = memory(stored(make_run()), none)
    assert r.verdict is Verdict.INCOMPARABLE


def test_fmt_bytes() -> None:
    assert fmt_bytes(int(20.93 * GiB)) == "20.93 GiB"
    assert fmt_bytes(100 * MiB) == "100.00 MiB"
    assert fmt_bytes(1023) == "1023 B"
    assert fmt_bytes(2**20 - 1) == "1.00 MiB"


# -- numerics -----------------------------------------------------------------------------

def numerics(baseline: dict[str, Any] | None, run: Run | None = None,
             tol: Tolerances = TOL) -> CheckResult:
    run = run or make_run()
    result = check_numerics(summarize(run), baseline, tol)
    assert result is not None
    return result


def test_matching_fingerprint_passes() -> None:
    def nudge(block: dict[str, Any]) -> None:
        block["numerics"]["params/w"]["sample"][0] += 1e-6
    r = numerics(edited(make_run(), nudge))
    assert r.verdict is Verdict.PASS
    assert r.baseline is None and r.unit == "max |Δ|"
    assert r.now == pytest.approx(1e-6)
    assert r.detail.startswith("fingerprints of 2 parameter leaves match the baseline")


def test_changed_values_are_a_regression_naming_the_worst_leaf() -> None:
    def change(block: dict[str, Any]) -> None:
        block["numerics"]["params/w"]["sample"][1] += 0.5
        block["numerics"]["params/b"]["rms"] += 0.01
    r = numerics(edited(make_run(), change))
    assert r.verdict is Verdict.REGRESSION
    assert r.detail.startswith("params/w differs from the baseline fingerprint: max |Δ| = 0.5 ")
    assert r.detail.endswith("2 of 2 leaves differ")
    assert r.now == pytest.approx(0.5)


@pytest.mark.parametrize(("edit", "words"), [
    (lambda fp: fp.pop("params/b"), "parameter structure changed: added params/b (8,) float32"),
    (lambda fp: fp.update({"params/x": fp["params/b"]}), "removed params/x (8,) float32"),
    (lambda fp: fp["params/w"].update(shape=[16, 8]), "params/w shape (16, 8) → (32, 8)"),
    (lambda fp: fp["params/w"].update(dtype="bfloat16"), "params/w dtype bfloat16 → float32"),
])
def test_changed_structure_is_a_regression(edit: Callable[[dict[str, Any]], None],
                                           words: str) -> None:
    r = numerics(edited(make_run(), lambda b: edit(b["numerics"])))
    assert r.verdict is Verdict.REGRESSION
    assert words in r.detail


def test_another_environment_compares_numerics_at_the_cross_tolerance() -> None:
    """Intel vs AMD kernels: 1.9e-3 apart after 42 Adam steps. Within the cross-environment
    tolerance when the baseline came from another host; a real change still fails."""
    def drift(block: dict[str, Any]) -> None:
        block["numerics"]["params/w"]["sample"][0] += 1.9e-3

    def change(block: dict[str, Any]) -> None:
        block["numerics"]["params/w"]["sample"][0] += 0.05

    same = checks(make_run(), edited(make_run(), drift))["numerics"]
    assert same.verdict is Verdict.REGRESSION
    cross = checks(make_run(), edited(make_run(), drift), comparable=False)["numerics"]
    assert cross.verdict is Verdict.PASS
    assert "cross-environment tolerance" in cross.detail
    assert cross.data["atol"] == TOL.numerics_cross_atol
    real = checks(make_run(), edited(make_run(), change), comparable=False)["numerics"]
    assert real.verdict is Verdict.REGRESSION
    assert "cross-environment tolerance" in real.detail


def test_a_different_sample_size_is_incomparable() -> None:
    r = numerics(edited(make_run(), lambda b: b["numerics"]["params/w"]["sample"].pop()))
    assert r.verdict is Verdict.INCOMPARABLE


def test_a_compact_baseline_is_compared_with_this_runs_sketch() -> None:
    """The store keeps one sketch value per leaf; the run's per-leaf fingerprint is
    compacted to compare with it, and a failing leaf is named by the run's path."""
    def sketched(fp: dict[str, Any], w: float = 0.3) -> dict[str, Any]:
        return {p: {**leaf, "sketch": w if p == "params/w" else -1.2} for p, leaf in fp.items()}

    run = make_run(params_fingerprint=sketched(fingerprint()))
    base = {**stored(run), "numerics": compact(run.params_fingerprint)}
    r = numerics(base, run)
    assert r.verdict is Verdict.PASS and r.data["format"] == "compact"
    assert r.detail.startswith("fingerprints of 2 parameter leaves match the baseline")
    flipped = make_run(params_fingerprint=sketched(fingerprint(), -0.3))  # a sign flip
    r = numerics(base, flipped)
    assert r.verdict is Verdict.REGRESSION
    assert r.detail.startswith("params/w differs from the baseline fingerprint")
    assert r.data["failing"] == ["params/w"]
    cross = check_numerics(summarize(flipped), base, TOL, same_environment=False)
    assert cross is not None and cross.verdict is Verdict.REGRESSION


def test_numerics_new_and_absent() -> None:
    assert numerics(None).verdict is Verdict.NEW
    bare = make_run(params_fingerprint={})
    assert check_numerics(summarize(bare), stored(bare), TOL) is None


# -- reference ----------------------------------------------------------------------------

def params(offset: float = 0.0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {"params/w": rng.normal(size=(32, 8)).astype(np.float32) + np.float32(offset),
            "params/b": np.zeros(8, np.float32)}


def test_reference_match_passes_without_a_baseline() -> None:
    now = params()
    now["params/b"] = now["params/b"] + np.float32(1e-3)
    got = checks(make_run(), None, params=now, reference_params=params())
    r = got["reference"]
    assert r.verdict is Verdict.PASS
    assert r.detail.startswith("parameters match the single-device reference within "
                               "atol=0.005 (largest |Δ| 0.001")
    assert r.detail.endswith(" in params/b)")
    assert r.now == pytest.approx(1e-3)


def test_reference_after_steps_says_what_was_compared() -> None:
    """A :class:`ReferenceParams` carries the run's parameters after the same steps: those
    are compared, not the final ones, and the detail says after how many, on which mesh."""
    final = params(offset=1.0)  # far from the reference: not what is compared
    early = params()
    early["params/b"][0] += np.float32(3e-7)
    ref = ReferenceParams(params(), compared=early, steps=1, mesh="4x2")
    r = checks(make_run(), None, params=final, reference_params=ref)["reference"]
    assert r.verdict is Verdict.PASS
    assert r.detail.startswith("parameters after 1 step on the 4x2 mesh match the "
                               "single-device reference within atol=0.005 (largest |Δ| 3")
    assert r.detail.endswith(" in params/b)") and r.data["steps"] == 1
    early["params/w"][1, :2] += np.float32(0.1)
    r = check_reference(final, ref, TOL)
    assert r.verdict is Verdict.REGRESSION
    assert r.detail.startswith("params/w differs from the single-device reference after 1 "
                               "step: max |Δ| = 0.1")
    many = ReferenceParams(params(), compared=params(), steps=32, mesh="8x1")
    r = check_reference(final, many, TOL)
    assert r.verdict is Verdict.PASS
    assert r.detail.startswith("parameters after 32 steps on the 8x1 mesh match ")
    assert r.detail.endswith("; compared after 32 steps (reference_steps): rounding "
                             "differences between the two programs grow with every step")
    # Without what to compare (a reference that trained every step), the final parameters.
    assert check_reference(final, ReferenceParams(params()), TOL).verdict is Verdict.REGRESSION


def test_reference_whose_parameters_never_moved_cannot_pass() -> None:
    """Issue 23: parameters that did not move beyond the tolerance from where they started
    (a schedule at learning rate 0) match the reference whatever the sharding did: that is
    ``inconclusive`` with the reason, not a pass. The state beside the parameters (a step
    counter always moves) does not count as moving; a mismatch still fails."""
    start = params()
    after = {**params(), "step": np.asarray(3)}
    after["params/w"] = after["params/w"] + np.float32(1e-4)
    ref = ReferenceParams(after, compared=dict(after), steps=3, mesh="8x1",
                          state={"step"}, initial=start)
    r = check_reference(None, ref, TOL)
    assert r.verdict is Verdict.INCONCLUSIVE, r.detail
    assert r.detail.startswith("the parameters did not move beyond atol=0.005 in 3 steps "
                               "(largest move 0.0001 in params/w, of 2 parameter leaves; "
                               "learning rate 0 at the start of the schedule?)"), r.detail
    assert r.detail.endswith("raise reference_steps past the warm-up")
    moved = ReferenceParams(after, compared=dict(after), steps=3, mesh="8x1", state={"step"},
                            initial={**start, "params/b": start["params/b"] - 0.01})
    assert check_reference(None, moved, TOL).verdict is Verdict.PASS
    wrong = {**after, "params/b": after["params/b"] + 0.1}
    bad = ReferenceParams(after, compared=wrong, steps=3, mesh="8x1", state={"step"},
                          initial=start)
    assert check_reference(None, bad, TOL).verdict is Verdict.REGRESSION


def test_reference_mismatch_names_leaf_and_count() -> None:
    now = params()
    now["params/w"][0, :3] += np.float32(0.1)
    r = check_reference(now, params(), TOL)
    assert r.verdict is Verdict.REGRESSION
    assert r.detail.startswith("params/w differs from the single-device reference: max |Δ| = 0.1")
    assert "3 of 264 elements (1.1%) mismatched in 1 of 2 leaves" in r.detail
    assert r.data["mismatched"] == 3 and r.data["total"] == 264


def test_reference_uses_allclose_semantics() -> None:
    ref = {"x": np.array([100.0, 1.0])}
    close = {"x": np.array([100.5, 1.0])}
    assert check_reference(close, ref, Tolerances(reference_atol=0.0, reference_rtol=0.01)
                           ).verdict is Verdict.PASS
    assert check_reference(close, ref, Tolerances(reference_atol=0.1, reference_rtol=0.0)
                           ).verdict is Verdict.REGRESSION
    nan = {"x": np.array([np.nan, 1.0])}
    r = check_reference(nan, ref, TOL)
    assert r.verdict is Verdict.REGRESSION and "max |Δ| = nan" in r.detail


def test_reference_structure_and_missing_params() -> None:
    now = params()
    now["params/w"] = now["params/w"][:16]
    r = check_reference(now, params(), TOL)
    assert r.verdict is Verdict.REGRESSION
    assert "params/w shape (32, 8) → (16, 8)" in r.detail
    assert check_reference(None, params(), TOL).verdict is Verdict.INCONCLUSIVE
    # bf16 against f32 is compared by value, not called a structural change
    assert check_reference({"b": np.zeros(3, np.float16)}, {"b": np.zeros(3)},
                           TOL).verdict is Verdict.PASS


def test_reference_is_skipped_for_a_run_that_did_not_finish() -> None:
    got = checks(oom_run(), None, params={}, reference_params=params())
    assert "reference" not in got


# -- drift correction -----------------------------------------------------------------------

PROBE = "jax-cpu-matmul256x8"


def probed(step: float, probe: float, probe_noise: float = 0.02, seed: int = 0) -> Run:
    return make_run(step_times=noisy(30, step, 0.02, seed=seed),
                    probe_times=noisy(30, probe, probe_noise, seed=seed + 100), probe_kind=PROBE)


def test_a_machine_slower_for_everything_passes_when_drift_corrected() -> None:
    base, now = probed(0.010, 0.004), probed(0.020, 0.008, seed=1)  # both 2x: the machine
    r = checks(now, stored(base), Tolerances(throughput_tolerance=0.1))["throughput"]
    assert r.verdict is Verdict.PASS, r.detail
    assert r.data["drift_corrected"] is True
    assert r.data["ratio"] == pytest.approx(1.0, abs=0.05)
    assert r.data["raw_ratio"] == pytest.approx(2.0, rel=0.05)
    assert r.change == pytest.approx(0.0, abs=0.05)
    assert "[drift-corrected by the jax-cpu-matmul256x8 probe; raw step time +" in r.detail


def test_a_slower_step_on_a_steady_machine_is_a_regression_when_drift_corrected() -> None:
    base, now = probed(0.010, 0.004), probed(0.020, 0.004, seed=1)
    r = checks(now, stored(base), Tolerances(throughput_tolerance=0.1))["throughput"]
    assert r.verdict is Verdict.REGRESSION
    assert r.data["ratio"] == pytest.approx(2.0, rel=0.05)


def test_a_short_case_whose_probe_is_unsteady_is_judged_on_its_step_times() -> None:
    """Issue 24: Flax MNIST's short `[nomesh-b64]` case timed its drift probe at IQR 64-78 %
    of its median on an idle machine while its steps were steady, and was never judged
    again (`not judged, ...`). An unsteady probe, in this run or in the baseline's, now
    only turns drift correction off: the raw step times give the verdict, at the default
    --accelperf-max-probe-spread, and the detail says the correction was off and why."""
    tol = Tolerances(throughput_tolerance=0.1)  # max_probe_spread left at its default
    assert tol.max_probe_spread == 0.5
    base = probed(0.0012, 0.004, probe_noise=0.5)  # a 1.2 ms step, its probe at IQR ~70 %
    assert 0.5 < spread(base.probe_times) < 0.9
    runs = {"unchanged": (probed(0.0012, 0.004, probe_noise=0.5, seed=1), Verdict.PASS),
            "slower": (probed(0.0024, 0.004, probe_noise=0.5, seed=2), Verdict.REGRESSION),
            "faster": (probed(0.0006, 0.004, probe_noise=0.5, seed=3), Verdict.IMPROVEMENT)}
    for what, (now, verdict) in runs.items():
        r = checks(now, stored(base), tol)["throughput"]
        assert r.verdict is verdict, (what, r.detail)
        assert not r.detail.startswith("not judged"), r.detail
        assert r.data["drift_corrected"] is False and not r.data["contaminated"]
        assert ("[drift correction off: this run's jax-cpu-matmul256x8 probe varied by IQR "
                in r.detail), r.detail
        assert "of its median (bound 25%); raw step times compared]" in r.detail
    # A steady probe now, an unsteady one in the baseline: the same, and it says whose.
    r = checks(probed(0.0024, 0.004, seed=4), stored(base), tol)["throughput"]
    assert r.verdict is Verdict.REGRESSION, r.detail
    assert r.data["drift_corrected"] is False and not r.data["contaminated"]
    assert ("[drift correction off: the baseline's jax-cpu-matmul256x8 probe varied by IQR "
            in r.detail), r.detail
    assert ("raw step times compared, and will be for this case until it is re-recorded]"
            in r.detail)


def test_step_times_far_more_dispersed_than_the_baseline_s_are_not_judged() -> None:
    base = probed(0.010, 0.004)
    rng = np.random.default_rng(3)
    wild = [float(x) for x in 0.02 * rng.lognormal(0.0, 1.0, 30)]
    now = replace(probed(0.020, 0.004, seed=1), step_times=wild)
    r = checks(now, stored(base), Tolerances(throughput_tolerance=0.1))["throughput"]
    assert r.verdict is Verdict.INCONCLUSIVE
    assert "this run's step times are contaminated" in r.detail


def test_a_baseline_without_the_same_probe_compares_raw() -> None:
    base = make_run()
    now = make_run(step_times=list(base.step_times), probe_times=[0.004] * 30, probe_kind=PROBE)
    r = checks(now, stored(base))["throughput"]
    assert r.data["drift_corrected"] is False
    assert r.detail.endswith("[raw step times: the baseline has no matching probe]")
    other = stored(probed(0.010, 0.004))
    other["probe"]["kind"] = "torch-cpu-matmul256x8"
    r = checks(probed(0.010, 0.004, seed=1), other)["throughput"]
    assert r.data["drift_corrected"] is False


# -- a loss far below the baseline's (issue 15, part 8) ------------------------------------
def test_a_much_lower_loss_is_an_improvement_by_default_and_a_regression_either_way() -> None:
    """Learning rate x10 took a ResNet's final loss from 1.178 to 0.235: the training
    changed. By default that is an improvement; --accelperf-loss-either-way fails it."""
    base = make_run(losses=[1.178] * 100)
    now = make_run(losses=[0.235] * 100)
    assert checks(now, stored(base))["loss"].verdict is Verdict.IMPROVEMENT
    r = checks(now, stored(base), loss_either_way=True)["loss"]
    assert r.verdict is Verdict.REGRESSION
    assert "below the baseline's 1.178" in r.detail
    assert "--accelperf-loss-either-way" in r.detail
    same = checks(base, stored(base), loss_either_way=True)["loss"]
    assert same.verdict is Verdict.PASS


def test_a_verdict_only_the_drift_correction_gives_is_not_one() -> None:
    """benchmarks/gate.py, quiet, unchanged code: the step took 7.47 ms against 7.83 ms
    recorded (raw -4.6 %) while the probe took 1.01 ms against 1.33 ms; the corrected
    ratio, 1.26, failed the run. A change the step times themselves do not show is not
    judged; the same correction on a slower step still is."""
    base = probed(0.00783, 0.00133)
    now = probed(0.00747, 0.00101, seed=1)
    r = checks(now, stored(base), Tolerances(throughput_tolerance=0.03))["throughput"]
    assert r.verdict is Verdict.INCONCLUSIVE, r.detail
    assert r.data["probe_only"] is True and r.data["measured_verdict"] == "regression"
    assert r.detail.startswith("not judged, only the drift correction makes it a change: the "
                               "raw step time was -4.")
    assert "against the baseline's (improvement by itself)" in r.detail
    assert "while the jax-cpu-matmul256x8 probe took -2" in r.detail
    assert "--accelperf-add-session" in r.detail
    # the step itself 10 % slower on the same faster machine: judged
    slower = probed(0.00783 * 1.10 * 0.97, 0.00101, seed=2)
    judged = checks(slower, stored(base), Tolerances(throughput_tolerance=0.03))["throughput"]
    assert judged.verdict is Verdict.REGRESSION, judged.detail
    # a raw step 0.2 % longer is no regression by itself either (seen: corrected 1.034)
    level = probed(0.00783 * 1.002, 0.00128, probe_noise=0.002, seed=4)
    r = checks(level, stored(base), Tolerances(throughput_tolerance=0.03))["throughput"]
    assert r.verdict is Verdict.INCONCLUSIVE and r.data["probe_only"] is True, r.detail
    # and the mirror image: an improvement the raw step times do not show
    faster_probe = probed(0.00800, 0.00180, seed=3)
    r = checks(faster_probe, stored(base), Tolerances(throughput_tolerance=0.03))["throughput"]
    assert r.verdict is Verdict.INCONCLUSIVE and r.data["probe_only"] is True
