"""One verdict for the whole suite (:mod:`pytest_accelperf.checks.family`): the p-value of a
timing check from its interval, Benjamini-Hochberg q-values across the session, the false
alarms to expect, and the line and JSON block that report them."""

from __future__ import annotations

import json
import math
import re
import statistics
from typing import Any

import pytest
from conftest import Suite

from pytest_accelperf.ab.rounds import ABMeasurement
from pytest_accelperf.ab.verdict import ab_check
from pytest_accelperf.checks.family import (
    Interval,
    expected_false,
    interval,
    p_at_least,
    p_value,
    q_values,
    suite_verdict,
)
from pytest_accelperf.checks.table import check_of
from pytest_accelperf.records.verdict import CheckResult, Verdict
from pytest_accelperf.report.data import CaseRecord, SessionReport
from pytest_accelperf.report.markdown import markdown
from pytest_accelperf.report.terminal import suite_text, table_lines
from pytest_accelperf.store.schema import ReportFile

#: The normal quantile of a two-sided 95 % interval, to the digits printed in tables.
Z975 = 1.959963984540054


def normal_sf(z: float) -> float:
    return 0.5 * math.erfc(z / math.sqrt(2))


def t2_sf(t: float) -> float:
    """Student's t survival function with 2 degrees of freedom, in closed form."""
    return 0.5 - t / (2 * math.sqrt(t * t + 2))


# -- the p-value of one check ------------------------------------------------------------------
def test_p_value_of_a_normal_interval_is_the_hand_computation() -> None:
    # 1.05 within 1.01-1.09 at 95 %: se = (ln 1.09 - ln 1.01) / (2 * 1.96) = 0.019446,
    # z = ln 1.05 / se = 2.5090, p = 1 - Phi(z) = 0.00605.
    se = (math.log(1.09) - math.log(1.01)) / (2 * Z975)
    assert se == pytest.approx(0.019446, abs=1e-6)
    assert p_value(Interval(1.05, 1.01, 1.09)) == pytest.approx(normal_sf(math.log(1.05) / se),
                                                                rel=1e-9)
    assert p_value(Interval(1.05, 1.01, 1.09)) == pytest.approx(0.00605, abs=1e-5)
    # Faster: most of the evidence is against a slowdown.
    assert p_value(Interval(0.95, 0.92, 0.98)) > 0.99
    # At 90 % confidence the same interval is narrower evidence: a larger se, a larger p.
    se90 = (math.log(1.09) - math.log(1.01)) / (2 * 1.6448536269514722)
    assert p_value(Interval(1.05, 1.01, 1.09, confidence=0.90)) == pytest.approx(
        normal_sf(math.log(1.05) / se90), rel=1e-9)


def test_p_value_of_a_zero_width_interval() -> None:
    assert p_value(Interval(1.2, 1.2, 1.2)) == 0.0
    assert p_value(Interval(1.0, 1.0, 1.0)) == 1.0
    assert p_value(Interval(0.8, 0.8, 0.8)) == 1.0


def test_ab_over_process_pairs_is_the_one_sided_t_test_of_the_pairs() -> None:
    # Three process pairs, two rounds each, every round of a pair alike: the pairs' mean
    # log-ratios are ln 1.02, ln 1.03, ln 1.05, and the interval is Student's t with 2
    # degrees of freedom over them. Recovered from that interval, the p-value must be the
    # one-sided t-test's of the three means.
    heads = [1.02, 1.03, 1.05] * 2
    measured = ABMeasurement(base=[[1.0] * 3] * 6, head=[[h] * 3 for h in heads],
                             seconds=6.0, first=["base", "head"] * 3,
                             pairs=[0, 1, 2, 0, 1, 2], processes=3)
    check = ab_check("HEAD", measured, samples_per_step=8, tolerance=0.01, block=3)
    iv = interval(check)
    assert iv is not None and iv.df == 2
    means = [math.log(1.02), math.log(1.03), math.log(1.05)]
    t = statistics.mean(means) / (statistics.stdev(means) / math.sqrt(3))
    assert p_value(iv) == pytest.approx(t2_sf(t), rel=1e-9)
    # Read as a normal interval it would be another number: the t matters.
    normal = Interval(iv.ratio, iv.low, iv.high, iv.confidence, None)
    assert abs(p_value(normal) - p_value(iv)) > 1e-3
    # One pair: a bootstrap over rounds, a normal interval.
    one = ABMeasurement(base=[[1.0] * 3] * 6, head=[[h] * 3 for h in heads], seconds=6.0,
                        first=["base", "head"] * 3, pairs=[0] * 6, processes=1)
    single = interval(ab_check("HEAD", one, samples_per_step=8, tolerance=0.01, block=3))
    assert single is not None and single.df is None


