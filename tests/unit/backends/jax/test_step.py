"""The user's own training step (``JaxStep``, ``nnx_step``) through the JAX backend.

Real training on 8 virtual CPU devices: a Flax linen ``TrainState`` with ``batch_stats``
and a dropout key, a pmap-style step whose BatchNorm reduces over ``axis_name='batch'``,
an NNX model with ``nnx.Optimizer`` and ``nnx.MultiMetric``, metrics beside the loss, and
the errors a step can make, which must name the user's function and the fix. The tests
that go through pytest (the state handed back to the test, a clean failure, metrics
checked against the baseline) run inner sessions with pytester.
"""

from __future__ import annotations

import math
import pickle
import time
from typing import Any

from pytest_accelperf.provision.accel import prepare_environment

# Before jax is imported anywhere: 8 virtual CPU devices for the (4, 2) and (8, 1) meshes.
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
from conftest import Suite  # noqa: E402
from flax.training import train_state  # noqa: E402
from jax.sharding import PartitionSpec  # noqa: E402

from pytest_accelperf.backends.jax.backend import BACKEND  # noqa: E402
from pytest_accelperf.backends.measure.common import TaskError  # noqa: E402
from pytest_accelperf.backends.protocol import TrainResult  # noqa: E402
from pytest_accelperf.checks import Tolerances, Verdict  # noqa: E402
from pytest_accelperf.checks.numerics import check_numerics  # noqa: E402
from pytest_accelperf.collect.cases import Case  # noqa: E402
from pytest_accelperf.jax import JaxStep, JaxTask, nnx_step  # noqa: E402
from pytest_accelperf.provision.accel import Accelerator, provision  # noqa: E402
from pytest_accelperf.records.fingerprint import compact  # noqa: E402
from pytest_accelperf.records.run import Run  # noqa: E402

P: Any = PartitionSpec  # untyped in jax
DIM, STEPS, WARMUP = 8, 6, 1


@pytest.fixture(scope="module")
def accel() -> Accelerator:
    return provision("cpu", 8)


def case(batch: int = 32, mesh: tuple[int, ...] | None = None, **kw: Any) -> Case:
    return Case(backend="jax", batch=batch, mesh=mesh, steps=STEPS, warmup=WARMUP, **kw)


def regression_batch(batch: int) -> Any:
    def make_batch(step: int) -> dict[str, np.ndarray]:
        r = np.random.default_rng(step)
        x = (3.0 + 2.0 * r.normal(size=(batch, DIM))).astype(np.float32)  # mean 3, std 2
        return {"x": x, "y": (x - 3.0).mean(axis=1, keepdims=True)}
    return make_batch


class MLP(nn.Module):
    """Dense, BatchNorm (over ``axis_name`` when given, as pmap code does), Dropout."""

    axis_name: str | None = None
    dropout: float = 0.0
    momentum: float = 0.5

    @nn.compact
    def __call__(self, x: jax.Array, train: bool) -> jax.Array:
        x = nn.BatchNorm(use_running_average=not train, momentum=self.momentum,
                         axis_name=self.axis_name)(x)
        x = nn.relu(nn.Dense(16)(x))
        x = nn.Dropout(rate=self.dropout, deterministic=not train)(x)
        return nn.Dense(1)(x)


class TrainState(train_state.TrainState):
    batch_stats: Any
    key: jax.Array


def make_state(axis_name: str | None = None, dropout: float = 0.0,
               momentum: float = 0.5) -> Any:
    def create(key: jax.Array) -> TrainState:
        params_key, dropout_key = jax.random.split(key)
        model = MLP(axis_name=axis_name, dropout=dropout, momentum=momentum)
        variables = model.init(params_key, jnp.ones((1, DIM)), train=False)
        return TrainState.create(apply_fn=model.apply, params=variables["params"],
                                 batch_stats=variables["batch_stats"], key=dropout_key,
                                 tx=optax.adam(5e-2))
    return create


def bn_step(pmean_axis: str | None = None) -> Any:
    """The Flax guides' BatchNorm + Dropout step; with ``pmean_axis``, the pmap version."""

    def train_step(state: TrainState, batch: Any) -> tuple[TrainState, dict[str, Any]]:
        dropout_key = jax.random.fold_in(key=state.key, data=state.step)

        def loss_fn(params: Any) -> Any:
            pred, updates = state.apply_fn(
                {"params": params, "batch_stats": state.batch_stats}, batch["x"],
                train=True, rngs={"dropout": dropout_key}, mutable=["batch_stats"])
            return jnp.mean((pred - batch["y"]) ** 2), updates

        (loss, updates), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
        if pmean_axis:
            grads = jax.lax.pmean(grads, pmean_axis)
            loss = jax.lax.pmean(loss, pmean_axis)
        state = state.apply_gradients(grads=grads, batch_stats=updates["batch_stats"])
        return state, {"loss": loss, "grad_norm": optax.tree.norm(grads)}

    return train_step


