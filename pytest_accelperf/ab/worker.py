"""One arm of an A/B comparison (:mod:`pytest_accelperf.ab`): a long-lived process that
imports the suites of one revision, builds the step of each case it is asked for, and
trains blocks of steps when told to.

It is started as ``python -m pytest_accelperf.ab.worker`` with the controller's
connection details in the environment, so the plugin itself is the working tree's in both
arms (its modules are imported before anything else); then ``sys.path`` becomes the
controller's, with every entry inside the repository moved to this arm's tree. What differs
between the arms is what the suites import from the repository's files: the model, the
training code, the suite itself.

A case's task is built by calling the test function itself with a stand-in ``accelperf``
fixture whose ``train(task)`` captures the task and stops the function there: the same
``make_task(...)`` the test runs under pytest, at this arm's revision. A single-process case
is then trained here, by its backend's stepper; a case trained in ranks (DDP, DeepSpeed)
by a group of ranks this worker starts for it (:mod:`pytest_accelperf.ab.rank_groups`).

The first base worker also gives the base revision's *record* of a case
(:meth:`Worker.locate`, then :meth:`Worker.record`, then :meth:`Worker.prepare`): the case
trained once as a normal run trains it, by the same code
(:func:`pytest_accelperf.backends.local.train_here`: the backend's ``train``, or its ranks for
a case trained in ranks), bounded by the case's ``--accelperf-timeout``, before its stepper
is built. Its :class:`~pytest_accelperf.records.run.Run` (as JSON) carries what the memory,
numerics and loss checks read for that revision.

This module imports no ML framework at import time (the device environment is in place
first: the controller's ``XLA_FLAGS`` and ``JAX_PLATFORMS`` are inherited).
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import os
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Client, Connection
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, NoReturn, TypeGuard

if TYPE_CHECKING:
    from pytest_accelperf.ab.rank_groups import BlockTrainer
    from pytest_accelperf.backends.protocol import Stepper, Task
    from pytest_accelperf.backends.spec import BackendSpec
    from pytest_accelperf.collect.cases import Case
    from pytest_accelperf.provision.accel import Accelerator
    from pytest_accelperf.records.jsonvalue import JSONValue
    from pytest_accelperf.records.program import ProgramRecord

#: Environment of a worker: the controller's address and key, and its arm's setup (JSON).
ADDRESS_ENV = "ACCELPERF_AB_ADDRESS"
#: Set in a worker's environment: its process pair (``Setup.pair``), and its arm.
PAIR_ENV = "ACCELPERF_AB_PAIR"
AUTHKEY_ENV = "ACCELPERF_AB_AUTHKEY"
SETUP_ENV = "ACCELPERF_AB_SETUP"


class NotCapturable(BaseException):
    """Raised by the stand-in fixture when the test function uses more of the fixture than
    ``case``, ``accelerator`` and ``train(task)``: the case cannot be rebuilt here, and is
    not compared (a BaseException, as :class:`Captured`)."""


class Captured(BaseException):
    """Raised by the stand-in fixture's ``train`` to stop the test function there (a
    BaseException so that a test's own ``except Exception`` cannot swallow it)."""

    def __init__(self, task: Task) -> None:
        super().__init__("task captured")
        self.task = task


class CaptureRunner:
    """The ``accelperf`` fixture as an A/B worker gives it to a test function: ``case``
    and ``accelerator`` are real; ``train(task)`` captures ``task``."""

    def __init__(self, case: Case, accelerator: Accelerator) -> None:
        self.case = case
        self.accelerator = accelerator

    def train(self, task: Task, **_: object) -> NoReturn:
        raise Captured(task)

    def __getattr__(self, name: str) -> NoReturn:
        raise NotCapturable(
            f"A/B comparison builds a case's task by running the test function up to "
            f"accelperf.train(task); this test used accelperf.{name} before that, which "
            f"only a real session has (train the case with accelperf.train(task) to "
            f"compare it)")


@dataclass
class Setup:
    """What the controller tells a worker about its arm."""

    arm: str  # "base" or "head"
    tree: str  # the root of this arm's files
    head_root: str  # the repository's working tree (the controller's)
    sys_path: list[str]  # the controller's sys.path, entries already moved to ``tree``
    accel: str
    cpu_devices: int
    platform: str | None
    #: Which process pair of the comparison this worker belongs to (0, 1, ...); the
    #: worker's environment has it as ``ACCELPERF_AB_PAIR``.
    pair: int = 0
    #: Seconds the controller waits for a ``prepare`` (``--accelperf-compare-prepare-
    #: timeout``); a rank group gets :data:`RANKS_SHARE` of it, so that this worker answers
    #: with the ranks' reason before the controller gives up on it.
    prepare_timeout: float = 600.0
    #: The entries of ``sys_path`` that are the controller's environment (its standard
    #: library and site-packages), replaced by the worker's own where it runs under
    #: another interpreter (``own_env``).
    env_path: list[str] = field(default_factory=list)
    own_env: bool = False


