"""A CUDA error inside a step (issue 38): the case fails with the device's message and its
id, without a traceback of ours; after a sticky one (an illegal memory access) the later
in-process cases of that process fail at once naming the case that broke the context, and
the session goes on. No GPU here: the step raises the error torch raises on one, word for
word (a stand-in for the device; everything above it is the plugin's real path)."""

from __future__ import annotations

import pytest
from conftest import Suite

pytest.importorskip("torch")

SUITE = '''
import torch

from pytest_accelperf import Case, cases
from pytest_accelperf.torch import TorchTask

ILLEGAL = ("CUDA error: an illegal memory access was encountered\\nCUDA kernel errors might "
           "be asynchronously reported at some other API call, so the stacktrace below might "
           "be incorrect.\\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1")


def make_task(case):
    def make_batch(step):
        g = torch.Generator().manual_seed(step)
        x = torch.randn(case.batch, 8, generator=g)
        return {"x": x, "y": x.sum(dim=1, keepdim=True)}

    def loss_fn(model, batch):
        if case.label == "broken":
            raise torch.AcceleratorError(ILLEGAL)
        return ((model(batch["x"]) - batch["y"]) ** 2).mean()

    return TorchTask(make_model=lambda: torch.nn.Linear(8, 1), loss_fn=loss_fn,
                     make_batch=make_batch, make_optimizer=lambda p: torch.optim.SGD(p, 0.01))


@cases(Case(backend="torch", batch=4, steps=3, warmup=1, label="broken"),
       Case(backend="torch", batch=4, steps=3, warmup=1, label="after"))
def test_cuda(accelperf):
    accelperf.train(make_task(accelperf.case))
'''


def test_a_sticky_cuda_error_fails_its_case_and_the_later_ones_fast(suite: Suite) -> None:
    suite.write(SUITE)
    result = suite.run("--accel=cpu", "--accelperf-update", subprocess=True)
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines([
        "*test_suite.py::test_cuda?torch-nomesh-b4-broken? (torch-nomesh-b4-broken): a CUDA "
        "error that breaks the process's device context on cpu: AcceleratorError: CUDA "
        "error: an illegal memory access was encountered",
        "*test_suite.py::test_cuda?torch-nomesh-b4-after? (torch-nomesh-b4-after): not run: "
        "the device context of this process was broken by case torch-nomesh-b4-broken "
        "(AcceleratorError: CUDA error: an illegal memory access was encountered)*",
    ])
    assert "Traceback" not in result.stdout.str()
