"""How a commit is judged (``bisection/evidence.py``): A/B mode's statistic against halfway
to BAD's level, the host checks (input, input_wait) a search can follow, and the
regressions it cannot follow named in their own words. Sessions made up from check
results; nothing is trained."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from pytest_accelperf.ab.rounds import ABMeasurement
from pytest_accelperf.ab.verdict import ab_check
from pytest_accelperf.bisection.commits import Commit
from pytest_accelperf.bisection.evidence import (
    halfway,
    host_targets,
    judge_host,
    judge_timing,
    program_targets,
    unjudged_host,
    unsearched_regressions,
)
from pytest_accelperf.bisection.trial import Session
from pytest_accelperf.records.verdict import CheckResult, Tolerances, Verdict
from pytest_accelperf.report.data import CaseRecord


def _ab_session(ratio: float, jitter: float) -> Session:
    """A session whose one case's A/B throughput check is A/B mode's own (``ab_check``)
    over 3 process pairs of 8 rounds whose head blocks are ``ratio`` times the base's,
    each round off by up to ``jitter`` (a fixed pattern)."""
    base, head, pairs = [], [], []
    for i in range(24):
        wobble = 1 + jitter * ((i * 7) % 5 - 2) / 2
        base.append([0.010, 0.0101, 0.0102])
        head.append([0.010 * ratio * wobble, 0.0101 * ratio * wobble, 0.0102 * ratio])
        pairs.append(i % 3)
    measured = ABMeasurement(base=base, head=head, seconds=3.0, first=["base", "head"] * 12,
                             pairs=pairs, processes=3)
    check = ab_check("GOOD", measured, 32, 0.1, 3)
    record = CaseRecord("t.py::test_step[c]", "c", "cpu-x1", {"outcome": "ok"}, [check])
    return Session(Commit("0" * 40, "x"), (), Path(), 1, 1.0, {record.nodeid: record})


@pytest.mark.parametrize(("ratio", "jitter", "call"), [
    (1.0, 0.01, "good"),    # GOOD's level: the interval lies below halfway
    (1.4, 0.01, "bad"),     # BAD's level: above
    (1.18, 0.01, "skip"),   # at halfway itself: it straddles it, and cannot say
    (1.3, 0.9, "skip"),     # near BAD's level, but too noisy to say which side
])
def test_a_commit_between_is_judged_against_halfway_to_bad(ratio: float, jitter: float,
                                                             call: str) -> None:
    """The midpoints' rule, on A/B mode's own statistic: BAD measured 1.4x GOOD, so a
    commit is bad above sqrt(1.4) = 1.18 and good below, whole interval."""
    judged = judge_timing(_ab_session(ratio, jitter), {"t.py::test_step[c]": 1.4})
    assert judged.call == call, judged.evidence
    assert "halfway to BAD's 1.40" in judged.evidence
    assert halfway(1.4) == pytest.approx(1.1832, abs=1e-4)


def test_bad_is_judged_by_the_ab_verdict() -> None:
    judged = judge_timing(_ab_session(1.4, 0.01), ["t.py::test_step[c]"])
    assert judged.call == "bad" and judged.levels["t.py::test_step[c]"] == \
        pytest.approx(1.4, rel=0.02)
    assert "tolerance 10%" in judged.evidence
    faster = judge_timing(_ab_session(0.6, 0.01), ["t.py::test_step[c]"])
    assert faster.call == "good" and faster.faster  # GOOD is already worse


def test_a_regression_without_figures_is_named_by_its_own_words() -> None:
    """The parameter fingerprint has no before and after figures: the regression the
    search cannot follow is named by the check's detail, never as ``- \u2192 -``."""
    fingerprint = CheckResult("numerics", Verdict.REGRESSION,
                              "structure changed: dense/kernel shape (8, 64) \u2192 (8, 2048)",
                              unit="max |\u0394|")
    batch = CheckResult("input", Verdict.REGRESSION, "slower", baseline=0.3e-3, now=5.45e-3,
                        unit="s", change=17.2)
    record = CaseRecord("t.py::test_step[c]", "c", "cpu-x1", {"outcome": "ok"},
                        [fingerprint, batch])
    others = unsearched_regressions(Session(Commit("0" * 40, "x"), (), Path(), 1, 1.0,
                                            {record.nodeid: record}))
    assert [metric for metric, _ in others] == ["numerics", "input"]
    assert others[0][1] == ("numerics (structure changed: dense/kernel shape (8, 64) "
                            "\u2192 (8, 2048))")
    assert others[1][1].startswith("input 0.30 ms \u2192 5.45 ms (+"), others[1][1]
    assert all(" - \u2192 -" not in words for _, words in others)


