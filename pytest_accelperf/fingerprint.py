"""The environment fingerprint stored with every baseline.

Throughput measured under another framework version, device or host CPU is not evidence
about this change, so a differing fingerprint makes the throughput check ``incomparable``
(with a warning) while convergence, memory and numerics are still checked.
"""

from __future__ import annotations

import platform as _platform
from importlib import metadata
from typing import Any

from pytest_accelperf.accel import Accelerator, cpu_isa, host_cpu

#: Packages whose versions go into the fingerprint when installed.
PACKAGES = ("jax", "jaxlib", "flax", "optax", "numpy", "torch", "deepspeed")

#: The packages whose versions matter to a backend's step time. A package outside
#: ``PACKAGES`` (added through the ``pytest_accelperf_environment`` hook) always matters.
BACKEND_PACKAGES: dict[str, tuple[str, ...]] = {
    "jax": ("jax", "jaxlib", "flax", "optax", "numpy"),
    "torch": ("torch", "numpy"),
    "deepspeed": ("torch", "deepspeed", "numpy"),
    "neuron": ("torch", "numpy"),
    "alpa": ("jax", "jaxlib", "flax", "optax", "numpy"),
    "jax-pipeline": ("jax", "jaxlib", "flax", "optax", "numpy"),
    # An ingested log: this machine's packages say nothing about it; its own versions
    # (compiler, runtime) come with the log under other names and always count.
    "external": (),
}

#: Keys that must match for step times to be comparable.
THROUGHPUT_KEYS = ("platform", "device_kind", "device_count", "host_cpu", "cpu_isa", "python",
                   "packages")


def environment(accel: Accelerator) -> dict[str, Any]:
    packages: dict[str, str] = {}
    for name in PACKAGES:
        try:
            packages[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return {
        "platform": accel.platform,
        "accel": accel.name,
        "device_kind": accel.device_kind,
        "device_count": accel.device_count,
        "host_cpu": host_cpu(),
        "cpu_isa": cpu_isa(),
        "python": _platform.python_version(),
        "packages": packages,
    }


def _isa_change(base: str, now: str) -> str:
    """What a host's CPU features lack or add against the baseline's (only the difference:
    the whole list is a line of 15 flags)."""
    lacks = sorted(set(base.split()) - set(now.split()))
    adds = sorted(set(now.split()) - set(base.split()))
    parts = ([f"this host lacks {' '.join(lacks)}"] if lacks else []) + \
        ([f"this host adds {' '.join(adds)}"] if adds else [])
    return "; ".join(parts) or f"{base} -> {now}"


def differences(now: dict[str, Any], base: dict[str, Any],
                backend: str | None = None) -> list[str]:
    """Human-readable differences that make throughput incomparable, empty when comparable.

    With ``backend``, only the packages that backend runs on are compared: installing torch
    beside jax does not change a jax step.

    >>> differences({"python": "3.11.7"}, {"python": "3.12.1"})
    ['python: 3.12.1 -> 3.11.7']
    >>> differences({"packages": {"torch": "2.13.0"}}, {"packages": {}}, backend="jax")
    []
    >>> differences({"packages": {"torch": "2.13.0"}}, {"packages": {}}, backend="torch")
    ['torch: absent -> 2.13.0']
    >>> differences({"cpu_isa": "avx avx2 fma"}, {"cpu_isa": "avx avx2 avx512f avx512bw fma"})
    ['cpu_isa: this host lacks avx512bw avx512f']
    """
    out: list[str] = []
    for key in THROUGHPUT_KEYS:
        a, b = base.get(key), now.get(key)
        if key == "packages" and isinstance(a, dict) and isinstance(b, dict):
            relevant = BACKEND_PACKAGES.get(backend or "")
            for name in sorted(set(a) | set(b)):
                if relevant is not None and name in PACKAGES and name not in relevant:
                    continue
                if a.get(name) != b.get(name):
                    out.append(f"{name}: {a.get(name, 'absent')} -> {b.get(name, 'absent')}")
        elif key == "cpu_isa" and isinstance(a, str) and isinstance(b, str) and a != b:
            out.append(f"{key}: {_isa_change(a, b)}")
        elif a != b:
            out.append(f"{key}: {a} -> {b}")
    return out