# -- mutable state, RNG, metrics, final state ---------------------------------------------------
def test_batch_stats_change_across_steps_and_state_comes_back(accel: Accelerator) -> None:
    step = JaxStep(init=make_state(), step=jax.jit(bn_step()), make_batch=regression_batch(32))
    result = BACKEND.train(case(mesh=(8, 1)), step, accel)
    run = result.run
    assert run.outcome == "ok", run.message
    assert isinstance(result, TrainResult)
    state = result.state
    assert isinstance(state, TrainState) and int(state.step) == STEPS + WARMUP
    mean = np.asarray(state.batch_stats["BatchNorm_0"]["mean"])
    # Initialized at 0; momentum 0.5 over 7 steps moves it close to the data's mean of 3.
    assert np.all(mean > 2.5), mean
    # The numerics fingerprint is of state.params (the default accessor) and, marked as
    # state, every other leaf of the state but Adam's moments (issue 23).
    fp = run.params_fingerprint
    assert {k for k, v in fp.items() if not v.get("state")} == {
        "BatchNorm_0/bias", "BatchNorm_0/scale", "Dense_0/bias", "Dense_0/kernel",
        "Dense_1/bias", "Dense_1/kernel"}
    assert {k for k, v in fp.items() if v.get("state")} == {
        "batch_stats/BatchNorm_0/mean", "batch_stats/BatchNorm_0/var", "key",
        "opt_state/0/count", "step"}
    assert fp["step"]["rms"] == fp["opt_state/0/count"]["rms"] == STEPS + WARMUP
    assert len(run.metrics["grad_norm"]) == len(run.losses) == STEPS + WARMUP
    assert all(g > 0 for g in run.metrics["grad_norm"])
    assert run.losses[-1] < run.losses[0]


@pytest.mark.slow  # trains twice (5 s): not in the quick loop
def test_a_batchnorm_momentum_change_is_caught_naming_the_collection(
        accel: Accelerator) -> None:
    """Issue 23: a BatchNorm momentum changed 0.9 -> 0.99 in Flax's ImageNet example changed
    only ``batch_stats`` (training normalizes with each batch's own statistics), and the
    numerics fingerprint, of ``state.params`` alone, saw nothing. The default now covers
    the state beside the parameters, and the check names the collection that moved."""
    def trained(momentum: float) -> Run:
        step = JaxStep(init=make_state(momentum=momentum), step=jax.jit(bn_step()),
                       make_batch=regression_batch(32))
        run = BACKEND.train(case(), step, accel).run
        assert run.outcome == "ok", run.message
        return run

    base, changed = trained(0.9), trained(0.99)
    now = {"numerics": changed.params_fingerprint}
    check = check_numerics(now, {"numerics": compact(base.params_fingerprint)}, Tolerances())
    assert check is not None and check.verdict is Verdict.REGRESSION, check.detail
    assert check.detail.startswith("batch_stats/BatchNorm_0/"), check.detail
    assert " differs from the baseline fingerprint: max |Δ| = " in check.detail
    # Only the running statistics moved: every parameter is as it was, bit for bit.
    assert set(check.data["failing"]) == {"batch_stats/BatchNorm_0/mean",
                                          "batch_stats/BatchNorm_0/var"}
    assert all(check.data["max_abs"][k] == 0 for k, v in base.params_fingerprint.items()
               if not v.get("state"))


def test_explicit_params_is_all_that_is_compared() -> None:
    """``params=`` (the workaround of issue 23, ``{"params": ..., "batch_stats": ...}``)
    keeps meaning exactly what is fingerprinted: nothing is added beside it."""
    state = make_state()(jax.random.key(0))
    both = JaxStep(init=state, step=bn_step(), make_batch=regression_batch(8),
                   params=lambda s: {"params": s.params, "batch_stats": s.batch_stats})
    assert both.beside_of(state, both.params_of(state)) == {}
    default = JaxStep(init=state, step=bn_step(), make_batch=regression_batch(8))
    beside = default.beside_of(state, default.params_of(state))
    assert sorted(beside) == ["batch_stats/BatchNorm_0/mean", "batch_stats/BatchNorm_0/var",
                              "key", "opt_state/0/count", "step"]


def test_dropout_rng_is_new_every_step_and_reproducible(accel: Accelerator) -> None:
    def init(key: jax.Array) -> dict[str, Any]:
        return {"key": key, "step": jnp.zeros((), jnp.int32), "w": jnp.ones((64,))}

    def train_step(state: dict[str, Any], batch: Any) -> tuple[dict[str, Any], Any]:
        rng = jax.random.fold_in(state["key"], state["step"])
        kept = nn.Dropout(rate=0.5, deterministic=False).apply({}, state["w"],
                                                                 rngs={"dropout": rng})
        mask = (kept > 0).astype(jnp.float32)
        loss = jnp.mean(batch["x"])
        return ({**state, "step": state["step"] + 1},
                {"loss": loss, "mask_code": jnp.sum(mask * jnp.arange(64.0))})

    def run_once() -> list[float]:
        step = JaxStep(init=init, step=train_step, make_batch=regression_batch(16))
        run = BACKEND.train(case(batch=16), step, accel).run
        assert run.outcome == "ok", run.message
        return run.metrics["mask_code"]

    first = run_once()
    assert len(set(first)) == len(first), f"a dropout mask repeated: {first}"
    assert run_once() == first  # the same masks on a fresh run: seeded by state and step


