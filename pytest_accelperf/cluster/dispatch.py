"""Dispatching a case to the Ray cluster (see :mod:`pytest_accelperf.cluster` for the
picture): its resources reserved (:mod:`.placement` says which), its fresh actors, their
progress while they train (:class:`_Follow`), the faults, and the run that comes back
(:func:`train`).
"""

from __future__ import annotations

import importlib
import os
import re
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any

from pytest_accelperf.backends.procs.events import ProgressEvent, error_event, progress_events
from pytest_accelperf.backends.procs.launch import RankReport, show_latest_step
from pytest_accelperf.backends.protocol import Task, TrainResult
from pytest_accelperf.backends.registry import get_backend
from pytest_accelperf.backends.spec import BackendSpec, BackendSpecError
from pytest_accelperf.cluster.connection import HOST_RESOURCE, ClusterError, import_ray
from pytest_accelperf.cluster.placement import describe_nodes, feasible, placement, shown
from pytest_accelperf.collect.cases import Case
from pytest_accelperf.provision.accel import Accelerator

if TYPE_CHECKING:
    from pytest_accelperf.cluster.handles import ActorHandle, ObjectRef, PlacementGroup
    from pytest_accelperf.cluster.worker import HostInfo
    from pytest_accelperf.records.run import Run

#: Seconds a worker may take beyond the case's own timeout (process start, imports,
#: compile) before it is killed; the backend itself stops at a step boundary first.
GRACE_S = 120.0
#: Seconds between reads of a running case's progress (and checks of its deadline).
POLL_S = 0.5


# -- running actors -----------------------------------------------------------------------
@dataclass
class _Gang:
    """The actors of one case, in one placement group, and where each runs."""

    actors: list[Any]
    hosts: list[HostInfo]

    def host(self, index: int) -> str:
        if index >= len(self.hosts):
            return "host ? (node ?, id ?, pid ?)"
        h = self.hosts[index]
        return (f"host {h.get('hostname', '?')} (node {h.get('node_ip', '?')}, id "
                f"{str(h.get('node_id', '?'))[:8]}, pid {h.get('pid', '?')})")


def _worker_env(extra: dict[str, str]) -> dict[str, str]:
    """The runtime environment of a case's workers: the suite's import path and the
    session's device environment (``XLA_FLAGS``, ``JAX_PLATFORMS``), plus ``extra``."""
    from pytest_accelperf.backends.measure.common import INJECT_ENV
    from pytest_accelperf.backends.procs.launch import EXTENSIONS_ENV, default_extensions_dir
    from pytest_accelperf.cluster.worker import THREADS_ENV

    paths = [p if p else os.getcwd() for p in sys.path]
    env = {"PYTHONPATH": os.pathsep.join(paths), EXTENSIONS_ENV: str(default_extensions_dir()),
           "PYTHONUNBUFFERED": "1"}
    for key in ("XLA_FLAGS", "JAX_PLATFORMS", "OMP_NUM_THREADS", INJECT_ENV):
        if os.environ.get(key):
            env[key] = os.environ[key]
    if "OMP_NUM_THREADS" in env:
        env[THREADS_ENV] = env["OMP_NUM_THREADS"]
    env.update(extra)
    return env


@contextmanager
def _gang(case: Case, accel: Accelerator, wait: float,
          envs: Sequence[dict[str, str]]) -> Iterator[_Gang]:
    """Reserve the case's resources (failing after ``wait`` s when the cluster cannot ever
    hold them), start one fresh actor per process with ``envs[i]``, and kill them all and
    free the reservation on the way out, whatever happened (Ctrl-C included)."""
    __tracebackhide__ = True
    ray = import_ray()
    pg_mod: Any = importlib.import_module("ray.util.placement_group")
    strategies: Any = importlib.import_module("ray.util.scheduling_strategies")
    from pytest_accelperf.cluster.worker import CaseWorker

    nodes = [n for n in ray.nodes() if n.get("Alive")]
    bundles, strategy = placement(case, accel, nodes)
    pg = pg_mod.placement_group(bundles, strategy=strategy,
                                name=f"accelperf:{case.id}"[:100])
    actors: list[Any] = []
    try:
        _await_placement(ray, pg, case, bundles, strategy, wait)
        remote = ray.remote(CaseWorker)
        for i, bundle in enumerate(bundles):
            gpus = bundle.get("GPU", 0.0)
            custom = {k: v for k, v in bundle.items() if k != "GPU"}
            actors.append(remote.options(
                num_cpus=0, num_gpus=gpus, resources=custom, max_restarts=0,
                runtime_env={"env_vars": _worker_env(envs[i])},
                scheduling_strategy=strategies.PlacementGroupSchedulingStrategy(
                    placement_group=pg, placement_group_bundle_index=i),
            ).remote())
        hosts = ray.get([a.where.remote() for a in actors], timeout=GRACE_S)
        yield _Gang(actors, hosts)
    finally:
        for a in actors:
            ray.kill(a, no_restart=True)
        pg_mod.remove_placement_group(pg)


