"""What DDP and DeepSpeed train: the user's own model, optimizer and schedule, built per rank.

A :class:`RankStep` is the multi-process counterpart of
:class:`~pytest_accelperf.backends.jax.step.JaxStep`: instead of the plugin building a
model and an optimizer from separate pieces, the user's ``build(rank)`` builds them in each
rank the way their training script does (``model.configure_optimizers(...)`` with
weight-decay groups, a learning-rate schedule), and the plugin wraps them in the case's
engine (``DistributedDataParallel``, or ``deepspeed.initialize(model=..., optimizer=...,
lr_scheduler=...)``) and runs the loop DeepSpeed's docs write::

    loss = loss_fn(engine, micro_batch)   # engine(x) is the model's forward
    engine.backward(loss)
    engine.step()                         # optimizer and schedule at accumulation boundaries

:class:`~pytest_accelperf.backends.torch.task.TorchTask` is a convenience built on it
(:func:`from_task`). Whatever the user's functions get wrong is a
:class:`~pytest_accelperf.backends.measure.common.TaskError` naming the function and the fix.
Importing this module imports torch, and no engine.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypedDict

import numpy as np
import torch

from pytest_accelperf.backends.measure.common import (
    RESERVED_METRICS,
    TaskError,
    at_user_frame,
    describe,
    first_line,
)
from pytest_accelperf.backends.measure.data import batch_function
from pytest_accelperf.backends.torch.task import TorchTask
from pytest_accelperf.backends.types import Batch, UserValue

if TYPE_CHECKING:
    from pytest_accelperf.backends.protocol import Task


@dataclass(frozen=True)
class Built:
    """What ``RankStep.build(rank)`` returns (a plain ``(model, optimizer)`` or
    ``(model, optimizer, scheduler)`` tuple works too).

    ``model`` is a ``torch.nn.Module`` on the CPU (the plugin moves it to the rank's
    device; ``Module.to`` keeps the parameters the optimizer holds). ``optimizer`` is a
    ``torch.optim.Optimizer`` over the model's parameters, in any groups; or, for
    DeepSpeed, None where its config has an ``optimizer`` section: DeepSpeed builds it
    (and the schedule of a ``scheduler`` section), as its tutorials have it. ``scheduler``
    (optional) is anything with ``step()``, typically a
    ``torch.optim.lr_scheduler.LRScheduler`` of that optimizer: the engine steps it once
    per optimizer step, after the optimizer.
    """

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer | None
    scheduler: Any = None


@dataclass(frozen=True)
class RankStep:
    """A model, optimizer and schedule built by the user's code in every rank, and its loss:
    what DDP (``backend="torch"``, ``world_size > 1``) and DeepSpeed train.

    ``build(rank)`` returns :class:`Built`, ``(model, optimizer)`` or ``(model,
    optimizer, scheduler)``; the plugin calls it in each rank after
    ``torch.manual_seed(seed)`` (DeepSpeed: inside ``deepspeed.zero.Init`` only when the
    case sets ``zero_init=True``). ``loss_fn(model, batch)`` runs the forward of one
    micro-batch and returns the scalar loss, ``(loss, metrics)`` or a dict of scalars
    holding the loss under ``loss``; ``model`` is what the rank trains and is called like
    the user's model: the DeepSpeed engine, the ``DistributedDataParallel`` module (compiled
    with ``compile=True``), or, for the single-process reference, the plain model. The
    plugin then calls ``engine.backward(loss)`` and ``engine.step()``.

    ``make_batch(step)`` returns the *global* batch of an optimizer step (``case.batch``
    samples, tensors on the CPU, or numpy arrays, made tensors first as DataLoader makes
    them: :func:`~.torch.task.as_tensors`): rank ``r`` takes rows ``[r*B/N, (r+1)*B/N)`` of
    every tensor whose first dimension is ``case.batch``, and splits them into
    ``case.grad_accum`` micro-batches in order. Or, instead, ``data`` is an iterable of
    those global batches (a ``DataLoader``) or a function of no arguments that returns an
    iterator of them, as :class:`~pytest_accelperf.backends.torch.step.TorchStep` takes it
    (:mod:`pytest_accelperf.backends.measure.data`): every rank, and the single-process
    reference, iterates it from the start.

    Metrics: the loss and every other scalar ``loss_fn`` returns, averaged over the
    micro-batches and ranks of a step, and the learning rate the step used (first
    parameter group, named ``lr_metric``; None: not recorded) go into ``Run.metrics``, each
    checked against the baseline like the loss. ``ds_config`` is merged over the
    DeepSpeed config the case implies (a key set here wins; the batch, accumulation and
    clipping keys come from the case). ``compile`` runs the model through
    ``torch.compile`` in every rank. ``grad_clip`` clips the global gradient norm (or set
    it on the case). ``params(model)`` returns the named tensors the numerics fingerprint
    and the reference compare (default: ``model.named_parameters()``); :meth:`params_of`
    is the accessor. ``label`` is how errors name the step (default: the build function,
    file and line).
    """

    build: Callable[[int], Any]
    loss_fn: Callable[[Any, Any], Any]
    # Optional as a field (``data=`` instead), always a function after __post_init__.
    make_batch: Callable[[int], Any] = None  # type: ignore[assignment]
    ds_config: Mapping[str, Any] = field(default_factory=dict)
    compile: bool = False
    grad_clip: float | None = None
    params: Callable[[torch.nn.Module], Any] | None = None
    loss: str = "loss"
    lr_metric: str | None = "lr"
    tokens_per_sample: int | None = None
    seed: int = 0
    label: str = ""
    data: Any = None

    def __post_init__(self) -> None:
        for name, what in (("build", "a function of the rank that returns (model, optimizer"
                                     "[, scheduler])"),
                           ("loss_fn", "a function loss_fn(model, batch) that returns the "
                                       "scalar loss")):
            value = getattr(self, name)
            if not callable(value):
                raise TaskError(f"RankStep.{name} must be {what}; got {type(value).__name__}")
        object.__setattr__(self, "make_batch",
                           batch_function(self.make_batch, self.data, "RankStep"))
        if not isinstance(self.ds_config, Mapping):
            raise TaskError(f"RankStep.ds_config must be a dict of DeepSpeed config keys; got "
                            f"{type(self.ds_config).__name__}")
        if self.lr_metric is not None and self.lr_metric in RESERVED_METRICS:
            raise TaskError(f"RankStep.lr_metric {self.lr_metric!r} is the name of one of the "
                            f"plugin's own checks: use another (e.g. 'lr')")
        if not self.label:
            object.__setattr__(self, "label", f"RankStep.build {describe(self.build)}")

    # -- the user's functions, checked --------------------------------------------------
    def built(self, rank: int, *, config_optimizer: bool = False) -> Built:
        """What ``build(rank)`` returns, as :class:`Built` (a :class:`TaskError` naming
        ``build`` and the fix for anything else). ``config_optimizer``: DeepSpeed's config
        has an ``optimizer`` section, so ``build`` may return the model alone, or None as
        its optimizer (DeepSpeed builds it)."""
        out = self.build(rank)  # what it raises stays itself (an out-of-memory is an outcome)
        if isinstance(out, torch.nn.Module):
            if not config_optimizer:
                raise TaskError(f"{self.label} returns {_value_text(out)}, the model alone: "
                                f"return (model, optimizer) or (model, optimizer, scheduler), "
                                f"e.g. `return model, model.configure_optimizers(...), "
                                f"scheduler`; or, for DeepSpeed, give its config an "
                                f"'optimizer' section (RankStep(ds_config=...)), and "
                                f"DeepSpeed builds it")
            out = Built(out, None)
        if isinstance(out, tuple | list) and len(out) in (2, 3):
            out = Built(*out)
        if not isinstance(out, Built):
            raise TaskError(f"{self.label} returns {_value_text(out)}: return (model, "
                            f"optimizer) or (model, optimizer, scheduler), e.g. `return model, "
                            f"model.configure_optimizers(...), scheduler`, or "
                            f"Built(model=..., optimizer=..., scheduler=...)")
        if not isinstance(out.model, torch.nn.Module):
            raise TaskError(f"{self.label} returns {_value_text(out.model)} as the model: "
                            f"return the torch.nn.Module first, then its optimizer")
        if out.optimizer is None and config_optimizer:
            if out.scheduler is not None:
                raise TaskError(f"{self.label} returns a scheduler but no optimizer: give "
                                f"DeepSpeed's config a 'scheduler' section beside its "
                                f"'optimizer', or build both")
            return out
        if not isinstance(out.optimizer, torch.optim.Optimizer):
            raise TaskError(f"{self.label} returns {_value_text(out.optimizer)} as the "
                            f"optimizer: return a torch.optim.Optimizer built over the "
                            f"model's parameters (e.g. torch.optim.AdamW(groups, lr=...)); "
                            f"or, for DeepSpeed, give its config an 'optimizer' section "
                            f"(RankStep(ds_config=...)) and return the model alone")
        if out.scheduler is not None and not callable(getattr(out.scheduler, "step", None)):
            raise TaskError(f"{self.label} returns {_value_text(out.scheduler)} as the "
                            f"scheduler: return an LR scheduler of the optimizer (e.g. "
                            f"torch.optim.lr_scheduler.LambdaLR(optimizer, ...)), or nothing")
        owned = {id(p) for p in out.model.parameters()}
        for group in out.optimizer.param_groups:
            if any(id(p) not in owned for p in group["params"]):
                raise TaskError(f"{self.label} returns an optimizer over parameters that are "
                                f"not the returned model's: build the optimizer from this "
                                f"model (model.parameters() or its groups)")
        return out

    def compute(self, model: torch.nn.Module,
                batch: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """``loss_fn(model, batch)`` as ``(scalar loss, other scalar metrics)``."""
        out = self.loss_fn(model, batch)
        metrics: dict[object, UserValue] = {}
        loss: UserValue = out
        if isinstance(out, Mapping):
            if self.loss not in out:
                have = ", ".join(repr(k) for k in out) or "none"
                raise TaskError(f"RankStep.loss_fn {describe(self.loss_fn)} returns no "
                                f"{self.loss!r} (keys: {have}): return the loss under "
                                f"{self.loss!r}, or name its key with RankStep(..., loss=...)")
            metrics = {k: v for k, v in out.items() if k != self.loss}
            loss = out[self.loss]
        elif isinstance(out, tuple | list) and len(out) == 2 and isinstance(out[1], Mapping):
            loss, metrics = out[0], dict(out[1])
            metrics.pop(self.loss, None)
        if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
            raise TaskError(f"RankStep.loss_fn {describe(self.loss_fn)} returns "
                            f"{_value_text(loss)} as the loss: return a scalar tensor with a "
                            f"gradient (reduce it: loss.mean()), or (loss, metrics)")
        clean: dict[str, torch.Tensor] = {}
        for key, value in metrics.items():
            if not isinstance(key, str) or key in RESERVED_METRICS or key == self.lr_metric:
                raise TaskError(f"RankStep.loss_fn {describe(self.loss_fn)} returns a metric "
                                f"named {key!r}, which the plugin uses: rename it (e.g. "
                                f"'train_{key}')")
            tensor = torch.as_tensor(value.detach() if isinstance(value, torch.Tensor)
                                     else value)
            if tensor.numel() != 1:
                raise TaskError(f"RankStep.loss_fn {describe(self.loss_fn)} returns metric "
                                f"{key!r} as {_value_text(value)}: metrics are scalars, one "
                                f"value per micro-batch; reduce it or leave it out")
            clean[key] = tensor.reshape(()).float().cpu()
        return loss, clean

    def params_of(self, model: torch.nn.Module) -> dict[str, np.ndarray]:
        """The final parameters of ``model`` as arrays (the documented accessor: ``params``
        or ``model.named_parameters()``)."""
        if self.params is None:
            named: Any = dict(model.named_parameters())
        else:
            try:
                named = dict(self.params(model))
            except Exception as exc:
                raise TaskError(f"RankStep.params {describe(self.params)} failed on the "
                                f"trained model: {type(exc).__name__}: {first_line(exc)}"
                                f"{at_user_frame(exc)}; it must return {{name: tensor}} (e.g. "
                                f"lambda model: model.named_parameters())") from exc
        return {str(k): torch.as_tensor(v).detach().float().cpu().numpy().copy()
                for k, v in named.items()}


def from_task(task: TorchTask) -> RankStep:
    """A :class:`TorchTask` as the :class:`RankStep` the ranks train: ``build`` makes the
    model and ``make_optimizer(model.parameters())``, no schedule, no ``lr`` metric (its
    runs and baselines stay as they were)."""

    make_model, make_optimizer = task.make_model, task.make_optimizer

    def build(rank: int) -> Built:
        model = make_model()
        return Built(model, make_optimizer(model.parameters()))

    build.__wrapped__ = make_model  # type: ignore[attr-defined]  # errors name it
    return RankStep(build=build, loss_fn=task.loss_fn, make_batch=task.make_batch,
                    compile=task.compile, grad_clip=task.grad_clip, lr_metric=None,
                    tokens_per_sample=task.tokens_per_sample, seed=task.seed,
                    label=f"TorchTask.make_model {describe(make_model)}")


def as_rank_step(task: Task) -> RankStep:
    """``task`` as the :class:`RankStep` to train: itself, or a :class:`TorchTask`
    converted (:func:`from_task`)."""
    if isinstance(task, RankStep):
        return task
    if isinstance(task, TorchTask):
        return from_task(task)
    raise TaskError(f"DDP and DeepSpeed train a RankStep (your own build(rank) -> (model, "
                    f"optimizer, scheduler) and loss_fn; pytest_accelperf.torch) "
                    f"or a TorchTask; got {type(task).__name__}")


class GroupSummary(TypedDict):
    """One parameter group of an optimizer, as the run's ``extra`` shows it."""

    tensors: int
    elements: int
    weight_decay: float
    lr: float


def group_summary(optimizer: torch.optim.Optimizer) -> list[GroupSummary]:
    """Per parameter group: tensors, elements, weight decay, lr (what the run's ``extra``
    shows, so that an empty decay group is seen)."""
    out: list[GroupSummary] = []
    for group in optimizer.param_groups:
        params = group["params"]
        out.append({"tensors": len(params),
                    "elements": int(sum(int(getattr(p, "ds_numel", p.numel())) for p in params)),
                    "weight_decay": float(group.get("weight_decay", 0.0)),
                    "lr": float(group.get("lr", math.nan))})
    return out


def compiled_graphs() -> int:
    """Graphs ``torch.compile`` compiled in this process so far (0: nothing was compiled;
    the run's ``extra`` shows it, so a compile that silently fell back to eager is seen)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def _value_text(value: object) -> str:
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)} ({value.dtype})"
    if isinstance(value, tuple | list):
        return f"a {type(value).__name__} of {len(value)}"
    return "None" if value is None else f"a {type(value).__name__}"
