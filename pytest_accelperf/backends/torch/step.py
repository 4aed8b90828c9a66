"""What the in-process torch backend trains: the user's own training step.

A :class:`TorchStep` is a ``step(batch) -> metrics`` written as PyTorch's docs write a
training loop: a closure over the user's model, optimizer (built by a model method, with
weight-decay groups), LR scheduler, ``torch.amp.GradScaler`` and gradient accumulation,
unchanged. The backend (:mod:`pytest_accelperf.backends.torch.backend`) moves each batch to the
device outside the timer, times and synchronizes every step, records the loss and the other
metrics the step returns, counts FLOPs and memory, and hands the trained model back to the
test. :class:`~pytest_accelperf.backends.torch.task.TorchTask` is a convenience built on it
(``TorchTask.to_step``).

Counting FLOPs and memory runs the step for real, untimed, before the measured run, and
then *undoes* it (:func:`undone`): model parameters, buffers and gradients, every
optimizer the step stepped (found by a global optimizer-step hook), every LR scheduler and
``GradScaler`` alive in the process, and the RNG state are put back as they were. What else
a step keeps (a Python counter in its closure, an EMA copy of the model that is not a
``model``) is not undone: read the step count from the scheduler or the optimizer instead.
The state undone the first time is kept: a step the plugin trains again (a throughput
regression re-measured under ``--accelperf-confirm``) is first put back there
(:func:`rewind`), so every training of it starts from the same weights and schedule.

Whatever the user's function returns wrong is a
:class:`~pytest_accelperf.backends.measure.common.TaskError` that names the function, where it is
defined, and the fix.
"""

from __future__ import annotations

import copy
import gc
import itertools
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeAlias

import numpy as np
import torch

from pytest_accelperf.backends.measure.common import TaskError, check_metric_keys, describe
from pytest_accelperf.backends.measure.data import batch_function
from pytest_accelperf.backends.torch.ops import uncounted
from pytest_accelperf.backends.types import Batch, UserValue

if TYPE_CHECKING:
    from torch.optim.optimizer import StateDict

    from pytest_accelperf.backends.protocol import Task

Models = torch.nn.Module | Sequence[torch.nn.Module] | Mapping[str, torch.nn.Module]


