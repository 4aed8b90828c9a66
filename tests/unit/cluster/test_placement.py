"""What a case asks the Ray cluster for (``cluster/placement.py``): the whole host, or the
platform's devices, and whether the nodes can give it."""

from __future__ import annotations

from pytest_accelperf.cluster.connection import HOST_RESOURCE
from pytest_accelperf.cluster.placement import feasible, placement
from pytest_accelperf.collect.cases import Case
from pytest_accelperf.provision.accel import Accelerator


def test_placement_holds_the_whole_host_or_the_platform_devices() -> None:
    one_host = [{"Resources": {"CPU": 2.0, HOST_RESOURCE: 1.0}}]
    cpu = Accelerator(name="cpu", platform="cpu-x8", device_kind="cpu", device_count=8)
    assert placement(Case(backend="jax", batch=8), cpu, one_host) == (
        [{HOST_RESOURCE: 1.0}], "PACK")
    two = Case(backend="deepspeed", zero_stage=0, batch=8, world_size=2)
    # one host: the two ranks share it, and hold all of it
    assert placement(two, cpu, one_host) == ([{HOST_RESOURCE: 0.5}] * 2, "PACK")
    assert placement(two, cpu, one_host * 2) == ([{HOST_RESOURCE: 1.0}] * 2, "STRICT_SPREAD")
    gpu = Accelerator(name="gpu", platform="gpu-h100-x8", device_kind="H100", device_count=8)
    assert placement(two, gpu, []) == ([{"GPU": 4.0}] * 2, "SPREAD")
    assert feasible([{HOST_RESOURCE: 0.5}] * 2, "PACK", one_host)
    assert not feasible([{"GPU": 8.0}], "PACK", one_host)
    assert not feasible([{HOST_RESOURCE: 1.0}] * 2, "STRICT_SPREAD", one_host)
