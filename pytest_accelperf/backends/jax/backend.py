"""The JAX backend: AOT-compile a sharded train step, predict its memory, then time it.

What it trains is a :class:`~pytest_accelperf.backends.jax.step.JaxStep`: the user's own
``step(state, batch) -> (state, metrics)`` and its state (a :class:`JaxTask` and an
:func:`nnx_step` are built on it). One code path serves every case: no mesh is a one-device
mesh, so the single-device reference run of a sharded case is the same function called
with another mesh. The step is lowered on abstract values and compiled *before* any state
exists, so a case that cannot fit (seed 000's batch 4096 without a mesh) costs one compile
and is recorded as a predicted out-of-memory instead of allocating, or being killed by the
host. What the compiled step does (FLOPs, bytes, collectives, host callbacks) is read from
it into ``Run.program`` (:mod:`.jax.program`); the compile time counts the init's compile
with the step's; and the live arrays are counted after the warm-up and after the last
measured step (``Run.memory_growth``), so a step that keeps device memory shows it. Where
the case's time went is ``Run.extra["phases"]`` (wall seconds: :meth:`JaxBackend._train`);
the drift probe is made once per device and kept for the session's later cases
(:func:`jax_probe`).
"""

from __future__ import annotations

import importlib.util
import math
import os
import re
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from pytest_accelperf.accel import Accelerator
from pytest_accelperf.backends.jax.program import program_of
from pytest_accelperf.backends.jax.step import (
    BatchSignature,
    abstract_state,
    as_step,
    batch_signature,
    check_batch,
    check_outputs,
    explain,
    full_specs,
)

# The step API lives in jax_step; imported from here as before.
from pytest_accelperf.backends.jax.step import JaxStep as JaxStep
from pytest_accelperf.backends.jax.step import JaxTask as JaxTask
from pytest_accelperf.backends.jax.step import host_batch as as_host  # "host_batch": a local
from pytest_accelperf.backends.jax.step import nnx_step as nnx_step

# Re-exported: both lived here before the torch backend needed them without jax.
from pytest_accelperf.backends.measure.common import N_SAMPLES as N_SAMPLES
from pytest_accelperf.backends.measure.common import Phases, describe, with_state
from pytest_accelperf.backends.measure.common import TaskError as TaskError
from pytest_accelperf.backends.measure.common import fingerprint as fingerprint
from pytest_accelperf.backends.measure.data import expect, source_label
from pytest_accelperf.backends.measure.loop import (
    LoopResult,
    StepFns,
    load_json,
    run_steps,
    time_block,
)
from pytest_accelperf.backends.measure.probe import PROBE_N, PROBE_REPS, Probe
from pytest_accelperf.backends.protocol import Fit, TrainResult
from pytest_accelperf.cases import Case
from pytest_accelperf.checks.base import Tolerances
from pytest_accelperf.checks.numerics import ReferenceParams, compare_leaf
from pytest_accelperf.contention import Contention, Load
from pytest_accelperf.errors import ConfigError
from pytest_accelperf.run import Run
from pytest_accelperf.targets import compiling, not_run
from pytest_accelperf.units import round_sig

PyTree = Any
# jax leaves these untyped; mypy --strict refuses untyped calls, so they go through Any.
P: Any = PartitionSpec
_ShapeDtypeStruct: Any = jax.ShapeDtypeStruct
_block_until_ready: Any = jax.block_until_ready
_device_put: Any = jax.device_put
_eval_shape: Any = jax.eval_shape
_set_mesh: Any = jax.set_mesh
_live_arrays: Any = jax.live_arrays
GIB = 2**30


@dataclass
class JaxTrainResult(TrainResult):
    """A :class:`TrainResult` with the final state of the training (what the test gets
    back as ``CaseResult.state``: ``JaxStep.final`` of it). The state stays in the process
    that trained it: pickling (a result sent back from a launched process or a cluster
    worker) drops it."""

    state: Any = None

    def __getstate__(self) -> dict[str, Any]:
        data = dict(self.__dict__)
        data["state"] = None
        return data


@dataclass
class _Program:
    """A compiled train step and the shardings its inputs must have."""

    step: JaxStep
    mesh: Any
    state_shardings: PyTree
    batch_shardings: PyTree
    compiled: Any
    compile_time: float
    #: The step before it was partitioned over the mesh: its cost analysis counts the
    #: model's FLOPs once however the mesh replicates them (:mod:`.jax.program`). For a
    #: ``bind_axes`` step, the same step lowered on one device over the global batch
    #: (:func:`_global_lowering`): the shard_map-ed program is one shard's.
    lowered: Any = None
    #: ``lowered`` is that global lowering (the program record says so).
    global_flops: bool = False
    #: A fresh initial state from the compiled init, once :func:`_init_state` compiled it:
    #: the reference check's second start (:func:`_reference`) compiles nothing.
    fresh_state: Any = None
    #: What other processes used of the machine while the step compiled (None: no /proc).
    compile_load: Load | None = None
    #: Seconds tracing the user's step (``eval_shape``, checked before it is lowered): the
    #: trace any ``jax.jit`` makes on its first call, made once (the lowering reuses it
    #: from jax's cache) and not in ``compile_time`` (the lowering and XLA's compile).
    trace_time: float = 0.0
    #: What the step was compiled for of its batch (step 0's): every batch is checked
    #: against it before it is transferred (:func:`.jax.step.check_batch`).
    batch_signature: BatchSignature | None = None
    #: What the compiler wrote to stderr while compiling for a compile-only target (kept
    #: off the terminal: :func:`pytest_accelperf.targets.compiling`).
    compiler_log: list[str] = field(default_factory=list)


class _OutOfMemory(Exception):
    """XLA ran out of device memory (RESOURCE_EXHAUSTED) compiling or running."""


def _is_oom(exc: BaseException) -> bool:
    text = str(exc)
    return isinstance(exc, RuntimeError) and (
        "RESOURCE_EXHAUSTED" in text or "out of memory" in text.lower())


