"""Framework-free helpers shared by the backends (importing this imports no ML framework)."""

from __future__ import annotations

import contextlib
import functools
import inspect
import math
import os
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from types import CodeType, FrameType, ModuleType, TracebackType
from typing import Any, TypeVar

import numpy as np

from pytest_accelperf.errors import UserError, shown, user_frame
from pytest_accelperf.records.fingerprint import LeafFingerprint, ParamsFingerprint
from pytest_accelperf.stats.units import round_sig

#: Values per leaf sampled into the numerics fingerprint.
N_SAMPLES = 16
#: Significant digits of the fingerprint's numbers.
FINGERPRINT_DIGITS = 7

#: Names of the plugin's own checks: a step metric may not take one (its check would be
#: confused with the built-in one in reports and in ``CaseResult.check``). One set for
#: every step API (JaxStep, TorchStep, RankStep). The metrics of the table of checks
#: (:data:`pytest_accelperf.checks.table.BUILTIN`), written out so that a rank process does
#: not import every check to read it; ``tests/unit/checks/test_table.py`` holds them equal.
RESERVED_METRICS = frozenset({"outcome", "throughput", "loss", "metrics", "input",
                              "input_wait", "trainer", "compile", "program", "memory",
                              "numerics", "reference", "max_batch", "scaling"})

def check_metric_keys(label: str, metrics: Mapping[Any, Any], loss: str, step_class: str,
                      not_scalar: Callable[[str, Any], str | None]) -> None:
    """The rules every step API's metrics dict keeps, a :class:`TaskError` naming the fix
    for the first broken: it holds the loss under ``loss`` (``step_class(..., loss=...)``
    renames it), its keys are ``str``, none names one of the plugin's own checks but the
    loss, and ``not_scalar(key, value)`` (the framework's word on a value that is not one
    scalar, or None) says nothing."""
    if loss not in metrics:
        have = ", ".join(repr(k) for k in metrics) or "none"
        raise TaskError(
            f"{label} returns no metric {loss!r} (metrics: {have}): return the loss "
            f"under {loss!r}, or name its key with {step_class}(..., loss='<key>')")
    for key, value in metrics.items():
        if not isinstance(key, str):
            raise TaskError(f"{label} returns a metric keyed {key!r}: keys must be str")
        why = not_scalar(key, value)
        if why:
            raise TaskError(why)
        if key != loss and key in RESERVED_METRICS:
            raise TaskError(
                f"{label} returns a metric named {key!r}, the name of one of the "
                f"plugin's own checks: rename it (e.g. 'train_{key}')")


#: Values of the projection drawn at a time (a large leaf is projected in chunks).
_CHUNK = 1 << 20


def _project(values: np.ndarray) -> float:
    """``<r, values>`` for the fixed direction ``r`` of a leaf of that size: standard normal
    values from a generator seeded by the size alone (every run and host draws the same
    ``r``), drawn in chunks so a large leaf needs no second copy of itself."""
    n = values.size
    rng = np.random.default_rng([0x5EED, n])
    total = 0.0
    for start in range(0, n, _CHUNK):
        chunk = values[start:start + _CHUNK]
        total += float(chunk @ rng.standard_normal(chunk.size))
    return total


V = TypeVar("V")


def with_state(params: Mapping[str, V],
               state: Mapping[str, V]) -> tuple[dict[str, V], list[str]]:
    """The flat ``params`` and the flat ``state`` beside them in one dict, and the names of
    the state's leaves in it: a state leaf keeps its path from the state's root
    (``batch_stats/BatchNorm_0/mean``, ``step``), or ``state/<path>`` should a parameter
    have that name (parameters are named from their own root, so both could be ``step``).

    >>> with_state({"w": 1, "step": 2}, {"step": 3, "count": 4})
    ({'w': 1, 'step': 2, 'state/step': 3, 'count': 4}, ['state/step', 'count'])
    """
    merged = dict(params)
    names: list[str] = []
    for path, value in state.items():
        name = path
        while name in merged:
            name = f"state/{name}"
        merged[name] = value
        names.append(name)
    return merged, names


def fingerprint(flat: Mapping[str, np.ndarray],
                state: Collection[str] = ()) -> ParamsFingerprint:
    """Per leaf: shape, dtype, RMS, 16 fixed samples and ``sketch``, rounded to 7
    significant digits; the leaves named in ``state`` (the training state beside the
    parameters: running statistics, step counters, a loss scale) are marked
    ``"state": True``, which the store keeps apart from the parameters
    (:func:`pytest_accelperf.records.fingerprint.compact`).

    ``sketch`` is ``c = <r, x> / ||x||``, the leaf ``x`` (flattened) projected on a fixed
    random direction ``r`` (:func:`_project`) over its norm (0 for a zero leaf): a
    number about N(0, 1) that moves with any change of the leaf's pattern the RMS cannot
    see (a sign flip, a permutation, one changed element anywhere, not just at a sampled
    position). The store keeps one number per leaf of this
    (:func:`pytest_accelperf.records.fingerprint.compact`); the samples are what blocks
    recorded before the compact form are checked with.
    """
    out: ParamsFingerprint = {}
    for key, arr in flat.items():
        values = np.asarray(arr, dtype=np.float64).ravel()
        n, k = values.size, min(N_SAMPLES, values.size)
        rms = float(np.sqrt(np.mean(np.square(values)))) if n else 0.0
        idx = (np.arange(k) * n) // k if k else np.zeros(0, dtype=int)  # evenly strided
        norm = rms * math.sqrt(n)
        sketch = _project(values) / norm if n and norm > 0 else 0.0
        leaf: LeafFingerprint = {
            "shape": [int(n) for n in arr.shape], "dtype": str(arr.dtype),
            "rms": round_sig(rms, FINGERPRINT_DIGITS),
            "sample": [round_sig(float(v), FINGERPRINT_DIGITS) for v in values[idx]],
            "sketch": round_sig(sketch, FINGERPRINT_DIGITS)}
        if key in state:
            leaf["state"] = True
        out[key] = leaf
    return out


