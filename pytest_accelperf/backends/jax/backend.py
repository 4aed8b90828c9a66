"""The JAX backend: AOT-compile a sharded train step, predict its memory, then time it.

What it trains is a :class:`~pytest_accelperf.backends.jax.step.JaxStep`: the user's own
``step(state, batch) -> (state, metrics)`` and its state (a :class:`JaxTask` and an
:func:`nnx_step` are built on it). One code path serves every case: no mesh is a one-device
mesh, so the single-device reference run of a sharded case is the same function called
with another mesh. The step is lowered on abstract values and compiled *before* any state
exists (:mod:`.jax.compile`, on the shardings of :mod:`.jax.sharding`), so a case that
cannot fit (seed 000's batch 4096 without a mesh) costs one compile and is recorded as a
predicted out-of-memory (:mod:`.jax.memory`) instead of allocating, or being killed by the
host. What the compiled step does (FLOPs, bytes, collectives, host callbacks) is read from
it into ``Run.program`` (:mod:`.jax.program`); the compile time counts the init's compile
with the step's; and the live arrays are counted after the warm-up and after the last
measured step (``Run.memory_growth``), so a step that keeps device memory shows it. Where
the case's time went is ``Run.phases`` (wall seconds: :meth:`JaxBackend._train`);
the drift probe is made once per device and kept for the session's later cases
(:func:`jax_probe`).
"""

from __future__ import annotations

import importlib.util
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from pytest_accelperf.backends.jax.compile import _compile, _is_oom, _OutOfMemory, _Program
from pytest_accelperf.backends.jax.hlo import program_of
from pytest_accelperf.backends.jax.memory import (
    _analysis_bytes,
    _capacity,
    _labels,
    _live_bytes,
    _oom_message,
    _oom_run,
    _predicted_oom,
    _runtime_peaks,
    planner,
)
from pytest_accelperf.backends.jax.step import JaxMetrics, JaxStep, as_step, check_batch
from pytest_accelperf.backends.jax.step import host_batch as as_host
from pytest_accelperf.backends.measure.common import Phases, fingerprint, settled, with_state
from pytest_accelperf.backends.measure.data import expect
from pytest_accelperf.backends.measure.loop import (
    LoopResult,
    StepFns,
    run_steps,
)
from pytest_accelperf.backends.measure.probe import PROBE_N, PROBE_REPS, Probe
from pytest_accelperf.backends.measure.recording import (
    RunBuilder,
    deadline_after,
)
from pytest_accelperf.backends.measure.stepper import BlockStepper
from pytest_accelperf.backends.protocol import Fit, Task, TrainResult
from pytest_accelperf.backends.types import Batch, Leaf, PyTree
from pytest_accelperf.collect.cases import Case
from pytest_accelperf.errors import ConfigError
from pytest_accelperf.provision.accel import Accelerator
from pytest_accelperf.provision.targets import not_run
from pytest_accelperf.records.program import ProgramRecord
from pytest_accelperf.records.reference import ReferenceParams
from pytest_accelperf.records.run import MemoryGrowth, Replay
from pytest_accelperf.records.verdict import Tolerances
from pytest_accelperf.stats.leaves import compare_leaf
from pytest_accelperf.stats.units import round_sig

# jax leaves these untyped; mypy --strict refuses untyped calls, so they go through Any.
_block_until_ready: Any = jax.block_until_ready
_device_put: Any = jax.device_put
_set_mesh: Any = jax.set_mesh


def _flat(tree: PyTree) -> dict[str, np.ndarray]:
    """``{"params/Block_0/Dense_0/kernel": host array}`` of a pytree (gathers shards)."""
    if jax.process_count() > 1:  # a case spanning processes: every process gathers
        from jax.experimental import multihost_utils

        tree = multihost_utils.process_allgather(tree, tiled=True)
    tree = jax.tree.map(_key_data, tree)
    leaves, _ = jax.tree_util.tree_flatten_with_path(jax.device_get(tree))
    return {jax.tree_util.keystr(path, simple=True, separator="/"): np.asarray(leaf)
            for path, leaf in leaves}


