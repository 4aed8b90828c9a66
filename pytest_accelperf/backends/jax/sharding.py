"""Where a JAX step's arrays live on the mesh: the shardings of its state and batch.

The state's specs are the user's ``state_specs`` (a spec tree, or a function of the abstract
state), else what a Flax linen state is annotated with, else replicated; the batch's are
``batch_specs``, else split along the mesh's first axis (``"data"``). Each is checked to
divide its leaves evenly (:class:`TaskError` naming the leaf and the fix). A ``bind_axes``
step renames mesh axes to its own axis names and runs under ``jax.shard_map`` over them
(:func:`_bound`). Used by :mod:`.jax.compile`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from pytest_accelperf.backends.jax.step import JaxStep, full_specs
from pytest_accelperf.backends.jax.step import host_batch as as_host
from pytest_accelperf.backends.measure.common import TaskError, describe
from pytest_accelperf.backends.measure.data import source_label
from pytest_accelperf.backends.types import Batch, PyTree, UserValue
from pytest_accelperf.collect.cases import Case

# jax leaves these untyped; mypy --strict refuses untyped calls, so they go through Any.
P: Any = PartitionSpec
_ShapeDtypeStruct: Any = jax.ShapeDtypeStruct


def _restrict(spec: PartitionSpec | None, axes: tuple[str, ...],
              rename: Mapping[str, str] | None = None) -> PartitionSpec:
    """``spec`` without the mesh axes this mesh lacks (``"model"`` on a one-device mesh),
    with the axes ``rename`` names renamed (a mesh axis bound to a model's axis name)."""
    if spec is None:
        replicated: PartitionSpec = P()
        return replicated
    rename = rename or {}
    out: list[object] = []
    for entry in spec:
        if isinstance(entry, str):
            entry = rename.get(entry, entry)
            out.append(entry if entry in axes else None)
        elif isinstance(entry, tuple):
            kept = tuple(rename.get(a, a) for a in entry if rename.get(a, a) in axes)
            out.append(kept if kept else None)
        else:
            out.append(entry)  # None or P.UNCONSTRAINED
    restricted: PartitionSpec = P(*out)
    return restricted


def _resolve(specs: PyTree, tree: PyTree, default: PyTree, what: str, step: JaxStep) -> PyTree:
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


def _shardings(mesh: Mesh, specs: PyTree, tree: PyTree, rename: Mapping[str, str], what: str,
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


def _check_divisible(tree: PyTree, shardings: PyTree, mesh: Mesh, what: str,
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


def _bound(step: JaxStep, mesh: Mesh, state_sh: PyTree,
           batch_sh: PyTree) -> Callable[[PyTree, Batch], UserValue]:
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

    def local(sharding: NamedSharding) -> PartitionSpec:
        return _restrict(sharding.spec, manual)

    state_specs = jax.tree.map(local, state_sh)
    batch_specs = jax.tree.map(local, batch_sh)
    shard_map: Any = jax.shard_map
    mapped: Callable[[PyTree, Batch], UserValue] = shard_map(
        step.step, mesh=mesh, in_specs=(state_specs, batch_specs),
        out_specs=(state_specs, P()), axis_names=set(manual), check_vma=False)
    return mapped


def _host_mesh(names: tuple[str, ...]) -> Mesh:
    """A one-device mesh of this host's first CPU device (axes ``names``)."""
    from jax.sharding import AxisType

    device = jax.devices("cpu")[0]
    return Mesh(np.asarray([device]), names[:1], axis_types=(AxisType.Auto,))


def _inputs(step: JaxStep, mesh: Mesh, rename: Mapping[str, str],
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


def _annotated_specs(abstract: PyTree) -> PyTree:
    """The specs a Flax linen state carries (``nn.with_partitioning``), else replicated."""
    try:
        import flax.linen as nn

        specs: PyTree = nn.get_partition_spec(abstract)
        return specs
    except Exception:
        return P()

