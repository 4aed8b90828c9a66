"""What an eager torch step dispatches: its aten ops by dtype, the bytes they move and the
host syncs among them, counted by a dispatch mode (:class:`OpCounter`) over the step the
backend already runs to count FLOPs; the eager part of ``Run.program``.

Counted per call of an op, after autograd and autocast (a cast autocast inserts is a
``_to_copy``; the backward's ops are dispatched too) and after ``FlopCounterMode``
decomposed what it decomposes (the counter sits below it: it sees the kernels that run):

``ops``
    ``{"name[dtypes]": count}``: the op's overload packet (``mm``, ``_softmax``) and the
    dtypes of its tensor inputs, each once in the order met (``mm[bf16]``,
    ``embedding[f32,i64]``; an op with no tensor input, a factory, is its bare name:
    ``zeros``). Left out, as they move no data: views (an op whose outputs alias an input
    without writing it, by its schema: ``view``, ``t``, ``expand``, ``detach``,
    ``transpose``, ``split``; and ``_unsafe_view``, a view its schema does not mark),
    queries of a tensor's metadata (``size``, ``is_contiguous``: dispatched only for
    subclasses), and the profiler's range markers (``record_function``, which
    ``torch.optim`` adds around every ``step``). Kept: copies (``_to_copy``, ``copy_``,
    ``clone``: real traffic, and autocast's casts), allocations (``empty``, ``zeros``) and
    in-place ops (``add_``).
``bytes_accessed``
    the sum over the counted ops of the bytes of their tensor inputs and outputs (elements
    times element size): what eager mode moves through memory at op boundaries, each op's
    operands read once and its results written once (an in-place op's operand counts as
    read and written; an op's own re-reads, tiling and caches are not seen).
``host_syncs`` and ``host_sync_sites``
    the ops that make the host wait for the device: a tensor's value read by Python
    (``_local_scalar_dense``: ``.item()``, ``float(t)``, ``if t:``; ``equal``), an output
    whose shape depends on the data (``nonzero``, ``masked_select``, ``unique``,
    ``bincount``, indexing with a boolean mask, ``repeat_interleave`` without
    ``output_size``, ``one_hot`` without ``num_classes``), and a blocking copy from a
    device to the CPU. On an accelerator only those of tensors on it count (a CPU
    tensor's ``.item()`` waits for nothing); on the CPU every one does, since that is
    where the step's tensors live (nothing waits there, but the same code waits on an
    accelerator). Left out on every device: the optimizer's own step counters, which
    ``torch.optim`` reads with ``.item()`` (``optimizer._get_value``) and keeps on the CPU
    on every device. ``host_sync_sites`` says where each was, ``{"_local_scalar_dense at
    suites/x.py in step: logged = loss.item()": 1}``: the innermost frame outside torch,
    keyed by its function and source text, not its line (:mod:`pytest_accelperf.records.sites`).

Deterministic: the same code, shapes and dtypes dispatch the same ops, every run. The
plugin's own work inside the counted step (the snapshot that undoes it) runs
:func:`uncounted`.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import sys
from collections import Counter
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, TypedDict

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from pytest_accelperf.backends.types import Untyped
from pytest_accelperf.records.sites import code_site

if TYPE_CHECKING:
    from torch._ops import OpOverload

    #: An aten op as ``__torch_dispatch__`` receives it.
    Op = OpOverload[..., Any]

#: Compact dtype names in op keys (``mm[bf16]``); another dtype is its torch name.
DTYPE_TAGS: dict[torch.dtype, str] = {
    torch.float64: "f64", torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16",
    torch.int64: "i64", torch.int32: "i32", torch.int16: "i16", torch.int8: "i8",
    torch.uint8: "u8", torch.bool: "b8", torch.complex64: "c64", torch.complex128: "c128",
    torch.float8_e4m3fn: "f8e4m3fn", torch.float8_e5m2: "f8e5m2",
}

#: Views whose schema does not say so (no alias annotation): no data moves.
_UNMARKED_VIEWS = frozenset({"_unsafe_view"})
#: Queries of a tensor's metadata (dispatched only for tensor subclasses): no data moves.
_METADATA = frozenset({
    "size", "sym_size", "stride", "sym_stride", "storage_offset", "sym_storage_offset",
    "numel", "sym_numel", "dim", "is_contiguous", "sym_is_contiguous",
    "is_strides_like_format", "is_non_overlapping_and_dense"})
#: Namespaces left out: ``prim`` (``prim.device``, ``prim.layout``: metadata) and
#: ``profiler`` (``record_function``'s range markers).
_NAMESPACES_LEFT_OUT = frozenset({"prim", "profiler"})
#: Indexing ops whose output shape (``index``) or work (``index_put``) depends on the data
#: only with a boolean mask among the indices.
_MASKABLE = frozenset({"index", "index_put", "index_put_", "_index_put_impl_"})
_COPIES = frozenset({"_to_copy", "copy_"})

#: Set while the plugin does its own work inside a counted step (:func:`uncounted`).
_UNCOUNTED: contextvars.ContextVar[bool] = contextvars.ContextVar("accelperf_uncounted",
                                                                   default=False)
_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_OPTIMIZER_FILE = os.path.join(_TORCH_DIR, "optim", "optimizer.py")
#: The plugin's own package: a frame there called a trainer, not the user's code.
_PLUGIN_DIR = os.path.dirname(os.path.dirname(os.path.dirname(__file__))) + os.sep


@contextlib.contextmanager
def uncounted() -> Iterator[None]:
    """Ops run in the block are the plugin's, not the step's (the optimizer snapshot taken
    inside a counted step, :func:`~.torch.step.undone`): :class:`OpCounter` leaves them
    out. Other dispatch modes (FlopCounterMode, MemTracker) still see them."""
    token = _UNCOUNTED.set(True)
    try:
        yield
    finally:
        _UNCOUNTED.reset(token)


def dtype_tag(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bf16"`` (:data:`DTYPE_TAGS`)."""
    return DTYPE_TAGS.get(dtype) or str(dtype).removeprefix("torch.")


