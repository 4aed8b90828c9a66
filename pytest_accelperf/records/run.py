"""The run: what training one case yields, as plain data that round-trips through JSON."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Literal, TypedDict, Unpack

from pytest_accelperf.records.environment import Environment
from pytest_accelperf.records.fingerprint import ParamsFingerprint
from pytest_accelperf.records.jsonvalue import JSONValue
from pytest_accelperf.records.program import ProgramRecord
from pytest_accelperf.records.section import Int, NonNegative
from pytest_accelperf.stats.contention import Load

Outcome = Literal["ok", "oom", "nan", "error", "timeout"]
OUTCOMES: tuple[str, ...] = ("ok", "oom", "nan", "error", "timeout")


class OomRecord(TypedDict, total=False):
    """``Run.oom``: what a predicted or caught out-of-memory needed and had (the backend
    says what it knows: the JAX plan, the torch allocator, a rank's error)."""

    required_bytes: float
    capacity_bytes: float
    exceeded_by_bytes: float
    source: str
    rank: int
    step: int | None
    #: The compiler whose memory plan it is (JAX).
    planned_by: str


class MemoryGrowth(TypedDict):
    """``Run.memory_growth``: how live memory grew over the measured steps (bytes live
    after the warm-up and after the last measured step, and who counted them). Its one
    declaration: :class:`pytest_accelperf.store.block.Growth`, a block's
    ``memory.growth``, is made of these fields and their constraints."""

    bytes_per_step: float
    steps: Int
    after_warmup: NonNegative
    after_steps: NonNegative
    source: str


class Replay(TypedDict):
    """``Run.replay``: how far a replay of the same steps moved the parameters (JAX, on
    platforms whose arithmetic does not repeat exactly): the worst leaf's relative spread,
    and each leaf that moved."""

    steps: int
    spread: float
    leaf: str | None
    leaves: dict[str, float]


class RunDetails(TypedDict, total=False):
    """``Run.details``: what one backend, the cluster or a log reader notes about its own
    run, each under its own key (the report shows them as they are; few other modules read
    them). In a run's JSON they sit under ``"extra"``, where they were written before they
    were declared here: old reports and reports of this version have the same form."""

    # -- the trainers (lightning, hf, keras) -------------------------------------------------
    #: The settings the gate owns that differed from the user's, one line each.
    notes: list[str]
    #: Whether Keras compiled the train function with XLA (``jit_compile``).
    jit_compile: bool
    # -- JAX ----------------------------------------------------------------------------------
    #: What the devices execute per step, replicated work counted on every replica.
    hardware_flops_per_step: float
    #: The first lines the compiler wrote on stderr (a compile-only target).
    compiler_log: list[str]
    #: The compiler whose memory plan the run's memory is.
    planned_by: str
    #: The plan's parts in bytes per device (a compile-only target).
    memory_plan: dict[str, int]
    #: A device's runtime peak where this case raised it.
    runtime_peak: dict[str, int]
    #: Why the single-device reference did not run.
    reference: str
    #: The steps the reference and the case were compared after.
    reference_steps: int
    #: The processes of a multi-process JAX case.
    processes: int
    #: A pipeline case's stages, micro-batches and mesh.
    pipeline: dict[str, JSONValue]
    # -- torch: torch.compile, Neuron, DDP and DeepSpeed ranks ---------------------------------
    #: Why torch.compile recompiled.
    recompile_reasons: list[str]
    #: The XLA device kind a Neuron case ran on.
    device: str
    #: The steps at which a Neuron case recompiled its graph.
    recompiles: list[int]
    world_size: int
    grad_accum: int
    micro_batch: int
    #: What the run's loss is, over ranks and micro-batches.
    loss: str
    #: What the run's memory per rank counts.
    memory: str
    #: Rank 0's engine (``describe()``: DDP's or DeepSpeed's configuration).
    engine: Mapping[str, object]
    launch_seconds: float
    #: Seconds per phase of the launch (``backends.torch.processes.LaunchBreakdown``).
    timings: Mapping[str, object]
    #: Every rank's times, losses, memory and collectives (``RankSummary``).
    ranks: Sequence[Mapping[str, object]]
    #: How the collectives were counted.
    comm: Mapping[str, object]
    # -- the Ray cluster ------------------------------------------------------------------------
    #: The host a case ran on (``cluster.worker.HostInfo``), or its ranks' hosts and master.
    cluster: Mapping[str, object]
    # -- ingested logs (Cerebras, Hugging Face, Neuron) -------------------------------------------
    #: The log's section the run is, and the file and line it starts at.
    section: str
    source: str
    total_samples: int
    total_time: float
    global_rate: float | None
    rates: list[float]
    programming_time: float
    weights_time: float
    hf_metrics: dict[str, float]
    train_steps: int | None
    train_steps_estimate: list[float]
    eval_loss: float
    profile: dict[str, float]
    profile_dimensions: dict[str, str]
    profile_text: dict[str, str]
    mfu: float
    profile_step_time: float
    logical_neuroncores: int
    memory_by_usage: dict[str, dict[str, int]]


#: The keys of :class:`RunDetails`: read from a run's ``"extra"`` into ``Run.details``.
DETAIL_KEYS = RunDetails.__optional_keys__ | RunDetails.__required_keys__


#: Key of an explanation under ``"extra"`` in a run's JSON (``Run.explain``).
EXPLAIN_KEY = "explain"


class Explained(TypedDict):
    """``Run.explain``: what the profiler traced of a failed case
    (:func:`pytest_accelperf.gate.explain.explain`): ``path`` (the trace's directory, None
    when none was kept), ``steps`` traced, ``size`` in bytes (of the trace written, kept or
    not) and a one-line ``note`` for the failure message and the reports."""

    path: str | None
    steps: int
    size: int
    note: str


@dataclass(frozen=True)
class InputSeries:
    """The making of each measured step's batch, timed apart from the step
    (:mod:`pytest_accelperf.backends.measure.loop`): ``Run.inputs``, and what the loop
    appends to as it runs. Each series is one value per measured step (the yardstick's, per
    k-th) and empty where it was not counted; in a run's JSON each is its own key, the
    field's name after ``input_`` (:data:`INPUT_KEYS`), as before they were one record.

    The series are lists the loop appends to while it runs; a run's are not changed after.
    """

    #: CPU seconds of the thread that made the batch (the user's ``make_batch`` or data
    #: iterator and the host-side conversion, not the transfer to the device): what the
    #: ``input`` check judges (:mod:`pytest_accelperf.checks.input`). Work done in other
    #: processes or threads (a DataLoader's workers, tf.data's threads) is not in it: what
    #: the thread waited for them is in ``wall_times``, less this.
    times: list[float] = field(default_factory=list)
    #: Wall seconds of the same.
    wall_times: list[float] = field(default_factory=list)
    #: Seconds the thread was blocked in the same, neither on a CPU nor waiting for one
    #: (:mod:`pytest_accelperf.backends.measure.blocked`): what the ``input_wait`` check
    #: judges; empty where the kernel does not count its run-queue delay.
    blocked_times: list[float] = field(default_factory=list)
    #: Seconds the thread waited for a CPU in the same (its run-queue delay); empty where
    #: the kernel does not count it.
    queued_times: list[float] = field(default_factory=list)
    #: The thread's page faults in the same (:mod:`pytest_accelperf.backends.measure.faults`);
    #: empty where the platform does not count them per thread.
    faults: list[int] = field(default_factory=list)
    #: CPU seconds of the input yardstick (:mod:`pytest_accelperf.stats.yardstick`), a fixed
    #: piece of host work the same thread did right after, after every k-th measured step
    #: (:func:`pytest_accelperf.backends.measure.loop.yardstick_every`): what the input
    #: check corrects the CPU seconds by.
    yardstick_times: list[float] = field(default_factory=list)

    def to_json(self) -> dict[str, list[float] | list[int]]:
        """Each series under its key in a run's JSON (:data:`INPUT_KEYS`)."""
        return {key: list(getattr(self, name)) for name, key in INPUT_KEYS.items()}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> InputSeries:
        """The series a run's JSON holds under :data:`INPUT_KEYS` (a missing one: empty)."""
        return cls(**{name: list(data.get(key) or ()) for name, key in INPUT_KEYS.items()})

    @classmethod
    def joined(cls, series: Sequence[InputSeries]) -> InputSeries:
        """The series of several runs of one case, one after the other."""
        return cls(**{name: [x for s in series for x in getattr(s, name)]
                      for name in INPUT_KEYS})


#: The key of each :class:`InputSeries` field in a run's JSON, by field name.
INPUT_KEYS: dict[str, str] = {f.name: f"input_{f.name}" for f in fields(InputSeries)}


#: Marks a field of :class:`Run` whose JSON lives under ``"extra"`` (where it was written
#: before it was a field: old reports and reports of this version have the same form).
IN_EXTRA = "in_extra"


_EXTRA = {IN_EXTRA: True}


def extra_fields() -> tuple[str, ...]:
    """The fields of :class:`Run` kept under ``"extra"`` in its JSON (:data:`IN_EXTRA`)."""
    return tuple(f.name for f in fields(Run) if f.metadata.get(IN_EXTRA))


@dataclass(frozen=True)
class Run:
    """Device-synchronized measurements of one case.

    ``step_times`` are seconds per measured step, each step blocked until its outputs are
    ready; compile time is kept apart in ``compile_time``. ``losses`` holds the loss of
    every training step, warm-up included (``loss_steps`` gives their step numbers), and
    ``metrics`` the other scalars a training step returned (accuracy, gradient norm,
    learning rate), by name, one value per step of ``loss_steps``.
    ``memory_per_device`` maps a device label to its peak bytes; ``memory_source`` says
    whether the runtime counted it (``memory_stats``) or the compiler predicted it
    (``memory_analysis``). ``flops_per_step`` is summed over devices. When the case did
    not finish, ``outcome`` says why and ``message`` holds what was seen; a predicted
    out-of-memory carries ``oom = {"required_bytes", "capacity_bytes"}``.

    ``probe_times`` are the times of a fixed reference workload (``probe_kind`` names it)
    run right after each measured step (after every k-th, evenly, in a run of more than
    100: :func:`pytest_accelperf.backends.measure.loop.probe_every`), outside its timer: what the
    machine's speed was at that moment. The throughput check compares step times relative
    to them, which cancels drift that slows both (see
    :mod:`pytest_accelperf.checks.throughput`). ``max_batch`` is the result of a
    maximum-batch search (:mod:`pytest_accelperf.gate.maxbatch`), when the test ran one:
    the JSON of the block's ``max_batch`` (:class:`pytest_accelperf.store.block.MaxBatch`).

    ``program`` is what the step's compiled program does, read from the program, not timed
    (:func:`pytest_accelperf.records.program.program_record`: FLOPs, bytes, collectives, host
    callbacks, torch.compile's graphs and breaks). ``memory_growth`` is how live memory
    grew over the measured steps: ``{"bytes_per_step", "steps", "after_warmup",
    "after_steps", "source"}`` (bytes live after the warm-up and after the last measured
    step, and who counted them); the memory check judges a leak from it.

    ``inputs`` (:class:`InputSeries`) is the making of each measured step's batch, timed
    apart from the step: the CPU, wall, blocked and run-queue seconds of the thread that
    made it, its page faults, and the input yardstick's CPU seconds right after (the
    ``input`` and ``input_wait`` checks'). Empty where a backend does not time them apart
    (DDP and DeepSpeed ranks, whose batch preparation waits for the other ranks; Alpa,
    Neuron, ingested logs). In the JSON each series is a key of the run's own
    (``input_times``, ``input_wall_times``, ...: :data:`INPUT_KEYS`), as it always was.

    The fields after ``inputs`` are read by other modules than the one that
    writes them; their JSON is under ``"extra"`` (:data:`IN_EXTRA`), as it always was:
    ``compile_only`` (the compile-only target a run stood for, ``--accelperf-target``: no
    step executed), ``step_load`` and ``compile_load`` (what other processes used while the
    steps ran, while the step compiled: :class:`~pytest_accelperf.stats.contention.Load`),
    ``batch_time`` (wall seconds making the batches), ``warmup_step_times``,
    ``injected_slowdown`` (the test-only slowdown a run was timed with),
    ``compile_time_parts`` / ``compile_time_covers`` (what ``compile_time`` timed),
    ``trace_time``, ``phases`` (where the case's wall time went), ``trainer_times`` (per
    measured step of a trainer that owns its loop, the seconds outside the user's forward,
    backward and optimizer step: the ``trainer`` check's), ``replay``
    (:class:`Replay`) and ``explain`` (:class:`Explained`).

    ``details`` (:class:`RunDetails`) is what one backend, the cluster or a log reader
    notes about its own run (DeepSpeed's engine config, each rank's times, the compiler's
    log lines, a Neuron profile's metrics, a Cerebras log's phases, the cluster hosts),
    each key declared with its type; its JSON is under ``"extra"`` too. ``extra`` keeps
    only what none of these declares: keys a user's code added, or a newer version wrote.

    A run is frozen: a backend builds it through
    :class:`~pytest_accelperf.backends.measure.recording.RunBuilder`, the one place its
    fields are written; anything after that makes a new one (:func:`dataclasses.replace`).
    """

    case_id: str
    outcome: Outcome = "ok"
    message: str = ""
    samples_per_step: int = 0
    tokens_per_step: int | None = None
    n_devices: int = 1
    step_times: list[float] = field(default_factory=list)
    compile_time: float | None = None
    losses: list[float] = field(default_factory=list)
    loss_steps: list[int] = field(default_factory=list)
    metrics: dict[str, list[float]] = field(default_factory=dict)
    memory_per_device: dict[str, int] = field(default_factory=dict)
    memory_source: str = ""
    flops_per_step: float | None = None
    peak_flops_per_device: float | None = None
    params_fingerprint: ParamsFingerprint = field(default_factory=dict)
    oom: OomRecord | None = None
    nan_step: int | None = None
    environment: Environment = field(default_factory=lambda: Environment.from_json({}))
    extra: dict[str, JSONValue] = field(default_factory=dict)
    probe_times: list[float] = field(default_factory=list)
    probe_kind: str = ""
    #: The JSON of :class:`pytest_accelperf.store.block.MaxBatch`, its one declaration.
    max_batch: dict[str, JSONValue] | None = None
    program: ProgramRecord | None = None
    memory_growth: MemoryGrowth | None = None
    #: In the JSON, each series its own key (``input_times``, ...: :meth:`InputSeries.to_json`).
    inputs: InputSeries = field(default_factory=InputSeries)
    # -- under "extra" in the JSON ------------------------------------------------------------
    compile_only: str | None = field(default=None, metadata=_EXTRA)
    step_load: Load | None = field(default=None, metadata=_EXTRA)
    compile_load: Load | None = field(default=None, metadata=_EXTRA)
    batch_time: float | None = field(default=None, metadata=_EXTRA)
    warmup_step_times: list[float] | None = field(default=None, metadata=_EXTRA)
    injected_slowdown: float | None = field(default=None, metadata=_EXTRA)
    compile_time_parts: dict[str, float] | None = field(default=None, metadata=_EXTRA)
    compile_time_covers: str | None = field(default=None, metadata=_EXTRA)
    trace_time: float | None = field(default=None, metadata=_EXTRA)
    phases: dict[str, float] | None = field(default=None, metadata=_EXTRA)
    trainer_times: list[float] | None = field(default=None, metadata=_EXTRA)
    replay: Replay | None = field(default=None, metadata=_EXTRA)
    explain: Explained | None = field(default=None, metadata=_EXTRA)
    # -- also under "extra" in the JSON, each key its own -------------------------------------
    details: RunDetails = field(default_factory=lambda: RunDetails())

    # -- derived --------------------------------------------------------------------------
    @property
    def median_step_time(self) -> float | None:
        return statistics.median(self.step_times) if self.step_times else None

    @property
    def samples_per_second(self) -> float | None:
        med = self.median_step_time
        if not med or not self.samples_per_step:
            return None
        return self.samples_per_step / med

    @property
    def mfu(self) -> float | None:
        """Model FLOPs utilization: achieved FLOP/s over the devices' peak FLOP/s."""
        med = self.median_step_time
        if not med or not self.flops_per_step or not self.peak_flops_per_device:
            return None
        return self.flops_per_step / med / (self.peak_flops_per_device * self.n_devices)

    @property
    def hfu(self) -> float | None:
        """Hardware FLOPs utilization: what the devices executed (replicated work counted on
        every replica: ``program["hardware_flops"]``) per second over their peak."""
        med = self.median_step_time
        hardware = self.program.get("hardware_flops") if self.program else None
        if not med or not isinstance(hardware, int | float) or not self.peak_flops_per_device:
            return None
        return float(hardware) / med / (self.peak_flops_per_device * self.n_devices)

    @property
    def peak_memory(self) -> int | None:
        return max(self.memory_per_device.values()) if self.memory_per_device else None

    @property
    def final_loss(self) -> float | None:
        return self.losses[-1] if self.losses else None

    def noted(self, **details: Unpack[RunDetails]) -> Run:
        """This run with ``details`` added to its :attr:`details` (what a layer above the
        backend notes: the cluster's hosts, a pipeline's stages)."""
        return replace(self, details=RunDetails(**{**self.details, **details}))

    # -- serialization ----------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {}
        for name, value in asdict(self).items():  # the input series where ``inputs`` stands
            data.update(self.inputs.to_json() if name == "inputs" else {name: value})
        extra: dict[str, Any] = {}
        for name in extra_fields():
            value = data.pop(name)
            if value is not None:
                extra[name] = value
        for name in ("step_load", "compile_load"):
            load = getattr(self, name)
            if load is not None:
                extra[name] = load.to_json()
        data["extra"] = {**extra, **data.pop("details"), **data["extra"]}
        data["environment"] = self.environment.to_json()
        data["losses"] = [_json_float(x) for x in self.losses]
        data["metrics"] = {k: [_json_float(x) for x in v] for k, v in self.metrics.items()}
        data["derived"] = {
            "median_step_time": self.median_step_time,
            "samples_per_second": self.samples_per_second,
            "mfu": self.mfu,
            "hfu": self.hfu,
            "peak_memory": self.peak_memory,
        }
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Run:
        data = {k: v for k, v in data.items() if k != "derived"}
        data["losses"] = [float(x) if x is not None else math.nan for x in data.get("losses", [])]
        data["metrics"] = {str(k): [float(x) if x is not None else math.nan for x in v]
                           for k, v in (data.get("metrics") or {}).items()}
        extra = dict(data.get("extra") or {})
        for name in extra_fields():
            if name in extra and name not in data:
                data[name] = extra.pop(name)
        for name in ("step_load", "compile_load"):
            if isinstance(data.get(name), dict):
                data[name] = Load.from_json(data[name])
        data["details"] = {k: extra.pop(k) for k in list(extra) if k in DETAIL_KEYS}
        data["inputs"] = InputSeries.from_json(
            {key: data.pop(key) for key in INPUT_KEYS.values() if key in data})
        data["extra"] = extra
        data["environment"] = Environment.from_json(data.get("environment") or {})
        return cls(**data)


def _json_float(x: float) -> float | str:
    """JSON has no NaN/inf: keep them as strings so a report stays valid JSON."""
    if math.isfinite(x):
        return x
    return str(x)