@dataclass
class TorchStep:
    """A training step the user wrote, and the model it trains: what the torch backend
    trains in this process.

    ``step(batch)`` runs one training step (zero_grad, forward under autocast, backward,
    over as many micro-batches as it likes, ``scaler.step``/``optimizer.step``,
    ``scheduler.step``) and returns its metrics: a dict holding the loss under ``loss``
    (default ``"loss"``) and any other scalars (learning rate, gradient norm, accuracy) as
    tensors or floats, or a bare loss tensor. Every metric is recorded per step and checked
    against the baseline like the loss.

    ``make_batch(step)`` returns the batch of a step: tensors on the CPU in any nesting of
    dicts, lists, tuples and namedtuples; the backend moves them to the device outside the
    timer. Numpy arrays and numpy scalars in it are made tensors first, as torch's
    ``DataLoader`` makes them (``torch.utils.data.default_convert``: same dtype, memory
    shared); Python numbers and strings are passed as they are. Or, instead, ``data`` is
    the user's own pipeline: an iterable of batches (a ``DataLoader``: iterated again with
    ``iter()`` for every training the plugin runs) or a function of no arguments that
    returns an iterator (a generator function); batch ``i`` is its ``i``-th item, and every
    pass must give the same batches (:mod:`pytest_accelperf.backends.measure.data`).

    ``model`` is the ``nn.Module`` the step trains, or several (a list, or a dict by name):
    the backend moves it to the device (built on the CPU, its parameters keep their
    identity, so an optimizer made over them stays valid), counts its memory, and by default
    fingerprints its ``state_dict()`` for the numerics check. ``params()`` returns the final
    parameters instead (a ``{name: tensor}`` mapping), the documented accessor for them.
    ``fingerprint_state``: whether the numerics also cover the training state beside what
    ``params()`` returns (:func:`state_beside`): the models' buffers (BatchNorm's running
    statistics) under their ``state_dict`` names, each optimizer's step count
    (``optimizer/step``) and each ``GradScaler``'s scale (``scaler/scale``); default: when
    ``params`` is not given (an explicit ``params()`` is all that is compared).
    ``final()`` is what the test gets back as ``CaseResult.state`` (default: ``model``).

    Seeding: the test seeds what it builds (``torch.manual_seed(0)`` before making the
    model); the backend calls ``torch.manual_seed(seed)`` again right before the first
    training step, so dropout draws the same numbers in every run.

    ``compile``: the step calls a ``torch.compile``-d model or function, which compiles on
    its first call: that step's wall time is the compile time, never a measured step (the
    backend resets dynamo and empties inductor's caches before it, so it compiles cold).
    ``count_step`` is the step the backend runs (and undoes) to count FLOPs and CPU memory
    (default: ``step``; give the eager version of a compiled step). ``label`` is how errors
    name the step (default: the step function, file and line).

    ``stateful``: the LR schedulers and ``GradScaler``s the step advances, which the
    counting steps put back (:func:`undone`). Default None: every one alive in the process
    is found (:func:`live_stateful`, a scan of the process's objects, about 50 ms with
    torch and jax loaded); a step that names its own (``()`` for none, as
    ``TorchTask.to_step`` does) skips the scan. One it advances and leaves out would stay
    advanced by the counting steps.
    """

    step: Callable[[Any], Any]
    # Optional as fields (``data=`` instead of make_batch; the model is required, refused in
    # __post_init__ when missing), and typed as what they are after it.
    make_batch: Callable[[int], Any] = None  # type: ignore[assignment]
    model: Models = None  # type: ignore[assignment]
    params: Callable[[], Mapping[str, Any]] | None = None
    loss: str = "loss"
    final: Callable[[], Any] | None = None
    compile: bool = False
    count_step: Callable[[Any], Any] | None = None
    tokens_per_sample: int | None = None
    seed: int = 0
    label: str = ""
    stateful: Sequence[Any] | None = None
    fingerprint_state: bool | None = None
    data: Any = None
    _initial: _Saved | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not callable(self.step):
            raise TaskError(f"TorchStep.step must be the training step, a function "
                            f"step(batch) -> metrics; got {type(self.step).__name__}")
        self.make_batch = batch_function(self.make_batch, self.data, "TorchStep")
        if not self.label:
            self.label = f"the step {describe(self.step)}"
        self.modules()  # refuse a model that is not one

    def modules(self) -> dict[str, torch.nn.Module]:
        """The models by name: ``""`` for one, ``"0"``, ``"1"`` or its keys for several."""
        model = self.model
        if isinstance(model, torch.nn.Module):
            found: dict[str, object] = {"": model}
        elif isinstance(model, Mapping):
            found = {str(k): v for k, v in model.items()}
        elif isinstance(model, Sequence) and not isinstance(model, str):
            found = {str(i): v for i, v in enumerate(model)}
        else:
            found = {"": model}
        bad = [k for k, v in found.items() if not isinstance(v, torch.nn.Module)]
        if bad or not found:
            # The element that is not a module, by its key or index, when several were given.
            field = "TorchStep.model" + ("" if not bad else
                                         f"[{bad[0]!r}]" if isinstance(model, Mapping) else
                                         f"[{bad[0]}]" if bad[0] else "")
            what = given(found[bad[0]]) if bad else f"an empty {type(model).__name__}"
            raise TaskError(f"{field} of {self.label} must be the nn.Module the step "
                            f"trains, or a list or dict of them; got {what}")
        return {k: v for k, v in found.items() if isinstance(v, torch.nn.Module)}

    def to(self, device: torch.device) -> None:
        """Move the models to ``device``, in place (parameters keep their identity)."""
        for module in self.modules().values():
            module.to(device)

    def params_of(self) -> dict[str, np.ndarray]:
        """The final parameters as host arrays, ``{name: array}`` (see the class)."""
        if self.params is not None:
            try:
                found = dict(self.params())
            except Exception as exc:
                raise TaskError(f"TorchStep.params {describe(self.params)} failed: "
                                f"{type(exc).__name__}: {first_line(exc)}; it must return "
                                f"the final parameters as a dict of tensors (e.g. "
                                f"lambda: model.state_dict())") from exc
        else:
            found = {}
            for prefix, module in self.modules().items():
                for name, value in module.state_dict().items():
                    found[f"{prefix}/{name}" if prefix else name] = value
        out: dict[str, np.ndarray] = {}
        for name, value in found.items():
            if isinstance(value, torch.Tensor):
                out[str(name)] = host_array(value)
        return out

    def final_of(self) -> UserValue:
        """What the test gets back (``CaseResult.state``)."""
        return self.model if self.final is None else self.final()

    def covers_state(self) -> bool:
        """Whether the numerics cover the state beside the parameters (see the class)."""
        return self.params is None if self.fingerprint_state is None else self.fingerprint_state