def test_which_checks_have_an_interval() -> None:
    stored = CheckResult("throughput", Verdict.PASS, "", data={
        "ratio": 1.01, "ci": [0.99, 1.03], "confidence": 0.9})
    assert interval(stored) == Interval(1.01, 0.99, 1.03, 0.9, None)
    input_check = CheckResult("input", Verdict.PASS, "", data={
        "ratio": 1.2, "ci_low": 1.1, "ci_high": 1.3, "confidence": 0.95})
    assert interval(input_check) == Interval(1.2, 1.1, 1.3, 0.95, None)
    # Without an interval: a compile time, a new throughput, an input under its floor.
    assert interval(CheckResult("compile", Verdict.REGRESSION, "", data={"ratio": 3.0})) is None
    assert interval(CheckResult("throughput", Verdict.NEW, "")) is None
    assert interval(CheckResult("input", Verdict.PASS, "", data={"share": 0.01})) is None
    # Another metric with the same keys is none of ours.
    assert interval(CheckResult("memory", Verdict.PASS, "", data={
        "ratio": 1.0, "ci": [0.9, 1.1]})) is None


# -- Benjamini-Hochberg and the false alarms ---------------------------------------------------
def test_q_values_are_benjamini_hochberg() -> None:
    # m = 3: p * m / rank = 0.03, 0.06, 0.045, then the running minimum from the largest p
    # down (the step-up): 0.03, 0.045, 0.045.
    assert q_values([0.01, 0.04, 0.045]) == pytest.approx((0.03, 0.045, 0.045))
    # In the order given, not sorted.
    assert q_values([0.045, 0.01, 0.04]) == pytest.approx((0.045, 0.03, 0.045))
    # Benjamini & Hochberg (1995)'s own example: of its 15 p-values, 4 are discoveries at
    # an FDR of 5 % (the largest, 0.0095, is 3.6th of a 0.05 * 4 / 15 = 0.0133 bound).
    bh1995 = [0.0001, 0.0004, 0.0019, 0.0095, 0.0201, 0.0278, 0.0298, 0.0344, 0.0459,
              0.3240, 0.4262, 0.5719, 0.6528, 0.7590, 1.0000]
    assert sum(q <= 0.05 for q in q_values(bh1995)) == 4
    assert q_values([]) == ()


def test_expected_false_alarms_and_the_chance_of_seeing_k() -> None:
    rates = [0.025] * 24  # 24 checks at 95 %: each below its low end at most 2.5 %
    assert expected_false(rates) == pytest.approx(0.6)
    assert p_at_least(1, rates) == pytest.approx(1 - 0.975 ** 24)
    assert p_at_least(1, rates) == pytest.approx(0.45536, abs=1e-5)
    assert p_at_least(2, rates) == pytest.approx(1 - 0.975 ** 24 - 24 * 0.025 * 0.975 ** 23)
    assert p_at_least(0, rates) == 1.0
    assert p_at_least(25, rates) == 0.0
    # Mixed confidences: the sum is exact, the tail bounded by the largest rate.
    mixed = [0.05, 0.005]
    assert expected_false(mixed) == pytest.approx(0.055)
    assert p_at_least(1, mixed) == pytest.approx(1 - 0.95 ** 2)


# -- the suite verdict -------------------------------------------------------------------------
def _timing(verdict: Verdict, ratio: float, low: float, high: float,
            **extra: Any) -> CheckResult:
    return CheckResult("throughput", verdict, "", data={
        "ratio": ratio, "ci": [low, high], "confidence": 0.95, **extra})


def _record(name: str, *checks: CheckResult) -> CaseRecord:
    return CaseRecord(nodeid=f"test_m.py::test_x[{name}]", case_id=name, platform="cpu-x2",
                      run={"case_id": name, "outcome": "ok"}, checks=list(checks))


