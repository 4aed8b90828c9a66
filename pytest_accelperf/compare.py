"""A/B mode for pull requests: ``--accelperf-compare=GIT_REF``.

A stored baseline was measured hours or days ago, maybe on another runner: comparing a step
time with it compares two machines as much as two revisions. In A/B mode each case's step
time is instead measured on the base revision and on the working tree *in alternation, in
the same minutes, on the same machine*, and the verdict comes from the paired ratio.

How a session goes:

1. The base revision (``git rev-parse GIT_REF``) is extracted once per session with
   ``git archive`` into a temporary directory (nothing is checked out or changed in the
   repository).
2. Two long-lived worker processes start (:mod:`.compare_worker`): ``base``, whose
   ``sys.path`` has every entry inside the repository moved into the extracted tree, and
   ``head``, which imports the working tree as pytest does. Both run the working tree's
   plugin; what differs is the suites and everything they import from the repository.
3. For each case (after its normal run in the pytest process, which still serves the
   convergence, memory and numerics checks against the stored baseline), each worker builds
   the case's step from its revision (by running the test function up to
   ``accelperf.train(task)``), compiles and warms it up. Then they take turns: round ``i``
   times a block of ``--accelperf-compare-block`` steps on each, the order of the two
   drawn at random for every pair of rounds (one base-head and one head-base in each
   pair, so a steady drift favours neither and no pattern of the machine's can line up
   with the arms), at least ``--accelperf-compare-rounds`` rounds, and more while the
   interval is too wide to resolve the tolerance, until ``--accelperf-compare-budget``
   seconds of measurement.
4. The throughput verdict is the paired statistic of :func:`.stats.paired_ratio` under
   ``--accelperf-compare-tolerance``, with the same rule as the stored-baseline check
   (``regression`` needs the ratio past the tolerance *and* the whole interval above 1;
   ``inconclusive`` when the minimum detectable change exceeds the tolerance), unless
   other processes used more than ``--accelperf-max-foreign-load`` cores during the
   rounds (:mod:`.contention`): then the measurement is contaminated, pairing does not
   cancel it, and the verdict is ``inconclusive`` with that reason.

A case that the base revision does not have is ``new``; one whose backend cannot train in
blocks (multi-process DeepSpeed, ingested logs) keeps the stored-baseline throughput check,
and the detail says so.
"""

from __future__ import annotations

import json
import math
import os
import random
import secrets
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, Listener
from pathlib import Path
from typing import Any

import pytest

import pytest_accelperf
from pytest_accelperf.backends.registry import get_backend
from pytest_accelperf.backends.spec import BackendSpec, BackendSpecError
from pytest_accelperf.cases import Case
from pytest_accelperf.checks.base import CheckResult, Verdict
from pytest_accelperf.compare_worker import ADDRESS_ENV, AUTHKEY_ENV, SETUP_ENV, Setup, unsupported
from pytest_accelperf.contention import Contention, Load, contaminated
from pytest_accelperf.program import describe_changes
from pytest_accelperf.stats import RatioEstimate, paired_ratio, throughput_verdict
from pytest_accelperf.units import fmt_percent, fmt_ratio, fmt_signed_percent, fmt_tolerance

#: Seconds a worker may take to start, import a suite and compile a case's step.
PREPARE_TIMEOUT_S = 600.0
#: Seconds one block of steps may take before the worker is declared hung.
BLOCK_TIMEOUT_S = 300.0
METRIC = "throughput"


class CompareError(Exception):
    """The comparison cannot be made (a worker died or hung, the base cannot be built)."""


def _git(repo: Path, *args: str) -> str:
    proc = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                          check=False)
    if proc.returncode:
        raise CompareError(proc.stderr.strip() or f"git {' '.join(args)} failed")
    return proc.stdout.strip()