def _restrict(spec: Any, axes: tuple[str, ...], rename: Mapping[str, str] | None = None) -> Any:
    """``spec`` without the mesh axes this mesh lacks (``"model"`` on a one-device mesh),
    with the axes ``rename`` names renamed (a mesh axis bound to a model's axis name)."""
    if spec is None:
        return P()
    rename = rename or {}
    out: list[Any] = []
    for entry in spec:
        if isinstance(entry, str):
            entry = rename.get(entry, entry)
            out.append(entry if entry in axes else None)
        elif isinstance(entry, tuple):
            kept = tuple(rename.get(a, a) for a in entry if rename.get(a, a) in axes)
            out.append(kept if kept else None)
        else:
            out.append(entry)  # None or P.UNCONSTRAINED
    return P(*out)


def _resolve(specs: Any, tree: PyTree, default: Any, what: str, step: JaxStep) -> Any:
    """A spec pytree from ``specs`` (a spec tree, or a function of ``tree``)."""
    if specs is None:
        return default
    if callable(specs) and not isinstance(specs, PartitionSpec):
        try:
            return specs(tree)
        except Exception as exc:
            raise TaskError(f"{what} {describe(specs)} of {step.label} failed: "
                            f"{type(exc).__name__}: {str(exc).strip().splitlines()[0]}; it "
                            f"takes the abstract {what.split('_')[0]} and returns a "
                            f"PartitionSpec pytree") from exc
    return specs


def _shardings(mesh: Any, specs: Any, tree: PyTree, rename: Mapping[str, str], what: str,
               step: JaxStep) -> PyTree:
    """A ``NamedSharding`` per leaf of ``tree``; ``specs`` may be one spec or a prefix tree."""
    try:
        full = full_specs(specs, tree)
    except (ValueError, TypeError) as exc:
        raise TaskError(f"{what} of {step.label} does not fit its tree: "
                        f"{str(exc).strip().splitlines()[0]}; give one PartitionSpec, or a "
                        f"pytree of them shaped like (a prefix of) {what.split('_')[0]}") from exc
    axes = tuple(mesh.axis_names)
    # Every leaf of ``full`` is a PartitionSpec; a None left in it is an empty subtree of
    # ``tree`` (a ``TrainState(dynamic_scale=None)``), as JAX reads it: no sharding. Read
    # as "replicated" (``is_spec``), it gave a sharding to a leaf the state does not have.
    return jax.tree.map(lambda s: NamedSharding(mesh, _restrict(s, axes, rename)), full,
                        is_leaf=lambda x: isinstance(x, PartitionSpec))


def _check_divisible(tree: PyTree, shardings: PyTree, mesh: Any, what: str,
                     fix: str) -> None:
    """Every sharded dimension of ``tree`` divides evenly over its mesh axes."""
    sizes = dict(mesh.shape)
    flat = jax.tree_util.tree_flatten_with_path(tree)[0]
    for (path, leaf), sharding in zip(flat, jax.tree.leaves(shardings), strict=True):
        shape, spec = tuple(np.shape(leaf)), tuple(sharding.spec)
        where = jax.tree_util.keystr(path, simple=True, separator="/") or "(the whole value)"
        if len(spec) > len(shape):
            raise TaskError(f"{what} gives leaf {where!r} of shape {list(shape)} the spec "
                            f"{sharding.spec}, which has more entries than dimensions; {fix}")
        for dim, entry in enumerate(spec):
            names = entry if isinstance(entry, tuple) else (entry,) if isinstance(entry, str) \
                else ()
            n = math.prod(sizes[a] for a in names)
            if n > 1 and shape[dim] % n:
                raise TaskError(f"{what}: leaf {where!r} has {shape[dim]} along dimension {dim}, "
                                f"split over mesh axes {list(names)} ({n} devices), which does "
                                f"not divide it; {fix}")


def _with_sharding(abstract: PyTree, shardings: PyTree) -> PyTree:
    return jax.tree.map(lambda a, s: _ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                        abstract, shardings)


def _mesh_renaming(step: JaxStep, case: Case) -> dict[str, str]:
    """``{mesh axis: the model's axis name}`` of ``step.bind_axes``, checked."""
    rename: dict[str, str] = {}
    for model_axis, mesh_axis in step.bind_axes.items():
        if mesh_axis not in case.axis_names:
            raise TaskError(f"bind_axes of {step.label} binds {model_axis!r} to mesh axis "
                            f"{mesh_axis!r}, which the case does not have (its axes: "
                            f"{', '.join(case.axis_names)}); bind it to one of those")
        if mesh_axis in rename:
            raise TaskError(f"bind_axes of {step.label} binds both {rename[mesh_axis]!r} and "
                            f"{model_axis!r} to mesh axis {mesh_axis!r}; bind one name per axis")
        clash = model_axis in case.axis_names and model_axis != mesh_axis
        if clash:
            raise TaskError(f"bind_axes of {step.label} binds {model_axis!r} to {mesh_axis!r}, "
                            f"but {model_axis!r} is already another axis of the case's mesh")
        rename[mesh_axis] = model_axis
    return rename


def _bound(step: JaxStep, mesh: Any, state_sh: PyTree, batch_sh: PyTree) -> Any:
    """The step as the program runs it: under ``jax.shard_map`` over the bound axes (the
    others automatic) when ``step.bind_axes`` names any, else the step itself.

    With pmap's semantics (``check_vma=False``): the user's step reduces what it needs
    itself (``lax.pmean(grads, axis)``), as under ``pmap``. shard_map's replication
    checking would sum the gradients of replicated parameters across the axis first, and
    the step's own ``pmean`` then gave 8x the gradient on 8 devices."""
    if not step.bind_axes:
        return step.step
    manual = tuple(a for a in mesh.axis_names if a in step.bind_axes)
    if not manual:  # the bound axis is not in this (one-device) mesh: nothing to split
        manual = tuple(step.bind_axes)

    def local(sharding: Any) -> Any:
        return _restrict(sharding.spec, manual)

    state_specs = jax.tree.map(local, state_sh)
    batch_specs = jax.tree.map(local, batch_sh)
    shard_map: Any = jax.shard_map
    return shard_map(step.step, mesh=mesh, in_specs=(state_specs, batch_specs),
                     out_specs=(state_specs, P()), axis_names=set(manual), check_vma=False)


