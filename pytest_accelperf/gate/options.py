"""Options: one table, three sources.

Every setting has a command-line flag (``--accelperf-...``, or ``--accel``), an ini key
(``accelperf_...`` in pytest.ini / tox.ini / ``[tool.pytest.ini_options]``) and a key in
``[tool.accelperf]`` of the rootdir's ``pyproject.toml``. Precedence: flag, then ini, then
``[tool.accelperf]``, then the default. The table is plain data so that a standalone CLI can
reuse it.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, TypeAlias

from pytest_accelperf.checks.throughput import MAX_PROBE_SPREAD
from pytest_accelperf.errors import ConfigError
from pytest_accelperf.provision.accel import ACCELS
from pytest_accelperf.provision.targets import check_target
from pytest_accelperf.records.verdict import NON_NEGATIVE, Tolerances, non_negative_number
from pytest_accelperf.stats.bootstrap import MAX_PAIRS, MIN_SAMPLES
from pytest_accelperf.store.baselines import BaselineError, validate_platform
from pytest_accelperf.store.machines import MachineError, validate_machine

if TYPE_CHECKING:
    import pytest

# pytest is imported by the functions that raise its UsageError, not here: the
# ``accelperf`` command reads the store's directory through this table
# (:func:`read_table`) without pytest's start-up.

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


#: An option's value once read and checked: a choice, path or text as a string, a count, a
#: number, a switch; None where no source gives it.
OptionValue: TypeAlias = str | int | float | bool | None


class OptionValues(dict[str, OptionValue]):
    """Every option's value by key, with accessors for the type each kind converts to (a
    wrong type is a bug of the table, raised as the conversion itself would raise it)."""

    def text(self, key: str) -> str | None:
        value = self[key]
        return None if value is None else str(value)

    def string(self, key: str) -> str:
        value = self[key]
        if value is None:
            raise TypeError(f"option {key} has no value")
        return str(value)

    def number(self, key: str) -> float:
        return _number(key, self[key])

    def integer(self, key: str) -> int:
        value = self[key]
        if isinstance(value, int):
            return value
        raise TypeError(f"option {key}: {value!r} is not an integer")


def _number(key: str, value: OptionValue) -> float:
    if isinstance(value, int | float):
        return value
    if isinstance(value, str):
        return float(value)
    raise TypeError(f"option {key}: {value!r} is not a number")


@dataclass(frozen=True)
class Option:
    key: str  # [tool.accelperf] key; the ini key is "accelperf_" + key
    flag: str
    help: str
    kind: str  # "str" | "int" | "count" | "float" | "bool" | "choice" | "path"
    default: OptionValue
    choices: tuple[str, ...] = ()
    #: The largest value of an "int" or "count" option.
    maximum: int | None = None
    #: The smallest value of an "int" option, where it is more than 1.
    minimum: int | None = None
    #: Checks a "str" option's value: returns it, or raises ValueError (or BaselineError)
    #: with a message that names the fix.
    check: Callable[[str], str] | None = None

    @property
    def ini(self) -> str:
        return f"accelperf_{self.key}"

    @property
    def dest(self) -> str:
        return self.ini

    @property
    def default_number(self) -> float:
        """The default of a number option ("int", "count" or "float")."""
        return _number(self.key, self.default)


def _machine_name(name: str) -> str:
    """``name`` if it can name a machine, else a ValueError naming the fix."""
    try:
        return validate_machine(name)
    except MachineError as exc:
        raise ValueError(str(exc)) from None


_TOL = Tolerances()
#: The default wait for the CPU host lock, per case: ten minutes. A healthy holder keeps it
#: for one case's training (the longest case of suites/ compiles and times its steps in
#: about 9 s, by its stored baseline), and a stuck one is not waited for at all; 30 minutes
#: per case outlasted many CI jobs' own time limits (docs/checks-and-statistics.md).
HOST_LOCK_TIMEOUT_S = 600.0
#: The most virtual CPU devices: XLA:CPU takes 6 s to start 4096 of them on one core,
#: 16 s for 8192, and aborts (after minutes) or hangs far beyond that.
MAX_CPU_DEVICES = 4096

OPTIONS: tuple[Option, ...] = (
    Option("accel", "--accel", "accelerator to run cases on: cpu (JAX with virtual CPU devices), "
           "gpu, tpu, neuron, or auto (the first of tpu, gpu found, else cpu). Default: cpu.",
           "choice", "cpu", ACCELS),
    Option("cpu_devices", "--accelperf-cpu-devices", "number of virtual devices for --accel=cpu "
           f"(XLA's --xla_force_host_platform_device_count), 1 to {MAX_CPU_DEVICES}. "
           "Default: 8.", "int", 8, maximum=MAX_CPU_DEVICES),
    Option("target", "--accelperf-target", "compile each JAX case ahead of time for a TPU "
           "slice that is not here, through libtpu's compiler on this host (pip install "
           "'pytest-accelperf[tpu-aot]'), and gate that program without running a step: "
           "memory per device against the chip's HBM (a predicted out-of-memory), FLOPs, "
           "bytes accessed, collectives, host callbacks, precision, compile time; step time, "
           "loss and numerics are not run. tpu-v4:AxBxC, tpu-v5e:AxB, tpu-v5p:AxBxC or "
           "tpu-v6e:AxB (e.g. tpu-v5e:2x4); baselines under tpu-<chip>-x<devices> "
           "(tpu-v5e-x8). Cases of other backends are skipped. Default: off (cases run on "
           "--accel).", "str", None, check=check_target),
    Option("update", "--accelperf-update", "write or refresh the baselines of the cases that "
           "ran; regressions are reported but do not fail.", "bool", False),
    Option("add_session", "--accelperf-add-session", "measure the cases again on unchanged "
           "code and add this session's step-time level to their stored baselines (nothing "
           "else in them changes); from 3 sessions on, the throughput check widens its "
           "interval by the spread between sessions. Implies --accelperf-update.", "bool",
           False),
    Option("baselines", "--accelperf-baselines", "directory of the baseline store, relative to "
           "the rootdir. Default: baselines/.", "path", "baselines"),
    Option("json", "--accelperf-json", "write the machine-readable report (schema in the "
           "README) to this path; - or /dev/stdout for pytest's stdout. A file is replaced "
           "atomically; a device, FIFO or /dev/fd/N is written in place. A report that "
           "cannot be written fails the session.", "path", None),
    Option("markdown", "--accelperf-markdown", "write a Markdown summary for a pull-request "
           "comment to this path (regressions first, passes folded; - for stdout); also "
           "appended to $GITHUB_STEP_SUMMARY when that is set.", "path", None),
    Option("html", "--accelperf-html", "write one self-contained HTML report with interactive "
           "plots (loss within the baseline's band, step times, memory per device and rank, "
           "throughput across batch sizes and meshes with intervals, the history's trend) "
           "to this path (- for stdout). Needs vl-convert-python: pip install "
           "'pytest-accelperf[report]'.", "path", None),
    Option("history", "--accelperf-history", "directory of the run history: each session "
           "appends its runs, with the git commit and the environment fingerprint, as JSON "
           "lines to <dir>/<platform>.jsonl.", "path", None),
    Option("platform", "--accelperf-platform", "override the platform key baselines are stored "
           "under: one path component of letters, digits, '.', '_', '+' and '-' (default: "
           "derived, e.g. cpu-x8, tpu-v4-x8).", "str", None, check=validate_platform),
    Option("machine", "--accelperf-machine", "name of this machine within its platform's "
           "store: timing (step, compile and input times, the drift probe) is kept per "
           "machine, everything else once per platform. One path component of letters, "
           "digits, '.', '_', '+' and '-' (default: derived from the host's CPU model and "
           "features, e.g. amd-epyc-1f0e9a3c).", "str", None, check=_machine_name),
    Option("timeout", "--accelperf-timeout", "seconds one case may train (compile and steps) "
           "before it is stopped and recorded as outcome timeout; multi-process cases are "
           "killed, in-process ones stop at the next step boundary, or are interrupted a few "
           "seconds past the timeout where a step blocks (in the pytest process's main "
           "thread). 0 disables. Default: 900.", "float", 900.0),
    Option("confirm", "--accelperf-confirm", "re-measure a case whose throughput or input (the "
           "making of its batch) looks like a regression this many times; the regression "
           "stands only if every re-measurement confirms it; under --accelperf-update or "
           "--accelperf-add-session, re-measure a recording too noisy to be a baseline "
           "(--accelperf-max-step-spread) this many times before storing it marked noisy. "
           "0 disables. Default: 1.", "count", 1),
    Option("throughput_tolerance", "--accelperf-throughput-tolerance",
           "relative change of the median step time that counts as a regression or "
           f"improvement. Default: {_TOL.throughput_tolerance}.", "float",
           _TOL.throughput_tolerance),
    Option("loss_rtol", "--accelperf-loss-rtol", "relative band around the baseline's loss at "
           f"each checkpoint. Default: {_TOL.loss_rtol}.", "float", _TOL.loss_rtol),
    Option("loss_atol", "--accelperf-loss-atol", "absolute band around the baseline's loss. "
           f"Default: {_TOL.loss_atol}.", "float", _TOL.loss_atol),
    Option("loss_either_way", "--accelperf-loss-either-way", "a loss curve outside its band "
           "in either direction fails: a loss far below the baseline's means the training "
           "changed (the step's other metrics are always judged both ways); for CI gates. "
           "Default: a lower final loss is an improvement.", "bool", False),
    Option("memory_tolerance", "--accelperf-memory-tolerance", "relative change of peak memory "
           f"per device. Default: {_TOL.memory_tolerance}.", "float", _TOL.memory_tolerance),
    Option("numerics_rtol", "--accelperf-numerics-rtol", "rtol of parameters against the "
           f"baseline's fingerprint. Default: {_TOL.numerics_rtol}.", "float",
           _TOL.numerics_rtol),
    Option("numerics_atol", "--accelperf-numerics-atol", "atol of parameters against the "
           f"baseline's fingerprint. Default: {_TOL.numerics_atol}.", "float",
           _TOL.numerics_atol),
    Option("numerics_cross_rtol", "--accelperf-numerics-cross-rtol", "rtol of parameters "
           "against a baseline recorded in another environment (host CPU, framework "
           f"version). Default: {_TOL.numerics_cross_rtol}.", "float", _TOL.numerics_cross_rtol),
    Option("numerics_cross_atol", "--accelperf-numerics-cross-atol", "atol of parameters "
           "against a baseline recorded in another environment. Default: "
           f"{_TOL.numerics_cross_atol}.", "float", _TOL.numerics_cross_atol),
    Option("reference_atol", "--accelperf-reference-atol", "atol of parameters against a "
           f"single-device reference run. Default: {_TOL.reference_atol}.", "float",
           _TOL.reference_atol),
    Option("reference_rtol", "--accelperf-reference-rtol", "rtol of parameters against a "
           f"single-device reference run. Default: {_TOL.reference_rtol}.", "float",
           _TOL.reference_rtol),
    Option("program_tolerance", "--accelperf-program-tolerance", "relative change of the "
           "compiled program's FLOPs and bytes that counts (collectives, host callbacks, "
           "graphs, graph breaks and recompiles are compared exactly). Default: "
           f"{_TOL.program_tolerance}.", "float", _TOL.program_tolerance),
    Option("compile_tolerance", "--accelperf-compile-tolerance", "relative change of compile "
           "time, corrected for the machine's speed by the probe, that counts (a change "
           "under 0.5 s never does; 0.15 on a dedicated machine, as PyTorch's CI). Default: "
           f"{_TOL.compile_tolerance}.", "float", _TOL.compile_tolerance),
    Option("input_tolerance", "--accelperf-input-tolerance", "relative change of the median "
           "CPU time making a step's batch (the batch function or data iterator and the "
           "conversion of what it returns, timed apart from the step) that counts; a "
           "change under 5 percent of the median step time is never judged. "
           f"Default: {_TOL.input_tolerance}.", "float", _TOL.input_tolerance),
    Option("leak_bytes_per_step", "--accelperf-leak-bytes-per-step", "growth of live memory "
           "per measured step that is a memory regression (a leak). Default: "
           f"{_TOL.leak_bytes_per_step:g}.", "float", _TOL.leak_bytes_per_step),
    Option("max_probe_spread", "--accelperf-max-probe-spread", "largest spread (IQR over "
           "median) of the drift probe timed after each step, in this run or in the "
           "baseline's, for which a compile-time change gets a verdict (inconclusive beyond "
           "it); also the least spread of a run's step times that, at 3x the baseline's, "
           "leaves a throughput change unjudged. Throughput never counts the probe's spread "
           f"as noise: past {MAX_PROBE_SPREAD:g} the probe only stops correcting drift, and "
           f"raw step times are judged. Default: {_TOL.max_probe_spread}.", "float",
           _TOL.max_probe_spread),
    Option("max_step_spread", "--accelperf-max-step-spread", "largest spread (IQR over "
           "median) of the measured step times that --accelperf-update and "
           "--accelperf-add-session record without re-measuring; a recording past it, or "
           "measured past --accelperf-max-foreign-load, is re-measured over twice the "
           "measured steps (--accelperf-confirm times, after waiting for a quieter "
           "machine), and one that stays so is stored marked noisy, its throughput "
           f"inconclusive until re-recorded. Default: {_TOL.max_step_spread}.", "float",
           _TOL.max_step_spread),
    Option("cluster", "--accelperf-cluster", "train each case in a Ray worker that holds its "
           "devices: local (start a Ray cluster on this machine for the session and stop it "
           "at the end) or HOST:PORT of a running cluster (needs pip install "
           "'pytest-accelperf[ray]'). Default: train in the pytest process.", "str", None),
    Option("compare", "--accelperf-compare", "A/B mode for a pull request: measure each "
           "case's step time on this git revision (e.g. origin/main) and on the working tree "
           "in alternation, pairs of long-lived worker processes (one of each revision) "
           "taking turns, and gate throughput on their paired ratio; the program, memory, "
           "numerics and loss are checked against the base revision's own (its program, "
           "and one run of the case trained there). Default: off.", "str", None),
    Option("compare_python", "--accelperf-compare-python", "A/B mode across environments: "
           "the base arm runs under this Python interpreter (e.g. .venv-old/bin/python; it "
           "needs the plugin's dependencies and the cases' framework). Alone, it compares "
           "the working tree under two environments (an upgrade tried before its pull "
           "request exists); with --accelperf-compare, that revision under it. Default: the "
           "session's Python, or, where --accelperf-compare's revision has other dependency "
           "files, an environment built for it with uv (cached).", "str", None),
    Option("compare_processes", "--accelperf-compare-processes", "worker processes per "
           "revision in A/B mode: the rounds are spread over this many process pairs, and "
           "the interval is over the pairs (two-level: the speed of a process, from its "
           "memory layout and thread placement, varies as much as a small regression). "
           "0: 3, or one per 4 s of --accelperf-compare-budget when that is more (at most "
           "8; 5 at the default budget). 1: one process per revision, rounds only (the "
           "interval then misses the between-process variance); 2: a wide interval "
           "(Student's t 12.71, against 4.30 over 3 pairs). Default: 0.", "count", 0,
           maximum=MAX_PAIRS),
    Option("compare_tolerance", "--accelperf-compare-tolerance", "relative change of the "
           "paired step-time ratio that counts in A/B mode. Default: 0.01.", "float", 0.01),
    Option("compare_rounds", "--accelperf-compare-rounds", "fewest alternating rounds per "
           f"case in A/B mode, at least {MIN_SAMPLES} (a paired interval needs them). "
           "Default: 10.", "int", 10, minimum=MIN_SAMPLES),
    Option("compare_block", "--accelperf-compare-block", "steps of each revision per round "
           "in A/B mode. Default: 5.", "int", 5),
    Option("compare_budget", "--accelperf-compare-budget", "seconds of A/B measurement per "
           "case: rounds continue past the fewest while the interval is wider than half the "
           "tolerance, until this budget. Default: 20.", "float", 20.0),
    Option("compare_prepare_timeout", "--accelperf-compare-prepare-timeout", "seconds an A/B "
           "worker may take to start and connect, and then to build, compile and warm up a "
           "case's step (a case trained in ranks: nine tenths of it for its rank group); a worker "
           "past it is stopped and the case fails naming the worker (arm, pair, pid), the "
           "revision and the end of its output; the next case starts a new worker in its "
           "place. Default: 600.", "float", 600.0),
    Option("max_foreign_load", "--accelperf-max-foreign-load", "cores of CPU time that other "
           "processes may use on average while a case's steps are measured (read from "
           "/proc: all CPUs' busy time less that of this session's processes, its ranks and "
           "workers included, steal included) before its throughput change is not judged: "
           "inconclusive, re-measured once the machine is quieter (--accelperf-confirm), "
           "and a recording is stored marked noisy. A competing job slows the step more "
           "than the probe corrects for, and slows A/B mode's two revisions unequally. The "
           "same bound holds while a JAX step compiles. The machine's core count turns the "
           "check off. Default: 0.25.", "float", 0.25),
    Option("cluster_wait", "--accelperf-cluster-wait", "seconds to wait for a Ray cluster "
           "before failing: for its address to answer (asked before Ray connects; a head "
           "that is still starting is waited for; Ray's own connect then gets 30 s more), "
           "and for the resources a case asks for (a busy cluster is waited for). "
           "Default: 60.", "float", 60.0),
    Option("host_lock_timeout", "--accelperf-host-lock-timeout", "seconds a CPU case waits "
           "for the host-wide lock that makes CPU cases of all sessions on this machine train "
           "one at a time, before it fails naming the process that holds it; a holder known "
           "to be stuck (stopped, or past its own case's timeout) is not waited for. 0 waits "
           f"forever. Default: {HOST_LOCK_TIMEOUT_S:g}.", "float", HOST_LOCK_TIMEOUT_S),
    Option("explain", "--accelperf-explain", "on a regression (stored baseline or A/B), "
           "train the case 3 more steps under its framework's profiler (jax.profiler, "
           "torch.profiler) and keep the trace beside the report; the failure message and "
           "the reports say where; bounded by --accelperf-timeout, and never for a case "
           "that timed out. on or off. Default: on.", "choice", "on", ("on", "off")),
    Option("explain_dir", "--accelperf-explain-dir", "directory of the regressions' traces, "
           "one folder per case. Default: accelperf-explain/ beside --accelperf-json, else "
           ".accelperf/explain/ in the rootdir.", "path", None),
    Option("explain_max_mb", "--accelperf-explain-max-mb", "largest trace kept, in MB "
           "(10^6 bytes); a larger one is deleted and the failure says so. Default: 20.",
           "float", 20.0),
)
BY_KEY = {o.key: o for o in OPTIONS}
TOLERANCE_FIELDS = tuple(f.name for f in fields(Tolerances))


def add_options(parser: pytest.Parser) -> None:
    """Register the ``accelperf`` group: flags with ``default=None`` and their ini keys."""
    group = parser.getgroup("accelperf", "pytest-accelperf: performance regression gate")
    for opt in OPTIONS:
        if opt.kind == "bool":
            group.addoption(opt.flag, action="store_true", default=None, dest=opt.dest,
                            help=opt.help)
            parser.addini(opt.ini, opt.help, type="bool", default=None)
        else:
            # Choices are validated by us, not argparse, so the error can list them the
            # same way whichever source the bad value came from.
            group.addoption(opt.flag, action="store", default=None, dest=opt.dest,
                            metavar=opt.key.upper(), help=opt.help)
            parser.addini(opt.ini, opt.help, type="string", default=None)


def _convert(opt: Option, raw: object, source: str) -> OptionValue:
    import pytest

    def bad(expect: str) -> pytest.UsageError:
        return pytest.UsageError(
            f"{source}: invalid value {raw!r} for {opt.flag}; expected {expect}"
        )

    if raw is None:
        return None
    if opt.kind == "choice":
        value = str(raw).strip().lower()
        if value not in opt.choices:
            raise bad(f"one of: {', '.join(opt.choices)}")
        return value
    if opt.kind in ("int", "count"):
        least = opt.minimum or (1 if opt.kind == "int" else 0)
        expect = ("a positive integer" if least == 1 else "a non-negative integer"
                  if least == 0 else f"an integer of at least {least}")
        if opt.maximum is not None:
            expect = f"an integer from {least} to {opt.maximum}"
        # Only an integer or its digits: a TOML `true` is not 1, and 8.9 is not 8.
        if isinstance(raw, bool) or not isinstance(raw, int | str):
            raise bad(expect)
        try:
            value_i = int(raw)
        except ValueError:
            raise bad(expect) from None
        if value_i < least or (opt.maximum is not None and value_i > opt.maximum):
            raise bad(expect)
        return value_i
    if opt.kind == "float":
        try:
            return non_negative_number(raw)
        except ValueError:
            raise bad(NON_NEGATIVE) from None
    if opt.kind == "bool":
        if isinstance(raw, bool):
            return raw
        text = str(raw).strip().lower()
        if text in ("1", "true", "yes", "on"):
            return True
        if text in ("0", "false", "no", "off", ""):
            return False
        raise bad("true or false")
    if opt.check is not None:
        try:
            return opt.check(str(raw))
        except (ValueError, BaselineError) as exc:
            raise pytest.UsageError(f"{source}: {exc}") from None
    return str(raw)


def read_table(rootdir: Path) -> dict[str, object]:
    """``[tool.accelperf]`` of ``rootdir/pyproject.toml``; a ConfigError naming the file
    where it does not parse, the table is not one, or a key is unknown. Imports no pytest
    (the ``accelperf`` command's store directory is read through it)."""
    path = rootdir / "pyproject.toml"
    if not path.is_file():
        return {}
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: cannot parse: {exc}") from exc
    table = data.get("tool", {}).get("accelperf", {})
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: [tool.accelperf] must be a table")
    unknown = sorted(set(table) - set(BY_KEY))
    if unknown:
        raise ConfigError(
            f"{path}: unknown key(s) {', '.join(unknown)} in [tool.accelperf]; "
            f"valid: {', '.join(BY_KEY)}"
        )
    return dict(table)


def read_pyproject_table(rootdir: Path) -> dict[str, object]:
    """``[tool.accelperf]`` of ``rootdir/pyproject.toml`` (:func:`read_table`); what is
    wrong with it a UsageError."""
    import pytest

    try:
        return read_table(rootdir)
    except ConfigError as exc:
        raise pytest.UsageError(str(exc)) from exc.__cause__


@dataclass(frozen=True)
class Settings:
    """The resolved settings of a session."""

    accel: str
    cpu_devices: int
    update: bool
    baselines: Path
    json: Path | None
    platform: str | None
    tolerances: Tolerances
    #: ``--accelperf-machine``; None: the default name of the host
    #: (:func:`pytest_accelperf.store.machines.default_machine`).
    machine: str | None = None
    timeout: float | None = None
    confirm: int = 1
    markdown: Path | None = None
    html: Path | None = None
    history: Path | None = None
    cluster: str | None = None
    cluster_wait: float = 60.0
    compare: str | None = None
    #: The base arm's interpreter (``--accelperf-compare-python``), or None.
    compare_python: str | None = None
    compare_tolerance: float = 0.01
    compare_rounds: int = 10
    compare_block: int = 5
    compare_budget: float = 20.0
    compare_processes: int = 0
    compare_prepare_timeout: float = 600.0
    max_foreign_load: float = 0.25
    add_session: bool = False
    loss_either_way: bool = False
    host_lock_timeout: float | None = HOST_LOCK_TIMEOUT_S
    #: The compile-only target (``tpu-v5e:2x4``, :mod:`pytest_accelperf.provision.targets`), or
    #: None.
    target: str | None = None
    #: Where a regression's profiler trace goes (None: --accelperf-explain=off).
    explain_dir: Path | None = None
    explain_max_bytes: int = 20_000_000

    @property
    def ab(self) -> bool:
        """Whether this is an A/B session: against a revision, another environment, or
        both."""
        return bool(self.compare or self.compare_python)

    @property
    def compare_pairs(self) -> int:
        """The process pairs of A/B mode: ``compare_processes``, or for 0 (automatic) 3,
        or one per 4 s of the budget when that is more, at most 8 (5 at the default 20 s:
        Student's t over 5 pairs is 2.78, over 3 pairs 4.30)."""
        if self.compare_processes:
            return self.compare_processes
        return max(3, min(8, int(self.compare_budget // 4)))

    @classmethod
    def resolve(cls, getoption: Callable[[str], object], getini: Callable[[str], object],
                rootdir: Path, table: Mapping[str, object] | None = None,
                invocation_dir: Path | None = None) -> Settings:
        """Resolve every option. Paths from ini/pyproject are relative to the rootdir; a
        ``--accelperf-json`` given on the command line is relative to ``invocation_dir``
        (where pytest was started), as pytest's own ``--junitxml`` is."""
        import pytest

        table = read_pyproject_table(rootdir) if table is None else table
        values = OptionValues()
        for opt in OPTIONS:
            value = _convert(opt, getoption(opt.dest), f"command line {opt.flag}")
            if value is None:
                value = _convert(opt, getini(opt.ini) or None, f"ini option {opt.ini}")
            if value is None:
                value = _convert(opt, table.get(opt.key), f"[tool.accelperf] {opt.key}")
            if value is None:
                value = opt.default
            values[opt.key] = value
        ab = "--accelperf-compare" if values["compare"] else (
            "--accelperf-compare-python" if values["compare_python"] else None)
        if ab and (values["update"] or values["add_session"]):
            which = "--accelperf-add-session" if values["add_session"] else "--accelperf-update"
            raise pytest.UsageError(
                f"{which} and {ab} cannot be combined: A/B mode measures against a git "
                f"revision or another environment and never stores baselines; record "
                f"baselines in a run without {ab}")
        if values["target"]:
            _check_target_combination(values)
        tol = Tolerances(**{k: values.number(k) for k in TOLERANCE_FIELDS})
        return cls(
            target=values.text("target"),
            accel=values.string("accel"),
            cpu_devices=values.integer("cpu_devices"),
            update=bool(values["update"]) or bool(values["add_session"]),
            add_session=bool(values["add_session"]),
            loss_either_way=bool(values["loss_either_way"]),
            baselines=(rootdir / values.string("baselines")).resolve(),
            json=_output_path("json", values["json"], getoption, rootdir, invocation_dir),
            platform=values.text("platform"),
            machine=values.text("machine"),
            tolerances=tol,
            timeout=float(values.number("timeout")) or None,
            confirm=int(values.number("confirm")),
            markdown=_output_path("markdown", values["markdown"], getoption, rootdir,
                                  invocation_dir),
            html=_output_path("html", values["html"], getoption, rootdir, invocation_dir),
            history=_output_path("history", values["history"], getoption, rootdir,
                                 invocation_dir),
            cluster=values.text("cluster"),
            cluster_wait=float(values.number("cluster_wait")),
            compare=values.text("compare"),
            compare_python=_python_path(values["compare_python"], getoption, rootdir,
                                        invocation_dir),
            compare_tolerance=float(values.number("compare_tolerance")),
            compare_rounds=int(values.number("compare_rounds")),
            compare_block=int(values.number("compare_block")),
            compare_budget=float(values.number("compare_budget")),
            compare_processes=int(values.number("compare_processes")),
            compare_prepare_timeout=_positive(values.number("compare_prepare_timeout"),
                                              "--accelperf-compare-prepare-timeout"),
            max_foreign_load=float(values.number("max_foreign_load")),
            host_lock_timeout=float(values.number("host_lock_timeout")) or None,
            explain_dir=_explain_dir(values, getoption, rootdir, invocation_dir),
            explain_max_bytes=int(float(values.number("explain_max_mb")) * 1_000_000),
        )


def _positive(value: float, flag: str) -> float:
    """``value`` as a number of seconds above 0, or a usage error naming ``flag``."""
    import pytest

    seconds = float(value)
    if not seconds > 0 or seconds == float("inf"):
        raise pytest.UsageError(f"{flag}={value:g}: expected a number of seconds above 0 "
                                f"(every wait of A/B mode's prepare has a deadline)")
    return seconds


def _check_target_combination(values: Mapping[str, OptionValue]) -> None:
    """Refuse what a compile-only target cannot be combined with, naming the fix."""
    import pytest

    target = values["target"]
    if values["accel"] not in ("cpu", "auto"):
        raise pytest.UsageError(
            f"--accelperf-target={target} compiles on this host's CPU for a TPU that is not "
            f"here; --accel={values['accel']} asks for devices that run: drop one of them")
    for key, what in (("compare", "A/B mode times two revisions"),
                      ("compare_python", "A/B mode times two environments"),
                      ("cluster", "a Ray cluster trains cases on its workers")):
        if values[key]:
            raise pytest.UsageError(
                f"--accelperf-target and {BY_KEY[key].flag} cannot be combined: {what}, and a "
                f"compile-only target runs no step; drop one of them")

def _python_path(value: OptionValue, getoption: Callable[[str], object], rootdir: Path,
                 invocation_dir: Path | None) -> str | None:
    """``--accelperf-compare-python``'s interpreter as an absolute path: a path relative to
    where pytest was started (a flag) or to the rootdir; a bare name (``python3.12``)
    looked up on PATH. A UsageError naming the option when there is no such file."""
    import pytest

    if not value:
        return None
    text = str(value)
    flag = BY_KEY["compare_python"].flag
    if os.sep not in text and "/" not in text:
        found = shutil.which(text)
        if found is None:
            raise pytest.UsageError(f"{flag}={text}: no such command on PATH; give the "
                                    f"interpreter's path (e.g. .venv-old/bin/python)")
        return found
    base = invocation_dir if getoption(BY_KEY["compare_python"].dest) and invocation_dir \
        else rootdir
    path = Path(os.path.abspath(base / os.path.expanduser(text)))
    if not path.is_file() or not os.access(path, os.X_OK):
        raise pytest.UsageError(f"{flag}={text}: no executable file at {path}; give the "
                                f"interpreter of the environment to compare with (e.g. "
                                f".venv-old/bin/python)")
    return str(path)


def _explain_dir(values: Mapping[str, OptionValue], getoption: Callable[[str], object],
                 rootdir: Path,
                 invocation_dir: Path | None) -> Path | None:
    """Where a regression's trace goes: ``--accelperf-explain-dir``, else
    ``accelperf-explain/`` beside the JSON report (a file), else
    ``.accelperf/explain/`` in the rootdir; None when ``--accelperf-explain=off``."""
    if values["explain"] == "off":
        return None
    given = _output_path("explain_dir", values["explain_dir"], getoption, rootdir,
                         invocation_dir)
    if given is not None:
        return given
    json = _output_path("json", values["json"], getoption, rootdir, invocation_dir)
    if json is not None and str(json) != "-" and not str(json).startswith("/dev/"):
        return json.parent / "accelperf-explain"
    return rootdir / ".accelperf" / "explain"


def _output_path(key: str, value: OptionValue, getoption: Callable[[str], object],
                 rootdir: Path,
                 invocation_dir: Path | None) -> Path | None:
    """A report path: relative to where pytest was started when given as a flag (like
    ``--junitxml``), else to the rootdir; ``-`` (stdout) as it is.

    Made absolute, not resolved: a symlink is the writer's to follow
    (:mod:`pytest_accelperf.report.writing`), and resolving ``/dev/stdout`` would name what
    descriptor 1 is open on (``/proc/<pid>/fd/pipe:[...]``, or the file it was redirected
    to, which a rename would replace), not the descriptor."""
    if not value:
        return None
    if str(value) == "-" and key not in ("history", "explain_dir"):
        return Path("-")
    base = invocation_dir if getoption(BY_KEY[key].dest) and invocation_dir else rootdir
    return Path(os.path.abspath(base / str(value)))
