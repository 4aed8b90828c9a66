"""The neuron backend's loop above the device, driven by a CPU adapter (no NeuronCore here),
and its skip reason where torch-neuronx is absent."""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, field

import pytest

torch = pytest.importorskip("torch")

from pytest_accelperf.backends import BACKENDS  # noqa: E402
from pytest_accelperf.backends.torch.backend import BACKEND as TORCH  # noqa: E402
from pytest_accelperf.backends.torch.neuron import MIN_WARMUP, train_lazy  # noqa: E402
from pytest_accelperf.collect.cases import Case  # noqa: E402
from pytest_accelperf.torch import TorchTask  # noqa: E402

INSTALL = "pip install torch-neuronx --extra-index-url https://pip.repos.neuron.amazonaws.com"


@dataclass
class CpuLazyDevice:
    """The stand-in for torch-xla: eager CPU, with a log of the calls the loop makes and a
    compile counter that moves on the steps listed in ``compiles_at``."""

    compiles_at: tuple[int, ...] = (0, 1)
    kind: str = "cpu-lazy"
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    calls: list[str] = field(default_factory=list)

    def mark_step(self) -> None:
        self.calls.append("mark_step")

    def wait(self) -> None:
        self.calls.append("wait")

    def memory(self) -> dict[str, int]:
        return {"cpu-lazy:0": 1234}

    def compile_count(self) -> int | None:
        # Step i's work ends with the (2i+2)-th wait (the batch copy's wait comes first):
        # a "compile" at step s has happened once that wait has.
        waits = self.calls.count("wait")
        return sum(1 for s in self.compiles_at if 2 * s + 2 <= waits)


def make_task(case: Case) -> TorchTask:
    def make_batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        gen = torch.Generator().manual_seed(step)
        x = torch.randn(case.batch, 16, generator=gen)
        return x, x.sum(dim=1, keepdim=True)

    return TorchTask(make_model=lambda: torch.nn.Linear(16, 1),
                     loss_fn=lambda m, b: torch.nn.functional.mse_loss(m(b[0]), b[1]),
                     make_batch=make_batch,
                     make_optimizer=lambda p: torch.optim.SGD(p, lr=0.05))


def test_loop_marks_waits_and_times_warmup_apart() -> None:
    case = Case(backend="neuron", batch=8, steps=6, warmup=0)
    dev = CpuLazyDevice()
    run = train_lazy(case, make_task(case), dev).run
    total = MIN_WARMUP + case.steps
    # per step: the batch copy's graph, then the step's; each cut and waited for
    assert dev.calls == ["mark_step", "wait"] * (2 * total)
    assert len(run.step_times) == case.steps and len(run.losses) == total
    assert run.warmup_step_times is not None
    assert len(run.warmup_step_times) == MIN_WARMUP
    assert run.compile_time == pytest.approx(sum(run.warmup_step_times))
    assert run.losses[-1] < run.losses[0]
    assert run.memory_per_device == {"cpu-lazy:0": 1234}
    assert run.flops_per_step and run.flops_per_step > 0
    assert "recompiles" not in run.details


def test_same_numbers_as_the_torch_backend() -> None:
    case = Case(backend="neuron", batch=8, steps=5, warmup=2)
    lazy = train_lazy(case, make_task(case), CpuLazyDevice()).run
    from pytest_accelperf.provision.accel import Accelerator

    accel = Accelerator(name="cpu", platform="cpu-x1", device_kind="cpu", device_count=1)
    eager = TORCH.train(Case(backend="torch", batch=8, steps=5, warmup=2), make_task(case),
                        accel).run
    assert lazy.losses == eager.losses
    assert lazy.params_fingerprint == eager.params_fingerprint


def test_a_measured_step_that_compiles_is_recorded() -> None:
    case = Case(backend="neuron", batch=8, steps=4, warmup=0)
    run = train_lazy(case, make_task(case), CpuLazyDevice(compiles_at=(0, 1, 4))).run
    assert run.details["recompiles"] == [4]


def test_skips_with_the_install_command(pytester: pytest.Pytester) -> None:
    reason = BACKENDS["neuron"].unavailable_reason()
    assert reason is not None and INSTALL in reason
    pytester.makepyfile(test_n=textwrap.dedent('''
        from pytest_accelperf import cases

        @cases(backend="neuron", batch=[8], accels=("neuron",))
        def test_trn(accelperf):
            raise AssertionError("must not run")
    '''))
    result = pytester.runpytest("-p", "no:cacheprovider", "-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines([f"*{INSTALL}*"])