#: Fault injection, for measuring the gate itself (``benchmarks/gate.py``): every measured
#: step is made longer by this fraction (``0.05``: 5 % slower), by spinning on the CPU
#: inside the step's timer, so a benchmark can ask "would the gate have caught this?".
INJECT_ENV = "ACCELPERF_INJECT_SLOWDOWN"


def injected_slowdown() -> float:
    """The fraction set in ``ACCELPERF_INJECT_SLOWDOWN`` (0 when unset).

    >>> os.environ[INJECT_ENV] = "0.05"; injected_slowdown(); del os.environ[INJECT_ENV]
    0.05
    """
    value = os.environ.get(INJECT_ENV, "").strip()
    if not value:
        return 0.0
    try:
        fraction = float(value)
    except ValueError:
        fraction = math.nan
    if not (math.isfinite(fraction) and 0 <= fraction <= 10):
        raise ValueError(f"{INJECT_ENV}={value!r}: expected a fraction between 0 and 10, "
                         f"e.g. 0.05 for steps 5 % slower; unset it to measure normally")
    return fraction


def stretch(t0: float, t1: float, fraction: float) -> float:
    """Spin until a step that ran from ``t0`` to ``t1`` has taken ``1 + fraction`` times
    as long; returns the new end time (``t1`` itself when ``fraction`` is 0)."""
    if fraction <= 0:
        return t1
    end = t0 + (t1 - t0) * (1 + fraction)
    now = time.perf_counter()
    while now < end:
        now = time.perf_counter()
    return now


def settled(idle: Callable[[], bool], within: float, poll: float = 0.01) -> bool:
    """Whether ``idle()`` is true within ``within`` seconds (asked every ``poll`` s): how a
    backend's ``settle`` waits for its devices after a case was interrupted mid-step (the
    JAX backend: a trivial computation on every device done; torch: the CUDA stream
    empty)."""
    deadline = time.monotonic() + within
    while not idle():
        if time.monotonic() > deadline:
            return False
        time.sleep(poll)
    return True


class Phases:
    """Wall seconds of the named phases of one in-process training, for
    ``Run.phases``: where a case's time goes besides its compile and its measured
    steps (``benchmarks/cost.py`` reads them). Timing marks only (``time.perf_counter``
    around each phase), nothing that changes what is measured.

    >>> phases = Phases()
    >>> with phases("build"):
    ...     pass
    >>> sorted(phases.record())
    ['build', 'total']
    """

    def __init__(self) -> None:
        self._started = time.perf_counter()
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        """Time the block as phase ``name`` (added to that phase's seconds so far)."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t0

    def record(self) -> dict[str, float]:
        """Each phase's seconds, and ``total``: the seconds since this clock was made."""
        return {**self.seconds, "total": time.perf_counter() - self._started}


class TaskError(UserError, ValueError):
    """A task the backend cannot train as written (a loss that is not a scalar, an axis
    name nothing binds, a step that returns the wrong thing). The message names the user's
    function, where it is defined, and what to change; the runner fails the test with the
    message alone, not a framework's traceback."""


def task_of(task: object, kind: type[V], backend: str) -> V:
    """``task``, where it is the ``kind`` of task the ``backend`` trains (a trainer's task,
    from ``pytest_accelperf.<backend>``); else a :class:`TaskError` naming both."""
    if isinstance(task, kind):
        return task
    raise TaskError(f"the {backend} backend trains a {kind.__name__} "
                    f"(pytest_accelperf.{backend}); got {type(task).__name__}")


def describe(fn: object) -> str:
    """How an error names a user's function: ``train_step (suites/flax/test_x.py:57)``.

    Sees through ``functools.partial``, bound methods and wrappers that set ``__wrapped__``
    (``jax.jit``, ``nnx.jit``, ``functools.wraps``).

    >>> def loss_fn(params, batch): ...
    >>> describe(functools.partial(loss_fn, batch=None)).split(" (")[0]
    'loss_fn'
    """
    target = fn
    for _ in range(8):
        if isinstance(target, functools.partial):
            target = target.func
        elif hasattr(target, "__wrapped__"):
            target = target.__wrapped__
        elif inspect.ismethod(target):
            target = target.__func__
        else:
            break
    name = getattr(target, "__qualname__", None) or getattr(target, "__name__", None)
    if name is None:
        name = type(target).__name__
    elif "<locals>" in name:  # a function defined in a function: its own name reads better
        name = getattr(target, "__name__", name)
    if not (callable(target) or isinstance(target, ModuleType | TracebackType | FrameType
                                                   | CodeType)):
        return str(name)  # what inspect refuses (with a TypeError): not code
    try:
        source = inspect.getsourcefile(target)
        line = inspect.getsourcelines(target)[1]
    except (TypeError, OSError):
        return str(name)
    return f"{name} ({shown(source)}:{line})" if source else str(name)


def first_line(exc: BaseException) -> str:
    """The first line of ``exc``'s message (its type's name when it has none)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def at_user_frame(exc: BaseException) -> str:
    """`` (at file:line)`` of the user's innermost frame in ``exc``'s traceback, or ``""``."""
    where = user_frame(exc)
    return f" (at {where})" if where else ""
