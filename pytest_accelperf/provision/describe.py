"""The environment stored with every baseline: the machine, and the stack on it.

*The machine* (:data:`MACHINE_KEYS`: platform, device kind and count, host CPU and its
features) is what makes a timing taken elsewhere no evidence about this change: a baseline
from another machine makes throughput, compile and input time ``incomparable`` (with a
warning), and the program ``incomparable`` where the device differs
(:data:`PROGRAM_KEYS`), while convergence, memory and numerics are still checked.

*The stack* (:data:`STACK_KEYS`: Python, the framework packages and the accelerator's
libraries: libtpu, the CUDA runtime, cuDNN, NCCL, the driver, the Neuron SDK where
present) is the software under test. For the teams that run this plugin the commonest
cause of a slower step is an upgrade, so a stack that differs on the same machine is
compared, never ``incomparable``: every check judges it, and every verdict names the
difference (:func:`stack_changes`: ``stack: jax 0.8.3 → 0.10.2, jaxlib 0.8.3 →
0.10.2``). Baselines recorded before the split keep working: their ``python`` and
``packages`` are the stack, and a baseline without ``libraries`` compares none.
"""

from __future__ import annotations

import platform as _platform
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from importlib import metadata
from pathlib import Path

from pytest_accelperf.backends.registry import BACKENDS, UnknownBackend
from pytest_accelperf.backends.spec import BackendSpec
from pytest_accelperf.provision.accel import Accelerator, cpu_isa, host_cpu
from pytest_accelperf.records.environment import Environment

#: Packages whose versions go into the fingerprint when installed: those the built-in
#: backends declare (:mod:`pytest_accelperf.backends.builtin`). A session adds those of every
#: backend it has registered; a package outside them (added through the
#: ``pytest_accelperf_environment`` hook) always matters.
PACKAGES = BACKENDS.packages()

#: The machine: keys that must match for step times (and compile and input times) to be
#: comparable.
MACHINE_KEYS = ("platform", "device_kind", "device_count", "host_cpu", "cpu_isa")
#: Keys that must match for the step's program to be comparable: the device the frameworks
#: compile or dispatch for, not the host's CPU model or features. A baseline recorded on a
#: CI runner with other CPU flags (avx_vnni) made every program check ``incomparable``, the
#: one check that needs no timing; the torch eager records and the XLA:CPU programs of the
#: suites were the same on both hosts.
PROGRAM_KEYS = ("platform", "device_kind", "device_count")
#: The stack: what an upgrade changes. Judged and named, never incomparable.
STACK_KEYS = ("python", "packages", "libraries")
#: Before the split: the keys that made throughput incomparable (the machine and the stack).
THROUGHPUT_KEYS = MACHINE_KEYS

#: The accelerator's libraries, by the distributions that carry them (name → the name the
#: stack shows): libtpu, the CUDA runtime, cuDNN, NCCL, cuBLAS and the compiler jax and
#: torch load from pip wheels, jax's CUDA plugin, triton, the Neuron SDK's compiler and
#: runtime. Each where installed.
LIBRARY_DISTRIBUTIONS: Mapping[str, str] = {
    "libtpu": "libtpu",
    "libtpu-nightly": "libtpu",
    "nvidia-cuda-runtime-cu12": "cuda-runtime",
    "nvidia-cuda-runtime-cu13": "cuda-runtime",
    "nvidia-cuda-runtime": "cuda-runtime",
    "nvidia-cudnn-cu12": "cudnn",
    "nvidia-cudnn-cu13": "cudnn",
    "nvidia-nccl-cu12": "nccl",
    "nvidia-nccl-cu13": "nccl",
    "nvidia-cublas-cu12": "cublas",
    "nvidia-cublas-cu13": "cublas",
    "nvidia-cuda-nvcc-cu12": "nvcc",
    "jax-cuda12-plugin": "jax-cuda-plugin",
    "jax-cuda13-plugin": "jax-cuda-plugin",
    "jax-cuda12-pjrt": "jax-cuda-pjrt",
    "jax-cuda13-pjrt": "jax-cuda-pjrt",
    "triton": "triton",
    "pytorch-triton": "triton",
    "neuronx-cc": "neuronx-cc",
    "torch-neuronx": "torch-neuronx",
    "libneuronxla": "libneuronxla",
    "aws-neuronx-runtime-discovery": "neuron-runtime",
}
#: Where the NVIDIA kernel driver says its version (Linux).
NVIDIA_DRIVER = Path("/proc/driver/nvidia/version")


def driver_version(path: Path = NVIDIA_DRIVER) -> str | None:
    """The NVIDIA kernel driver's version, read from ``path``, or None without one.

    >>> import tempfile, pathlib
    >>> with tempfile.TemporaryDirectory() as d:
    ...     p = pathlib.Path(d, "version")
    ...     _ = p.write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue")
    ...     driver_version(p)
    '550.54.15'
    """
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    found = re.search(r"Kernel Module\s+(?:for \S+\s+)?(\d+(?:\.\d+)+)", text)
    return found.group(1) if found else None


def libraries(distributions: Mapping[str, str] = LIBRARY_DISTRIBUTIONS,
              driver: Path = NVIDIA_DRIVER) -> dict[str, str]:
    """The accelerator's libraries installed here, ``{name: version}``: those of
    :data:`LIBRARY_DISTRIBUTIONS` (from the installed distributions' metadata, no import)
    and the NVIDIA driver. Empty on a CPU-only host."""
    out: dict[str, str] = {}
    for dist, name in distributions.items():
        try:
            out.setdefault(name, metadata.version(dist))
        except metadata.PackageNotFoundError:
            continue
    found = driver_version(driver)
    if found is not None:
        out["nvidia-driver"] = found
    return out