def _key_data(leaf: Leaf) -> Leaf:
    """A PRNG key array as its raw integers (numpy cannot hold a key), else the leaf."""
    dtype = getattr(leaf, "dtype", None)
    if dtype is not None and jnp.issubdtype(dtype, jax.dtypes.prng_key):
        return jax.random.key_data(leaf)
    return leaf


#: The probe made last on each device, by device: ``(n, reps, probe)`` (:func:`jax_probe`).
_PROBES: dict[jax.Device, tuple[int, int, Probe]] = {}


def jax_probe(device: jax.Device, n: int = PROBE_N, reps: int = PROBE_REPS) -> Probe:
    """The drift-cancelling reference workload (see :mod:`.probe`): ``reps`` float32
    ``n x n`` products, jitted, on ``device``, blocked until done.

    Made once per device and size and kept: the cases of a session after the first reuse
    its compiled program and its two matrices (512 KiB at n=256) instead of compiling it
    again (0.07 s), and the matrices are standard normal numbers from numpy's generator
    (seeded) rather than ``jax.random``'s, whose op-by-op programs cost a process's first
    probe 0.4 s more to compile (the product's time does not depend on the values)."""
    kept = _PROBES.get(device)
    if kept is not None and kept[:2] == (n, reps):
        return kept[2]
    rng = np.random.default_rng(0)
    a = jax.device_put(rng.standard_normal((n, n), np.float32), device)
    b = jax.device_put(rng.standard_normal((n, n), np.float32), device)

    def work(x: jax.Array, y: jax.Array) -> jax.Array:
        for _ in range(reps):
            x = jax.numpy.tanh(x @ y)
        return x

    fn = jax.jit(work)
    _block_until_ready(fn(a, b))  # compile outside any timing

    def run() -> None:
        _block_until_ready(fn(a, b))

    probe = Probe(f"jax-{device.platform}-matmul{n}x{reps}", run)
    _PROBES[device] = (n, reps, probe)
    return probe


def _step_fns(program: _Program,
              state: PyTree) -> tuple[StepFns[Batch, JaxMetrics], list[PyTree]]:
    """The compiled program as the measured-step loop runs it (:mod:`.loop`), from
    ``state``; the live state is ``holder[0]``."""
    holder = [state]

    def run(i: int, batch: Batch) -> JaxMetrics:
        metrics: JaxMetrics
        holder[0], metrics = program.compiled(holder[0], batch)
        # Block on every step: besides honest timing, XLA:CPU collectives across virtual
        # devices can deadlock when many unblocked steps are queued.
        _block_until_ready((holder[0], metrics))
        return metrics

    key = program.step.loss

    def read(metrics: JaxMetrics) -> tuple[float, dict[str, float]]:
        values = jax.device_get(metrics)
        return float(values[key]), {k: float(v) for k, v in values.items() if k != key}

    return StepFns(prepare=lambda i: _batch(program, i), run=run, read=read,
                   host=lambda i: _host(program, i),
                   put=lambda i, host: _put(program, i, host)), holder


def _init_state(program: _Program) -> tuple[PyTree, float]:
    """The step's initial state on the program's shardings: ``init`` compiled with them,
    or a ready state copied onto them (a copy: the donated state is never the user's);
    and the seconds spent lowering and compiling that (part of the run's compile time:
    the user waits for it). Compiled explicitly, then called: one compile; a second call
    reuses it (0 seconds)."""
    if program.fresh_state is not None:
        return program.fresh_state(), 0.0
    step = program.step
    if not callable(step.init):
        # A compiled copy: device_put(may_alias=False) still shares the buffer of a
        # replicated array's first shard, which the first step's donation would delete.
        copy = jax.jit(lambda state: jax.tree.map(jnp.copy, state),
                       out_shardings=program.state_shardings)
        t0 = time.perf_counter()
        compiled = copy.lower(step.init).compile()
        seconds = time.perf_counter() - t0
        program.fresh_state = lambda: compiled(step.init)
        return program.fresh_state(), seconds
    # Leaves only, put back into the compiled structure: an init that makes its static
    # parts afresh each call (a TrainState's tx = optax.adam(...) inside init) gives a
    # structure that compares unequal to the one compiled, with the same leaves.
    init = step.init
    treedef: Any = jax.tree.structure(program.state_shardings)
    key = jax.random.key(step.seed)
    with _set_mesh(program.mesh):
        make = jax.jit(lambda key: jax.tree.leaves(init(key)),
                       out_shardings=jax.tree.leaves(program.state_shardings))
        t0 = time.perf_counter()
        compiled = make.lower(key).compile()
        seconds = time.perf_counter() - t0
    program.fresh_state = lambda: treedef.unflatten(compiled(key))
    return program.fresh_state(), seconds


