"""The A/B throughput row: its two figures and its change come from one estimator."""

from __future__ import annotations

import pytest
from conftest import rounds_of_pairs

from pytest_accelperf.ab.rounds import ABMeasurement
from pytest_accelperf.ab.verdict import ab_check
from pytest_accelperf.records.verdict import Verdict


def test_the_row_s_figures_are_the_paired_estimate_not_the_noisy_medians() -> None:
    """Every head block's fastest step is 1.5x the base's, while one disturbed step in
    each head block drags the head's median of every step below the base's: the row
    used to read the medians (head faster) beside a change of the paired ratio (slower)."""
    base = [[0.010, 0.011, 0.030, 0.031, 0.032]] * 8
    head = [[0.015, 0.016, 0.017, 0.018, 0.019]] * 8
    check = ab_check("HEAD", ABMeasurement(base=base, head=head, seconds=4.0,
                                           first=["base", "head"] * 4), 32, 0.01, 5)
    assert check.verdict is Verdict.REGRESSION
    assert check.data["ratio"] == pytest.approx(1.5)
    assert check.baseline == pytest.approx(32 / 0.010)
    assert check.now == pytest.approx(32 / 0.015)
    assert check.change == pytest.approx(check.now / check.baseline - 1)
    assert check.change < 0  # slower: fewer samples a second
    # The medians of every step stay in the record, as they were measured.
    assert check.data["median_step_time"] == {"now": 0.017, "baseline": 0.030}


def _pairs(ratios: list[float], per_pair: int, jitter: float) -> ABMeasurement:
    """An A/B measurement over one process pair per entry of ``ratios`` (the head's step
    time over the base's in that pair)."""
    base, head, pairs = rounds_of_pairs([(1.0, r) for r in ratios], per_pair, jitter)
    return ABMeasurement(base=base, head=head, seconds=4.0,
                         first=["base", "head"] * (len(pairs) // 2), pairs=pairs,
                         processes=len(ratios))


def test_an_interval_over_two_pairs_names_more_pairs_as_its_remedy() -> None:
    """CI measured 4x the work as 4.12x in one process pair and 5.73x in the other: over
    two pairs Student's t is 12.71 and the interval (0.59-39.8) could not judge it. The
    advice was a longer budget, which adds rounds to each pair and leaves t as it is."""
    two = ab_check("HEAD", _pairs([4.12, 5.73], per_pair=4, jitter=0.02), 32, 0.05, 5)
    assert two.verdict is Verdict.INCONCLUSIVE
    assert "raise --accelperf-compare-processes (over 2 process pairs the interval is " \
           "Student's t 12.71 standard errors wide each way, over 3 4.30; the processes' " \
           "spread counts for more in it than the rounds'" in two.detail
    assert "--accelperf-compare-budget" not in two.detail
    # three pairs that disagree as much judge it
    three = ab_check("HEAD", _pairs([4.12, 5.73, 4.9], per_pair=4, jitter=0.02), 32, 0.05, 5)
    assert three.verdict is Verdict.REGRESSION, three.detail
    # where the rounds are what is noisy, across enough pairs, the budget is the remedy
    noisy = ab_check("HEAD", _pairs([1.04] * 5, per_pair=4, jitter=0.3), 32, 0.01, 5)
    assert noisy.verdict is Verdict.INCONCLUSIVE
    assert noisy.detail.endswith("raise --accelperf-compare-budget or use a quieter machine")
