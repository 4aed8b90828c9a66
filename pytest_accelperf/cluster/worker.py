"""The Ray side of :mod:`pytest_accelperf.cluster`: what runs inside a Ray worker process.

One :class:`CaseWorker` actor is created per case (or per rank of a case that spans
hosts) and killed after it, so every case trains in a process that has run
nothing before: no compile cache, allocator state or imported model from an earlier case.
The controller gives the actor its environment (``XLA_FLAGS`` with the virtual device
count, ``JAX_PLATFORMS``, ``PYTHONPATH`` so the suite's own modules import, the torch
extensions cache) through Ray's ``runtime_env``; the case and its task arrive as
cloudpickle bytes, so lambdas and closures travel and a task that cannot be pickled fails
on the controller, before anything is scheduled.

While a case trains, its actors post the steps they report to the driver's
:class:`ProgressBoard` (from a thread of their own, every :data:`POST_S` seconds: the
training itself stays on the actor's main thread, where a plain run has it, signals and
all), and the driver reads them from there: the steps show on the terminal line as a local
case's do, and a worker that dies or is killed at the timeout leaves behind the steps it
had posted.

This module imports no framework at import time: the actor's methods import the backend
they need, after the environment is in place.
"""

from __future__ import annotations

import importlib
import os
import pickle
import socket
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

if TYPE_CHECKING:
    from pytest_accelperf.backends.procs.events import ProgressEvent
    from pytest_accelperf.cluster.handles import ActorHandle, ObjectRef

#: Environment variable carrying the thread count the controller chose for torch
#: (``OMP_NUM_THREADS`` itself is overwritten by Ray in its workers).
THREADS_ENV = "ACCELPERF_THREADS"
#: Seconds between a training actor's posts of its progress to the board.
POST_S = 0.5


class HostInfo(TypedDict):
    """Where a worker runs (:func:`host_info`); kept in the run's ``extra["cluster"]``."""

    node_ip: str
    node_id: str
    hostname: str
    pid: int


class RankOutput(TypedDict):
    """What :meth:`CaseWorker.rank` returns: the rank's result, and the progress events it
    reported (JSON lines, as a launched rank writes them)."""

    result: Any
    events: list[str]


def host_info() -> HostInfo:
    """Where this worker runs: node IP and id (Ray's), host name, process id."""
    ray: Any = importlib.import_module("ray")

    return {"node_ip": ray.util.get_node_ip_address(),
            "node_id": ray.get_runtime_context().get_node_id(),
            "hostname": socket.gethostname(), "pid": os.getpid()}


def _threads() -> None:
    """Give torch the thread count a local run would have. Ray sets ``OMP_NUM_THREADS``
    (to 1 in workers that hold no ``CPU``) where the driver did not; a case timed that way
    would not be comparable with a baseline recorded by a plain run. The controller passes
    the count it wants (its own ``OMP_NUM_THREADS``, or cores / ranks) as
    ``ACCELPERF_THREADS``; without it, torch picks its default as in a plain run."""
    threads = os.environ.get(THREADS_ENV)
    if threads:
        os.environ["OMP_NUM_THREADS"] = threads
    else:
        os.environ.pop("OMP_NUM_THREADS", None)


class _StepLog:
    """A progress sink (:mod:`pytest_accelperf.backends.measure.progress`) that keeps the steps the
    backend reports, as a launched rank's ``progress`` events read, until taken."""

    def __init__(self) -> None:
        self._events: list[ProgressEvent] = []
        self._lock = threading.Lock()

    def update(self, done: int, total: int, loss: float, step_time: float) -> None:
        with self._lock:
            self._events.append({"phase": "train", "step": done - 1, "total": total,
                                 "loss": loss, "time": step_time})

    def take(self) -> list[ProgressEvent]:
        """The steps reported since the last call."""
        with self._lock:
            events, self._events = self._events, []
        return events

    def close(self) -> None:
        pass


class ProgressBoard:
    """A Ray actor, one per pytest process that uses the cluster: the actors of its cases
    post the progress events they report (``phase``, ``step``, ``loss``, ``time``, as a
    launched rank's), under a key per actor, and the driver reads them while it waits. It
    outlives the case's actors, so a killed worker's steps are still there to read."""

    def __init__(self) -> None:
        self._events: dict[str, list[ProgressEvent]] = {}

    def post(self, key: str, events: list[ProgressEvent]) -> None:
        self._events.setdefault(key, []).extend(events)

    def read(self, key: str, since: int) -> list[ProgressEvent]:
        return self._events.get(key, [])[since:]

    def drop(self, keys: list[str]) -> None:
        for key in keys:
            self._events.pop(key, None)


