"""What the JAX backend trains: a state and the user's own training step.

A :class:`JaxStep` is any pytree state and a ``step(state, batch) -> (state, metrics)``,
written as the user would write it (a Flax ``TrainState`` with ``batch_stats``, a step that
is already ``jax.jit``-ed); the backend (:mod:`pytest_accelperf.backends.jax.backend`) jits it with
the case's shardings, compiles it before anything is allocated, and times it. The two
conveniences are built on it: :class:`JaxTask` (params, a loss and an optax optimizer)
becomes a step through :meth:`JaxTask.to_step`, and :func:`nnx_step` turns a Flax NNX
train step (a model, an ``nnx.Optimizer`` and metrics, updated in place) into one.

Whatever the user's function gets wrong is raised here as a
:class:`~pytest_accelperf.backends.measure.common.TaskError` that names the function, where it is
defined, and the fix (:func:`explain`, :func:`check_outputs`).
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any, TypeAlias

import jax
import numpy as np
import optax
from jax.sharding import PartitionSpec
from jax.typing import ArrayLike

from pytest_accelperf.backends.measure.common import (
    TaskError,
    at_user_frame,
    check_metric_keys,
    describe,
    first_line,
)
from pytest_accelperf.backends.measure.data import batch_function, source_label
from pytest_accelperf.backends.types import Batch, Framework, Leaf, PyTree, UserValue

if TYPE_CHECKING:
    from flax.nnx import GraphDef

    from pytest_accelperf.backends.protocol import Task

#: What installs flax, which only :func:`nnx_step` (and Linen's sharding annotations) use.
FLAX_INSTALL = "pip install flax (or pip install 'pytest-accelperf[jax]')"

#: A step's metrics: scalars by name (jax arrays, tracers while it is traced, or Python
#: numbers).
JaxMetrics: TypeAlias = dict[str, ArrayLike]
# jax leaves these untyped; mypy --strict refuses untyped calls, so they go through Any.
P: Any = PartitionSpec
_eval_shape: Any = jax.eval_shape



@dataclass
class JaxStep:
    """A training step the user wrote, and its state: what the JAX backend trains.

    ``init`` is a function of a PRNG key (``jax.random.key(seed)``) that returns the state,
    or the state itself; any pytree (a dict, a Flax ``TrainState`` with ``batch_stats`` and
    a dropout ``key``, an NNX ``State``). A function is compiled and its memory predicted
    before it runs; a ready state is copied onto the case's shardings.

    ``step(state, batch)`` returns ``(new_state, metrics)``: the new state has the same
    structure, shapes and dtypes as the old, and ``metrics`` is a dict of scalars holding
    the loss under ``loss`` (default ``"loss"``). Every other metric (accuracy, gradient
    norm, learning rate) is recorded per step and checked against the baseline like the
    loss. The step may already be ``jax.jit``-ed; the backend jits it again with the
    case's shardings (jit of jit is one program).

    ``make_batch(step)`` returns the global host batch of a step, the same whatever the
    mesh. Or, instead, ``data`` is the user's own pipeline: an iterable of batches (a
    ``DataLoader``, a ``tf.data`` dataset; iterated again with ``iter()`` for every
    training the plugin runs) or a function of no arguments that returns an iterator (a
    generator function); batch ``i`` is its ``i``-th item, and every pass must give the
    same batches (:mod:`pytest_accelperf.backends.measure.data`). ``state_specs`` and
    ``batch_specs`` are ``PartitionSpec`` pytrees (full, or a prefix: one spec for a whole
    subtree), or functions of the abstract state / host batch that return one; mesh axes a
    case lacks are dropped. Defaults: the state's own Flax annotations
    (``nn.with_partitioning``), else replicated; every batch leaf split on ``data`` along
    its first dimension.

    ``params(state)`` returns the parameters that the numerics fingerprint and the
    single-device reference compare (default: ``state.params`` or ``state["params"]``, else
    the whole state). Beside them both also compare the rest of the training state
    (``beside``), by default every leaf of the state outside the parameters except the
    optimizer's moments (:func:`state_beside`): Flax's ``batch_stats`` and any other mutable
    collection, the step counter, a dropout key, a dynamic loss scale, optax's ``count``.
    ``beside(state)`` returns that state instead (a pytree, its leaves named by their paths
    in it); given ``params`` and no ``beside``, exactly what ``params`` returns is
    compared. ``bind_axes`` binds a named axis of the user's model to a mesh axis,
    ``{"batch": "data"}`` for ``BatchNorm(axis_name="batch")`` / ``lax.pmean(x, "batch")``
    as pmap code writes them: the step then runs under ``jax.shard_map`` over that mesh
    axis (the others stay automatic), on its share of the batch, as it would under
    ``pmap``. ``donate`` lets the step update the state in place. ``final(state)`` is what
    the test gets back as ``CaseResult.state`` (default: the state). ``label`` is how
    errors name the step (default: the step function, file and line).
    """

    init: Any
    step: Callable[[Any, Any], Any]
    # Optional as a field (``data=`` instead), always a function after __post_init__:
    # typed as that so the backends call it unchecked.
    make_batch: Callable[[int], Batch] = None  # type: ignore[assignment]
    state_specs: Any = None
    batch_specs: Any = None
    params: Callable[[Any], PyTree] | None = None
    loss: str = "loss"
    bind_axes: Mapping[str, str] = field(default_factory=dict)
    beside: Callable[[Any], PyTree] | None = None
    donate: bool = True
    tokens_per_sample: int | None = None
    seed: int = 0
    final: Callable[[Any], Any] | None = None
    label: str = ""
    data: Any = None

    def __post_init__(self) -> None:
        if not callable(self.step):
            raise TaskError(f"JaxStep.step must be the training step, a function "
                            f"step(state, batch) -> (state, metrics); got "
                            f"{type(self.step).__name__}")
        self.make_batch = batch_function(self.make_batch, self.data, "JaxStep")
        pmapped = _pmapped(self.step)
        if pmapped is not None:
            inner, axis = pmapped
            what = ("the functools.partial given to pmap" if isinstance(inner, partial)
                    else getattr(inner, "__name__", "the function it wraps"))
            raise TaskError(
                f"JaxStep.step {describe(self.step)} is wrapped in jax.pmap, but the plugin "
                f"shards the step itself over the case's mesh: pass the function pmap wraps "
                f"({what}; the pmap-ed function's .__wrapped__) with "
                f"bind_axes={{{axis!r}: 'data'}}, which binds pmap's axis name to the mesh "
                f"axis the batch is split on")
        if not self.label:
            self.label = f"the step {describe(self.step)}"

    def params_of(self, state: PyTree) -> PyTree:
        """The parameters of ``state`` (the documented accessor, see the class)."""
        if self.params is not None:
            try:
                return self.params(state)
            except Exception as exc:
                raise TaskError(f"JaxStep.params {describe(self.params)} failed on the final "
                                f"state: {type(exc).__name__}: {first_line(exc)}"
                                f"{at_user_frame(exc)}; it must return the parameters of a state "
                                f"(e.g. lambda state: state.params)") from exc
        if isinstance(state, Mapping) and "params" in state:
            return state["params"]
        found = getattr(state, "params", None)
        return state if found is None else found

    def beside_of(self, state: PyTree, params: PyTree) -> PyTree:
        """The training state beside ``params`` (what :meth:`params_of` returned for
        ``state``) that the fingerprint and the reference compare too: ``beside(state)``,
        else by the rule of :func:`state_beside` when the parameters are the default
        accessor's, else nothing (an explicit ``params`` is all that is compared)."""
        if self.beside is not None:
            try:
                return self.beside(state)
            except TaskError:
                raise
            except Exception as exc:
                raise TaskError(f"JaxStep.beside {describe(self.beside)} failed on the final "
                                f"state: {type(exc).__name__}: {first_line(exc)}"
                                f"{at_user_frame(exc)}; it must return the state beside the "
                                f"parameters (e.g. lambda state: state.batch_stats)") from exc
        if self.params is not None:
            return {}
        return state_beside(state, params)

    def final_of(self, state: PyTree) -> UserValue:
        """What the test gets back for ``state`` (``CaseResult.state``)."""
        return state if self.final is None else self.final(state)


