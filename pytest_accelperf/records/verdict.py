"""Verdicts, tolerances and the result of one check: the records every check gives and every
layer above reads (the checks themselves are :mod:`pytest_accelperf.checks`)."""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from enum import Enum
from typing import Any, TypedDict

from pytest_accelperf.records.jsonvalue import JSONValue
from pytest_accelperf.records.program import ProgramRecord
from pytest_accelperf.records.run import MemoryGrowth, OomRecord

#: What :func:`non_negative_number` accepts, in the words of its errors.
NON_NEGATIVE = "a finite number >= 0"


def non_negative_number(raw: object) -> float:
    """``raw`` as a finite float >= 0, else ValueError saying what was wrong.

    The one check behind every numeric setting: flags and ini values (strings),
    ``[tool.accelperf]`` values (TOML numbers) and a case's ``tolerances``. A boolean is
    refused (``true`` is not 1.0), and so are NaN (every comparison with it is false, so a
    NaN tolerance passes any change), infinities and negative numbers (a negative band
    fails every run).

    >>> non_negative_number("0.25"), non_negative_number(3)
    (0.25, 3.0)
    """
    if isinstance(raw, bool) or not isinstance(raw, str | numbers.Real):
        raise ValueError(f"expected {NON_NEGATIVE}, got {type(raw).__name__} {raw!r}")
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"expected {NON_NEGATIVE}, got {raw!r}") from None
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"expected {NON_NEGATIVE}, got {raw!r}")
    return value


class Verdict(str, Enum):
    """What a check concluded. Only ``REGRESSION`` fails the gate."""

    PASS = "pass"
    REGRESSION = "regression"
    IMPROVEMENT = "improvement"
    NEW = "new"
    INCONCLUSIVE = "inconclusive"
    INCOMPARABLE = "incomparable"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Tolerances:
    """Thresholds of the four checks; ``[tool.accelperf]`` sets defaults, a case overrides.

    ``throughput_tolerance``: relative change of the median step time that counts.
    ``loss_rtol``/``loss_atol``: the band around the baseline's loss at each checkpoint.
    ``memory_tolerance``: relative change of peak memory per device.
    ``numerics_rtol``/``numerics_atol``: parameters against the baseline's fingerprint.
    ``numerics_cross_rtol``/``numerics_cross_atol``: the same, when the baseline was recorded
    in another environment (another host CPU or framework version): kernels that vectorize
    or reduce differently give other roundings, which Adam amplifies to about a learning
    rate per step on near-zero gradients (measured: up to 1.9e-3 after 42 JAX steps and
    1.4e-4 after 22 torch steps, Intel Xeon against AMD EPYC). Defaults at seed 004's 5e-3.
    ``reference_rtol``/``reference_atol``: parameters against a single-device reference
    run (seed 004 uses ``atol=5e-3``).
    ``program_tolerance``: relative change of the program's FLOPs and bytes that counts
    (counts of collectives, callbacks, graphs and breaks are compared exactly); the
    compiler's numbers are the same on every run of unchanged code.
    ``compile_tolerance``: relative change of compile time (corrected for the machine's
    speed by the probe) that counts; PyTorch's CI gates compile latency at 1.15x on
    dedicated machines (set 0.15 there), while one compile on a shared 2-core runner moved
    from 288 ms to 778 ms on unchanged code under load: the default is 1.0 (twice as long).
    ``input_tolerance``: relative change of the median CPU time making a step's batch
    (:mod:`pytest_accelperf.checks.input`) that counts, where the change is at least 5 % of
    the step. CPU time of a thread is steadier than wall time, not exact: between processes
    of unchanged code on a shared 2-core machine under load, the median of 0.6-1.9 ms of
    batch work moved up to 1.33x (its wall time up to 7.7x); 0.25 gave 2 false alarms in
    112 pairs, 0.5 none, and a batch function twice as slow still fails
    (docs/measured.md).
    ``leak_bytes_per_step``: growth of live memory per measured step that is a leak.
    ``max_probe_spread``: the largest interquartile range over median of the drift probe
    (in this run or the baseline's) for which a compile-time change is judged: a compile
    is one sample, and beyond it the machine had no one speed to tell a slower compile
    from, so the compile time is ``inconclusive``. Throughput never reads the probe's
    spread as noise: above 0.25 (:data:`~pytest_accelperf.checks.throughput.MAX_PROBE_SPREAD`)
    the probe no longer corrects drift and raw step times are judged (a quiet 2-core machine
    still showed 0.25-0.34 on 3 of 45 cases, and Flax MNIST's short case 0.64-0.78 on an
    idle one). It is also the floor of the step-time criterion of contamination: a run
    whose step times' spread is past both it and three times the baseline's is not judged.
    ``max_step_spread``: the largest interquartile range over median of the measured step
    times that ``--accelperf-update`` and ``--accelperf-add-session`` store as a level
    without re-measuring; past it the case is re-measured (over twice the measured steps),
    and a recording that stays so is stored marked ``noisy`` (its throughput is
    ``inconclusive`` until re-recorded). The suite's quiet recordings on a 2-core machine
    span 0.06-0.36 (one pipeline case 1.04); the recording under contention this guards
    against showed 4.4.
    """

    throughput_tolerance: float = 0.10
    loss_rtol: float = 0.05
    loss_atol: float = 1e-3
    memory_tolerance: float = 0.10
    numerics_rtol: float = 1e-4
    numerics_atol: float = 1e-5
    numerics_cross_rtol: float = 1e-3
    numerics_cross_atol: float = 5e-3
    reference_rtol: float = 0.0
    reference_atol: float = 5e-3
    program_tolerance: float = 0.01
    compile_tolerance: float = 1.0
    input_tolerance: float = 0.5
    leak_bytes_per_step: float = 16384.0
    max_probe_spread: float = 0.5
    max_step_spread: float = 2.0

    def __post_init__(self) -> None:
        for f in fields(self):
            try:
                non_negative_number(getattr(self, f.name))
            except ValueError as exc:
                raise ValueError(f"tolerance {f.name}: {exc}") from None

    def merged(self, overrides: dict[str, float]) -> Tolerances:
        data = asdict(self)
        for key, value in overrides.items():
            try:
                data[key] = non_negative_number(value)
            except ValueError as exc:
                raise ValueError(f"tolerance {key}: {exc}") from None
        return Tolerances(**data)


