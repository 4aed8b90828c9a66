"""Seed 001: a model fine-tuned on AWS Trainium (trn1.2xlarge) across batch 2-64.

Three kinds of case:

* ``test_trainium_mlp``: the neuron backend trains a small MLP on a NeuronCore through
  torch-xla (warm-up timed apart as compile, ``mark_step`` + wait every step). It runs with
  ``--accel=neuron`` on a Trainium host and skips elsewhere with the install command.
* ``test_trainium_profile``: the seed's Neuron profiler summaries and Trainer metrics
  (``data/001_trainium_neuron_profile.md``, the seed verbatim), one case per batch section,
  ingested and checked like any run: samples/s, train loss, memory per NeuronCore (the
  memory table's Total), FLOPs; MFU, HBM traffic and engine activity in ``run.details``.
* ``test_outside_command``: an outside training script (``train_hf_style.py``) run as a
  command; its Trainer-format metrics are ingested and checked.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from pytest_accelperf import Case, CaseRunner, cases

HERE = Path(__file__).parent
REPORT = HERE / "data" / "001_trainium_neuron_profile.md"

#: section heading -> (batch, label) of the sections that name their batch.
SECTIONS = {"Batch 2": (2, ""), "Batch 4": (4, ""), "Batch 16": (16, ""), "Batch 32": (32, ""),
            "Batch32 CC optim": (32, "cc_optim"), "Batch 48": (48, ""),
            "Batch 64 (swap)": (64, "swap")}


def make_mlp_task(case: Case) -> Any:
    import torch

    from pytest_accelperf.torch import TorchTask

    def make_batch(step: int) -> tuple[Any, Any]:
        gen = torch.Generator().manual_seed(step)
        x = torch.randn(case.batch, 256, generator=gen)
        return x, (x[:, :8].sum(dim=1) > 0).long()

    return TorchTask(
        make_model=lambda: torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(),
                                               torch.nn.Linear(512, 2)),
        loss_fn=lambda model, b: torch.nn.functional.cross_entropy(model(b[0]), b[1]),
        make_batch=make_batch,
        make_optimizer=lambda params: torch.optim.AdamW(params, lr=1e-3))


@cases(backend="neuron", batch=[16, 32], steps=20, accels=("neuron",), label="mlp")
def test_trainium_mlp(accelperf: CaseRunner) -> None:
    result = accelperf.train(make_mlp_task(accelperf.case))
    assert result.run.compile_time is not None


@cases(*(Case(backend="external", batch=b, label="_".join(filter(None, ["trn1", label])),
              params={"section": title}) for title, (b, label) in SECTIONS.items()))
def test_trainium_profile(accelperf: CaseRunner) -> None:
    section = accelperf.case.params["section"]
    result = accelperf.ingest(REPORT, parser="neuron", section=section)
    run = result.run
    assert run.samples_per_step == accelperf.case.batch
    assert run.environment.device_kind == "trn1.2xlarge"
    assert 0 < run.details["mfu"] < 1
    assert run.details["profile"]["hbm_read_bytes"] > 0


@pytest.mark.filterwarnings("ignore::UserWarning")
@cases(Case(backend="external", batch=64, label="hf_style_script"))
def test_outside_command(accelperf: CaseRunner) -> None:
    command = [sys.executable, str(HERE / "train_hf_style.py"), str(accelperf.case.batch), "100"]
    result = accelperf.ingest(command, parser="hf-trainer")
    # ~30 steps/s: the Trainer's rounding of runtime (0.01 s) and steps/s cannot move the
    # step count by half a step, so it is exact (faster steps would give an interval).
    assert result.run.details["train_steps"] == 100
