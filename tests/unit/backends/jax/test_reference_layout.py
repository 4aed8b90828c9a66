"""The reference check judges the layout, not the chaos of training (issue 15, part 7).

A tiny CNN with BatchNorm, trained data-parallel on the 8x1 mesh for 32 steps by a
``shard_map``-ed step written as pmap code is (BatchNorm over the ``data`` axis, gradients
``lax.pmean``-ed over it; ``check_vma=False``, as such code runs), and its single-device
reference. The check compares the two after ``reference_steps`` steps (default 1, as seed
004 does), apart from the measured run: correct code passes, and the rounding differences
between two correct programs grow with the steps compared. Two real sharding bugs fail it
from the first step, naming the leaf: BatchNorm statistics over one shard (the ``axis_name``
missing: a per-shard partition where the global batch was meant), and a missing gradient
reduction (no ``lax.pmean`` of the gradients).

Measured here (XLA:CPU, 8 virtual devices, Adam at lr 0.2; max |Δ| against the
single-device reference after 1 / 2 / 8 / 16 / 32 steps):

===================  =======  =======  =======  =======  =======
steps compared       1        2        8        16       32
===================  =======  =======  =======  =======  =======
correct              6.0e-08  2.6e-06  1.4e-05  2.0e-05  4.2e-05
BatchNorm per shard  0.40     0.75     1.9      2.5      4.7
no gradient pmean    0.40     0.79     2.0      6.1      15
===================  =======  =======  =======  =======  =======

A bug is 0.4 = 2 lr from the first step (Adam's first update is lr * sign(grad): the wrong
gradient's sign differs somewhere); correct code is 6e6 times below that.

The four trainings of the CNN are each one the assertions need (a correct one compared
after 1 step, the same compared after 32, and one per bug); what they cost is compiles,
not steps: the sharded step, its init, and the reference's two (about 12 s of CPU a
training, 27 s before the kernels were drawn as vectors: :func:`kernel_init`).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from pytest_accelperf.provision.accel import prepare_environment

# Before jax is imported anywhere: 8 virtual CPU devices for the 8x1 mesh.
prepare_environment("cpu", 8)

import pytest  # noqa: E402

# The JAX backend's own frameworks (pip install 'pytest-accelperf[jax]').
pytest.importorskip("flax")
pytest.importorskip("optax")
import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from flax.training import train_state  # noqa: E402
from jax.sharding import PartitionSpec  # noqa: E402

from pytest_accelperf.backends import TrainResult  # noqa: E402
from pytest_accelperf.backends.jax.backend import BACKEND, REFERENCE_MAX_STEPS  # noqa: E402
from pytest_accelperf.checks import CheckResult, Tolerances, Verdict, run_checks  # noqa: E402
from pytest_accelperf.checks.numerics import check_reference  # noqa: E402
from pytest_accelperf.collect.cases import Case  # noqa: E402
from pytest_accelperf.jax import JaxStep  # noqa: E402
from pytest_accelperf.provision.accel import Accelerator, provision  # noqa: E402
from pytest_accelperf.records.reference import ReferenceParams  # noqa: E402

#: Every test here is slow, out of the quick loop (`-m "not slow"`):
#: its fixtures train sharded and reference runs (12 s of CPU each).
pytestmark = pytest.mark.slow


P: Any = PartitionSpec  # untyped in jax
BATCH, STEPS, LR = 32, 32, 0.2
CASE = Case(backend="jax", batch=BATCH, mesh=(8, 1), steps=STEPS, warmup=0, reference=True)


def kernel_init(key: jax.Array, shape: tuple[int, ...], dtype: Any = jnp.float32) -> jax.Array:
    """A kernel drawn as LeCun's (a truncated normal of standard deviation 1 / sqrt(fan_in)),
    but as a vector, reshaped. XLA:CPU compiles jax's (partitionable) threefry draw of a
    rank-4 shape slowly: ``jax.random.bits(key, (3, 3, 3, 8))`` took 5.5 s of CPU to
    compile, ``(216,)`` 0.55 s (jax 0.10.2), and Flax's default ``init`` of this CNN took
    10 s of each training's 27 (it is compiled twice: sharded, and for the reference)."""
    draw = nn.initializers.truncated_normal(1 / math.sqrt(math.prod(shape[:-1])))
    vector: jax.Array = draw(key, (math.prod(shape),), dtype)
    return vector.reshape(shape)


class CNN(nn.Module):
    """Conv (no bias: BatchNorm follows), BatchNorm over ``axis_name``, Conv, pool, Dense."""

    axis_name: str | None = None

    @nn.compact
    def __call__(self, x: jax.Array, train: bool) -> jax.Array:
        x = nn.Conv(8, (3, 3), use_bias=False, kernel_init=kernel_init)(x)
        x = nn.BatchNorm(use_running_average=not train, momentum=0.9,
                         axis_name=self.axis_name)(x)
        x = nn.relu(x)
        x = nn.relu(nn.Conv(8, (3, 3), strides=2, kernel_init=kernel_init)(x)).mean(axis=(1, 2))
        return nn.Dense(4, kernel_init=kernel_init)(x)