def state_beside(state: PyTree, params: PyTree) -> dict[str, Leaf]:
    """The leaves of ``state`` beside ``params`` that the numerics fingerprint covers, by
    their paths in ``state`` (``batch_stats/BatchNorm_0/mean``, ``step``,
    ``opt_state/0/count``, ``dynamic_scale/scale``): every leaf of the state but

    * the parameters themselves (the subtree, or leaves, that ``params`` returned), and
    * the optimizer's moments: any subtree with exactly the parameters' structure, shapes
      and dtypes (optax's ``mu`` and ``nu``, a momentum ``trace``). They follow from the
      gradients the parameters already show, and would triple the fingerprint of an Adam
      run. A subtree that copies the parameters (an EMA of them) is left out by the same
      rule; a moment of an ``optax.masked`` optimizer, which lacks the masked leaves, is
      kept.

    A ``None`` is an empty subtree, as JAX reads it (``TrainState(dynamic_scale=None)``).
    When the parameters are the whole state, nothing is beside them."""
    param_leaves = jax.tree.leaves(params)
    if not param_leaves:
        return {}
    own = {id(leaf) for leaf in param_leaves}
    treedef: Any = jax.tree.structure(params)
    shapes = [(np.shape(x), _leaf_dtype(x)) for x in param_leaves]

    def mirrors(node: PyTree) -> bool:
        if node is params:
            return True
        try:
            if jax.tree.structure(node) != treedef:
                return False
        except Exception:  # a node that is not a pytree jax knows
            return False
        return [(np.shape(x), _leaf_dtype(x)) for x in jax.tree.leaves(node)] == shapes

    out: dict[str, Leaf] = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(state, is_leaf=mirrors)[0]:
        if id(leaf) in own or mirrors(leaf):
            continue
        out[jax.tree_util.keystr(path, simple=True, separator="/") or "state"] = leaf
    return out