def test_metrics_of_a_jaxtask_aux_and_a_schedule_read_from_state_step(
        accel: Accelerator) -> None:
    schedule = optax.linear_schedule(1e-2, 1e-3, transition_steps=STEPS + WARMUP)

    def loss_fn(params: Any, batch: Any) -> tuple[Any, dict[str, Any]]:
        pred = batch["x"] @ params["w"]
        err = pred - batch["y"]
        return jnp.mean(err**2), {"mae": jnp.mean(jnp.abs(err)), "pred": pred}

    task = JaxTask(init_params=lambda key: {"w": jnp.zeros((DIM, 1))}, loss_fn=loss_fn,
                   make_batch=regression_batch(16),
                   optimizer=optax.sgd(optax.linear_schedule(1e-3, 1e-4, 10)))
    run = BACKEND.train(case(batch=16), task, accel).run
    assert run.outcome == "ok", run.message
    assert set(run.metrics) == {"mae"}  # the non-scalar aux "pred" is not a metric
    assert len(run.metrics["mae"]) == len(run.losses)

    def train_step(state: TrainState, batch: Any) -> tuple[TrainState, dict[str, Any]]:
        lr = schedule(state.step)  # the schedule as the state's optimizer sees it
        grads = jax.grad(lambda p: jnp.mean((batch["x"] @ p["w"] - batch["y"]) ** 2))(
            state.params)
        return state.apply_gradients(grads=grads), {"loss": jnp.float32(0), "lr": lr}

    def init(key: jax.Array) -> train_state.TrainState:
        return train_state.TrainState.create(apply_fn=None, params={"w": jnp.zeros((DIM, 1))},
                                             tx=optax.sgd(schedule))

    run = BACKEND.train(case(batch=16), JaxStep(init, train_step, regression_batch(16)),
                        accel).run
    assert run.outcome == "ok", run.message
    np.testing.assert_allclose(run.metrics["lr"],
                               [float(schedule(i)) for i in range(STEPS + WARMUP)], rtol=1e-6)


@pytest.mark.slow  # 10 s
def test_named_axis_bound_to_the_mesh_matches_the_global_batch(accel: Accelerator) -> None:
    # The pmap-style step (BatchNorm over 'batch', lax.pmean of gradients) fails unbound...
    pmap_style = JaxStep(init=make_state(axis_name="batch"), step=bn_step("batch"),
                         make_batch=regression_batch(32))
    with pytest.raises(TaskError) as info:
        BACKEND.train(case(mesh=(8, 1)), pmap_style, accel)
    text = str(info.value)
    assert "the step train_step (tests/unit/backends/jax/test_step.py:" in text
    assert "named axis 'batch'" in text and "bind_axes={'batch': 'data'}" in text
    # ... and, bound to the mesh's data axis on 8 devices, trains as the global-view step
    # does on one: BatchNorm's statistics are those of the whole batch either way.
    pmap_style.bind_axes = {"batch": "data"}
    bound = BACKEND.train(case(mesh=(8, 1)), pmap_style, accel)
    assert bound.run.outcome == "ok", bound.run.message
    assert bound.run.n_devices == 8
    plain = BACKEND.train(case(), JaxStep(init=make_state(), step=bn_step(),
                                          make_batch=regression_batch(32)), accel)
    np.testing.assert_allclose(bound.run.losses, plain.run.losses, rtol=1e-4)
    # The gradients too: pmap-style lax.pmean of the gradients is the mean over the batch
    # (shard_map's replication checking summed them first, 8x the gradient, which Adam
    # hid from the parameters).
    np.testing.assert_allclose(bound.run.metrics["grad_norm"], plain.run.metrics["grad_norm"],
                               rtol=1e-3)
    for key, value in plain.params.items():
        np.testing.assert_allclose(bound.params[key], value, atol=1e-3, err_msg=key)
    # The other mesh axis stays automatic: a (4, 2) mesh trains too.
    assert BACKEND.train(case(mesh=(4, 2)), pmap_style, accel).run.outcome == "ok"


def test_a_pmapped_step_is_one_line_naming_bind_axes_and_the_function() -> None:
    """Issue 23: Flax's ImageNet example hands ``jax.pmap(train_step, axis_name='batch')``;
    the plugin said something about a context mesh and ``shard_map``. Now: one line
    naming the function pmap wraps and the ``bind_axes`` that replaces pmap's axis."""
    import functools

    def ready(axis: str) -> Any:
        return jax.pmap(bn_step(axis), axis_name=axis)

    for pmapped, axis in ((ready("batch"), "batch"), (jax.jit(ready("i")), "i")):
        with pytest.raises(TaskError) as info:
            JaxStep(init=make_state(), step=pmapped, make_batch=regression_batch(32))
        text = str(info.value)
        assert "\n" not in text
        assert text.startswith("JaxStep.step train_step "
                               "(tests/unit/backends/jax/test_step.py:"), text
        assert "is wrapped in jax.pmap" in text
        assert f"pass the function pmap wraps (train_step; the pmap-ed function's " \
               f".__wrapped__) with bind_axes={{'{axis}': 'data'}}" in text
    # Flax's ImageNet example pmaps a partial (the schedule bound): named as such.
    partial = jax.pmap(functools.partial(bn_step("batch")), axis_name="batch")
    with pytest.raises(TaskError, match=r"\(the functools.partial given to pmap; "):
        JaxStep(init=make_state(), step=partial, make_batch=regression_batch(32))


