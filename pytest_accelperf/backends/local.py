"""A case trained, or its fit asked, on this machine: in its backend's ranks when it spans
processes, else by the backend's own ``train`` or ``fits`` in this process. What the gate's
routing (:mod:`pytest_accelperf.gate.routing`) does where a case does not go to a Ray
cluster, and what an A/B worker trains its arm's record with
(:mod:`pytest_accelperf.ab.worker`).
"""

from __future__ import annotations

from pytest_accelperf.backends.procs.ranks import train_in_ranks
from pytest_accelperf.backends.protocol import Fit, Task, TrainResult
from pytest_accelperf.backends.spec import BackendSpec
from pytest_accelperf.collect.cases import Case
from pytest_accelperf.provision.accel import Accelerator


def train_here(spec: BackendSpec, case: Case, task: Task, accel: Accelerator, *,
               timeout: float | None) -> TrainResult:
    """Train ``case`` on this machine: in its backend's ranks when it spans processes,
    else by the backend's own ``train`` (the caller interrupts an ``in-process`` one that
    blocks; see :func:`pytest_accelperf.gate.routing.route`)."""
    if spec.spans_ranks(case.world_size):
        return train_in_ranks(spec.load_ranks(), case, task, accel, timeout=timeout)
    result: TrainResult = spec.load().train(case, task, accel, timeout=timeout)
    return result


def fits(spec: BackendSpec, case: Case, task: Task, accel: Accelerator, *,
         timeout: float | None) -> Fit:
    """Whether ``case`` fits (the maximum-batch search), asked where it would train."""
    if spec.spans_ranks(case.world_size):
        return spec.load_ranks().fits(case, task, accel, timeout=timeout)
    fit: Fit = spec.load().fits(case, task, accel, timeout=timeout)
    return fit