class TrainState(train_state.TrainState):
    batch_stats: Any


def make_state(axis_name: str | None) -> Any:
    def create(key: jax.Array) -> TrainState:
        model = CNN(axis_name=axis_name)
        variables = model.init(key, jnp.ones((1, 8, 8, 3)), train=False)
        return TrainState.create(apply_fn=model.apply, params=variables["params"],
                                 batch_stats=variables["batch_stats"], tx=optax.adam(LR))
    return create


def make_batch(step: int) -> dict[str, np.ndarray]:
    r = np.random.default_rng(step)
    return {"x": r.normal(size=(BATCH, 8, 8, 3)).astype(np.float32),
            "y": r.integers(0, 4, size=(BATCH,)).astype(np.int32)}


def data_parallel(bn_axis: str | None, grad_pmean: bool) -> JaxStep:
    """The pmap-style step under ``jax.shard_map`` over ``data`` (the mesh in context):
    each device trains on its share of the batch. Correct with ``bn_axis="data"`` and
    ``grad_pmean=True``."""

    def local(state: TrainState, batch: Any) -> tuple[TrainState, dict[str, Any]]:
        def loss_fn(params: Any) -> Any:
            logits, updates = state.apply_fn(
                {"params": params, "batch_stats": state.batch_stats}, batch["x"], train=True,
                mutable=["batch_stats"])
            loss = optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean()
            return loss, updates

        (loss, updates), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
        if grad_pmean:
            grads = jax.lax.pmean(grads, "data")
        state = state.apply_gradients(grads=grads, batch_stats=updates["batch_stats"])
        return state, {"loss": jax.lax.pmean(loss, "data")}

    def step(state: TrainState, batch: Any) -> tuple[TrainState, dict[str, Any]]:
        shard_map: Any = jax.shard_map
        return shard_map(local, in_specs=(P(), P("data")), out_specs=(P(), P()),
                         check_vma=False)(state, batch)

    return JaxStep(init=make_state(bn_axis), step=step, make_batch=make_batch)


def reference_check(result: TrainResult) -> CheckResult:
    checks = run_checks(result.run, None, None, Tolerances(), comparable=True,
                        reference_params=result.reference_params, params=result.params)
    return next(c for c in checks if c.metric == "reference")


@pytest.fixture(scope="module")
def accel() -> Accelerator:
    return provision("cpu", 8)


@pytest.fixture(scope="module")
def correct(accel: Accelerator) -> TrainResult:
    return BACKEND.train(CASE, data_parallel("data", grad_pmean=True), accel)


@pytest.mark.slow
def test_correct_code_passes_after_one_step(correct: TrainResult) -> None:
    run = correct.run
    assert run.outcome == "ok", run.message
    # The measured run keeps its steps; the reference steps are apart from it.
    assert len(run.step_times) == STEPS and len(run.losses) == STEPS
    assert run.details["reference_steps"] == 1
    ref = correct.reference_params
    assert isinstance(ref, ReferenceParams) and ref.steps == 1 and ref.compared is not None
    assert ref.keys() == correct.params.keys()
    # What is compared is the sharded program after one step, not its final parameters.
    kernel = "Conv_0/kernel"
    assert not np.allclose(ref.compared[kernel], correct.params[kernel], atol=1e-3)
    check = reference_check(correct)
    assert check.verdict is Verdict.PASS, check.detail
    assert check.detail.startswith(
        "parameters after 1 step on the 8x1 mesh match the single-device reference within "
        "atol=0.005 (largest |Δ| "), check.detail
    assert check.data["worst"] in check.detail and "rounding" not in check.detail
    assert check.now is not None and check.now < 1e-5  # 6.0e-08 measured


def test_compared_after_more_steps_the_difference_grows(correct: TrainResult,
                                                        accel: Accelerator) -> None:
    # One measured step; both programs train 32 steps for the comparison.
    case = replace(CASE, steps=1, reference_steps=STEPS)
    late = BACKEND.train(case, data_parallel("data", grad_pmean=True), accel)
    assert late.run.details["reference_steps"] == STEPS
    check, early = reference_check(late), reference_check(correct)
    assert check.detail.startswith(f"parameters after {STEPS} steps on the 8x1 mesh "), \
        check.detail
    assert "rounding differences between the two programs grow with every step" in check.detail
    assert check.data["steps"] == STEPS and early.data["steps"] == 1
    assert early.now is not None and check.now is not None
    # Measured: 6.0e-08 after 1 step, 4.2e-05 after 32 (2.6e-06 after 2, 1.4e-05 after 8).
    assert check.now > 10 * early.now, (early.now, check.now)


