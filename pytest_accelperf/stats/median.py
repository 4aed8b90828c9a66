"""The interval of a median: distribution-free, from the order statistics of the samples.

A session's step times are not normal (a long tail of slow steps), so the interval a plot
draws around a session's median step time is the one that needs no assumption about their
distribution: ``[x_(j), x_(n+1-j)]`` of the sorted samples, ``j`` the largest rank whose
coverage ``P(j <= B <= n - j)``, ``B ~ Binomial(n, 1/2)``, is at least the confidence
(Hollander & Wolfe, *Nonparametric Statistical Methods*, 3.6). Pure Python: the history
writes it for every case of every session, and the report and the published history draw
it.

>>> median_interval([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0])
(2.0, 9.0)
>>> median_interval([5.0]) is None
True
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def _pmf(n: int, k: int) -> float:
    """``P(B = k)`` for ``B ~ Binomial(n, 1/2)``, in log space (no underflow of 2**-n)."""
    return math.exp(math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)
                    - n * math.log(2.0))


def median_interval(samples: Sequence[float], confidence: float = 0.95
                    ) -> tuple[float, float] | None:
    """The ``confidence`` interval of the median of ``samples`` (finite numbers), or None
    with fewer than 2. With too few samples for the confidence (under 6 at 95 %), the
    range of the samples: the widest interval they give."""
    xs = sorted(x for x in samples if math.isfinite(x))
    n = len(xs)
    if n < 2:
        return None
    if n > 2000:  # the normal approximation of the rank: exact enough, and O(1)
        z = 1.959963984540054 if confidence == 0.95 else _z(confidence)
        j = max(1, math.floor(n / 2 - z * math.sqrt(n) / 2))
        return xs[j - 1], xs[n - j]
    # coverage of rank j: 1 - 2 P(B < j); raise j while the next rank still covers
    j, below = 1, _pmf(n, 0)
    while j + 1 <= n // 2 and 1.0 - 2.0 * (below + _pmf(n, j)) >= confidence:
        below += _pmf(n, j)
        j += 1
    return xs[j - 1], xs[n - j]


def _z(confidence: float) -> float:
    from statistics import NormalDist

    return NormalDist().inv_cdf(0.5 + confidence / 2)