def test_a_none_leaf_is_an_empty_subtree_in_every_step_api(accel: Accelerator) -> None:
    """Issue 23: Flax ImageNet's ``TrainState(dynamic_scale=None)`` crashed with ``zip()
    argument 2 is longer than argument 1`` in ``_check_divisible``, with or without
    ``state_specs``: a None is an empty subtree in JAX, and now in the plugin."""

    class ScaledState(train_state.TrainState):
        dynamic_scale: Any = None

    def init(key: jax.Array) -> ScaledState:
        return ScaledState.create(apply_fn=None, params={"w": jnp.zeros((DIM, 1))},
                                  tx=optax.adam(1e-2))

    def train_step(state: ScaledState, batch: Any) -> tuple[ScaledState, dict[str, Any]]:
        loss, grads = jax.value_and_grad(
            lambda p: jnp.mean((batch["x"] @ p["w"] - batch["y"]) ** 2))(state.params)
        return state.apply_gradients(grads=grads), {"loss": loss}

    task = JaxTask(init_params=lambda key: {"w": jnp.zeros((DIM, 1)), "b": None},
                   loss_fn=lambda p, b: jnp.mean((b["x"] @ p["w"] - b["y"]) ** 2),
                   make_batch=regression_batch(32), optimizer=optax.adam(1e-2))
    for what, specs in (("JaxStep", None), ("JaxStep", P()),
                        ("JaxStep", lambda abstract: jax.tree.map(lambda _: P(), abstract)),
                        ("JaxTask", None)):
        trained = (task if what == "JaxTask" else
                   JaxStep(init=init, step=train_step, make_batch=regression_batch(32),
                           state_specs=specs))
        run = BACKEND.train(case(mesh=(8, 1)), trained, accel).run
        assert run.outcome == "ok", (what, specs, run.message)
        assert all(math.isfinite(loss) for loss in run.losses), (what, specs)
        # The None holds no leaf of the fingerprint either (optax's count is the state).
        assert sorted(run.params_fingerprint) == (
            ["opt_state/0/count", "w"] if what == "JaxTask"
            else ["opt_state/0/count", "step", "w"]), (what, specs)


def test_bind_axes_flops_are_the_global_models(accel: Accelerator) -> None:
    """Issue 23: a ``bind_axes`` (pmap-style) step counted one shard's FLOPs, 16.4 MFLOP on
    8x1 against 113.2 MFLOP for the same step without a mesh (6.9x low, and MFU with it).
    Now the count is the step's on one device over the global batch, for an MLP of
    B x in -> h -> out the analytic 2B(in*h + h*out) forward and twice that backward, less
    the input's gradient nobody takes: 4B*in*h + 6B*h*out."""
    b, d_in, hidden, d_out = 256, 64, 128, 16

    def init(key: jax.Array) -> dict[str, Any]:
        k1, k2 = jax.random.split(key)
        return {"params": {"w1": jax.random.normal(k1, (d_in, hidden)) * 0.1,
                           "w2": jax.random.normal(k2, (hidden, d_out)) * 0.1}}

    def mlp_step(axis: str | None) -> Any:
        def train_step(state: Any, batch: Any) -> tuple[Any, dict[str, Any]]:
            def loss_fn(p: Any) -> Any:
                h = jnp.maximum(batch["x"] @ p["w1"], 0)
                return jnp.mean((h @ p["w2"] - batch["y"]) ** 2)
            loss, grads = jax.value_and_grad(loss_fn)(state["params"])
            if axis:
                grads, loss = jax.lax.pmean((grads, loss), axis)
            params = jax.tree.map(lambda p, g: p - 0.1 * g, state["params"], grads)
            return {"params": params}, {"loss": loss}
        return train_step

    def make_batch(step: int) -> dict[str, np.ndarray]:
        r = np.random.default_rng(step)
        return {"x": r.normal(size=(b, d_in)).astype(np.float32),
                "y": r.normal(size=(b, d_out)).astype(np.float32)}

    one = Case(backend="jax", batch=b, mesh=None, steps=1, warmup=0)
    plain = BACKEND.train(one, JaxStep(init, mlp_step(None), make_batch), accel).run
    bound = BACKEND.train(Case(backend="jax", batch=b, mesh=(8, 1), steps=1, warmup=0),
                          JaxStep(init, mlp_step("batch"), make_batch,
                                  bind_axes={"batch": "data"}), accel).run
    assert plain.outcome == bound.outcome == "ok", (plain.message, bound.message)
    assert plain.flops_per_step is not None and bound.flops_per_step is not None
    assert bound.flops_per_step == pytest.approx(plain.flops_per_step, rel=0.01)
    analytic = 4 * b * d_in * hidden + 6 * b * hidden * d_out
    assert bound.flops_per_step == pytest.approx(analytic, rel=0.05)
    # What the devices execute stays per device times 8: at least the model's FLOPs.
    assert bound.details["hardware_flops_per_step"] >= bound.flops_per_step
    # The record says how they were counted: a baseline of one shard's is not compared.
    assert bound.program is not None and bound.program["global_flops"] is True
    assert plain.program is not None and "global_flops" not in plain.program


def test_batch_specs_per_leaf_and_state_specs(accel: Accelerator) -> None:
    def init(key: jax.Array) -> dict[str, Any]:
        return {"params": {"w": jax.random.normal(key, (DIM, 4)) * 0.1}}

    def train_step(state: dict[str, Any], batch: Any) -> tuple[dict[str, Any], Any]:
        def loss_fn(params: Any) -> Any:
            logits = batch["x"] @ params["w"]
            return jnp.mean((logits - batch["table"][: logits.shape[1]].sum()) ** 2)
        loss, grads = jax.value_and_grad(loss_fn)(state["params"])
        params = jax.tree.map(lambda p, g: p - 0.01 * g, state["params"], grads)
        return {"params": params}, {"loss": loss}

    def make_batch(step: int) -> dict[str, np.ndarray]:
        # "table" has 7 rows: split over 8 devices it would not divide; replicated it does.
        return {"x": np.ones((32, DIM), np.float32), "table": np.ones((7, 3), np.float32)}

    step = JaxStep(init=init, step=train_step, make_batch=make_batch,
                   batch_specs={"x": P("data"), "table": P()},
                   state_specs={"params": {"w": P(None, "model")}})
    result = BACKEND.train(case(mesh=(4, 2)), step, accel)
    assert result.run.outcome == "ok", result.run.message
    assert isinstance(result, TrainResult)
    assert result.state["params"]["w"].sharding.spec == P(None, "model")
    step.batch_specs = P("data")  # one spec for every leaf: the 7 rows cannot split
    with pytest.raises(TaskError, match=r"leaf 'table' has 7 along dimension 0, split over "
                                        r"mesh axes \['data'\] \(4 devices\)"):
        BACKEND.train(case(mesh=(4, 2)), step, accel)