def session() -> SessionReport:
    """Thirteen cases: a timing regression past any doubt, one that chance could explain
    among this many checks, eight passes, one measured beside another job, a compile-time
    regression and a program regression."""
    ok = CheckResult("outcome", Verdict.PASS, "")
    records = [
        _record("a-sure", ok, _timing(Verdict.REGRESSION, 1.5, 1.4, 1.6)),
        _record("b-marginal", ok, _timing(Verdict.REGRESSION, 1.03, 1.001, 1.06)),
        *(_record(f"c-pass{i}", ok, _timing(Verdict.PASS, 1.0, 0.98, 1.02)) for i in range(8)),
        _record("d-loaded", ok, _timing(Verdict.INCONCLUSIVE, 1.3, 1.2, 1.4,
                                        contaminated="other processes used 1.2 cores")),
        _record("e-compile", ok, CheckResult("compile", Verdict.REGRESSION, "",
                                             data={"ratio": 3.0})),
        _record("f-program", ok, CheckResult("program", Verdict.REGRESSION, "")),
    ]
    return SessionReport(accel="cpu", platform="cpu-x2", records=records)


def _p(ratio: float, low: float, high: float) -> float:
    return normal_sf(math.log(ratio) / ((math.log(high) - math.log(low)) / (2 * Z975)))


def test_suite_verdict_counts_and_controls_the_false_discovery_rate() -> None:
    report = session()
    suite = suite_verdict(report.sorted_records())
    assert (suite.cases, suite.regressed_cases) == (13, 4)
    assert [t.nodeid.split("[")[1][:-1] for t in suite.tested] == [
        "a-sure", "b-marginal", *(f"c-pass{i}" for i in range(8))]
    assert suite.set_aside == 1
    p_a, p_b = _p(1.5, 1.4, 1.6), _p(1.03, 1.001, 1.06)
    assert [t.p_value for t in suite.tested] == pytest.approx([p_a, p_b] + [0.5] * 8)
    # b's interval excludes 1, so its p is below 0.025; among 10 checks BH asks more of the
    # second smallest: q_b = p_b * 10 / 2 (the passes' 0.5 * 10 / j are all larger).
    assert p_b < 0.025 and p_b * 10 / 2 > 0.05
    assert suite.tested[0].q_value == pytest.approx(p_a * 10)
    assert suite.tested[1].q_value == pytest.approx(p_b * 10 / 2)
    assert [t.q_value for t in suite.tested[2:]] == pytest.approx([0.5] * 8)
    assert [t.nodeid for t in suite.held] == ["test_m.py::test_x[a-sure]"]
    assert [t.nodeid for t in suite.not_held] == ["test_m.py::test_x[b-marginal]"]
    assert suite.expected_false == pytest.approx(0.25)
    assert suite.at_least == 2
    assert suite.p_at_least == pytest.approx(1 - 0.975 ** 10 - 10 * 0.025 * 0.975 ** 9)
    assert suite.other_timing.checks == 1 and dict(suite.other_timing.by_metric) == {
        "compile": 1}
    assert suite.deterministic.checks == 14 and dict(suite.deterministic.by_metric) == {
        "program": 1}


