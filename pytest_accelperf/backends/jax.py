"""The JAX backend: AOT-compile a sharded train step, predict its memory, then time it.

One code path serves every case: no mesh is a one-device mesh, so the single-device
reference run of a sharded case is the same function called with another mesh. The train
step is lowered on abstract values and compiled *before* any parameter exists, so a case
that cannot fit (seed 000's batch 4096 without a mesh) costs one compile and is recorded
as a predicted out-of-memory instead of allocating, or being killed by the host.
"""

from __future__ import annotations

import importlib.util
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import jax
import numpy as np
import optax
from jax.sharding import NamedSharding, PartitionSpec

from pytest_accelperf.accel import Accelerator
from pytest_accelperf.backends.base import Fit, TrainResult

# Re-exported: both lived here before the torch backend needed them without jax.
from pytest_accelperf.backends.common import N_SAMPLES as N_SAMPLES
from pytest_accelperf.backends.common import fingerprint as fingerprint
from pytest_accelperf.backends.common import injected_slowdown, stretch
from pytest_accelperf.backends.probe import PROBE_N, PROBE_REPS, Probe
from pytest_accelperf.cases import Case
from pytest_accelperf.report import progress
from pytest_accelperf.run import Run

PyTree = Any
# jax leaves these untyped; mypy --strict refuses untyped calls, so they go through Any.
P: Any = PartitionSpec
_ShapeDtypeStruct: Any = jax.ShapeDtypeStruct
_block_until_ready: Any = jax.block_until_ready
GIB = 2**30


@dataclass
class JaxTask:
    """What to train: a model, its data and its optimizer, independent of the mesh.

    ``make_batch(step)`` returns the *global* host batch of a step (leading dimension
    ``case.batch``), the same for a step whatever the mesh, so a sharded run and its
    single-device reference see identical data. ``param_specs`` maps the abstract params
    to a ``PartitionSpec`` pytree (None: replicate everything); axes a mesh lacks are
    dropped, so one spec serves the no-mesh case too.
    """

    init_params: Callable[[Any], PyTree]
    loss_fn: Callable[[PyTree, PyTree], Any]
    make_batch: Callable[[int], PyTree]
    optimizer: optax.GradientTransformation
    param_specs: Callable[[PyTree], PyTree] | None = None
    batch_spec: PartitionSpec = field(default_factory=lambda: P("data"))
    tokens_per_sample: int | None = None
    seed: int = 0


@dataclass
class _Program:
    """A compiled train step and the shardings its inputs must have."""

    mesh: Any
    param_shardings: PyTree
    opt_shardings: PyTree
    batch_sharding: NamedSharding
    compiled: Any
    compile_time: float


class _OutOfMemory(Exception):
    """XLA ran out of device memory (RESOURCE_EXHAUSTED) compiling or running."""


def _is_oom(exc: BaseException) -> bool:
    text = str(exc)
    return isinstance(exc, RuntimeError) and (
        "RESOURCE_EXHAUSTED" in text or "out of memory" in text.lower())


def _restrict(spec: Any, axes: tuple[str, ...]) -> Any:
    """``spec`` without the mesh axes this mesh lacks (``"model"`` on a one-device mesh)."""
    if spec is None:
        return P()
    out: list[Any] = []
    for entry in spec:
        if isinstance(entry, str):
            out.append(entry if entry in axes else None)
        elif isinstance(entry, tuple):
            kept = tuple(a for a in entry if a in axes)
            out.append(kept if kept else None)
        else:
            out.append(entry)  # None or P.UNCONSTRAINED
    return P(*out)


def _param_shardings(task: JaxTask, mesh: Any, abstract: PyTree) -> PyTree:
    """A NamedSharding per param leaf; specs may be a prefix of the params (or None)."""
    axes = tuple(mesh.axis_names)
    if task.param_specs is None:
        return jax.tree.map(lambda _: NamedSharding(mesh, P()), abstract)
    specs = task.param_specs(abstract)
    shardings = jax.tree.map(lambda s: NamedSharding(mesh, _restrict(s, axes)), specs,
                             is_leaf=lambda x: x is None or isinstance(x, P))
    # Broadcast a prefix tree of shardings over the full params tree.
    return jax.tree.map(lambda sh, sub: jax.tree.map(lambda _: sh, sub), shardings, abstract)