def scaler_readings(stateful: Sequence[object]) -> dict[int, StateDict]:
    """The state of every enabled ``GradScaler`` among ``stateful``, by its id: taken
    before the training, so that :func:`state_beside` knows which of those found alive in
    the process the step used (their state moved)."""
    return {id(obj): copy.deepcopy(obj.state_dict()) for obj in stateful
            if isinstance(obj, torch.amp.GradScaler) and obj.is_enabled()}


def state_beside(step: TorchStep, params: Mapping[str, object], stateful: Sequence[object],
                 before: Mapping[int, StateDict]) -> dict[str, np.ndarray]:
    """The training state beside ``params`` (the flat host arrays :meth:`TorchStep.params_of`
    gave) that the numerics fingerprint covers when :meth:`TorchStep.covers_state`:

    * the models' buffers, by their ``state_dict`` names (``norm.running_mean``,
      ``norm.num_batches_tracked``), but those already among ``params`` (the default
      ``params`` is the whole ``state_dict``: buffers included);
    * each optimizer the step stepped (found by the counting steps' hook): its step count,
      ``optimizer/step`` (``optimizer0/step``, ... for several), the largest ``step`` in its
      per-parameter state (Adam's, AdamW's; SGD keeps none);
    * each enabled ``GradScaler`` the step names (``TorchStep.stateful``), or of those found
      alive in the process each one whose state moved since ``before``
      (:func:`scaler_readings`): its scale, ``scaler/scale``.
    """
    if not step.covers_state():
        return {}
    out: dict[str, np.ndarray] = {}
    for prefix, module in step.modules().items():
        own = {name for name, _ in module.named_parameters()}
        for name, value in module.state_dict().items():
            key = f"{prefix}/{name}" if prefix else name
            if name in own or key in params or not isinstance(value, torch.Tensor):
                continue
            out[key] = host_array(value)
    optimizers = [opt for opt, _ in step._initial.optimizers.values()] if step._initial else []
    out.update(optimizer_steps(optimizers))
    named = step.stateful is not None
    scalers = [obj for obj in stateful if isinstance(obj, torch.amp.GradScaler)
               and obj.is_enabled() and (named or obj.state_dict() != before.get(id(obj)))]
    for i, scaler in enumerate(scalers):
        name = "scaler" if len(scalers) == 1 else f"scaler{i}"
        out[f"{name}/scale"] = np.asarray(scaler.get_scale(), dtype=np.float32)
    return out


def optimizer_steps(optimizers: Sequence[torch.optim.Optimizer]) -> dict[str, np.ndarray]:
    """Each optimizer's step count, the largest ``step`` in its per-parameter state
    (Adam's, AdamW's; SGD keeps none): ``optimizer/step``, or ``optimizer0/step``, ...
    for several (the numerics fingerprint's state beside the parameters)."""
    out: dict[str, np.ndarray] = {}
    for i, optimizer in enumerate(optimizers):
        counts = [float(state["step"]) for state in optimizer.state.values()
                  if isinstance(state, Mapping) and "step" in state]
        if counts:
            name = "optimizer" if len(optimizers) == 1 else f"optimizer{i}"
            out[f"{name}/step"] = np.asarray(max(counts), dtype=np.float32)
    return out


def given(value: object) -> str:
    """What a user gave where a module belongs, with the likely fix: a class or a function
    that makes the model, named (the mistake of passing ``Net`` or ``make_model`` for
    ``Net()``), else the value's type and its start."""
    if isinstance(value, type):
        if issubclass(value, torch.nn.Module):
            return (f"the class {value.__name__}, not a model: pass an instance, "
                    f"{value.__name__}(...)")
        return f"the class {value.__name__}"
    if callable(value) and not isinstance(value, torch.nn.Module):
        return (f"the function {describe(value)}: pass the model it makes "
                f"({getattr(value, '__name__', 'make_model')}())")
    if value is None:
        return "None"
    text = repr(value)
    if "\n" in text or len(text) > 60:  # an optimizer's repr is a table: its type says it
        return f"a {type(value).__name__} object"
    return f"{type(value).__name__} {text}"


def host_array(value: torch.Tensor) -> np.ndarray:
    """``value`` as a numpy array on the host (bfloat16 and float8, which numpy lacks, as
    float32)."""
    t = value.detach()
    if t.is_floating_point() and t.dtype not in (torch.float16, torch.float32, torch.float64):
        t = t.float()
    return np.asarray(t.cpu().numpy())