def _compile(case: Case, task: Any, accel: Accelerator,
             shape: tuple[int, ...] | None) -> _Program:
    """Lower and compile the train step of ``task`` on a mesh of ``shape``; no allocation.

    What the user's functions get wrong (a loss that is not a scalar, an unbound axis name,
    a step that returns the wrong thing, a batch the mesh cannot split) is a
    :class:`TaskError` naming the function and the fix."""
    step = as_step(task)
    rename = _mesh_renaming(step, case)
    names = tuple(rename.get(a, a) for a in case.axis_names)
    mesh = accel.mesh(shape, names)
    if step.bind_axes and not all(a in mesh.axis_names for a in step.bind_axes):
        raise TaskError(f"bind_axes of {step.label} binds {', '.join(step.bind_axes)}, but the "
                        f"mesh {shape} only has axes {', '.join(mesh.axis_names)}: bind the "
                        f"axis the batch is split on (its first, "
                        f"{case.axis_names[0]!r})")
    # The mesh in context while the user's code is traced: a step may constrain shardings
    # with bare PartitionSpecs, and Flax makes annotated variables on the context mesh.
    log: list[str] = []
    with _set_mesh(mesh), _target_compile(accel, log):
        program = _compile_on(step, mesh, rename)
    program.compiler_log = log
    manual = [a for a in step.bind_axes if a in mesh.axis_names]
    if accel.compile_only:
        # libtpu gives the unpartitioned program no cost analysis (None): the model's
        # FLOPs are those of the same step lowered (not compiled) for one host CPU device
        # over the global batch, HLO's count of the same operations.
        program.lowered = _global_lowering(step, _host_mesh(names), rename)
        program.global_flops = program.lowered is not None
    elif math.prod(int(mesh.shape[a]) for a in manual) > 1:
        # Under shard_map the unpartitioned program is one device's share of the step
        # (its batch shard): its cost analysis counted 1.51 of the 11.8 MFLOP the MLP of
        # tests/test_jax_step.py counts without a mesh, on 8x1 (16.4 of 113.2 in issue 23).
        # The model's FLOPs are those of the step on one device over the global batch,
        # which is lowered (not compiled) for them.
        program.lowered = _global_lowering(step, accel.mesh(None, names), rename)
        program.global_flops = program.lowered is not None
    return program


def _host_mesh(names: tuple[str, ...]) -> Any:
    """A one-device mesh of this host's first CPU device (axes ``names``)."""
    from jax.sharding import AxisType, Mesh

    device = jax.devices("cpu")[0]
    return Mesh(np.asarray([device]), names[:1], axis_types=(AxisType.Auto,))


def _target_compile(accel: Accelerator, log: list[str]) -> AbstractContextManager[None]:
    """Where a program is made for a compile-only target: in libtpu's environment, its log
    lines into ``log`` (:func:`pytest_accelperf.targets.compiling`); elsewhere nothing."""
    return compiling(log) if accel.compile_only else nullcontext()


def _global_lowering(step: JaxStep, mesh: Any, rename: Mapping[str, str]) -> Any:
    """``step`` lowered on the one-device ``mesh`` over the global batch (its bound axes of
    size 1): the program whose cost analysis is the model's FLOPs of a ``bind_axes`` step.
    None if it cannot be lowered (the run then reports the devices' FLOPs)."""
    try:
        with _set_mesh(mesh):
            abstract = abstract_state(step)
            state_sh, batch_sh, abstract_in, abstract_batch, _ = _inputs(
                step, mesh, rename, abstract)
            jitted = jax.jit(_bound(step, mesh, state_sh, batch_sh),
                             in_shardings=(state_sh, batch_sh),
                             out_shardings=(state_sh, NamedSharding(mesh, P())))
            return jitted.lower(abstract_in, abstract_batch)
    except Exception:  # a step that traces on the mesh but not on one device: no count
        return None


def _inputs(step: JaxStep, mesh: Any, rename: Mapping[str, str],
            abstract: PyTree) -> tuple[PyTree, PyTree, PyTree, PyTree, PyTree]:
    """The shardings of the state and the batch on ``mesh`` (checked to divide), the
    abstract inputs carrying them, and step 0's host batch."""
    state_specs = _resolve(step.state_specs, abstract, None, "state_specs", step)
    if state_specs is None:
        state_specs = _annotated_specs(abstract)
    state_sh = _shardings(mesh, state_specs, abstract, rename, "state_specs", step)
    _check_divisible(abstract, state_sh, mesh, f"state_specs of {step.label}",
                     "shard that dimension over fewer devices, or replicate it (P())")
    host_batch = as_host(step.make_batch(0))  # its shapes: batches are deterministic per step
    batch_specs = _resolve(step.batch_specs, host_batch, P("data"), "batch_specs", step)
    batch_sh = _shardings(mesh, batch_specs, host_batch, rename, "batch_specs", step)
    _check_divisible(host_batch, batch_sh, mesh,
                     f"the batch of {source_label(step.make_batch)}",
                     "make the case's batch a multiple of the devices it is split over, or "
                     "replicate that leaf with batch_specs")
    abstract_batch = jax.tree.map(
        lambda x, s: _ShapeDtypeStruct(np.shape(x), np.asarray(x).dtype, sharding=s),
        host_batch, batch_sh)
    return state_sh, batch_sh, _with_sharding(abstract, state_sh), abstract_batch, host_batch