def _await_placement(ray: ModuleType, pg: PlacementGroup, case: Case,
                     bundles: list[dict[str, float]], strategy: str, wait: float) -> None:
    __tracebackhide__ = True
    start = time.monotonic()
    ready = pg.ready()
    while True:
        done, _ = ray.wait([ready], timeout=1.0)
        if done:
            return
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        if feasible(bundles, strategy, nodes):
            start = time.monotonic()  # busy, not impossible: other cases hold it
            continue
        if time.monotonic() - start > wait:
            asked = " + ".join(f"{{{shown(b)}}}" for b in bundles)
            fix = (f"start nodes with --resources='{{\"{HOST_RESOURCE}\": 1}}'"
                   if any(HOST_RESOURCE in b for b in bundles)
                   else "add a node that has them (Ray detects GPU and TPU itself)")
            raise ClusterError(
                f"{case.id} asks the Ray cluster for {asked} ({strategy}), which it does not "
                f"have after waiting {wait:g} s; the cluster has: {describe_nodes(nodes)}. "
                f"{fix[0].upper()}{fix[1:]} (or raise --accelperf-cluster-wait)")


class _Follow:
    """The progress of a case's actors while they train, read from the driver's
    :class:`~pytest_accelperf.cluster.worker.ProgressBoard`, where each actor posts under
    its key in :attr:`keys`. One read is in flight per actor at a time. The first actor's
    steps (rank or process 0) go to the terminal line, as a local case's do; every actor's
    events are kept, so a worker that dies or is killed at the timeout leaves behind the
    steps it had posted."""

    def __init__(self, ray: ModuleType, n_actors: int, total_steps: int | None = None) -> None:
        self._ray = ray
        self._total = total_steps
        self._errors: Any = importlib.import_module("ray.exceptions").RayError
        self.board = _board(ray)
        tag = uuid.uuid4().hex[:12]
        self.keys = [f"{tag}/{i}" for i in range(n_actors)]
        self.events: list[list[ProgressEvent]] = [[] for _ in range(n_actors)]
        self._pending: list[Any] = [None] * n_actors

    def _ask(self, i: int) -> ObjectRef:
        return self.board.read.remote(self.keys[i], len(self.events[i]))

    def _take(self, i: int, ref: ObjectRef, timeout: float | None) -> list[ProgressEvent]:
        """Add what ``ref`` answered, and return it."""
        # An actor that died, or did not answer in time, keeps what was read of it.
        with suppress(self._errors):
            new: list[ProgressEvent] = self._ray.get(ref, timeout=timeout)
            self.events[i].extend(new)
            return new
        return []

    def poll(self) -> None:
        for i in range(len(self.keys)):
            ref = self._pending[i]
            if ref is not None and self._ray.wait([ref], timeout=0)[0]:
                self._pending[i] = None
                new = self._take(i, ref, timeout=None)
                if i == 0:
                    show_latest_step(new, self._total)
            if self._pending[i] is None:
                self._pending[i] = self._ask(i)

    def finish(self, timeout: float = 5.0) -> None:
        """One last read of every actor's events (the board keeps a dead one's), after
        the actors still alive (a rank blocked in a collective) have posted theirs."""
        from pytest_accelperf.cluster.worker import POST_S

        time.sleep(2 * POST_S)
        for i in range(len(self.keys)):
            if self._pending[i] is not None:
                self._take(i, self._pending[i], timeout)
                self._pending[i] = None
            self._take(i, self._ask(i), timeout)

    def close(self) -> None:
        """Drop this case's events from the board (fire-and-forget)."""
        with suppress(self._errors):
            self.board.drop.remote(self.keys)

    def report(self, index: int) -> RankReport:
        """What actor ``index`` had reported, as a launched rank's report."""
        report = RankReport(rank=index)
        report.add_progress(self.events[index])
        return report


#: The progress board of each Ray job (connection) of this process.
_BOARDS: dict[str, ActorHandle] = {}


def _board(ray: ModuleType) -> ActorHandle:
    """This driver's :class:`~pytest_accelperf.cluster.worker.ProgressBoard`, started on
    first use (a small actor holding no resources) and reused while the connection lasts;
    it ends with the connection, as every actor a driver owns does."""
    from pytest_accelperf.cluster.worker import ProgressBoard

    job = str(ray.get_runtime_context().get_job_id())
    if job not in _BOARDS:
        _BOARDS[job] = ray.remote(ProgressBoard).options(num_cpus=0, max_restarts=0).remote()
    return _BOARDS[job]


