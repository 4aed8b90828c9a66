"""Provisioning the accelerator of a session: devices, platform key, capacity, peak FLOPs.

The environment that selects devices (``XLA_FLAGS``, ``JAX_PLATFORMS``,
``CUDA_VISIBLE_DEVICES``) must be set before a framework initializes, so
:func:`prepare_environment` runs in ``pytest_configure``, on the controller and on every
xdist worker, while :func:`provision` (which imports jax, or torch where jax is not
installed) runs lazily in the session fixture.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING, Any, overload

from pytest_accelperf.errors import ConfigError

if TYPE_CHECKING:
    from jax import Device
    from jax.sharding import Mesh

ACCELS = ("cpu", "gpu", "tpu", "neuron", "auto")
_COUNT_FLAG = "--xla_force_host_platform_device_count"

# Peak dense bf16 FLOP/s per device (per chip for TPU; per NeuronCore-v2 device pair as
# jax/torch-neuronx expose it is not standardized, so Trainium figures are per chip).
# Sources:
#   TPU v4: 275 TFLOP/s bf16 per chip - cloud.google.com/tpu/docs/v4
#   TPU v5e: 197 TFLOP/s bf16 per chip - cloud.google.com/tpu/docs/v5e
#   TPU v5p: 459 TFLOP/s bf16 per chip - cloud.google.com/tpu/docs/v5p
#   TPU v6e (Trillium): 918 TFLOP/s bf16 per chip - cloud.google.com/tpu/docs/v6e
#   A100: 312 TFLOP/s dense bf16 - NVIDIA A100 datasheet
#   H100 SXM: 989 TFLOP/s dense bf16 - NVIDIA H100 datasheet (PCIe: 756)
#   H200: 989 TFLOP/s dense bf16 - NVIDIA H200 datasheet (same die as H100 SXM)
#   Trainium1: 190 TFLOP/s bf16 per chip - aws.amazon.com/machine-learning/trainium
#   Trainium2: 667 TFLOP/s dense bf16 per chip - aws.amazon.com/ec2/instance-types/trn2
PEAK_FLOPS: dict[str, float] = {
    "tpu v4": 275e12,
    "tpu v5 lite": 197e12,
    "tpu v5e": 197e12,
    "tpu v5p": 459e12,
    "tpu v5": 459e12,
    "tpu v6 lite": 918e12,
    "tpu v6e": 918e12,
    "a100": 312e12,
    "h100 pcie": 756e12,
    "h100": 989e12,
    "h200": 989e12,
    "trainium1": 190e12,
    "trainium2": 667e12,
}


def peak_flops(device_kind: str) -> float | None:
    """Peak FLOP/s of a device kind as the runtime names it, or None when unknown.

    >>> peak_flops("NVIDIA H100 80GB HBM3")
    989000000000000.0
    >>> peak_flops("cpu") is None
    True
    """
    kind = device_kind.lower()
    # Longest key first, so "h100 pcie" wins over "h100" and "tpu v5 lite" over "tpu v5".
    for key in sorted(PEAK_FLOPS, key=len, reverse=True):
        if key in kind:
            return PEAK_FLOPS[key]
    return None


def prepare_environment(accel: str, cpu_devices: int,
                        env: MutableMapping[str, str] | None = None) -> None:
    """Set the device environment before any framework initializes.

    For ``cpu`` this asks XLA for ``cpu_devices`` virtual host devices and pins JAX to the
    CPU platform. Existing ``XLA_FLAGS`` are kept; a different device count in them is
    replaced, not duplicated.
    """
    env = _env(env)
    flags = env.get("XLA_FLAGS", "")
    flags = re.sub(rf"{_COUNT_FLAG}=\S+", "", flags).strip()
    env["XLA_FLAGS"] = f"{flags} {_COUNT_FLAG}={cpu_devices}".strip()
    if accel == "cpu":
        env["JAX_PLATFORMS"] = "cpu"


def _env(env: MutableMapping[str, str] | None) -> MutableMapping[str, str]:
    return os.environ if env is None else env


def jax_initialized_too_early(cpu_devices: int) -> str | None:
    """A message when jax's CPU backend was initialized before our XLA_FLAGS could apply."""
    if "jax" not in sys.modules:
        return None
    try:
        from jax._src import xla_bridge  # private, but the only way to ask

        if not xla_bridge.backends_are_initialized():
            return None
    except Exception:  # pragma: no cover - a jax without this helper
        return None
    import jax

    n = len(jax.devices("cpu"))
    if n == cpu_devices:
        return None
    return (
        f"jax was initialized with {n} CPU device(s) before pytest-accelperf could ask for "
        f"{cpu_devices}: do not call jax at import time of a conftest or test module, or set "
        f"XLA_FLAGS={_COUNT_FLAG}={cpu_devices} yourself, or pass --accelperf-cpu-devices={n}"
    )


