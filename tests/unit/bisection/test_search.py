"""The bisection's search over a commit range (``bisection/search.py``): halving, and
stepping around a skipped commit as git bisect skip does."""

from __future__ import annotations

import pytest

from pytest_accelperf.bisection.search import Search


def test_the_search_halves_and_steps_around_a_skipped_commit() -> None:
    search = Search(16)
    tried = []
    first_bad = 11  # 0-based: commit 12 of 16
    while (index := search.next()) is not None:
        tried.append(index)
        search.mark(index, "bad" if index >= first_bad else "good")
    assert tried == [7, 11, 9, 10] and search.suspects() == [11]
    search = Search(16)
    search.mark(7, "skip")
    assert search.next() == 8  # the nearest to the middle, not skipped
    search.mark(8, "bad")
    assert search.next() == 3


def test_only_skipped_commits_left_names_them_all() -> None:
    search = Search(8)
    search.mark(3, "good")
    search.mark(5, "skip")
    search.mark(4, "skip")
    search.mark(6, "skip")
    assert search.next() is None
    assert search.suspects() == [4, 5, 6, 7]  # any of the skipped ones, or BAD
    with pytest.raises(ValueError, match="outside"):
        search.mark(2, "bad")


def test_a_one_commit_range_needs_no_midpoint() -> None:
    search = Search(1)
    assert search.next() is None and search.suspects() == [0]