def op_key(name: str, inputs: list[torch.Tensor]) -> str:
    """``"mm[bf16]"``: the op's name and its tensor inputs' dtypes, each once, in order."""
    tags = list(dict.fromkeys(dtype_tag(t.dtype) for t in inputs))
    return f"{name}[{','.join(tags)}]" if tags else name


def _name(func: Op) -> str:
    packet = func.overloadpacket.__name__
    return packet if func.namespace == "aten" else f"{func.namespace}.{packet}"


def left_out(func: Op) -> bool:
    """Whether an op is left out of the counts (see the module docstring): a view, a
    metadata query, a profiler marker."""
    if func.namespace in _NAMESPACES_LEFT_OUT:
        return True
    name = func.overloadpacket.__name__
    if name in _UNMARKED_VIEWS or name in _METADATA:
        return True
    returns = func._schema.returns
    return bool(returns) and all(r.alias_info is not None and not r.alias_info.is_write
                                 for r in returns)


def _tensors(tree: object) -> list[torch.Tensor]:
    return [x for x in tree_leaves(tree) if isinstance(x, torch.Tensor)]


def _nbytes(t: torch.Tensor) -> int:
    # Elements the op reads or writes (a broadcast view's elements, not its storage).
    return t.numel() * t.element_size() if t.layout == torch.strided else 0


def _arg(args: tuple[Untyped, ...], kwargs: Mapping[str, Untyped], index: int,
         name: str) -> Untyped:
    return args[index] if len(args) > index else kwargs.get(name)


def sync_kind(func: Op, args: tuple[Untyped, ...], kwargs: Mapping[str, Untyped], out: object,
              device: torch.device) -> str | None:
    """What kind of host sync a call of ``func`` is, on a step whose tensors live on
    ``device`` (see the module docstring): the op's name, ``"copy to cpu"`` or ``"<op>
    with a bool mask"``; None when it is none."""
    name: str = func.overloadpacket.__name__
    if name in _COPIES:
        src = _arg(args, kwargs, 0 if name == "_to_copy" else 1, "self" if name == "_to_copy"
                   else "src")
        dst = out if name == "_to_copy" else _arg(args, kwargs, 0, "self")
        if not isinstance(src, torch.Tensor) or not isinstance(dst, torch.Tensor):
            return None
        non_blocking = (_arg(args, kwargs, 2, "non_blocking") if name == "copy_"
                        else kwargs.get("non_blocking"))
        if src.device.type != "cpu" and dst.device.type == "cpu" and not non_blocking:
            return "copy to cpu"
        return None
    inputs = _tensors((args, kwargs))
    if not inputs or not (device.type == "cpu" or inputs[0].device.type != "cpu"):
        return None
    tags = func.tags
    if name in _MASKABLE:
        indices = _arg(args, kwargs, 1, "indices") or []
        masked = any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8)
                     for i in indices)
        return f"{name} with a bool mask" if masked else None
    if torch.Tag.data_dependent_output in tags:
        return name
    if torch.Tag.dynamic_output_shape in tags:
        if name == "repeat_interleave" and kwargs.get("output_size") is not None:
            return None
        classes = _arg(args, kwargs, 1, "num_classes")
        if name == "one_hot" and classes is not None and int(classes) >= 0:
            return None
        return name
    return None


