"""What the torch-based backends share: the task they train and its batches on a device.

:class:`TorchTask` is trained by the torch backend (one process, as the
:class:`~pytest_accelperf.backends.torch.step.TorchStep` that :meth:`TorchTask.to_step`
makes of it), by DDP and DeepSpeed (ranks, :mod:`.torch.ranks`) and by the neuron
backend; :func:`to_device` moves a batch (numpy arrays made tensors as DataLoader makes
them, :func:`as_tensors`),
:func:`torch_probe` is the drift probe in torch's own kernels. Importing this module imports
torch, and nothing of the backends that use it.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch.utils.data import default_convert as _default_convert

from pytest_accelperf.backends.measure.common import TaskError, describe
from pytest_accelperf.backends.measure.probe import PROBE_N, PROBE_REPS, Probe
from pytest_accelperf.backends.torch.step import TorchStep, given
from pytest_accelperf.backends.types import Batch, Leaf

if TYPE_CHECKING:
    from torch.utils.flop_counter import FlopCounterMode

#: ``torch.utils.data.default_convert``, untyped in torch: through Any for mypy --strict.
default_convert: Any = _default_convert


@dataclass
class TorchTask:
    """What to train, independent of the device.

    ``make_model()`` is called after ``torch.manual_seed(seed)`` and builds the model on
    the CPU (the backend moves it). ``loss_fn(model, batch)`` returns a scalar loss;
    ``make_batch(step)`` returns the batch of a step (tensors on the CPU, or numpy arrays,
    made tensors as DataLoader makes them, in any nesting of dicts, lists, tuples and
    namedtuples; the backend moves them to the device, outside the timer).
    ``compile`` wraps the model in ``torch.compile``; ``grad_clip`` clips the global
    gradient norm before every optimizer step.
    """

    make_model: Callable[[], torch.nn.Module]
    loss_fn: Callable[[torch.nn.Module, Any], torch.Tensor]
    make_batch: Callable[[int], Any]
    make_optimizer: Callable[[Iterable[torch.nn.Parameter]], torch.optim.Optimizer]
    compile: bool = False
    grad_clip: float | None = None
    tokens_per_sample: int | None = None
    seed: int = 0

    def to_step(self, device: torch.device | str = "cpu") -> TorchStep:
        """This task as the :class:`TorchStep` the in-process backend trains: the model
        built after ``torch.manual_seed(seed)`` and moved to ``device``, its optimizer, and
        the step ``zero_grad``, ``loss_fn``, ``backward``, clip, ``optimizer.step`` that
        returns ``{"loss": loss}``. With ``compile`` the step runs the
        ``torch.compile``-d model and FLOPs and memory are counted over the eager one."""
        torch.manual_seed(self.seed)
        made = self.make_model()
        if not isinstance(made, torch.nn.Module):  # else an AttributeError on .to() below
            raise TaskError(f"TorchTask.make_model {describe(self.make_model)} must return "
                            f"the nn.Module to train; it returns {given(made)}")
        model = made.to(device)
        optimizer = self.make_optimizer(model.parameters())
        runnable: Any = torch.compile(model) if self.compile else model
        loss_fn, grad_clip = self.loss_fn, self.grad_clip

        def train(module: torch.nn.Module, batch: Batch) -> dict[str, torch.Tensor]:
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(module, batch)
            loss.backward()  # type: ignore[no-untyped-call]  # untyped in torch
            if grad_clip is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
            optimizer.step()
            return {"loss": loss}

        def step(batch: Batch) -> dict[str, torch.Tensor]:
            return train(runnable, batch)

        def eager_step(batch: Batch) -> dict[str, torch.Tensor]:
            return train(model, batch)

        def params() -> dict[str, torch.Tensor]:
            return dict(model.named_parameters())

        return TorchStep(step=step, make_batch=self.make_batch, model=model, params=params,
                         compile=self.compile, count_step=eager_step if self.compile else None,
                         tokens_per_sample=self.tokens_per_sample, seed=self.seed,
                         label=f"TorchTask.loss_fn {describe(self.loss_fn)}",
                         stateful=(),  # it steps its optimizer, no scheduler or scaler
                         # The parameters by name, and beside them the buffers (BatchNorm's
                         # running statistics) and the optimizer's step.
                         fingerprint_state=True)


def _cpu_flash_attention(query_shape: Sequence[int], key_shape: Sequence[int],
                         value_shape: Sequence[int], *args: object, out_shape: object = None,
                         **kwargs: object) -> int:
    from torch.utils import flop_counter as counting

    count: Any = counting.sdpa_flop_count  # untyped in torch
    return int(count(query_shape, key_shape, value_shape))


def _cpu_flash_attention_backward(grad_out_shape: Sequence[int], query_shape: Sequence[int],
                                  key_shape: Sequence[int], value_shape: Sequence[int],
                                  *args: object, out_shape: object = None,
                                  **kwargs: object) -> int:
    # The model's FLOPs: the backward of the two products is four (as when attention is
    # written with matmuls), not the five of torch's CUDA formula, which counts the
    # kernel's recomputation of the scores.
    return 2 * _cpu_flash_attention(query_shape, key_shape, value_shape)


def flop_counter() -> FlopCounterMode:
    """A ``FlopCounterMode`` that also counts the CPU flash-attention kernels.

    torch's counter has formulas for the CUDA attention kernels only: on the CPU,
    ``F.scaled_dot_product_attention`` runs
    ``aten._scaled_dot_product_flash_attention_for_cpu``
    and its backward, which it counted as 0 FLOPs (a small GPT reported 0.926 of its
    FLOPs, less as the sequence grows). They count the model's FLOPs of attention: the two
    batched products of the forward (torch's ``sdpa_flop_count``) and four for the
    backward, exactly what the same attention written with matmuls counts; not discounted
    for a causal mask, as torch does not on CUDA either.
    """
    from torch.utils.flop_counter import FlopCounterMode

    aten = torch.ops.aten
    return FlopCounterMode(display=False, custom_mapping={
        aten._scaled_dot_product_flash_attention_for_cpu: _cpu_flash_attention,
        aten._scaled_dot_product_flash_attention_for_cpu_backward:
            _cpu_flash_attention_backward})


def map_batch(batch: Batch, leaf: Callable[[Leaf], Leaf]) -> Batch:
    """``batch`` with ``leaf`` applied to each of its leaves (a tensor, an array, a number,
    anything that is not a container), its containers kept: dicts and other mappings,
    namedtuples, tuples and lists, nested."""
    if isinstance(batch, torch.Tensor):
        return leaf(batch)
    if isinstance(batch, Mapping):
        items = {k: map_batch(v, leaf) for k, v in batch.items()}
        if type(batch) is dict:
            return items
        # Another mapping (an OrderedDict, a tokenizer's BatchEncoding) stays its type, as
        # DataLoader's default_convert keeps it: a copy updated, else one made from items.
        try:
            if isinstance(batch, MutableMapping):
                clone = copy.copy(batch)
                clone.update(items)
                return clone
            kind: Any = type(batch)  # a Mapping subclass's constructor: unknown to mypy
            return kind(items)
        except TypeError:
            return items
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a namedtuple
        return type(batch)(*(map_batch(v, leaf) for v in batch))
    if isinstance(batch, list | tuple):
        return type(batch)(map_batch(v, leaf) for v in batch)
    return leaf(batch)


def leaves_with_paths(batch: Batch, prefix: str = "") -> list[tuple[str, Leaf]]:
    """``(path, leaf)`` of each leaf of ``batch`` in order, paths as JAX's ``keystr``
    writes them simply: ``x``, ``pair/0``, ``point/x`` (``""`` for a batch that is one
    leaf)."""
    if isinstance(batch, torch.Tensor):
        return [(prefix, batch)]
    items: Iterable[tuple[Any, Any]]
    if isinstance(batch, Mapping):
        items = batch.items()
    elif isinstance(batch, tuple) and hasattr(batch, "_fields"):
        items = zip(batch._fields, batch, strict=True)
    elif isinstance(batch, list | tuple):
        items = enumerate(batch)
    else:
        return [(prefix, batch)]
    out: list[tuple[str, Leaf]] = []
    for key, value in items:
        out.extend(leaves_with_paths(value, f"{prefix}/{key}" if prefix else str(key)))
    return out


def _as_tensor(leaf: Leaf) -> Leaf:
    """A numpy array or numpy scalar as a tensor, as DataLoader converts one
    (``default_convert``: ``torch.as_tensor``, sharing the array's memory); anything else
    unchanged (a tensor, a Python number, a string). A read-only array (a memory-mapped
    file's) is copied first: a tensor over it would be writable, which torch warns of."""
    if isinstance(leaf, torch.Tensor):
        return leaf
    if isinstance(leaf, np.ndarray) and not leaf.flags.writeable:
        leaf = leaf.copy()
    return default_convert(leaf)


def as_tensors(batch: Batch) -> Batch:
    """``batch`` with its numpy arrays and numpy scalars as tensors, as torch's DataLoader
    gives them (``torch.utils.data.default_convert``); its containers kept (dicts,
    namedtuples, tuples, lists: ``default_convert`` alone turns a tuple into a list)."""
    return map_batch(batch, _as_tensor)


def to_device(batch: Batch, device: torch.device) -> Batch:
    """``batch`` with every tensor moved to ``device``, numpy arrays and numpy scalars made
    tensors first (:func:`as_tensors`); its containers kept."""

    def move(leaf: Leaf) -> Leaf:
        leaf = _as_tensor(leaf)
        return leaf.to(device) if isinstance(leaf, torch.Tensor) else leaf

    return map_batch(batch, move)


def sync(device: torch.device) -> None:
    """Wait for the work queued on ``device`` (CUDA); the CPU is always done."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def torch_probe(device: torch.device, n: int = PROBE_N, reps: int = PROBE_REPS) -> Probe:
    """The drift-cancelling reference workload on ``device`` (see :mod:`.probe`): ``reps``
    float32 ``n x n`` products through torch's own kernels and threads, synchronized."""
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(n, n, generator=gen).to(device)
    b = torch.randn(n, n, generator=gen).to(device)

    def run() -> None:
        with torch.no_grad():
            x = a
            for _ in range(reps):
                x = torch.tanh(x @ b)
        sync(device)

    return Probe(f"torch-{device.type}-matmul{n}x{reps}", run)
