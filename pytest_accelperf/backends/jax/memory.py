"""A JAX case's memory: planned by the compiler, judged against a capacity, counted live.

The gate's figure is the compiler's plan per device (``memory_analysis``: arguments,
outputs and temporaries less what donation aliases, :func:`_analysis_bytes`), against the
smaller of the device's and the case's declared capacity (:func:`_capacity`). A plan over
it is a predicted out-of-memory (``Run.oom``, :func:`_predicted_oom`), as is a compiler's or
runtime's own refusal (:func:`compiler_oom`). Beside it: the runtime's peaks on GPU and TPU
(:func:`_runtime_peaks`), and the live arrays' bytes that ``Run.memory_growth`` is read
from (:func:`_live_bytes`).
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING, Any

import jax

from pytest_accelperf.backends.jax.compile import _compile
from pytest_accelperf.backends.measure.recording import RunBuilder
from pytest_accelperf.backends.types import PyTree
from pytest_accelperf.collect.cases import Case
from pytest_accelperf.provision.accel import Accelerator
from pytest_accelperf.records.run import OomRecord, Run

if TYPE_CHECKING:
    from jax.sharding import Mesh
    from jax.stages import Compiled

    from pytest_accelperf.backends.protocol import Task

# jax leaves this untyped; mypy --strict refuses untyped calls, so it goes through Any.
_live_arrays: Any = jax.live_arrays
GIB = 2**30


def _analysis_bytes(compiled: Compiled) -> dict[str, int]:
    """Per-device bytes the compiler plans for one step.

    ``peak_memory_in_bytes`` omits temporaries on CPU, so the total is computed:
    arguments + outputs + temporaries - what donation aliases (counted in both).
    """
    ma = compiled.memory_analysis()
    if ma is None:
        return {}
    parts = {
        "argument_bytes": int(ma.argument_size_in_bytes),
        "output_bytes": int(ma.output_size_in_bytes),
        "temp_bytes": int(ma.temp_size_in_bytes),
        "alias_bytes": int(ma.alias_size_in_bytes),
    }
    parts["required_bytes"] = (parts["argument_bytes"] + parts["output_bytes"]
                               + parts["temp_bytes"] - parts["alias_bytes"])
    return parts


def predict_memory(case: Case, task: Task, accel: Accelerator) -> dict[str, int]:
    """Compile ``task`` as ``case`` and return the planned per-device bytes.

    Keys: ``argument_bytes``, ``output_bytes``, ``temp_bytes``, ``alias_bytes`` and their
    total ``required_bytes``. Nothing is allocated: only a compile runs.
    """
    return _analysis_bytes(_compile(case, task, accel, case.mesh).compiled)


def _gib(n: float) -> str:
    return f"{n / GIB:.2f} GiB"


def _capacity(accel: Accelerator, case: Case) -> int | None:
    """Bytes per device a case is judged against: the smaller of the device's and the
    case's declared ``memory_capacity`` (a suite that declares the fleet's 16 GiB keeps
    predicting that out-of-memory on an 80 GB development GPU, as the torch backend does);
    either one where only one is known (CPU: the declared one)."""
    known = [c for c in (accel.memory_capacity, case.memory_capacity) if c]
    return int(min(known)) if known else None


def _runtime_peaks(mesh: Mesh) -> list[int] | None:
    """The runtime's peak bytes in use on each device of ``mesh`` since the process
    started (GPU, TPU), or None where a device has no counter (XLA:CPU, another host's)."""
    here = jax.process_index()
    stats: list[Any] = [d.memory_stats() if d.process_index == here else None
                        for d in mesh.devices.flat]
    if not all(s and "peak_bytes_in_use" in s for s in stats):
        return None
    return [int(s["peak_bytes_in_use"]) for s in stats]


def _labels(mesh: Mesh) -> list[str]:
    return [f"{d.platform}:{d.id}" for d in mesh.devices.flat]


def _live_bytes(exclude: PyTree) -> int:
    """Bytes of the live JAX arrays on this process's devices (``jax.live_arrays()``, each
    array's shards on the devices that hold them: a replicated array counts on every
    device), but for the arrays among the leaves of ``exclude``."""
    skip = {id(leaf) for leaf in jax.tree.leaves(exclude)}
    total = 0
    for array in _live_arrays():
        if id(array) in skip or array.is_deleted():
            continue
        try:
            sharding = array.sharding
            total += (math.prod(sharding.shard_shape(array.shape)) * array.dtype.itemsize
                      * len(sharding.addressable_devices))
        except Exception:  # an array whose sharding cannot say: its logical size
            total += int(array.nbytes)
    return total


def planner(accel: Accelerator) -> str:
    """Whose memory plan a prediction is: ``XLA:CPU`` (virtual CPU devices: not what an
    accelerator's compiler plans for the same step), ``XLA:TPU`` (a TPU's, or a
    compile-only target's: libtpu's compiler), ``XLA:GPU``."""
    return f"XLA:{accel.name.upper()}"


def _predicted_oom(planned: dict[str, int], capacity: int | None,
                   planned_by: str = "") -> OomRecord | None:
    """The ``Run.oom`` record when the planned bytes exceed the capacity, else None;
    ``planned_by`` names the compiler whose plan it is (:func:`planner`)."""
    if not planned or not capacity or planned["required_bytes"] <= capacity:
        return None
    need = planned["required_bytes"]
    oom: OomRecord = {"required_bytes": need, "capacity_bytes": int(capacity),
                           "exceeded_by_bytes": need - int(capacity),
                           "source": "memory_analysis"}
    if planned_by:
        oom["planned_by"] = planned_by
    return oom


def _oom_message(oom: OomRecord) -> str:
    whose = f"; {oom['planned_by']}'s memory plan" if oom.get("planned_by") else ""
    return (f"predicted out of memory: program needs {_gib(oom['required_bytes'])} per device "
            f"of {_gib(oom['capacity_bytes'])} capacity "
            f"(exceeded by {_gib(oom['exceeded_by_bytes'])}{whose})")


#: XLA:TPU's refusal of a program larger than HBM, as the runtime words it ("Used 20.93G
#: of 15.48G hbm", seed 000) and as the compile-only compiler does ("the total memory
#: required for HLO temporaries (17.17G) exceeds available HBM (15.75G)"). Sizes are
#: binary (tsl's HumanReadableNumBytes).
_HBM_USED = re.compile(r"Used ([\d.]+)([KMGT]?) of ([\d.]+)([KMGT]?) hbm", re.IGNORECASE)


_HBM_REQUIRED = re.compile(r"\(([\d.]+)([KMGT]?)\) exceeds available HBM \(([\d.]+)([KMGT]?)\)",
                           re.IGNORECASE)


_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def compiler_oom(message: str, planned_by: str = "") -> OomRecord | None:
    """The ``Run.oom`` record of a compiler's out-of-memory error: what it said the program
    needs and what it had (``source: compiler``); None when it did not say.

    >>> oom = compiler_oom("Ran out of memory in memory space hbm. Used 20.93G of 15.48G hbm.")
    >>> [round(oom[k] / 2**30, 2) for k in ("required_bytes", "capacity_bytes")]
    [20.93, 15.48]
    """
    found = _HBM_USED.search(message) or _HBM_REQUIRED.search(message)
    if not found:
        return None
    need = round(float(found[1]) * _UNITS[found[2].upper()])
    have = round(float(found[3]) * _UNITS[found[4].upper()])
    oom: OomRecord = {"required_bytes": need, "capacity_bytes": have,
                           "exceeded_by_bytes": need - have, "source": "compiler"}
    if planned_by:
        oom["planned_by"] = planned_by
    return oom


def _oom_run(draft: RunBuilder, message: str, planned_by: str = "") -> Run:
    """The run of a case the compiler or the runtime found out of memory."""
    draft.failed("oom", f"out of memory: "
                        f"{message.splitlines()[0] if message else 'RESOURCE_EXHAUSTED'}",
                 oom=compiler_oom(message, planned_by))
    return draft.build()

