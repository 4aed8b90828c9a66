"""What a case asks a Ray cluster for (:func:`placement`: one placement-group bundle per
process, and a strategy) and whether the cluster's alive nodes could ever hold it
(:func:`feasible`), in words when they cannot (:func:`describe_nodes`). Plain data in, plain
data out: nothing here talks to Ray.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypedDict

from pytest_accelperf.cluster.connection import HOST_RESOURCE, ClusterError
from pytest_accelperf.collect.cases import Case
from pytest_accelperf.provision.accel import Accelerator


class Node(TypedDict, total=False):
    """What is read of a node of ``ray.nodes()`` (which has more keys)."""

    Alive: bool
    NodeID: str
    NodeManagerAddress: str
    Resources: dict[str, float]


#: Ray resource names of the accelerators (``--accel``).
DEVICE_RESOURCES = {"gpu": "GPU", "tpu": "TPU", "neuron": "neuron_cores"}


def process_count(case: Case) -> int:
    """Processes (hosts) a case spans: its ranks (``world_size > 1``), else one."""
    return case.world_size if case.world_size > 1 else 1


def placement(case: Case, accel: Accelerator,
              nodes: Sequence[Node]) -> tuple[list[dict[str, float]], str]:
    """The placement-group bundles (one per process) and strategy of ``case``.

    A case holds all the devices of the session's platform: on ``cpu`` the whole host
    (one ``accelperf_cpu_host``: shared by its processes when the cluster has fewer hosts
    than processes, else one host each), elsewhere the platform's device count split over
    its processes."""
    procs = process_count(case)
    if accel.name == "cpu":
        hosts = sum(1 for n in nodes if n.get("Resources", {}).get(HOST_RESOURCE, 0) >= 1)
        if procs > 1 and hosts >= procs:
            return [{HOST_RESOURCE: 1.0} for _ in range(procs)], "STRICT_SPREAD"
        return [{HOST_RESOURCE: round(1.0 / procs, 4)} for _ in range(procs)], "PACK"
    name = DEVICE_RESOURCES.get(accel.name)
    if name is None:
        raise ClusterError(f"--accel={accel.name} has no Ray resource; use cpu, gpu, tpu or "
                           f"neuron with --accelperf-cluster")
    if accel.device_count % procs:
        raise ClusterError(f"{case.id}: {procs} processes cannot split the "
                           f"{accel.device_count} devices of {accel.platform} evenly")
    per = float(accel.device_count // procs)
    return [{name: per} for _ in range(procs)], "PACK" if procs == 1 else "SPREAD"


def shown(resources: dict[str, float]) -> str:
    return ", ".join(f"{k}: {v:g}" for k, v in sorted(resources.items())) or "nothing"


def describe_nodes(nodes: Sequence[Node]) -> str:
    """``node 10.0.0.2 (id 3f2a9c1d): CPU: 2, accelperf_cpu_host: 1`` per alive node."""
    lines = []
    for n in nodes:
        res = {k: float(v) for k, v in n.get("Resources", {}).items()
               if not k.startswith(("node:", "accelerator_type:"))
               and k not in ("memory", "object_store_memory")}
        lines.append(f"node {n.get('NodeManagerAddress')} (id {str(n.get('NodeID'))[:8]}): "
                     f"{shown(res)}")
    return "; ".join(lines) or "no alive node"


def feasible(bundles: Sequence[dict[str, float]], strategy: str,
             nodes: Sequence[Node]) -> bool:
    """Whether the alive ``nodes`` could ever hold ``bundles`` (not whether they are free
    now): every bundle fits a node, the totals fit the cluster, and ``STRICT_SPREAD`` has
    a distinct node per bundle."""
    totals = [{k: float(v) for k, v in n.get("Resources", {}).items()} for n in nodes]

    def fits(bundle: dict[str, float], node: dict[str, float]) -> bool:
        return all(node.get(k, 0.0) + 1e-9 >= v for k, v in bundle.items())

    if not all(any(fits(b, t) for t in totals) for b in bundles):
        return False
    if strategy == "STRICT_SPREAD":
        return sum(1 for t in totals if fits(bundles[0], t)) >= len(bundles)
    if strategy == "PACK" and len(bundles) > 1:
        merged: dict[str, float] = {}
        for b in bundles:
            for k, v in b.items():
                merged[k] = merged.get(k, 0.0) + v
        return any(fits(merged, t) for t in totals) or all(
            sum(t.get(k, 0.0) for t in totals) + 1e-9 >= v for k, v in merged.items())
    return True