def test_a_ready_state_is_copied_not_donated(accel: Accelerator) -> None:
    state = make_state()(jax.random.key(0))
    before = np.asarray(state.params["Dense_0"]["kernel"]).copy()
    step = JaxStep(init=state, step=bn_step(), make_batch=regression_batch(32))
    first = BACKEND.train(case(mesh=(8, 1)), step, accel)
    second = BACKEND.train(case(mesh=(8, 1)), step, accel)
    assert first.run.outcome == second.run.outcome == "ok"
    np.testing.assert_array_equal(np.asarray(state.params["Dense_0"]["kernel"]), before)
    assert first.run.losses == second.run.losses


# -- NNX ---------------------------------------------------------------------------------------
@pytest.mark.slow  # trains an NNX model (6 s): not in the quick loop
def test_nnx_model_optimizer_and_metrics(accel: Accelerator) -> None:
    from flax import nnx

    class Model(nnx.Module):
        def __init__(self, rngs: nnx.Rngs) -> None:
            self.linear1 = nnx.Linear(DIM, 16, rngs=rngs)
            self.batch_norm = nnx.BatchNorm(16, momentum=0.5, rngs=rngs)
            self.dropout = nnx.Dropout(0.1, rngs=rngs)
            self.linear2 = nnx.Linear(16, 1, rngs=rngs)

        def __call__(self, x: jax.Array) -> jax.Array:
            return self.linear2(self.dropout(nnx.relu(self.batch_norm(self.linear1(x)))))

    def loss_fn(model: Model, batch: Any) -> tuple[jax.Array, jax.Array]:
        pred = model(batch["x"])
        return jnp.mean((pred - batch["y"]) ** 2), pred

    @nnx.jit
    def train_step(model: Model, optimizer: Any, metrics: Any, batch: Any) -> None:
        (loss, _), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model, batch)
        metrics.update(loss=loss)
        optimizer.update(model, grads)

    model = Model(nnx.Rngs(0))
    initial = np.asarray(model.linear1.kernel[...]).copy()
    optimizer = nnx.Optimizer(model, optax.adam(5e-2), wrt=nnx.Param)
    metrics = nnx.MultiMetric(loss=nnx.metrics.Average("loss"))
    step = nnx_step(train_step, (model, optimizer, metrics), make_batch=regression_batch(32))
    result = BACKEND.train(case(mesh=(8, 1)), step, accel)
    run = result.run
    assert run.outcome == "ok", run.message
    assert run.losses[-1] < run.losses[0]
    fp = run.params_fingerprint
    assert "linear1/kernel" in fp and not fp["linear1/kernel"].get("state")  # nnx.Param
    assert not any(k.startswith("batch_norm/mean") for k in fp)
    # Beside the parameters, every other variable, by object: the BatchStats, the RNG
    # counters, the optimizer's step and count; not Adam's moments (its OptVariables), nor
    # the metrics (issue 23).
    assert {k for k, v in fp.items() if v.get("state")} == {
        "model/batch_norm/mean", "model/batch_norm/var", "model/dropout/rngs/count",
        "model/dropout/rngs/key", "optimizer/opt_state/0/count", "optimizer/step"}
    assert fp["optimizer/step"]["rms"] == STEPS + WARMUP
    assert isinstance(result, TrainResult)
    trained, trained_opt, trained_metrics = result.state
    assert int(trained_opt.step[...]) == STEPS + WARMUP
    assert not np.allclose(np.asarray(trained.batch_norm.mean[...]), 0)  # stats moved
    # The metrics object holds the last step's loss (reset before each step).
    assert float(trained_metrics.compute()["loss"]) == pytest.approx(run.losses[-1], rel=1e-5)
    # The user's own objects are not the trained ones: training started from a copy.
    np.testing.assert_array_equal(np.asarray(model.linear1.kernel[...]), initial)

    def make_objects() -> tuple[Any, ...]:  # made on the case's shardings, not before
        made = Model(nnx.Rngs(0))
        return (made, nnx.Optimizer(made, optax.adam(5e-2), wrt=nnx.Param),
                nnx.MultiMetric(loss=nnx.metrics.Average("loss")))

    made = BACKEND.train(case(mesh=(8, 1)), nnx_step(train_step, make_objects,
                                                     make_batch=regression_batch(32)), accel)
    assert made.run.outcome == "ok", made.run.message
    np.testing.assert_allclose(made.run.losses, run.losses, rtol=1e-5)


@pytest.mark.slow
def test_nnx_partitioning_annotations_shard_model_and_optimizer(accel: Accelerator) -> None:
    from flax import nnx

    class Model(nnx.Module):
        def __init__(self, rngs: nnx.Rngs) -> None:
            init = nnx.with_partitioning(nnx.initializers.lecun_normal(), (None, "model"))
            self.linear1 = nnx.Linear(DIM, 16, kernel_init=init, rngs=rngs)
            self.linear2 = nnx.Linear(16, 1, rngs=rngs)

        def __call__(self, x: jax.Array) -> jax.Array:
            return self.linear2(nnx.relu(self.linear1(x)))

    @nnx.jit
    def train_step(model: Model, optimizer: Any, batch: Any) -> jax.Array:
        loss, grads = nnx.value_and_grad(
            lambda m: jnp.mean((m(batch["x"]) - batch["y"]) ** 2))(model)
        optimizer.update(model, grads)
        return loss  # a scalar return is the loss

    def make_objects() -> tuple[Any, ...]:  # annotated variables need the case's mesh
        model = Model(nnx.Rngs(0))
        return model, nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)

    result = BACKEND.train(case(mesh=(4, 2)), nnx_step(train_step, make_objects,
                                                       make_batch=regression_batch(32)), accel)
    assert result.run.outcome == "ok", result.run.message
    assert isinstance(result, TrainResult)
    model, optimizer = result.state
    assert model.linear1.kernel[...].sharding.spec == P(None, "model")
    assert optimizer.opt_state[0].mu["linear1"]["kernel"][...].sharding.spec == P(None, "model")
    assert model.linear2.kernel[...].sharding.spec == P()