@dataclass
class JaxTask:
    """What to train: a model, its data and its optimizer, independent of the mesh.

    A convenience built on :class:`JaxStep` (:meth:`to_step`): the step is
    ``value_and_grad(loss_fn)``, ``optimizer.update`` and ``optax.apply_updates``, the
    state ``(params, opt_state)``. ``make_batch(step)`` returns the *global* host batch of
    a step (leading dimension ``case.batch``), the same for a step whatever the mesh, so a
    sharded run and its single-device reference see identical data. ``param_specs`` maps
    the abstract params to a ``PartitionSpec`` pytree (None: replicate everything); axes a
    mesh lacks are dropped, so one spec serves the no-mesh case too; the optimizer state
    follows its parameters. ``loss_fn`` returns a scalar loss, or ``(loss, aux)``: scalars
    in a dict ``aux`` are recorded as metrics, anything else in it is ignored.
    """

    init_params: Callable[[Any], PyTree]
    loss_fn: Callable[[PyTree, PyTree], Any]
    make_batch: Callable[[int], PyTree]
    optimizer: optax.GradientTransformation
    param_specs: Callable[[PyTree], PyTree] | None = None
    batch_spec: Any = field(default_factory=lambda: P("data"))
    tokens_per_sample: int | None = None
    seed: int = 0

    def to_step(self) -> JaxStep:
        """This task as the :class:`JaxStep` the backend trains."""
        init_params, optimizer, param_specs = self.init_params, self.optimizer, self.param_specs
        loss = scalar_loss(self.loss_fn, f"JaxTask.loss_fn {describe(self.loss_fn)}")

        def init(key: jax.Array) -> tuple[PyTree, PyTree]:
            params = init_params(key)
            return params, optimizer.init(params)

        def step(state: tuple[PyTree, PyTree], batch: Batch) -> tuple[PyTree, JaxMetrics]:
            params, opt_state = state
            (value, metrics), grads = jax.value_and_grad(loss, has_aux=True)(params, batch)
            updates, opt_state = optimizer.update(grads, opt_state, params)
            return (optax.apply_updates(params, updates), opt_state), {**metrics, "loss": value}

        def state_specs(abstract: tuple[PyTree, PyTree]) -> tuple[PyTree, PyTree]:
            params, opt_state = abstract
            specs = full_specs(param_specs(params) if param_specs else P(), params)
            try:  # moments get their parameter's spec; step counts are replicated
                opt_specs = optax.tree_utils.tree_map_params(
                    optimizer, lambda _, spec: spec, opt_state, specs,
                    transform_non_params=lambda _: P())
            except Exception:  # an optimizer whose init cannot take optax's placeholder
                opt_specs = jax.tree.map(lambda _: P(), opt_state)
            return specs, opt_specs

        def beside(state: tuple[PyTree, PyTree]) -> dict[str, Leaf]:
            # The optimizer's state but its moments: optax's step count (a schedule's).
            return state_beside({"opt_state": state[1]}, state[0])

        return JaxStep(init=init, step=step, make_batch=self.make_batch,
                       state_specs=state_specs, batch_specs=self.batch_spec,
                       params=lambda state: state[0], beside=beside,
                       tokens_per_sample=self.tokens_per_sample,
                       seed=self.seed, label=f"JaxTask.loss_fn {describe(self.loss_fn)}")


def _is_pmap_wrapper(fn: object) -> bool:
    """Whether ``fn`` is what ``jax.pmap`` returns: a ``PmapFunction`` (jaxlib's, before
    jax 0.7), or the Python wrapper defined in ``jax/_src/pmap.py`` (jax 0.10.2: a plain
    function with ``__wrapped__`` and ``lower``)."""
    if "PmapFunction" in type(fn).__name__:
        return True
    code = getattr(fn, "__code__", None)
    filename = str(getattr(code, "co_filename", "")).replace("\\", "/")
    return filename.endswith("jax/_src/pmap.py") and hasattr(fn, "__wrapped__")


def _pmapped(fn: object) -> tuple[object, str] | None:
    """``(the function pmap wraps, pmap's axis name)`` when ``fn`` is ``jax.pmap``-ed (also
    under ``jax.jit`` or another wrapper that sets ``__wrapped__``), else None. The axis
    name is read from the wrapper's closure where it is there, else ``'batch'`` (what Flax's
    examples name it)."""
    target = fn
    for _ in range(8):
        if _is_pmap_wrapper(target):
            return getattr(target, "__wrapped__", target), _pmap_axis(target)
        inner = getattr(target, "__wrapped__", None)
        if inner is None:
            return None
        target = inner
    return None