def _compile_on(step: JaxStep, mesh: Any, rename: Mapping[str, str]) -> _Program:
    abstract = abstract_state(step)
    state_sh, batch_sh, abstract_in, abstract_batch, host_batch = _inputs(
        step, mesh, rename, abstract)
    fn = _bound(step, mesh, state_sh, batch_sh)
    t0 = time.perf_counter()
    try:  # jit's one trace of the step: the lowering below reuses it from jax's cache
        out = _eval_shape(fn, abstract_in, abstract_batch)
    except Exception as exc:
        raise explain(exc, step, tuple(mesh.axis_names)) from exc
    trace_time = time.perf_counter() - t0
    check_outputs(step, abstract, out)
    jitted = jax.jit(fn, in_shardings=(state_sh, batch_sh),
                     out_shardings=(state_sh, NamedSharding(mesh, P())),
                     donate_argnums=(0,) if step.donate else ())  # the state updated in place
    watch = Contention([os.getpid()]).start()  # a compile is one sample: was it alone?
    t0 = time.perf_counter()
    try:
        lowered = jitted.lower(abstract_in, abstract_batch)
        compiled = lowered.compile()
    except RuntimeError as exc:
        if _is_oom(exc):
            raise _OutOfMemory(str(exc)) from exc
        raise
    return _Program(step, mesh, state_sh, batch_sh, compiled, time.perf_counter() - t0,
                    lowered, compile_load=watch.reading(), trace_time=trace_time,
                    batch_signature=batch_signature(host_batch))


def _annotated_specs(abstract: PyTree) -> PyTree:
    """The specs a Flax linen state carries (``nn.with_partitioning``), else replicated."""
    try:
        import flax.linen as nn

        specs: PyTree = nn.get_partition_spec(abstract)
        return specs
    except Exception:
        return P()


def _analysis_bytes(compiled: Any) -> dict[str, int]:
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


def predict_memory(case: Case, task: Any, accel: Accelerator) -> dict[str, int]:
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


def _runtime_peaks(mesh: Any) -> list[int] | None:
    """The runtime's peak bytes in use on each device of ``mesh`` since the process
    started (GPU, TPU), or None where a device has no counter (XLA:CPU, another host's)."""
    here = jax.process_index()
    stats: list[Any] = [d.memory_stats() if d.process_index == here else None
                        for d in mesh.devices.flat]
    if not all(s and "peak_bytes_in_use" in s for s in stats):
        return None
    return [int(s["peak_bytes_in_use"]) for s in stats]


def _labels(mesh: Any) -> list[str]:
    return [f"{d.platform}:{d.id}" for d in mesh.devices.flat]


def _flat(tree: PyTree) -> dict[str, np.ndarray]:
    """``{"params/Block_0/Dense_0/kernel": host array}`` of a pytree (gathers shards)."""
    if jax.process_count() > 1:  # a case spanning processes: every process gathers
        from jax.experimental import multihost_utils

        tree = multihost_utils.process_allgather(tree, tiled=True)
    tree = jax.tree.map(_key_data, tree)
    leaves, _ = jax.tree_util.tree_flatten_with_path(jax.device_get(tree))
    return {jax.tree_util.keystr(path, simple=True, separator="/"): np.asarray(leaf)
            for path, leaf in leaves}


def _key_data(leaf: Any) -> Any:
    """A PRNG key array as its raw integers (numpy cannot hold a key), else the leaf."""
    dtype = getattr(leaf, "dtype", None)
    if dtype is not None and jnp.issubdtype(dtype, jax.dtypes.prng_key):
        return jax.random.key_data(leaf)
    return leaf


#: The probe made last on each device, by device: ``(n, reps, probe)`` (:func:`jax_probe`).
_PROBES: dict[Any, tuple[int, int, Probe]] = {}


def jax_probe(device: Any, n: int = PROBE_N, reps: int = PROBE_REPS) -> Probe:
    """The drift-cancelling reference workload (see :mod:`.probe`): ``reps`` float32
    ``n x n`` products, jitted, on ``device``, blocked until done.

    Made once per device and size and kept: the cases of a session after the first reuse
    its compiled program and its two matrices (512 KiB at n=256) instead of compiling it
    again (0.07 s), and the matrices are standard normal numbers from numpy's generator
    (seeded) rather than ``jax.random``'s, whose op-by-op programs cost a process's first
    probe 0.4 s more to compile (the product's time does not depend on the values)."""
    kept = _PROBES.get(device)
    if kept is not None and kept[:2] == (n, reps):
        return kept[2]
    rng = np.random.default_rng(0)
    a = jax.device_put(rng.standard_normal((n, n), np.float32), device)
    b = jax.device_put(rng.standard_normal((n, n), np.float32), device)

    def work(x: Any, y: Any) -> Any:
        for _ in range(reps):
            x = jax.numpy.tanh(x @ y)
        return x

    fn = jax.jit(work)
    _block_until_ready(fn(a, b))  # compile outside any timing

    def run() -> None:
        _block_until_ready(fn(a, b))

    probe = Probe(f"jax-{device.platform}-matmul{n}x{reps}", run)
    _PROBES[device] = (n, reps, probe)
    return probe


def _step_fns(program: _Program, state: PyTree) -> tuple[StepFns[PyTree, Any], list[Any]]:
    """The compiled program as the measured-step loop runs it (:mod:`.loop`), from
    ``state``; the live state is ``holder[0]``."""
    holder = [state]

    def run(i: int, batch: PyTree) -> Any:
        holder[0], metrics = program.compiled(holder[0], batch)
        # Block on every step: besides honest timing, XLA:CPU collectives across virtual
        # devices can deadlock when many unblocked steps are queued.
        _block_until_ready((holder[0], metrics))
        return metrics

    key = program.step.loss

    def read(metrics: Any) -> tuple[float, dict[str, float]]:
        values = jax.device_get(metrics)
        return float(values[key]), {k: float(v) for k, v in values.items() if k != key}

    return StepFns(prepare=lambda i: _batch(program, i), run=run, read=read,
                   host=lambda i: _host(program, i),
                   put=lambda i, host: _put(program, i, host)), holder