#: The share of the prepare deadline a case's rank group gets to start and warm up.
RANKS_SHARE = 0.9


def worker_path(setup: Setup, own: list[str]) -> list[str]:
    """The worker's ``sys.path``: the controller's (``setup.sys_path``), where the worker
    runs in another environment with the controller's environment entries replaced by
    its own (``own``, its path at start), which come where the controller's first did.

    >>> s = Setup("base", "/t", "/r", ["/t/suites", "/venv/site", "/t"], "cpu", 1, None,
    ...           env_path=["/venv/site"], own_env=True)
    >>> worker_path(s, ["/t", "/plugin", "/old/site"])
    ['/t/suites', '/plugin', '/old/site', '/t']
    """
    if not setup.own_env:
        return list(setup.sys_path)
    theirs = set(setup.env_path)
    out: list[str] = []
    for entry in setup.sys_path:
        if entry in theirs:
            if not any(e in out for e in own):
                out.extend(e for e in own if e not in setup.sys_path)
            continue
        out.append(entry)
    out.extend(e for e in own if e not in out)
    return out


def _foreign_modules(setup: Setup) -> list[str]:
    """Modules this base worker imported from the working tree instead of its own files
    (an editable install's import hook, a hard-coded path): the comparison would be of
    the working tree against itself."""
    from pytest_accelperf.ab.tree import environment_dirs, in_dirs

    if setup.arm != "base":
        return []
    head = Path(setup.head_root).resolve()
    plugin = Path(__file__).resolve().parents[1]  # the pytest_accelperf package
    # The environments, this worker's own and the controller's (the session's site-packages
    # under an environment built over it), are not the working tree's code even where they
    # lie inside the repository (a .venv at its root).
    environment = environment_dirs(head) + [Path(e).resolve() for e in setup.env_path]
    out = []
    for name, module in list(sys.modules.items()):
        file = getattr(module, "__file__", None)
        if not file:
            continue
        path = Path(file).resolve()
        if (path.is_relative_to(head) and not path.is_relative_to(plugin)
                and not in_dirs(path, environment)):
            out.append(f"{name} ({path})")
    return out


def in_ranks(spec: BackendSpec, world_size: int) -> bool:
    """Whether a case of backend ``spec`` and ``world_size`` trains in ranks (its spec's
    ``ranks``): every case of a backend with ranks and no stepper (DeepSpeed), and the
    ``world_size > 1`` cases of one with both (torch: DDP)."""
    return spec.ranks is not None and (spec.spans_ranks(world_size) or not spec.ab_blocks)


def unsupported(spec: BackendSpec) -> str:
    """Why a case of backend ``spec`` (a :class:`~pytest_accelperf.backends.spec.BackendSpec`
    without ``ab_blocks``) is not compared in A/B mode."""
    return (f"the {spec.name} backend cannot train a case in blocks of steps (its "
            f"BackendSpec does not declare ab_blocks)")


