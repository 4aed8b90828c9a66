"""Data as users have it: ``data=`` beside ``make_batch`` in JaxStep, TorchStep, RankStep.

A ``DataLoader`` and a generator function train a JaxStep and a TorchStep to exactly the
losses of the equivalent ``make_batch``, through every re-iteration the backends make
(the JAX compile reads batch 0, the torch counting steps run and undo the first batches);
what cannot be iterated again, what ends early and what changes between passes are
one-line TaskErrors naming the data and the fix.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from typing import Any

from pytest_accelperf.provision.accel import prepare_environment

prepare_environment("cpu", 8)

import pytest  # noqa: E402

# The JAX backend's own frameworks (pip install 'pytest-accelperf[jax]').
pytest.importorskip("flax")
pytest.importorskip("optax")
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

torch = pytest.importorskip("torch")

from pytest_accelperf.backends.jax.backend import BACKEND as JAX  # noqa: E402
from pytest_accelperf.backends.measure.common import TaskError  # noqa: E402
from pytest_accelperf.backends.measure.data import Batches, digest  # noqa: E402
from pytest_accelperf.backends.torch.backend import BACKEND as TORCH  # noqa: E402
from pytest_accelperf.collect.cases import Case  # noqa: E402
from pytest_accelperf.jax import JaxStep, nnx_step  # noqa: E402
from pytest_accelperf.provision.accel import Accelerator, provision  # noqa: E402
from pytest_accelperf.torch import RankStep, TorchStep  # noqa: E402

BATCH, DIM, STEPS, WARMUP = 16, 8, 6, 1
N = STEPS + WARMUP  # the batches a run needs
CPU = Accelerator(name="cpu", platform="cpu-x1", device_kind="cpu", device_count=1)

_rng = np.random.default_rng(0)
X = _rng.normal(size=(BATCH * N, DIM)).astype(np.float32)
Y = X[:, :2].sum(axis=1, keepdims=True)


def make_batch(i: int) -> list[np.ndarray]:
    """Batch ``i``: rows ``i*BATCH .. (i+1)*BATCH`` of the data, as ``[x, y]``."""
    rows = slice(i * BATCH, (i + 1) * BATCH)
    return [X[rows], Y[rows]]


def batches() -> Iterator[list[np.ndarray]]:
    """The same batches from a generator function."""
    for i in range(N):
        yield make_batch(i)


def loader(**kw: Any) -> Any:
    """The same batches from a DataLoader (as torch tensors)."""
    data = torch.utils.data.TensorDataset(torch.from_numpy(X), torch.from_numpy(Y))
    return torch.utils.data.DataLoader(data, batch_size=BATCH, **kw)


@pytest.fixture(scope="module")
def accel() -> Accelerator:
    return provision("cpu", 8)


# -- JAX ----------------------------------------------------------------------------------------
def jax_step(**source: Any) -> JaxStep:
    def init(key: jax.Array) -> dict[str, jax.Array]:
        return {"w": jax.random.normal(key, (DIM, 1)) * 0.1}

    def train_step(state: Any, batch: Any) -> Any:
        x, y = batch
        loss, grad = jax.value_and_grad(lambda w: jnp.mean((x @ w - y) ** 2))(state["w"])
        return {"w": state["w"] - 0.1 * grad}, {"loss": loss}

    return JaxStep(init, train_step, **source)


@pytest.mark.slow  # trains twice (5 s): not in the quick loop
def test_a_dataloader_and_a_generator_function_train_a_jax_step_as_make_batch(
        accel: Accelerator) -> None:
    """On a 4x2 mesh with the single-device reference: the data is iterated for the
    compile, the run, and twice for the reference, each pass from its start."""
    case = Case(backend="jax", batch=BATCH, mesh=(4, 2), steps=STEPS, warmup=WARMUP,
                reference=True)
    runs = {name: JAX.train(case, jax_step(**source), accel)
            for name, source in (("make_batch", {"make_batch": make_batch}),
                                 ("generator", {"data": batches}),
                                 ("loader", {"data": loader()}))}
    losses = {name: r.run.losses for name, r in runs.items()}
    assert len(losses["make_batch"]) == N
    assert losses["generator"] == losses["make_batch"] == losses["loader"], losses
    for r in runs.values():
        assert r.run.outcome == "ok" and r.reference_params is not None
        assert len(r.run.inputs.times) == STEPS


def test_nnx_step_takes_data() -> None:
    step = nnx_step(lambda model, batch: None, lambda: (), data=batches)
    assert isinstance(step.make_batch, Batches) and step.make_batch.owner == "nnx_step.data"
    with pytest.raises(TaskError, match=r"^nnx_step takes make_batch or data, not both"):
        nnx_step(lambda model, batch: None, lambda: (), make_batch, data=batches)


# -- torch --------------------------------------------------------------------------------------
def torch_step(**source: Any) -> TorchStep:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(DIM, 16), torch.nn.Tanh(),
                                torch.nn.Linear(16, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)

    def step(batch: Any) -> Any:
        x, y = batch
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        scheduler.step()
        return loss

    return TorchStep(step, model=model, stateful=(scheduler,), **source)


def test_a_dataloader_and_a_generator_function_train_a_torch_step_as_make_batch() -> None:
    """The counting steps (memory, FLOPs) take the first batches and are undone, then the
    run starts a new pass: the losses are make_batch's to the bit."""
    case = Case(backend="torch", batch=BATCH, steps=STEPS, warmup=WARMUP)
    losses = {name: TORCH.train(case, torch_step(**source), CPU).run.losses
              for name, source in (("make_batch", {"make_batch": make_batch}),
                                   ("generator", {"data": batches}),
                                   ("loader", {"data": loader()}),
                                   ("factory", {"data": lambda: iter(loader())}))}
    assert len(losses["make_batch"]) == N
    assert all(v == losses["make_batch"] for v in losses.values()), losses