@dataclass
class _Failed:
    index: int
    died: bool
    error: BaseException


def _gather(ray: ModuleType, refs: list[ObjectRef], deadline: float | None,
            follow: _Follow) -> tuple[list[Any], _Failed | None, bool]:
    """Results of ``refs`` in order, following the actors' progress while they run; stops
    at the first failure (an actor that died or a task that raised) or at ``deadline``,
    after a last read of every actor's progress. Returns (results, failure, timed out)."""
    exceptions: Any = importlib.import_module("ray.exceptions")
    pending = list(refs)
    results: dict[int, Any] = {}
    failed: _Failed | None = None
    timed_out = False
    try:
        while pending and failed is None and not timed_out:
            follow.poll()
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            done, pending = ray.wait(pending, num_returns=1, timeout=min(
                POLL_S, POLL_S if left is None else left))
            for ref in done:
                index = refs.index(ref)
                try:
                    results[index] = ray.get(ref)
                except exceptions.RayActorError as exc:
                    failed = _Failed(index, True, exc)
                except exceptions.RayTaskError as exc:
                    failed = _Failed(index, False, exc)
                if failed is not None:
                    break
            timed_out = bool(pending) and deadline is not None and time.monotonic() > deadline
        if failed is not None or timed_out:
            follow.finish()
            return [], failed, failed is None
    finally:
        follow.close()
    return [results[i] for i in range(len(refs))], None, False


def _death(gang: _Gang, failed: _Failed, what: str, report: RankReport,
           total_steps: int | None = None) -> str:
    text = " ".join(str(failed.error).split())
    kind = re.search(r"[Ww]orker exit type: (\w+)", text)
    said = re.search(r"[Ww]orker exit detail: (.*?)(?: Some common causes|$)", text)
    if kind or said:
        detail = (f"Ray: exit type {kind.group(1) if kind else '?'}, "
                  f"{said.group(1).strip() if said else ''}").rstrip(", ")
    else:
        lines = str(failed.error).strip().splitlines()
        detail = next((line.strip() for line in lines if "died" in line.lower()),
                      lines[0] if lines else "")
    where = report.where(total_steps or _total(report))
    return (f"the Ray worker of {what} died on {gang.host(failed.index)} {where} "
            f"({detail[:300]}); this case failed, the session goes on")


def _cause(error: BaseException) -> BaseException:
    cause = getattr(error, "cause", None)
    return cause if isinstance(cause, BaseException) else error


# -- the entry point ----------------------------------------------------------------------
def train(case: Case, task: Task, accel: Accelerator, *, cpu_devices: int,
          platform: str | None, timeout: float | None, wait: float,
          spec: BackendSpec | None = None) -> TrainResult:
    """Train ``case`` on the connected cluster and return its run, as ``backend.train``
    would locally: in one worker, or, when it spans processes and its backend declares
    ``ranks``, in one worker per rank. ``spec`` is the case's backend as the session
    registered it (default: the built-in of that name); the workers import it by its
    module. A worker that dies gives the outcome ``error`` naming its host."""
    __tracebackhide__ = True
    spec = spec if spec is not None else get_backend(case.backend)
    try:
        spec.check_importable("a Ray worker")
    except BackendSpecError as exc:
        raise ClusterError(str(exc)) from None
    cloudpickle: Any = importlib.import_module("cloudpickle")
    if spec.spans_ranks(case.world_size):
        return _train_ranks(spec, case, task, accel, cloudpickle, cpu_devices=cpu_devices,
                            platform=platform, timeout=timeout, wait=wait)
    ray = import_ray()
    payload = cloudpickle.dumps((case, task, spec))
    deadline = time.monotonic() + timeout + GRACE_S if timeout else None
    with _gang(case, accel, wait, [{}]) as gang:
        follow = _Follow(ray, 1)
        ref = gang.actors[0].train.remote(payload, accel.name, cpu_devices, platform, timeout,
                                          follow.board, follow.keys[0])
        results, failed, timed_out = _gather(ray, [ref], deadline, follow)
        if failed is not None and not failed.died:
            raise failed.error  # the task's own exception, with the worker's traceback
        if failed is not None or timed_out:
            return TrainResult(run=_failed_run(case, gang, failed, timeout, "this case",
                                               follow))
    where, result = results[0]
    _check_platform(where, accel, platform)
    assert isinstance(result, TrainResult)
    result.run = result.run.noted(cluster=gang.hosts[0])
    return result


