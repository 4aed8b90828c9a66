"""The JAX backend trained directly (no pytester): the char-LM of the suite on 8 CPU devices.

Compiles dominate here (seconds each on a small host), so the runs are module fixtures
shared by the tests: one no-mesh run, and one 4x2 run whose single-device reference trains
as many steps as the run (``reference_steps``), so it is the no-mesh run repeated from
scratch, which doubles as the determinism check.
"""

from __future__ import annotations

import math
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from pytest_accelperf.provision.accel import prepare_environment

# Before jax is imported anywhere: 8 virtual CPU devices for the (4, 2) and (8, 1) meshes.
prepare_environment("cpu", 8)

import pytest  # noqa: E402

# The JAX backend's own frameworks (pip install 'pytest-accelperf[jax]').
pytest.importorskip("flax")
pytest.importorskip("optax")
import jax  # noqa: E402
import numpy as np  # noqa: E402

from pytest_accelperf.backends import TrainResult, get_backend  # noqa: E402
from pytest_accelperf.backends.jax.backend import BACKEND, jax_probe  # noqa: E402
from pytest_accelperf.backends.measure.common import fingerprint  # noqa: E402
from pytest_accelperf.checks import Tolerances, Verdict  # noqa: E402
from pytest_accelperf.checks.numerics import check_reference  # noqa: E402
from pytest_accelperf.collect.cases import Case  # noqa: E402
from pytest_accelperf.jax import JaxTask, predict_memory  # noqa: E402
from pytest_accelperf.provision.accel import Accelerator, provision  # noqa: E402
from pytest_accelperf.records.reference import ReferenceParams  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[4] / "suites" / "jax"))
from charlm import make_task  # noqa: E402

GIB = 2**30
STEPS, WARMUP, BATCH = 8, 2, 32


@pytest.fixture(scope="module")
def accel() -> Accelerator:
    return provision("cpu", 8)


def small(mesh: tuple[int, ...] | None, **kw: Any) -> Case:
    return Case(backend="jax", batch=BATCH, mesh=mesh, steps=STEPS, warmup=WARMUP, **kw)


@pytest.fixture(scope="module")
def nomesh(accel: Accelerator) -> TrainResult:
    case = small(None)
    return BACKEND.train(case, make_task(case), accel)


@pytest.fixture(scope="module")
def sharded(accel: Accelerator) -> TrainResult:
    case = small((4, 2), reference=True, reference_steps=STEPS + WARMUP)
    return BACKEND.train(case, make_task(case), accel)


def test_registry_loads_this_backend() -> None:
    assert get_backend("jax").load() is BACKEND
    assert BACKEND.unavailable_reason() is None


@pytest.mark.slow
@pytest.mark.parametrize("which, n_devices", [("nomesh", 1), ("sharded", 8)])
def test_small_case_trains_and_is_measured(request: pytest.FixtureRequest, which: str,
                                           n_devices: int) -> None:
    run = request.getfixturevalue(which).run
    assert run.outcome == "ok", run.message
    assert run.n_devices == n_devices
    assert len(run.step_times) == STEPS and all(t > 0 for t in run.step_times)
    assert len(run.losses) == STEPS + WARMUP and run.loss_steps == list(range(STEPS + WARMUP))
    assert run.losses[-1] < run.losses[0] - 0.5, run.losses
    assert run.compile_time is not None and run.compile_time > 0
    assert run.memory_source == "memory_analysis"
    assert sorted(run.memory_per_device) == sorted(f"cpu:{i}" for i in range(n_devices))
    assert all(b > 0 for b in run.memory_per_device.values())
    assert run.flops_per_step is not None and run.flops_per_step > 0
    assert run.samples_per_step == BATCH and run.tokens_per_step == BATCH * 32
    leaf = run.params_fingerprint["params/block0/qkv/kernel"]
    assert leaf["shape"] == [64, 192] and leaf["dtype"] == "float32"
    assert len(leaf["sample"]) == 16 and leaf["rms"] > 0


@pytest.mark.slow  # the nomesh and sharded trainings: 40 s of setup
def test_model_flops_do_not_depend_on_the_mesh(nomesh: TrainResult,
                                               sharded: TrainResult) -> None:
    """FLOPs per step are the model's: the unpartitioned program's cost analysis, the same
    on one device and on a 4x2 mesh. One device's count times the device count (kept as
    ``hardware_flops_per_step``) counts compute the mesh replicates on every replica: it
    gave 2.01x the model's FLOPs with parameters replicated over ``model``."""
    one, mesh = nomesh.run.flops_per_step, sharded.run.flops_per_step
    assert one is not None and mesh is not None
    assert mesh == pytest.approx(one, rel=0.01)
    hardware = sharded.run.details["hardware_flops_per_step"]
    assert hardware >= mesh * 0.99  # replicated work only adds


@pytest.mark.slow  # the nomesh and sharded trainings: 40 s of setup
def test_sharding_splits_memory(nomesh: TrainResult, sharded: TrainResult) -> None:
    one = nomesh.run.peak_memory
    per_device = sharded.run.peak_memory
    assert one is not None and per_device is not None and per_device < one / 2


