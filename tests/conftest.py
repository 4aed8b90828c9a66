"""Fixtures for the plugin's own tests: a tiny real JAX task and a suite writer.

Inner sessions run in-process where they can (the outer session already asked XLA for 8
virtual CPU devices, the default) and in a subprocess where they need another device count.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from pytest_accelperf.interrupt import sigint_delivered

# jax is imported once here, in the outer process: pytester's in-process runs restore
# sys.modules afterwards, and a second import of jaxlib in one process aborts it. Importing
# it does not initialize a backend, so the plugin's XLA_FLAGS still apply. The same goes for
# the torch modules the torch backend imports lazily: a second import of
# torch.distributed re-registers kernels (a UserWarning, an error under filterwarnings).
with contextlib.suppress(ImportError):  # jax is optional: the tests that need it skip
    import jax  # noqa: F401
# OpenMP's threads (torch's CPU kernels) wait for each other by spinning: on a machine with
# more runnable threads than cores (two workers, their scratch sessions and ranks, CI's
# background jobs) a spinning thread holds the core that the thread it waits for needs.
# Told to wait passively (before torch loads libgomp here, and in every process a test
# starts, which inherit it): tests/unit/backends/torch/test_step.py with -n 2 at load 9-10
# took 497 s spinning and 70 s passive (25 passed both ways; 300 Adam steps of a small MLP
# in two processes at once: 381 s and 14 s). A user's own setting is kept.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
try:
    import torch.distributed._tools.mem_tracker
    import torch.utils.flop_counter
except ImportError:  # torch is optional
    pass
else:
    # Under pytest-xdist each worker trains in-process on its share of the cores, as the
    # plugin gives each of N ranks cores / N (backends/procs/launch.py): with torch's
    # default of one thread a core, the two workers of `-n 2` ran four threads on 2 cores,
    # and torch's waiting threads spun. tests/unit/backends/torch/test_backend.py and
    # test_memory.py (14 tests, serial, load 10): 26.1 s of own CPU with 2 threads, 4.8 s
    # with 1. Subprocesses (ranks, scratch sessions) keep their own defaults.
    if workers := int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0")):
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))
# And Hypothesis, which its pytest plugin imports at the end of every session (to list the
# files its observability wrote): in an in-process session that is an import of all of
# Hypothesis, its modules' assertions rewritten (no cached bytecode under
# PYTHONDONTWRITEBYTECODE), 2-3 s of CPU time every session, since pytester drops the
# modules a session imported. Imported here, it is done once per process.
with contextlib.suppress(ImportError):  # a test extra
    import hypothesis.internal.observability  # noqa: F401
# And vl_convert (the HTML report's plotting library, a PyO3 module: a second import in one
# process raises ImportError): an in-process session that writes HTML imports it, pytester
# drops it, and the next one failed (tests/unit/cli/test_cli.py run on its own). 12 ms.
with contextlib.suppress(ImportError):  # the html extra
    import vl_convert  # noqa: F401
# And scipy.stats (stats/bootstrap.py, report/changes.py import it when first asked): every
# in-process session that judges a case against its baseline imported it again, about 500
# modules, 1.5-2 s of CPU time a session (a 5-step numpy case's session: 2.1-2.8 s with
# it, 0.65-0.85 s recording without it). Imported here, it is done once per process.
with contextlib.suppress(ImportError):
    import scipy.stats  # noqa: F401

TINYTASK = '''
"""A linear regression in JAX: real training, compiled in well under a second."""
import numpy as np
import optax
from jax.sharding import PartitionSpec as P

from pytest_accelperf.jax import JaxTask


def make_task(case, lr=0.05, nan_at=None, sleep=0.0):
    dim, out = case.params.get("dim", 32), case.params.get("out", 8)
    rng = np.random.default_rng(0)
    true_w = rng.normal(size=(dim, out)).astype(np.float32)

    def init_params(key):
        import jax
        return {"w": jax.random.normal(key, (dim, out)) * 0.01, "b": jax.numpy.zeros((out,))}

    def loss_fn(params, batch):
        import jax.numpy as jnp
        pred = batch["x"] @ params["w"] + params["b"]
        loss = jnp.mean((pred - batch["y"]) ** 2)
        return loss * batch["scale"][0]

    def make_batch(step):
        r = np.random.default_rng(step)
        x = r.normal(size=(case.batch, dim)).astype(np.float32)
        y = x @ true_w + 0.01 * r.normal(size=(case.batch, out)).astype(np.float32)
        scale = np.full((case.batch,), np.nan if step == nan_at else 1.0, np.float32)
        if sleep:
            import time
            time.sleep(sleep)
        return {"x": x, "y": y, "scale": scale}

    return JaxTask(init_params=init_params, loss_fn=loss_fn, make_batch=make_batch,
                   optimizer=optax.sgd(lr),
                   param_specs=lambda p: {"w": P(None, "model"), "b": P("model")})
'''

# A small torch MLP for multi-process cases (DeepSpeed, DDP); params["fail"] makes rank 1
# misbehave at step 3: tests/unit/backends/torch/test_deepspeed.py and tests/e2e/test_cluster.py.
DSTASK = '''
import os
import signal
import time

import torch

from pytest_accelperf.torch import TorchTask


def make_task(case):
    """A small MLP regression; params["fail"] makes rank 1 misbehave at step 3."""
    fail = case.params.get("fail")

    def make_batch(step):
        if fail and step == 3 and os.environ.get("RANK") == "1":
            if fail == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            if fail == "raise":
                raise RuntimeError("rank one's batch is broken")
            if fail == "hang":
                time.sleep(3600)
        g = torch.Generator().manual_seed(step)
        x = torch.randn(case.batch, 16, generator=g)
        return {"x": x, "y": x.sum(dim=1, keepdim=True)}

    def loss_fn(model, batch):
        return ((model(batch["x"]) - batch["y"]) ** 2).mean()

    return TorchTask(
        make_model=lambda: torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(),
                                               torch.nn.Linear(32, 1)),
        loss_fn=loss_fn, make_batch=make_batch,
        make_optimizer=lambda p: torch.optim.AdamW(p, lr=1e-2))
'''

# A backend of a suite's own (tests/e2e/test_backend_plugins.py, tests/e2e/test_cluster.py): linear
# regression trained by numpy SGD, for real; its Run is built as the built-in backends do.
NUMPY_SGD = '''
import time

import numpy as np

from pytest_accelperf.backends import Fit, TrainResult
from pytest_accelperf.backends.measure.common import fingerprint
from pytest_accelperf.backends.measure.probe import numpy_probe
from pytest_accelperf.backends.measure import progress
from pytest_accelperf.records.run import Run


class Steps:
    """Linear regression ``y = x @ W`` trained by plain SGD, a step at a time; ``task`` is
    a dict of its sizes and learning rate. ``run(n)`` is what A/B mode alternates."""

    def __init__(self, case, task):
        self.case, self.lr = case, task["lr"]
        rng = np.random.default_rng(0)
        self.true_w = rng.normal(size=(task["dim"], task["out"])).astype(np.float32)
        self.w = np.zeros_like(self.true_w)
        self.step, self.nbytes = 0, 0

    def one(self):
        """One step: (loss, seconds); the batch is made outside the timer."""
        rng = np.random.default_rng(self.step % (self.case.warmup + self.case.steps))
        x = rng.normal(size=(self.case.batch, self.w.shape[0])).astype(np.float32)
        y = x @ self.true_w
        t0 = time.perf_counter()
        err = x @ self.w - y
        self.w -= self.lr * (2.0 / self.case.batch) * (x.T @ err)
        seconds = time.perf_counter() - t0
        self.step += 1
        self.nbytes = max(self.nbytes, x.nbytes + y.nbytes + err.nbytes + self.w.nbytes)
        return float(np.mean(err ** 2)), seconds

    def run(self, n):
        return [self.one()[1] for _ in range(n)]


class NumpySGD:
    name = "numpy-sgd"

    def unavailable_reason(self):
        return None

    def train(self, case, task, accel, *, timeout=None):
        steps, probe = Steps(case, task), numpy_probe()
        losses, step_times, probe_times = [], [], []
        total = case.warmup + case.steps
        for step in range(total):
            loss, seconds = steps.one()
            losses.append(loss)
            if step >= case.warmup:
                step_times.append(seconds)
                probe_times.append(probe.time())  # outside the step's timer
            progress.step(step + 1, total, loss, seconds)
        params = {"w": steps.w}
        run = Run(case_id=case.id, samples_per_step=case.batch, n_devices=1,
                  flops_per_step=6.0 * case.batch * steps.w.size, probe_kind=probe.kind,
                  losses=losses, loss_steps=list(range(total)), step_times=step_times,
                  probe_times=probe_times, memory_per_device={"cpu:0": steps.nbytes},
                  memory_source="numpy nbytes", params_fingerprint=fingerprint(params))
        return TrainResult(run=run, params=params)

    def fits(self, case, task, accel, *, timeout=None):
        need = 4 * (2 * case.batch * task["dim"] + task["dim"] * task["out"])
        return Fit(need <= case.memory_capacity, need, case.memory_capacity, "numpy nbytes")

    def stepper(self, case, task, accel):
        return Steps(case, task)


BACKEND = NumpySGD()
'''

# Its registration by module (``numpy_sgd.py`` beside the conftest): what Ray and A/B
# workers, which import backends by module, can load too.
NUMPY_SGD_CONFTEST = '''
from pytest_accelperf.backends import BackendSpec


def pytest_accelperf_backends(config):
    return [BackendSpec("numpy-sgd", module="numpy_sgd", requires=("numpy",),
                        packages=("numpy",), ab_blocks=True)]
'''

SUITE = '''
from tinytask import make_task
from pytest_accelperf import Case, cases

# 256 x 512 x 512 matmuls: ~10 ms a step, long enough for step times to mean something.
@cases(backend="jax", mesh=[None, (4, 2)], batch=[256], steps=30, warmup=2,
       params={"dim": 512, "out": 512})
def test_sweep(accelperf):
    accelperf.train(make_task(accelperf.case))
'''


#: Not Hypothesis's pytest plugin in an inner session: no inner suite uses it, and it
#: imports Hypothesis at the end of every session (about 1 s of CPU time in a subprocess).
NO_HYPOTHESIS = ("-p", "no:hypothesispytest")
#: Options of every inner session (:meth:`Suite.run`): no cache directory in the project.
INNER_ARGS = ("-p", "no:cacheprovider", *NO_HYPOTHESIS)


#: Around starting a child: SIGINT delivered to it and handled by default, as a shell starts
#: a command (the package's one implementation, :mod:`pytest_accelperf.interrupt`). After
#: the tests before it in the same xdist worker, a process under test went on through the
#: interrupt (a cluster session in CI, exit 0 with 40 steps; an accelperf bisect in a full
#: run here, which ran every session to the end), while alone it stops at once.
as_from_a_shell = sigint_delivered


def without_hypothesis(env: dict[str, str]) -> dict[str, str]:
    """``env`` for a process that starts pytest sessions of its own (a benchmark, accelperf
    bisect): its sessions load no Hypothesis plugin either (:data:`NO_HYPOTHESIS`)."""
    addopts = " ".join(p for p in (env.get("PYTEST_ADDOPTS", ""), *NO_HYPOTHESIS) if p)
    return {**env, "PYTEST_ADDOPTS": addopts}


class Suite:
    """A pytester project with the tiny task, a suite module, and baseline helpers."""

    def __init__(self, pytester: pytest.Pytester) -> None:
        self.pytester = pytester
        pytester.makepyfile(tinytask=TINYTASK)
        # Step times on a shared 2-core machine move 20-50% between sessions, up to 2x
        # when the other xdist worker starts a DeepSpeed case, and 20x in CI beside its
        # TPU compiles (a 0.14 ms JAX step read 2.9 ms, confirmed on re-measurement, and
        # failed a schema test at the 300% this tolerance was): tests that are not about
        # throughput must not depend on it, so its tolerance is 1000 (a step 1001x as long
        # passes), and tests about it pass their own flag (--accelperf-throughput-
        # tolerance). The other worker also makes the drift probe unsteady (which makes a
        # compile-time verdict inconclusive; throughput only stops correcting drift) and
        # the step times more dispersed than the baseline's (contamination, whose floor is
        # the same bound):
        # tests of the verdicts themselves raise the bound, and contamination has its own
        # tests (unit/checks/test_checks.py, unit/checks/test_program.py).
        # Compile times move as much (one sample each): tests about them pass their own.
        # So may a small batch function's CPU time (the input check): tests about it pass
        # their own tolerance.
        # The other worker's CPU time is foreign load to this one's measurements, which
        # leaves them unjudged past --accelperf-max-foreign-load: tests of the verdicts
        # take any load, and the load has its own tests (unit/stats/test_contention.py,
        # e2e/test_foreign_load.py).
        pytester.makepyprojecttoml("[tool.accelperf]\nthroughput_tolerance = 1000.0\n"
                                   "max_probe_spread = 1000.0\nmax_step_spread = 1000.0\n"
                                   "compile_tolerance = 1000.0\nmax_foreign_load = 64.0\n"
                                   "input_tolerance = 1000.0\n")

    def write(self, body: str = SUITE, name: str = "test_suite") -> Path:
        return self.pytester.makepyfile(**{name: textwrap.dedent(body)})

    def run(self, *args: str, subprocess: bool = False) -> pytest.RunResult:
        runner: Callable[..., pytest.RunResult] = (
            self.pytester.runpytest_subprocess if subprocess else self.pytester.runpytest
        )
        return runner(*INNER_ARGS, *args)

    def baseline_path(self, module: str = "test_suite", platform: str = "cpu-x8") -> Path:
        return self.pytester.path / "baselines" / platform / f"{module}.json"

    def load(self, module: str = "test_suite", platform: str = "cpu-x8") -> dict[str, Any]:
        data: dict[str, Any] = json.loads(self.baseline_path(module, platform).read_text())
        return data

    def edit(self, fn: Callable[[dict[str, Any]], None], module: str = "test_suite") -> None:
        data = self.load(module)
        for block in data["cases"].values():
            fn(block)
        self.baseline_path(module).write_text(json.dumps(data, indent=2, sort_keys=True))

    def report(self, path: str = "report.json") -> dict[str, Any]:
        data: dict[str, Any] = json.loads((self.pytester.path / path).read_text())
        return data


@pytest.fixture(scope="session", autouse=True)
def host_lock_of_this_worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Under pytest-xdist, the CPU host lock of this worker's scratch sessions is a file of
    its own (``$ACCELPERF_HOST_LOCK_DIR``, in the worker's base temporary directory, read by
    in-process sessions through ``hangs.HOST_LOCK_DIR`` and inherited by every process a
    test starts). The lock keeps measurements comparable with a baseline recorded alone;
    these sessions' measurements are compared with nothing but their own, under tolerances
    that take the other worker's load (:class:`Suite`), so the two workers need not train
    one at a time: with one lock for both, the lock was held in 98 % of twice-a-second
    samples over 3 minutes of a full run (69 % by its two workers, the rest by other
    sessions on the machine), so a worker spent much of its time waiting. Within a worker
    the lock is still one for all its sessions and their processes (the tests of xdist,
    clusters and the lock itself rely on it); a run without xdist keeps the machine's.

    Opt-in (``ACCELPERF_TESTS_LOCK_PER_WORKER=1``), for a quicker local loop: a full run
    under it (2026-11-28) failed a bisection whose 4-round A/B, measured beside the other
    worker's training, found BAD 52 % *faster* (95 % CI 0.14-0.95), so CI keeps one lock."""
    if not os.environ.get("PYTEST_XDIST_WORKER") or \
            os.environ.get("ACCELPERF_TESTS_LOCK_PER_WORKER") != "1":
        yield
        return
    from pytest_accelperf.gate import hangs

    directory = tmp_path_factory.getbasetemp()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ACCELPERF_HOST_LOCK_DIR", str(directory))
        mp.setattr(hangs, "HOST_LOCK_DIR", directory)
        yield


