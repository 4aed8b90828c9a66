"""Compile-only targets: an accelerator topology compiled for on a host that lacks it.

``--accelperf-target=tpu-v5e:2x4`` makes a session compile every JAX case for a TPU v5e
2x4 slice through libtpu's ahead-of-time compiler, on whatever host runs the tests, and
gate that program: memory per device against the chip's HBM (:data:`CHIPS`), FLOPs,
bytes accessed, collectives, host callbacks, precision. No step is executed, so a
compile-only case has no step time, loss or numerics (:func:`not_run`).

This module holds what a target is (:func:`parse_target`), the chips' capacities and
their sources, whether libtpu is installed (:func:`libtpu_missing`), the environment
libtpu wants on a host without a TPU (:func:`libtpu_environment`, set for the compile
only and restored after; its log lines kept off the terminal, :func:`captured_stderr`),
and the :class:`~pytest_accelperf.provision.accel.Accelerator` of a target's compile-only devices
(:func:`provision_target`). jax is imported only by that last one.

How the devices are made: ``jax.experimental.topologies.get_topology_desc(
topology_name="v5e:2x4", platform="tpu", chip_config_name=...)``, as MaxText's
``train_compile.py`` does; v4 and v5p are compiled as JAX runs them, one device per chip
("megacore": the chip's two TensorCores as one device).
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
import os
import re
import signal
import sys
import tempfile
import threading
from collections.abc import Iterator, MutableMapping
from dataclasses import dataclass, field
from typing import Any

from pytest_accelperf.errors import UserError
from pytest_accelperf.provision.accel import Accelerator

GIB = 2**30

#: The extra that installs libtpu at the version the installed jax pins for its ``tpu``
#: extra (jax 0.10.2: ``libtpu==0.0.42.*``).
INSTALL = "pip install 'pytest-accelperf[tpu-aot]'"


@dataclass(frozen=True)
class Chip:
    """A TPU generation as a compile target: its HBM per chip (what a program's memory is
    judged against), peak bf16 FLOP/s per chip, and how libtpu names its topologies."""

    name: str  #: as the target names it: ``v5e``
    hbm_bytes: int
    peak_flops: float
    #: ``dims``: how many dimensions a topology has (2: ``2x4``, 3: ``2x2x1``).
    dims: int
    #: libtpu's ``chip_config_name``: ``megacore`` where a chip's two TensorCores are one
    #: JAX device (v4, v5p), ``default`` where a chip has one TensorCore.
    chip_config: str
    source: str


#: The chips a target may name. HBM per chip, from Google's Cloud TPU documentation (the
#: pages name the unit GiB for v4 and v5p, GB for v5e and v6e; XLA:TPU's own numbers for
#: v5e are binary: seed 000's "Used 20.93G of 15.48G hbm" with 530.01M reserved is 16 GiB):
CHIPS: dict[str, Chip] = {
    "v4": Chip("v4", 32 * GIB, 275e12, 3, "megacore",
               "cloud.google.com/tpu/docs/v4: HBM2 capacity 32 GiB, 275 TFLOP/s bf16"),
    "v5e": Chip("v5e", 16 * GIB, 197e12, 2, "default",
                "cloud.google.com/tpu/docs/v5e: HBM2 capacity 16 GB (16 GiB: seed 000's "
                "15.48G program + 530.01M reserved), 197 TFLOP/s bf16"),
    "v5p": Chip("v5p", 95 * GIB, 459e12, 3, "megacore",
                "cloud.google.com/tpu/docs/v5p: HBM capacity per chip 95 GiB, 459 TFLOP/s bf16"),
    "v6e": Chip("v6e", 32 * GIB, 918e12, 2, "default",
                "cloud.google.com/tpu/docs/v6e: HBM capacity per chip 32 GB, 918 TFLOP/s bf16"),
}

_TARGET = re.compile(r"tpu-(?P<chip>[a-z0-9]+):(?P<topology>\d+(?:x\d+)*)\Z")


@dataclass(frozen=True)
class Target:
    """A compile-only target: ``tpu-v5e:2x4`` is a TPU v5e slice of 2x4 chips."""

    chip: Chip
    topology: tuple[int, ...]

    @property
    def name(self) -> str:
        """As the option names it: ``tpu-v5e:2x4``."""
        return f"tpu-{self.chip.name}:{'x'.join(map(str, self.topology))}"

    @property
    def topology_name(self) -> str:
        """As libtpu names it: ``v5e:2x4``."""
        return f"{self.chip.name}:{'x'.join(map(str, self.topology))}"

    @property
    def n_devices(self) -> int:
        """JAX devices of the slice: one per chip (v4 and v5p as megacore)."""
        return math.prod(self.topology)

    @property
    def platform(self) -> str:
        """The key its baselines are stored under: ``tpu-v5e-x8``. A TPU host's own
        session derives its key from the runtime's device kind (``tpu-v5-lite-x8`` on a
        v5e), so a compile-only baseline never stands for a measured one."""
        return f"tpu-{self.chip.name}-x{self.n_devices}"


def parse_target(text: str) -> Target:
    """``text`` (``tpu-v5e:2x4``) as a :class:`Target`; a ``ValueError`` naming the fix.

    >>> parse_target("tpu-v5e:2x4").platform
    'tpu-v5e-x8'
    >>> parse_target("tpu-v4:2x2x1").n_devices
    4
    """
    value = text.strip().lower()
    known = ", ".join(f"tpu-{c.name}:{'2x4' if c.dims == 2 else '2x2x1'}"
                      for c in CHIPS.values())
    match = _TARGET.match(value)
    if not match:
        raise ValueError(f"invalid target {text!r}: give tpu-<chip>:<topology>, e.g. {known}")
    chip = CHIPS.get(match["chip"])
    if chip is None:
        raise ValueError(f"invalid target {text!r}: no TPU chip {match['chip']!r}; the chips "
                         f"are {', '.join(CHIPS)} (e.g. {known})")
    topology = tuple(int(n) for n in match["topology"].split("x"))
    if len(topology) != chip.dims or not all(topology):
        example = "2x4" if chip.dims == 2 else "2x2x1"
        raise ValueError(f"invalid target {text!r}: a {chip.name} topology has {chip.dims} "
                         f"dimensions of at least 1 chip, e.g. tpu-{chip.name}:{example}")
    return Target(chip, topology)


def check_target(text: str) -> str:
    """The option's check: ``text`` normalized (``tpu-v5e:2x4``), or ``ValueError``."""
    return parse_target(text).name