@pytest.mark.slow  # the nomesh and sharded trainings: 40 s of setup
def test_reference_matches_sharded_run(sharded: TrainResult) -> None:
    ref = sharded.reference_params
    assert isinstance(ref, ReferenceParams) and ref.keys() == sharded.params.keys()
    assert ref.steps == STEPS + WARMUP == sharded.run.details["reference_steps"]
    assert ref.mesh == "4x2" and ref.compared is not None
    for key, value in sharded.params.items():
        np.testing.assert_allclose(value, ref[key], atol=5e-3, rtol=0, err_msg=key)
        # The sharded program trained again from its initial state, apart from the
        # measured run, on the same batches: the same parameters, bit for bit.
        np.testing.assert_array_equal(ref.compared[key], value, err_msg=key)
    check = check_reference(sharded.params, ref, Tolerances())
    assert check.verdict is Verdict.PASS, check.detail
    assert check.detail.startswith(f"parameters after {STEPS + WARMUP} steps on the 4x2 mesh "
                                   f"match the single-device reference within atol=0.005 ")
    assert "rounding differences between the two programs grow" in check.detail


@pytest.mark.slow  # the nomesh and sharded trainings: 40 s of setup
def test_training_is_deterministic(nomesh: TrainResult, sharded: TrainResult) -> None:
    # The reference of the 4x2 case is the no-mesh case compiled and trained again.
    ref = sharded.reference_params
    assert ref is not None
    assert isinstance(ref, ReferenceParams)
    assert fingerprint(ref, ref.state) == nomesh.run.params_fingerprint
    for key, value in nomesh.params.items():
        np.testing.assert_array_equal(value, ref[key], err_msg=key)


@pytest.mark.slow  # the nomesh and sharded trainings: 40 s of setup
def test_the_run_says_where_its_time_went(nomesh: TrainResult, sharded: TrainResult) -> None:
    for result, reference in ((nomesh, False), (sharded, True)):
        run = result.run
        phases = run.phases
        assert phases is not None
        assert set(phases) == {"build", "compile", "program", "probe", "train",
                               "fingerprint", "reference", "total"}
        assert all(seconds >= 0 for seconds in phases.values())
        # The step's timed lowering and compile is inside the compile phase; the init's
        # compile and the measured steps inside the train phase.
        # The step's one trace (before the lowering, which reuses it) is timed apart.
        assert run.trace_time is not None and run.batch_time is not None
        assert run.compile_time_parts is not None
        assert 0 < run.trace_time < phases["compile"]
        assert phases["compile"] >= (run.compile_time_parts["step"]
                                     + run.trace_time)
        # The batches made and moved outside the timer are inside the train phase too.
        assert run.batch_time > 0
        assert phases["train"] >= (run.compile_time_parts["init"]
                                   + sum(run.step_times) + run.batch_time)
        assert (phases["reference"] > 0.05) is reference  # the single-device program's compile
        assert sum(v for k, v in phases.items() if k != "total") <= phases["total"]


def test_the_drift_probe_is_made_once_per_device_and_size(accel: Accelerator) -> None:
    device = jax.devices()[0]
    first = jax_probe(device)
    assert jax_probe(device) is first  # the next case's: nothing compiled again
    other = jax_probe(device, n=64, reps=2)
    assert other is not first and other.kind == "jax-cpu-matmul64x2"
    assert jax_probe(device, n=64, reps=2) is other
    assert first.time() > 0 and other.time() > 0


@pytest.mark.slow  # compiles the full-size model (6 s): not in the quick loop
def test_full_size_without_mesh_is_predicted_out_of_memory(accel: Accelerator) -> None:
    case = Case(backend="jax", batch=4096, label="full", memory_capacity=16 * GIB,
                params={"size": "full"})
    run = BACKEND.train(case, make_task(case), accel).run
    assert run.outcome == "oom", run.message
    assert run.oom is not None
    assert run.oom["required_bytes"] > run.oom["capacity_bytes"] == 16 * GIB
    assert run.oom["exceeded_by_bytes"] == run.oom["required_bytes"] - 16 * GIB
    assert run.oom["source"] == "memory_analysis"
    assert run.message.startswith("predicted out of memory: program needs ")
    assert "of 16.00 GiB capacity (exceeded by " in run.message
    assert run.memory_per_device == {"cpu:0": run.oom["required_bytes"]}
    assert run.losses == [] and run.step_times == []  # nothing was trained


@pytest.mark.slow
def test_full_size_on_mesh_4x2_is_predicted_to_fit(accel: Accelerator) -> None:
    case = Case(backend="jax", batch=4096, mesh=(4, 2), params={"size": "full"})
    planned = predict_memory(case, make_task(case), accel)
    assert planned["required_bytes"] < 12 * GIB, planned
    assert planned["required_bytes"] == (planned["argument_bytes"] + planned["output_bytes"]
                                         + planned["temp_bytes"] - planned["alias_bytes"])


