"""pytest-accelperf: catch throughput, convergence, memory and numerics regressions in ML
training before they reach the accelerator fleet.

Public API::

    from pytest_accelperf import cases, grid, Case
"""

from typing import TYPE_CHECKING

from pytest_accelperf.accel import Accelerator
from pytest_accelperf.cases import Case, cases, grid
from pytest_accelperf.checks.base import CheckResult, Tolerances, Verdict
from pytest_accelperf.maxbatch import MaxBatch
from pytest_accelperf.run import Run
from pytest_accelperf.runner import CaseResult, CaseRunner, MaxBatchSearch
from pytest_accelperf.session import AccelperfWarning

if TYPE_CHECKING:
    from pytest_accelperf.torch import Built, RankStep

__version__ = "0.1.0"

#: Exports that import a framework, loaded on first use (``import pytest_accelperf`` and the
#: plugin stay framework-free).
_LAZY = {"RankStep": "pytest_accelperf.torch", "Built": "pytest_accelperf.torch"}


def __getattr__(name: str) -> object:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'pytest_accelperf' has no attribute {name!r}")

__all__ = [
    "Accelerator",
    "AccelperfWarning",
    "Built",
    "Case",
    "CaseResult",
    "CaseRunner",
    "CheckResult",
    "MaxBatch",
    "MaxBatchSearch",
    "RankStep",
    "Run",
    "Tolerances",
    "Verdict",
    "__version__",
    "cases",
    "grid",
]