def _failed_run(case: Case, gang: _Gang, failed: _Failed | None, timeout: float | None,
                what: str, follow: _Follow) -> Run:
    """The run of a case whose worker died (``failed``) or was killed at the timeout,
    with the losses its first process had reported."""
    from pytest_accelperf.records.run import Outcome, Run

    report = follow.report(0)
    where = report.where(_total(report))
    if failed is None:
        outcome: Outcome = "timeout"
        message = (f"exceeded the {timeout:g} s timeout by {GRACE_S:g} s on "
                   f"{gang.host(0)}, {where}; its Ray worker(s) were killed")
    else:
        outcome, message = "error", _death(gang, failed, what, follow.report(failed.index))
    return Run(case_id=case.id, outcome=outcome, message=message,
               losses=[float(s["loss"]) for s in report.steps if "loss" in s],
               loss_steps=[int(s["step"]) for s in report.steps if "loss" in s])


def _total(report: RankReport) -> int | None:
    total = report.progress.get("total")
    return int(total) if isinstance(total, int) else None


def _check_platform(worker_platform: str, accel: Accelerator, platform: str | None) -> None:
    __tracebackhide__ = True
    if platform is None and worker_platform != accel.platform:
        raise ClusterError(
            f"the Ray worker's devices are {worker_platform}, but this session's baselines "
            f"are those of {accel.platform} (what pytest sees here): run pytest where the "
            f"devices match, or pass --accelperf-platform={worker_platform}")


def _train_ranks(spec: BackendSpec, case: Case, task: Task, accel: Accelerator,
                 cloudpickle: ModuleType, *, cpu_devices: int, platform: str | None,
                 timeout: float | None, wait: float) -> TrainResult:
    """A case whose ranks are Ray actors, one per host: its backend's
    :class:`~pytest_accelperf.backends.procs.ranks.RankTrainer` says what each runs and makes the
    run of what they returned or reported, as it does for ranks launched locally."""
    __tracebackhide__ = True

    from pytest_accelperf.backends.procs.launch import LaunchResult, describe_failure
    from pytest_accelperf.cluster.worker import THREADS_ENV

    ray = import_ray()
    trainer = spec.load_ranks()
    job = trainer.job(case, task, accel, cpu_devices=cpu_devices, platform=platform,
                      timeout=timeout)
    payload = cloudpickle.dumps((job.fn, job.args, job.device))
    n = case.world_size
    threads = os.environ.get("OMP_NUM_THREADS") or str(max(1, (os.cpu_count() or 1) // n))
    env = {THREADS_ENV: threads, "ACCELPERF_DEVICE": job.device}
    start = time.monotonic()
    deadline = start + timeout + GRACE_S if timeout else None
    with _gang(case, accel, wait, [env] * n) as gang:
        port = ray.get(gang.actors[0].free_port.remote())
        master = str(gang.hosts[0]["node_ip"])
        follow = _Follow(ray, n, job.total_steps)
        refs = [a.rank.remote(payload, r, n, master, port, follow.board, follow.keys[r])
                for r, a in enumerate(gang.actors)]
        results, failed, timed_out = _gather(ray, refs, deadline, follow)
        # What each rank reported: all of it when it returned, else what was followed.
        reports = [follow.report(r) for r in range(n)]
        for r, res in enumerate(results):
            report = reports[r] = RankReport(rank=r, returncode=0, result=res["result"])
            report.add_progress(progress_events(res["events"]))
        if timed_out:
            steps = ", ".join(f"rank {r.rank}: {r.where(job.total_steps)}" for r in reports)
            launched = LaunchResult("timeout", f"exceeded the {timeout:g} s timeout by "
                                    f"{GRACE_S:g} s ({steps}); all {n} rank actors were "
                                    f"killed", reports)
        elif failed is not None and failed.died:
            launched = LaunchResult("error", _death(gang, failed, f"rank {failed.index}",
                                                    reports[failed.index], job.total_steps),
                                    reports, failed_rank=failed.index)
        elif failed is not None:
            report = reports[failed.index]
            report.returncode = 17
            report.error = error_event(_cause(failed.error))  # as a launched rank's
            message = describe_failure(report, job.total_steps)
            launched = LaunchResult("oom" if report.is_oom else "error",
                                    f"{message} (on {gang.host(failed.index)})", reports,
                                    failed_rank=failed.index)
        else:
            launched = LaunchResult("ok", "", reports)
        launched.elapsed = time.monotonic() - start
        seen = trainer.platform(launched)
        if seen is not None:
            _check_platform(seen, accel, platform)
        result = trainer.result(case, task, accel, job, launched, timeout=timeout)
        if case.reference and result.run.outcome == "ok":
            # Where rank 0 ran: the controller may have neither the framework nor a device.
            result.reference_params = ray.get(gang.actors[0].reference.remote(
                cloudpickle.dumps((spec, case, task, job))))
    result.run = result.run.noted(cluster={"ranks": gang.hosts,
                                           "master": f"{master}:{port}"})
    return result