def _caller(libraries: tuple[str, ...] = ()) -> tuple[str, bool]:
    """Where the op being dispatched was called from: the site
    (:func:`~pytest_accelperf.records.sites.code_site`: file, function and source text) of the
    innermost Python frame outside torch, this module and ``libraries`` (directories: a
    trainer's own package, whose frames lie between the user's code and torch), or, where
    the frame outside them is the plugin's own (the trainer's loop called the op, not the
    user's code), the innermost frame in ``libraries``; ``"?"`` when there is none (a
    backward op on autograd's thread). And whether torch.optim's ``_get_value`` (the
    optimizer's step counter) is between."""
    frame = sys._getframe(2)
    counter = False
    library: str | None = None
    while frame is not None:
        path = frame.f_code.co_filename
        if path == __file__ or path.startswith(_TORCH_DIR):
            counter = counter or (path == _OPTIMIZER_FILE
                                  and frame.f_code.co_name == "_get_value")
            frame = frame.f_back  # type: ignore[assignment]  # None ends the loop
            continue
        site = code_site(path, frame.f_lineno, frame.f_code.co_name)
        if libraries and path.startswith(libraries):
            library = library or site
            frame = frame.f_back  # type: ignore[assignment]  # None ends the loop
            continue
        if library is not None and path.startswith(_PLUGIN_DIR):
            return library, counter
        return site, counter
    return library or "?", counter


class OpCounts(TypedDict):
    """What :class:`OpCounter` counted (:meth:`OpCounter.record`), as ``program_record``
    takes it: ops by name and dtypes, the bytes they read and wrote, the host syncs and
    where the step made them."""

    ops: dict[str, int]
    bytes_accessed: float
    host_syncs: int
    host_sync_sites: dict[str, int]


class OpCounter(TorchDispatchMode):  # type: ignore[no-untyped-call]  # untyped in torch
    """Counts what the ops dispatched inside it do (see the module docstring), for a step
    whose tensors live on ``device`` (``libraries``: see :func:`_caller`). Enter it before
    ``FlopCounterMode``, so that it sees the ops that counter decomposes into."""

    def __init__(self, device: torch.device, libraries: tuple[str, ...] = ()) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # untyped in torch
        self.device = device
        #: Directories of a trainer's package: a host sync's site is the user's frame
        #: that called into it (``self.log`` in ``training_step``), not the trainer's.
        self.libraries = libraries
        self.ops: Counter[str] = Counter()
        self.bytes = 0
        self.sync_sites: Counter[str] = Counter()

    def __torch_dispatch__(self, func: Op, types: object, args: tuple[Untyped, ...] = (),
                           kwargs: Mapping[str, Untyped] | None = None) -> object:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if _UNCOUNTED.get() or left_out(func):
            return out
        inputs = _tensors((args, kwargs))
        self.ops[op_key(_name(func), inputs)] += 1
        self.bytes += sum(_nbytes(t) for t in inputs) + sum(_nbytes(t) for t in _tensors(out))
        kind = sync_kind(func, args, kwargs, out, self.device)
        if kind is not None:
            site, optimizer_counter = _caller(self.libraries)
            if not optimizer_counter:
                self.sync_sites[f"{kind} at {site}"] += 1
        return out

    @property
    def host_syncs(self) -> int:
        return sum(self.sync_sites.values())

    def record(self, times: int = 1) -> OpCounts:
        """The counts as ``program_record`` keyword arguments, each multiplied by ``times``
        (a rank counts one micro-batch of ``grad_accum``)."""
        return {"ops": {k: v * times for k, v in self.ops.items()},
                "bytes_accessed": float(self.bytes * times),
                "host_syncs": self.host_syncs * times,
                "host_sync_sites": {k: v * times for k, v in self.sync_sites.items()}}