@pytest.fixture
def host_lock_of_its_own(tmp_path_factory: pytest.TempPathFactory,
                         monkeypatch: pytest.MonkeyPatch) -> Path:
    """For a test whose sessions measure nothing that is compared with another session's
    (what a report writes, a deterministic check): a CPU host lock of the test's own (the
    directory returned; in-process sessions read ``hangs.HOST_LOCK_DIR``, the others
    inherit ``$ACCELPERF_HOST_LOCK_DIR``), so its few milliseconds of training do not wait
    for the lock the other xdist worker's trainings hold (tests/unit/report/test_outputs.py
    waited 21-26 s a test for 1 s of CPU)."""
    from pytest_accelperf.gate import hangs

    directory = tmp_path_factory.mktemp("host-lock")
    monkeypatch.setenv("ACCELPERF_HOST_LOCK_DIR", str(directory))
    monkeypatch.setattr(hangs, "HOST_LOCK_DIR", directory)
    return directory


@pytest.fixture(scope="session", autouse=True)
def torch_extensions_of_the_machine() -> Iterator[None]:
    """DeepSpeed's C++ ops built once per machine, not once per test: a scratch session's
    HOME is its pytester directory, so the default cache
    (``~/.cache/pytest-accelperf/torch_extensions``, :mod:`.backends.procs.launch`) was a
    new one in every test, and each test with a DeepSpeed case on the CPU compiled
    ``deepspeed_shm_comm`` again (two cc1plus, 170-340 s of a 2-core machine under load).
    ``$TORCH_EXTENSIONS_DIR``, inherited by every session and rank a test starts, names the
    machine's cache (or the one already set)."""
    from pytest_accelperf.backends.procs.launch import EXTENSIONS_ENV, default_extensions_dir

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(EXTENSIONS_ENV, str(default_extensions_dir()))
        yield