def _init_state(program: _Program) -> tuple[PyTree, float]:
    """The step's initial state on the program's shardings: ``init`` compiled with them,
    or a ready state copied onto them (a copy: the donated state is never the user's);
    and the seconds spent lowering and compiling that (part of the run's compile time:
    the user waits for it). Compiled explicitly, then called: one compile; a second call
    reuses it (0 seconds)."""
    if program.fresh_state is not None:
        return program.fresh_state(), 0.0
    step = program.step
    if not callable(step.init):
        # A compiled copy: device_put(may_alias=False) still shares the buffer of a
        # replicated array's first shard, which the first step's donation would delete.
        copy = jax.jit(lambda state: jax.tree.map(jnp.copy, state),
                       out_shardings=program.state_shardings)
        t0 = time.perf_counter()
        compiled = copy.lower(step.init).compile()
        seconds = time.perf_counter() - t0
        program.fresh_state = lambda: compiled(step.init)
        return program.fresh_state(), seconds
    # Leaves only, put back into the compiled structure: an init that makes its static
    # parts afresh each call (a TrainState's tx = optax.adam(...) inside init) gives a
    # structure that compares unequal to the one compiled, with the same leaves.
    init = step.init
    treedef: Any = jax.tree.structure(program.state_shardings)
    key = jax.random.key(step.seed)
    with _set_mesh(program.mesh):
        make = jax.jit(lambda key: jax.tree.leaves(init(key)),
                       out_shardings=jax.tree.leaves(program.state_shardings))
        t0 = time.perf_counter()
        compiled = make.lower(key).compile()
        seconds = time.perf_counter() - t0
    program.fresh_state = lambda: treedef.unflatten(compiled(key))
    return program.fresh_state(), seconds


def _batch(program: _Program, i: int) -> PyTree:
    """Batch ``i`` on the program's shardings, transferred (outside any timer)."""
    return _put(program, i, _host(program, i))


def _host(program: _Program, i: int) -> PyTree:
    """Batch ``i`` on the host: what the user's ``make_batch`` (or data) gives, its torch
    or TensorFlow tensors as numpy arrays (the step's input time, :mod:`.loop`)."""
    return as_host(program.step.make_batch(i))


def _put(program: _Program, i: int, host: PyTree) -> PyTree:
    """``host``, batch ``i``, on the program's shardings, transferred; one whose shapes or
    dtypes are not those the step was compiled for is a :class:`TaskError` naming
    ``make_batch``, the step and the leaves that changed."""
    if program.batch_signature is not None:
        check_batch(program.step, i, program.batch_signature, host)
    batch = _device_put(host, program.batch_shardings)
    _block_until_ready(batch)
    return batch


class JaxStepper:
    """The compiled train step of a case, run on demand in blocks of steps: what the A/B
    comparison (:mod:`pytest_accelperf.ab`) alternates between two revisions. Steps
    are timed exactly as in a run (:func:`.loop.time_block`)."""

    def __init__(self, case: Case, task: Any, accel: Accelerator) -> None:
        step = as_step(task)
        expect(step.make_batch, case.warmup + case.steps)  # data given as an iterable
        self._program = _compile(case, step, accel, case.mesh)
        self._cycle = max(1, case.warmup + case.steps)  # the batches a run would see
        self._fns, self._state = _step_fns(self._program, _init_state(self._program)[0])
        self._step = 0

    def run(self, n: int) -> list[float]:
        """Train ``n`` more steps; their step times in seconds."""
        times, _ = time_block(self._fns, self._step, n, self._cycle)
        self._step += n
        return times

    @property
    def program(self) -> dict[str, Any]:
        """The step's program record, for A/B mode's diff of the two revisions."""
        program = self._program
        return program_of(program.lowered, program.compiled, int(program.mesh.devices.size),
                          global_flops=program.global_flops)


@dataclass
class _Trained:
    """What :func:`_execute` gives back."""

    loop: LoopResult
    state: PyTree  #: the final state
    init_compile_time: float  #: seconds compiling ``init`` (:func:`_init_state`)
    #: ``Run.memory_growth``; None when the loop stopped before its last step.
    memory_growth: dict[str, Any] | None


def _execute(program: _Program, case: Case, probe: Probe | None = None,
             deadline: float | None = None) -> _Trained:
    """Initialize on the program's shardings and run warmup + measured steps in the
    measured-step loop (:func:`.loop.run_steps`); the result, the final state, the init's
    compile time, and how live memory grew over the measured steps.

    Live bytes (:func:`_live_bytes`) are read after the last warm-up step (before the first
    measured step without warm-up) and after the last measured step, outside the timer;
    the batch and the metrics of that step are left out of both readings, so the two
    count the same things (the state, and whatever the user's code kept)."""
    state, init_seconds = _init_state(program)
    fns, holder = _step_fns(program, state)
    del state  # donated by the first step: holder[0] is the live state
    current: list[PyTree] = [None]  # the batch of the step that ran last

    def prepare(i: int) -> PyTree:
        current[0] = None
        current[0] = fns.prepare(i)
        return current[0]

    def host(i: int) -> PyTree:
        current[0] = None  # the last step's batch is not kept while this one is made
        return _host(program, i)

    def put(i: int, made: PyTree) -> PyTree:
        current[0] = _put(program, i, made)
        return current[0]

    readings: dict[str, int] = {}
    last = case.warmup + case.steps - 1

    def after_step(i: int, metrics: Any, measured: bool) -> None:
        if i == case.warmup - 1:
            readings["after_warmup"] = _live_bytes((current[0], metrics))
        if i == last:
            readings["after_steps"] = _live_bytes((current[0], metrics))

    if case.warmup == 0:
        readings["after_warmup"] = _live_bytes(None)
    trained = run_steps(StepFns(prepare=prepare, run=fns.run, read=fns.read, sync=fns.sync,
                                sync_before=fns.sync_before, host=host, put=put),
                        warmup=case.warmup, steps=case.steps, probe=probe, deadline=deadline,
                        after_step=after_step)
    growth: dict[str, Any] | None = None
    if "after_warmup" in readings and "after_steps" in readings:
        before, after = readings["after_warmup"], readings["after_steps"]
        growth = {"bytes_per_step": (after - before) / case.steps, "steps": case.steps,
                  "after_warmup": before, "after_steps": after, "source": "live_arrays"}
    return _Trained(trained, holder[0], init_seconds, growth)


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


