"""How change points are searched in a series measured with noise: the settings of
:mod:`pytest_accelperf.report.changes`, and their defaults.

Their own module, without the search's imports (numpy, ruptures, SciPy, the history), so
that ``accelperf``'s parser can show ``--max-pvalue``'s default without importing them.
"""

from __future__ import annotations

from dataclasses import dataclass

#: The least sessions a change must hold, and stand on, to count (a timing series).
MIN_SESSIONS = 3
#: The largest p-value of a change point in a series measured with noise.
MAX_PVALUE = 0.001
#: The penalty of a change in the search, in units of the series' noise variance times
#: log(sessions): BIC's 2, so that the search proposes what the test then judges.
PENALTY = 2.0


@dataclass(frozen=True)
class Detection:
    """How change points are searched in a series measured with noise."""

    max_pvalue: float = MAX_PVALUE
    min_sessions: int = MIN_SESSIONS
    penalty: float = PENALTY