def as_torch_step(task: Task, device: torch.device | None = None) -> TorchStep:
    """``task`` as the :class:`TorchStep` to train: itself, or what its ``to_step(device)``
    gives (:class:`~pytest_accelperf.backends.torch.task.TorchTask`)."""
    if isinstance(task, TorchStep):
        return task
    to_step = getattr(task, "to_step", None)
    if callable(to_step):
        step = to_step(device) if device is not None else to_step()
        if isinstance(step, TorchStep):
            return step
    raise TaskError(f"the torch backend trains a TorchStep (your own training step) or a "
                    f"TorchTask (pytest_accelperf.torch); got {type(task).__name__}")


# -- what a step returns --------------------------------------------------------------------
#: One metric's value as a step returns it: a one-element tensor, or a number.
Scalar: TypeAlias = torch.Tensor | int | float | np.floating[Any] | np.integer[Any]


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _value_text(value: object) -> str:
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)} ({value.dtype})"
    if isinstance(value, tuple | list):
        return f"a {type(value).__name__} of {len(value)}"
    return f"a {type(value).__name__}"


def _is_scalar(value: object) -> bool:
    if isinstance(value, torch.Tensor):
        return value.numel() == 1
    return isinstance(value, int | float | np.floating | np.integer) and not isinstance(
        value, bool)


def metrics_of(step: TorchStep, out: UserValue) -> dict[str, Scalar]:
    """What ``step`` returned as ``{name: scalar}`` with the loss under ``step.loss``;
    anything else is a :class:`TaskError` naming the step and the fix."""
    if isinstance(out, torch.Tensor):
        out = {step.loss: out}
    if not isinstance(out, Mapping):
        raise TaskError(
            f"{step.label} returns {_value_text(out)}: return the loss tensor, or a dict of "
            f"scalar metrics holding it, e.g. `return {{'{step.loss}': loss, 'lr': "
            f"scheduler.get_last_lr()[0]}}`")
    def not_scalar(key: str, value: object) -> str | None:
        if _is_scalar(value):
            return None
        return (f"{step.label} returns metric {key!r} as {_value_text(value)}: metrics are "
                f"scalars, one value per step (a one-element tensor or a float); reduce it "
                f"(.mean()) or leave it out")

    check_metric_keys(step.label, out, step.loss, "TorchStep", not_scalar)
    return dict(out)


def to_float(value: Scalar) -> float:
    """A metric's value as a Python float (a tensor's ``.item()``: it waits for it)."""
    return float(value.detach().item()) if isinstance(value, torch.Tensor) else float(value)


def float_metrics(step: TorchStep, out: UserValue) -> dict[str, float]:
    """The step's output as float metrics (waits for them)."""
    return {k: to_float(v) for k, v in metrics_of(step, out).items()}


# -- running a step and undoing it ----------------------------------------------------------
def _stateful_kinds() -> tuple[type, ...]:
    kinds: list[type] = [torch.optim.lr_scheduler.LRScheduler, torch.amp.GradScaler]
    plateau = getattr(torch.optim.lr_scheduler, "ReduceLROnPlateau", None)
    if isinstance(plateau, type) and not issubclass(plateau, tuple(kinds)):
        kinds.append(plateau)
    return tuple(kinds)


def _subclasses(kinds: tuple[type, ...]) -> set[type]:
    """``kinds`` and every class derived from them that exists now (a live object's class
    exists, so this holds the class of every live instance of them)."""
    found: set[type] = set()
    stack = list(kinds)
    while stack:
        kind = stack.pop()
        if kind not in found:
            found.add(kind)
            stack.extend(kind.__subclasses__())
    return found


def live_stateful() -> list[Any]:
    """Every LR scheduler and ``GradScaler`` alive in the process: what :func:`undone`
    puts back besides the models and the optimizers.

    One pass over the garbage collector's objects, filtered by their exact ``type()``
    against the scheduler and scaler classes and their subclasses (not ``isinstance``:
    that reads ``__class__`` of proxies that warn when touched), at C speed: about 60 ms
    with torch, dynamo and a test suite loaded (300,000 objects), half what a Python loop
    over them took. The torch backend scans once per training and hands the list to
    each :func:`undone` block it runs."""
    known = _subclasses(_stateful_kinds())
    objects = gc.get_objects()
    return list(itertools.compress(objects, map(known.__contains__, map(type, objects))))


def step_stateful(step: TorchStep) -> list[Any]:
    """The schedulers and scalers :func:`undone` puts back for ``step``: those it names
    (``TorchStep.stateful``), or every one alive (:func:`live_stateful`)."""
    return live_stateful() if step.stateful is None else list(step.stateful)


def _rng_states() -> tuple[torch.Tensor, list[torch.Tensor] | None]:
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    return torch.random.get_rng_state(), cuda