def _batch(program: _Program, i: int) -> PyTree:
    """Batch ``i`` on the program's shardings, transferred (outside any timer)."""
    return _put(program, i, _host(program, i))


def _host(program: _Program, i: int) -> PyTree:
    """Batch ``i`` on the host: what the user's ``make_batch`` (or data) gives, its torch
    or TensorFlow tensors as numpy arrays (the step's input time, :mod:`.loop`)."""
    return as_host(program.step.make_batch(i))


def _put(program: _Program, i: int, host: PyTree) -> PyTree:
    """``host``, batch ``i``, on the program's shardings, transferred; one whose shapes or
    dtypes are not those the step was compiled for is a :class:`TaskError` naming
    ``make_batch``, the step and the leaves that changed."""
    if program.batch_signature is not None:
        check_batch(program.step, i, program.batch_signature, host)
    batch = _device_put(host, program.batch_shardings)
    _block_until_ready(batch)
    return batch


class JaxStepper(BlockStepper[Batch, JaxMetrics]):
    """The compiled train step of a case, run on demand in blocks of steps: what the A/B
    comparison (:mod:`pytest_accelperf.ab`) alternates between two revisions. Steps
    are timed exactly as in a run (:class:`.measure.stepper.BlockStepper`)."""

    def __init__(self, case: Case, task: Task, accel: Accelerator) -> None:
        step = as_step(task)
        expect(step.make_batch, case.warmup + case.steps)  # data given as an iterable
        self._program = _compile(case, step, accel, case.mesh)
        fns, self._state = _step_fns(self._program, _init_state(self._program)[0])
        super().__init__(fns, case.warmup + case.steps)  # the batches a run would see

    @property
    def program(self) -> ProgramRecord:
        """The step's program record, for A/B mode's diff of the two revisions."""
        program = self._program
        return program_of(program.lowered, program.compiled, int(program.mesh.devices.size),
                          global_flops=program.global_flops)


@dataclass
class _Trained:
    """What :func:`_execute` gives back."""

    loop: LoopResult
    state: PyTree  #: the final state
    init_compile_time: float  #: seconds compiling ``init`` (:func:`_init_state`)
    #: ``Run.memory_growth``; None when the loop stopped before its last step.
    memory_growth: MemoryGrowth | None