class Compared(TypedDict, total=False):
    """A number of this run beside the baseline's (``n``, ``median_step_time``, ``final``
    with its ``band``, a device's peak with their ``ratio``)."""

    now: float | None
    baseline: float | None
    band: float
    ratio: float


class CountChange(TypedDict):
    """One count of the program that changed (``changes``, ``op_changes``)."""

    name: str
    baseline: float | None
    now: float | None


class ScalingRow(TypedDict):
    """One point of a scaling group (``points``)."""

    x: float
    throughput: float
    label: str
    efficiency: float
    noise: float


class ABSkipped(TypedDict):
    """Why a throughput check was not compared in A/B mode (``ab``)."""

    ref: str
    skipped: str


class ABBlocks(TypedDict):
    """The step times of each round of an A/B comparison, per revision (``blocks``)."""

    base: list[list[float]]
    head: list[list[float]]


class CheckData(TypedDict, total=False):
    """:attr:`CheckResult.data`: the numbers behind a verdict, each check writing the
    keys it has (all optional), shown in the reports as JSON and read by the judge, the
    suite verdict (:mod:`pytest_accelperf.checks.family`) and bisection."""

    # -- every check's tolerances
    tolerance: float
    rtol: float
    atol: float
    #: The framework versions that differ from the baseline's (``checks.apply``); in A/B
    #: mode, per side, the versions that differ between the revisions' environments.
    stack: list[str] | dict[str, dict[str, str]] | None
    #: How the run was compared: ``"ab"`` (A/B mode), ``"compact"`` (numerics).
    mode: str
    format: str
    #: A timing check's: the machine with no timing of its own in the baseline
    #: (``checks.apply``: ``new for this machine``).
    machine_new: str
    # -- outcome: the outcomes (``now`` and ``baseline``) or max batch's searches
    now: JSONValue
    baseline: JSONValue
    baseline_outcome: str
    message: str
    oom: OomRecord
    baseline_oom: OomRecord
    compile_only: str
    not_run: list[str]
    # -- convergence, metrics
    nan_step: int | None
    checkpoints: list[list[float]]
    steps: int
    baseline_steps: int
    step: float | None
    either_way: bool
    final: Compared
    scale: float
    # -- interval checks (throughput, input, input_wait, compile_time, A/B)
    ratio: float
    ci: list[float]
    ci_low: float
    ci_high: float
    mdc: float
    confidence: float
    measured_verdict: str
    contaminated: str | bool | None
    noisy_baseline: str | None
    probe_only: bool
    load: dict[str, float | int] | None
    drift_corrected: bool
    raw_ratio: float | None
    sessions: int
    session_sd: float | None
    session_outliers: list[int]
    n: Compared
    median_step_time: Compared
    #: A verdict confirmed by re-measuring (:mod:`pytest_accelperf.gate.judge`).
    confirmations: list[float | None]
    unconfirmed: list[float | None]
    remeasured: list[float | None]
    correction: str
    # -- A/B mode (:mod:`pytest_accelperf.ab.verdict`)
    ref: str
    #: The base revision a program was compared with, in A/B mode.
    against: str
    rounds: int
    block: int
    seconds: float
    first: list[str]
    max_foreign_load: float | None
    processes: int
    pairs: list[int]
    process_sd: float | None
    within_sd: float | None
    blocks: ABBlocks
    program_diff: list[str] | None
    base_env: str | None
    ab: ABSkipped
    # -- input, input_wait
    min_share: float
    share: float | None
    baseline_share: float | None
    input_bound_steps: int
    wall_median: float
    #: This run's input yardstick over the baseline's: what the input check corrected by.
    yardstick_ratio: float
    wait_median: float
    min_change_s: float
    # -- memory
    per_device: Mapping[str, float] | Mapping[str, Compared]
    source: str
    baseline_source: str
    devices: list[str]
    baseline_devices: list[str]
    device: str
    growth: MemoryGrowth
    leak: bool
    # -- numerics, reference
    leaves: int
    spread: dict[str, float]
    changes: list[str] | list[CountChange]
    new: list[str]
    max_abs: dict[str, float]
    worst: str
    failing: list[str]
    mismatched: int
    total: int
    moved: float
    # -- program
    program: ProgramRecord
    not_compared: str
    op_changes: list[CountChange]
    not_in_baseline: list[str]
    # -- scaling
    group: str
    exponent: float
    min_efficiency: float
    axis: str
    points: list[ScalingRow]
    bend_at: float


def count_changes(data: CheckData) -> list[CountChange]:
    """The program's counts that changed (``changes`` as the program check writes it; the
    numerics checks' ``changes`` are phrases)."""
    return [c for c in data.get("changes") or [] if not isinstance(c, str)]


@dataclass(frozen=True)
class CheckResult:
    """One metric of a run against its baseline.

    ``baseline`` and ``now`` are display numbers in ``unit``; ``change`` is relative
    (``now / baseline - 1``) where that is meaningful. ``detail`` says why, in words a
    reviewer can act on; ``data`` holds the numbers behind it (intervals, per-device values).

    Frozen: a check builds its result complete, and whatever changes a verdict afterwards
    (a confirmation, A/B mode) makes a new one (:func:`dataclasses.replace`).
    """

    metric: str
    verdict: Verdict
    detail: str
    baseline: float | None = None
    now: float | None = None
    unit: str = ""
    change: float | None = None
    data: CheckData = field(default_factory=lambda: CheckData())

    @property
    def failed(self) -> bool:
        return self.verdict is Verdict.REGRESSION

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["verdict"] = self.verdict.value
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CheckResult:
        data = dict(data)
        data["verdict"] = Verdict(data["verdict"])
        return cls(**data)
