"""The keras backend trained directly: a small Keras 3 convnet (two convolution and pooling
blocks, dropout, a softmax head) on synthetic 28 x 28 images, compiled and trained by a
real ``model.fit`` on Keras's JAX backend through the plugin's callback, on the CPU."""

from __future__ import annotations

import importlib.util
import math
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("jax")
if importlib.util.find_spec("keras") is None:
    pytest.skip("keras is not installed: pip install 'pytest-accelperf[keras]'",
                allow_module_level=True)

from pytest_accelperf import AccelperfWarning
from pytest_accelperf.backends import get_backend
from pytest_accelperf.backends.keras.backend import BACKEND
from pytest_accelperf.backends.keras.load import keras
from pytest_accelperf.backends.measure.common import TaskError
from pytest_accelperf.backends.protocol import TrainResult
from pytest_accelperf.checks.program import check_program
from pytest_accelperf.collect.cases import Case
from pytest_accelperf.keras import KerasTask
from pytest_accelperf.provision.accel import Accelerator
from pytest_accelperf.records.verdict import Tolerances, Verdict

#: Tests that make a model are marked slow: its first in a process compiles each variable's
#: initializer (13 XLA compiles: 4 s of CPU, 14 s with Keras's own draw of the kernels, see
#: :class:`FlatGlorotUniform`), and a fit's train step compiles again.
STEPS, WARMUP, BATCH = 6, 1, 16
CPU = Accelerator(name="cpu", platform="cpu-x1", device_kind="cpu", device_count=1)


class FlatGlorotUniform(keras.initializers.Initializer):  # type: ignore[misc]  # untyped
    """Keras's default kernel initializer (Glorot uniform: the same limit, from the same
    fans), drawn as a vector and reshaped. XLA:CPU compiles jax's threefry draw of a rank-4
    shape slowly: the convnet's first model in a process took 14.3 s of CPU with Keras's
    own draw of its two (3, 3, in, out) kernels, 4.2 s with this (jax 0.10.2)."""

    def __call__(self, shape: tuple[int, ...], dtype: Any = None) -> Any:
        receptive = math.prod(shape[:-2])
        limit = math.sqrt(6 / (receptive * (shape[-2] + shape[-1])))
        flat = keras.random.uniform((math.prod(shape),), -limit, limit, dtype=dtype)
        return keras.ops.reshape(flat, shape)


def convnet(jit_compile: bool | str = "auto", steps_per_execution: int = 1,
            compiled: bool = True) -> Any:
    layers = keras.layers
    model = keras.Sequential([
        keras.Input(shape=(28, 28, 1)),
        layers.Conv2D(8, kernel_size=(3, 3), activation="relu",
                      kernel_initializer=FlatGlorotUniform()),
        layers.MaxPooling2D(pool_size=(2, 2)),
        layers.Conv2D(16, kernel_size=(3, 3), activation="relu",
                      kernel_initializer=FlatGlorotUniform()),
        layers.MaxPooling2D(pool_size=(2, 2)),
        layers.Flatten(),
        layers.Dropout(0.5),
        layers.Dense(10, activation="softmax"),
    ])
    if compiled:
        model.compile(loss="sparse_categorical_crossentropy", optimizer="adam",
                      metrics=["accuracy"], jit_compile=jit_compile,
                      steps_per_execution=steps_per_execution)
    return model


def images(n: int) -> np.ndarray:
    return np.random.default_rng(0).random((n, 28, 28, 1), dtype=np.float32)


def labels(n: int) -> np.ndarray:
    return np.random.default_rng(1).integers(0, 10, n)


def case(**kw: Any) -> Case:
    kw = {"backend": "keras", "batch": BATCH, "steps": STEPS, "warmup": WARMUP, **kw}
    return Case(**kw)


def task(samples: int = 8 * BATCH, fit: Any = None, **model: Any) -> KerasTask:
    return KerasTask(model=lambda c: convnet(**model), x=images(samples), y=labels(samples),
                     fit={"batch_size": BATCH} if fit is None else fit)