def _execute(program: _Program, case: Case, probe: Probe | None = None,
             deadline: float | None = None) -> _Trained:
    """Initialize on the program's shardings and run warmup + measured steps in the
    measured-step loop (:func:`.loop.run_steps`); the result, the final state, the init's
    compile time, and how live memory grew over the measured steps.

    Live bytes (:func:`_live_bytes`) are read after the last warm-up step (before the first
    measured step without warm-up) and after the last measured step, outside the timer;
    the batch and the metrics of that step are left out of both readings, so the two
    count the same things (the state, and whatever the user's code kept)."""
    state, init_seconds = _init_state(program)
    fns, holder = _step_fns(program, state)
    del state  # donated by the first step: holder[0] is the live state
    current: list[PyTree] = [None]  # the batch of the step that ran last

    def prepare(i: int) -> PyTree:
        current[0] = None
        current[0] = fns.prepare(i)
        return current[0]

    def host(i: int) -> PyTree:
        return _host(program, i)

    def put(i: int, made: PyTree) -> PyTree:
        current[0] = _put(program, i, made)
        return current[0]

    readings: dict[str, int] = {}
    last = case.warmup + case.steps - 1

    def after_step(i: int, metrics: JaxMetrics, measured: bool) -> None:
        if i == case.warmup - 1:
            readings["after_warmup"] = _live_bytes((current[0], metrics))
        if i == last:
            readings["after_steps"] = _live_bytes((current[0], metrics))
        # Dropped here, not in ``host``: nothing of the last step is released inside the
        # input's window (the loop's own reference goes when the next batch is put). Freeing
        # a batch sharded over 8 virtual devices is XLA's work, not the batch function's:
        # 0.1-0.6 ms of CPU under load, measured.
        current[0] = None

    if case.warmup == 0:
        readings["after_warmup"] = _live_bytes(None)
    trained = run_steps(StepFns(prepare=prepare, run=fns.run, read=fns.read, sync=fns.sync,
                                sync_before=fns.sync_before, host=host, put=put),
                        warmup=case.warmup, steps=case.steps, probe=probe, deadline=deadline,
                        after_step=after_step)
    growth: MemoryGrowth | None = None
    if "after_warmup" in readings and "after_steps" in readings:
        before, after = readings["after_warmup"], readings["after_steps"]
        growth = {"bytes_per_step": (after - before) / case.steps, "steps": case.steps,
                  "after_warmup": before, "after_steps": after, "source": "live_arrays"}
    return _Trained(trained, holder[0], init_seconds, growth)