# -- outcomes ----------------------------------------------------------------------------------
def test_nan_and_timeout_with_a_step(accel: Accelerator) -> None:
    def init(key: jax.Array) -> dict[str, Any]:
        return {"params": {"w": jnp.zeros((DIM, 1))}}

    def make_batch(step: int) -> dict[str, np.ndarray]:
        batch = regression_batch(16)(step)
        if step == 3:
            batch["y"][0, 0] = np.nan
        return batch

    def train_step(state: dict[str, Any], batch: Any) -> tuple[dict[str, Any], Any]:
        loss, grads = jax.value_and_grad(
            lambda p: jnp.mean((batch["x"] @ p["w"] - batch["y"]) ** 2))(state["params"])
        return ({"params": jax.tree.map(lambda p, g: p - 1e-3 * g, state["params"], grads)},
                {"loss": loss, "w_mean": jnp.mean(state["params"]["w"])})

    result = BACKEND.train(case(batch=16), JaxStep(init, train_step, make_batch), accel)
    run = result.run
    assert run.outcome == "nan" and run.nan_step == 3, run.message
    assert len(run.losses) == 4 and math.isnan(run.losses[-1])
    assert len(run.metrics["w_mean"]) == 4
    assert isinstance(result, TrainResult) and result.state is not None

    def slow_batch(step: int) -> dict[str, np.ndarray]:
        time.sleep(0.3)
        return regression_batch(16)(step)

    slow = JaxStep(init, train_step, slow_batch)
    result = BACKEND.train(case(batch=16), slow, accel, timeout=0.5)
    assert result.run.outcome == "timeout", result.run.message
    assert 0 < len(result.run.losses) < STEPS + WARMUP
    assert "timeout after" in result.run.message


def test_the_final_state_stays_in_its_process() -> None:
    result = TrainResult(run=Run(case_id="c", metrics={"acc": [0.5, math.nan]}),
                            state={"w": np.ones(3)})
    back = pickle.loads(pickle.dumps(result))
    assert back.state is None and back.run.case_id == "c"
    assert result.state is not None
    again = Run.from_json(result.run.to_json())
    assert again.metrics["acc"][0] == 0.5 and math.isnan(again.metrics["acc"][1])


# -- errors name the user's function and the fix -------------------------------------------------
def test_step_errors_name_the_function_and_the_fix(accel: Accelerator) -> None:
    def init(key: jax.Array) -> dict[str, Any]:
        return {"w": jnp.zeros((DIM, 1)), "n": jnp.zeros((), jnp.int32)}

    def returns_state_only(state: Any, batch: Any) -> Any:
        return state

    def no_loss(state: Any, batch: Any) -> Any:
        return state, {"accuracy": jnp.float32(1)}

    def vector_metric(state: Any, batch: Any) -> Any:
        return state, {"loss": jnp.float32(0), "per_row": batch["x"][:, 0]}

    def casts_a_leaf(state: Any, batch: Any) -> Any:
        return {**state, "n": state["n"].astype(jnp.float32)}, {"loss": jnp.float32(0)}

    def grad_of_a_vector(state: Any, batch: Any) -> Any:
        jax.grad(lambda w: batch["x"] @ w)(state["w"])
        return state, {"loss": jnp.float32(0)}

    expected = {
        returns_state_only: "returns a dict, not (state, metrics)",
        no_loss: "returns no metric 'loss' (metrics: 'accuracy'): return the loss under",
        vector_metric: "returns metric 'per_row' as an array of shape (16,)",
        casts_a_leaf: "returns state leaf 'n' as float32[], but takes it as int32[]",
        grad_of_a_vector: "Gradient only defined for scalar-output functions",
    }
    for fn, text in expected.items():
        with pytest.raises(TaskError) as info:
            BACKEND.train(case(batch=16), JaxStep(init, fn, regression_batch(16)), accel)
        message = str(info.value)
        assert f"the step {fn.__name__} (tests/unit/backends/jax/test_step.py:" in message, message
        assert text in message, message
    assert "reduce the loss (jnp.mean(...))" in message and "has_aux=True" in message
    assert "(at tests/unit/backends/jax/test_step.py:" in message  # the user's line that failed
    with pytest.raises(TaskError, match=r"JaxStep \(your own step\), a JaxTask or nnx_step"):
        BACKEND.train(case(), object(), accel)


def _shrinks_at_step_5(leaves: dict[str, Any] | None = None) -> Any:
    """``regression_batch(16)`` until step 4, then 12 rows (a loader's last, short batch),
    or ``leaves`` changed (dtype, structure) from step 5."""
    full = regression_batch(16)

    def make_batch(step: int) -> dict[str, Any]:
        if step < 5:
            return full(step)
        if leaves is None:
            return regression_batch(12)(step)
        return {**full(step), **leaves}

    return make_batch


