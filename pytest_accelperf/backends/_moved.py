"""Where the flat ``backends/`` modules went, kept importable for one release.

``backends/`` was 29 flat modules until 0.1; it is now split by framework (``measure/``,
``procs/``, ``jax/``, ``torch/``). The old import paths still work, with a
:class:`DeprecationWarning` that names the new path:

* an old module (``pytest_accelperf.backends.torch_step``) is a stub that warns when it is
  imported (:func:`warn_moved`) and gives its names from the new module (:func:`forward`);
* ``backends.jax`` and ``backends.torch``, modules that became packages, warn when one of
  the old module's names is read from them (:func:`old_name`): importing their
  submodules does not warn.

What a suite imports is in :mod:`pytest_accelperf.jax` and :mod:`pytest_accelperf.torch`.
Importing this module imports no framework.
"""

from __future__ import annotations

import importlib
import sys
import warnings
from types import FrameType
from typing import Any

_B = "pytest_accelperf.backends"
_JAX, _TORCH = "pytest_accelperf.jax", "pytest_accelperf.torch"

#: ``{old module: its new module}``.
MODULES = {f"{_B}.{old}": f"{_B}.{new}" for old, new in {
    "base": "protocol", "loop": "measure.loop", "probe": "measure.probe",
    "common": "measure.common", "data": "measure.data", "launch": "procs.launch",
    "ranks": "procs.ranks", "_rank": "procs._rank", "rank_pool": "procs.rank_pool",
    "xla_program": "jax.program", "jax_step": "jax.step", "jax_multihost": "jax.ranks",
    "pipeline": "jax.pipeline", "alpa": "jax.alpa",
    "torch_memory": "torch.memory", "torch_program": "torch.program", "torch_ops": "torch.ops",
    "torch_step": "torch.step", "torch_task": "torch.task", "torch_ranks": "torch.ranks",
    "rank_step": "torch.rank_step", "rank_comm": "torch.comm", "ddp": "torch.ddp",
    "deepspeed": "torch.deepspeed", "neuron": "torch.neuron",
}.items()}

#: The names of an old module that a suite imports, now from :mod:`pytest_accelperf.jax` or
#: :mod:`pytest_accelperf.torch` (the warning says so).
USER = {f"{_B}.{old}": names for old, names in {
    "jax_step": "JaxStep, JaxTask, nnx_step: " + _JAX, "pipeline": "PipelineTask: " + _JAX,
    "torch_step": "TorchStep: " + _TORCH, "torch_task": "TorchTask: " + _TORCH,
    "rank_step": "RankStep, Built: " + _TORCH, "ddp": "train_ddp: " + _TORCH,
}.items()}


def _names(table: dict[str, str]) -> dict[str, str]:
    """``{name: module}`` from ``{module: "name name ..."}``."""
    return {name: module for module, names in table.items() for name in names.split()}