class JaxBackend:
    """Trains a :class:`JaxStep` (or a :class:`JaxTask`, or an :func:`nnx_step`) on a
    ``jax.sharding.Mesh`` of the case's shape."""

    name = "jax"

    def unavailable_reason(self) -> str | None:
        missing = [p for p in ("jax", "optax") if importlib.util.find_spec(p) is None]
        if missing:
            return (f"the jax backend needs {', '.join(missing)}: "
                    f"pip install 'pytest-accelperf[jax]'")
        return None

    def fits(self, case: Case, task: Task, accel: Accelerator, *,
             timeout: float | None = None) -> Fit:
        """Compile only: the planned bytes per device against the capacity (the smaller of
        the runtime's and ``case.memory_capacity``); a compile that itself runs out of
        memory does not fit."""
        capacity = _capacity(accel, case)
        if not capacity:
            raise ConfigError(f"{case.id}: no device capacity to search a maximum batch against; "
                             f"declare memory_capacity on the case")
        try:
            planned = _analysis_bytes(_compile(case, task, accel, case.mesh).compiled)
        except _OutOfMemory as exc:
            return Fit(False, None, int(capacity), str(exc).splitlines()[0])
        need = planned.get("required_bytes")
        if need is None:
            raise ConfigError(f"{case.id}: this runtime gives no memory analysis to search a "
                             f"maximum batch with")
        return Fit(need <= capacity, need, int(capacity), "memory_analysis per device")

    def settle(self, accel: Accelerator, within: float) -> bool:
        """After a case was interrupted mid-step: whether every device of this process
        finishes a trivial computation within ``within`` seconds. XLA cannot cancel a
        computation once dispatched; one of the interrupted case that is still running
        holds its device, and anything measured after it would wait behind it."""
        probes = [jax.device_put(np.zeros((), np.float32), d) + 1 for d in jax.local_devices()]
        return settled(lambda: all(p.is_ready() for p in probes), within)

    def stepper(self, case: Case, task: Task, accel: Accelerator) -> JaxStepper:
        """The case's compiled step, run in blocks (A/B comparison)."""
        return JaxStepper(case, task, accel)

    def train(self, case: Case, task: Task, accel: Accelerator, *,
              timeout: float | None = None) -> TrainResult:
        """Compile, predict memory, train and fingerprint the case (the module docstring);
        where its time went is ``Run.phases`` (:meth:`_train`)."""
        phases = Phases()
        draft = RunBuilder(case.id)
        result = self._train(case, task, accel, timeout, phases, draft)
        draft.phases(phases.record())
        result.run = draft.build()
        return result

    def _train(self, case: Case, task: Task, accel: Accelerator, timeout: float | None,
               phases: Phases, draft: RunBuilder) -> TrainResult:
        """:meth:`train`, timing its phases in ``phases``: ``build`` (the user's task as a
        step), ``compile`` (tracing and checking the step, then lowering and compiling it:
        ``Run.compile_time``'s step part is the latter), ``program`` (reading the program
        record and the memory analysis), ``probe`` (making the drift probe), ``train``
        (compiling the init, then the warm-up and measured steps with the drift probe after
        each), ``fingerprint``, ``reference`` (the single-device reference). The run is
        recorded in ``draft``."""
        with phases("build"):  # the user's task as a step (JaxTask.to_step)
            step = as_step(task)
        expect(step.make_batch, case.warmup + case.steps)  # data given as an iterable
        deadline = deadline_after(timeout)
        draft.declared(case, accel.peak_flops, n_devices=case.n_devices,
                       tokens_per_sample=step.tokens_per_sample)
        if accel.compile_only:  # every result of this case says what it did not measure
            draft.compile_only(accel.compile_only, not_run(accel.compile_only))
        try:
            with phases("compile"):  # tracing and checking the step, then compiling it
                program = _compile(case, step, accel, case.mesh)
        except _OutOfMemory as exc:
            return TrainResult(run=_oom_run(draft, str(exc), planner(accel)))
        mesh = program.mesh
        n_devices = int(mesh.devices.size)
        draft.devices(n_devices)
        draft.compiled(program.compile_time, parts={"step": program.compile_time},
                       load=program.compile_load, trace_time=program.trace_time)
        with phases("program"):
            record = program_of(program.lowered, program.compiled, n_devices,
                                global_flops=program.global_flops)
            planned = _analysis_bytes(program.compiled)
        hardware = record.get("hardware_flops")
        draft.counted(flops=record.get("flops") or hardware, program=record)
        if hardware is not None:
            draft.detail(hardware_flops_per_step=hardware)
        if planned:
            draft.memory({label: planned["required_bytes"] for label in _labels(mesh)},
                         "memory_analysis")
        capacity = _capacity(accel, case)
        oom = _predicted_oom(planned, capacity, planner(accel))
        if oom is not None:
            draft.failed("oom", _oom_message(oom), oom=oom)
            return TrainResult(run=draft.build())  # no parameter was ever allocated
        if accel.compile_only:
            # Compiled for devices that are not here: nothing runs. What the compiler said
            # on stderr is summarized in one line, kept off the terminal.
            if program.compiler_log:
                draft.detail(compiler_log=program.compiler_log[:20])
            # The plan's parts, and the compiler's own peak (XLA:TPU's, from its heap
            # simulation; the gate's figure stays the sum above, as on every platform).
            peak = getattr(program.compiled.memory_analysis(), "peak_memory_in_bytes", 0)
            draft.detail(planned_by=planner(accel),
                         memory_plan={**planned, "compiler_peak_bytes": int(peak)}
                         if peak else planned)
            return TrainResult(run=draft.build())

        peaks_before = _runtime_peaks(mesh)
        # This process's first device (with jax.distributed, others belong to other hosts).
        with phases("probe"):
            probe = jax_probe(next(d for d in mesh.devices.flat
                                   if d.process_index == jax.process_index()))
        try:
            with phases("train"):  # the init's compile, warm-up and measured steps
                executed = _execute(program, case, probe, deadline)
        except RuntimeError as exc:
            if _is_oom(exc):
                return TrainResult(run=_oom_run(draft, str(exc)))
            raise
        trained, final = executed.loop, executed.state
        draft.compiled(program.compile_time + executed.init_compile_time,
                       parts={"step": program.compile_time, "init": executed.init_compile_time})
        draft.memory_growth(executed.memory_growth)
        draft.loop(trained, probe)
        # The gate's figure stays the compiler's plan on every platform. GPU/TPU runtimes
        # also count a peak, but since the process started, with no reset: on an H100 every
        # case after a larger one read that one's peak (189.77 MiB for an MLP of 2 MiB).
        # Where this case raised the peak, the peak is its own and is recorded beside.
        after = _runtime_peaks(mesh)
        if after is not None and peaks_before is not None:
            draft.detail(runtime_peak={
                label: peak for label, peak, before
                in zip(_labels(mesh), after, peaks_before, strict=True) if peak > before})
        with phases("fingerprint"):  # the parameters and the state beside them
            params, state_names = _fingerprinted(step, final)
            draft.fingerprint(fingerprint(params, state_names))
        if (trained.nan_step is None and not trained.timed_out
                and _replayed_on(next(iter(mesh.devices.flat)).platform)):
            with phases("replay"):  # the same steps again: does the platform repeat them?
                draft.replay(_replay(program, len(trained.losses), params))
        # The final state goes back to the test; a case spanning processes holds shards
        # of it in each, and no process can hand it over whole.
        state = step.final_of(final) if jax.process_count() == 1 else None
        if draft.end(trained, timeout, case):  # a loss not finite, or the deadline
            return TrainResult(run=draft.build(), params=params, state=state)

        with phases("reference"):
            reference = (_reference(case, step, accel, capacity, draft, program)
                         if case.reference else None)
        return TrainResult(run=draft.build(), params=params, reference_params=reference,
                           state=state)