def worker_visible_devices(total: int, worker_index: int, worker_count: int) -> list[int]:
    """The device indices an xdist worker owns: a contiguous, disjoint slice.

    >>> worker_visible_devices(8, 1, 2)
    [4, 5, 6, 7]
    """
    if worker_count <= 0 or not 0 <= worker_index < worker_count:
        raise ValueError(f"bad worker {worker_index} of {worker_count}")
    if total < worker_count:
        raise ValueError(
            f"{worker_count} xdist workers but only {total} device(s): run with -n {total} or less"
        )
    per = total // worker_count
    return list(range(worker_index * per, (worker_index + 1) * per))


def assign_worker_devices(accel: str, worker_id: str, worker_count: int,
                          env: MutableMapping[str, str] | None = None) -> list[int] | None:
    """Give an xdist worker (``gw0``...) its own accelerators by environment.

    CPU needs nothing: each worker process has its own virtual devices. For GPUs the
    visible devices (``CUDA_VISIBLE_DEVICES``, else ``nvidia-smi -L``) are split into
    disjoint slices. Returns the indices assigned, or None when nothing was changed.
    """
    env = _env(env)
    if accel != "gpu" or worker_count <= 1:
        return None
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible:
        ids = [v for v in visible.split(",") if v.strip()]
    else:
        ids = [str(i) for i in range(_count_nvidia_gpus())]
    if not ids:
        return None
    index = int(worker_id.removeprefix("gw"))
    mine = worker_visible_devices(len(ids), index, worker_count)
    env["CUDA_VISIBLE_DEVICES"] = ",".join(ids[i] for i in mine)
    return mine


def _count_nvidia_gpus() -> int:
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))