def _pmap_axis(wrapper: object) -> str:
    """pmap's ``axis_name`` from the closure of its wrapper (jax 0.10.2 keeps it in the
    closure of the ``infer_params`` the wrapper calls), else ``'batch'``."""
    seen: list[object] = [wrapper]
    i = 0
    while i < min(len(seen), 8):  # the wrapper, then the functions in its closure
        fn = seen[i]
        i += 1
        code, cells = getattr(fn, "__code__", None), getattr(fn, "__closure__", None) or ()
        names = getattr(code, "co_freevars", ())
        for name, cell in zip(names, cells, strict=False):
            try:
                value = cell.cell_contents
            except ValueError:  # an empty cell
                continue
            if name == "axis_name" and isinstance(value, str):
                return value
            if callable(value) and getattr(value, "__closure__", None):
                seen.append(value)
    return "batch"


def scalar_loss(loss_fn: Callable[[PyTree, Batch], UserValue],
                label: str) -> Callable[[PyTree, Batch], tuple[UserValue, JaxMetrics]]:
    """``loss_fn`` as ``(params, batch) -> (loss, scalar metrics)`` for
    ``value_and_grad(..., has_aux=True)``: a loss that is not a scalar is a
    :class:`TaskError` naming ``label`` (not JAX's ``Gradient only defined for
    scalar-output functions``)."""

    def wrapped(params: PyTree, batch: Batch) -> tuple[UserValue, JaxMetrics]:
        out = loss_fn(params, batch)
        aux: UserValue = None
        if isinstance(out, tuple | list) and len(out) == 2:
            out, aux = out
        if _shape(out) != ():
            raise TaskError(
                f"{label} returns {_value_text(out)}: the loss must be a scalar to take its "
                f"gradient. Reduce it (jnp.mean(...)), or return (loss, aux) with a scalar "
                f"loss and a dict of scalar metrics as aux")
        metrics = ({str(k): v for k, v in aux.items() if _shape(v) == ()}
                   if isinstance(aux, Mapping) else {})
        metrics.pop("loss", None)
        return out, metrics

    return wrapped


