"""Counting the live tensor bytes of torch on a CPU: the one MemTracker the torch backend
and the ranks (DDP, DeepSpeed) count with, and how a device's total is read from it.

``torch.distributed._tools.mem_tracker.MemTracker`` sums the storage bytes of live tensors
(parameters, buffers, gradients, optimizer state, activations and temporaries) as a
dispatch mode sees them made and freed. After every op it also updates the peak of each
module it has seen (its per-module breakdown), a loop over all the model's modules per op:
a step costs O(ops * modules): 4 counted steps of the suites' two-block GPT took 12 times
as long as 4 eager steps, and more as a model grows. The plugin reads only the device
totals (the peak and the live bytes), so :func:`memory_tracker` keeps MemTracker's
accounting of storages whole (what is allocated, resized and freed, and when) and only
leaves the per-module peaks out: the totals are the same bytes
(``tests/unit/backends/torch/test_memory.py`` compares the two on a real model).
"""

from __future__ import annotations

import functools
from typing import Any

import torch

#: The private attributes the per-op peak update reads; a torch without them gets the stock
#: tracker (slower, the same totals).
_PEAK_STATE = ("_curr_mem_snap", "_peak_mem", "_peak_mem_snap", "_update_peak_stats")


@functools.cache
def _totals_only_class() -> type[Any]:
    from torch.distributed._tools.mem_tracker import MemTracker

    class TotalsTracker(MemTracker):  # type: ignore[no-untyped-call]
        """MemTracker whose per-op update keeps the device totals' peak, not each module's
        (the stock update's first loop): the same storage accounting, O(1) modules per op."""

        def _update_peak_stats(self, peak_state: Any) -> None:
            for dev, snap in self._curr_mem_snap.items():
                total = snap["Total"]
                if self._peak_mem.get(dev, 0) < total:
                    self._peak_mem[dev] = total
                    self._peak_mem_snap[dev] = dict(snap)  # str -> int: a full copy

    return TotalsTracker


def memory_tracker(*, per_module: bool = False) -> Any:
    """A MemTracker for the device totals (:func:`device_total`); ``per_module`` gives the
    stock one, which also keeps every module's peak."""
    from torch.distributed._tools.mem_tracker import MemTracker

    if per_module:
        return MemTracker()
    tracker = _totals_only_class()()
    return tracker if all(hasattr(tracker, name) for name in _PEAK_STATE) else MemTracker()


def device_total(tracker: Any, kind: str, device: torch.device) -> int | None:
    """The tracker's total bytes on ``device``'s type, ``kind`` ``"current"`` or
    ``"peak"``; None when it saw no tensor there."""
    snapshot = tracker.get_tracker_snapshot(kind)
    totals = [int(s.get("Total", sum(s.values()))) for dev, s in snapshot.items()
              if torch.device(dev).type == device.type]
    return max(totals) if totals else None


def reset_cuda_peak(device: torch.device) -> None:
    """Free the caching allocator's cached blocks and reset its peak for ``device``.

    torch raises ``RuntimeError: Invalid device argument`` when the peak of a device is
    reset before anything was allocated on it in this process (seen on torch 2.11+cu130,
    an H100: every torch case of the suites failed so as its first CUDA call); an empty
    tensor initializes the device's allocator first.
    """
    torch.empty(0, device=device)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