def libtpu_missing(target: str) -> str | None:
    """Why the cases of ``target`` cannot be compiled here (libtpu is not installed, with
    the line that installs it), or None."""
    if importlib.util.find_spec("libtpu") is not None:
        return None
    return (f"--accelperf-target={target} compiles through libtpu, which is not installed: "
            f"{INSTALL}")


class TargetError(UserError, ValueError):
    """A target that libtpu cannot make (a topology it does not know)."""


#: What libtpu reads on a host without a TPU, set for the compile only: skip the query of
#: the GCE metadata server (a TPU VM's; elsewhere it fails or waits), and say which
#: accelerator and workers this host is, which it would otherwise log as missing
#: ("could not determine TPU accelerator type", "unexpected worker hostname"). They
#: describe this host, not the target: the topology is given by name.
LIBTPU_ENV: dict[str, str] = {
    "TPU_SKIP_MDS_QUERY": "1",
    # libtpu takes /tmp/libtpu_lockfile so that two processes never drive one TPU; a
    # compile drives none, and a second session (or an xdist worker) would be refused.
    "ALLOW_MULTIPLE_LIBTPU_LOAD": "1",
    "TPU_ACCELERATOR_TYPE": "v5litepod-8",
    "TPU_WORKER_HOSTNAMES": "localhost",
    "TPU_WORKER_ID": "0",
}


@contextlib.contextmanager
def libtpu_environment(env: MutableMapping[str, str] | None = None) -> Iterator[None]:
    """:data:`LIBTPU_ENV` in ``env`` (``os.environ``) for the block, then restored exactly:
    a variable the user set keeps the user's value, one that was unset is removed. Nothing
    else is touched."""
    env = os.environ if env is None else env
    added = [k for k in LIBTPU_ENV if k not in env]
    for key in added:
        env[key] = LIBTPU_ENV[key]
    try:
        yield
    finally:
        for key in added:
            env.pop(key, None)


