"""A trainer's training inside one of the plugin's launched ranks: :class:`Launched`,
what the rank's code knows of its group, and :class:`CollectiveMode`, which counts the
collectives the rank's training step issues.

:mod:`.torch.trainer_ddp` runs a trainer backend's own training (Lightning's, transformers')
in every rank of a ``world_size > 1`` case with :func:`inside` entered. What reads
:func:`launched` then trains over the group (Lightning's ``Trainer`` settings,
:func:`~.lightning.fit.trainer_settings`; transformers' ``Trainer`` needs nothing: accelerate
reads the same environment) and the counting training counts the collectives of its
counted step (:class:`~.torch.counting.CountedSteps`); nothing else changes: the same
callback, clock, memory count and fingerprint as in one process.

Collectives are counted where every one of them passes, whoever issues it: the
dispatcher. ``torch.distributed``'s collectives are dispatcher ops (``c10d.allreduce_``,
``c10d.broadcast_``, ...), the bucket all-reduce DDP's reducer issues from C++ as well as a
``self.log(..., sync_dist=True)``'s ``torch.distributed.all_reduce``, and a
``TorchDispatchMode`` sees each call (measured: DDP over gloo, torch 2.13). Kinds and
payload bytes are those of :mod:`pytest_accelperf.backends.torch.comm`: ``all_reduce``,
``broadcast``, ... and the tensors the rank puts in; Lightning's own ``barrier`` is
``barrier``, 0 bytes.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from torch.utils._python_dispatch import TorchDispatchMode

from pytest_accelperf.backends.torch.comm import CommCounter, payload_bytes
from pytest_accelperf.backends.types import Untyped
from pytest_accelperf.collect.cases import Case
from pytest_accelperf.errors import ConfigError

if TYPE_CHECKING:
    from torch._ops import OpOverload

#: ``c10d`` op -> (the kind counted, the position of the argument whose tensors are the
#: rank's payload; None: none).
C10D_KINDS: Mapping[str, tuple[str, int | None]] = {
    "allreduce_": ("all_reduce", 0),
    "allreduce_coalesced_": ("all_reduce", 0),
    "reduce_": ("reduce", 0),
    "broadcast_": ("broadcast", 0),
    "allgather_": ("all_gather", 1),
    "_allgather_base_": ("all_gather", 1),
    "allgather_coalesced_": ("all_gather", 1),
    "allgather_into_tensor_coalesced_": ("all_gather", 1),
    "reduce_scatter_": ("reduce_scatter", 1),
    "_reduce_scatter_base_": ("reduce_scatter", 1),
    "reduce_scatter_tensor_coalesced_": ("reduce_scatter", 1),
    "alltoall_": ("all_to_all", 1),
    "alltoall_base_": ("all_to_all", 1),
    "gather_": ("gather", 1),
    "scatter_": ("scatter", 1),
    "barrier": ("barrier", None),
}


@dataclass
class Launched:
    """This process is rank ``rank`` of ``world_size`` launched by the plugin (the
    torchelastic-style environment set: ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
    ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``); ``comm`` holds the
    collectives of its counted step."""

    rank: int
    world_size: int
    #: The ranks on this machine: all of them where the plugin launched them here, one
    #: where each is a Ray worker on a host of its own.
    local_world_size: int
    comm: CommCounter = field(default_factory=CommCounter)

    @property
    def machines(self) -> int:
        """Lightning's ``num_nodes``: the machines the ranks run on."""
        return max(1, self.world_size // max(1, self.local_world_size))


_LAUNCHED: contextvars.ContextVar[Launched | None] = contextvars.ContextVar(
    "accelperf_lightning_launched", default=None)


def launched() -> Launched | None:
    """The rank this training runs in, or None in one process."""
    return _LAUNCHED.get()


@contextlib.contextmanager
def inside(rank: Launched) -> Iterator[Launched]:
    """Train the ``lightning`` backend's training in ``rank`` (see the module docstring)."""
    token = _LAUNCHED.set(rank)
    try:
        yield rank
    finally:
        _LAUNCHED.reset(token)


class CollectiveMode(TorchDispatchMode):  # type: ignore[no-untyped-call]  # untyped in torch
    """Counts each ``c10d`` collective dispatched while it is entered into ``comm``
    (which counts while a step of it is open: :meth:`CommCounter.step`)."""

    def __init__(self, comm: CommCounter) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # untyped in torch
        self.comm = comm

    def __torch_dispatch__(self, func: OpOverload[..., Any], types: object,
                           args: tuple[Untyped, ...] = (),
                           kwargs: Mapping[str, Untyped] | None = None) -> Untyped:
        if func.namespace == "c10d":
            kind = C10D_KINDS.get(func.overloadpacket.__name__)
            if kind is not None:
                name, position = kind
                payload = args[position] if position is not None and len(args) > position \
                    else None
                self.comm.add(name, payload_bytes(payload))
        return func(*args, **(kwargs or {}))


__all__ = ["C10D_KINDS", "CollectiveMode", "Launched", "inside", "launched"]


def one_device(case: Case, backend: str, ddp: str) -> None:
    """Refuse a case a torch trainer's process cannot train (``backend``: ``"a lightning"``,
    ``"an hf"``; ``ddp``: whose DDP it trains over ranks): more than one device, unless
    this is one of the case's launched ranks, or a reference run."""
    rank = launched()
    name = backend.split()[-1]
    if case.world_size > 1 and (rank is None or rank.world_size != case.world_size):
        raise ConfigError(f"{case.id}: {backend} case of world_size={case.world_size} "
                          f"trains {ddp} in the plugin's launched ranks "
                          f"(accelperf.train sends it there), not in one process")
    if case.n_devices != case.world_size:
        raise ConfigError(f"{case.id}: the {name} backend trains one device a process "
                          f"(mesh={case.mesh}): declare world_size for data parallelism")
    if case.reference:
        raise ConfigError(f"{case.id}: the {name} backend has no single-device reference "
                          f"run: drop reference=True")
