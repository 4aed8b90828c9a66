"""The bisection's driver (``bisection/driver.py``): what it offers when only skipped commits
are left."""

from __future__ import annotations

from pathlib import Path

from pytest_accelperf.bisection.commits import Commit


def test_only_skipped_commits_left_offers_the_narrowed_bisection() -> None:
    """Exit status 5 names the commits left and the command that bisects only them: from
    the last good commit to the known bad one, with twice the A/B budget on timing (found
    trying bisect on nanoGPT: a contaminated midpoint left two suspects, and the rerun on
    them found the culprit in 3)."""
    from pytest_accelperf.bisection.commits import CommitRange
    from pytest_accelperf.bisection.driver import Settings, narrowed

    commits = tuple(Commit(f"{i:040x}", f"commit {i}") for i in range(1, 9))
    rng = CommitRange(Path("/repo"), Commit("f" * 40, "GOOD"), commits[-1], commits)
    settings = Settings(("test_suite.py", "--accel=cpu"), 0.05, None)
    text = narrowed(rng, settings, commits[4:6], "timing")
    assert text == ("to decide between them, bisect only them on a quieter machine or with "
                    "more time to measure: accelperf bisect --tolerance 0.05 --budget 40 "
                    f"{commits[3].sha[:10]} {commits[5].sha[:10]} -- test_suite.py "
                    "--accel=cpu")
    first = narrowed(rng, Settings(("t.py",), 0.01, 5.0), commits[:2], "program")
    assert first.endswith(f"--budget 5 {'f' * 10} {commits[1].sha[:10]} -- t.py")
    assert "once what made them untestable is fixed" in first