class _Poster:
    """Posts what ``new()`` returns (the events reported since its last call) to ``board``
    under ``key``: every :data:`POST_S` seconds from a daemon thread, and the rest when the
    block ends. Each post costs the training thread little (``new`` reads only what was
    appended); posts are fire-and-forget, and Ray runs them in the order sent."""

    def __init__(self, board: ActorHandle, key: str, new: Callable[[], list[ProgressEvent]]
                 ) -> None:
        self._board, self._key, self._new = board, key, new
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="accelperf-progress",
                                        daemon=True)

    def __enter__(self) -> _Poster:
        if self._board is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._board is not None:
            self._stop.set()
            self._thread.join()
            # Waited for: the driver reads the board as soon as this method has returned
            # (or raised), and must find every step there.
            ref = self._flush()
            if ref is not None:
                importlib.import_module("ray").get(ref, timeout=30)

    def _run(self) -> None:
        while not self._stop.wait(POST_S):
            self._flush()

    def _flush(self) -> ObjectRef | None:
        new = self._new()
        return self._board.post.remote(self._key, new) if new else None


class CaseWorker:
    """A Ray actor (wrapped by ``ray.remote`` on the controller) that trains one case, one
    rank of a multi-process torch case, or one process of a multi-host JAX case. The
    training methods take the driver's :class:`ProgressBoard` and this actor's key on it
    (``board=None``: nothing is posted)."""

    def __init__(self) -> None:
        _threads()

    def where(self) -> HostInfo:
        return host_info()

    def free_port(self) -> int:
        """A TCP port free on this node (the rendezvous of a case spanning hosts)."""
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("", 0))
            port: int = s.getsockname()[1]
            return port

    def train(self, payload: bytes, accel: str, cpu_devices: int, platform: str | None,
              timeout: float | None, board: ActorHandle | None = None,
              key: str = "") -> tuple[str, Any]:
        """Train a single-process case with its backend, on this worker's devices.

        ``payload`` holds the case, its task and its backend's spec (whose module this
        worker imports). Returns ``(platform key here, TrainResult)``: the controller
        checks that the worker's devices are the platform the baselines are stored under."""
        from pytest_accelperf.provision.accel import provision

        case, task, spec = pickle.loads(payload)
        if spec.spans_ranks(case.world_size):
            raise ValueError(f"{case.id} spans {case.world_size} processes: rank, not train")
        from pytest_accelperf.backends.measure import progress

        acc = provision(accel, cpu_devices, platform)
        steps = _StepLog()
        with progress.reporting(steps), _Poster(board, key, steps.take):
            result = spec.load().train(case, task, acc, timeout=timeout)
        return acc.platform, result

    def rank(self, payload: bytes, rank: int, world_size: int, master_addr: str,
             master_port: int, board: ActorHandle | None = None,
             key: str = "") -> RankOutput:
        """Rank ``rank`` of a case that spans hosts: ``fn(ctx, *args)`` of its backend's
        :class:`~pytest_accelperf.backends.procs.ranks.RankJob`, as a launched rank runs it, one
        rank per host (so its local rank is 0). Returns its result and the progress events
        it reported."""
        from pytest_accelperf.backends.procs._rank import RankContext
        from pytest_accelperf.backends.procs.launch import ProgressTail, default_extensions_dir

        os.environ.update({
            "RANK": str(rank), "WORLD_SIZE": str(world_size), "LOCAL_RANK": "0",
            "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": master_addr,
            "MASTER_PORT": str(master_port)})
        os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(default_extensions_dir()))
        fn, args, device = pickle.loads(payload)
        workdir = Path(tempfile.mkdtemp(prefix=f"accelperf-rank{rank}-"))
        ctx = RankContext(rank=rank, world_size=world_size, local_rank=0, device=device,
                          workdir=workdir)
        ctx.progress(phase="starting")
        with _Poster(board, key, ProgressTail(ctx.events).new):
            result = fn(ctx, *args)
        return {"result": result,
                "events": ctx.events.read_text(encoding="utf-8").splitlines()}

    def reference(self, payload: bytes) -> object:
        """The single-process reference of a case that trained in ranks, on this host (its
        backend's trainer says what it is)."""
        spec, case, task, job = pickle.loads(payload)
        return spec.load_ranks().reference(case, task, job)