def _opt_shardings(optimizer: Any, mesh: Any, abstract_state: PyTree,
                   param_shardings: PyTree) -> PyTree:
    """Shardings of the optimizer state, derived without allocating it.

    Compiling ``optimizer.init`` and reading ``output_shardings`` does not work: adam's
    moments are ``zeros_like(params)``, which does not depend on the params' values, so
    XLA drops the (sharded) inputs and reports single-device outputs. Instead optax's
    ``tree_map_params`` finds the param-shaped subtrees of the state (moments get their
    param's sharding); everything else (step counts) is replicated.
    """
    replicated = NamedSharding(mesh, P())
    try:
        return optax.tree_utils.tree_map_params(
            optimizer, lambda _, sh: sh, abstract_state, param_shardings,
            transform_non_params=lambda _: replicated)
    except Exception:  # an optimizer whose init cannot take optax's placeholder
        return jax.tree.map(lambda _: replicated, abstract_state)


def _with_sharding(abstract: PyTree, shardings: PyTree) -> PyTree:
    return jax.tree.map(lambda a, s: _ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                        abstract, shardings)


def _compile(case: Case, task: JaxTask, accel: Accelerator,
             shape: tuple[int, ...] | None) -> _Program:
    """Lower and compile the train step of ``task`` on a mesh of ``shape``; no allocation."""
    mesh = accel.mesh(shape, case.axis_names)
    abstract_params = jax.eval_shape(task.init_params, jax.random.key(task.seed))
    abstract_state = jax.eval_shape(task.optimizer.init, abstract_params)
    p_sh = _param_shardings(task, mesh, abstract_params)
    o_sh = _opt_shardings(task.optimizer, mesh, abstract_state, p_sh)
    b_sh = NamedSharding(mesh, _restrict(task.batch_spec, tuple(mesh.axis_names)))
    host_batch = task.make_batch(0)  # only its shapes: batches are deterministic per step
    abstract_batch = jax.tree.map(
        lambda x: _ShapeDtypeStruct(np.shape(x), np.asarray(x).dtype, sharding=b_sh),
        host_batch)
    optimizer, loss_fn = task.optimizer, task.loss_fn

    def step(params: PyTree, opt_state: PyTree, batch: PyTree) -> tuple[PyTree, PyTree, Any]:
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    jitted = jax.jit(step, in_shardings=(p_sh, o_sh, b_sh),
                     out_shardings=(p_sh, o_sh, NamedSharding(mesh, P())),
                     donate_argnums=(0, 1))  # params/opt state updated in place
    t0 = time.perf_counter()
    try:
        compiled = jitted.lower(_with_sharding(abstract_params, p_sh),
                                _with_sharding(abstract_state, o_sh), abstract_batch).compile()
    except RuntimeError as exc:
        if _is_oom(exc):
            raise _OutOfMemory(str(exc)) from exc
        raise
    return _Program(mesh, p_sh, o_sh, b_sh, compiled, time.perf_counter() - t0)


def _analysis_bytes(compiled: Any) -> dict[str, int]:
    """Per-device bytes the compiler plans for one step.

    ``peak_memory_in_bytes`` omits temporaries on CPU, so the total is computed:
    arguments + outputs + temporaries - what donation aliases (counted in both).
    """
    ma = compiled.memory_analysis()
    if ma is None:
        return {}
    parts = {
        "argument_bytes": int(ma.argument_size_in_bytes),
        "output_bytes": int(ma.output_size_in_bytes),
        "temp_bytes": int(ma.temp_size_in_bytes),
        "alias_bytes": int(ma.alias_size_in_bytes),
    }
    parts["required_bytes"] = (parts["argument_bytes"] + parts["output_bytes"]
                               + parts["temp_bytes"] - parts["alias_bytes"])
    return parts


def _flops(compiled: Any, n_devices: int) -> float | None:
    """FLOPs of one step over all devices (``cost_analysis`` counts one device's program)."""
    cost = compiled.cost_analysis()
    if isinstance(cost, list | tuple):  # older jax: one dict per program
        cost = cost[0] if cost else None
    if not cost or "flops" not in cost:
        return None
    flops = float(cost["flops"])
    return flops * n_devices if flops > 0 else None


