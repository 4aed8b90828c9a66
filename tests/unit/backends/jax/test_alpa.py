"""The Alpa backend above Alpa: its loop, compile time, outcomes and reference, driven by a
stand-in ``alpa`` module whose ``parallelize`` is ``jax.jit`` (Alpa needs Python <= 3.9
and jax 0.3.x, so the real one cannot be installed here). The model and its training are
real JAX; only the parallelizer is stood in for."""

from __future__ import annotations

import math
import sys
import types
from typing import Any

from pytest_accelperf.provision.accel import prepare_environment

prepare_environment("cpu", 8)  # before jax: as every JAX test module of this suite

import numpy as np  # noqa: E402
import pytest  # noqa: E402

jax = pytest.importorskip("jax")
optax = pytest.importorskip("optax")

from pytest_accelperf.backends.jax.alpa import BACKEND  # noqa: E402
from pytest_accelperf.collect.cases import Case  # noqa: E402
from pytest_accelperf.jax import JaxTask  # noqa: E402
from pytest_accelperf.provision.accel import provision  # noqa: E402


class _Executable:
    def __init__(self) -> None:
        self.syncs = 0

    def sync(self) -> None:
        self.syncs += 1

    def get_total_allocation_size(self) -> int:
        return 4096


def _fake_alpa() -> types.ModuleType:
    alpa = types.ModuleType("alpa")
    calls: dict[str, Any] = {"init": 0, "shutdown": 0, "executable": _Executable()}

    def parallelize(fn: Any, method: Any) -> Any:
        calls["method"] = method
        jitted = jax.jit(fn)

        def step(*args: Any) -> Any:
            out = jitted(*args)
            jax.block_until_ready(out)
            return out

        step.get_last_executable = lambda: calls["executable"]  # type: ignore[attr-defined]
        return step

    alpa.parallelize = parallelize  # type: ignore[attr-defined]
    alpa.grad = jax.grad  # type: ignore[attr-defined]
    alpa.init = lambda cluster: calls.__setitem__("init", calls["init"] + 1)  # type: ignore[attr-defined]
    alpa.shutdown = lambda: calls.__setitem__(  # type: ignore[attr-defined]
        "shutdown", calls["shutdown"] + 1)
    alpa.PipeshardParallel = lambda **kw: ("pipeshard", kw)  # type: ignore[attr-defined]
    alpa.AutoLayerOption = lambda layer_num: ("auto", layer_num)  # type: ignore[attr-defined]
    alpa.calls = calls  # type: ignore[attr-defined]
    return alpa


def _task(case: Case, lr: float = 0.05) -> JaxTask:
    true_w = np.random.default_rng(0).normal(size=(16, 1)).astype(np.float32)

    def make_batch(step: int) -> dict[str, np.ndarray]:
        x = np.random.default_rng(step).normal(size=(case.batch, 16)).astype(np.float32)
        return {"x": x, "y": x @ true_w}

    def loss_fn(params: Any, batch: Any) -> Any:
        return ((batch["x"] @ params["w"] - batch["y"]) ** 2).mean()

    return JaxTask(init_params=lambda key: {"w": jax.numpy.zeros((16, 1))}, loss_fn=loss_fn,
                   make_batch=make_batch, optimizer=optax.sgd(lr))


@pytest.fixture
def alpa(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    module = _fake_alpa()
    monkeypatch.setitem(sys.modules, "alpa", module)
    return module


def test_alpa_trains_in_the_measured_step_loop(alpa: types.ModuleType) -> None:
    case = Case(backend="alpa", batch=32, steps=6, warmup=2, reference=True,
                params={"microbatches": 4, "layers": 2})
    result = BACKEND.train(case, _task(case), provision("cpu", 8))
    run = result.run
    assert run.outcome == "ok"
    assert len(run.losses) == 8 and len(run.step_times) == 6
    assert run.losses[-1] < run.losses[0]
    assert run.compile_time is not None and run.compile_time > 0
    # synchronized before and after every step but the first (nothing compiled before it)
    assert alpa.calls["executable"].syncs == 2 * 8 - 1
    assert alpa.calls["method"] == ("pipeshard", {"num_micro_batches": 4,
                                                  "layer_option": ("auto", 2),
                                                  "stage_option": "auto"})
    assert alpa.calls["init"] == alpa.calls["shutdown"] == 1
    assert run.memory_per_device == {"alpa:total": 4096}
    assert result.reference_params is not None
    for name, value in result.params.items():
        np.testing.assert_allclose(value, result.reference_params[name], rtol=1e-6)


def test_alpa_stops_at_a_non_finite_loss(alpa: types.ModuleType) -> None:
    case = Case(backend="alpa", batch=32, steps=20, warmup=1)
    run = BACKEND.train(case, _task(case, lr=1e3), provision("cpu", 8)).run
    assert run.outcome == "nan"
    assert run.nan_step is not None and len(run.losses) == run.nan_step + 1
    assert not math.isfinite(run.losses[-1])
    assert alpa.calls["shutdown"] == 1