def nnx_step(train_step: Callable[..., UserValue], objects: object,
             make_batch: Callable[[int], Batch] | None = None, *, data: object = None,
             params: Callable[[tuple[Any, ...]], PyTree] | None = None, loss: str = "loss",
             state_specs: object = None, batch_specs: object = None,
             bind_axes: Mapping[str, str] | None = None, donate: bool = True,
             tokens_per_sample: int | None = None, after: Sequence[object] = ()) -> JaxStep:
    """A Flax NNX training step as a :class:`JaxStep`, written as Flax's docs write it.

    ``train_step(*objects, batch, *after)`` updates ``objects`` in place: typically
    ``(model, optimizer, metrics)`` with an ``nnx.Optimizer`` and an ``nnx.MultiMetric``,
    and may be decorated with ``nnx.jit``. ``objects`` are those objects (already made), or
    a function that makes them, which the backend then compiles and runs on the case's
    shardings without allocating first, with the case's mesh in context (so variables
    annotated with ``nnx.with_partitioning`` can be made). The model is the first object.
    ``after`` are ready objects the step takes after the batch, as Flax's MNIST example
    takes ``rngs`` (an ``nnx.Rngs`` that dropout draws from): they are part of the state,
    so their counters advance step by step as in the user's own loop.

    Each step, every ``nnx.Metric`` among the objects is reset before the step and computed
    after it: its values are that step's metrics. What ``train_step`` returns is added: a
    scalar is the loss, a dict more metrics, None nothing. The loss is the metric ``loss``
    (``nnx.metrics.Average('loss')`` in a ``MultiMetric``).

    ``params(objects)`` returns the parameters for the numerics (default: the model's
    ``nnx.Param`` state). Without ``params``, the numerics also compare every other
    variable of the objects (:func:`nnx_beside`): the model's ``BatchStat`` and any other
    variable type, its RNG counters, the optimizer's ``step`` and ``count``, the ``Rngs``
    after the batch; not the optimizer's moments (its ``OptVariable`` state, one per
    parameter) nor the metrics (they are the step's metrics, reset every step), named
    ``model/batch_norm/mean``, ``optimizer/step``. ``CaseResult.state`` is the tuple of
    trained objects. Sharding annotations on the model (``nnx.with_partitioning``) are the
    default ``state_specs``. ``make_batch(step)`` makes the
    batches, or ``data`` is the user's iterable of them (a ``tf.data`` dataset, a
    ``DataLoader``) or a function of no arguments that returns an iterator, as
    :class:`JaxStep` takes them.
    """
    try:
        from flax import nnx
    except ImportError:
        raise TaskError(f"nnx_step needs flax, which is not installed: {FLAX_INSTALL}"
                        ) from None

    batches = batch_function(make_batch, data, "nnx_step")

    label = f"the NNX train_step {describe(train_step)}"
    ready = isinstance(objects, tuple | list) or _is_graph_node(nnx, objects)
    if not ready and not callable(objects):
        raise TaskError(f"nnx_step: objects must be the objects {label} takes before the batch "
                        f"(e.g. (model, optimizer, metrics)), or a function that makes them; "
                        f"got {type(objects).__name__}")
    trailing = tuple(after)
    # The graph (and where the metrics are) of the objects: known now for ready objects;
    # for a factory, from its first (abstract) call, which the backend makes with the
    # case's mesh in context (Flax creates annotated variables on it).
    known = _NnxGraph()

    def remember(objs: tuple[object, ...]) -> PyTree:
        graphdef, state = nnx.split(objs)
        if not known.split:
            known.graphdef = graphdef
            known.metric_at = [i for i, o in enumerate(objs) if isinstance(o, nnx.Metric)]
            known.names = _object_names(nnx, objs)
            known.split = True
        return state

    if ready:
        before = tuple(objects) if isinstance(objects, tuple | list) else (objects,)
        known.before = len(before)
        init: Any = remember(before + trailing)
    else:
        assert callable(objects)  # refused above unless ready or callable
        factory: Callable[[], object] = objects

        def init(_key: object) -> PyTree:
            out = factory()
            made = tuple(out) if isinstance(out, tuple | list) else (out,)
            if known.before is None:
                known.before = len(made)
            return remember(made + trailing)

        init.__wrapped__ = factory  # errors name it

    def merge(state: PyTree) -> tuple[Any, ...]:
        assert known.graphdef is not None  # split when init made the state
        live: tuple[Any, ...] = nnx.merge(known.graphdef, state)
        return live

    def step(state: PyTree, batch: Batch) -> tuple[PyTree, JaxMetrics]:
        live = merge(state)
        for i in known.metric_at:
            live[i].reset()
        n = known.before
        assert n is not None  # set before the first call of init
        if not known.arity_checked:  # here, so the error reads as a step's error
            _check_arity(train_step, label, n, len(trailing))
            known.arity_checked = True
        out = train_step(*live[:n], batch, *live[n:])
        metrics: JaxMetrics = {}
        for i in known.metric_at:
            computed = live[i].compute()
            if isinstance(computed, Mapping):
                metrics.update({str(k): v for k, v in computed.items()})
            else:
                metrics[str(getattr(live[i], "argname", None) or f"metric{i}")] = computed
        if isinstance(out, Mapping):
            metrics.update({str(k): v for k, v in out.items()})
        elif out is not None and _shape(out) == ():
            metrics[loss] = out
        elif out is not None:
            raise TaskError(f"{label} returns {_value_text(out)}: return nothing (metrics in an "
                            f"nnx.MultiMetric), the scalar loss, or a dict of scalar metrics")
        return nnx.split(live)[1], metrics

    def default_params(live: tuple[Any, ...]) -> PyTree:
        return nnx.to_pure_dict(nnx.state(live[0], nnx.Param))

    accessor = params or default_params

    def params_of(state: PyTree) -> PyTree:
        return accessor(merge(state))

    params_of.__wrapped__ = accessor  # type: ignore[attr-defined]  # errors name it

    def beside(state: PyTree) -> dict[str, Leaf]:
        return nnx_beside(nnx, state, known.names, known.metric_at)

    return JaxStep(
        init=init, step=step, make_batch=batches,
        state_specs=state_specs if state_specs is not None else nnx.get_partition_spec,
        batch_specs=batch_specs, params=params_of, beside=beside if params is None else None,
        loss=loss, bind_axes=dict(bind_axes or {}), donate=donate,
        tokens_per_sample=tokens_per_sample, final=merge,
        label=label)


@dataclass
class _NnxGraph:
    """What :func:`nnx_step` learns of its objects: from their first ``nnx.split`` (the
    graph, where the metrics are, the objects' names), and how many come before the batch
    (known at once for ready objects, from the factory's first call otherwise)."""

    graphdef: GraphDef[tuple[object, ...]] | None = None
    metric_at: list[int] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    split: bool = False
    before: int | None = None
    arity_checked: bool = False


def _object_names(nnx: Framework, objects: Sequence[object]) -> list[str]:
    """How the numerics name the objects of an :func:`nnx_step`: ``model`` (the first),
    ``optimizer`` (an ``nnx.Optimizer``), else the class's name in lower case (``rngs``),
    numbered where two share one (``rngs``, ``rngs_3``)."""
    names: list[str] = []
    for i, obj in enumerate(objects):
        name = ("model" if i == 0 else "optimizer" if isinstance(obj, nnx.Optimizer)
                else type(obj).__name__.lower())
        names.append(name if name not in names else f"{name}_{i}")
    return names


