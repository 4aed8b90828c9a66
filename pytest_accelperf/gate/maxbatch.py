"""The maximum-batch search: the largest batch of a case that fits in device memory.

Starting from a batch, the search doubles while the batch fits, then bisects between the
largest batch that fitted and the smallest that did not (halving first when the start does
not fit). Every candidate is a multiple of ``multiple_of`` (the world size, so each rank
gets a whole share). Whether a batch fits is the backend's answer (:meth:`Backend.fits`):
a compile and its memory analysis on JAX, a short counted run on torch and DeepSpeed,
against the device's capacity or the case's declared ``memory_capacity`` on CPU.

The result goes in the case's baseline block as ``max_batch``::

    {"value": 48, "capacity_bytes": 17179869184, "multiple_of": 2,
     "probes": [[8, true, 2.1e9], [16, true, 4.0e9], [32, true, 8.1e9], [64, false, 16.2e9],
                [48, true, 12.1e9], [56, false, 14.2e9], [52, false, 13.2e9], [50, false, ...]]}

and :mod:`pytest_accelperf.checks.max_batch` gates on it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from pytest_accelperf.backends.protocol import Fit
from pytest_accelperf.collect.cases import Case
from pytest_accelperf.records.section import made
from pytest_accelperf.store.block import MaxBatch, MaxBatchProbe

__all__ = ["MAX_PROBES", "MaxBatch", "search_max_batch"]

#: Candidates tried at most; doubling from 1 to 65536 and bisecting back takes ~33.
MAX_PROBES = 40


def search_max_batch(case: Case, fits: Callable[[Case], Fit], *, start: int | None = None,
                     limit: int = 1 << 16, multiple_of: int = 1) -> MaxBatch:
    """The largest batch ``b <= limit``, a multiple of ``multiple_of``, with
    ``fits(case with batch b).fits``, assuming that fitting is monotone in the batch.

    The result is the baseline block's ``max_batch`` section
    (:class:`pytest_accelperf.store.block.MaxBatch`, its one declaration, public as
    ``pytest_accelperf.MaxBatch``): ``value`` (None when not even ``multiple_of`` fits) and
    every candidate tried as ``(batch, fits, required_bytes)``; ``.to_json()`` is what
    ``Run.max_batch`` holds.

    >>> from pytest_accelperf.collect.cases import Case
    >>> found = search_max_batch(Case(backend="jax", batch=8),
    ...                          lambda c: Fit(c.batch * 100 <= 5000, c.batch * 100, 5000))
    >>> found.value, [b for b, _, _ in found.probes]
    (50, [8, 16, 32, 64, 48, 56, 52, 50, 51])
    """
    if multiple_of < 1 or limit < multiple_of:
        raise ValueError(f"need 1 <= multiple_of <= limit, got {multiple_of} and {limit}")
    step = multiple_of
    first = max(step, (start or case.batch) // step * step)
    first = min(first, limit // step * step)
    probes: list[MaxBatchProbe] = []
    capacity: list[int] = []  # the device's capacity, as the last answer that gave one said
    tried: dict[int, bool] = {}

    def found(value: int | None) -> MaxBatch:
        return made(MaxBatch, value=value, capacity_bytes=capacity[-1] if capacity else None,
                    multiple_of=step, limit=limit, probes=probes)

    def probe(batch: int) -> bool:
        if batch in tried:
            return tried[batch]
        if len(probes) >= MAX_PROBES:
            raise RuntimeError(f"max-batch search of {case.id} did not converge in "
                               f"{MAX_PROBES} candidates: {probes}")
        answer = fits(replace(case, batch=batch))
        if answer.capacity_bytes is not None:
            capacity.append(answer.capacity_bytes)
        probes.append((batch, answer.fits, answer.required_bytes))
        tried[batch] = answer.fits
        return answer.fits

    if probe(first):
        lo, hi = first, None
        while hi is None:
            nxt = min(lo * 2, limit // step * step)
            if nxt <= lo:
                return found(lo)  # the limit itself fits
            if probe(nxt):
                lo = nxt
            else:
                hi = nxt
    else:
        hi, lo_opt = first, None
        while lo_opt is None:
            nxt = hi // 2 // step * step
            if nxt < step:
                return found(None)  # not even one share per rank fits
            if probe(nxt):
                lo_opt = nxt
            else:
                hi = nxt
        lo = lo_opt
    # Invariant: lo fits, hi does not; both multiples of step.
    while hi - lo > step:
        mid = (lo + hi) // 2 // step * step
        if mid in (lo, hi):
            mid = lo + step
        if probe(mid):
            lo = mid
        else:
            hi = mid
    return found(lo)