class JaxBackend:
    """Trains a :class:`JaxStep` (or a :class:`JaxTask`, or an :func:`nnx_step`) on a
    ``jax.sharding.Mesh`` of the case's shape."""

    name = "jax"

    def unavailable_reason(self) -> str | None:
        missing = [p for p in ("jax", "flax", "optax") if importlib.util.find_spec(p) is None]
        if missing:
            return (f"the jax backend needs {', '.join(missing)}: "
                    f"pip install 'pytest-accelperf[jax]'")
        return None

    def fits(self, case: Case, task: Any, accel: Accelerator, *,
             timeout: float | None = None) -> Fit:
        """Compile only: the planned bytes per device against the capacity (the smaller of
        the runtime's and ``case.memory_capacity``); a compile that itself runs out of
        memory does not fit."""
        capacity = _capacity(accel, case)
        if not capacity:
            raise ConfigError(f"{case.id}: no device capacity to search a maximum batch against; "
                             f"declare memory_capacity on the case")
        try:
            planned = _analysis_bytes(_compile(case, task, accel, case.mesh).compiled)
        except _OutOfMemory as exc:
            return Fit(False, None, int(capacity), str(exc).splitlines()[0])
        need = planned.get("required_bytes")
        if need is None:
            raise ConfigError(f"{case.id}: this runtime gives no memory analysis to search a "
                             f"maximum batch with")
        return Fit(need <= capacity, need, int(capacity), "memory_analysis per device")

    def settle(self, accel: Accelerator, within: float) -> bool:
        """After a case was interrupted mid-step: whether every device of this process
        finishes a trivial computation within ``within`` seconds. XLA cannot cancel a
        computation once dispatched; one of the interrupted case that is still running
        holds its device, and anything measured after it would wait behind it."""
        deadline = time.monotonic() + within
        probes = [jax.device_put(np.zeros((), np.float32), d) + 1 for d in jax.local_devices()]
        while not all(p.is_ready() for p in probes):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True

    def stepper(self, case: Case, task: Any, accel: Accelerator) -> JaxStepper:
        """The case's compiled step, run in blocks (A/B comparison)."""
        return JaxStepper(case, task, accel)

    def train(self, case: Case, task: Any, accel: Accelerator, *,
              timeout: float | None = None) -> TrainResult:
        """Compile, predict memory, train and fingerprint the case (the module docstring);
        where its time went is ``Run.extra["phases"]`` (:meth:`_train`)."""
        phases = Phases()
        result = self._train(case, task, accel, timeout, phases)
        result.run.extra["phases"] = phases.record()
        return result

    def _train(self, case: Case, task: Any, accel: Accelerator, timeout: float | None,
               phases: Phases) -> TrainResult:
        """:meth:`train`, timing its phases in ``phases``: ``build`` (the user's task as a
        step), ``compile`` (tracing and checking the step, then lowering and compiling it:
        ``Run.compile_time``'s step part is the latter), ``program`` (reading the program
        record and the memory analysis), ``probe`` (making the drift probe), ``train``
        (compiling the init, then the warm-up and measured steps with the drift probe after
        each), ``fingerprint``, ``reference`` (the single-device reference)."""
        with phases("build"):  # the user's task as a step (JaxTask.to_step)
            step = as_step(task)
        expect(step.make_batch, case.warmup + case.steps)  # data given as an iterable
        deadline = time.monotonic() + timeout if timeout else None
        run = Run(case_id=case.id, samples_per_step=case.batch,
                  tokens_per_step=(case.batch * step.tokens_per_sample
                                   if step.tokens_per_sample else None),
                  n_devices=case.n_devices, peak_flops_per_device=accel.peak_flops)
        if accel.compile_only:  # every result of this case says what it did not measure
            run.extra["compile_only"] = accel.compile_only
            run.message = not_run(accel.compile_only)
        try:
            with phases("compile"):  # tracing and checking the step, then compiling it
                program = _compile(case, step, accel, case.mesh)
        except _OutOfMemory as exc:
            return TrainResult(run=_oom_run(run, str(exc), planner(accel)))
        mesh = program.mesh
        run.n_devices = int(mesh.devices.size)
        run.compile_time = program.compile_time
        if program.compile_load is not None:
            run.extra["compile_load"] = program.compile_load.to_json()
        run.extra["compile_time_parts"] = {"step": program.compile_time}
        run.extra["trace_time"] = program.trace_time
        with phases("program"):
            run.program = program_of(program.lowered, program.compiled, run.n_devices,
                                     global_flops=program.global_flops)
            planned = _analysis_bytes(program.compiled)
        hardware = run.program.get("hardware_flops")
        run.flops_per_step = run.program.get("flops") or hardware
        if hardware is not None:
            run.extra["hardware_flops_per_step"] = hardware
        if planned:
            run.memory_per_device = {label: planned["required_bytes"] for label in _labels(mesh)}
            run.memory_source = "memory_analysis"
        capacity = _capacity(accel, case)
        oom = _predicted_oom(planned, capacity, planner(accel))
        if oom is not None:
            run.outcome, run.oom = "oom", oom
            run.message = _oom_message(oom)
            return TrainResult(run=run)  # no parameter was ever allocated
        if accel.compile_only:
            # Compiled for devices that are not here: nothing runs. What the compiler said
            # on stderr is summarized in one line, kept off the terminal.
            if program.compiler_log:
                run.extra["compiler_log"] = program.compiler_log[:20]
            run.extra["planned_by"] = planner(accel)
            # The plan's parts, and the compiler's own peak (XLA:TPU's, from its heap
            # simulation; the gate's figure stays the sum above, as on every platform).
            run.extra["memory_plan"] = planned
            peak = getattr(program.compiled.memory_analysis(), "peak_memory_in_bytes", 0)
            if peak:
                run.extra["memory_plan"] = {**planned, "compiler_peak_bytes": int(peak)}
            return TrainResult(run=run)

        peaks_before = _runtime_peaks(mesh)
        # This process's first device (with jax.distributed, others belong to other hosts).
        with phases("probe"):
            probe = jax_probe(next(d for d in mesh.devices.flat
                                   if d.process_index == jax.process_index()))
        try:
            with phases("train"):  # the init's compile, warm-up and measured steps
                executed = _execute(program, case, probe, deadline)
        except RuntimeError as exc:
            if _is_oom(exc):
                return TrainResult(run=_oom_run(run, str(exc)))
            raise
        trained, final = executed.loop, executed.state
        run.extra["compile_time_parts"]["init"] = executed.init_compile_time
        run.compile_time = program.compile_time + executed.init_compile_time
        run.memory_growth = executed.memory_growth
        run.losses = trained.losses
        run.loss_steps = list(range(len(trained.losses)))
        run.metrics = trained.metrics
        run.step_times = trained.step_times
        run.probe_times, run.probe_kind = trained.probe_times, probe.kind
        run.input_times, run.input_wall_times = trained.input_times, trained.input_wall_times
        run.extra.update(load_json(trained))
        # The gate's figure stays the compiler's plan on every platform. GPU/TPU runtimes
        # also count a peak, but since the process started, with no reset: on an H100 every
        # case after a larger one read that one's peak (189.77 MiB for an MLP of 2 MiB).
        # Where this case raised the peak, the peak is its own and is recorded beside.
        after = _runtime_peaks(mesh)
        if after is not None and peaks_before is not None:
            run.extra["runtime_peak"] = {
                label: peak for label, peak, before
                in zip(_labels(mesh), after, peaks_before, strict=True) if peak > before}
        with phases("fingerprint"):  # the parameters and the state beside them
            params, state_names = _fingerprinted(step, final)
            run.params_fingerprint = fingerprint(params, state_names)
        if (trained.nan_step is None and not trained.timed_out
                and _replayed_on(next(iter(mesh.devices.flat)).platform)):
            with phases("replay"):  # the same steps again: does the platform repeat them?
                run.extra["replay"] = _replay(program, len(trained.losses), params)
        # The final state goes back to the test; a case spanning processes holds shards
        # of it in each, and no process can hand it over whole.
        state = step.final_of(final) if jax.process_count() == 1 else None
        if trained.nan_step is not None:
            run.outcome = "nan"
            run.nan_step = trained.nan_step
            run.message = f"loss is {trained.losses[-1]} at step {trained.nan_step}"
            return JaxTrainResult(run=run, params=params, state=state)
        if trained.timed_out:
            run.outcome = "timeout"
            run.message = (f"exceeded the {timeout:g} s timeout after {len(trained.losses)} of "
                           f"{case.warmup + case.steps} steps (raise --accelperf-timeout, or "
                           f"give the case fewer steps)")
            return JaxTrainResult(run=run, params=params, state=state)

        with phases("reference"):
            reference = (_reference(case, step, accel, capacity, run, program)
                         if case.reference else None)
        return JaxTrainResult(run=run, params=params, reference_params=reference, state=state)