def nnx_beside(nnx: Framework, state: PyTree, names: Sequence[str],
               metric_at: Sequence[int]) -> dict[str, Leaf]:
    """Every variable of an :func:`nnx_step`'s state (``nnx.split`` of its objects) that
    the numerics compare beside the model's parameters, by object name and path
    (``model/batch_norm/mean``): all but the model's ``nnx.Param`` (the parameters), the
    optimizer's ``OptVariable`` (its moments, one per parameter: NNX's word for what
    :func:`state_beside` leaves out) and the metrics' objects."""
    moment: Any = getattr(nnx, "OptVariable", ())
    out: dict[str, Leaf] = {}
    for path, var in nnx.to_flat_state(state):
        i = path[0]
        if i in metric_at or (i == 0 and isinstance(var, nnx.Param)) \
                or (moment and isinstance(var, moment)):
            continue
        value = var.get_value() if hasattr(var, "get_value") else var.value
        if value is None:  # an empty variable, as an empty subtree
            continue
        where = names[i] if isinstance(i, int) and 0 <= i < len(names) else str(i)
        out["/".join([where, *(str(k) for k in path[1:])])] = value
    return out


def _check_arity(train_step: Callable[..., UserValue], label: str, before: int, after: int) -> None:
    """Refuse, naming the fix, a ``train_step`` that cannot take ``before`` objects, the
    batch and ``after`` objects (Flax's MNIST example takes ``rngs`` after the batch)."""
    try:
        sig = inspect.signature(train_step)
    except (TypeError, ValueError):
        return  # a builtin or C callable: tracing will say what is wrong
    names = list(sig.parameters)
    try:
        sig.bind(*range(before), "batch", *range(after))
    except TypeError as exc:
        given = [f"{before} object(s)", "the batch"] + ([f"{after} after it"] if after else [])
        hint = ""
        if len(names) > before + 1 + after and not after:
            rest = ", ".join(names[before + 1:])
            hint = (f"; it takes ({rest}) after the batch: pass those objects as "
                    f"nnx_step(..., after=({rest},))")
        elif len(names) < before + 1 + after:
            hint = "; pass only the objects it takes before the batch as objects"
        raise TaskError(f"{label} takes ({', '.join(names)}) but nnx_step would call it with "
                        f"{', '.join(given)} ({exc}){hint}") from None


def _is_graph_node(nnx: Framework, obj: object) -> bool:
    is_node: Any = getattr(getattr(nnx, "graph", None), "is_graph_node", None)
    if is_node is not None:
        return bool(is_node(obj))
    return isinstance(obj, nnx.Module | nnx.Optimizer)


def as_step(task: Task) -> JaxStep:
    """``task`` as the :class:`JaxStep` to train: itself, or what its ``to_step()`` gives
    (:class:`JaxTask`)."""
    if isinstance(task, JaxStep):
        return task
    to_step = getattr(task, "to_step", None)
    if callable(to_step):
        step = to_step()
        if isinstance(step, JaxStep):
            return step
    raise TaskError(f"the jax backend trains a JaxStep (your own step), a JaxTask or "
                    f"nnx_step(...) (pytest_accelperf.jax); got {type(task).__name__}")


def _shape(value: object) -> tuple[int, ...] | None:
    """The shape of an array or tracer, ``()`` for a Python number, None for anything
    else (a tuple of arrays is not a scalar)."""
    shape = getattr(value, "shape", None)
    if shape is not None:
        return tuple(shape)
    return () if isinstance(value, int | float) and not isinstance(value, bool) else None


# -- specs ---------------------------------------------------------------------------------
def is_spec(x: object) -> bool:
    """Whether ``x`` is a leaf of a spec tree: a ``PartitionSpec``, or None (replicated)."""
    return x is None or isinstance(x, PartitionSpec)


def full_specs(specs: PyTree, tree: PyTree) -> PyTree:
    """A spec for every leaf of ``tree`` from ``specs``: one spec, or a prefix tree of them
    (a spec stands for its whole subtree; None for replicated)."""
    if is_spec(specs):
        return jax.tree.map(lambda _: specs if specs is not None else P(), tree)
    return jax.tree.map(lambda spec, sub: jax.tree.map(lambda _: spec or P(), sub),
                        specs, tree, is_leaf=is_spec)


# -- diagnostics ----------------------------------------------------------------------------
def _value_text(value: object) -> str:
    shape = getattr(value, "shape", None)
    dtype = getattr(value, "dtype", None)
    if shape is not None and dtype is not None:
        return f"an array of shape {tuple(shape)} ({dtype})"
    if isinstance(value, tuple | list):
        return f"a {type(value).__name__} of {len(value)}"
    return f"a {type(value).__name__}"