def test_the_line_the_json_block_and_the_markdown_say_it() -> None:
    report = session()
    suite = report.suite()
    q_a, q_b = suite.tested[0].q_value, suite.tested[1].q_value
    assert suite.p_at_least == pytest.approx(0.02461, abs=1e-5)  # shown rounded up: 3 %
    text = suite_text(suite)
    assert text == (
        f"4 of 13 cases regressed; 10 timing checks with an interval (at most 0.25 false "
        f"alarms expected by chance, P(>=2) <= 3%): 2 regressions: 1 holds at a 5% false "
        f"discovery rate (q = {q_a:.2g}), 1 does not (q = {q_b:.2g}); 1 timing check set "
        f"aside, which cannot regress (measured beside another job, or against a noisy "
        f"baseline); 1 timing regression without an interval (compile); 14 deterministic "
        f"checks: 1 regression (program)")
    assert f"(q = {q_b:.2g})" == "(q = 0.11)"
    lines = table_lines(report)
    assert lines[-2] == f"accelperf: suite: {text}"
    assert lines[-1].startswith("accelperf: 13 case(s) on cpu-x2: ")
    assert f"\nSuite: {text}\n" in markdown(report)

    data = json.loads(json.dumps(report.to_json(1)))
    ReportFile.model_validate(data)  # the schema knows the block
    block = data["suite"]
    assert (block["cases"], block["regressed"]) == (13, 4)
    stat = block["statistical"]
    assert {k: stat[k] for k in ("checks", "set_aside", "regressions", "at_least", "fdr")} == {
        "checks": 10, "set_aside": 1, "regressions": 2, "at_least": 2, "fdr": 0.05}
    assert stat["expected_false"] == pytest.approx(0.25)
    assert stat["p_at_least"] == pytest.approx(suite.p_at_least)
    assert [h["nodeid"] for h in stat["held"]] == ["test_m.py::test_x[a-sure]"]
    assert stat["not_held"][0]["q_value"] == pytest.approx(q_b)
    assert block["other_timing"] == {"checks": 1, "regressions": 1,
                                     "by_metric": {"compile": 1}}
    assert block["deterministic"] == {"checks": 14, "regressions": 1,
                                      "by_metric": {"program": 1}}
    # Each statistical check's data carries its p and q; the others none.
    by_case = {c["case_id"]: c["checks"] for c in data["cases"]}
    assert by_case["b-marginal"][1]["data"]["q_value"] == pytest.approx(q_b)
    assert by_case["c-pass3"][1]["data"]["p_value"] == pytest.approx(0.5)
    assert "p_value" not in by_case["d-loaded"][1]["data"]
    assert "p_value" not in by_case["e-compile"][1]["data"]
    # ... in the report only: the checks themselves are as the cases gave them.
    assert "p_value" not in report.records[1].checks[1].data
    assert [r.verdict for r in report.records] == [Verdict.REGRESSION] * 2 + [
        Verdict.PASS] * 8 + [Verdict.INCONCLUSIVE, Verdict.REGRESSION, Verdict.REGRESSION]
    # A report read back gives the same block.
    assert SessionReport.from_json(data).to_json(1)["suite"] == data["suite"]


def test_a_clean_session_says_no_regression() -> None:
    ok = CheckResult("outcome", Verdict.PASS, "")
    report = SessionReport(platform="cpu-x2", records=[
        _record("a", ok, _timing(Verdict.PASS, 1.0, 0.98, 1.02)),
        _record("b", ok, _timing(Verdict.PASS, 1.01, 0.99, 1.03))])
    assert suite_text(report.suite()) == (
        "0 of 2 cases regressed; 2 timing checks with an interval (at most 0.05 false alarms "
        "expected by chance, P(>=1) <= 5%): no regression; 2 deterministic checks: no "
        "regression")
    assert report.suite().p_at_least == pytest.approx(0.049375)  # 1 - 0.975 ** 2, up: 5 %
    only_fixed = SessionReport(platform="cpu-x2", records=[_record("a", ok)])
    assert suite_text(only_fixed.suite()) == (
        "0 of 1 case regressed; no timing check with an interval; 1 deterministic check: no "
        "regression")