def test_a_shuffling_loader_is_refused_and_a_seeded_one_trains() -> None:
    """A DataLoader(shuffle=True) draws a new order on each pass (from torch's RNG, which
    the counting steps put back and the run reseeds): its first batches differ, which would
    train the run on other data than the counting steps and the reference."""
    case = Case(backend="torch", batch=BATCH, steps=STEPS, warmup=WARMUP)
    with pytest.raises(TaskError) as info:
        TORCH.train(case, torch_step(data=loader(shuffle=True)), CPU)
    message = str(info.value)
    assert message.startswith("TorchStep.data (a DataLoader) gave another first batch when "
                              "iterated again") and "\n" not in message, message
    assert "generator=torch.Generator().manual_seed(0)" in message

    def seeded() -> Any:
        return loader(shuffle=True, generator=torch.Generator().manual_seed(0))

    run = TORCH.train(case, torch_step(data=seeded), CPU).run
    assert run.outcome == "ok" and len(run.losses) == N


# -- what is refused ------------------------------------------------------------------------------
def test_a_one_shot_iterator_is_refused_naming_what_to_pass() -> None:
    for make, owner in ((lambda data: jax_step(data=data), "JaxStep"),
                        (lambda data: torch_step(data=data), "TorchStep")):
        for one_shot in (batches(), iter(loader()), iter([make_batch(0)])):
            with pytest.raises(TaskError) as info:
                make(one_shot)
            message = str(info.value)
            assert message.startswith(f"{owner}.data (a "), message
            assert ") is an iterator, which can be iterated once" in message, message
            assert "not data=batches()" in message
            assert "\n" not in message


def test_data_that_ends_before_the_steps_do_is_one_line_naming_it_and_the_count(
        accel: Accelerator) -> None:
    case = Case(backend="jax", batch=BATCH, steps=STEPS, warmup=WARMUP)
    # With a len(): refused before anything compiles.
    with pytest.raises(TaskError) as info:
        JAX.train(case, jax_step(data=[make_batch(i) for i in range(3)]), accel)
    assert str(info.value).startswith(f"JaxStep.data (a list) holds 3 batch(es), but the case "
                                      f"needs {N} (one per step, warm-up included)")

    def short() -> Iterator[list[np.ndarray]]:
        for i in range(4):
            yield make_batch(i)

    for train, make in ((lambda s: JAX.train(case, s, accel), jax_step),
                        (lambda s: TORCH.train(Case(backend="torch", batch=BATCH, steps=STEPS,
                                                    warmup=WARMUP), s, CPU), torch_step)):
        with pytest.raises(TaskError) as info:
            train(make(data=short))
        message = str(info.value)
        assert "data short (tests/unit/backends/measure/test_data.py:" in message, message
        assert f"ran out after 4 batch(es), but the case needs {N} (one per step" in message
        assert "\n" not in message


def test_make_batch_or_data_exactly_one() -> None:
    with pytest.raises(TaskError, match=r"^JaxStep takes make_batch or data, not both"):
        jax_step(make_batch=make_batch, data=batches)
    with pytest.raises(TaskError, match=r"^TorchStep needs its batches: make_batch, a function"):
        torch_step()
    with pytest.raises(TaskError, match=r"make_batch must be a function of the step number "
                                        r"that returns its batch; got list \(an iterable of "
                                        r"batches goes in data=\)"):
        torch_step(make_batch=[make_batch(0)])
    with pytest.raises(TaskError, match=r"takes arguments: .* a function of the step number "
                                        r"is make_batch="):
        jax_step(data=make_batch)
    with pytest.raises(TaskError, match=r"^TorchStep.model of the step .* must be the "
                                        r"nn.Module the step trains.*; got None$"):
        TorchStep(lambda batch: None, data=batches)


def test_rank_step_takes_data_and_its_batches_pickle_without_their_pass() -> None:
    """Ranks get the step by pickle: a pass in progress (a generator) is not sent, the
    rank starts its own from the first batch."""
    step = RankStep(build=lambda rank: None, loss_fn=lambda model, batch: None, data=batches)
    assert isinstance(step.make_batch, Batches)
    assert digest(step.make_batch(2)) == digest(make_batch(2))  # a pass under way
    cloudpickle = pytest.importorskip("cloudpickle")
    copy = pickle.loads(cloudpickle.dumps(step))
    assert digest(copy.make_batch(0)) == digest(make_batch(0))
    with pytest.raises(TaskError, match=r"^RankStep.data \(a generator\) is an iterator"):
        RankStep(build=lambda rank: None, loss_fn=lambda model, batch: None, data=batches())


def test_the_digest_sees_values_shapes_dtypes_and_containers() -> None:
    base = {"x": np.arange(6, dtype=np.float32).reshape(2, 3), "n": 3, "t": torch.ones(2)}
    assert digest(base) == digest({**base, "x": base["x"].copy(), "t": torch.ones(2)})
    for changed in ({**base, "x": base["x"] + 1}, {**base, "x": base["x"].reshape(3, 2)},
                    {**base, "x": base["x"].astype(np.float64)}, {**base, "n": 4},
                    {**base, "t": torch.zeros(2)}, [base["x"], 3, torch.ones(2)]):
        assert digest(changed) != digest(base)
