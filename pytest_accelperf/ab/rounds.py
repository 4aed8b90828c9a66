"""The rounds of A/B mode (see :mod:`pytest_accelperf.ab`): the session's comparison
(:class:`Comparison`: the base tree and the two arms, started on first use) and, for each
case, its step built in both arms (for a case trained in ranks, a group of ranks in each:
:mod:`.ranks`), then blocks of steps timed in alternation, in an order drawn at random per
pair of rounds (:func:`round_orders`), until the interval resolves the tolerance or the
budget is spent (:class:`ABMeasurement`). The ranks' CPU time is the measurement's own, not
contention.
"""

from __future__ import annotations

import contextlib
import os
import random
import secrets
import shutil
import sys
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Listener
from pathlib import Path
from typing import Any

from pytest_accelperf.ab import CompareError
from pytest_accelperf.ab.arms import BLOCK_TIMEOUT_S, PREPARE_TIMEOUT_S, Arm, start_arm
from pytest_accelperf.ab.tree import extract, moved_path, resolve, snapshot, socket_dir
from pytest_accelperf.ab.worker import Setup, unsupported
from pytest_accelperf.backends.registry import get_backend
from pytest_accelperf.backends.spec import BackendSpec, BackendSpecError
from pytest_accelperf.cases import Case
from pytest_accelperf.contention import Contention, Load
from pytest_accelperf.stats import ab_ratio


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
    #: Which process pair (0, 1, ...) timed each round: its base and head workers.
    pairs: list[int] = field(default_factory=list)
    #: Process pairs the rounds were spread over.
    processes: int = 1


def round_orders(rng: random.Random) -> tuple[bool, bool]:
    """Whether base runs first in each of the next two rounds: one round of each order,
    which one comes first drawn at random."""
    base_first = rng.random() < 0.5
    return base_first, not base_first