@dataclass
class Accelerator:
    """The accelerator a session (or xdist worker) provisioned.

    ``platform`` is the key baselines are stored under (``cpu-x8``, ``tpu-v4-x8``,
    ``gpu-h100-80gb-hbm3-x8``). ``memory_capacity`` is bytes per device where the runtime
    reports it (None on CPU, where a case declares it). ``peak_flops`` is per device where
    known. ``devices`` are the framework's device objects (jax devices here).
    ``compile_only`` names the compile-only target these devices stand for
    (``tpu-v5e:2x4``, :mod:`pytest_accelperf.provision.targets`): a program can be compiled for them
    but not run; None for devices that run.
    """

    name: str
    platform: str
    device_kind: str
    device_count: int
    memory_capacity: int | None = None
    peak_flops: float | None = None
    devices: Sequence[Any] = field(default_factory=list, repr=False)
    compile_only: str | None = None

    def mesh(self, shape: Sequence[int] | None,
             axis_names: Sequence[str] = ("data", "model")) -> Mesh:
        """A ``jax.sharding.Mesh`` of ``shape`` over this session's devices.

        ``None`` gives a one-device mesh, so single-device and sharded cases share one
        code path. Axes are ``Auto`` so ``NamedSharding`` + ``jit`` propagate shardings.

            mesh = accel.mesh((4, 2))          # axes ("data", "model")
            x = jax.device_put(x, NamedSharding(mesh, P("data")))
        """
        import numpy as np
        from jax.sharding import AxisType, Mesh

        shape = tuple(shape) if shape is not None else (1,)
        names = tuple(axis_names)[: len(shape)]
        n = int(np.prod(shape))
        if n > len(self.devices) and self.compile_only:
            raise ConfigError(
                f"mesh {shape} needs {n} devices but {self.compile_only} has "
                f"{len(self.devices)}: compile for a larger topology (--accelperf-target) or "
                f"choose a smaller mesh")
        if n > len(self.devices):
            raise ConfigError(
                f"mesh {shape} needs {n} devices but {self.platform} has {len(self.devices)}: "
                f"pass --accelperf-cpu-devices={n} (cpu) or choose a smaller mesh"
            )
        devs = np.asarray(list(self.devices)[:n]).reshape(shape)
        if self.compile_only and n == len(self.devices) and n > 1:
            # A whole TPU slice: its devices laid out by their place in the torus, as
            # jax.make_mesh lays out a TPU host's (neighbours on the fastest axis).
            from jax.experimental import mesh_utils

            devs = mesh_utils.create_device_mesh(shape, list(self.devices))
        return Mesh(devs, names, axis_types=(AxisType.Auto,) * len(shape))


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def platform_key(accel: str, device_kind: str, count: int) -> str:
    """``cpu-x8``, ``tpu-v4-x8``, ``gpu-nvidia-h100-80gb-hbm3-x8``.

    >>> platform_key("tpu", "TPU v4", 8)
    'tpu-v4-x8'
    """
    if accel == "cpu":
        return f"cpu-x{count}"
    kind = _slug(device_kind)
    kind = kind.removeprefix(f"{accel}-")
    return f"{accel}-{kind}-x{count}" if kind else f"{accel}-x{count}"


class AcceleratorUnavailable(Exception):
    """The requested accelerator is not there; the message says what to do."""


class JaxDevices(Sequence[Any]):
    """The jax devices of a platform, found on first use (:meth:`Accelerator.mesh`, a JAX
    case): a session on the CPU that trains no JAX case never imports jax for them
    (0.6 s, and the XLA client's threads, in every torch session)."""

    def __init__(self, platform: str, expected: int | None = None) -> None:
        self.platform = platform
        self.expected = expected
        self._found: list[Any] | None = None

    def _devices(self) -> list[Any]:
        if self._found is None:
            import jax

            found = list(jax.devices(self.platform))
            if self.expected is not None and len(found) != self.expected:
                # The session was described as `expected` devices (its platform key): a
                # process whose jax started without the plugin's XLA_FLAGS has others.
                raise AcceleratorUnavailable(
                    f"jax has {len(found)} {self.platform} device(s) in this process, not the "
                    f"{self.expected} the session was described with: set "
                    f"XLA_FLAGS={_COUNT_FLAG}={self.expected} before jax starts (do not "
                    f"call jax at import time of a conftest), or pass "
                    f"--accelperf-cpu-devices={len(found)}")
            self._found = found
        return self._found

    def __len__(self) -> int:
        return len(self._devices())

    @overload
    def __getitem__(self, index: int) -> Device: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[Device]: ...

    def __getitem__(self, index: int | slice) -> Device | Sequence[Device]:
        return self._devices()[index]

    def __repr__(self) -> str:
        found = "not yet found" if self._found is None else f"{len(self._found)}"
        return f"JaxDevices({self.platform!r}: {found})"