class Worker:
    def __init__(self, setup: Setup) -> None:
        self.setup = setup
        #: Per case, what this arm steps it with: its backend's stepper, or a group of ranks
        #: (:class:`~pytest_accelperf.ab.rank_groups.RankGroupStepper`, which also has ``pids``
        #: and ``close``).
        self.steppers: dict[str, Stepper] = {}
        #: Per case, its test function as :meth:`locate` found it.
        self.targets: dict[str, Callable[..., object]] = {}
        self._accelerator: Accelerator | None = None

    def accelerator(self) -> Accelerator:
        if self._accelerator is None:
            from pytest_accelperf.provision.accel import provision

            s = self.setup
            self._accelerator = provision(s.accel, s.cpu_devices, s.platform)
        return self._accelerator

    def locate(self, key: str, rel_file: str, qualname: str) -> tuple[str, str]:
        """Import the test's module from this arm's tree and find its function:
        ``("ready", "")``, or ``("absent", why)`` when this revision has no such test. What
        :meth:`prepare` and :meth:`record` do first (kept for them: a second call is a
        lookup)."""
        path = Path(self.setup.tree) / rel_file
        if not path.is_file():
            return "absent", f"{rel_file} does not exist"
        module = self._import(path)
        target: Any = module
        for part in qualname.split("."):
            target = getattr(target, part, None)
            if target is None:
                return "absent", f"{rel_file} has no {qualname}"
        if "." in qualname:  # a method of a test class: call it on an instance
            owner_name, method = qualname.rsplit(".", 1)
            owner: Any = module
            for part in owner_name.split("."):
                owner = getattr(owner, part)
            target = getattr(owner(), method)
        self.targets[key] = target
        return "ready", ""

    def prepare(self, key: str, rel_file: str, qualname: str, case: Case,
                spec: BackendSpec) -> tuple[str, str]:
        """Build the case's stepper and warm it up. ``("ready", "")``, or ``("absent",
        why)`` when this revision has no such test, or ``("unsupported", why)`` when the
        backend (``spec``, a :class:`~pytest_accelperf.backends.spec.BackendSpec`) neither
        declares ``ab_blocks`` nor has ranks that train in blocks (``block_job``), or the
        test function cannot be run up to ``accelperf.train(task)`` here."""
        status, why = self.locate(key, rel_file, qualname)
        if status != "ready":
            return status, why
        target = self.targets[key]
        ranks = in_ranks(spec, case.world_size)
        trainer = spec.load_ranks() if ranks else None
        if ranks and not _trains_blocks(trainer):
            return "unsupported", (f"the {spec.name} backend's ranks cannot train a case in "
                                   f"blocks of steps (its RankTrainer has no block_job)")
        if not ranks and not spec.ab_blocks:
            return "unsupported", unsupported(spec)
        # Its stepper: what ab_blocks declares, beyond the Backend protocol.
        backend: Any = None if ranks else spec.load()
        try:
            task = self._capture(target, case)
        except NotCapturable as exc:
            return "unsupported", str(exc)
        self._refuse_foreign()
        # Ranks of its own, built and warmed up as in a run.
        if trainer is not None and _trains_blocks(trainer):
            from pytest_accelperf.ab.rank_groups import RankGroupStepper

            _pickle_by_value(target)
            self.steppers[key] = RankGroupStepper(
                trainer, case, task, self.accelerator(),
                prepare_s=RANKS_SHARE * self.setup.prepare_timeout)
            return "ready", ""
        assert backend is not None
        stepper = backend.stepper(case, task, self.accelerator())
        stepper.run(max(case.warmup, 2))  # warm caches, allocators, the first compile
        self.steppers[key] = stepper
        return "ready", ""

    def record(self, key: str, case: Case, spec: BackendSpec,
               timeout: float | None) -> tuple[dict[str, JSONValue] | None, str]:
        """The base revision's record of the case: the case trained once as a normal run
        trains it (:meth:`_train_record`), its test found first by :meth:`locate`, before
        any stepper of it exists (nothing of a stepper counts in its memory); a backend
        that cannot train in blocks gives it too. Its run's JSON and ``""``; or None and
        why there is none."""
        target = self.targets.get(key)
        if target is None:
            return None, "its test was not located in the base revision"
        found = self._train_record(target, case, spec, timeout)
        if isinstance(found, str):
            return None, found
        return found, ""

    def _train_record(self, target: Callable[..., object], case: Case, spec: BackendSpec,
                      timeout: float | None) -> dict[str, JSONValue] | str:
        """The case trained once as the pytest process trains it in a normal run: a task
        captured afresh, trained by :func:`~pytest_accelperf.backends.local.train_here`
        (the backend's ``train``, or its ranks), within ``timeout`` seconds. Its run's
        JSON; or, where the test function cannot be run up to ``accelperf.train(task)``
        here, why not (the run's own failures, an error or a timeout, are its outcome)."""
        from pytest_accelperf.backends.local import train_here

        try:
            task = self._capture(target, case)
        except NotCapturable as exc:
            return str(exc)
        self._refuse_foreign()
        if spec.spans_ranks(case.world_size):
            _pickle_by_value(target)
        try:
            result = train_here(spec, case, task, self.accelerator(), timeout=timeout)
        except Exception as exc:
            from pytest_accelperf.provision.device_errors import classify

            if classify(exc) is not None:  # the device's: serve() handles it
                raise
            return f"its training raised {type(exc).__name__}: {exc}"
        run_json: dict[str, JSONValue] = result.run.to_json()  # sent over the connection
        return run_json

    def _refuse_foreign(self) -> None:
        """Stop where this base worker imported code under test from the working tree
        (:func:`_foreign_modules`): its comparison would be of the working tree with
        itself."""
        foreign = _foreign_modules(self.setup)
        if foreign:
            raise RuntimeError(
                "the base revision's worker imported these modules from the working tree, "
                "not from the base revision's files, so the comparison would be of the "
                "working tree with itself: " + ", ".join(foreign[:5]) + ". Import the "
                "code under test through sys.path (e.g. a src/ directory pytest adds with "
                "pythonpath=src), not an editable install's import hook")

    def _import(self, path: Path) -> ModuleType:
        name = f"_accelperf_ab_{self.setup.arm}_{abs(hash(str(path)))}_{path.stem}"
        if name in sys.modules:
            return sys.modules[name]
        if str(path.parent) not in sys.path:
            sys.path.insert(0, str(path.parent))
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot import {path}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        return module

    def _capture(self, function: Callable[..., object], case: Case) -> Task:
        params = inspect.signature(function).parameters
        missing = [n for n, p in params.items() if p.default is inspect.Parameter.empty
                   and n != "accelperf"]
        if missing:
            raise TypeError(f"A/B comparison runs the test function with the accelperf "
                            f"fixture only; it also asks for {', '.join(missing)}")
        try:
            function(accelperf=CaptureRunner(case, self.accelerator()))
        except Captured as captured:
            return captured.task
        raise RuntimeError("the test function returned without calling accelperf.train(task)")

    def stack(self, extra: list[str] | None = None) -> dict[str, str]:
        """This worker's environment: Python and its framework packages' versions, and
        those of the ``extra`` packages (what an environment built for the base revision
        installed). The framework packages are every registered backend's (a trainer's
        ``lightning`` or ``transformers`` among them), so that each case's stack line can
        name what its backend declares."""
        from pytest_accelperf.backends.registry import BACKENDS
        from pytest_accelperf.envs.stack import STACK_PACKAGES, stack_versions

        return stack_versions([*STACK_PACKAGES, *BACKENDS.packages(), *(extra or [])])

    def run(self, key: str, n: int) -> list[float]:
        times: list[float] = self.steppers[key].run(n)
        return times

    def program(self, key: str) -> ProgramRecord | None:
        """The case's program record (:mod:`pytest_accelperf.records.program`) at this arm's
        revision, when its stepper has one."""
        # A conftest's backend may give a stepper with no program at all: none to diff.
        record: ProgramRecord | None = getattr(self.steppers[key], "program", None)
        return record

    def pids(self, key: str) -> list[int]:
        """The processes that train the case besides this one (its ranks), for the
        contention reading."""
        return list(getattr(self.steppers.get(key), "pids", []))

    def drop(self, key: str) -> None:
        self.targets.pop(key, None)
        close = getattr(self.steppers.pop(key, None), "close", None)
        if callable(close):
            close()  # a rank group: stopped, and nothing left running

    def close(self) -> None:
        for key in list(self.steppers):
            self.drop(key)