def train(the_task: KerasTask, the_case: Case | None = None) -> TrainResult:
    result = BACKEND.train(the_case or case(), the_task, CPU)
    assert isinstance(result, TrainResult)
    return result


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Every training of this module runs here: nothing may be left behind."""
    path = tmp_path_factory.mktemp("keras-cwd")
    before = Path.cwd()
    os.chdir(path)
    try:
        yield path
    finally:
        os.chdir(before)


@pytest.fixture(scope="module")
def plain(workdir: Path) -> TrainResult:
    return train(task())


@pytest.fixture(scope="module")
def again(workdir: Path) -> TrainResult:
    return train(task())


@pytest.fixture(scope="module")
def owned(workdir: Path) -> tuple[TrainResult, list[str]]:
    """A fit whose settings the gate owns (epochs, verbose, a CSV log and a checkpoint),
    on arrays of 3 batches: the gate's settings, said; the data cycled, said."""
    fit = {"batch_size": BATCH, "epochs": 15, "verbose": 1, "validation_split": 0.1,
           "callbacks": [keras.callbacks.CSVLogger("train.csv"),
                         keras.callbacks.ModelCheckpoint("best.keras")]}
    with pytest.warns(AccelperfWarning) as said:
        result = train(task(samples=3 * BATCH, fit=fit))
    return result, [str(w.message) for w in said]


def test_registered_and_named_like_its_library() -> None:
    spec = get_backend("keras")
    assert spec.requires == ("jax", "keras")
    assert spec.load() is BACKEND and BACKEND.unavailable_reason() is None
    assert "keras" in (spec.packages or ())


@pytest.mark.slow
def test_steps_times_losses_and_learning_rate(plain: TrainResult) -> None:
    run = plain.run
    assert run.outcome == "ok", run.message
    assert len(run.losses) == WARMUP + STEPS and len(run.step_times) == STEPS
    assert all(t > 0 for t in run.step_times)
    assert run.metrics["lr"] == [pytest.approx(1e-3)] * (WARMUP + STEPS)
    assert len(run.inputs.times) == STEPS and all(t > 0 for t in run.inputs.wall_times)
    assert run.samples_per_step == BATCH and run.n_devices == 1
    # Keras's own time per step: the step less its train step (fetched batch to outputs)
    trainer = run.trainer_times or []
    assert len(trainer) == STEPS
    assert all(0 <= t < s for t, s in zip(trainer, run.step_times, strict=True))


@pytest.mark.slow
def test_each_steps_loss_is_taken_back_out_of_kerass_running_mean(
        plain: TrainResult) -> None:
    """Keras logs the epoch's mean loss so far; the run's losses are each batch's own, so
    their mean is the mean Keras reported at the epoch's end (its History)."""
    model = plain.state
    assert np.mean(plain.run.losses) == pytest.approx(model.history.history["loss"][-1],
                                                      rel=1e-5)
    assert len(set(plain.run.losses)) == len(plain.run.losses)


@pytest.mark.slow
def test_the_program_of_kerass_jitted_train_step(plain: TrainResult) -> None:
    run = plain.run
    program = run.program or {}
    assert program["source"] == "xla" and program["dispatches"] == 1
    assert program["flops"] == run.flops_per_step and (run.flops_per_step or 0) > 1e6
    assert program["host_callbacks"] == 0 and program.get("ops", {}).get("convolution")
    assert run.memory_source == "memory_analysis"
    assert next(iter(run.memory_per_device.values())) > 100_000
    assert run.details["jit_compile"] is True


@pytest.mark.slow
def test_numerics_fingerprint_stable_and_covers_the_whole_state(
        plain: TrainResult, again: TrainResult) -> None:
    assert plain.run.params_fingerprint == again.run.params_fingerprint
    assert plain.run.losses == again.run.losses
    params = plain.params or {}
    assert "sequential/conv2d/kernel" in params  # names from a fresh session: stable
    assert "seed_generator/seed_generator_state" in params  # dropout's generator
    assert int(params["adam/iteration"]) == WARMUP + STEPS
    assert "adam/sequential_conv2d_kernel_momentum" in params
    assert plain.run.params_fingerprint["adam/iteration"]["state"] is True