def provision(accel: str, cpu_devices: int, platform_override: str | None = None) -> Accelerator:
    """Find the devices of ``accel`` through jax and describe them; without jax (a torch
    user's install), through torch (:func:`provision_without_jax`). The CPU is described
    without importing jax (the same fields jax gives it: ``cpu``, ``cpu_devices`` of them,
    no capacity), its jax devices found when a JAX case first asks (:class:`JaxDevices`):
    ``XLA_FLAGS`` gave jax ``cpu_devices`` of them (:func:`prepare_environment`), or
    :func:`jax_initialized_too_early` stopped the session."""
    if accel == "cpu":
        cpu = provision_without_jax(accel, cpu_devices, platform_override)
        if importlib.util.find_spec("jax") is not None:
            cpu.devices = JaxDevices("cpu", expected=cpu_devices)
        return cpu
    try:
        import jax
    except ImportError:
        return provision_without_jax(accel, cpu_devices, platform_override)
    if accel == "auto":
        accel = _detect(jax)
    platform_name = {"cpu": "cpu", "gpu": "gpu", "tpu": "tpu", "neuron": "neuron"}[accel]
    try:
        devices = jax.devices(platform_name)
    except RuntimeError as exc:
        if accel == "gpu":
            raise AcceleratorUnavailable(no_gpu_message(jax_error=str(exc))) from None
        hint = {
            "gpu": "install jax[cuda12] on a machine with an NVIDIA GPU",
            "tpu": "install jax[tpu] on a TPU VM",
            "neuron": "install jax-neuronx on a Trainium/Inferentia instance",
            "cpu": "check JAX_PLATFORMS",
        }[accel]
        raise AcceleratorUnavailable(
            f"--accel={accel}: jax sees no {platform_name} devices ({exc}); {hint}, "
            f"or pass --accel=cpu"
        ) from exc
    kind = devices[0].device_kind
    capacity: int | None = None
    # This process's own device: under jax.distributed the first may be another host's.
    mine = [d for d in devices if d.process_index == jax.process_index()] or devices
    stats = mine[0].memory_stats()
    if stats and stats.get("bytes_limit"):
        capacity = int(stats["bytes_limit"])
    key = platform_override or platform_key(accel, kind, len(devices))
    return Accelerator(
        name=accel,
        platform=key,
        device_kind=kind,
        device_count=len(devices),
        memory_capacity=capacity,
        peak_flops=peak_flops(kind),
        devices=devices,
    )


def provision_without_jax(accel: str, cpu_devices: int,
                          platform_override: str | None = None) -> Accelerator:
    """The accelerator of a session with no jax installed: torch's cases need none of it.

    ``cpu`` is described as with jax (``cpu-x<cpu_devices>``, the same platform key, so
    the same baselines); ``gpu`` by torch's CUDA devices (the same device names as jax's,
    so the same keys; capacity: each device's total memory). ``auto`` is ``gpu`` where
    torch sees CUDA, else ``cpu``. TPU and Neuron devices are found through jax only."""
    cuda = _torch_cuda() if accel in ("gpu", "auto") else None  # torch: ~1 s to import
    if accel == "auto":
        accel = "gpu" if cuda is not None and cuda.is_available() else "cpu"
    if accel == "cpu":
        key = platform_override or platform_key("cpu", "cpu", cpu_devices)
        return Accelerator(name="cpu", platform=key, device_kind="cpu",
                           device_count=cpu_devices)
    if accel == "gpu" and cuda is not None and cuda.is_available() and cuda.device_count():
        count = int(cuda.device_count())
        kind = str(cuda.get_device_name(0))
        capacity = int(cuda.get_device_properties(0).total_memory)
        return Accelerator(name="gpu", platform=platform_override or
                           platform_key("gpu", kind, count), device_kind=kind,
                           device_count=count, memory_capacity=capacity,
                           peak_flops=peak_flops(kind))
    if accel == "gpu":
        raise AcceleratorUnavailable(no_gpu_message(cuda=cuda))
    raise AcceleratorUnavailable(
        f"--accel={accel}: its devices are found through jax, which is not installed: "
        f"pip install 'pytest-accelperf[jax]' (jax-neuronx for neuron, jax[tpu] for tpu)")


def _jax_platforms(jax_error: str) -> str:
    """The platforms jax named in its error (``Platforms present are: cpu``), or ''."""
    found = re.search(r"[Pp]latforms present are: ([\w, ]+)", jax_error)
    return found.group(1).strip() if found else ""