def _trains_blocks(trainer: object) -> TypeGuard[BlockTrainer]:
    """Whether a backend's ``RankTrainer`` trains a case in blocks of steps (has
    ``block_job``, :class:`~pytest_accelperf.ab.rank_groups.BlockTrainer`)."""
    return callable(getattr(trainer, "block_job", None))


def _pickle_by_value(function: object) -> None:
    """Have cloudpickle ship the functions of the test's module by value: the module was
    imported here under a name of its own, which the ranks cannot import."""
    import cloudpickle  # type: ignore[import-untyped]  # untyped

    module = sys.modules.get(getattr(function, "__module__", "") or "")
    if module is not None and module.__name__.startswith("_accelperf_ab_"):
        cloudpickle.register_pickle_by_value(module)


def serve(conn: Connection, worker: Worker) -> None:
    """Answer the controller's requests until it says stop or goes away."""
    while True:
        try:
            request = conn.recv()
        except (EOFError, OSError):
            return
        op, args = request[0], request[1:]
        if op == "stop":
            conn.send(("ok", None))
            return
        try:
            conn.send(("ok", getattr(worker, op)(*args)))
        except Exception as exc:
            from pytest_accelperf.provision.device_errors import classify, release_device_memory

            device = classify(exc)
            broken = device is not None and device.sticky
            conn.send(("error", f"{type(exc).__name__}: {exc}",
                       "".join(traceback.format_exception(exc))[-4000:], broken))
            if broken:  # this process's CUDA context is unusable: end it (it is replaced)
                return
            if device is not None:
                release_device_memory()


def main() -> None:
    setup = Setup(**json.loads(os.environ[SETUP_ENV]))
    sys.path[:] = worker_path(setup, list(sys.path))
    address = os.environ[ADDRESS_ENV]
    conn = Client(address, authkey=bytes.fromhex(os.environ[AUTHKEY_ENV]))
    worker = Worker(setup)
    try:
        serve(conn, worker)
    finally:
        worker.close()
        conn.close()


if __name__ == "__main__":
    main()