@pytest.fixture
def competitor() -> Iterator[int]:
    """Another job: a process spinning on one core for the test's duration (:func:`spinning`)."""
    with spinning() as pid:
        yield pid


@contextlib.contextmanager
def spinning() -> Iterator[int]:
    """Another job: a process spinning on one core while the block runs, and no
    descendant of this one (a shell starts it in the background and exits, so it is
    re-parented), as the plugin counts a session's own descendants (ranks, Ray workers)
    as the measurement's own work, not contention. Its pid is yielded."""
    out = subprocess.run(
        ["sh", "-c", f'"{sys.executable}" -c "while True: pass" >/dev/null 2>&1 & echo $!'],
        check=True, capture_output=True, text=True)
    pid = int(out.stdout.strip())
    try:
        time.sleep(0.3)
        yield pid
    finally:
        os.kill(pid, signal.SIGKILL)


@pytest.fixture
def suite(pytester: pytest.Pytester) -> Suite:
    return Suite(pytester)


def recorded_once(suite: Suite, recording: Path, *, passed: int) -> Suite:
    """``suite`` (its suite module already written) with its baselines recorded by
    ``--accelperf-update``: by the first test that asks for them with this ``recording``
    (a directory of a module- or session-scoped fixture, in this process), and for every
    other a copy of them as they were then, each test's to read and edit. A recording
    trains each case once, holding the host lock (where it was too noisy to store, again
    over :data:`pytest_accelperf.gate.judge.RECORDING_WINDOWS` trainings, up to
    ``--accelperf-confirm`` times); tests that only read or edit the baseline need not
    make their own."""
    baselines = suite.pytester.path / "baselines"
    if recording.exists():
        shutil.copytree(recording, baselines)
    else:
        suite.run("--accelperf-update").assert_outcomes(passed=passed)
        shutil.copytree(baselines, recording)
    return suite


