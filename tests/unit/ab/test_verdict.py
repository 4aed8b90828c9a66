"""The A/B throughput row: its two figures and its change come from one estimator."""

from __future__ import annotations

import pytest

from pytest_accelperf.ab.rounds import ABMeasurement
from pytest_accelperf.ab.verdict import ab_check
from pytest_accelperf.checks.base import Verdict


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
