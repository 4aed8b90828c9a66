"""The throughput statistic on its own: the ratio, its interval, and the verdict rule."""

from __future__ import annotations

import time
import warnings

import numpy as np
import pytest

from pytest_accelperf.records.verdict import Verdict
from pytest_accelperf.stats.bootstrap import (
    RatioEstimate,
    ab_verdict,
    step_time_ratio,
    throughput_verdict,
)


def noisy(n: int, center: float, noise: float, seed: int) -> list[float]:
    """``n`` step times around ``center`` with relative Gaussian noise, all positive."""
    rng = np.random.default_rng(seed)
    return [float(x) for x in center * np.abs(1 + noise * rng.standard_normal(n))]


def est(ratio: float, low: float, high: float) -> RatioEstimate:
    return RatioEstimate(ratio, low, high, (high - low) / 2, 30, 30)


def test_ratio_is_of_medians_and_slower_is_above_one() -> None:
    e = step_time_ratio([2.0, 2.1, 1.9, 100.0, 2.0], [1.0, 1.05, 0.95, 1.0, 1.0])
    assert e.ratio == pytest.approx(2.0)  # the one slow step does not move a median
    assert e.low <= e.ratio <= e.high
    assert e.mdc == pytest.approx((e.high - e.low) / (2 * e.ratio))
    assert (e.n_now, e.n_base) == (5, 5)


def test_twice_as_slow_with_ten_percent_noise_is_a_regression() -> None:
    base = noisy(30, 0.010, 0.10, seed=1)
    now = noisy(30, 0.020, 0.10, seed=2)
    e = step_time_ratio(now, base)
    assert 1.8 < e.ratio < 2.2
    assert e.low > 1.5
    assert e.mdc < 0.5
    assert throughput_verdict(e, 0.5) is Verdict.REGRESSION


def test_twice_as_fast_is_an_improvement() -> None:
    e = step_time_ratio(noisy(30, 0.005, 0.10, seed=3), noisy(30, 0.010, 0.10, seed=4))
    assert throughput_verdict(e, 0.3) is Verdict.IMPROVEMENT


def test_same_distribution_passes() -> None:
    e = step_time_ratio(noisy(50, 0.010, 0.05, seed=5), noisy(50, 0.010, 0.05, seed=6))
    assert abs(e.ratio - 1) < 0.05
    assert throughput_verdict(e, 0.10) is Verdict.PASS


def test_very_noisy_samples_are_inconclusive() -> None:
    rng = np.random.default_rng(7)
    base = [float(x) for x in rng.lognormal(np.log(0.01), 1.0, 8)]
    now = [float(x) for x in rng.lognormal(np.log(0.01), 1.0, 8)]
    e = step_time_ratio(now, base)
    assert e.mdc > 0.10
    assert throughput_verdict(e, 0.10) is Verdict.INCONCLUSIVE


def test_seeded_and_reproducible() -> None:
    now, base = noisy(20, 1.1, 0.2, seed=8), noisy(20, 1.0, 0.2, seed=9)
    assert step_time_ratio(now, base) == step_time_ratio(now, base)
    assert step_time_ratio(now, base, seed=1) != step_time_ratio(now, base, seed=2)


def test_identical_values_collapse_the_interval_without_warning() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        e = step_time_ratio([0.02] * 10, [0.01] * 10)
    assert (e.ratio, e.low, e.high, e.mdc) == (2.0, 2.0, 2.0, 0.0)
    assert throughput_verdict(e, 0.1) is Verdict.REGRESSION
    same = step_time_ratio([0.01] * 4, [0.01] * 4)
    assert throughput_verdict(same, 0.0) is Verdict.PASS


def test_nearly_degenerate_data_does_not_warn() -> None:
    # Resampled medians are almost always 1.0: a (near-)degenerate bootstrap distribution.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        e = step_time_ratio([1.0] * 19 + [5.0], [1.0] * 20)
    assert e.ratio == 1.0
    assert e.low == 1.0 and e.high == 1.0