@pytest.mark.slow
def test_jit_compile_false_is_caught_by_the_program_without_a_clock(
        plain: TrainResult, workdir: Path) -> None:
    eager = train(task(jit_compile=False)).run
    assert eager.outcome == "ok" and eager.details["jit_compile"] is False
    program = eager.program or {}
    assert program["dispatches"] > 100 and program["flops"] == (plain.run.program or {})["flops"]
    assert eager.memory_per_device == {}  # no compiled plan: op by op
    result = check_program({"outcome": "ok", "environment": {}, "program": program},
                           {"outcome": "ok", "environment": {}, "program": plain.run.program},
                           Tolerances(), comparable=True)
    assert result is not None and result.verdict is Verdict.REGRESSION
    assert f"dispatches: 1 → {program['dispatches']}" in result.detail


@pytest.mark.slow
def test_what_the_gate_owns_is_set_and_said(owned: tuple[TrainResult, list[str]],
                                            workdir: Path) -> None:
    result, said = owned
    assert result.run.outcome == "ok" and len(result.run.losses) == WARMUP + STEPS
    assert "KerasTask.fit['epochs']=15: the gate uses 1 (one epoch of the case's warm-up " \
           "+ steps batches (steps_per_epoch))" in said
    assert "KerasTask.fit['verbose']=1: the gate uses 0 (the gate's own progress line " \
           "reports each step)" in said
    assert ("KerasTask.fit['callbacks'] holds CSVLogger: left out (nothing is written to "
            "disk; the gate reports each step)") in said
    assert any("holds ModelCheckpoint: left out" in s for s in said)
    assert ("KerasTask.fit['validation_split']: validation is not run (validation_freq=[]: "
            "it is not part of a training step)") in said
    assert list(workdir.iterdir()) == []


@pytest.mark.slow
def test_arrays_shorter_than_the_run_are_cycled_and_said(
        owned: tuple[TrainResult, list[str]]) -> None:
    result, said = owned
    assert ("KerasTask.x holds 44 training samples, 2 full batch(es) of 16; the case "
            "trains 7 (warm-up + steps): cycled (the arrays repeated to 112 samples, one "
            "epoch)") in said
    assert result.notes == said


class Batches(keras.utils.PyDataset):  # type: ignore[misc]
    """A PyDataset of ``n`` batches of ``size``."""

    def __init__(self, n: int, size: int) -> None:
        super().__init__()
        self.n, self.size = n, size

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        rows = slice(i * self.size, (i + 1) * self.size)
        return images(self.n * self.size)[rows], labels(self.n * self.size)[rows]


@pytest.mark.slow
def test_a_short_pydataset_is_cycled_and_said(workdir: Path) -> None:
    with pytest.warns(AccelperfWarning, match="KerasTask.x is a PyDataset of 3 batch"):
        result = train(KerasTask(model=lambda c: convnet(), x=Batches(3, BATCH)))
    assert result.run.outcome == "ok" and len(result.run.losses) == WARMUP + STEPS


@pytest.mark.slow
def test_a_datasets_batch_unlike_the_case_is_one_line(workdir: Path) -> None:
    with pytest.raises(TaskError, match=r"the global batch is 8 \(the first batch fit drew\), "
                       r"but keras-nomesh-b16 declares batch=16: make the data's batch 16"):
        train(KerasTask(model=lambda c: convnet(), x=Batches(8, 8)))


@pytest.mark.slow
def test_an_arrays_batch_unlike_the_case_is_one_line(workdir: Path) -> None:
    with pytest.raises(TaskError, match=r"the global batch is 32 \(Keras's default batch_size "
                       r"\(fit was given none\)\), but keras-nomesh-b16 declares batch=16: "
                       r"give fit batch_size=16"):
        train(task(fit={}))