def test_a_batch_that_changes_shape_names_make_batch_the_step_and_the_leaves(
        accel: Accelerator) -> None:
    """Seen: a batch of 12 rows at step 5 after 16 crashed in XLA with 'Argument types
    differ from the types for which this computation was compiled', naming neither
    make_batch nor the step. Now a TaskError says both, and each leaf before and after,
    for a JaxStep and a JaxTask alike."""
    def init(key: jax.Array) -> dict[str, Any]:
        return {"w": jnp.zeros((DIM, 1))}

    def train_step(state: Any, batch: Any) -> Any:
        loss = jnp.mean((batch["x"] @ state["w"] - batch["y"]) ** 2)
        return state, {"loss": loss}

    def loss_fn(params: Any, batch: Any) -> Any:
        return jnp.mean((batch["x"] @ params["w"] - batch["y"]) ** 2)

    make_batch = _shrinks_at_step_5()
    line = make_batch.__code__.co_firstlineno
    for task, label in ((JaxStep(init, train_step, make_batch), "the step train_step"),
                        (JaxTask(init_params=init, loss_fn=loss_fn, make_batch=make_batch,
                                 optimizer=optax.sgd(0.1)), "JaxTask.loss_fn loss_fn")):
        with pytest.raises(TaskError) as info:
            BACKEND.train(case(batch=16), task, accel)
        message = str(info.value)
        assert message.startswith(f"make_batch make_batch "
                                  f"(tests/unit/backends/jax/test_step.py:{line}) "
                                  f"returns at step 5 a batch unlike step 0's, which {label} "
                                  f"(tests/unit/backends/jax/test_step.py:"), message
        assert ("leaf 'x' float32[16, 8] → float32[12, 8], leaf 'y' float32[16, 1] → "
                "float32[12, 1]; ") in message, message
        assert "a fixed batch size" in message and "drop_last=True" in message, message
        assert "Argument types differ" not in message and "\n" not in message
    # A dtype that changes, and a leaf that appears: named as such.
    with pytest.raises(TaskError, match=r"step 5 .*: leaf 'y' float32\[16, 1\] → "
                                        r"int32\[16, 1\]; the step is compiled once"):
        BACKEND.train(case(batch=16), JaxStep(init, train_step, _shrinks_at_step_5(
            {"y": np.ones((16, 1), np.int32)})), accel)
    with pytest.raises(TaskError, match=r"step 5 .*: its structure changed, "
                                        r"PyTreeDef\(\{'x': \*, 'y': \*\}\) → "
                                        r"PyTreeDef\(\{'mask': \*, 'x': \*, 'y': \*\}\)"):
        BACKEND.train(case(batch=16), JaxStep(init, train_step, _shrinks_at_step_5(
            {"mask": np.ones((16,), np.float32)})), accel)
    # float64 from step 5: jax makes it float32 (x64 is off), the program it was compiled
    # for runs it, and nothing is refused.
    run = BACKEND.train(case(batch=16), JaxStep(init, train_step, _shrinks_at_step_5(
        {"y": np.ones((16, 1), np.float64)})), accel).run
    assert run.outcome == "ok" and len(run.losses) == STEPS + WARMUP, run.message


NONSCALAR = '''
import jax.numpy as jnp
import numpy as np
import optax

from pytest_accelperf import cases
from pytest_accelperf.jax import JaxTask


def loss_fn(params, batch):
    return (batch["x"] @ params["w"] - batch["y"]) ** 2  # forgot the mean


@cases(backend="jax", batch=[16], steps=2, warmup=0)
def test_nonscalar(accelperf):
    accelperf.train(JaxTask(init_params=lambda key: {"w": jnp.zeros((4, 1))}, loss_fn=loss_fn,
                            make_batch=lambda step: {"x": np.ones((16, 4), np.float32),
                                                     "y": np.ones((16, 1), np.float32)},
                            optimizer=optax.sgd(0.1)))
'''


@pytest.mark.slow
def test_a_task_error_fails_the_test_with_the_fix_not_a_traceback(suite: Suite) -> None:
    suite.write(NONSCALAR, name="test_nonscalar")
    result = suite.run("--accelperf-update", "--accelperf-json=report.json")
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert ("JaxTask.loss_fn loss_fn (test_nonscalar.py:9) returns an array of shape (16, 1) "
            "(float32): the loss must be a scalar to take its gradient. Reduce it "
            "(jnp.mean(...)), or return (loss, aux)") in out
    assert "Gradient only defined for scalar-output functions" not in out
    assert "jax/_src" not in out and "Traceback" not in out
    run = suite.report()["cases"][0]["run"]
    assert run["outcome"] == "error" and run["message"].startswith("TaskError: JaxTask.loss_fn")


# -- through pytest: the state handed back, metrics in the baseline and checked ------------------
STEPSUITE = '''
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax.training import train_state

from pytest_accelperf import cases
from pytest_accelperf.jax import JaxStep


def create(key):
    return train_state.TrainState.create(apply_fn=None, params={"w": jnp.zeros((4, 1))},
                                         tx=optax.sgd(0.05))


@jax.jit
def train_step(state, batch):
    def loss_fn(params):
        pred = batch["x"] @ params["w"]
        return jnp.mean((pred - batch["y"]) ** 2), pred
    (loss, pred), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    close = jnp.mean(jnp.abs(pred - batch["y"]) < 1.0)
    return state.apply_gradients(grads=grads), {"loss": loss, "close": close}


def make_batch(step):
    x = np.random.default_rng(step).normal(size=(32, 4)).astype(np.float32)
    return {"x": x, "y": x.sum(axis=1, keepdims=True)}


@cases(backend="jax", mesh=[None, (8, 1)], batch=[32], steps=12, warmup=1)
def test_step(accelperf):
    result = accelperf.train(JaxStep(init=create, step=train_step, make_batch=make_batch))
    state = result.state
    assert int(state.step) == 13
    held_out = make_batch(1000)
    assert float(jnp.mean((held_out["x"] @ state.params["w"] - held_out["y"]) ** 2)) < 2.0
    assert result.check("close").verdict.value in ("new", "pass")
'''


