"""Baselines recorded over several sessions: the throughput interval widened by the spread
between sessions (``--accelperf-add-session``), so that a machine whose sessions differ by
more than the tolerance says ``inconclusive`` instead of failing or passing blindly."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest

from pytest_accelperf.checks.summary import MAX_SESSIONS, summarize, with_added_session
from pytest_accelperf.checks.throughput import check_throughput
from pytest_accelperf.records.environment import Environment
from pytest_accelperf.records.run import Run
from pytest_accelperf.records.verdict import Tolerances, Verdict
from pytest_accelperf.stats.bootstrap import RatioEstimate, widen_by_sessions

TOL = Tolerances(throughput_tolerance=0.03)


def steady(median: float, seed: int, n: int = 40) -> list[float]:
    """Step times with 0.5 % noise: within one session, the interval is tight."""
    rng = np.random.default_rng(seed)
    return [float(x) for x in median * (1 + 0.005 * rng.standard_normal(n))]


def run_at(median: float, seed: int = 0) -> Run:
    return Run(case_id="jax-nomesh-b64", samples_per_step=64, n_devices=1,
               step_times=steady(median, seed),
               environment=Environment.from_json({"host_cpu": "Test CPU"}))


def baseline_with_sessions(levels: list[float]) -> dict[str, Any]:
    """A baseline whose samples are the first session's, with ``levels`` as its sessions."""
    block = summarize(run_at(levels[0])).to_json()
    block["step_time"]["sessions"] = [{"median": lv, "probe_median": None} for lv in levels]
    return block


def test_one_session_is_what_a_fresh_baseline_records() -> None:
    block = summarize(run_at(0.010)).to_json()
    sessions = block["step_time"]["sessions"]
    assert len(sessions) == 1
    assert sessions[0]["median"] == pytest.approx(0.010, rel=0.01)
    assert sessions[0]["probe_median"] is None


def test_sessions_that_disagree_make_a_small_change_inconclusive() -> None:
    # This session is 6 % slower than the first recorded one, with a tight interval of its
    # own: against that one session alone it is a confident regression at 3 %.
    now = run_at(0.0106, seed=9)
    alone = check_throughput(now, summarize(now), summarize(run_at(0.010)).to_json(), TOL)
    assert alone is not None and alone.verdict is Verdict.REGRESSION
    # The same baseline recorded over three sessions that differed by up to 20 %:
    r = check_throughput(now, summarize(now), baseline_with_sessions([0.010, 0.012, 0.0095]),
                         TOL)
    assert r is not None
    assert r.verdict is Verdict.INCONCLUSIVE, r.detail
    assert "3 baseline sessions, between-session SD" in r.detail
    assert r.data["sessions"] == 3 and r.data["mdc"] > 0.2
    # the step-time ratio is taken against the sessions' geometric mean (10.45 ms), not
    # against the first session (10 ms)
    assert r.data["ratio"] == pytest.approx(0.0106 / (0.010 * 0.012 * 0.0095) ** (1 / 3),
                                            rel=0.01)


def test_sessions_that_agree_keep_the_gate_sharp() -> None:
    levels = [0.0100, 0.01002, 0.00998, 0.01001, 0.00999]
    slower = run_at(0.0120, seed=3)  # 20 % slower
    r = check_throughput(slower, summarize(slower), baseline_with_sessions(levels), TOL)
    assert r is not None and r.verdict is Verdict.REGRESSION, r.detail
    same = run_at(0.0100, seed=4)
    r = check_throughput(same, summarize(same), baseline_with_sessions(levels), TOL)
    assert r is not None and r.verdict is Verdict.PASS, r.detail
    assert r.data["mdc"] < 0.03