def _reference(case: Case, step: JaxStep, accel: Accelerator, capacity: int | None,
               run: Run, program: _Program) -> ReferenceParams | None:
    """The single-device reference of a sharded case (seed 004), apart from the measured
    run: the same task, seed and batches compiled for ONE device, and both it and the
    case's own compiled ``program`` trained the same steps from a fresh initial state (the
    sharded program's compiled init is reused: no compile but the single-device
    program's). Their flat parameters and the state beside them after those steps are
    compared (:class:`ReferenceParams`), not the final ones: rounding differences between
    two correct programs grow with every step, a sharding bug shows from the first.
    Neither's times are recorded. When one device cannot hold the case, None, with the
    reason in ``run.extra["reference"]``.

    How many steps: at least ``case.reference_steps``, and on until the reference's
    parameters have moved from their initial values beyond the reference tolerance (the
    case's, else the default), at most :data:`REFERENCE_MAX_STEPS` (or
    ``reference_steps`` if more). Until they have, a program that updated nothing would
    match the reference: a schedule that warms up from learning rate 0 (Flax's ImageNet
    example) left the parameters where they started after the one step compared before,
    and the check passed with a largest |Δ| of 0 whatever the sharding did. Where they
    never moved, the check says so (``inconclusive``), from ``ReferenceParams.initial``."""
    least = case.reference_steps
    most = max(least, REFERENCE_MAX_STEPS)
    tol = Tolerances().merged(dict(case.tolerances))
    try:
        single = _compile(case, step, accel, None)
        oom = _predicted_oom(_analysis_bytes(single.compiled), capacity, planner(accel))
        if oom is not None:
            raise _OutOfMemory(_oom_message(oom))
        initial: dict[str, np.ndarray] = {}

        def moved(state: PyTree) -> bool:
            now = _flat(step.params_of(state))
            return any(compare_leaf(p, initial[p], now[p], rtol=tol.reference_rtol,
                                    atol=tol.reference_atol).mismatched
                       for p in now if p in initial)

        final, n = _train_steps(single, least, most, moved=moved, initial=initial)
        reference, state_names = _fingerprinted(step, final)
    except (_OutOfMemory, RuntimeError) as exc:
        if not isinstance(exc, _OutOfMemory) and not _is_oom(exc):
            raise
        run.extra["reference"] = f"single-device reference not run: {exc}".splitlines()[0]
        return None
    compared, _ = _fingerprinted(step, _train_steps(program, n, n)[0])
    run.extra["reference_steps"] = n
    mesh = "x".join(str(size) for size in case.mesh) if case.mesh is not None else ""
    return ReferenceParams(reference, compared=compared, steps=n, mesh=mesh,
                           state=state_names, initial=initial, least=least)