def predict_memory(case: Case, task: JaxTask, accel: Accelerator) -> dict[str, int]:
    """Compile ``task`` as ``case`` and return the planned per-device bytes.

    Keys: ``argument_bytes``, ``output_bytes``, ``temp_bytes``, ``alias_bytes`` and their
    total ``required_bytes``. Nothing is allocated: only a compile runs.
    """
    return _analysis_bytes(_compile(case, task, accel, case.mesh).compiled)


def _gib(n: float) -> str:
    return f"{n / GIB:.2f} GiB"


def _labels(mesh: Any) -> list[str]:
    return [f"{d.platform}:{d.id}" for d in mesh.devices.flat]


def _flat(tree: PyTree) -> dict[str, np.ndarray]:
    """``{"params/Block_0/Dense_0/kernel": host array}`` of a pytree (gathers shards)."""
    if jax.process_count() > 1:  # a case spanning processes: every process gathers
        from jax.experimental import multihost_utils

        tree = multihost_utils.process_allgather(tree, tiled=True)
    leaves, _ = jax.tree_util.tree_flatten_with_path(jax.device_get(tree))
    return {jax.tree_util.keystr(path, simple=True, separator="/"): np.asarray(leaf)
            for path, leaf in leaves}


def jax_probe(device: Any, n: int = PROBE_N, reps: int = PROBE_REPS) -> Probe:
    """The drift-cancelling reference workload (see :mod:`.probe`): ``reps`` float32
    ``n x n`` products, jitted, on ``device``, blocked until done."""
    key_a, key_b = jax.random.split(jax.random.key(0))
    a = jax.device_put(jax.random.normal(key_a, (n, n), np.float32), device)
    b = jax.device_put(jax.random.normal(key_b, (n, n), np.float32), device)

    def work(x: Any, y: Any) -> Any:
        for _ in range(reps):
            x = jax.numpy.tanh(x @ y)
        return x

    fn = jax.jit(work)
    _block_until_ready(fn(a, b))  # compile outside any timing

    def run() -> None:
        _block_until_ready(fn(a, b))

    return Probe(f"jax-{device.platform}-matmul{n}x{reps}", run)


@dataclass
class _Trained:
    params: PyTree
    losses: list[float]
    step_times: list[float]
    probe_times: list[float] = field(default_factory=list)
    nan_step: int | None = None
    timed_out: bool = False


def _timed_step(program: _Program, params: PyTree, opt_state: PyTree, batch: PyTree,
                slower: float) -> tuple[PyTree, PyTree, Any, float]:
    """One step of the compiled program, timed and synchronized: (params, opt_state, loss,
    seconds)."""
    t0 = time.perf_counter()
    params, opt_state, loss = program.compiled(params, opt_state, batch)
    # Block on every step: besides honest timing, XLA:CPU collectives across virtual
    # devices can deadlock when many unblocked steps are queued.
    _block_until_ready((params, opt_state, loss))
    return params, opt_state, loss, stretch(t0, time.perf_counter(), slower) - t0


def _init_state(program: _Program, task: JaxTask) -> tuple[PyTree, PyTree]:
    params = jax.jit(task.init_params, out_shardings=program.param_shardings)(
        jax.random.key(task.seed))
    opt_state = jax.jit(task.optimizer.init, out_shardings=program.opt_shardings)(params)
    return params, opt_state


class JaxStepper:
    """The compiled train step of a case, run on demand in blocks of steps: what the A/B
    comparison (:mod:`pytest_accelperf.compare`) alternates between two revisions. Steps
    are timed exactly as in a run (:func:`_timed_step`)."""

    def __init__(self, case: Case, task: JaxTask, accel: Accelerator) -> None:
        self._program = _compile(case, task, accel, case.mesh)
        self._task = task
        self._cycle = max(1, case.warmup + case.steps)  # the batches a run would see
        self._params, self._opt_state = _init_state(self._program, task)
        self._step = 0
        self._slower = injected_slowdown()

    def run(self, n: int) -> list[float]:
        """Train ``n`` more steps; their step times in seconds."""
        times = []
        for _ in range(n):
            batch = jax.device_put(self._task.make_batch(self._step % self._cycle),
                                   self._program.batch_sharding)
            _block_until_ready(batch)
            self._params, self._opt_state, _, seconds = _timed_step(
                self._program, self._params, self._opt_state, batch, self._slower)
            times.append(seconds)
            self._step += 1
        return times