# -- through pytest ----------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.timing
def test_a_session_reports_its_suite_verdict(recorded: Suite) -> None:
    """A recorded suite whose one baseline claims 4x the throughput (a timing regression)
    and whose other claims half the memory (a deterministic one) and a tenth of the
    throughput (an improvement, so it cannot regress on timing)."""
    suite = recorded
    data = suite.load()
    slow, lean = "test_sweep[jax-nomesh-b256]", "test_sweep[jax-mesh4x2-b256]"
    st = data["cases"][slow]["step_time"]
    st["samples"] = [t / 4 for t in st["samples"]]
    st["median"] /= 4
    data["cases"][slow]["samples_per_second"] *= 4
    mem = data["cases"][lean]["memory"]
    mem["per_device"] = {k: v // 2 for k, v in mem["per_device"].items()}
    mem["peak"] //= 2
    data["cases"][lean]["step_time"]["samples"] = [
        t * 10 for t in data["cases"][lean]["step_time"]["samples"]]
    suite.baseline_path().write_text(json.dumps(data, indent=2, sort_keys=True))

    result = suite.run("--accelperf-throughput-tolerance=0.5", "--accelperf-json=report.json")
    result.assert_outcomes(failed=2)
    report = suite.report()
    checks = {c["nodeid"].split("::")[1]: {k["metric"]: k for k in c["checks"]}
              for c in report["cases"]}
    assert checks[slow]["throughput"]["verdict"] == "regression"
    assert checks[lean]["memory"]["verdict"] == "regression"
    # The truth, from the checks' own data: the timing checks with an interval and their
    # p-values by hand, BH by hand.
    tested = [k for c in report["cases"] for k in c["checks"] if "p_value" in k["data"]]
    assert checks[slow]["throughput"] in tested
    for k in tested:
        d = k["data"]
        low, high = d["ci"] if "ci" in d else (d["ci_low"], d["ci_high"])
        z = math.log(d["ratio"]) / ((math.log(high) - math.log(low)) / (2 * Z975))
        assert d["p_value"] == pytest.approx(normal_sf(z), rel=1e-9, abs=1e-300)
    m = len(tested)
    ranked = sorted(k["data"]["p_value"] for k in tested)
    bh = [min(ranked[j] * m / (j + 1) for j in range(i, m)) for i in range(m)]
    assert sorted(k["data"]["q_value"] for k in tested) == pytest.approx(bh)
    regressed = [k for k in tested if k["verdict"] == "regression"]
    assert regressed == [checks[slow]["throughput"]]

    block = report["suite"]
    assert (block["cases"], block["regressed"]) == (2, 2)
    stat = block["statistical"]
    assert (stat["checks"], stat["regressions"], stat["at_least"]) == (m, 1, 1)
    assert stat["expected_false"] == pytest.approx(0.025 * m)
    assert stat["p_at_least"] == pytest.approx(1 - 0.975 ** m)
    held = stat["held"]
    assert [h["nodeid"].split("::")[1] for h in held] == [slow]
    assert held[0]["q_value"] == pytest.approx(checks[slow]["throughput"]["data"]["q_value"])
    assert held[0]["q_value"] <= 0.05
    assert block["deterministic"]["by_metric"] == {"memory": 1}
    n_fixed = sum(1 for c in report["cases"] for k in c["checks"]
                  if check_of(k["metric"]).kind == "deterministic")
    assert n_fixed == sum(1 for c in report["cases"] for k in c["checks"] if k["metric"] not in
                          ("throughput", "input", "input_wait", "compile", "scaling"))
    assert block["deterministic"]["checks"] == n_fixed

    # The line says the same, its bounds rounded up (never below the truth).
    line = next(x for x in result.outlines if x.startswith("accelperf: suite: "))
    assert result.outlines.index(line) + 1 == next(
        i for i, x in enumerate(result.outlines) if x.startswith("accelperf: 2 case(s) on"))
    found = re.fullmatch(
        r"accelperf: suite: 2 of 2 cases regressed; (\d+) timing checks? with an interval "
        r"\(at most ([\d.]+) false alarms expected by chance, "
        r"P\(>=1\) <= ([\d.]+)%\): 1 regression, which holds at a 5% false discovery rate "
        r"\(q = ([^)]+)\); (?:\d+ timing checks? set aside, [^;]+; )?"
        r"(\d+) deterministic checks: 1 regression \(memory\)", line)
    assert found, line
    shown_m, shown_expected, shown_p, shown_q, shown_fixed = found.groups()
    assert (int(shown_m), int(shown_fixed)) == (m, n_fixed)
    # (1e-9: the rates themselves, (1 - 0.95) / 2, are 0.025 to float precision)
    assert 0.025 * m * (1 - 1e-9) <= float(shown_expected) < 0.025 * m * 1.1
    assert (1 - 0.975 ** m) * (1 - 1e-9) <= float(shown_p) / 100 <= 1 - 0.975 ** m + 0.01
    assert float(shown_q) == pytest.approx(held[0]["q_value"], rel=0.05, abs=1e-300)


@pytest.mark.parametrize("typed, model", [
    ("TestedJson", "ReportTested"), ("TallyJson", "ReportTally"),
    ("StatisticalJson", "ReportStatistical"), ("SuiteJson", "ReportSuite"),
])
def test_what_the_verdict_writes_is_what_the_report_schema_reads(typed: str,
                                                                 model: str) -> None:
    """The suite verdict's JSON is declared once, where it is written (records/suite.py's
    TypedDicts); the report's models are made from them: the same keys, in order."""
    import typing

    from pytest_accelperf.records import suite
    from pytest_accelperf.store import schema

    written = list(typing.get_type_hints(getattr(suite, typed)))
    read = list(getattr(schema, model).model_fields)
    assert written == read, (typed, set(written) ^ set(read))