def _reference(case: Case, step: JaxStep, accel: Accelerator, capacity: int | None,
               draft: RunBuilder, program: _Program) -> ReferenceParams | None:
    """The single-device reference of a sharded case (seed 004), apart from the measured
    run: the same task, seed and batches compiled for ONE device, and both it and the
    case's own compiled ``program`` trained the same steps from a fresh initial state (the
    sharded program's compiled init is reused: no compile but the single-device
    program's). Their flat parameters and the state beside them after those steps are
    compared (:class:`ReferenceParams`), not the final ones: rounding differences between
    two correct programs grow with every step, a sharding bug shows from the first.
    Neither's times are recorded. When one device cannot hold the case, None, with the
    reason in the run's ``details["reference"]``.

    How many steps: at least ``case.reference_steps``, and on until the reference's
    parameters have moved from their initial values beyond the reference tolerance (the
    case's, else the default), at most :data:`REFERENCE_MAX_STEPS` (or
    ``reference_steps`` if more). Until they have, a program that updated nothing would
    match the reference: a schedule that warms up from learning rate 0 (Flax's ImageNet
    example) left the parameters where they started after the one step compared before,
    and the check passed with a largest |Δ| of 0 whatever the sharding did. Where they
    never moved, the check says so (``inconclusive``), from ``ReferenceParams.initial``."""
    least = case.reference_steps
    most = max(least, REFERENCE_MAX_STEPS)
    tol = Tolerances().merged(dict(case.tolerances))
    try:
        single = _compile(case, step, accel, None)
        oom = _predicted_oom(_analysis_bytes(single.compiled), capacity, planner(accel))
        if oom is not None:
            raise _OutOfMemory(_oom_message(oom))
        initial: dict[str, np.ndarray] = {}

        def moved(state: PyTree) -> bool:
            now = _flat(step.params_of(state))
            return any(compare_leaf(p, initial[p], now[p], rtol=tol.reference_rtol,
                                    atol=tol.reference_atol).mismatched
                       for p in now if p in initial)

        final, n = _train_steps(single, least, most, moved=moved, initial=initial)
        reference, state_names = _fingerprinted(step, final)
    except (_OutOfMemory, RuntimeError) as exc:
        if not isinstance(exc, _OutOfMemory) and not _is_oom(exc):
            raise
        draft.detail(reference=f"single-device reference not run: {exc}".splitlines()[0])
        return None
    compared, _ = _fingerprinted(step, _train_steps(program, n, n)[0])
    draft.detail(reference_steps=n)
    mesh = "x".join(str(size) for size in case.mesh) if case.mesh is not None else ""
    return ReferenceParams(reference, compared=compared, steps=n, mesh=mesh,
                           state=state_names, initial=initial, least=least)


