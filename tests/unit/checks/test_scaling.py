"""The scaling check: a bent curve is flagged, a straight one passes, noise is inconclusive."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from pytest_accelperf.checks.scaling import (
    Scaling,
    ScalingCollector,
    ScalingPoint,
    check_scaling,
)
from pytest_accelperf.ingest import parse_file
from pytest_accelperf.records.verdict import Verdict

CEREBRAS = Path(__file__).resolve().parents[3] / "suites/cerebras/data/003_cerebras_bert_large.log"


def test_seed_003_bends_at_2048_against_80_percent() -> None:
    runs = parse_file(CEREBRAS, "cerebras")
    points = [ScalingPoint.from_run(r.samples_per_step, r) for r in runs]
    result = check_scaling(points, Scaling(min_efficiency=0.8), "bert-large")
    assert result.verdict is Verdict.REGRESSION
    assert result.data["bend_at"] == 2048
    assert "bends at batch 2048" in result.detail and "efficiency 58% < 80%" in result.detail
    effs = [round(p["efficiency"], 2) for p in result.data["points"]]
    assert effs == [1.0, 0.84, 0.58]
    # What the seed's hardware gives passes at 50%.
    assert check_scaling(points, Scaling(min_efficiency=0.5)).verdict is Verdict.PASS


def test_straight_and_flat_curves_pass() -> None:
    linear = [ScalingPoint(b, 10.0 * b) for b in (8, 16, 32)]
    assert check_scaling(linear, Scaling(min_efficiency=0.95)).verdict is Verdict.PASS
    flat = [ScalingPoint(n, 100.0) for n in (1, 2, 4)]
    assert check_scaling(flat, Scaling(exponent=0, axis="devices")).verdict is Verdict.PASS
    assert check_scaling(flat, Scaling(exponent=1, axis="devices")).verdict is Verdict.REGRESSION


def test_noise_makes_a_near_miss_inconclusive() -> None:
    pts = [ScalingPoint(1, 100.0, noise=0.1), ScalingPoint(2, 150.0, noise=0.1)]
    result = check_scaling(pts, Scaling(min_efficiency=0.8))
    assert result.verdict is Verdict.INCONCLUSIVE and "noise" in result.detail


def test_collector_checks_when_the_group_is_complete() -> None:
    col = ScalingCollector()
    expect = Scaling(min_efficiency=0.9)
    assert col.add("g", ScalingPoint(1, 100.0), expect, 2) is None
    assert col.incomplete() == ["g (1 of 2 points)"]
    result = col.add("g", ScalingPoint(2, 120.0), expect, 2)
    assert result is not None and result.verdict is Verdict.REGRESSION
    with pytest.raises(ValueError, match="declare it once"):
        col.add("g", ScalingPoint(4, 1.0), Scaling(), 2)


def test_suite_fails_the_case_that_completes_a_bent_group(pytester: pytest.Pytester) -> None:
    log = pytester.path / "bert.log"
    log.write_text(CEREBRAS.read_text())
    pytester.makepyfile(test_bent=textwrap.dedent('''
        from pytest_accelperf import cases
        from pytest_accelperf.checks.scaling import Scaling

        @cases(backend="external", batch=[512, 1024, 2048])
        def test_series(accelperf):
            r = accelperf.ingest("bert.log", parser="cerebras",
                                 section=f"Batch size {accelperf.case.batch}")
            accelperf.scaling("bert", r, points=3, expect=Scaling(min_efficiency=0.8))
    '''))
    pytester.runpytest("-p", "no:cacheprovider", "--accelperf-update").assert_outcomes(passed=3)
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(["*test_series[[]external-nomesh-b2048[]]*scaling group bert:"
                                 " the linear scaling curve bends at batch 2048*",
                                 "*scaling *0.5773 *REGRESSION*"])