@pytest.mark.parametrize(("now", "base", "match"), [
    ([1.0, 2.0], [1.0, 1.0, 1.0], "the new run has 2 step time"),
    ([1.0, 1.0, 1.0], [], "the baseline has 0 step time"),
    ([1.0, 0.0, 1.0], [1.0, 1.0, 1.0], r"step time #1 is 0.0; step times must be positive"),
    ([1.0, 1.0, 1.0], [1.0, float("nan"), 1.0], "must be positive and finite"),
    ([1.0, 1.0, -1.0], [1.0, 1.0, 1.0], "must be positive and finite"),
])
def test_bad_samples_raise_clearly(now: list[float], base: list[float], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        step_time_ratio(now, base)


def test_bad_parameters_raise() -> None:
    with pytest.raises(ValueError, match="confidence"):
        step_time_ratio([1.0] * 3, [1.0] * 3, confidence=1.5)
    with pytest.raises(ValueError, match="n_resamples"):
        step_time_ratio([1.0] * 3, [1.0] * 3, n_resamples=0)


def test_confidence_widens_the_interval() -> None:
    now, base = noisy(20, 1.0, 0.2, seed=10), noisy(20, 1.0, 0.2, seed=11)
    narrow = step_time_ratio(now, base, confidence=0.5)
    wide = step_time_ratio(now, base, confidence=0.99)
    assert wide.mdc > narrow.mdc
    assert wide.confidence == 0.99


@pytest.mark.parametrize(("estimate", "tolerance", "verdict"), [
    (est(1.30, 1.20, 1.40), 0.10, Verdict.REGRESSION),
    (est(1.15, 0.99, 1.31), 0.10, Verdict.INCONCLUSIVE),  # mdc 0.16 > 0.10
    (est(1.12, 0.98, 1.16), 0.10, Verdict.PASS),  # above tolerance, interval reaches 1
    (est(1.05, 1.02, 1.08), 0.10, Verdict.PASS),  # surely slower, but within tolerance
    (est(0.70, 0.65, 0.75), 0.10, Verdict.IMPROVEMENT),
    (est(0.85, 0.80, 1.01), 0.20, Verdict.PASS),  # faster, but not beyond tolerance
    (est(0.85, 0.82, 1.01), 0.10, Verdict.PASS),  # interval reaches 1
    (est(1.00, 1.00, 1.00), 0.00, Verdict.PASS),
    # wide, but wholly past the tolerance: a regression (improvement) however noisy
    (est(2.00, 1.40, 2.60), 0.10, Verdict.REGRESSION),
    (est(0.50, 0.30, 0.80), 0.10, Verdict.IMPROVEMENT),
    (est(2.00, 1.05, 2.95), 0.10, Verdict.INCONCLUSIVE),  # wide and reaching the tolerance
])
def test_verdict_rule(estimate: RatioEstimate, tolerance: float, verdict: Verdict) -> None:
    assert throughput_verdict(estimate, tolerance) is verdict


INC = Verdict.INCONCLUSIVE


@pytest.mark.parametrize(("estimate", "verdict", "stored"), [
    # the stored check's rule where it names a change or resolves the tolerance
    (est(1.30, 1.20, 1.40), Verdict.REGRESSION, Verdict.REGRESSION),
    (est(1.005, 0.998, 1.012), Verdict.PASS, Verdict.PASS),
    # significant, past the tolerance, interval up to twice the tolerance: named
    (est(1.021, 1.0095, 1.0335), Verdict.REGRESSION, INC),
    (est(0.979, 0.966, 0.991), Verdict.IMPROVEMENT, INC),
    # past twice the tolerance: inconclusive, however far from 1 its estimate
    (est(0.968, 0.941, 0.997), INC, INC),
    (est(1.05, 1.005, 1.095), INC, INC),
    # within twice the tolerance but reaching 1, or an estimate within the tolerance
    (est(1.015, 0.998, 1.032), INC, INC),
    (est(1.008, 1.001, 1.025), INC, INC),
])
def test_ab_verdict_rule(estimate: RatioEstimate, verdict: Verdict, stored: Verdict) -> None:
    """A/B mode names a significant change past the tolerance while its interval is up to
    twice the tolerance wide; the stored check calls those inconclusive."""
    assert ab_verdict(estimate, 0.01) is verdict
    assert throughput_verdict(estimate, 0.01) is stored


@pytest.mark.timing
def test_fast_enough() -> None:
    now, base = noisy(50, 1.0, 0.1, seed=12), noisy(50, 1.0, 0.1, seed=13)
    step_time_ratio(now, base)  # warm up imports and caches
    start = time.perf_counter()
    for _ in range(5):
        step_time_ratio(now, base)
    assert (time.perf_counter() - start) / 5 < 0.05