def environment(accel: Accelerator, packages_of: Iterable[str] = PACKAGES) -> Environment:
    """This machine's fingerprint: platform, device, host CPU, Python, and the versions of
    ``packages_of`` that are installed (the session passes every registered backend's)."""
    packages: dict[str, str] = {}
    for name in packages_of:
        try:
            packages[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return Environment.model_validate({
        "platform": accel.platform,
        "accel": accel.name,
        "device_kind": accel.device_kind,
        "device_count": accel.device_count,
        "host_cpu": host_cpu(),
        "cpu_isa": cpu_isa(),
        "python": _platform.python_version(),
        "packages": packages,
        "libraries": libraries(),
    })


def machine(env: Mapping[str, object]) -> dict[str, object]:
    """The machine of an environment (:data:`MACHINE_KEYS`)."""
    return {k: env.get(k) for k in MACHINE_KEYS}


def stack(env: Mapping[str, object]) -> dict[str, object]:
    """The stack of an environment (:data:`STACK_KEYS`): Python, packages, libraries."""
    return {k: env.get(k) for k in STACK_KEYS if k in env}


def case_stack(env: Mapping[str, object], backend: str | BackendSpec | None = None, *,
               known: Collection[str] = PACKAGES) -> dict[str, object]:
    """The stack of an environment that a case of ``backend`` runs on: as :func:`stack`,
    its packages only those :func:`stack_changes` compares for that backend (the
    history's ``stack`` is a hash of it: installing or upgrading torch beside jax is no
    change of a jax case's stack).

    >>> case_stack({"platform": "cpu", "python": "3.11.7",
    ...             "packages": {"jax": "0.8.3", "torch": "2.13.0"}}, "jax")
    {'python': '3.11.7', 'packages': {'jax': '0.8.3'}}
    """
    out = stack(env)
    relevant = _declared(backend)
    packages = out.get("packages")
    if relevant is not None and isinstance(packages, Mapping):
        out["packages"] = {k: v for k, v in packages.items()
                           if k not in known or k in relevant}
    return out


def stack_changes(now: Mapping[str, object], base: Mapping[str, object],
                  backend: str | BackendSpec | None = None, *,
                  known: Collection[str] = PACKAGES) -> list[str]:
    """How the stack of ``now`` differs from ``base``'s, one item a component, in the
    words every verdict shows (``jax 0.8.3 → 0.10.2``); empty when it is the same.

    As for :func:`differences`, only the packages ``backend`` declares count among the
    ``known`` backend packages; a package outside ``known`` always counts. A baseline
    recorded before libraries were fingerprinted (no ``libraries``) compares none.

    >>> stack_changes({"python": "3.11.7", "packages": {"jax": "0.10.2"}},
    ...               {"python": "3.11.7", "packages": {"jax": "0.8.3"}}, "jax")
    ['jax 0.8.3 → 0.10.2']
    >>> stack_changes({"packages": {"torch": "2.13.0"}}, {"packages": {}}, "jax")
    []
    >>> stack_changes({"libraries": {"libtpu": "0.0.42"}}, {"packages": {}})
    []
    >>> stack_changes({"libraries": {"libtpu": "0.0.42"}}, {"libraries": {}})
    ['libtpu absent → 0.0.42']
    """
    out: list[str] = []
    if now.get("python") != base.get("python") and base.get("python") is not None:
        out.append(f"python {base.get('python')} → {now.get('python')}")
    relevant = _declared(backend)
    a, b = base.get("packages"), now.get("packages")
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        for name in sorted(set(a) | set(b)):
            if relevant is not None and name in known and name not in relevant:
                continue
            if a.get(name) != b.get(name):
                out.append(f"{name} {a.get(name, 'absent')} → {b.get(name, 'absent')}")
    a, b = base.get("libraries"), now.get("libraries", {})
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        for name in sorted(set(a) | set(b)):
            if a.get(name) != b.get(name):
                out.append(f"{name} {a.get(name, 'absent')} → {b.get(name, 'absent')}")
    return out


def stack_words(changes: Sequence[str]) -> str:
    """``stack: jax 0.8.3 → 0.10.2, jaxlib 0.8.3 → 0.10.2``, what every verdict across a
    stack change says; ``""`` for none."""
    return f"stack: {', '.join(changes)}" if changes else ""


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


def differences(now: Mapping[str, object], base: Mapping[str, object],
                backend: str | BackendSpec | None = None, *,
                known: Collection[str] = PACKAGES,
                keys: Sequence[str] = THROUGHPUT_KEYS) -> list[str]:
    """Human-readable differences of the machine that make timings incomparable, empty
    when comparable (``keys=PROGRAM_KEYS``: those that make the program incomparable).
    With ``keys`` that include the stack's (``python``, ``packages``), those are compared
    too, as they were before the machine and the stack were told apart.

    With ``backend`` (its spec, or a built-in's name), only the packages that backend
    declares are compared among the ``known`` backend packages: installing torch beside jax
    does not change a jax step. A package outside ``known`` always counts.

    >>> differences({"python": "3.11.7"}, {"python": "3.12.1"})
    []
    >>> differences({"device_count": 8}, {"device_count": 4})
    ['device_count: 4 -> 8']
    >>> OLD = ("python", "packages")
    >>> differences({"packages": {"torch": "2.13.0"}}, {"packages": {}}, backend="jax", keys=OLD)
    []
    >>> differences({"packages": {"torch": "2.13.0"}}, {"packages": {}}, backend="torch",
    ...             keys=OLD)
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