@pytest.mark.slow
@pytest.mark.parametrize("bug, step", [
    ("batchnorm_per_shard", data_parallel(None, grad_pmean=True)),
    ("no_gradient_pmean", data_parallel("data", grad_pmean=False)),
])
def test_a_sharding_bug_fails_naming_the_leaf(bug: str, step: JaxStep,
                                              accel: Accelerator) -> None:
    result = BACKEND.train(CASE, step, accel)
    assert result.run.outcome == "ok", result.run.message  # it trains, silently wrong
    check = reference_check(result)
    assert check.verdict is Verdict.REGRESSION, check.detail
    worst = check.data["worst"]
    assert worst in result.params  # a leaf, named: "Conv_0/kernel", "Dense_0/bias"
    assert check.detail.startswith(
        f"{worst} differs from the single-device reference after 1 step: max |Δ| = "), \
        check.detail
    assert "beyond atol=0.005" in check.detail
    assert check.now is not None and check.now > 5e-3


def linear(lr: Any) -> JaxStep:
    """A linear regression trained by Adam at ``lr`` (a number, or a schedule of the step),
    its state a Flax ``TrainState``."""

    def init(key: jax.Array) -> train_state.TrainState:
        w = jax.random.normal(key, (8, 1)) * 0.1
        return train_state.TrainState.create(apply_fn=None, params={"w": w},
                                             tx=optax.adam(lr))

    def step(state: train_state.TrainState, batch: Any) -> tuple[Any, dict[str, Any]]:
        x = batch["x"].reshape(BATCH, -1)[:, :8]
        loss, grads = jax.value_and_grad(
            lambda p: jnp.mean((x @ p["w"] - batch["y"][:, None]) ** 2))(state.params)
        return state.apply_gradients(grads=grads), {"loss": loss}

    return JaxStep(init=init, step=step, make_batch=make_batch)


def test_a_warm_up_from_learning_rate_0_is_compared_once_the_parameters_moved(
        accel: Accelerator) -> None:
    """Issue 23: Flax's ImageNet schedule warms up from learning rate 0, so after the one
    step compared the parameters had not moved, and ``largest |Δ| 0`` passed whatever the
    sharding did. The reference now trains on until they moved beyond the tolerance, and
    the comparison it makes then can fail: a program that updated nothing does."""
    warm_up = optax.linear_schedule(0.0, 0.1, transition_steps=4)  # 0, then 0.025, ...
    result = BACKEND.train(replace(CASE, steps=2), linear(warm_up), accel)
    assert result.run.outcome == "ok", result.run.message
    assert result.run.details["reference_steps"] == 2  # step 1 (lr 0) left them unmoved
    check = reference_check(result)
    assert check.verdict is Verdict.PASS, check.detail
    assert check.detail.startswith("parameters after 2 steps on the 8x1 mesh match"), \
        check.detail
    assert "; compared after 2 steps (the first after which the parameters had moved beyond " \
           "the tolerance; reference_steps 1): rounding" in check.detail
    ref = result.reference_params
    assert isinstance(ref, ReferenceParams) and ref.initial is not None
    # Beside the parameters the state is compared too: Adam's count, the schedule's.
    assert ref.compared is not None
    assert ref.state == {"opt_state/0/count", "opt_state/1/count", "step"}
    idle = ReferenceParams(ref, compared={**ref.compared, **ref.initial}, steps=2,
                           mesh="8x1", state=ref.state, initial=ref.initial)
    failed = check_reference(None, idle, Tolerances())
    assert failed.verdict is Verdict.REGRESSION, failed.detail
    assert failed.detail.startswith("w differs from the single-device reference after 2 steps")


def test_parameters_that_never_move_are_inconclusive_not_a_pass(accel: Accelerator) -> None:
    """A learning rate of 0 throughout: no number of steps makes the check able to fail,
    and it says so instead of passing with ``largest |Δ| 0``."""
    result = BACKEND.train(replace(CASE, steps=1), linear(0.0), accel)
    assert result.run.outcome == "ok", result.run.message
    assert result.run.details["reference_steps"] == REFERENCE_MAX_STEPS == 16
    check = reference_check(result)
    assert check.verdict is Verdict.INCONCLUSIVE, check.detail
    assert check.detail == (
        "the parameters did not move beyond atol=0.005 in 16 steps (largest move 0 in w, of "
        "1 parameter leaf; learning rate 0 at the start of the schedule?), so a program "
        "that updated nothing would match the reference: raise reference_steps past the "
        "warm-up")


def test_reference_steps_is_validated() -> None:
    assert CASE.reference_steps == 1
    assert CASE.to_json()["reference_steps"] == 1
    for bad in (0, -1):
        with pytest.raises(ValueError, match="reference_steps must be a whole number >= 1"):
            replace(CASE, reference_steps=bad)
    for bad in (1.5, True, "2"):  # the wrong type, refused by the fields' own annotations
        with pytest.raises(ValueError, match=r"Case\.reference_steps must be int, got"):
            replace(CASE, reference_steps=bad)
