"""The numerics check on a platform that does not repeat its arithmetic exactly.

On an H100 (XLA:GPU, atomic reductions), 5 of 11 unchanged cases failed the numerics check
against their own recording: two runs of one program differ after a case's steps. The JAX
backend replays the training there and the check compares no tighter than a multiple of
the replay's spread. A GPU cannot exist here; a program that is nondeterministic on the CPU
stands in for it (noise from the host in every step, through ``jax.pure_callback``), and
the CPU is named a replayed platform for these tests.
"""

from __future__ import annotations

import copy
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
import optax  # noqa: E402

from pytest_accelperf.backends.jax import backend as jax_backend  # noqa: E402
from pytest_accelperf.backends.jax.backend import BACKEND  # noqa: E402
from pytest_accelperf.checks import Tolerances, Verdict  # noqa: E402
from pytest_accelperf.checks.numerics import SPREAD_FACTOR, check_numerics  # noqa: E402
from pytest_accelperf.checks.summary import summarize  # noqa: E402
from pytest_accelperf.collect.cases import Case  # noqa: E402
from pytest_accelperf.jax import JaxTask  # noqa: E402
from pytest_accelperf.provision.accel import Accelerator, provision  # noqa: E402
from pytest_accelperf.records.fingerprint import compact  # noqa: E402

DIM, OUT, BATCH = 32, 8, 16
CASE = Case(backend="jax", batch=BATCH, steps=12, warmup=2)


def task(*, noise: float, lr: float = 0.01) -> JaxTask:
    true_w = np.random.default_rng(0).normal(size=(DIM, OUT)).astype(np.float32)

    def host_noise() -> np.ndarray:  # a different draw every call: not repeatable
        return np.random.default_rng().normal(size=(OUT,)).astype(np.float32) * noise

    def init_params(key: Any) -> Any:
        return {"w": jax.random.normal(key, (DIM, OUT)) * 0.1, "b": jnp.zeros((OUT,))}

    def loss_fn(params: Any, b: Any) -> Any:
        jitter = jax.pure_callback(host_noise, jax.ShapeDtypeStruct((OUT,), jnp.float32))
        pred = b["x"] @ params["w"] + params["b"]
        return jnp.mean((pred - b["y"]) ** 2) + jnp.sum(jitter * params["b"])

    def make_batch(step: int) -> dict[str, np.ndarray]:
        x = np.random.default_rng(step).normal(size=(BATCH, DIM)).astype(np.float32)
        return {"x": x, "y": x @ true_w}

    return JaxTask(init_params=init_params, loss_fn=loss_fn, make_batch=make_batch,
                   optimizer=optax.sgd(lr))


@pytest.fixture(scope="module")
def accel() -> Accelerator:
    return provision("cpu", 8)


@pytest.fixture
def replayed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jax_backend, "REPLAYED_PLATFORMS", frozenset({"cpu"}))


@pytest.fixture(scope="module")
def recording(accel: Accelerator) -> dict[str, Any]:
    """The noisy task's recording (:func:`stored`, replayed as in :func:`replayed`): one
    training shared by the tests that judge a new run against it, which each trained the
    same recording of their own (a training with its replay, about 1.5 s of CPU time).
    Each test gets a copy (:func:`base`)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(jax_backend, "REPLAYED_PLATFORMS", frozenset({"cpu"}))
        return stored(task(noise=3e-2), accel)


@pytest.fixture
def base(recording: dict[str, Any]) -> dict[str, Any]:
    return copy.deepcopy(recording)


def block(t: JaxTask, accel: Accelerator) -> dict[str, Any]:
    return summarize(BACKEND.train(CASE, t, accel).run).to_json()


def stored(t: JaxTask, accel: Accelerator) -> dict[str, Any]:
    """A recording as the store keeps it: the fingerprint's compact form."""
    out = block(t, accel)
    out["numerics"] = compact(out["numerics"])
    return out


def test_unchanged_code_passes_against_its_own_recording(
        replayed: None, accel: Accelerator, base: dict[str, Any]) -> None:
    now = block(task(noise=3e-2), accel)
    assert base["numerics_spread"]["b"] > 1e-3  # the replay saw the platform's own spread
    result = check_numerics(now, base, Tolerances())
    assert result is not None and result.verdict is Verdict.PASS, result.detail
    assert f"rtol {SPREAD_FACTOR}x this platform's own spread" in result.detail
    # Without the replay's spread, the same two runs are a false regression: what the
    # H100 showed.
    bare = {k: v for k, v in now.items() if k != "numerics_spread"}
    bare_base = {k: v for k, v in base.items() if k != "numerics_spread"}
    unfloored = check_numerics(bare, bare_base, Tolerances())
    assert unfloored is not None and unfloored.verdict is Verdict.REGRESSION


def test_a_change_beyond_the_spread_is_still_a_regression(
        replayed: None, accel: Accelerator, base: dict[str, Any]) -> None:
    now = block(task(noise=3e-2, lr=0.03), accel)
    result = check_numerics(now, base, Tolerances())
    assert result is not None and result.verdict is Verdict.REGRESSION, result.detail


def test_a_platform_that_repeats_itself_records_no_spread(replayed: None,
                                                          accel: Accelerator) -> None:
    run = BACKEND.train(CASE, task(noise=0.0), accel).run
    assert run.replay is not None
    assert run.replay["spread"] == 0.0 and run.replay["leaves"] == {}
    assert run.replay["steps"] == CASE.warmup + CASE.steps
    assert "numerics_spread" not in summarize(run).to_json()


def test_the_cpu_is_not_replayed(accel: Accelerator) -> None:
    assert BACKEND.train(CASE, task(noise=0.0), accel).run.replay is None