@pytest.fixture(scope="session")
def sweep_recording(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the baselines of :data:`SUITE` are kept once recorded (:func:`recorded_once`),
    for the tests of every module of this process that ask for :func:`recorded`."""
    return tmp_path_factory.mktemp("sweep-recording") / "baselines"


@pytest.fixture
def recorded(suite: Suite, sweep_recording: Path) -> Suite:
    """:data:`SUITE` written, with its baselines recorded (:func:`recorded_once`): ten
    recordings of the same two cases were about a third of tests/e2e/test_gate.py's CPU
    time (126 s with them, 83 s with one)."""
    suite.write()
    return recorded_once(suite, sweep_recording, passed=2)


def rounds_of_pairs(offsets: list[tuple[float, float]], per_pair: int, jitter: float,
                    seed: int = 0) -> tuple[list[list[float]], list[list[float]], list[int]]:
    """Rounds of A/B blocks timed by process pairs whose processes run at their own speed
    (``offsets``: each pair's base and head factors, equal for an unchanged program),
    ``jitter`` the rounds' own noise: base blocks, head blocks, and the pair of each round."""
    rng = random.Random(seed)
    base: list[list[float]] = []
    head: list[list[float]] = []
    pairs: list[int] = []
    for j, (b, h) in enumerate(offsets):
        for _ in range(per_pair):
            base.append([b * (1 + rng.gauss(0, jitter)) for _ in range(5)])
            head.append([h * (1 + rng.gauss(0, jitter)) for _ in range(5)])
            pairs.append(j)
    return base, head, pairs


def verdicts(report: dict[str, Any]) -> dict[str, dict[str, str]]:
    """``{case id: {metric: verdict}}`` of a JSON report."""
    return {c["nodeid"].split("::")[-1]: {k["metric"]: k["verdict"] for k in c["checks"]}
            for c in report["cases"]}


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``-n N`` without ``--dist`` sends each test module to one worker as a whole
    (pytest-xdist's ``--dist loadfile``), not its tests one by one to whichever worker is
    free (``load``): a module's fixtures then run once, not once in each worker. Several
    are whole trainings or processes: a recording shared by the module's tests, a torch
    compile, a Ray cluster, DeepSpeed's ranks. An explicit ``--dist`` is obeyed."""
    given = [*config.invocation_params.args, *os.environ.get("PYTEST_ADDOPTS", "").split()]
    if config.getvalue("dist") != "load" or any(
            str(a) == "-d" or str(a).startswith("--dist") for a in given):
        return None
    from xdist.scheduler import LoadFileScheduling

    return LoadFileScheduling(config, log)


E2E = Path(__file__).parent / "e2e"


#: Set (to 1) by CI for the README's tests command, which runs beside CI's background jobs:
#: the tests marked ``timing`` (a measured time must clear a margin) are deselected there and
#: run in a phase of their own, alone on the machine (.ci/run), so that a margin squeezed by
#: CI's own lint and installs does not decide whether a change lands.
DEFER_TIMING_ENV = "ACCELPERF_TESTS_DEFER_TIMING"
#: Set by CI to a number N: the session ends with pytest's N slowest tests of 10 s or more
#: (``--durations=N --durations-min=10``), so that every CI log says where its time went.
#: Read here, not passed in ``PYTEST_ADDOPTS``, which every session a test starts in a
#: subprocess would inherit too.
DURATIONS_ENV = "ACCELPERF_TESTS_DURATIONS"


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    """``$ACCELPERF_TESTS_DURATIONS`` (:data:`DURATIONS_ENV`), unless ``--durations`` is
    given."""
    wanted = os.environ.get(DURATIONS_ENV, "")
    if wanted.isdigit() and not config.option.durations:
        config.option.durations = int(wanted)
        config.option.durations_min = 10.0


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test under tests/e2e/ (whole sessions, the CLI, benchmarks end to end) is marked
    ``e2e``; ``slow`` is marked by hand on the tests that took 10 s or more. Under
    ``$ACCELPERF_TESTS_DEFER_TIMING=1`` the ``timing`` tests are deselected (reported as
    such)."""
    for item in items:
        if item.path.is_relative_to(E2E):
            item.add_marker(pytest.mark.e2e)
    if os.environ.get(DEFER_TIMING_ENV) == "1":
        deferred = [item for item in items if item.get_closest_marker("timing")]
        if deferred:
            config.hook.pytest_deselected(items=deferred)
            items[:] = [item for item in items if not item.get_closest_marker("timing")]