def test_an_input_wait_not_judged_beside_another_job_is_named() -> None:
    """Beside another job, ``input_wait`` measures BAD's sleep but does not judge it: the
    bisection has no target, and says what was measured and how to judge it."""
    from pytest_accelperf.checks.input_wait import check_input_wait

    steps = [0.02] * 20
    def block(blocked: float) -> dict[str, Any]:
        return {"step_time": {"median": 0.02, "samples": steps},
                "input": {"median": 0.0004, "samples": [0.0004] * 20,
                          "blocked_median": blocked, "blocked_samples": [blocked] * 20}}
    loaded = "other processes used 0.95 of 2 cores on average"
    check = check_input_wait(block(0.008), block(0.0), Tolerances(), loaded=loaded)
    assert check is not None and check.verdict is Verdict.INCONCLUSIVE
    record = CaseRecord("t.py::test_step[c]", "c", "cpu-x1", {"outcome": "ok"}, [check])
    bad = Session(Commit("0" * 40, "x"), (), Path(), 1, 1.0, {record.nodeid: record})
    assert host_targets(bad) == {}
    assert unjudged_host(bad) == [f"input_wait 0.00 ms \u2192 8.00 ms ({loaded})"]


def test_an_input_wait_too_noisy_to_judge_is_named() -> None:
    """On a loaded machine GOOD's batch thread waited too (for the GIL, for a core): BAD's
    6 ms sleep measures above it, but the interval is too wide to call a regression. The
    bisection has no target, and says what it measured and why it is not searched (in CI
    it once said only that A/B mode could not tell the step times apart)."""
    from pytest_accelperf.checks.input_wait import check_input_wait

    steps = [0.02] * 20

    def block(blocked: list[float]) -> dict[str, Any]:
        return {"step_time": {"median": 0.02, "samples": steps},
                "input": {"median": 0.0004, "samples": [0.0004] * 20,
                          "blocked_median": sorted(blocked)[10], "blocked_samples": blocked}}
    good = [0.0001, 0.012, 0.0002, 0.009, 0.0001] * 4
    bad = [0.003, 0.0005, 0.014, 0.0002, 0.011] * 4
    check = check_input_wait(block(bad), block(good), Tolerances())
    assert check is not None and check.verdict is Verdict.INCONCLUSIVE, check
    record = CaseRecord("t.py::test_step[c]", "c", "cpu-x1", {"outcome": "ok"}, [check])
    session = Session(Commit("0" * 40, "x"), (), Path(), 1, 1.0, {record.nodeid: record})
    assert host_targets(session) == {}
    [words] = unjudged_host(session)
    assert re.fullmatch(r"input_wait 0\.20 ms \u2192 3\.00 ms \(\d+\.\d+x, 95% CI "
                        r"\d+\.\d+\u2013\d+\.\d+: too noisy to judge\)", words), words
    # a pass (under the floor) and an improvement are not named
    assert unjudged_host(Session(Commit("0" * 40, "x"), (), Path(), 1, 1.0, {
        record.nodeid: CaseRecord(record.nodeid, "c", "cpu-x1", {"outcome": "ok"}, [
            check_input_wait(block(good), block(bad), Tolerances())])})) == []


