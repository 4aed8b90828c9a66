"""Which commit a bisection tries next (see :mod:`pytest_accelperf.bisection`): binary search
over the commits of a range, oldest first, with ``git bisect skip``'s rule for a commit
that cannot be tested.

The commits are numbered ``0 .. n-1``, ``n-1`` being BAD (known bad) and GOOD the ``-1``
before them (known good). The first bad commit is one of ``good+1 .. bad``; the next to try
is the untested commit nearest the middle of ``good`` and ``bad``, not skipped. When none is
left, the first bad commit is ``bad`` if every commit between is known good, else any of
the skipped ones between and ``bad`` (:meth:`Search.suspects`).

>>> s = Search(16)
>>> s.next()
7
>>> s.mark(7, "bad"); s.next()
3
>>> s.mark(3, "skip"); s.next()
4
"""

from __future__ import annotations

from typing import Literal


class Search:
    """The state of a bisection over ``count`` commits (the last one BAD)."""

    def __init__(self, count: int) -> None:
        if count < 1:
            raise ValueError("a bisection needs at least one commit")
        self.count = count
        #: The newest commit known good (-1: GOOD) and the oldest known bad.
        self.good = -1
        self.bad = count - 1
        self.skipped: set[int] = set()

    def next(self) -> int | None:
        """The commit to test next: the one nearest the middle of ``(good, bad)`` that was
        not skipped (the newer one of two as near); None when none is left."""
        left = [i for i in range(self.good + 1, self.bad) if i not in self.skipped]
        if not left:
            return None
        middle = (self.good + self.bad) // 2
        return min(left, key=lambda i: (abs(i - middle), -i))

    def mark(self, index: int, call: Literal["good", "bad", "skip"]) -> None:
        """What testing commit ``index`` said."""
        if not self.good < index < self.bad:
            raise ValueError(f"commit {index} is outside ({self.good}, {self.bad})")
        if call == "good":
            self.good = index
        elif call == "bad":
            self.bad = index
        else:
            self.skipped.add(index)

    def suspects(self) -> list[int]:
        """The commits that may be the first bad one, once :meth:`next` is None: ``bad``
        alone, or the skipped commits before it and ``bad``."""
        return [i for i in range(self.good + 1, self.bad + 1)
                if i == self.bad or i in self.skipped]