#: The most steps the reference trains looking for the parameters to move (when
#: ``Case.reference_steps`` is fewer): a few more than an Adam step of 1e-3 per step needs
#: to move a parameter past the default tolerance of 5e-3, few enough that the rounding
#: differences of two correct programs stay far below it (1.1e-05 after 32 steps for the
#: CNN of tests/test_reference_layout.py).
REFERENCE_MAX_STEPS = 16


def _train_steps(program: _Program, least: int, most: int,
                 moved: Callable[[PyTree], bool] | None = None,
                 initial: dict[str, np.ndarray] | None = None) -> tuple[PyTree, int]:
    """The state after ``least`` steps of ``program`` from its initial state on batches
    ``0, 1, ...`` (the first batches of a run), untimed, and on to ``most`` steps until
    ``moved(state)``; and the steps it took. ``initial`` is filled with the initial
    state's flat parameters (before the first step donates it)."""
    state, _ = _init_state(program)
    if initial is not None:
        initial.update(_flat(program.step.params_of(state)))
    fns, holder = _step_fns(program, state)
    del state  # donated by the first step: holder[0] is the live state
    for i in range(most):
        fns.run(i, fns.prepare(i))
        if i + 1 >= least and (moved is None or moved(holder[0])):
            return holder[0], i + 1
    return holder[0], most


#: Platforms whose programs need not repeat their arithmetic exactly: XLA:GPU reduces with
#: atomics (a bias's gradient summed over the batch), so two runs of one program from one
#: initial state differ in the last bits, and after a case's steps by more than the
#: numerics tolerance (on an H100, 6e-4 to 4.5e-3 in 2 of 31 leaves of the charlm MLP, and
#: a BatchNorm's running mean: 5 of 11 unchanged cases failed the check against their own
#: recording). On these, the training is replayed (:func:`_replay`). XLA:CPU and TPUs
#: repeat their programs exactly.
REPLAYED_PLATFORMS = frozenset({"gpu", "cuda", "rocm"})


def _replayed_on(platform: str) -> bool:
    return platform in REPLAYED_PLATFORMS


def _replay(program: _Program, steps: int, flat: Mapping[str, np.ndarray]) -> dict[str, Any]:
    """The case's training replayed: the same ``steps`` steps of the same compiled program
    from the same initial state and batches, untimed, and its parameters and state against
    the run's (``flat``), leaf by leaf: ``spread``, the largest relative difference
    ``||run - replay|| / ||run||`` of a leaf (0 where the platform repeated the run
    exactly), ``leaf`` where it is, and each differing leaf's (``leaves``). Each leaf's
    norm is over all its elements, so one replay measures the spread well where a single
    number per leaf (the stored sketch) would not. The numerics check compares a run with
    its baseline at a relative tolerance no tighter than a multiple of each leaf's spread:
    two runs of unchanged code differ by as much
    (:func:`pytest_accelperf.checks.numerics.check_numerics`)."""
    again, _ = _fingerprinted(program.step, _train_steps(program, steps, steps)[0])
    spreads: dict[str, float] = {}
    for path, ran in flat.items():
        if path in again:
            a = np.asarray(ran, np.float64)
            norm = float(np.linalg.norm(a))
            diff = float(np.linalg.norm(a - np.asarray(again[path], np.float64)))
            spreads[path] = diff / norm if norm > 0 else (math.inf if diff else 0.0)
    worst = max(spreads, key=spreads.__getitem__, default="")
    return {"steps": steps, "spread": round_sig(spreads.get(worst, 0.0), 4),
            "leaf": worst or None,
            "leaves": {p: round_sig(d, 4) for p, d in sorted(spreads.items()) if d > 0}}


def _fingerprinted(step: JaxStep, state: PyTree) -> tuple[dict[str, np.ndarray], list[str]]:
    """The flat parameters of ``state`` and the state beside them (:meth:`JaxStep.beside_of`)
    in one dict, and the names of the state's leaves in it
    (:func:`~pytest_accelperf.backends.measure.common.with_state`)."""
    params = step.params_of(state)
    return with_state(_flat(params), _flat(step.beside_of(state, params)))


def planner(accel: Accelerator) -> str:
    """Whose memory plan a prediction is: ``XLA:CPU`` (virtual CPU devices: not what an
    accelerator's compiler plans for the same step), ``XLA:TPU`` (a TPU's, or a
    compile-only target's: libtpu's compiler), ``XLA:GPU``."""
    return f"XLA:{accel.name.upper()}"


def _predicted_oom(planned: dict[str, int], capacity: int | None,
                   planned_by: str = "") -> dict[str, Any] | None:
    """The ``Run.oom`` record when the planned bytes exceed the capacity, else None;
    ``planned_by`` names the compiler whose plan it is (:func:`planner`)."""
    if not planned or not capacity or planned["required_bytes"] <= capacity:
        return None
    need = planned["required_bytes"]
    oom: dict[str, Any] = {"required_bytes": need, "capacity_bytes": int(capacity),
                           "exceeded_by_bytes": need - int(capacity),
                           "source": "memory_analysis"}
    if planned_by:
        oom["planned_by"] = planned_by
    return oom


def _oom_message(oom: dict[str, Any]) -> str:
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


def compiler_oom(message: str, planned_by: str = "") -> dict[str, Any] | None:
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
    oom: dict[str, Any] = {"required_bytes": need, "capacity_bytes": have,
                           "exceeded_by_bytes": need - have, "source": "compiler"}
    if planned_by:
        oom["planned_by"] = planned_by
    return oom


def _oom_run(run: Run, message: str, planned_by: str = "") -> Run:
    run.outcome = "oom"
    run.message = f"out of memory: {message.splitlines()[0] if message else 'RESOURCE_EXHAUSTED'}"
    oom = compiler_oom(message, planned_by)
    if oom is not None:
        run.oom = oom
    return run


BACKEND = JaxBackend()