def _execute(program: _Program, case: Case, task: JaxTask, probe: Probe | None = None,
             deadline: float | None = None) -> _Trained:
    """Initialize on the program's shardings and run warmup + measured steps.

    After each measured step (outside its timer) ``probe`` runs and is timed; past
    ``deadline`` (``time.monotonic()``) the run stops at the next step boundary.
    """
    params, opt_state = _init_state(program, task)
    out = _Trained(params=None, losses=[], step_times=[])
    slower = injected_slowdown()  # 0 unless a gate benchmark injects a slowdown
    for i in range(case.warmup + case.steps):
        # Transfer outside the timer: the step time is device work, not host->device copy.
        batch = jax.device_put(task.make_batch(i), program.batch_sharding)
        _block_until_ready(batch)
        params, opt_state, loss, seconds = _timed_step(program, params, opt_state, batch,
                                                       slower)
        value = float(loss)
        out.losses.append(value)
        if i >= case.warmup:
            out.step_times.append(seconds)
            if probe is not None:
                out.probe_times.append(probe.time())
        progress.step(i + 1, case.warmup + case.steps, value, seconds)  # outside the timer
        if not math.isfinite(value):
            out.nan_step = i
            break
        if deadline is not None and time.monotonic() > deadline:
            out.timed_out = True
            break
    out.params = params
    return out


class JaxBackend:
    """Trains a :class:`JaxTask` on a ``jax.sharding.Mesh`` of the case's shape."""

    name = "jax"

    def unavailable_reason(self) -> str | None:
        missing = [p for p in ("jax", "flax", "optax") if importlib.util.find_spec(p) is None]
        if missing:
            return (f"the jax backend needs {', '.join(missing)}: "
                    f"pip install 'pytest-accelperf[jax]'")
        return None

    def fits(self, case: Case, task: JaxTask, accel: Accelerator, *,
             timeout: float | None = None) -> Fit:
        """Compile only: the planned bytes per device against the capacity (the runtime's,
        or ``case.memory_capacity``); a compile that itself runs out of memory does not fit."""
        capacity = accel.memory_capacity or case.memory_capacity
        if not capacity:
            raise ValueError(f"{case.id}: no device capacity to search a maximum batch against; "
                             f"declare memory_capacity on the case")
        try:
            planned = _analysis_bytes(_compile(case, task, accel, case.mesh).compiled)
        except _OutOfMemory as exc:
            return Fit(False, None, int(capacity), str(exc).splitlines()[0])
        need = planned.get("required_bytes")
        if need is None:
            raise ValueError(f"{case.id}: this runtime gives no memory analysis to search a "
                             f"maximum batch with")
        return Fit(need <= capacity, need, int(capacity), "memory_analysis per device")

    def settle(self, accel: Accelerator, within: float) -> bool:
        """After a case was interrupted mid-step: whether every device of this process
        finishes a trivial computation within ``within`` seconds. XLA cannot cancel a
        computation once dispatched; one of the interrupted case that is still running
        holds its device, and anything measured after it would wait behind it."""
        deadline = time.monotonic() + within
        probes = [jax.device_put(np.zeros((), np.float32), d) + 1 for d in jax.local_devices()]
        while not all(p.is_ready() for p in probes):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True

    def stepper(self, case: Case, task: JaxTask, accel: Accelerator) -> JaxStepper:
        """The case's compiled step, run in blocks (A/B comparison)."""
        return JaxStepper(case, task, accel)

    def train(self, case: Case, task: JaxTask, accel: Accelerator, *,
              timeout: float | None = None) -> TrainResult:
        if case.world_size > 1 and jax.process_count() == 1:
            # A case spanning processes, launched here (inside them process_count > 1).
            from pytest_accelperf.backends.jax_multihost import train_processes

            return train_processes(case, task, accel, timeout=timeout)
        deadline = time.monotonic() + timeout if timeout else None
        run = Run(case_id=case.id, samples_per_step=case.batch,
                  tokens_per_step=(case.batch * task.tokens_per_sample
                                   if task.tokens_per_sample else None),
                  n_devices=case.n_devices, peak_flops_per_device=accel.peak_flops)
        try:
            program = _compile(case, task, accel, case.mesh)
        except _OutOfMemory as exc:
            return TrainResult(run=_oom_run(run, str(exc)))
        mesh = program.mesh
        run.n_devices = int(mesh.devices.size)
        run.compile_time = program.compile_time
        run.flops_per_step = _flops(program.compiled, run.n_devices)
        planned = _analysis_bytes(program.compiled)
        if planned:
            run.memory_per_device = {label: planned["required_bytes"] for label in _labels(mesh)}
            run.memory_source = "memory_analysis"
        capacity = accel.memory_capacity or case.memory_capacity
        oom = _predicted_oom(planned, capacity)
        if oom is not None:
            run.outcome, run.oom = "oom", oom
            run.message = _oom_message(oom)
            return TrainResult(run=run)  # no parameter was ever allocated

        # This process's first device (with jax.distributed, others belong to other hosts).
        probe = jax_probe(next(d for d in mesh.devices.flat
                               if d.process_index == jax.process_index()))
        try:
            trained = _execute(program, case, task, probe, deadline)
        except RuntimeError as exc:
            if _is_oom(exc):
                return TrainResult(run=_oom_run(run, str(exc)))
            raise
        run.losses = trained.losses
        run.loss_steps = list(range(len(trained.losses)))
        run.step_times = trained.step_times
        run.probe_times, run.probe_kind = trained.probe_times, probe.kind
        # GPU/TPU runtimes count the real peak (since process start: an earlier, larger
        # case in the same process raises it); XLA:CPU has no counter, so the plan stays.
        here = jax.process_index()  # other hosts' devices have no counter in this process
        stats: list[Any] = [d.memory_stats() if d.process_index == here else None
                            for d in mesh.devices.flat]
        if all(s and "peak_bytes_in_use" in s for s in stats):
            run.memory_per_device = {label: int(s["peak_bytes_in_use"])
                                     for label, s in zip(_labels(mesh), stats, strict=True)}
            run.memory_source = "memory_stats"
        params = _flat(trained.params)
        run.params_fingerprint = fingerprint(params)
        if trained.nan_step is not None:
            run.outcome = "nan"
            run.nan_step = trained.nan_step
            run.message = f"loss is {trained.losses[-1]} at step {trained.nan_step}"
            return TrainResult(run=run, params=params)
        if trained.timed_out:
            run.outcome = "timeout"
            run.message = (f"exceeded the {timeout:g} s timeout after {len(trained.losses)} of "
                           f"{case.warmup + case.steps} steps (raise --accelperf-timeout, or "
                           f"give the case fewer steps)")
            return TrainResult(run=run, params=params)

        reference = _reference(case, task, accel, capacity, run) if case.reference else None
        return TrainResult(run=run, params=params, reference_params=reference)