_UNBOUND = re.compile(r"unbound axis name:?\s*'?([A-Za-z_]\w*)", re.IGNORECASE)


def explain(exc: BaseException, step: JaxStep, mesh_axes: tuple[str, ...]) -> TaskError:
    """A :class:`TaskError` for ``exc``, raised while tracing ``step``: the user's function,
    where it failed, what JAX said and what to change."""
    if isinstance(exc, TaskError):
        return exc
    said = f"{type(exc).__name__}: {first_line(exc)}"
    head = f"{step.label} cannot be compiled: {said}{at_user_frame(exc)}"
    text = str(exc)
    unbound = _UNBOUND.search(text)
    if isinstance(exc, NameError) and unbound:
        name = unbound.group(1)
        return TaskError(
            f"{head}. It reduces over the named axis {name!r} (BatchNorm(axis_name={name!r}), "
            f"lax.pmean(x, {name!r}), as pmap code does), which nothing binds here: bind it "
            f"to the mesh axis the batch is split on, JaxStep(..., "
            f"bind_axes={{{name!r}: 'data'}}) (mesh axes: {', '.join(mesh_axes)})")
    if "Gradient only defined for scalar-output functions" in text:
        return TaskError(
            f"{head}. A function whose gradient the step takes returns more than a scalar: "
            f"reduce the loss (jnp.mean(...)); to return more, return (loss, aux) and take "
            f"jax.value_and_grad(loss_fn, has_aux=True)")
    if "out_specs" in text and ("vary" in text or "replicat" in text):
        axes = ", ".join(repr(a) for a in step.bind_axes)
        return TaskError(
            f"{head}. Under bind_axes each device runs the step on its share of the batch, "
            f"as pmap does, so what it returns must be the same on every device: average the "
            f"gradients and the metrics over the bound axis ({axes}) in the step, e.g. "
            f"grads = lax.pmean(grads, {next(iter(step.bind_axes), 'batch')!r})")
    return TaskError(f"{head}. Fix it there; the step must be a function of (state, batch) "
                     f"that jax can trace, returning (state, metrics)")


def check_outputs(step: JaxStep, state: PyTree, out: UserValue) -> None:
    """Refuse what ``step`` returned for ``state`` (abstract values, from ``eval_shape``)
    unless it is ``(state of the same structure, shapes and dtypes, dict of scalars with
    the loss)``."""
    if not isinstance(out, tuple | list) or len(out) != 2:
        raise TaskError(
            f"{step.label} returns {_value_text(out)}, not (state, metrics): return the new "
            f"state and a dict of scalar metrics holding the loss, e.g. "
            f"`return state, {{'{step.loss}': loss}}`")
    new, metrics = out
    before: Any = jax.tree.structure(state)
    after: Any = jax.tree.structure(new)
    if before != after:
        raise TaskError(
            f"{step.label} returns a state whose structure differs from the state it takes "
            f"(it takes {_tree_text(state)}, returns {_tree_text(new)}): the step must return "
            f"the same kind of state (e.g. state.replace(...), state.apply_gradients(...))")
    for (path, a), b in zip(jax.tree_util.tree_flatten_with_path(state)[0],
                            jax.tree.leaves(new), strict=True):
        if np.shape(a) != np.shape(b) or a.dtype != b.dtype:
            where = jax.tree_util.keystr(path, simple=True, separator="/")
            raise TaskError(
                f"{step.label} returns state leaf {where!r} as {b.dtype}{list(np.shape(b))}, "
                f"but takes it as {a.dtype}{list(np.shape(a))}: a step must keep every "
                f"leaf's shape and dtype (cast it back, e.g. .astype({a.dtype}))")
    if not isinstance(metrics, Mapping):
        raise TaskError(
            f"{step.label} returns {_value_text(metrics)} as its metrics: return a dict of "
            f"scalars holding the loss, e.g. `return state, {{'{step.loss}': loss}}`")

    def not_scalar(key: str, value: object) -> str | None:
        if _shape(value) == ():
            return None
        return (f"{step.label} returns metric {key!r} as {_value_text(value)}: metrics are "
                f"scalars, one value per step; reduce it (jnp.mean) or leave it out")

    check_metric_keys(step.label, metrics, step.loss, "JaxStep", not_scalar)


#: What a step is compiled for of its batch: the tree structure, and each leaf's shape and
#: dtype in the order of the leaves (:func:`batch_signature`).
BatchSignature = tuple[Any, tuple[tuple[tuple[int, ...], Any], ...]]


def _leaf_shape(leaf: Leaf) -> tuple[int, ...]:
    shape = getattr(leaf, "shape", None)
    return tuple(shape) if shape is not None else tuple(np.shape(leaf))


def _leaf_dtype(leaf: Leaf) -> np.dtype[Any]:
    dtype = getattr(leaf, "dtype", None)  # an array's own: no copy, no device transfer
    return dtype if dtype is not None else np.asarray(leaf).dtype  # a Python number


