"""The hf backend without a training: its registration, the entry point's imports, the
skip line, and the ``TrainingArguments`` a measured run uses (what the gate owns set, and
one line for each of the user's settings it replaced)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from pytest_accelperf.backends import get_backend
from pytest_accelperf.collect.cases import Case

STEPS, WARMUP = 6, 1


def case(**kw: object) -> Case:
    return Case(backend="hf", batch=8, steps=STEPS, warmup=WARMUP, **kw)  # type: ignore[arg-type]


def test_registered_and_named_like_its_library() -> None:
    spec = get_backend("hf")
    assert spec.requires == ("torch", "transformers", "accelerate")
    assert {"transformers", "accelerate", "torch"} <= set(spec.packages or ())


def test_not_installed_skips_with_its_install_line(monkeypatch: pytest.MonkeyPatch) -> None:
    found = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "transformers" else found(name, *a))
    assert get_backend("hf").unavailable_reason() == (
        "backend 'hf' needs transformers, which is not installed: pip install "
        "'pytest-accelperf[hf]' (install torch first: pip install torch==2.13.0 for CPU)")


def test_importing_the_entry_point_imports_no_framework() -> None:
    code = ("import sys, pytest_accelperf.hf\n"
            "print(sorted(m for m in ('torch', 'transformers', 'accelerate') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"


@pytest.fixture
def training_args() -> object:
    """``training_args``: the same lines for a dict and for a ``TrainingArguments``."""
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from pytest_accelperf.backends.hf.backend import training_args

    return training_args

def test_what_the_gate_owns_is_set_and_said_once_per_field(training_args: object) -> None:
    import torch
    from transformers import TrainingArguments

    given = {"output_dir": "out", "max_steps": 100, "save_strategy": "epoch",
             "report_to": "none", "disable_tqdm": False, "learning_rate": 3e-4}
    expected = [
        "TrainerTask.args.save_strategy='epoch': the gate uses 'no' (no checkpoint is "
        "left in the project)",
        "TrainerTask.args.disable_tqdm=False: the gate uses True (the gate's own "
        "progress line reports each step)",
        f"TrainerTask.args.max_steps=100: the gate uses {WARMUP + STEPS} (the case's "
        f"warm-up + steps)",
        "TrainerTask.args.output_dir='out': the gate uses a temporary directory "
        "(removed after the case: nothing is left in the project)"]
    # A TrainingArguments's field is the user's where it differs from transformers' own
    # default: disable_tqdm=False is what TrainingArguments() makes of its None.
    for args, lines in ((given, expected), (TrainingArguments(**given),
                                            expected[:1] + expected[2:])):
        made, notes = training_args(args, case(), torch.device("cpu"), 7)  # type: ignore[operator]
        assert notes == lines
        assert (made.save_strategy, made.report_to, made.disable_tqdm, made.seed,
                made.learning_rate, made.use_cpu) == ("no", [], True, 7, 3e-4, True)

def test_defaults_are_not_the_users_settings(training_args: object) -> None:
    import torch
    from transformers import TrainingArguments

    for args in ({}, None, TrainingArguments()):
        _, notes = training_args(args, case(), torch.device("cpu"), None)  # type: ignore[operator]
        assert notes == []

def test_the_cases_grad_accum_is_the_trainers(training_args: object) -> None:
    import torch

    made, notes = training_args({"gradient_accumulation_steps": 4},  # type: ignore[operator]
                                case(grad_accum=2), torch.device("cpu"), None)
    assert made.gradient_accumulation_steps == 2
    assert notes == ["TrainerTask.args.gradient_accumulation_steps=4: the gate uses 2 "
                     "(the case's grad_accum)"]

def test_a_field_transformers_refuses_is_one_line(training_args: object) -> None:
    import torch

    from pytest_accelperf.backends.measure.common import TaskError

    with pytest.raises(TaskError, match=r"^TrainerTask.args: .*no_such_field"):
        training_args({"no_such_field": 1}, case(), torch.device("cpu"), None)  # type: ignore[operator]