#: The names that an old module had but its new module does not define, by where they are.
ELSEWHERE: dict[str, dict[str, str]] = {
    f"{_B}.ddp": _names({
        f"{_B}.torch.ranks": "build_run make_plan rank_main slice_batch train_reference"}),
    # The modules backends/jax.py and backends/torch.py, now packages: every name they
    # defined or re-exported. "module:attr" where the name changed.
    f"{_B}.jax": {**_names({
        _JAX: "JaxStep JaxTask nnx_step predict_memory",
        f"{_B}.measure.common": "N_SAMPLES TaskError fingerprint",
        f"{_B}.jax.backend":
            "BACKEND JaxBackend JaxStepper JaxTrainResult PyTree REFERENCE_MAX_STEPS "
            "REPLAYED_PLATFORMS _PROBES _Trained _batch _block_until_ready _device_put "
            "_execute _fingerprinted _flat _host _init_state _key_data _put _reference "
            "_replay _replayed_on _set_mesh _step_fns _train_steps jax_probe",
        f"{_B}.jax.sharding":
            "P _ShapeDtypeStruct _annotated_specs _bound _check_divisible _host_mesh "
            "_inputs _mesh_renaming _resolve _restrict _shardings _with_sharding",
        f"{_B}.jax.compile":
            "_OutOfMemory _Program _compile _compile_on _eval_shape _global_lowering "
            "_is_oom _target_compile",
        f"{_B}.jax.memory":
            "GIB _HBM_REQUIRED _HBM_USED _UNITS _analysis_bytes _capacity _gib _labels "
            "_live_arrays _live_bytes _oom_message _oom_run _predicted_oom _runtime_peaks "
            "compiler_oom planner",
    }), "as_host": f"{_B}.jax.step:host_batch"},
    f"{_B}.torch": _names({
        _TORCH: "TorchStep TorchTask",
        f"{_B}.torch.task": "to_device torch_probe",
        f"{_B}.torch.backend":
            "BACKEND CpuMemory GIB GROWTH_STEPS MEMORY_STEPS PROBE_N StepCount TorchBackend "
            "TorchStepper TorchTrainResult _CompileLoad _CudaGrowth _STEP_END _build _device "
            "_execute _hooks _label _mem_tracker_count _one_process _oom_message _oom_record "
            "_profiler_count _same_metrics _seen _step _step_fns _value _warmup count_flops "
            "count_step count_step_flops cpu_memory cpu_memory_growth cpu_peak_memory "
            "deadline_after growth_record timeout_message",
    }),
}


def _stacklevel() -> int:
    """The ``stacklevel`` of the first frame outside the import machinery and this
    module's stubs: the user's import, which the warning then points at. (``warnings``
    itself skips the import machinery's frames in counting levels.)"""
    level = 2
    frame: FrameType | None = sys._getframe(2)
    while frame is not None and _ours(frame):
        frame = frame.f_back
        if frame is not None and not frame.f_code.co_filename.startswith("<frozen importlib"):
            level += 1
    return level


def _ours(frame: FrameType) -> bool:
    """Whether ``frame`` runs in the import machinery (importlib's, or a loader's
    ``exec_module``: pytest's assertion rewriter loads this package), a stub or this
    module."""
    name = frame.f_globals.get("__name__")
    return (frame.f_code.co_filename.startswith("<frozen importlib")
            or frame.f_code.co_name == "exec_module"
            or name in MODULES or name in ELSEWHERE or name == __name__)


def warn_moved(old: str) -> None:
    """Warn that module ``old`` (a stub's ``__name__``) moved, naming where."""
    also = f" ({USER[old]})" if old in USER else ""
    warnings.warn(f"{old} is deprecated: import from {MODULES[old]}{also}; the old path "
                  f"goes in the next release", DeprecationWarning, stacklevel=_stacklevel())


def _get(where: str, name: str) -> Any:
    module, _, attr = where.partition(":")
    return getattr(importlib.import_module(module), attr or name)


def forward(old: str, name: str) -> Any:
    """Name ``name`` of the old module ``old``, from its new place (the stub already
    warned when it was imported)."""
    where = ELSEWHERE.get(old, {}).get(name, MODULES[old])
    try:
        return _get(where, name)
    except AttributeError:
        raise AttributeError(f"module {old!r} has no attribute {name!r}") from None


def old_name(package: str, name: str) -> Any:
    """Name ``name`` of the old module that is now ``package`` (``backends.jax``,
    ``backends.torch``), from where it is now, with a warning naming that place; an
    ``AttributeError`` for any other name (a submodule not imported yet is then imported
    by the import system)."""
    where = ELSEWHERE[package].get(name)
    if where is None:
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    module = where.partition(":")[0]
    new = f"{module}.{where.partition(':')[2] or name}"
    warnings.warn(f"{package}.{name} is deprecated: use {new}; the old path goes in the "
                  f"next release", DeprecationWarning, stacklevel=_stacklevel())
    return _get(where, name)
