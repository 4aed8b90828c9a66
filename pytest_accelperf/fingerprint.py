"""The environment fingerprint stored with every baseline.

Throughput measured under another framework version, device or host CPU is not evidence
about this change, so a differing fingerprint makes the throughput check ``incomparable``
(with a warning) while convergence, memory and numerics are still checked.
"""

from __future__ import annotations

import platform as _platform
from collections.abc import Collection, Iterable, Sequence
from importlib import metadata
from typing import Any

from pytest_accelperf.accel import Accelerator, cpu_isa, host_cpu
from pytest_accelperf.backends.registry import BACKENDS, UnknownBackend
from pytest_accelperf.backends.spec import BackendSpec

#: Packages whose versions go into the fingerprint when installed: those the built-in
#: backends declare (:mod:`pytest_accelperf.backends.builtin`). A session adds those of every
#: backend it has registered; a package outside them (added through the
#: ``pytest_accelperf_environment`` hook) always matters.
PACKAGES = BACKENDS.packages()

#: Keys that must match for step times to be comparable.
THROUGHPUT_KEYS = ("platform", "device_kind", "device_count", "host_cpu", "cpu_isa", "python",
                   "packages")
#: Keys that must match for the step's program to be comparable: what the frameworks
#: compile or dispatch for the platform, not the host's CPU model or features. A baseline
#: recorded on a CI runner with other CPU flags (avx_vnni) made every program check
#: ``incomparable``, the one check that needs no timing; the torch eager records and the
#: XLA:CPU programs of the suites were the same on both hosts.
PROGRAM_KEYS = ("platform", "device_kind", "device_count", "python", "packages")


def environment(accel: Accelerator, packages_of: Iterable[str] = PACKAGES) -> dict[str, Any]:
    """This machine's fingerprint: platform, device, host CPU, Python, and the versions of
    ``packages_of`` that are installed (the session passes every registered backend's)."""
    packages: dict[str, str] = {}
    for name in packages_of:
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


def _declared(backend: str | BackendSpec | None) -> tuple[str, ...] | None:
    """The packages ``backend`` declares (a built-in's by name); None: all of them count."""
    if isinstance(backend, str):
        try:
            backend = BACKENDS[backend]
        except UnknownBackend:
            return None
    return backend.packages if backend is not None else None


def differences(now: dict[str, Any], base: dict[str, Any],
                backend: str | BackendSpec | None = None, *,
                known: Collection[str] = PACKAGES,
                keys: Sequence[str] = THROUGHPUT_KEYS) -> list[str]:
    """Human-readable differences that make throughput incomparable, empty when comparable
    (``keys=PROGRAM_KEYS``: those that make the program incomparable).

    With ``backend`` (its spec, or a built-in's name), only the packages that backend
    declares are compared among the ``known`` backend packages: installing torch beside jax
    does not change a jax step. A package outside ``known`` always counts.

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
    for key in keys:
        a, b = base.get(key), now.get(key)
        if key == "packages" and isinstance(a, dict) and isinstance(b, dict):
            relevant = _declared(backend)
            for name in sorted(set(a) | set(b)):
                if relevant is not None and name in known and name not in relevant:
                    continue
                if a.get(name) != b.get(name):
                    out.append(f"{name}: {a.get(name, 'absent')} -> {b.get(name, 'absent')}")
        elif key == "cpu_isa" and isinstance(a, str) and isinstance(b, str) and a != b:
            out.append(f"{key}: {_isa_change(a, b)}")
        elif a != b:
            out.append(f"{key}: {a} -> {b}")
    return out
