"""Where a case trains: in this process, in ranks, or on a Ray cluster.

The one place that makes the choice, from what the backend's spec declares
(:class:`~pytest_accelperf.backends.spec.BackendSpec`) and the session's settings; no
backend knows the others, nor chooses for itself:

* ``ray``: ``--accelperf-cluster`` is set; the case trains in Ray workers
  (:mod:`pytest_accelperf.cluster.dispatch`), in its backend's ranks when it spans
  processes. A backend that declares ``ray=False`` is refused, naming the fix.
* ``ranks``: ``world_size > 1`` and the spec names ``ranks``: the case trains in
  ``world_size`` processes the plugin launches on this machine
  (:func:`~pytest_accelperf.backends.procs.ranks.train_in_ranks`).
* ``in-process``: the backend's ``train`` runs the steps in this process (the plugin
  interrupts a step that blocks past the timeout).
* ``launched``: the backend's ``train`` launches processes of its own and stops them at
  the timeout itself (``in_process=False``: DeepSpeed, every case).
"""

from __future__ import annotations

from typing import Any, Literal

from pytest_accelperf.accel import Accelerator
from pytest_accelperf.backends.procs.ranks import train_in_ranks
from pytest_accelperf.backends.protocol import Fit, TrainResult
from pytest_accelperf.backends.spec import BackendSpec
from pytest_accelperf.cases import Case
from pytest_accelperf.errors import ConfigError

Route = Literal["ray", "ranks", "in-process", "launched"]


def route(spec: BackendSpec, case: Case, *, cluster: bool) -> Route:
    """Where ``case`` of backend ``spec`` trains (see the module doc)."""
    if cluster:
        if not spec.ray:
            raise ConfigError(
                f"{case.id}: the {spec.name} backend does not train on a Ray cluster (its "
                f"BackendSpec says ray=False): run it without --accelperf-cluster")
        return "ray"
    if spec.spans_ranks(case.world_size):
        return "ranks"
    return "in-process" if spec.in_process else "launched"


def train_here(spec: BackendSpec, case: Case, task: Any, accel: Accelerator, *,
               timeout: float | None) -> TrainResult:
    """Train ``case`` on this machine: in its backend's ranks when it spans processes,
    else by the backend's own ``train`` (the caller interrupts an ``in-process`` one that
    blocks; see :func:`route`)."""
    if spec.spans_ranks(case.world_size):
        return train_in_ranks(spec.load_ranks(), case, task, accel, timeout=timeout)
    result: TrainResult = spec.load().train(case, task, accel, timeout=timeout)
    return result


def fits(spec: BackendSpec, case: Case, task: Any, accel: Accelerator, *,
         timeout: float | None) -> Fit:
    """Whether ``case`` fits (the maximum-batch search), asked where it would train."""
    if spec.spans_ranks(case.world_size):
        return spec.load_ranks().fits(case, task, accel, timeout=timeout)
    fit: Fit = spec.load().fits(case, task, accel, timeout=timeout)
    return fit
