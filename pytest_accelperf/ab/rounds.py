"""The rounds of A/B mode (see :mod:`pytest_accelperf.ab`): the session's comparison
(:class:`Comparison`: the base tree and the two arms, started on first use) and, for each
case, its step built in both arms (for a case trained in ranks, a group of ranks in each:
:mod:`.ranks`), then blocks of steps timed in alternation, in an order drawn at random per
pair of rounds (:func:`round_orders`), until the interval resolves the tolerance or the
budget is spent (:class:`ABMeasurement`). The ranks' CPU time is the measurement's own, not
contention.
"""

from __future__ import annotations

import os
import random
import secrets
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Listener
from pathlib import Path
from typing import Any

from pytest_accelperf.ab import CompareError
from pytest_accelperf.ab.arms import BLOCK_TIMEOUT_S, PREPARE_TIMEOUT_S, Arm, start_arm
from pytest_accelperf.ab.tree import extract, moved_path, resolve, snapshot
from pytest_accelperf.ab.worker import Setup, unsupported
from pytest_accelperf.backends.registry import get_backend
from pytest_accelperf.backends.spec import BackendSpec, BackendSpecError
from pytest_accelperf.cases import Case
from pytest_accelperf.contention import Contention, Load
from pytest_accelperf.stats import paired_ratio


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
        self._arms: dict[str, Arm] = {}
        #: Why the trees or arms could not be set up, once that failed.
        self._failed: str | None = None

    @property
    def label(self) -> str:
        return f"{self.ref} ({self.sha[:10]})"

    def _start(self) -> None:
        """The two trees and arms; a setup that failed (git stuck past its timeout, an arm
        that did not start) is not tried again: every later case fails at once with its
        message, instead of waiting as long again. Half of it (one arm) is stopped."""
        if self._failed is not None:
            raise CompareError(f"{self._failed} (found by an earlier case of this session; "
                               f"not tried again)")
        try:
            self._start_arms()
        except CompareError as exc:
            self._failed = str(exc)
            self.close()
            raise

    def _start_arms(self) -> None:
        self._dir = Path(tempfile.mkdtemp(prefix="accelperf-compare-"))
        trees = {"base": extract(self.root, self.sha, self._dir),
                 "head": snapshot(self.root, self._dir)}
        authkey = secrets.token_bytes(16)
        listener = Listener(str(self._dir / "socket"), family="AF_UNIX", authkey=authkey)
        try:
            for arm, arm_tree in trees.items():
                entries = [p or os.getcwd() for p in sys.path]
                setup = Setup(arm=arm, tree=str(arm_tree), head_root=str(self.root),
                              sys_path=moved_path(entries, self.root, arm_tree),
                              accel=self._accel, cpu_devices=self._cpu_devices,
                              platform=self._platform)
                self._arms[arm] = start_arm(setup, listener, authkey,
                                            self._dir / f"{arm}.log")
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
            ranks = [pid for arm in (base, head) for pid in arm.call(BLOCK_TIMEOUT_S, "pids", key)]
            load = Contention([os.getpid(), base.proc.pid, head.proc.pid, *ranks]).start()
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