@pytest.mark.slow
def test_state_comes_back_and_metrics_are_stored_and_checked(suite: Suite) -> None:
    suite.write(STEPSUITE, name="test_steps")
    suite.run("--accelperf-update").assert_outcomes(passed=2)
    block = suite.load("test_steps")["cases"]["test_step[jax-nomesh-b32]"]
    curve = block["metrics"]["close"]
    assert curve["steps"] == 13 and len(curve["checkpoints"]) == 10
    assert 0 <= curve["final"] <= 1

    result = suite.run("--accelperf-json=report.json")
    result.assert_outcomes(passed=2)
    report = suite.report()
    for record in report["cases"]:
        assert len(record["run"]["metrics"]["close"]) == 13
        assert {c["metric"]: c["verdict"] for c in record["checks"]}["close"] == "pass"

    def claim_higher(block: dict[str, Any]) -> None:  # the baseline said: more were close
        block["metrics"]["close"]["checkpoints"][-1][1] += 0.3
    suite.edit(claim_higher, module="test_steps")
    result = suite.run()
    result.assert_outcomes(failed=2)
    out = result.stdout.str()
    assert "regression(s) against the cpu-x8 baseline:\n  close: close at step 12 is" in out
    assert "below the baseline's" in out and "the training step changed" in out


def test_flops_count_replicated_compute_once() -> None:
    """Seen: on a 4x2 mesh with the parameters replicated over ``model``, FLOPs per step
    were 2.01x the model's (one device's cost analysis times 8 counts the work both
    ``model`` replicas repeat). Now the model's FLOPs match the analytic count: forward
    2BDH + 2BH8, backward (no gradient for the input) 2BDH + 4BH8."""
    b, d, h = 256, 512, 512

    def loss_fn(params: Any, batch: Any) -> Any:
        return jnp.mean(jnp.tanh(batch["x"] @ params["a"]) @ params["b"])

    task = JaxTask(init_params=lambda key: {"a": jnp.zeros((d, h)), "b": jnp.zeros((h, 8))},
                   loss_fn=loss_fn, optimizer=optax.sgd(0.1),
                   make_batch=lambda step: {"x": np.ones((b, d), np.float32)},
                   param_specs=lambda p: {"a": PartitionSpec(), "b": PartitionSpec()})
    case = Case(backend="jax", batch=b, mesh=(4, 2), steps=2, warmup=1)
    run = BACKEND.train(case, task, provision("cpu", 8)).run
    analytic = 4 * b * d * h + 6 * b * h * 8
    assert run.flops_per_step == pytest.approx(analytic, rel=0.02)
    assert run.details["hardware_flops_per_step"] / run.flops_per_step == pytest.approx(2.0,
                                                                                      rel=0.05)


def test_nnx_objects_after_the_batch_as_flax_mnist_takes_rngs(accel: Accelerator) -> None:
    """Flax's MNIST example (examples/mnist/train.py) takes ``rngs`` after the batch:
    ``train_step(model, optimizer, metrics, batch, rngs)``, dropout drawing from it."""
    from flax import nnx

    class Model(nnx.Module):
        def __init__(self, rngs: nnx.Rngs) -> None:
            self.linear1 = nnx.Linear(DIM, 16, rngs=rngs)
            self.dropout = nnx.Dropout(0.5)
            self.linear2 = nnx.Linear(16, 1, rngs=rngs)

        def __call__(self, x: jax.Array, rngs: nnx.Rngs) -> jax.Array:
            return self.linear2(self.dropout(nnx.relu(self.linear1(x)), rngs=rngs))

    @nnx.jit
    def train_step(model: Model, optimizer: Any, batch: Any, rngs: nnx.Rngs) -> jax.Array:
        def loss_fn(model: Model, batch: Any, rngs: nnx.Rngs) -> jax.Array:
            return jnp.mean((model(batch["x"], rngs) - batch["y"]) ** 2)

        loss, grads = nnx.value_and_grad(loss_fn)(model, batch, rngs)
        optimizer.update(model, grads)
        return loss

    model = Model(nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adam(5e-2), wrt=nnx.Param)
    rngs = nnx.Rngs(1)
    with pytest.raises(TaskError) as missing:
        BACKEND.train(case(), nnx_step(train_step, (model, optimizer),
                                       make_batch=regression_batch(32)), accel)
    assert "takes (model, optimizer, batch, rngs)" in str(missing.value)
    assert "nnx_step(..., after=(rngs,))" in str(missing.value)
    result = BACKEND.train(case(), nnx_step(train_step, (model, optimizer),
                                            make_batch=regression_batch(32), after=(rngs,)),
                           accel)
    assert result.run.outcome == "ok", result.run.message
    assert result.run.losses[-1] < result.run.losses[0]
    _, trained_opt, trained_rngs = result.state
    assert int(trained_opt.step[...]) == STEPS + WARMUP
    # The stream advanced once per step, as in the user's own loop: a fresh mask each step.
    assert int(trained_rngs.default.count[...]) == STEPS + WARMUP
    assert int(rngs.default.count[...]) == 0  # the user's own object is not the trained one