@dataclass
class _Saved:
    tensors: list[tuple[torch.Tensor, torch.Tensor]]
    grads: list[tuple[torch.Tensor, torch.Tensor | None]]
    optimizers: dict[int, tuple[torch.optim.Optimizer, StateDict]]
    others: list[tuple[Any, StateDict]]
    rng: tuple[torch.Tensor, list[torch.Tensor] | None]


def _host_copy(t: torch.Tensor) -> torch.Tensor:
    """A copy of ``t`` in host memory: a snapshot held on the device would add to the peak
    the allocator counts for the run."""
    return t.detach().to("cpu", copy=True)


def _save_optimizer(saved: _Saved, optimizer: torch.optim.Optimizer) -> None:
    """Before ``optimizer`` first steps inside :func:`undone`: its state and its
    parameters (which may belong to no declared model)."""
    if id(optimizer) in saved.optimizers:
        return
    saved.optimizers[id(optimizer)] = (optimizer, copy.deepcopy(optimizer.state_dict()))
    known = {id(t) for t, _ in saved.tensors}
    for group in optimizer.param_groups:
        for p in group["params"]:
            if id(p) not in known:
                saved.tensors.append((p, _host_copy(p)))
                saved.grads.append((p, None if p.grad is None else _host_copy(p.grad)))


def _snapshot(step: TorchStep, stateful: Sequence[Any] | None = None) -> _Saved:
    saved = _Saved(tensors=[], grads=[], optimizers={}, others=[], rng=_rng_states())
    seen: set[int] = set()
    for module in step.modules().values():
        for t in [*module.parameters(), *module.buffers()]:
            if id(t) not in seen:
                seen.add(id(t))
                saved.tensors.append((t, _host_copy(t)))
        for p in module.parameters():
            saved.grads.append((p, None if p.grad is None else _host_copy(p.grad)))
    for obj in step_stateful(step) if stateful is None else stateful:
        state = obj.state_dict()
        if state:  # a disabled GradScaler has none (and refuses to load an empty one)
            saved.others.append((obj, copy.deepcopy(state)))
    return saved


def _restore(saved: _Saved) -> None:
    """Put back what ``saved`` holds; ``saved`` itself is never aliased (it may be
    restored again)."""
    with torch.no_grad():
        for tensor, value in saved.tensors:
            tensor.copy_(value)
        for param, grad in saved.grads:
            param.grad = None if grad is None else grad.to(param.device, copy=True)
    for optimizer, state in saved.optimizers.values():
        optimizer.load_state_dict(copy.deepcopy(state))
    for obj, state in saved.others:
        obj.load_state_dict(copy.deepcopy(state))
    torch.random.set_rng_state(saved.rng[0])
    if saved.rng[1] is not None:
        torch.cuda.set_rng_state_all(saved.rng[1])


@contextmanager
def undone(step: TorchStep, stateful: Sequence[Any] | None = None) -> Iterator[None]:
    """Run what the block runs of ``step``, then put everything back as it was: the models'
    parameters, buffers and gradients, every optimizer stepped in the block, every LR
    scheduler and ``GradScaler`` alive, and the RNG (see the module's docstring). The first
    time, what was put back is kept as the state the step started from (:func:`rewind`).

    ``stateful``: the schedulers and scalers to put back, as :func:`live_stateful` found
    them (default: found now), so that blocks run one after the other scan once."""
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    saved = _snapshot(step, stateful)

    def before_step(optimizer: torch.optim.Optimizer, args: tuple[object, ...],
                    kwargs: Mapping[str, object]) -> None:
        with uncounted():  # the plugin's snapshot (copies to the host): not the step's ops
            _save_optimizer(saved, optimizer)
            if step._initial is not None:
                # An earlier block ended before this optimizer first stepped (MemTracker
                # raises in a step that calls a module twice, gradient accumulation, and
                # the profiler counts instead): every block put everything back, so what
                # it holds now is still where the step started.
                _save_optimizer(step._initial, optimizer)

    handle = register_optimizer_step_pre_hook(before_step)
    try:
        yield
    finally:
        handle.remove()
        _restore(saved)
        if step._initial is None:
            step._initial = saved


def rewind(step: TorchStep) -> None:
    """Put ``step`` back where it was when the plugin first ran it (its first counting
    step, before any training): a step trained again (a throughput regression
    re-measured, ``--accelperf-confirm``) starts where its first training started, not
    where it ended. Nothing happens for a step never run."""
    if step._initial is not None:
        _restore(step._initial)


def run_step(step: TorchStep, batch: Batch, counting: bool = False) -> UserValue:
    """One call of the step (``count_step`` when ``counting``); its raw output."""
    fn = step.count_step if counting and step.count_step is not None else step.step
    return fn(batch)
