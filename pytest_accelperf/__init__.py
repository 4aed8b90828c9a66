"""pytest-accelperf: catch throughput, convergence, memory and numerics regressions in ML
training before they reach the accelerator fleet.

Public API::

    from pytest_accelperf import cases, grid, Case
"""

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pytest_accelperf.collect.cases import Case, cases, grid
    from pytest_accelperf.errors import AccelperfWarning
    from pytest_accelperf.gate.maxbatch import MaxBatch
    from pytest_accelperf.gate.runner import CaseResult, CaseRunner, MaxBatchSearch
    from pytest_accelperf.provision.accel import Accelerator
    from pytest_accelperf.records.run import Run
    from pytest_accelperf.records.verdict import CheckResult, Tolerances, Verdict
    from pytest_accelperf.torch import Built, RankStep

__version__ = "0.1.0"

#: Where each other name of the public API lives: imported when first asked for, so that
#: ``import pytest_accelperf`` (and every ``accelperf`` command) does not import the
#: collector, the runner, every check, pydantic, numpy and scipy before it needs them;
#: ``pytest_accelperf.torch`` only for a torch user.
_LAZY = {
    # The decorator ``cases`` lives in ``pytest_accelperf.collect.cases``: importing that
    # module sets ``pytest_accelperf.collect.cases``, never this package's ``cases``.
    "Case": "pytest_accelperf.collect.cases",
    "cases": "pytest_accelperf.collect.cases",
    "grid": "pytest_accelperf.collect.cases",
    "Accelerator": "pytest_accelperf.provision.accel",
    "AccelperfWarning": "pytest_accelperf.errors",
    "Built": "pytest_accelperf.torch",
    "CaseResult": "pytest_accelperf.gate.runner",
    "CaseRunner": "pytest_accelperf.gate.runner",
    "CheckResult": "pytest_accelperf.records.verdict",
    "MaxBatch": "pytest_accelperf.gate.maxbatch",
    "MaxBatchSearch": "pytest_accelperf.gate.runner",
    "RankStep": "pytest_accelperf.torch",
    "Run": "pytest_accelperf.records.run",
    "Tolerances": "pytest_accelperf.records.verdict",
    "Verdict": "pytest_accelperf.records.verdict",
}


def __getattr__(name: str) -> object:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
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