def linear_task(batch: int, nan_at: int | None = None) -> JaxTask:
    """A linear regression: compiles in a fraction of the char-LM's time. ``nan_at`` sets a
    batch flag that turns the loss into NaN at that step."""
    import jax
    import jax.numpy as jnp
    import optax
    from jax.sharding import PartitionSpec

    dim, out = 64, 32
    true_w = np.random.default_rng(0).normal(size=(dim, out)).astype(np.float32)

    def init_params(key: Any) -> Any:
        return {"w": jax.random.normal(key, (dim, out)) * 0.01, "b": jnp.zeros((out,))}

    def loss_fn(params: Any, b: Any) -> Any:
        pred = b["x"] @ params["w"] + params["b"]
        return jnp.mean((pred - b["y"]) ** 2) * b["scale"][0]

    def make_batch(step: int) -> dict[str, np.ndarray]:
        r = np.random.default_rng(step)
        x = r.normal(size=(batch, dim)).astype(np.float32)
        scale = np.full((batch,), math.nan if step == nan_at else 1.0, np.float32)
        return {"x": x, "y": x @ true_w, "scale": scale}

    spec: Any = PartitionSpec  # untyped in jax
    return JaxTask(init_params=init_params, loss_fn=loss_fn, make_batch=make_batch,
                   optimizer=optax.adam(0.05),
                   param_specs=lambda p: {"w": spec(None, "model"), "b": spec("model")})


def test_nan_loss_stops_training(accel: Accelerator) -> None:
    case = Case(backend="jax", batch=16, steps=6, warmup=1)
    run = BACKEND.train(case, linear_task(16, nan_at=3), accel).run
    assert run.outcome == "nan"
    assert run.nan_step == 3
    assert run.message == "loss is nan at step 3"
    assert len(run.losses) == 4 and math.isnan(run.losses[-1])
    assert all(math.isfinite(x) for x in run.losses[:3])


def test_reference_skipped_when_one_device_cannot_hold_it(accel: Accelerator) -> None:
    batch = 4096
    one = predict_memory(Case(backend="jax", batch=batch), linear_task(batch), accel)
    case = Case(backend="jax", batch=batch, mesh=(8, 1), steps=2, warmup=0, reference=True)
    eight = predict_memory(case, linear_task(batch), accel)
    assert eight["required_bytes"] < one["required_bytes"]
    capacity = (one["required_bytes"] + eight["required_bytes"]) // 2
    result = BACKEND.train(replace(case, memory_capacity=capacity), linear_task(batch), accel)
    assert result.run.outcome == "ok", result.run.message
    assert result.reference_params is None
    assert result.run.details["reference"].startswith(
        "single-device reference not run: predicted out of memory")


def test_memory_is_the_cases_own_where_the_runtime_peak_cannot_be_reset(
        accel: Accelerator, monkeypatch: pytest.MonkeyPatch) -> None:
    """Seen on an H100: JAX's runtime peak counts since the process started, so every
    case after a larger one read that one's peak (189.77 MiB for a 2 MiB MLP, the same
    figure for three cases). The gate's figure is the compiler's plan everywhere; the
    runtime's peak is recorded beside only where this case raised it."""
    import pytest_accelperf.backends.jax.backend as jax_backend

    case = Case(backend="jax", batch=16, steps=3, warmup=1)
    plan = BACKEND.train(case, linear_task(16), accel).run.memory_per_device
    readings = iter([[10**9], [10**9]])  # an earlier case's peak, not raised by this one
    monkeypatch.setattr(jax_backend, "_runtime_peaks", lambda mesh: next(readings))
    run = BACKEND.train(case, linear_task(16), accel).run
    assert run.memory_per_device == plan and run.memory_source == "memory_analysis"
    assert run.details["runtime_peak"] == {}
    readings = iter([[10**9], [2 * 10**9]])  # this case raised it: its own peak
    run = BACKEND.train(case, linear_task(16), accel).run
    assert run.memory_per_device == plan
    assert list(run.details["runtime_peak"].values()) == [2 * 10**9]


def test_a_declared_capacity_smaller_than_the_device_is_what_a_case_is_judged_against() -> None:
    """Seen on an H100 (80 GB): seed 000's batch 4096, declared against a 16 GiB device,
    trained instead of being predicted out of memory, and the suite's assertion failed."""
    from pytest_accelperf.backends.jax.memory import _capacity

    gpu = Accelerator(name="gpu", platform="gpu-x1", device_kind="h100", device_count=1,
                      memory_capacity=80 * GIB)
    declared = Case(backend="jax", batch=8, memory_capacity=16 * GIB)
    assert _capacity(gpu, declared) == 16 * GIB
    assert _capacity(gpu, Case(backend="jax", batch=8)) == 80 * GIB
    cpu = Accelerator(name="cpu", platform="cpu-x8", device_kind="cpu", device_count=8)
    assert _capacity(cpu, declared) == 16 * GIB
    assert _capacity(cpu, Case(backend="jax", batch=8)) is None
