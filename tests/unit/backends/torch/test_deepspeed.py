"""DeepSpeed (ZeRO 0-3, CPU offload) and DDP at world size 2 on the CPU: real training in
launched ranks, checked against single-process torch; and rank failures as outcomes.

Each launch costs ~10 s here (two interpreters importing torch and DeepSpeed on two cores),
so the trained runs are shared by module-scoped fixtures. The first run on a machine also
compiles DeepSpeed's ``deepspeed_shm_comm`` and ``cpu_adam`` ops (about a minute each),
cached in ``~/.cache/pytest-accelperf/torch_extensions``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import DSTASK, Suite

torch = pytest.importorskip("torch")
pytest.importorskip("deepspeed")
pytest.importorskip("cloudpickle")

from pytest_accelperf.backends import TrainResult, get_backend  # noqa: E402
from pytest_accelperf.backends.procs.launch import default_extensions_dir  # noqa: E402
from pytest_accelperf.backends.torch.deepspeed import (  # noqa: E402
    BACKEND,
    OP_KEY_FILE,
    DeepSpeedRankEngine,
    ds_config,
    op_is_built,
)
from pytest_accelperf.backends.torch.in_rank import slice_batch  # noqa: E402
from pytest_accelperf.backends.torch.processes import make_plan, train_reference  # noqa: E402
from pytest_accelperf.checks.numerics import check_reference  # noqa: E402
from pytest_accelperf.collect.cases import Case  # noqa: E402
from pytest_accelperf.provision.accel import Accelerator  # noqa: E402
from pytest_accelperf.records.verdict import Tolerances, Verdict  # noqa: E402
from pytest_accelperf.torch import train_ddp  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[4] / "suites" / "torch"))
from gpt import make_task, n_params  # noqa: E402

#: Every test here is slow, out of the quick loop (`-m "not slow"`):
#: its fixtures train DeepSpeed over 2 ranks (28 s of setup).
pytestmark = pytest.mark.slow


CPU = Accelerator(name="cpu", platform="cpu-x1", device_kind="cpu", device_count=1)
STEPS, WARMUP, BATCH, SEQ = 3, 2, 8, 32
#: Bucket sizes for a 110k-parameter model (DeepSpeed's defaults are 5e8 elements: a 2 GB
#: ZeRO-3 bucket would dwarf everything the count is meant to show).
BUCKETS = {"zero_optimization": {"reduce_bucket_size": 50_000, "allgather_bucket_size": 50_000,
                                 "stage3_prefetch_bucket_size": 50_000,
                                 "stage3_param_persistence_threshold": 1_000}}
#: (ZeRO stage, offload) of the shared runs: every stage, one with the optimizer offloaded
#: (DeepSpeedCPUAdam), one with parameters and optimizer offloaded.
CONFIGS = [(0, "none"), (1, "none"), (2, "optimizer"), (3, "all")]


def ds_case(stage: int, offload: str = "none", **kw: Any) -> Case:
    defaults: dict[str, Any] = {"batch": BATCH, "steps": STEPS, "warmup": WARMUP,
                                "world_size": 2, "params": {"ds_config": BUCKETS}}
    defaults.update(kw)
    return Case(backend="deepspeed", zero_stage=stage, offload=offload, **defaults)


@pytest.fixture(scope="module")
def runs() -> dict[tuple[int, str], TrainResult]:
    out = {}
    for stage, offload in CONFIGS:
        case = ds_case(stage, offload, reference=True)
        out[stage, offload] = BACKEND.train(case, make_task(case), CPU, timeout=600)
    return out


def test_registered_and_loadable() -> None:
    entry = get_backend("deepspeed")
    assert entry.unavailable_reason() is None
    assert entry.load() is BACKEND


@pytest.mark.slow
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"zero{c[0]}-{c[1]}")
def test_every_stage_trains_and_reports_per_rank(runs: dict[Any, TrainResult],
                                                  config: tuple[int, str]) -> None:
    run = runs[config].run
    assert run.outcome == "ok", run.message
    assert len(run.step_times) == STEPS and all(t > 0 for t in run.step_times)
    assert len(run.probe_times) == STEPS and run.probe_kind.startswith("torch-cpu")
    assert len(run.losses) == WARMUP + STEPS and run.losses[-1] < run.losses[0]
    assert run.n_devices == 2 and run.tokens_per_step == BATCH * SEQ
    assert set(run.memory_per_device) == {"rank0", "rank1"}
    # At least this rank's share of fp32 parameters, gradients and two Adam moments.
    assert min(run.memory_per_device.values()) > 4 * 4 * n_params(make_task(ds_case(0))) / 2
    assert run.memory_source == "mem_tracker"
    ranks = run.details["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1]
    assert ranks[0]["step_times"] == run.step_times and len(ranks[1]["step_times"]) == STEPS
    config_used = run.details["engine"]["config"]
    assert config_used["gradient_clipping"] == 0.0  # explicit, never DeepSpeed's 1.0
    assert config_used["zero_optimization"]["stage"] == config[0]
    flops = run.flops_per_step
    assert flops is not None
    assert 0.5 < flops / (6 * n_params(make_task(ds_case(0))) * BATCH * SEQ) < 2.0
    assert run.params_fingerprint


def test_offload_uses_deepspeed_cpu_adam(runs: dict[Any, TrainResult]) -> None:
    engine = runs[2, "optimizer"].run.details["engine"]
    assert engine["optimizer"] == "DeepSpeedCPUAdam"
    assert engine["config"]["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    assert runs[0, "none"].run.details["engine"]["optimizer"] == "AdamW"  # the task's own
    assert "offload_param" in runs[3, "all"].run.details["engine"]["config"]["zero_optimization"]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"zero{c[0]}-{c[1]}")
def test_every_stage_matches_single_process_torch(runs: dict[Any, TrainResult],
                                                   config: tuple[int, str]) -> None:
    result = runs[config]
    assert result.reference_params is not None
    check = check_reference(result.params, result.reference_params, Tolerances())
    assert check.verdict is Verdict.PASS, check.detail
    assert check.now is not None and check.now < 1e-3  # measured: 1.4e-4 to 1.7e-4


def test_a_different_lr_or_model_fails_the_reference(runs: dict[Any, TrainResult]) -> None:
    case = ds_case(3, "all", reference=True)
    task = make_task(case)
    plan = make_plan(DeepSpeedRankEngine, case, task, CPU)
    result = runs[3, "all"]
    other_lr = dataclasses.replace(
        task, make_optimizer=lambda p: torch.optim.AdamW(p, lr=6e-3))
    other_seed = dataclasses.replace(task, seed=1)
    for wrong in (other_lr, other_seed):
        check = check_reference(result.params, train_reference(case, wrong, plan),
                                Tolerances())
        assert check.verdict is Verdict.REGRESSION


def test_fits_measures_the_same_peak_as_training(runs: dict[Any, TrainResult]) -> None:
    peak = runs[0, "none"].run.peak_memory
    assert peak is not None
    case = ds_case(0, memory_capacity=peak)
    fit = BACKEND.fits(case, make_task(case), CPU, timeout=600)
    assert fit.fits and fit.required_bytes == peak == fit.capacity_bytes
    assert fit.message.startswith("rank ")


def test_ddp_trains_and_matches_the_reference() -> None:
    case = Case(backend="torch", batch=BATCH, steps=STEPS, warmup=WARMUP, world_size=2,
                reference=True, grad_clip=0.5)
    result = train_ddp(case, make_task(case), CPU, timeout=600)
    run = result.run
    assert run.outcome == "ok", run.message
    assert set(run.memory_per_device) == {"rank0", "rank1"}
    engine = run.details["engine"]
    assert (engine["engine"], engine["optimizer"], engine["grad_clip"]) == ("ddp", "AdamW", 0.5)
    assert engine["scheduler"] is None and engine["compile"] is False
    assert result.reference_params is not None
    check = check_reference(result.params, result.reference_params, Tolerances())
    assert check.verdict is Verdict.PASS, check.detail


def test_config_and_batch_errors_name_the_fix() -> None:
    with pytest.raises(ValueError, match="not divisible by 2: use a batch that is a multiple"):
        BACKEND.train(ds_case(0, batch=7), make_task(ds_case(0)), CPU)
    with pytest.raises(ValueError, match="needs ZeRO stage 1 or more"):
        ds_config(ds_case(0, offload="optimizer"), None)
    with pytest.raises(ValueError, match=r"sets gradient_clipping 1\.0 where the case gives "
                                         r"0\.0: these come from the case"):
        ds_config(ds_case(1, params={"ds_config": {"gradient_clipping": 1.0}}), None)
    # A config written for the case's own batch and clipping (DeepSpeed's CIFAR-10
    # tutorial's: train_batch_size 16, gradient_clipping 1.0) is taken as it is.
    same = {"train_batch_size": BATCH, "gradient_clipping": 1, "optimizer": {"type": "Adam"}}
    config = ds_config(ds_case(1, grad_clip=1.0), 1.0, extra=same)
    assert config["train_batch_size"] == BATCH and config["optimizer"] == {"type": "Adam"}
    with pytest.raises(ValueError, match=f"train_batch_size {2 * BATCH} where the case gives "
                                         f"{BATCH}"):
        ds_config(ds_case(1, grad_clip=1.0), 1.0, extra={**same, "train_batch_size": 2 * BATCH})
    config = ds_config(ds_case(2, grad_clip=0.25), 0.25)
    assert config["gradient_clipping"] == 0.25 and config["train_batch_size"] == BATCH
    assert config["train_micro_batch_size_per_gpu"] == BATCH // 2


def test_a_warm_rank_loads_only_ops_that_need_no_build(tmp_path: Path) -> None:
    """preload_ops' test of an op's build directory: built, and nothing for ninja to do;
    never built, stale, or locked by torch (a build under way, or one killed midway whose
    lock stayed) leaves the op to the case that needs it."""
    if shutil.which("ninja") is None:
        pytest.skip("no ninja on PATH (torch's extension builds need it)")
    (tmp_path / "op.cpp").write_text("int x;\n")
    (tmp_path / "build.ninja").write_text(
        "rule copy\n  command = cp $in $out\nbuild op.so: copy op.cpp\n")
    assert not op_is_built(tmp_path)  # never built
    subprocess.run(["ninja", "-C", str(tmp_path)], check=True, capture_output=True)
    assert op_is_built(tmp_path)
    (tmp_path / "lock").touch()
    assert not op_is_built(tmp_path)  # torch's FileBaton: a build holds it
    (tmp_path / "lock").unlink()
    future = time.time() + 60
    os.utime(tmp_path / "op.cpp", (future, future))  # a source newer than the build
    assert not op_is_built(tmp_path)


KEYED = """
import json, os, sys
from pathlib import Path
from deepspeed.accelerator import get_accelerator
from pytest_accelperf.backends.torch import deepspeed as ds
build = Path(sys.argv[1])
so = build / "deepspeed_shm_comm.so"
key = ds.op_key(get_accelerator().create_op_builder("ShareMemCommBuilder"))
ds.write_op_key(build, "deepspeed_shm_comm", "0" * 64)  # built from other sources
other = ds.preload_ops()
ds.write_op_key(build, "deepspeed_shm_comm", key)
os.utime(so, ns=(so.stat().st_atime_ns, so.stat().st_mtime_ns + 1))  # rebuilt since
rebuilt = ds.preload_ops()
ds.write_op_key(build, "deepspeed_shm_comm", key)
print(json.dumps([other, rebuilt, ds.preload_ops()]))
"""


def test_a_build_recorded_for_the_same_sources_loads_without_ninja(tmp_path: Path) -> None:
    """A fresh environment of the same releases (each CI run's venv) would have ninja
    rebuild every op, its files all newer than the build: preload_ops loads a build whose
    recorded op_key is this environment's without ninja (here none is on PATH), and leaves
    to the case that needs it one recorded for other sources, or rebuilt since (by ninja,
    for another environment). One process: an op once loaded stays loaded."""
    machine = default_extensions_dir() / "deepspeed_shm_comm"
    if not (machine / "deepspeed_shm_comm.so").is_file():
        pytest.skip("deepspeed_shm_comm is not built on this machine yet")
    extensions = tmp_path / "extensions"
    build = extensions / "deepspeed_shm_comm"
    shutil.copytree(machine, build, ignore=shutil.ignore_patterns("lock", OP_KEY_FILE))
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(extensions), "PATH": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", KEYED, str(build)], env=env,
                         capture_output=True, text=True, check=True, timeout=300)
    assert json.loads(out.stdout.splitlines()[-1]) == [[], [], ["deepspeed_shm_comm"]]


def test_ranks_get_their_slice_of_the_global_batch() -> None:
    batch = {"x": torch.arange(8).reshape(8, 1), "scale": torch.tensor(2.0),
             "pair": (torch.arange(8), torch.zeros(3))}
    parts = [slice_batch(batch, r, 2, 8) for r in range(2)]
    assert torch.equal(torch.cat([p["x"] for p in parts]), batch["x"])
    assert parts[1]["pair"][0].tolist() == [4, 5, 6, 7]
    assert parts[1]["pair"][1].shape == (3,) and parts[1]["scale"].item() == 2.0


# -- through the plugin: failures are outcomes, and the session goes on ---------------------


FAILURES = '''
from dstask import make_task
from pytest_accelperf import Case, cases

def ds(label, **kw):
    return Case(backend="deepspeed", batch=8, steps=4, warmup=2, world_size=2, zero_stage=1,
                label=label, accels=("cpu",), **kw)

# "fine" first: a failed case kills its warm ranks (the next case starts new ones), so the
# fine case ahead of them lends its warm ranks to "kill" (three rank-pool starts, not four;
# a pool start is two interpreters importing torch, DeepSpeed and inductor).
@cases(ds("fine"), ds("kill", params={"fail": "kill"}), ds("raise", params={"fail": "raise"}),
       ds("tiny", memory_capacity=1000))
def test_ds(accelperf):
    accelperf.train(make_task(accelperf.case))
'''


def _runs(suite: Suite) -> dict[str, dict[str, Any]]:
    return {c["case_id"].rsplit("-", 1)[-1]: c["run"] for c in suite.report()["cases"]}


@pytest.mark.slow
def test_dead_raising_and_oom_ranks_are_outcomes_and_the_session_goes_on(
        suite: Suite) -> None:
    suite.pytester.makepyfile(dstask=DSTASK)
    suite.write(FAILURES)
    t0 = time.monotonic()
    result = suite.run("--accelperf-update", "--accelperf-json=report.json",
                       "--accelperf-timeout=300")
    # The session goes on past each dead rank, not to a timeout: 91 s alone, 261 s beside
    # three other sessions' work (load 6-10, the host lock shared with them; 2026-11-29).
    assert time.monotonic() - t0 < 400
    result.assert_outcomes(passed=2, failed=2)  # error fails; a first oom is recorded
    runs = _runs(suite)
    kill = runs["kill"]
    assert kill["outcome"] == "error"
    assert kill["message"].startswith("rank 1 was killed by SIGKILL")
    assert "in step 3 (steps 0-2 of 6 had finished)" in kill["message"]
    assert len(kill["losses"]) >= 3  # what rank 0 had reported
    raised = runs["raise"]
    assert raised["outcome"] == "error"
    assert "rank 1 raised RuntimeError: rank one's batch is broken" in raised["message"]
    tiny = runs["tiny"]
    assert tiny["outcome"] == "oom"
    assert "cannot even initialize model" in tiny["message"]
    assert tiny["oom"]["capacity_bytes"] == 1000 and tiny["oom"]["step"] is None
    assert runs["fine"]["outcome"] == "ok"
    assert set(runs["fine"]["memory_per_device"]) == {"rank0", "rank1"}


HANG = '''
from dstask import make_task
from pytest_accelperf import Case, cases

@cases(Case(backend="deepspeed", batch=8, steps=4, warmup=2, world_size=2, zero_stage=0,
            label="hang", accels=("cpu",), params={"fail": "hang"}))
def test_ds(accelperf):
    accelperf.train(make_task(accelperf.case))
'''


@pytest.mark.slow
def test_a_hung_rank_times_out(suite: Suite) -> None:
    suite.pytester.makepyfile(dstask=DSTASK)
    suite.write(HANG)
    t0 = time.monotonic()
    result = suite.run("--accelperf-json=report.json", "--accelperf-timeout=25")
    # Stopped after the 25 s timeout, far from the hang's forever: 25 s alone; starting two
    # ranks and killing them took up to 24 s more when the other xdist worker held both
    # cores, and 146 s in all when the session first waited for the machine's host lock
    # (the other worker's DeepSpeed ranks training) beside a TPU compile (2026-11-29).
    assert time.monotonic() - t0 < 240
    result.assert_outcomes(failed=1)
    run = _runs(suite)["hang"]
    assert run["outcome"] == "timeout"
    assert run["message"].startswith("exceeded the 25 s timeout (rank 0: ")