def _reference(case: Case, task: JaxTask, accel: Accelerator, capacity: int | None,
               run: Run) -> dict[str, np.ndarray] | None:
    """Flat params of the same task, seed, batches and step count on ONE device: the
    ground truth a sharded run must match (seed 004). Its times are not recorded. When
    one device cannot hold the case, None, with the reason in ``run.extra["reference"]``.
    """
    try:
        program = _compile(case, task, accel, None)
        oom = _predicted_oom(_analysis_bytes(program.compiled), capacity)
        if oom is not None:
            raise _OutOfMemory(_oom_message(oom))
        return _flat(_execute(program, case, task).params)
    except (_OutOfMemory, RuntimeError) as exc:
        if not isinstance(exc, _OutOfMemory) and not _is_oom(exc):
            raise
        run.extra["reference"] = f"single-device reference not run: {exc}".splitlines()[0]
        return None


def _predicted_oom(planned: dict[str, int], capacity: int | None) -> dict[str, Any] | None:
    """The ``Run.oom`` record when the planned bytes exceed the capacity, else None."""
    if not planned or not capacity or planned["required_bytes"] <= capacity:
        return None
    need = planned["required_bytes"]
    return {"required_bytes": need, "capacity_bytes": int(capacity),
            "exceeded_by_bytes": need - int(capacity), "source": "memory_analysis"}


def _oom_message(oom: dict[str, Any]) -> str:
    return (f"predicted out of memory: program needs {_gib(oom['required_bytes'])} per device "
            f"of {_gib(oom['capacity_bytes'])} capacity "
            f"(exceeded by {_gib(oom['exceeded_by_bytes'])})")


def _oom_run(run: Run, message: str) -> Run:
    run.outcome = "oom"
    run.message = f"out of memory: {message.splitlines()[0] if message else 'RESOURCE_EXHAUSTED'}"
    return run


BACKEND = JaxBackend()