@dataclass
class CompilerLog:
    """What libtpu wrote to the process's stderr during a block (:func:`captured_stderr`)."""

    lines: list[str] = field(default_factory=list)

    def summary(self, what: str) -> str:
        """One line: how many lines, and the first (empty when none)."""
        if not self.lines:
            return ""
        first = self.lines[0].strip()
        first = first if len(first) <= 160 else first[:157] + "..."
        return (f"libtpu wrote {len(self.lines)} log line(s) while {what}, kept off the "
                f"terminal; the first: {first}")


@contextlib.contextmanager
def captured_stderr() -> Iterator[CompilerLog]:
    """Descriptor 2 into a temporary file for the block (libtpu's C++ logging writes there,
    beneath Python's ``sys.stderr`` and pytest's capture), its lines handed back in the
    :class:`CompilerLog` after the block; descriptor 2 restored whatever happens."""
    log = CompilerLog()
    with contextlib.suppress(Exception):
        sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield log
        finally:
            with contextlib.suppress(Exception):
                sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            text = sink.read().decode("utf-8", "replace")
            log.lines[:] = [line for line in text.splitlines() if line.strip()]


@contextlib.contextmanager
def compiling(log: list[str] | None = None) -> Iterator[None]:
    """The block in which a target's program is made: libtpu's environment set, its log
    lines kept off the terminal (appended to ``log`` when given)."""
    try:
        with libtpu_environment(), captured_stderr() as captured:
            yield
    finally:
        _python_knows_sigprof_is_ignored()
    if log is not None:
        log.extend(captured.lines)


def _python_knows_sigprof_is_ignored() -> None:
    """Once libtpu is loaded: its threads carry CPU timers that send ``SIGPROF`` (12 in a
    process that made a v5e 2x4), which it ignores, set beneath Python, whose ``signal``
    module still reports the default. A library that restores every handler Python reports
    (Lightning's ``Trainer``, at the end of ``fit``) then sets the default back, and the next
    tick kills the process ("Profiling timer expired": an xdist worker that had run a
    target's test and then a Lightning case). Python is told the ignore, so that such a
    restore keeps it; a handler set from Python is left as it is."""
    if (threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGPROF) == signal.SIG_DFL):
        signal.signal(signal.SIGPROF, signal.SIG_IGN)


def provision_target(target: Target, platform_override: str | None = None) -> Accelerator:
    """The :class:`Accelerator` of ``target``: its compile-only devices (libtpu loaded now,
    in :func:`compiling`), its platform key, the chip's HBM as each device's capacity and
    its peak FLOP/s. A topology libtpu refuses is a :class:`TargetError` with its words."""
    from jax.experimental import topologies

    get: Any = topologies.get_topology_desc
    dims = target.topology + (1,) * (3 - len(target.topology))
    kwargs: dict[str, str | tuple[int, ...]] = {"chip_config_name": target.chip.chip_config}
    if any(d < h for d, h in zip(dims, (2, 2, 1), strict=True)):
        # A slice smaller than libtpu's default host (2x2x1 chips) is one host's share.
        kwargs["chips_per_host_bounds"] = tuple(min(d, h) for d, h in
                                                zip(dims, (2, 2, 1), strict=True))
    log: list[str] = []
    try:
        with compiling(log):
            devices = list(get(topology_name=target.topology_name, platform="tpu",
                               **kwargs).devices)
    except Exception as exc:  # libtpu's refusal of the topology, in its words
        said = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise TargetError(f"--accelperf-target={target.name}: libtpu cannot make this "
                          f"topology: {said}") from None
    return Accelerator(
        name="tpu", platform=platform_override or target.platform,
        device_kind=str(devices[0].device_kind), device_count=len(devices),
        memory_capacity=target.chip.hbm_bytes, peak_flops=target.chip.peak_flops,
        devices=devices, compile_only=target.name)


#: What a compile-only case does not measure: the checks that need steps executed.
NOT_RUN = ("throughput", "loss", "input", "input_wait", "numerics", "reference")


def not_run(target: str) -> str:
    """The sentence a compile-only case's report gives for what it did not measure."""
    return (f"compile-only ({target}): compiled for the target, no step executed; "
            f"{', '.join(NOT_RUN)} not run")
