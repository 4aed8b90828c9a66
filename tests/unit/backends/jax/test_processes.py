"""A multi-host JAX case's processes (``backends/jax/processes.py``): each its share of the
devices, and the cases that cannot be split refused."""

from __future__ import annotations

import pytest

from pytest_accelperf.collect.cases import Case
from pytest_accelperf.provision.accel import Accelerator


def test_each_process_of_a_multihost_jax_case_gets_its_share_of_devices() -> None:
    from pytest_accelperf.backends.jax.processes import check_case, local_xla_flags

    flags = "--xla_cpu_foo=1 --xla_force_host_platform_device_count=8"
    assert local_xla_flags(flags, 4) == ("--xla_cpu_foo=1 "
                                         "--xla_force_host_platform_device_count=4")
    cpu = Accelerator(name="cpu", platform="cpu-x8", device_kind="cpu", device_count=8)
    with pytest.raises(ValueError, match="drop reference=True"):
        check_case(Case(backend="jax", batch=8, world_size=2, reference=True), cpu)
    with pytest.raises(ValueError, match="do not split over 3 processes"):
        check_case(Case(backend="jax", batch=8, world_size=3), cpu)