class Comparison:
    """The session's A/B setup: the base tree and the two workers (started lazily)."""

    def __init__(self, ref: str, rootdir: Path, accel: str, cpu_devices: int,
                 platform: str | None, processes: int = 1,
                 prepare_timeout: float = PREPARE_TIMEOUT_S) -> None:
        self.ref = ref
        self.root, self.sha = resolve(rootdir, ref)
        self._accel, self._cpu_devices, self._platform = accel, cpu_devices, platform
        #: Worker processes per arm: pair ``j`` is ``_pairs[j]``, one base and one head.
        self.processes = max(1, processes)
        #: Seconds a worker may take to connect, and then to prepare a case
        #: (``--accelperf-compare-prepare-timeout``).
        self.prepare_timeout = prepare_timeout
        self._dir: Path | None = None
        self._pairs: list[dict[str, Arm]] = []
        #: Each worker's setup, to start another in its place (:meth:`_revive`).
        self._setups: dict[tuple[int, str], Setup] = {}
        self._authkey = b""
        #: Workers started in place of one that died or was stopped, so far.
        self.restarts = 0
        #: Why the trees or arms could not be set up, once that failed.
        self._failed: str | None = None

    @property
    def label(self) -> str:
        return f"{self.ref} ({self.sha[:10]})"

    def revision(self, arm: str) -> str:
        """What ``arm`` runs, as messages name it."""
        return self.label if arm == "base" else "the working tree"

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
        self._dir = socket_dir("accelperf-compare-", "socket")
        trees = {"base": extract(self.root, self.sha, self._dir),
                 "head": snapshot(self.root, self._dir)}
        self._authkey = secrets.token_bytes(16)
        listener = Listener(str(self._dir / "socket"), family="AF_UNIX",
                            authkey=self._authkey)
        try:
            for j in range(self.processes):
                pair: dict[str, Arm] = {}
                self._pairs.append(pair)
                for arm, arm_tree in trees.items():
                    entries = [p or os.getcwd() for p in sys.path]
                    setup = Setup(arm=arm, tree=str(arm_tree), head_root=str(self.root),
                                  sys_path=moved_path(entries, self.root, arm_tree),
                                  accel=self._accel, cpu_devices=self._cpu_devices,
                                  platform=self._platform, pair=j,
                                  prepare_timeout=self.prepare_timeout)
                    self._setups[j, arm] = setup
                    pair[arm] = start_arm(setup, listener, self._authkey,
                                          self._dir / f"{arm}-{j}.log", self.revision(arm),
                                          workers=2 * self.processes)
        finally:
            listener.close()

    def _revive(self) -> None:
        """Start a worker in place of each one that is gone: one that died, that did not
        answer in time (it was killed), or whose device was left broken (a sticky CUDA
        error: it was stopped). The case that lost it failed with the reason; the next
        case gets a fresh process, and nothing of the old one's state. A worker that
        cannot be started fails the comparison as a failed start does."""
        dead = [(j, name) for j, pair in enumerate(self._pairs) for name, arm in pair.items()
                if arm.dead]
        if not dead:
            return
        assert self._dir is not None
        socket = self._dir / f"socket-{self.restarts + 1}"
        listener = Listener(str(socket), family="AF_UNIX", authkey=self._authkey)
        try:
            for j, name in dead:
                self._pairs[j][name].stop()
                self.restarts += 1
                self._pairs[j][name] = start_arm(
                    self._setups[j, name], listener, self._authkey,
                    self._dir / f"{name}-{j}.{self.restarts}.log", self.revision(name),
                    workers=2 * self.processes)
        except CompareError as exc:
            self._failed = str(exc)
            self.close()
            raise
        finally:
            listener.close()

    def _workers(self) -> list[Arm]:
        """Every worker, the base arm's first in each pair (a pair whose start was cut
        short, by a failed start or an interrupt, has the arms that started)."""
        return [pair[arm] for pair in self._pairs for arm in ("base", "head") if arm in pair]

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
        if not self._pairs:
            self._start()
        else:
            self._revive()
        key = case.id
        prepared: list[Arm] = []
        try:
            status, why = self._prepare(key, rel_file, qualname, case, spec, prepared)
            if status != "ready":
                return status, why, out
            first = self._pairs[0]
            for name in ("base", "head"):
                out.programs[name] = first[name].call(BLOCK_TIMEOUT_S, "program", key)
            out.processes = len(self._pairs)
            rng = random.Random(secrets.randbits(64))
            pending: list[bool] = []
            ranks = [pid for arm in prepared for pid in arm.call(BLOCK_TIMEOUT_S, "pids", key)]
            load = Contention([os.getpid(), *(arm.proc.pid for arm in prepared),
                               *ranks]).start()
            cycle = 2 * len(self._pairs)  # rounds that give every pair one of each order
            t0 = time.monotonic()
            while True:
                # Two rounds (one of each order) per pair, the pairs in turn: every pair's
                # processes see the same span of the machine's states, and none sits idle
                # long enough to cool down.
                pair_index = (len(out.base) // 2) % len(self._pairs)
                pair = self._pairs[pair_index]
                base, head = pair["base"], pair["head"]
                if not pending:
                    pending.extend(round_orders(rng))
                order = (base, head) if pending.pop(0) else (head, base)
                out.first.append(order[0].name)
                out.pairs.append(pair_index)
                for arm in order:
                    times = arm.call(BLOCK_TIMEOUT_S, "run", key, block)
                    (out.base if arm is base else out.head).append(times)
                out.seconds = time.monotonic() - t0
                n = len(out.base)
                if n < max(rounds, cycle) or n % cycle:
                    continue  # the fewest rounds, and whole cycles: balanced pairs
                if out.seconds >= budget:
                    break
                if ab_ratio(out.head, out.base, out.pairs)[0].mdc <= tolerance / 2:
                    break  # resolved well within the tolerance
            out.load = load.reading()
            return "ready", "", out
        finally:
            for arm in prepared:
                if not arm.dead:  # one that fails to drop is stopped: the next case
                    with contextlib.suppress(CompareError):  # starts another
                        arm.call(60, "drop", key)

    def _prepare(self, key: str, rel_file: str, qualname: str, case: Case,
                 spec: BackendSpec, prepared: list[Arm]) -> tuple[str, str]:
        """The case built, compiled and warmed up in every worker at once (a pair's
        compile is outside the timed rounds, and the workers compile side by side).
        Every worker that answered is added to ``prepared`` (to be told to drop the
        case); the first status that is not ``ready`` (a base worker's first: the base
        revision may not have the case) is returned with why."""
        __tracebackhide__ = True
        workers = self._workers()
        first = workers[0]
        status, why = first.call(self.prepare_timeout, "prepare", key, rel_file, qualname,
                                 case, spec)
        prepared.append(first)
        if status != "ready":
            return status, why
        rest = workers[1:]
        for arm in rest:
            arm.send("prepare", key, rel_file, qualname, case, spec)
        answers, errors = [], []
        for arm in rest:  # every answer read, so that no worker is left a reply behind
            try:
                answers.append(arm.answer(self.prepare_timeout, "prepare"))
                prepared.append(arm)
            except CompareError as exc:
                errors.append(exc)
        if errors:
            raise errors[0]
        for status, why in answers:
            if status != "ready":
                return status, why
        return "ready", ""

    def close(self, *, keep_logs: bool = False) -> Path | None:
        """Stop every worker and remove the trees; with ``keep_logs`` (the session was
        interrupted, perhaps while a worker hung), the workers' output (``base-0.log``,
        ``head-0.log``, ...) stays where it was, and its folder is returned."""
        for arm in self._workers():
            arm.stop()
        self._pairs.clear()
        kept = None
        if self._dir is not None:
            logs = sorted(self._dir.glob("*.log"))
            if keep_logs and logs:
                kept = self._dir
                for entry in self._dir.iterdir():
                    if entry.suffix != ".log":
                        if entry.is_dir():
                            shutil.rmtree(entry, ignore_errors=True)
                        else:
                            entry.unlink(missing_ok=True)
            else:
                shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
        return kept