def test_one_contaminated_session_does_not_blind_the_gate() -> None:
    """Seen: two --accelperf-add-session runs, one under another job's load, gave a
    between-session SD of 438 % and a smallest detectable change of +-227978.7 %: the mean
    and SD of log levels are not robust. The outlying session is left out, and says so."""
    slower = run_at(0.0120, seed=3)  # 20 % slower
    contaminated = [0.0100, 0.01003, 0.180]  # the third session 18x slower
    r = check_throughput(slower, summarize(slower), baseline_with_sessions(contaminated), TOL)
    assert r is not None and r.verdict is Verdict.REGRESSION, r.detail
    assert r.data["session_outliers"] == [2] and r.data["session_sd"] < 0.01
    assert "outlying session(s) #3 (17.95x the median level) left out" in r.detail
    assert "the median and MAD of all of them" in r.detail  # two left: too few for an SD
    # with four sessions, the other three give the mean and the SD
    four = [0.0100, 0.01003, 0.00998, 0.180]
    same = run_at(0.0100, seed=4)
    r = check_throughput(same, summarize(same), baseline_with_sessions(four), TOL)
    assert r is not None and r.verdict is Verdict.PASS, r.detail
    assert r.data["mdc"] < 0.03 and "the others' mean and SD" in r.detail
    # without the outlier test the same baseline is blind: every change inconclusive
    est = RatioEstimate(1.2, 1.19, 1.21, 0.01, 40, 40)
    _, spread = widen_by_sessions(est, 0.012, four)
    assert spread.outliers == (3,) and not spread.robust
    assert float(np.std(np.log(four), ddof=1)) > 1.0  # what the mean and SD alone gave


def test_fewer_than_three_sessions_change_nothing() -> None:
    now = run_at(0.0106, seed=9)
    r = check_throughput(now, summarize(now), baseline_with_sessions([0.010, 0.012]), TOL)
    assert r is not None and r.verdict is Verdict.REGRESSION
    assert "baseline sessions" not in r.detail and r.data["session_sd"] is None


def test_a_malformed_session_is_named() -> None:
    base = baseline_with_sessions([0.010, 0.011, 0.012])
    base["step_time"]["sessions"][1] = {"median": "fast"}
    now = run_at(0.010)
    r = check_throughput(now, summarize(now), base, TOL)
    assert r is not None and r.verdict is Verdict.INCONCLUSIVE
    assert "step_time.sessions[1] has no positive median step time" in r.detail
    assert "--accelperf-update" in r.detail


def test_the_widening_is_a_prediction_interval() -> None:
    est = RatioEstimate(1.0, 0.99, 1.01, 0.01, 30, 30)
    # identical sessions: only the within-session half-width remains
    wide, spread = widen_by_sessions(est, 1.0, [2.0, 2.0, 2.0])
    assert spread.sd == 0 and wide.ratio == pytest.approx(0.5)
    assert wide.high / wide.ratio == pytest.approx(1.01, rel=1e-3)
    # more sessions with the same spread give a narrower interval (Student's t shrinks)
    few, _ = widen_by_sessions(est, 1.0, [0.9, 1.0, 1.1])
    many, _ = widen_by_sessions(est, 1.0, [0.9, 1.0, 1.1] * 4)
    assert many.mdc < few.mdc
    with pytest.raises(ValueError, match="at least 3"):
        widen_by_sessions(est, 1.0, [1.0, 1.0])


def test_adding_a_session_keeps_the_rest_of_the_baseline() -> None:
    base = summarize(run_at(0.010)).to_json()
    del base["step_time"]["sessions"]  # a baseline recorded before sessions were kept
    merged = with_added_session(base, run_at(0.011, seed=1), [])
    assert [round(s["median"], 4) for s in merged["step_time"]["sessions"]] == [0.010, 0.011]
    assert merged["step_time"]["samples"] == base["step_time"]["samples"]
    assert "sessions" not in base["step_time"]  # the stored block is not modified in place
    for _ in range(MAX_SESSIONS + 5):
        merged = with_added_session(merged, run_at(0.011, seed=1), [])
    assert len(merged["step_time"]["sessions"]) == MAX_SESSIONS


@pytest.mark.parametrize(("baseline", "diffs", "run", "message"), [
    (None, [], run_at(0.01), "no baseline to add it to; record one first with "
                             "--accelperf-update"),
    (summarize(run_at(0.01)).to_json(), ["host_cpu: A != B"], run_at(0.01),
     "recorded in another environment (host_cpu: A != B)"),
    (summarize(run_at(0.01)).to_json(), [], Run(case_id="x", samples_per_step=32, n_devices=1,
                                      step_times=steady(0.01, 0)),
     "took 64 samples per step, this run 32"),
    ({**summarize(run_at(0.01)).to_json(), "step_time": {"samples": [0.01]}}, [], run_at(0.01),
     "step_time has no median to start its sessions with; re-record it"),
])
def test_a_session_that_cannot_be_added_says_why(baseline: dict[str, Any] | None,
                                                 diffs: list[str], run: Run,
                                                 message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        with_added_session(baseline, run, diffs)