#: The most steps the reference trains looking for the parameters to move (when
#: ``Case.reference_steps`` is fewer): a few more than an Adam step of 1e-3 per step needs
#: to move a parameter past the default tolerance of 5e-3, few enough that the rounding
#: differences of two correct programs stay far below it (4.2e-05 after 32 steps for the
#: CNN of tests/unit/backends/jax/test_reference_layout.py).
REFERENCE_MAX_STEPS = 16


def _train_steps(program: _Program, least: int, most: int,
                 moved: Callable[[PyTree], bool] | None = None,
                 initial: dict[str, np.ndarray] | None = None) -> tuple[PyTree, int]:
    """The state after ``least`` steps of ``program`` from its initial state on batches
    ``0, 1, ...`` (the first batches of a run), untimed, and on to ``most`` steps until
    ``moved(state)``; and the steps it took. ``initial`` is filled with the initial
    state's flat parameters (before the first step donates it)."""
    state, _ = _init_state(program)
    if initial is not None:
        initial.update(_flat(program.step.params_of(state)))
    fns, holder = _step_fns(program, state)
    del state  # donated by the first step: holder[0] is the live state
    for i in range(most):
        fns.run(i, fns.prepare(i))
        if i + 1 >= least and (moved is None or moved(holder[0])):
            return holder[0], i + 1
    return holder[0], most


#: Platforms whose programs need not repeat their arithmetic exactly: XLA:GPU reduces with
#: atomics (a bias's gradient summed over the batch), so two runs of one program from one
#: initial state differ in the last bits, and after a case's steps by more than the
#: numerics tolerance (on an H100, 6e-4 to 4.5e-3 in 2 of 31 leaves of the charlm MLP, and
#: a BatchNorm's running mean: 5 of 11 unchanged cases failed the check against their own
#: recording). On these, the training is replayed (:func:`_replay`). XLA:CPU and TPUs
#: repeat their programs exactly.
REPLAYED_PLATFORMS = frozenset({"gpu", "cuda", "rocm"})


def _replayed_on(platform: str) -> bool:
    return platform in REPLAYED_PLATFORMS


def _replay(program: _Program, steps: int, flat: Mapping[str, np.ndarray]) -> Replay:
    """The case's training replayed: the same ``steps`` steps of the same compiled program
    from the same initial state and batches, untimed, and its parameters and state against
    the run's (``flat``), leaf by leaf: ``spread``, the largest relative difference
    ``||run - replay|| / ||run||`` of a leaf (0 where the platform repeated the run
    exactly), ``leaf`` where it is, and each differing leaf's (``leaves``). Each leaf's
    norm is over all its elements, so one replay measures the spread well where a single
    number per leaf (the stored sketch) would not. The numerics check compares a run with
    its baseline at a relative tolerance no tighter than a multiple of each leaf's spread:
    two runs of unchanged code differ by as much
    (:func:`pytest_accelperf.checks.numerics.check_numerics`)."""
    again, _ = _fingerprinted(program.step, _train_steps(program, steps, steps)[0])
    spreads: dict[str, float] = {}
    for path, ran in flat.items():
        if path in again:
            a = np.asarray(ran, np.float64)
            norm = float(np.linalg.norm(a))
            diff = float(np.linalg.norm(a - np.asarray(again[path], np.float64)))
            spreads[path] = diff / norm if norm > 0 else (math.inf if diff else 0.0)
    worst = max(spreads, key=spreads.__getitem__, default="")
    return {"steps": steps, "spread": round_sig(spreads.get(worst, 0.0), 4),
            "leaf": worst or None,
            "leaves": {p: round_sig(d, 4) for p, d in sorted(spreads.items()) if d > 0}}


def _fingerprinted(step: JaxStep, state: PyTree) -> tuple[dict[str, np.ndarray], list[str]]:
    """The flat parameters of ``state`` and the state beside them (:meth:`JaxStep.beside_of`)
    in one dict, and the names of the state's leaves in it
    (:func:`~pytest_accelperf.backends.measure.common.with_state`)."""
    params = step.params_of(state)
    return with_state(_flat(params), _flat(step.beside_of(state, params)))


BACKEND = JaxBackend()

