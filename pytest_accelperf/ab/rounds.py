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
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Listener
from pathlib import Path

from packaging.requirements import Requirement

from pytest_accelperf.ab import CompareError, EnvironmentSetupError
from pytest_accelperf.ab.arms import (
    BLOCK_TIMEOUT_S,
    PREPARE_TIMEOUT_S,
    Arm,
    plugin_root,
    start_arm,
)
from pytest_accelperf.ab.tree import (
    environment_dirs,
    extract,
    in_dirs,
    moved_path,
    resolve,
    snapshot,
    socket_dir,
    toplevel,
)
from pytest_accelperf.ab.worker import Setup, unsupported
from pytest_accelperf.backends.registry import get_backend
from pytest_accelperf.backends.spec import BackendSpec, BackendSpecError
from pytest_accelperf.collect.cases import Case
from pytest_accelperf.envs import EnvError
from pytest_accelperf.envs.cache import build_env, session_site
from pytest_accelperf.envs.depfiles import dependency_change, files_at, files_here
from pytest_accelperf.envs.stack import STACK_PACKAGES, check_python
from pytest_accelperf.git import GitError
from pytest_accelperf.provision.describe import LIBRARY_DISTRIBUTIONS, stack_words
from pytest_accelperf.provision.describe import stack_changes as fingerprint_stack_changes
from pytest_accelperf.records.program import ProgramRecord
from pytest_accelperf.records.run import Run
from pytest_accelperf.stats.bootstrap import ab_ratio
from pytest_accelperf.stats.contention import Contention, Load


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
    #: Each arm's program record (:mod:`pytest_accelperf.records.program`), where its stepper has
    #: one.
    programs: dict[str, ProgramRecord | None] = field(default_factory=dict)
    #: Which process pair (0, 1, ...) timed each round: its base and head workers.
    pairs: list[int] = field(default_factory=list)
    #: Process pairs the rounds were spread over.
    processes: int = 1
    #: The base revision's record of the case: its run, trained once by the first base
    #: worker as a normal run trains it (what the memory, numerics and loss checks read for
    #: that revision); None where there is none, and ``base_run_note`` says why.
    base_run: Run | None = None
    base_run_note: str = ""


def environment_entries(entries: Sequence[str], repo: Path) -> list[str]:
    """The entries of ``sys.path`` that are this interpreter's environment (its standard
    library, its site-packages and what lies under its prefixes:
    :func:`~pytest_accelperf.ab.tree.environment_dirs`), which a worker in another
    environment replaces with its own."""
    dirs = environment_dirs(repo)
    return [entry or os.getcwd() for entry in entries
            if in_dirs(Path(entry or os.getcwd()).resolve(), dirs)]


def round_orders(rng: random.Random) -> tuple[bool, bool]:
    """Whether base runs first in each of the next two rounds: one round of each order,
    which one comes first drawn at random."""
    base_first = rng.random() < 0.5
    return base_first, not base_first


def _as_environment(stack: Mapping[str, str], packages: Collection[str]) -> dict[str, object]:
    """A worker's stack (``{"python": ..., "jax": ..., "nvidia-cudnn-cu12": ...}``) in
    the fingerprint's shape: Python, ``packages`` among its packages, and its accelerator
    libraries under the names the fingerprint gives them."""
    return {"python": stack.get("python"),
            "packages": {k: v for k, v in stack.items()
                         if k in packages and k not in LIBRARY_DISTRIBUTIONS},
            "libraries": {LIBRARY_DISTRIBUTIONS[k]: v for k, v in stack.items()
                          if k in LIBRARY_DISTRIBUTIONS}}


