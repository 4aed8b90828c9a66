"""Errors a device raises inside a step, told apart: an out-of-memory, which leaves the
process usable (the memory is freed with the case), and a *sticky* CUDA error (an illegal
memory access, a device-side assert, a launch failure), after which every later CUDA call of
the process fails, so no later case of that process can be measured.

The pytest process fails such a case with the device's message and the case's id, and no
traceback of ours (:meth:`pytest_accelperf.gate.runner.CaseRunner.train`); after a sticky error
the later in-process cases of that process fail at once, naming the case that broke the
context, instead of each failing on an error it did not cause. An A/B worker whose device
broke is stopped and replaced for the next case (:mod:`pytest_accelperf.ab.rounds`).

This module imports no framework: it reads the exception's type name and text, which is all
that torch (``torch.OutOfMemoryError``, ``RuntimeError: CUDA error: ...``,
``torch.AcceleratorError``) and XLA (``XlaRuntimeError: RESOURCE_EXHAUSTED ...``,
``INTERNAL: ... CUDA_ERROR_ILLEGAL_ADDRESS``) give.
"""

from __future__ import annotations

import gc
import sys
from dataclasses import dataclass

#: Texts of CUDA errors that leave the context unusable (CUDA's "sticky" errors: the
#: process must exit before the device can be used again), as torch and XLA word them.
STICKY = ("illegal memory access", "illegal address", "ILLEGAL_ADDRESS", "illegal instruction",
          "ILLEGAL_INSTRUCTION", "misaligned address", "MISALIGNED_ADDRESS",
          "unspecified launch failure", "LAUNCH_FAILED", "device-side assert",
          "ASSERT_TRIGGERED", "hardware stack error", "HARDWARE_STACK_ERROR",
          "uncorrectable ECC error", "ECC_UNCORRECTABLE", "the launch timed out",
          "LAUNCH_TIMEOUT", "CUDA_ERROR_NOT_READY_STICKY", "unrecoverable")
#: Texts of an out-of-memory (XLA's RESOURCE_EXHAUSTED, torch's OutOfMemoryError).
OUT_OF_MEMORY = ("out of memory", "RESOURCE_EXHAUSTED", "OutOfMemoryError")
#: What makes a text a device's (so that "out of memory" of a host allocation is not one).
DEVICE = ("CUDA", "cuda", "cuDNN", "CUBLAS", "cublas", "NCCL", "XLA", "GPU", "gpu",
          "RESOURCE_EXHAUSTED", "OutOfMemoryError", "HIP", "device")


@dataclass(frozen=True)
class DeviceError:
    """A device's error in a step: ``kind`` ``oom`` or ``sticky``, and its message (the
    exception's type and its first line)."""

    kind: str
    message: str

    @property
    def sticky(self) -> bool:
        return self.kind == "sticky"


def classify(exc: BaseException) -> DeviceError | None:
    """The device error ``exc`` is, or None for any other exception.

    >>> classify(RuntimeError("CUDA error: an illegal memory access was encountered\\nCUDA "
    ...                       "kernel errors might be asynchronously reported")).kind
    'sticky'
    >>> classify(MemoryError("out of memory")) is None
    True
    """
    name = type(exc).__name__
    text = f"{name}: {exc}"
    if not any(mark in text for mark in DEVICE):
        return None
    first = next((line.strip() for line in str(exc).splitlines() if line.strip()), "")
    message = f"{name}: {first}" if first else name
    if any(mark in text for mark in STICKY):
        return DeviceError("sticky", message)
    if any(mark in text for mark in OUT_OF_MEMORY):
        return DeviceError("oom", message)
    return None


def release_device_memory() -> None:
    """After an out-of-memory: the failed case's tensors collected and torch's cached
    blocks given back, so that the next case starts from an empty allocator (JAX frees a
    buffer when its last reference goes)."""
    gc.collect()
    torch = sys.modules.get("torch")
    if torch is None:
        return
    try:
        if torch.cuda.is_initialized():
            torch.cuda.empty_cache()
    except Exception:  # the device may be gone: nothing more to free
        pass


def broken_context_message(case_id: str, error: DeviceError) -> str:
    """Why a later in-process case of a process whose CUDA context ``case_id`` broke is
    not run."""
    return (f"not run: the device context of this process was broken by case {case_id} "
            f"({error.message}); after such a CUDA error every later CUDA call of the "
            f"process fails. Run the remaining cases in a new process (pytest --lf), or "
            f"fix {case_id} first")