@pytest.mark.slow
def test_a_model_that_was_not_compiled_is_one_line(workdir: Path) -> None:
    with pytest.raises(TaskError, match=r"KerasTask.model 'sequential' \(Sequential\) was not "
                       r"compiled: call model.compile\(optimizer=..., loss=...\)"):
        train(task(compiled=False))


@pytest.mark.slow
def test_steps_per_execution_above_one_is_refused_saying_why(workdir: Path) -> None:
    with pytest.raises(TaskError, match="compiled with steps_per_execution=2: Keras then "
                       "calls back once every 2 optimizer steps"):
        train(task(steps_per_execution=2))


@pytest.mark.slow
def test_nothing_is_left_in_the_working_directory(plain: TrainResult,
                                                  workdir: Path) -> None:
    assert list(workdir.iterdir()) == []


def test_keras_not_installed_skips_with_its_install_line(
        monkeypatch: pytest.MonkeyPatch) -> None:
    found = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "keras" else found(name, *a))
    assert get_backend("keras").unavailable_reason() == (
        "backend 'keras' needs keras, which is not installed: pip install "
        "'pytest-accelperf[keras]'")


def _python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, **env}, check=False)


@pytest.mark.slow
def test_keras_on_another_backend_is_refused_in_one_line(tmp_path: Path) -> None:
    """Keras picks its backend at its first import, once: a process whose keras is on
    torch cannot train a case on JAX, nor one whose KERAS_BACKEND names another."""
    load = "import pytest_accelperf.backends.keras.load"
    home = {"KERAS_HOME": str(tmp_path / "home")}
    imported = _python(f"import keras\n{load}", KERAS_BACKEND="torch", **home)
    assert imported.returncode == 1
    assert imported.stderr.splitlines()[-1] == (
        "pytest_accelperf.errors.ConfigError: keras was imported in this process on its "
        "'torch' backend before the case trained, and cannot change it; the keras backend "
        "trains Keras 3 on JAX: set KERAS_BACKEND=jax before anything imports keras (in the "
        "environment, or at the top of conftest.py: os.environ['KERAS_BACKEND'] = 'jax')")
    chosen = _python(load, KERAS_BACKEND="torch", **home)
    assert chosen.stderr.splitlines()[-1].startswith(
        "pytest_accelperf.errors.ConfigError: KERAS_BACKEND=torch: the keras backend trains "
        "Keras 3 on JAX; set KERAS_BACKEND=jax")


@pytest.mark.slow
def test_importing_keras_leaves_no_config_behind(tmp_path: Path) -> None:
    """Keras writes keras.json into its home on its first import: the backend's import
    takes it away again."""
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if k != "KERAS_BACKEND"}
    out = subprocess.run(
        [sys.executable, "-c", "from pytest_accelperf.backends.keras.load import keras\n"
         "print(keras.backend.backend())"], capture_output=True, text=True, check=True,
        env={**env, "KERAS_HOME": str(home)})
    assert out.stdout.strip() == "jax" and not home.exists()


def test_importing_the_entry_point_imports_no_framework() -> None:
    code = ("import sys, pytest_accelperf.keras\n"
            "print(sorted(m for m in ('keras', 'jax') if m in sys.modules))")
    assert _python(code).stdout.strip() == "[]"


@pytest.mark.slow
def test_the_ab_stepper_holds_the_fit_between_blocks(plain: TrainResult,
                                                     workdir: Path) -> None:
    """A/B mode's stepper: ``model.fit`` in a thread of its own, held before each step;
    each ``run(n)`` lets exactly ``n`` through and gives their times; the program is the
    run's; ``close`` ends the fit and leaves nothing behind."""
    stepper = BACKEND.stepper(case(), task(), CPU)
    try:
        first, second = stepper.run(3), stepper.run(2)
        assert len(first) == 3 and len(second) == 2 and all(t > 0 for t in first + second)
        program = stepper.program or {}
        assert program["dispatches"] == 1
        assert program["flops"] == (plain.run.program or {})["flops"]
    finally:
        stepper.close()
    assert list(workdir.iterdir()) == []