def _input_session(now_ms: float, *, noisy: bool = False, loaded: bool = False) -> Session:
    """A session against GOOD's recording whose input check measured ``now_ms`` of CPU a
    batch against GOOD's 0.3 ms (30 steps of 20 ms)."""
    from pytest_accelperf.checks.input import check_input

    def block(ms: float) -> dict[str, Any]:
        samples = [ms * 1e-3 * (1 + (0.9 if noisy else 0.02) * ((i * 7) % 5 - 2) / 2)
                   for i in range(30)]
        return {"step_time": {"median": 0.02, "samples": [0.02] * 30},
                "input": {"median": sorted(samples)[15], "samples": samples}}
    check = check_input(block(now_ms), block(0.3), Tolerances())
    assert check is not None
    if loaded:
        check = CheckResult(check.metric, check.verdict, check.detail, check.baseline,
                            check.now, check.unit, check.change,
                            {**check.data, "contaminated": "other jobs"})
    record = CaseRecord("t.py::test_step[c]", "c", "cpu-x1", {"outcome": "ok"}, [check])
    return Session(Commit("0" * 40, "x"), (), Path(), 1, 1.0, {record.nodeid: record})


def test_a_slower_batch_function_is_searched_on_the_input_check() -> None:
    """BAD's make_batch burns 10 ms of CPU more (the gate's input check fails it; no step
    time includes it): the search follows the input check's interval, as A/B timing's
    (found bisecting nanoGPT's get_batch, where it once said BAD was not worse)."""
    bad = _input_session(10.3)
    levels = host_targets(bad)
    assert list(levels) == [("t.py::test_step[c]", "input")]
    level = levels[("t.py::test_step[c]", "input")]
    assert level == pytest.approx(10.3 / 0.3, rel=0.05)
    assert judge_host(_input_session(10.3), levels).call == "bad"
    good = judge_host(_input_session(0.32), levels)
    assert good.call == "good" and "under the floor" in good.evidence, good.evidence
    assert judge_host(_input_session(1.2), levels).call == "good"  # 4x: below sqrt(34) = 5.9x
    assert judge_host(_input_session(10.3, loaded=True), levels).call == "skip"
    straddling = judge_host(_input_session(1.76, noisy=True), levels)
    assert straddling.call == "skip", straddling.evidence


def _program_session(*checks: CheckResult, outcome: str = "ok") -> Session:
    record = CaseRecord("t.py::test_step[c]", "c", "cpu-x8", {"outcome": outcome,
                                                              "message": "killed"},
                        list(checks))
    return Session(Commit("4" * 40, "x"), (), Path(), 1, 1.0, {record.nodeid: record})


def test_same_program_is_said_only_of_programs_compared() -> None:
    """BAD's program check could not compare (another device count, say): its call is not
    "same program as GOOD" (once said of a 4x wider model, whose A/B then found it 65 %
    slower) but ``skip``, with the check's reason; the search goes on in A/B mode either
    way (no targets)."""
    incomparable = CheckResult("program", Verdict.INCOMPARABLE,
                               "baseline recorded in another environment; program not "
                               "compared", unit="FLOPs")
    targets, judged = program_targets(_program_session(incomparable), {})
    assert not targets
    assert judged.call == "skip", judged
    assert judged.evidence.startswith("program not compared with GOOD's: ")
    assert "program incomparable: baseline recorded in another environment" in \
        judged.evidence
    _, unfinished = program_targets(_program_session(outcome="timeout"), {})
    assert unfinished.call == "skip" and "its run ended timeout: killed" in \
        unfinished.evidence, unfinished
    _, none = program_targets(_program_session(), {})
    assert none.call == "skip" and "no program check" in none.evidence
    same = CheckResult("program", Verdict.PASS, "same program as the baseline",
                       baseline=1e6, now=1e6, unit="FLOPs")
    _, judged = program_targets(_program_session(same), {})
    assert (judged.call, judged.evidence) == ("same", "same program and memory plan as GOOD")