def _host_leaf(leaf: Leaf) -> Leaf:
    if isinstance(leaf, np.ndarray | np.generic | jax.Array | int | float | bool | str):
        return leaf
    if hasattr(leaf, "__array__"):  # a torch CPU tensor, a TensorFlow EagerTensor
        return np.asarray(leaf)
    return leaf


def host_batch(batch: Batch) -> Batch:
    """``batch`` with every leaf jax can take as it is (numpy arrays, jax arrays, Python
    numbers), and every other array-like leaf as a numpy array: a ``DataLoader``'s torch
    tensors (shared memory, no copy) or a ``tf.data`` iterator's tensors, which
    ``jax.device_put`` refuses. Part of the input time of a step (the host-side
    conversion)."""
    return jax.tree.map(_host_leaf, batch)


def batch_signature(batch: Batch) -> BatchSignature:
    """The structure of ``batch`` and each leaf's ``(shape, dtype)``: what the compiled
    step's batch must keep. Read from the leaves' attributes, never their values (about
    2 microseconds for a batch of two arrays), so it is taken on every step."""
    leaves, treedef = jax.tree.flatten(batch)
    return treedef, tuple((_leaf_shape(x), _leaf_dtype(x)) for x in leaves)


def _canonical(signature: BatchSignature) -> BatchSignature:
    """``signature`` with the dtypes jax gives the leaves (float64 is float32 unless x64
    is enabled): two batches that agree on these run the same compiled program."""
    canonicalize: Any = jax.dtypes.canonicalize_dtype
    treedef, leaves = signature
    return treedef, tuple((shape, canonicalize(dtype)) for shape, dtype in leaves)


def check_batch(step: JaxStep, i: int, compiled: BatchSignature, batch: Batch) -> None:
    """Refuse batch ``i`` of ``step`` unless it has the structure, shapes and dtypes of the
    batch the step was compiled for (``compiled``: step 0's), naming ``make_batch`` (or the
    data), the
    step and every leaf that changed, before and after. Without it XLA refuses the call
    with ``Argument types differ from the types for which this computation was
    compiled``, naming neither the function nor the step.

    Compares tuples of shapes and dtypes, not arrays: the leaves' paths are only read for
    the message."""
    now = batch_signature(batch)
    if now == compiled or _canonical(now) == _canonical(compiled):
        return
    head = (f"{source_label(step.make_batch)} returns at step {i} a batch unlike step "
            f"0's, which {step.label} was compiled for")
    fix = ("the step is compiled once, for the shapes and dtypes of step 0's batch: return "
           "batches of one shape every step (a fixed batch size; a data loader with "
           "drop_last=True, so its last, shorter batch is dropped; variable lengths padded "
           "to one)")
    if now[0] != compiled[0]:
        raise TaskError(f"{head}: its structure changed, {_text_of(compiled[0])} → "
                        f"{_text_of(now[0])}; {fix}")
    paths = [jax.tree_util.keystr(path, simple=True, separator="/") or "(the whole batch)"
             for path, _ in jax.tree_util.tree_flatten_with_path(batch)[0]]
    changed = [f"leaf {where!r} {_sig_text(before)} → {_sig_text(after)}"
               for where, before, after, canon_before, canon_after
               in zip(paths, compiled[1], now[1], _canonical(compiled)[1], _canonical(now)[1],
                      strict=True)
               if canon_before != canon_after]
    raise TaskError(f"{head}: {', '.join(changed)}; {fix}")


def _sig_text(leaf: tuple[tuple[int, ...], Any]) -> str:
    shape, dtype = leaf
    return f"{dtype}{list(shape)}"


def _text_of(treedef: object, width: int = 120) -> str:
    text = str(treedef)
    return text if len(text) <= width else text[:width - 4] + " ..."


def _tree_text(tree: PyTree, width: int = 120) -> str:
    text = str(jax.tree.structure(tree))
    return text if len(text) <= width else text[:width - 4] + " ..."


def abstract_state(step: JaxStep) -> PyTree:
    """The shapes and dtypes of ``step``'s initial state, without allocating it."""
    try:
        if callable(step.init):
            # The key made inside the trace too: a concrete key would be computed on the
            # context mesh's devices, which a compile-only target's cannot run.
            return _eval_shape(lambda: step.init(jax.random.key(step.seed)))
        return _eval_shape(lambda state: state, step.init)
    except TaskError:
        raise
    except Exception as exc:
        what = (f"the init {describe(step.init)}" if callable(step.init)
                else "the initial state")
        raise TaskError(f"{what} of {step.label} cannot be traced: {type(exc).__name__}: "
                        f"{first_line(exc)}{at_user_frame(exc)}; init is a function of a PRNG key "
                        f"that returns the state, or the state itself") from exc
