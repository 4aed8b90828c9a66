"""pytest-accelperf: catch throughput, convergence, memory and numerics regressions in ML
training before they reach the accelerator fleet.

Public API::

    from pytest_accelperf import cases, grid, Case
"""

from pytest_accelperf.accel import Accelerator
from pytest_accelperf.cases import Case, cases, grid
from pytest_accelperf.checks.base import CheckResult, Tolerances, Verdict
from pytest_accelperf.maxbatch import MaxBatch
from pytest_accelperf.run import Run
from pytest_accelperf.session import AccelperfWarning, CaseResult, CaseRunner, MaxBatchSearch

__version__ = "0.1.0"

__all__ = [
    "Accelerator",
    "AccelperfWarning",
    "Case",
    "CaseResult",
    "CaseRunner",
    "CheckResult",
    "MaxBatch",
    "MaxBatchSearch",
    "Run",
    "Tolerances",
    "Verdict",
    "__version__",
    "cases",
    "grid",
]