class Comparison:
    """The session's A/B setup: the base tree and the two workers (started lazily).

    ``ref``: the base revision (None: the working tree's own files, with ``python``);
    ``python``: the base arm's interpreter (``--accelperf-compare-python``; None: this
    session's, or an environment built for ``ref`` where its dependency files differ:
    :mod:`pytest_accelperf.envs`). ``notify`` shows a line to the user now (which
    environment the base arm runs in)."""

    def __init__(self, ref: str | None, rootdir: Path, accel: str, cpu_devices: int,
                 platform: str | None, processes: int = 1, python: str | None = None,
                 notify: Callable[[str], None] | None = None,
                 prepare_timeout: float = PREPARE_TIMEOUT_S,
                 hook_packages: Sequence[str] = ()) -> None:
        self.ref = ref
        self.python = python
        #: The packages the ``pytest_accelperf_environment`` hook adds: in every case's
        #: stack, as in stored mode.
        self.hook_packages = tuple(hook_packages)
        if ref is not None:
            self.root, self.sha = resolve(rootdir, ref)
        else:
            self.root, self.sha = toplevel(rootdir, "--accelperf-compare-python"), ""
        self._accel, self._cpu_devices, self._platform = accel, cpu_devices, platform
        self._notify = notify
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
        #: Why the trees or arms could not be set up, once that failed; and whether it was
        #: the base arm's environment.
        self._failed: str | None = None
        self._failed_env = False
        #: The base arm's interpreter once started (None: this session's).
        self.base_python: str | None = None
        #: What the base arm's environment is, in words ("" where it is this session's).
        self.base_env = ""
        #: Each arm's stack (:func:`~pytest_accelperf.envs.stack.stack_versions`).
        self.stacks: dict[str, dict[str, str]] = {}
        #: The packages an environment built for the base revision installed (named in
        #: the stacks too).
        self._installed: list[str] = []
        #: Per backend, why the base arm's environment cannot train its cases ("": it can).
        self._checked: dict[str, str] = {}

    def _is_session_python(self) -> bool:
        """Whether the given interpreter is this session's own (``accelperf bisect`` gives
        it, to keep every commit's comparison in one environment)."""
        return self.python is not None and os.path.abspath(self.python) == os.path.abspath(
            sys.executable)

    @property
    def label(self) -> str:
        if self.ref is None:
            return f"the working tree under {self.python}"
        under = f" under {self.python}" if self.python and not self._is_session_python() else ""
        return f"{self.ref} ({self.sha[:10]}){under}"

    def stack_change(self, backend: BackendSpec | None = None) -> str:
        """How the head's stack differs from the base's as a case of ``backend`` sees it
        (``stack: jax 0.8.3 → 0.10.2``), or ``""``."""
        return stack_words(self.stack_changes(backend))

    def stack_changes(self, backend: BackendSpec | None = None) -> list[str]:
        """:meth:`stack_change`, one package a phrase (``["jax 0.8.3 → 0.10.2"]``), what
        the checks of the base arm's record name (:func:`~pytest_accelperf.ab.verdict.
        ab_record_checks`). As in stored mode (:func:`~pytest_accelperf.provision.
        fingerprint.stack_changes`), only what the case's ``backend`` declares counts of
        the framework packages (None: all), with Python, the accelerator's libraries, the
        packages an environment built for the base installed, and the hook's packages."""
        if len(self.stacks) < 2:
            return []
        kept = {*(backend.packages if backend is not None and backend.packages is not None
                  else STACK_PACKAGES), *self._installed, *self.hook_packages}
        base, head = (_as_environment(self.stacks[arm], kept) for arm in ("base", "head"))
        return fingerprint_stack_changes(head, base, known=())
    def revision(self, arm: str) -> str:
        """What ``arm`` runs, as messages name it."""
        return self.label if arm == "base" else "the working tree"

    def _start(self) -> None:
        """The two trees and arms; a setup that failed (git stuck past its timeout, an arm
        that did not start, an environment that could not be built) is not tried again:
        every later case fails at once with its message, instead of waiting as long again.
        Half of it (one arm) is stopped."""
        if self._failed is not None:
            kind = EnvironmentSetupError if self._failed_env else CompareError
            raise kind(f"{self._failed} (found by an earlier case of this session; not "
                       f"tried again)")
        try:
            self._start_arms()
        except EnvError as exc:
            self._failed, self._failed_env = str(exc), True
            self.close()
            raise EnvironmentSetupError(str(exc)) from None
        except CompareError as exc:
            self._failed = str(exc)
            self.close()
            raise

    def _base_interpreter(self) -> str | None:
        """The base arm's interpreter: the given one; for a revision whose dependency
        files differ from the working tree's, an environment built for it (the session's
        with the revision's requirements installed over it, cached); else None (this
        session's)."""
        if self.python is not None and not self._is_session_python():
            self.base_env = f"the environment of {self.python}"
            return self.python
        if self.python is not None:
            return None  # this session's own: as without the option
        if self.ref is None:
            return None
        try:
            change = dependency_change(files_at(self.root, self.sha), files_here(self.root))
        except GitError as exc:
            raise CompareError(f"reading {self.ref}'s dependency files: {exc}") from None
        if not change.files:
            return None
        for part in change.unreadable:  # one rule for every file: go on, saying so
            self._say(f"accelperf: A/B: {self.label}'s {part} cannot be read: nothing of it "
                      f"is installed, the base arm goes on without it in this session's "
                      f"environment")
        differ = f"{self.ref}'s dependency files differ ({', '.join(change.files)})"
        notes = f" ({'; '.join(change.notes)})" if change.notes else ""
        if not change.requirements:
            self._say(f"accelperf: A/B: {differ}, but in no requirement this environment "
                      f"lacks{notes}: both arms run in this session's environment")
            return None
        env = build_env(change.requirements, over=session_site())
        self._installed = [Requirement(r).name for r in change.requirements]
        self.base_env = env.describe()
        self._say(f"accelperf: A/B: {differ}: its arm runs in {env.describe()}{notes}")
        return str(env.python)

    def _say(self, text: str) -> None:
        if self._notify is not None:
            self._notify(text)

    def _start_arms(self) -> None:
        self.base_python = self._base_interpreter()
        self._dir = socket_dir("accelperf-compare-", "socket")
        trees = {"base": (extract(self.root, self.sha, self._dir) if self.ref is not None
                          else snapshot(self.root, self._dir, "base")),
                 "head": snapshot(self.root, self._dir)}
        self._authkey = secrets.token_bytes(16)
        listener = Listener(str(self._dir / "socket"), family="AF_UNIX",
                            authkey=self._authkey)
        env_path = environment_entries(sys.path, self.root)
        try:
            for j in range(self.processes):
                pair: dict[str, Arm] = {}
                self._pairs.append(pair)
                for arm, arm_tree in trees.items():
                    entries = [p or os.getcwd() for p in sys.path]
                    python = self.base_python if arm == "base" else None
                    setup = Setup(arm=arm, tree=str(arm_tree), head_root=str(self.root),
                                  sys_path=moved_path(entries, self.root, arm_tree),
                                  accel=self._accel, cpu_devices=self._cpu_devices,
                                  platform=self._platform, pair=j, env_path=env_path,
                                  own_env=python is not None,
                                  prepare_timeout=self.prepare_timeout)
                    self._setups[j, arm] = setup
                    pair[arm] = start_arm(setup, listener, self._authkey,
                                          self._dir / f"{arm}-{j}.log", self.revision(arm),
                                          workers=2 * self.processes, python=python)
        finally:
            listener.close()
        first = self._pairs[0]
        self.stacks = {arm: first[arm].call(BLOCK_TIMEOUT_S, "stack",
                                            [*self._installed, *self.hook_packages])
                       for arm in first}

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
                    workers=2 * self.processes,
                    python=self.base_python if name == "base" else None)
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
                budget: float, tolerance: float, spec: BackendSpec | None = None,
                record: bool = True, timeout: float | None = None
                ) -> tuple[str, str, ABMeasurement]:
        """Prepare the case in both workers and alternate blocks of steps. Returns
        ``(status, why, measurement)``; status ``ready`` when measured. ``spec`` is the
        case's backend as the session registered it (default: the built-in of that name);
        the workers, outside pytest, import it by its module.

        With ``record``, the first base worker first trains the case once as a normal run
        (within ``timeout`` seconds, the case's ``--accelperf-timeout``:
        :meth:`_base_record`), and the measurement carries that run (``base_run``, or
        ``base_run_note``: why none), also where the case cannot be timed in blocks."""
        __tracebackhide__ = True
        out = ABMeasurement()
        spec = spec if spec is not None else get_backend(case.backend)
        if spec.ab_blocks:  # else the workers say so, once they know the test exists
            try:
                spec.check_importable("an A/B worker")
            except BackendSpecError as exc:
                out.base_run_note = str(exc)
                return "unsupported", str(exc), out
        elif not spec.importable:
            out.base_run_note = unsupported(spec)
            return "unsupported", unsupported(spec), out
        if not self._pairs:
            self._start()
        else:
            self._revive()
        lacking = self._lacking(spec)
        if lacking:
            raise EnvironmentSetupError(lacking)
        key = case.id
        prepared: list[Arm] = []
        try:
            if record:
                status, why = self._base_record(key, rel_file, qualname, case, spec, timeout,
                                                prepared, out)
                if status != "ready":
                    return status, why, out
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

    def _base_record(self, key: str, rel_file: str, qualname: str, case: Case,
                     spec: BackendSpec, timeout: float | None, prepared: list[Arm],
                     out: ABMeasurement) -> tuple[str, str]:
        """The base revision's record of the case, into ``out`` (``base_run``, or why there
        is none in ``base_run_note``): the first base worker finds the test (``locate``,
        within the prepare deadline: a suite that hangs on import is caught as in a
        prepare), then trains the case once as a normal run (``record``), within the
        case's ``timeout`` plus the prepare deadline, before any stepper of it exists.
        ``("absent", why)`` where the base revision has no such test, else ``("ready",
        "")``; the worker joins ``prepared`` (to be told to drop the case)."""
        __tracebackhide__ = True
        first = self._workers()[0]
        status, why = first.call(self.prepare_timeout, "locate", key, rel_file, qualname)
        prepared.append(first)
        if status != "ready":
            out.base_run_note = why
            return status, why
        found, note = first.call((timeout or 0.0) + self.prepare_timeout, "record", key,
                                 case, spec, timeout)
        if found is None:
            out.base_run_note = note
        else:
            out.base_run = Run.from_json(found)
        return "ready", ""

    def _lacking(self, spec: BackendSpec) -> str:
        """Why the base arm's environment cannot train a case of ``spec`` (it cannot import
        what the backend needs), in one line naming the interpreter and the fix; or
        ``""``. Asked once per backend."""
        if self.base_python is None or not spec.requires:
            return ""
        if spec.name not in self._checked:
            try:
                check_python(self.base_python, plugin_root(), spec.requires, spec.name)
                self._checked[spec.name] = ""
            except EnvError as exc:
                self._checked[spec.name] = str(exc)
        return self._checked[spec.name]

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
        if first not in prepared:
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