def no_gpu_message(jax_error: str | None = None, cuda: object = None,
                   environ: Mapping[str, str] | None = None) -> str:
    """One line for ``--accel=gpu`` where no GPU is visible, naming each place that was
    looked at and what it showed: jax's gpu platform (``jax_error``: what
    ``jax.devices("gpu")`` raised; None: jax is not installed), torch's CUDA devices
    (``cuda``: ``torch.cuda``, None where torch is not installed), the NVIDIA device files,
    ``nvidia-smi`` and ``CUDA_VISIBLE_DEVICES``.

    >>> no_gpu_message(None, None, {"CUDA_VISIBLE_DEVICES": ""})[:80]
    '--accel=gpu: no GPU is visible to this process; looked for: jax (not installed),'
    """
    env = os.environ if environ is None else environ
    if jax_error is None:
        jax_part = "jax (not installed)"
    else:
        platforms = _jax_platforms(jax_error)
        plugin = any(importlib.util.find_spec(name) is not None
                     for name in ("jax_cuda12_plugin", "jax_cuda13_plugin"))
        jax_part = (f"jax's gpu platform (none; jax has {platforms or 'other platforms'}"
                    f"{'' if plugin else ', no jax CUDA plugin installed'})")
    if cuda is None and importlib.util.find_spec("torch") is not None:
        cuda = _torch_cuda()
    if cuda is None:
        torch_part = "torch's CUDA devices (torch not installed)"
    else:
        import torch

        built = torch.version.cuda
        if not built:
            torch_part = (f"torch's CUDA devices (none: torch {torch.__version__} is built "
                          f"without CUDA)")
        else:
            torch_part = f"torch's CUDA devices (none: torch built for CUDA {built})"
    nodes = sorted(p for p in os.listdir("/dev") if re.fullmatch(r"nvidia\d+", p)) \
        if os.path.isdir("/dev") else []
    smi = shutil.which("nvidia-smi")
    visible = env.get("CUDA_VISIBLE_DEVICES")
    visible_part = ("CUDA_VISIBLE_DEVICES (unset)" if visible is None
                    else f"CUDA_VISIBLE_DEVICES={visible!r}")
    return (f"--accel=gpu: no GPU is visible to this process; looked for: {jax_part}, "
            f"{torch_part}, /dev/nvidia* ({', '.join(nodes) or 'none'}), nvidia-smi "
            f"({smi or 'not on PATH'}), {visible_part}; on a machine with an NVIDIA GPU "
            f"install jax[cuda12] or a CUDA build of torch, or pass --accel=cpu")


def _torch_cuda() -> ModuleType | None:
    """``torch.cuda``, or None without torch."""
    try:
        import torch
    except ImportError:
        return None
    return torch.cuda


def _detect(jax: ModuleType) -> str:
    for name in ("tpu", "gpu"):
        try:
            if jax.devices(name):
                return name
        except RuntimeError:
            continue
    return "cpu"


def host_cpu() -> str:
    """The host CPU model, part of the environment fingerprint."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


#: CPU features that select different kernels in oneDNN, MKL, XLA:CPU and Eigen, and so
#: different floating-point results: two hosts that both say "AMD EPYC" (a VM's masked
#: model name) but differ here train to parameters ~1e-4 apart.
ISA_FLAGS = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx_vnni", "avx512f", "avx512bw",
             "avx512dq", "avx512vl", "avx512cd", "avx512_vnni", "avx512_bf16", "avx512_fp16",
             "avx512ifma", "avx512vbmi", "amx_tile", "amx_bf16", "amx_int8", "asimd", "sve",
             "sve2")


def cpu_isa() -> str | None:
    """The host's kernel-relevant CPU features (:data:`ISA_FLAGS`), sorted, space-separated;
    None where ``/proc/cpuinfo`` has no flags (not Linux)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith(("flags", "Features")):
                    have = set(line.split(":", 1)[1].split())
                    return " ".join(sorted(have & set(ISA_FLAGS)))
    except OSError:
        pass
    return None