def resolve(rootdir: Path, ref: str) -> tuple[Path, str]:
    """The repository root containing ``rootdir`` and the commit ``ref`` names."""
    try:
        root = Path(_git(rootdir, "rev-parse", "--show-toplevel"))
    except (CompareError, FileNotFoundError) as exc:
        raise pytest.UsageError(f"--accelperf-compare={ref}: {rootdir} is not in a git "
                                f"repository ({exc})") from None
    try:
        sha = _git(root, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
    except CompareError:
        raise pytest.UsageError(
            f"--accelperf-compare={ref}: git cannot resolve {ref!r} to a commit in {root}; "
            f"pass a branch, tag or commit (in a shallow CI clone fetch it first, e.g. "
            f"git fetch origin main && --accelperf-compare=origin/main)") from None
    return root, sha


def extract(root: Path, sha: str, into: Path) -> Path:
    """The files of commit ``sha`` under ``into`` (``git archive``; the repository is not
    touched)."""
    archive = into / "base.tar"
    with archive.open("wb") as out:
        proc = subprocess.run(["git", "-C", str(root), "archive", "--format=tar", sha],
                              stdout=out, stderr=subprocess.PIPE, check=False)
    if proc.returncode:
        raise CompareError(f"git archive {sha[:12]} failed: {proc.stderr.decode().strip()}")
    tree = into / "tree"
    with tarfile.open(archive) as tar:
        tar.extractall(tree, filter="data")
    archive.unlink()
    return tree


def moved_path(entries: list[str], head_root: Path, tree: Path) -> list[str]:
    """``sys.path`` with every entry inside ``head_root`` moved to ``tree``.

    >>> moved_path(["/r/suites/jax", "/usr/lib/python3", ""], Path("/r"), Path("/t"))[:2]
    ['/t/suites/jax', '/usr/lib/python3']
    """
    out = []
    for entry in entries:
        path = Path(entry or os.getcwd()).resolve()
        out.append(str(tree / path.relative_to(head_root))
                   if path.is_relative_to(head_root) else entry)
    return out


@dataclass
class _Arm:
    name: str
    proc: subprocess.Popen[bytes]
    conn: Connection
    log: Path

    def call(self, timeout: float, op: str, *args: Any) -> Any:
        __tracebackhide__ = True
        try:
            self.conn.send((op, *args))
            deadline = time.monotonic() + timeout
            while not self.conn.poll(0.2):
                if self.proc.poll() is not None:
                    raise EOFError
                if time.monotonic() > deadline:
                    raise CompareError(f"the {self.name} worker (pid {self.proc.pid}) did not "
                                       f"answer {op!r} within {timeout:g} s; it was stopped. "
                                       f"{self._tail()}")
            reply = self.conn.recv()
        except (EOFError, OSError, BrokenPipeError):
            code = self.proc.poll()
            raise CompareError(f"the {self.name} worker (pid {self.proc.pid}) died (exit "
                               f"{code}) during {op!r}. {self._tail()}") from None
        if reply[0] == "error":
            raise CompareError(f"the {self.name} revision's worker failed in {op!r}: "
                               f"{reply[1]}\n{reply[2]}")
        return reply[1]

    def _tail(self) -> str:
        try:
            text = self.log.read_text(errors="replace").strip()
        except OSError:
            return ""
        return f"Its output ends: {text[-800:]}" if text else ""

    def stop(self) -> None:
        try:
            if self.proc.poll() is None:
                self.conn.send(("stop",))
                self.proc.wait(timeout=10)
        except (OSError, EOFError, subprocess.TimeoutExpired):
            pass
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.conn.close()


@dataclass
class ABMeasurement:
    """The rounds of one case: step times per round of each revision."""

    base: list[list[float]] = field(default_factory=list)
    head: list[list[float]] = field(default_factory=list)
    seconds: float = 0.0
    #: Which arm ran first in each round ("base" or "head").
    first: list[str] = field(default_factory=list)
    #: What the rest of the machine used during the rounds (None: unknown).
    load: Load | None = None
    #: Each arm's program record (:mod:`pytest_accelperf.program`), where its stepper has one.
    programs: dict[str, dict[str, Any] | None] = field(default_factory=dict)


def round_orders(rng: random.Random) -> tuple[bool, bool]:
    """Whether base runs first in each of the next two rounds: one round of each order,
    which one comes first drawn at random."""
    base_first = rng.random() < 0.5
    return base_first, not base_first


class Comparison:
    """The session's A/B setup: the base tree and the two workers (started lazily)."""

    def __init__(self, ref: str, rootdir: Path, accel: str, cpu_devices: int,
                 platform: str | None) -> None:
        self.ref = ref
        self.root, self.sha = resolve(rootdir, ref)
        self._accel, self._cpu_devices, self._platform = accel, cpu_devices, platform
        self._dir: Path | None = None
        self._arms: dict[str, _Arm] = {}

    @property
    def label(self) -> str:
        return f"{self.ref} ({self.sha[:10]})"

    def _start(self) -> None:
        self._dir = Path(tempfile.mkdtemp(prefix="accelperf-compare-"))
        tree = extract(self.root, self.sha, self._dir)
        authkey = secrets.token_bytes(16)
        listener = Listener(str(self._dir / "socket"), family="AF_UNIX", authkey=authkey)
        plugin_parent = str(Path(pytest_accelperf.__file__).resolve().parents[1])
        try:
            for arm, arm_tree in (("base", tree), ("head", self.root)):
                entries = [p or os.getcwd() for p in sys.path]
                setup = Setup(arm=arm, tree=str(arm_tree), head_root=str(self.root),
                              sys_path=(moved_path(entries, self.root, tree) if arm == "base"
                                        else entries),
                              accel=self._accel, cpu_devices=self._cpu_devices,
                              platform=self._platform)
                env = {**os.environ, ADDRESS_ENV: str(listener.address),
                       AUTHKEY_ENV: authkey.hex(), SETUP_ENV: json.dumps(setup.__dict__),
                       "PYTHONPATH": plugin_parent}
                log = self._dir / f"{arm}.log"
                with log.open("wb") as out:
                    proc = subprocess.Popen(
                        [sys.executable, "-m", "pytest_accelperf.compare_worker"],
                        cwd=arm_tree, env=env, stdin=subprocess.DEVNULL, stdout=out,
                        stderr=subprocess.STDOUT)
                conn = _accept(listener, proc, arm, log)
                self._arms[arm] = _Arm(arm, proc, conn, log)
        finally:
            listener.close()

    def measure(self, case: Case, rel_file: str, qualname: str, *, rounds: int, block: int,
                budget: float, tolerance: float, spec: BackendSpec | None = None
                ) -> tuple[str, str, ABMeasurement]:
        """Prepare the case in both workers and alternate blocks of steps. Returns
        ``(status, why, measurement)``; status ``ready`` when measured. ``spec`` is the
        case's backend as the session registered it (default: the built-in of that name);
        the workers, outside pytest, import it by its module."""
        __tracebackhide__ = True
        out = ABMeasurement()
        spec = spec if spec is not None else get_backend(case.backend)
        if spec.ab_blocks:  # else the workers say so, once they know the test exists
            try:
                spec.check_importable("an A/B worker")
            except BackendSpecError as exc:
                return "unsupported", str(exc), out
        elif not spec.importable:
            return "unsupported", unsupported(spec), out
        if not self._arms:
            self._start()
        base, head = self._arms["base"], self._arms["head"]
        key = case.id
        status, why = base.call(PREPARE_TIMEOUT_S, "prepare", key, rel_file, qualname, case,
                                spec)
        if status != "ready":
            return status, why, out
        try:
            status, why = head.call(PREPARE_TIMEOUT_S, "prepare", key, rel_file, qualname,
                                    case, spec)
            if status != "ready":
                return status, why, out
            for arm in (base, head):
                out.programs[arm.name] = arm.call(BLOCK_TIMEOUT_S, "program", key)
            rng = random.Random(secrets.randbits(64))
            pending: list[bool] = []
            load = Contention([os.getpid(), base.proc.pid, head.proc.pid]).start()
            t0 = time.monotonic()
            while True:
                if not pending:
                    pending.extend(round_orders(rng))
                order = (base, head) if pending.pop(0) else (head, base)
                out.first.append(order[0].name)
                for arm in order:
                    times = arm.call(BLOCK_TIMEOUT_S, "run", key, block)
                    (out.base if arm is base else out.head).append(times)
                out.seconds = time.monotonic() - t0
                n = len(out.base)
                if n < rounds:
                    continue
                if out.seconds >= budget:
                    break
                est = paired_ratio(out.head, out.base)
                if est.mdc <= tolerance / 2 and n % 2 == 0:
                    break  # resolved well within the tolerance
            out.load = load.reading()
            return "ready", "", out
        finally:
            for arm in (base, head):
                if arm.proc.poll() is None:
                    arm.call(60, "drop", key)

    def close(self) -> None:
        for arm in self._arms.values():
            arm.stop()
        self._arms.clear()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None


def _accept(listener: Listener, proc: subprocess.Popen[bytes], arm: str,
            log: Path) -> Connection:
    """The worker's connection, or a CompareError when it dies before connecting."""
    import threading

    box: dict[str, Any] = {}

    def accept() -> None:
        try:
            box["conn"] = listener.accept()
        except OSError as exc:  # the listener was closed
            box["error"] = exc

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    deadline = time.monotonic() + PREPARE_TIMEOUT_S
    while thread.is_alive():
        thread.join(0.2)
        if proc.poll() is not None and thread.is_alive():
            listener.close()
            thread.join()
            raise CompareError(f"the {arm} worker exited ({proc.returncode}) before "
                               f"connecting: {log.read_text(errors='replace')[-800:]}")
        if time.monotonic() > deadline:
            proc.kill()
            listener.close()
            raise CompareError(f"the {arm} worker did not connect within "
                               f"{PREPARE_TIMEOUT_S:g} s")
    if "conn" not in box:
        raise CompareError(f"the {arm} worker could not connect: {box.get('error')}")
    conn: Connection = box["conn"]
    return conn


def program_diff(measured: ABMeasurement, tolerance: float) -> list[str] | None:
    """How the head's program differs from the base's, in words (empty: the same
    program); None when either arm has no program record."""
    base, head = measured.programs.get("base"), measured.programs.get("head")
    if not base or not head:
        return None
    return describe_changes(base, head, tolerance)


def ab_check(label: str, measured: ABMeasurement, samples_per_step: int,
             tolerance: float, block: int, max_foreign_load: float = math.inf,
             program_tolerance: float = 0.01) -> CheckResult:
    """The throughput verdict of an A/B measurement: ``inconclusive`` whatever the ratio
    when other processes used more than ``max_foreign_load`` cores during it. The two
    arms' programs are diffed and the difference follows the verdict: a slowdown comes
    with its likely cause (``program: all-gather: 2 → 6 per step (+48.00 MiB)``), or with
    ``same program`` when only the kernels' speed can explain it."""
    est: RatioEstimate = paired_ratio(measured.head, measured.base)
    verdict = throughput_verdict(est, tolerance)
    dirty = contaminated(measured.load, max_foreign_load)
    if dirty:
        verdict = Verdict.INCONCLUSIVE
    base_median = float(_median([t for b in measured.base for t in b]))
    head_median = float(_median([t for b in measured.head for t in b]))
    unit = "samples/s" if samples_per_step else "s"

    def rate(median: float) -> float:
        return samples_per_step / median if samples_per_step else median

    ci = (f"{est.confidence * 100:.0f}% CI of the paired step-time ratio "
          f"{fmt_ratio(est.low)}\u2013{fmt_ratio(est.high)}, tolerance "
          f"{fmt_tolerance(tolerance)}; {len(measured.base)} alternating rounds of {block} "
          f"steps in {measured.seconds:.1f} s")
    if verdict is Verdict.REGRESSION:
        text = f"slower than {label}: step time {fmt_percent(est.ratio - 1)} longer ({ci})"
    elif verdict is Verdict.IMPROVEMENT:
        text = f"faster than {label}: step time {fmt_percent(1 - est.ratio)} shorter ({ci})"
    elif dirty:
        assert measured.load is not None
        text = (f"against {label}: not judged, the measurement is contaminated: "
                f"{measured.load.text()} (bound --accelperf-max-foreign-load="
                f"{max_foreign_load:g}); step time {fmt_signed_percent(est.ratio - 1)} "
                f"({ci}); run on a machine with nothing else running, or raise the bound")
    elif verdict is Verdict.INCONCLUSIVE:
        text = (f"against {label}: noise too large to resolve ±{fmt_tolerance(tolerance)}: "
                f"smallest detectable change here is ±{fmt_percent(est.mdc)} (step time "
                f"{fmt_signed_percent(est.ratio - 1)}, {ci}); raise "
                f"--accelperf-compare-budget or use a quieter machine")
    else:
        text = (f"within tolerance of {label}: step time "
                f"{fmt_signed_percent(est.ratio - 1)} ({ci})")
    diff = program_diff(measured, program_tolerance)
    if diff is not None:
        text += (f"; program: {'; '.join(diff)}" if diff
                 else "; same program in both revisions")
    result = CheckResult(METRIC, verdict, f"A/B {text}", baseline=rate(base_median),
                         now=rate(head_median), unit=unit, change=1 / est.ratio - 1)
    result.data = {"mode": "ab", "ref": label, "tolerance": tolerance, "ratio": est.ratio,
                   "ci": [est.low, est.high], "mdc": est.mdc, "confidence": est.confidence,
                   "rounds": len(measured.base), "block": block,
                   "seconds": measured.seconds, "first": measured.first,
                   "load": measured.load.to_json() if measured.load else None,
                   "max_foreign_load": max_foreign_load if math.isfinite(max_foreign_load)
                   else None, "contaminated": dirty,
                   "median_step_time": {"now": head_median, "baseline": base_median},
                   "blocks": {"base": measured.base, "head": measured.head},
                   "program_diff": diff}
    return result


def _median(values: list[float]) -> float:
    import statistics

    return statistics.median(values)


def not_compared(label: str, why: str, stored: CheckResult | None) -> CheckResult | None:
    """The throughput check when a case could not be compared: the stored-baseline check
    with a note, or ``new`` when the base revision has no such case."""
    if stored is None:
        return None
    stored.detail = f"{stored.detail} [not compared with {label}: {why}]".strip()
    stored.data["ab"] = {"ref": label, "skipped": why}
    return stored


def new_in_head(label: str, why: str, stored: CheckResult | None) -> CheckResult:
    result = CheckResult(METRIC, Verdict.NEW, f"not in {label} ({why}): nothing to compare "
                         f"with", now=stored.now if stored else None,
                         unit=stored.unit if stored else "samples/s")
    result.data = {"mode": "ab", "ref": label}
    return result


def node_location(item: pytest.Item, root: Path) -> tuple[str, str]:
    """The test's file relative to the repository root, and its qualified name
    (``TestClass.test_x`` or ``test_x``)."""
    rel = str(Path(str(item.path)).resolve().relative_to(root))
    names: list[str] = []
    node: Any = item
    while node is not None and not isinstance(node, pytest.Module):
        if isinstance(node, pytest.Class):
            names.append(node.name)
        node = node.parent
    function = getattr(item, "originalname", None) or item.name.split("[", 1)[0]
    return rel, ".".join([*reversed(names), function])


