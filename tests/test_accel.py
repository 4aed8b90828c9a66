"""Provisioning helpers: platform keys, peak FLOPs, device environment per xdist worker."""

from __future__ import annotations

import pytest

from pytest_accelperf.accel import (
    assign_worker_devices,
    peak_flops,
    platform_key,
    prepare_environment,
    worker_visible_devices,
)


def test_platform_keys() -> None:
    assert platform_key("cpu", "cpu", 8) == "cpu-x8"
    assert platform_key("tpu", "TPU v4", 8) == "tpu-v4-x8"
    assert platform_key("gpu", "NVIDIA H100 80GB HBM3", 8) == "gpu-nvidia-h100-80gb-hbm3-x8"


def test_peak_flops_table() -> None:
    assert peak_flops("TPU v5 lite") == 197e12
    assert peak_flops("TPU v5p") == 459e12
    assert peak_flops("NVIDIA H100 PCIe") == 756e12
    assert peak_flops("NVIDIA H100 80GB HBM3") == 989e12
    assert peak_flops("NVIDIA A100-SXM4-40GB") == 312e12
    assert peak_flops("cpu") is None


def test_prepare_environment_keeps_other_flags_and_replaces_count() -> None:
    env = {"XLA_FLAGS": "--xla_dump_to=/tmp/x --xla_force_host_platform_device_count=2"}
    prepare_environment("cpu", 8, env)
    assert env["XLA_FLAGS"] == "--xla_dump_to=/tmp/x --xla_force_host_platform_device_count=8"
    assert env["JAX_PLATFORMS"] == "cpu"
    gpu_env: dict[str, str] = {}
    prepare_environment("gpu", 8, gpu_env)
    assert "JAX_PLATFORMS" not in gpu_env


def test_workers_get_disjoint_device_slices() -> None:
    assert worker_visible_devices(8, 0, 2) == [0, 1, 2, 3]
    assert worker_visible_devices(8, 1, 2) == [4, 5, 6, 7]
    assert worker_visible_devices(8, 2, 3) == [4, 5]
    with pytest.raises(ValueError, match="run with -n 2 or less"):
        worker_visible_devices(2, 0, 4)


def test_gpu_workers_get_their_own_cuda_devices() -> None:
    env = {"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}
    assert assign_worker_devices("gpu", "gw1", 2, env) == [4, 5, 6, 7]
    assert env["CUDA_VISIBLE_DEVICES"] == "4,5,6,7"
    cpu_env = {"CUDA_VISIBLE_DEVICES": "0,1"}
    assert assign_worker_devices("cpu", "gw1", 2, cpu_env) is None
    assert cpu_env["CUDA_VISIBLE_DEVICES"] == "0,1"
