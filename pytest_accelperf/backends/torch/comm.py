"""What one rank communicates per training step, by collective (DDP and DeepSpeed ranks).

A :class:`CommCounter` counts the collectives a rank's engine issues during the steps it is
told to count (:meth:`CommCounter.step`), and gives them per step
(:meth:`CommCounter.per_step`) in the form of ``Run.program["collectives"]``
(:func:`pytest_accelperf.records.program.program_record`): ``{kind: {"count": n, "bytes": b}}``.
Two real sources feed it, each the layer where the engine's own collectives pass:

* DeepSpeed (:func:`count_deepspeed`): every collective of ZeRO and the engine goes
  through ``deepspeed.comm`` (DeepSpeed's runtime never calls ``torch.distributed``
  directly), which calls the methods of one backend object (``deepspeed.comm.comm.cdb``,
  a ``TorchBackend`` over gloo or nccl). Those methods are wrapped on that object; a
  wrapper adds the call's payload when the counter is on and is a flag test otherwise.
  (DeepSpeed's own ``comms_logger`` sees the same calls and sizes them by the same
  tensors, but synchronizes and times each call, and misses ``all_gather_coalesced``,
  which ``deepspeed.comm`` does not decorate.)
* DDP (:func:`register_ddp_hook`): the reducer's bucket all-reduce is issued from C++, not
  through Python's ``torch.distributed.all_reduce``; a DDP communication hook
  (``DistributedDataParallel.register_comm_hook``) is called with every bucket. The hook
  is torch's default one (``default_hooks.allreduce_hook``: divide by the world size,
  all-reduce), wrapped to count the bucket while the counter is on. A hook cannot be
  removed, so it runs in timed steps too: one Python call per bucket (a few microseconds).

Kinds are ``torch.distributed`` names: ``all_reduce`` (``inference_all_reduce`` and
``all_reduce_coalesced`` too), ``reduce``, ``reduce_scatter`` (``reduce_scatter_tensor``
too), ``all_gather`` (``all_gather_into_tensor``, ``all_gather_base``,
``all_gather_coalesced``), ``broadcast``, ``all_to_all`` (``all_to_all_single``),
``gather``, ``scatter``. ``count`` is calls (a coalesced call is one); ``bytes`` is the
rank's *payload*: the bytes of the tensors the rank puts in (an all-reduce's or a
broadcast's tensor, a reduce-scatter's whole input, an all-gather's own shard, an
all-to-all's input). A DDP bucket's all-reduce thus carries the bucket (gradients of
every parameter once per optimizer step: the parameter bytes); a ZeRO all-gather of
parameters carries this rank's partition. What the backend does underneath (gloo runs a
reduce-scatter as an all-reduce) is not what is counted: the request is, so a count means
the same on gloo and nccl.

Per step: totals over the counted steps divided by their number, rounded to whole calls
and bytes (exact when every counted step issued the same, which
:meth:`CommCounter.summary` says).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, NotRequired, TypedDict

import torch

if TYPE_CHECKING:
    from torch._C._distributed_c10d import GradBucket

#: DeepSpeed ``TorchBackend`` method -> (kind, the argument whose tensors are the payload:
#: its position, then its name).
DEEPSPEED_METHODS: dict[str, tuple[str, int, str]] = {
    "all_reduce": ("all_reduce", 0, "tensor"),
    "inference_all_reduce": ("all_reduce", 0, "tensor"),
    "all_reduce_coalesced": ("all_reduce", 0, "tensors"),
    "reduce": ("reduce", 0, "tensor"),
    "reduce_scatter": ("reduce_scatter", 1, "input_list"),
    "reduce_scatter_tensor": ("reduce_scatter", 1, "input_tensor"),
    "all_gather": ("all_gather", 1, "tensor"),
    "all_gather_into_tensor": ("all_gather", 1, "input_tensor"),
    "all_gather_base": ("all_gather", 1, "input_tensor"),
    "all_gather_coalesced": ("all_gather", 1, "input_tensors"),
    "broadcast": ("broadcast", 0, "tensor"),
    "all_to_all_single": ("all_to_all", 1, "input"),
    "all_to_all": ("all_to_all", 1, "input_tensor_list"),
    "gather": ("gather", 0, "tensor"),
    "scatter": ("scatter", 0, "tensor"),
}


def payload_bytes(value: object) -> int:
    """Bytes of a tensor, or the sum over a list or tuple of tensors (0 for anything else)."""
    if isinstance(value, torch.Tensor):
        return int(value.numel()) * int(value.element_size())
    if isinstance(value, list | tuple):
        return sum(payload_bytes(v) for v in value)
    return 0


class CommSummary(TypedDict):
    """What a rank reports of its collectives (:meth:`CommCounter.summary`)."""

    collectives: dict[str, dict[str, int]] | None
    steps: int
    same_each_step: bool
    each_step: NotRequired[list[dict[str, dict[str, int]]]]


class CommCounter:
    """Collectives counted over the steps run inside :meth:`step`, by kind; calls made
    outside a counted step are ignored (the engine's construction, timed steps, the rank
    loop's own loss all-reduce)."""

    def __init__(self) -> None:
        self.active = False
        #: One ``{kind: [count, bytes]}`` per counted step, in order.
        self.steps: list[dict[str, list[int]]] = []

    def add(self, kind: str, nbytes: int) -> None:
        """Count one call of ``kind`` carrying ``nbytes`` (if a step is being counted)."""
        if not self.active:
            return
        entry = self.steps[-1].setdefault(kind, [0, 0])
        entry[0] += 1
        entry[1] += int(nbytes)

    @contextmanager
    def step(self) -> Iterator[None]:
        """Count the collectives issued inside as one step's."""
        self.steps.append({})
        self.active = True
        try:
            yield
        finally:
            self.active = False

    def per_step(self) -> dict[str, dict[str, int]] | None:
        """``{kind: {"count": n, "bytes": b}}`` per step (totals over the counted steps
        divided by their number, rounded); None when no step was counted."""
        if not self.steps:
            return None
        k = len(self.steps)
        kinds = sorted({kind for s in self.steps for kind in s})
        out: dict[str, dict[str, int]] = {}
        for kind in kinds:
            count = sum(s.get(kind, [0, 0])[0] for s in self.steps)
            nbytes = sum(s.get(kind, [0, 0])[1] for s in self.steps)
            out[kind] = {"count": round(count / k), "bytes": round(nbytes / k)}
        return out

    def summary(self) -> CommSummary:
        """What the rank reports: the per-step collectives, how many steps were counted,
        and whether every counted step issued the same (then the division is exact; if
        not, ``each_step`` lists every step's)."""
        same = all(s == self.steps[0] for s in self.steps)
        out: CommSummary = {"collectives": self.per_step(), "steps": len(self.steps),
                            "same_each_step": same}
        if not same:
            out["each_step"] = [{kind: {"count": c, "bytes": b}
                                 for kind, (c, b) in sorted(s.items())} for s in self.steps]
        return out


# -- DeepSpeed ------------------------------------------------------------------------------
def _counting(method: Callable[..., Any], kind: str, position: int, name: str,
              counter: CommCounter) -> Callable[..., Any]:
    @functools.wraps(method)
    def wrapper(*args: object, **kwargs: object) -> object:
        if counter.active:
            payload = kwargs[name] if name in kwargs else (
                args[position] if len(args) > position else None)
            counter.add(kind, payload_bytes(payload))
        return method(*args, **kwargs)

    return wrapper


def count_deepspeed(counter: CommCounter) -> list[str]:
    """Have every collective DeepSpeed issues from now on counted in ``counter`` (in the
    steps it counts): the methods of ``deepspeed.comm``'s backend object
    (:data:`DEEPSPEED_METHODS`) are wrapped on that object, for the rest of the process;
    returns the names wrapped. Needs ``deepspeed.comm`` initialized
    (``deepspeed.init_distributed``); a method already wrapped is left as it is."""
    import importlib

    comm = importlib.import_module("deepspeed.comm.comm")
    backend = comm.cdb
    if backend is None:
        raise RuntimeError("deepspeed.comm is not initialized: call deepspeed.init_distributed "
                           "before counting its collectives")
    wrapped: list[str] = []
    for method_name, (kind, position, arg) in DEEPSPEED_METHODS.items():
        method = getattr(backend, method_name, None)
        if method is None or method_name in vars(backend):
            continue  # not this backend's, or wrapped already
        setattr(backend, method_name, _counting(method, kind, position, arg, counter))
        wrapped.append(method_name)
    return wrapped


# -- DDP ------------------------------------------------------------------------------------
def counting_allreduce_hook(counter: CommCounter,
                            bucket: GradBucket) -> torch.futures.Future[Any]:
    """A DDP communication hook: torch's default all-reduce of the bucket
    (``default_hooks.allreduce_hook``: divide by the world size, all-reduce, on the default
    process group), counted in ``counter`` as one ``all_reduce`` of the bucket's bytes."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.distributed.distributed_c10d import _get_default_group

    if counter.active:
        counter.add("all_reduce", payload_bytes(bucket.buffer()))
    future: torch.futures.Future[Any] = default_hooks.allreduce_hook(_get_default_group(),
                                                                     bucket)
    return future


def register_ddp_hook(ddp: torch.nn.parallel.DistributedDataParallel,
                      counter: CommCounter) -> None:
    """Have ``ddp`` reduce its gradient buckets with :func:`counting_allreduce_hook`
    (before its first backward; a DDP module takes one hook, for good)."""
    # A lambda: DDP checks a hook's annotations against the classes, and this module's are
    # strings (``from __future__ import annotations``).
    ddp.register_comm_hook(counter, lambda state, bucket: counting_allreduce_hook(state, bucket))


# -- over ranks -----------------------------------------------------------------------------
def largest_over_ranks(per_rank: Sequence[Mapping[str, Mapping[str, int]] | None]
                       ) -> dict[str, dict[str, int]] | None:
    """Per kind, the largest count and the largest bytes over the ranks' per-step
    collectives (the busiest rank's, when one rank is busiest in both); None when no rank
    counted any step."""
    known = [r for r in per_rank if r is not None]
    if not known:
        return None
    out: dict[str, dict[str, int]] = {}
    for kind in sorted({k for r in known for k in r}):
        out[kind] = {"count": max(int(r.get(kind, {}).get("count", 0)) for r in known),
                     "bytes": max(int(r.get(kind, {}).get("bytes", 0)) for r in known)}
    return out


__all__ = ["DEEPSPEED_METHODS", "CommCounter", "count_deepspeed", "counting_allreduce_hook",
           "largest_over_ranks", "payload_bytes", "register_ddp_hook"]
