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
* ``in-process``: the backend's ``train`` runs the steps in this process
  (:func:`pytest_accelperf.gate.hangs.train_in_process` interrupts a step that blocks past the
  timeout).
* ``launched``: the backend's ``train`` launches processes of its own and stops them at
  the timeout itself (``in_process=False``: DeepSpeed, every case).

:func:`train` trains a case where :func:`route` sends it; whether a batch fits is asked where
it trains (:func:`pytest_accelperf.backends.local.fits`).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Literal

from pytest_accelperf.backends.local import train_here
from pytest_accelperf.backends.protocol import Task, TrainResult
from pytest_accelperf.backends.spec import BackendSpec
from pytest_accelperf.cluster.dispatch import train as train_on_cluster
from pytest_accelperf.collect.cases import Case
from pytest_accelperf.errors import ConfigError
from pytest_accelperf.gate.hangs import train_in_process
from pytest_accelperf.gate.options import Settings
from pytest_accelperf.provision.accel import Accelerator
from pytest_accelperf.records.environment import Environment
from pytest_accelperf.records.run import Run

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


def train(spec: BackendSpec, case: Case, task: Task, accel: Accelerator, *, settings: Settings,
          on_cluster: bool, host: Callable[[], AbstractContextManager[object]],
          environment: Environment, on_stuck: Callable[[Run], None]) -> TrainResult:
    """Train ``case`` where :func:`route` says. On the Ray cluster (``on_cluster``: the
    session has one) the cluster's resources, not the host lock, keep cases apart. Else it
    trains under ``host()`` (the host lock): ``in-process`` by
    :func:`~pytest_accelperf.gate.hangs.train_in_process`, which interrupts a step that blocks
    past the timeout (``environment`` is the run's then, and ``on_stuck(run)`` is called
    with the run of a case that cannot be stopped); ``ranks`` and ``launched`` by
    :func:`~pytest_accelperf.backends.local.train_here`, whose launcher kills them at the
    timeout itself."""
    __tracebackhide__ = True
    where = route(spec, case, cluster=on_cluster)
    if where == "ray":
        return train_on_cluster(case, task, accel, cpu_devices=settings.cpu_devices,
                                platform=settings.platform, timeout=settings.timeout,
                                wait=settings.cluster_wait, spec=spec)
    with host():
        if where == "in-process":
            return train_in_process(spec.load(), case, task, accel, timeout=settings.timeout,
                                    environment=environment, on_stuck=on_stuck)
        return train_here(spec, case, task, accel, timeout=settings.timeout)
