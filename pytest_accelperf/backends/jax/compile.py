"""A JAX train step lowered and compiled ahead of time, before any state exists.

:func:`_compile` traces the user's step on abstract values (checked: what it returns, its
axis names), shards it (:mod:`.jax.sharding`) and compiles it: a case that cannot fit
costs one compile and no allocation (XLA's RESOURCE_EXHAUSTED is :class:`_OutOfMemory`).
For a compile-only target the compile runs in libtpu's environment with its log kept
(:func:`pytest_accelperf.provision.targets.compiling`). The model's FLOPs of a ``bind_axes`` step,
or of a target's program, come from the same step lowered on one device over the global
batch (:func:`_global_lowering`). What the compiled program does is read by
:mod:`.jax.program`; its memory plan by :mod:`.jax.memory`.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from pytest_accelperf.backends.jax.sharding import _bound, _host_mesh, _inputs, _mesh_renaming
from pytest_accelperf.backends.jax.step import (
    BatchSignature,
    JaxStep,
    abstract_state,
    as_step,
    batch_signature,
    check_outputs,
    explain,
)
from pytest_accelperf.backends.measure.common import TaskError
from pytest_accelperf.backends.types import PyTree
from pytest_accelperf.collect.cases import Case
from pytest_accelperf.provision.accel import Accelerator
from pytest_accelperf.provision.targets import compiling
from pytest_accelperf.stats.contention import Contention, Load

if TYPE_CHECKING:
    from pytest_accelperf.backends.protocol import Task

# jax leaves these untyped; mypy --strict refuses untyped calls, so they go through Any.
P: Any = PartitionSpec
_eval_shape: Any = jax.eval_shape
_set_mesh: Any = jax.set_mesh


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
    #: off the terminal: :func:`pytest_accelperf.provision.targets.compiling`).
    compiler_log: list[str] = field(default_factory=list)


class _OutOfMemory(Exception):
    """XLA ran out of device memory (RESOURCE_EXHAUSTED) compiling or running."""


def _is_oom(exc: BaseException) -> bool:
    text = str(exc)
    return isinstance(exc, RuntimeError) and (
        "RESOURCE_EXHAUSTED" in text or "out of memory" in text.lower())


def _compile(case: Case, task: Task, accel: Accelerator,
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
        # tests/unit/backends/jax/test_step.py counts without a mesh, on 8x1 (16.4 of 113.2 in
        # issue 23).
        # The model's FLOPs are those of the step on one device over the global batch,
        # which is lowered (not compiled) for them.
        program.lowered = _global_lowering(step, accel.mesh(None, names), rename)
        program.global_flops = program.lowered is not None
    return program


def _target_compile(accel: Accelerator, log: list[str]) -> AbstractContextManager[None]:
    """Where a program is made for a compile-only target: in libtpu's environment, its log
    lines into ``log`` (:func:`pytest_accelperf.provision.targets.compiling`); elsewhere nothing."""
    return compiling(log) if accel.compile_only else nullcontext()


def _global_lowering(step: JaxStep, mesh: Mesh,
                     rename: Mapping[str, str]) -> jax.stages.Lowered | None:
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


def global_lowering(task: Task, case: Case) -> jax.stages.Lowered | None:
    """``task``'s step lowered on one device over the global batch (the case's axes of
    size 1): the program whose cost analysis is the model's FLOPs. None where it cannot
    be lowered."""
    step = as_step(task)
    try:
        rename = _mesh_renaming(step, case)
    except TaskError:
        return None
    names = tuple(rename.get(a, a) for a in case.axis_names)
    return _global_lowering(step, _host_mesh(names), rename)


def _compile_on(step: JaxStep, mesh: Mesh, rename: Mapping[str, str]) -> _Program:
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

