"""Provisioning helpers: platform keys, peak FLOPs, device environment per xdist worker."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import NO_HYPOTHESIS

from pytest_accelperf.provision.accel import (
    assign_worker_devices,
    peak_flops,
    platform_key,
    prepare_environment,
    worker_visible_devices,
)


def test_platform_keys() -> None:
    assert platform_key("cpu", "cpu", 8) == "cpu-x8"
    assert platform_key("tpu", "TPU v4", 8) == "tpu-v4-x8"
    assert platform_key("gpu", "NVIDIA H100 80GB HBM3", 8) == "gpu-nvidia-h100-80gb-hbm3-x8"


def test_peak_flops_table() -> None:
    assert peak_flops("TPU v5 lite") == 197e12
    assert peak_flops("TPU v5p") == 459e12
    assert peak_flops("NVIDIA H100 PCIe") == 756e12
    assert peak_flops("NVIDIA H100 80GB HBM3") == 989e12
    assert peak_flops("NVIDIA A100-SXM4-40GB") == 312e12
    assert peak_flops("cpu") is None


def test_prepare_environment_keeps_other_flags_and_replaces_count() -> None:
    env = {"XLA_FLAGS": "--xla_dump_to=/tmp/x --xla_force_host_platform_device_count=2"}
    prepare_environment("cpu", 8, env)
    assert env["XLA_FLAGS"] == "--xla_dump_to=/tmp/x --xla_force_host_platform_device_count=8"
    assert env["JAX_PLATFORMS"] == "cpu"
    gpu_env: dict[str, str] = {}
    prepare_environment("gpu", 8, gpu_env)
    assert "JAX_PLATFORMS" not in gpu_env


def test_workers_get_disjoint_device_slices() -> None:
    assert worker_visible_devices(8, 0, 2) == [0, 1, 2, 3]
    assert worker_visible_devices(8, 1, 2) == [4, 5, 6, 7]
    assert worker_visible_devices(8, 2, 3) == [4, 5]
    with pytest.raises(ValueError, match="run with -n 2 or less"):
        worker_visible_devices(2, 0, 4)


def test_gpu_workers_get_their_own_cuda_devices() -> None:
    env = {"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}
    assert assign_worker_devices("gpu", "gw1", 2, env) == [4, 5, 6, 7]
    assert env["CUDA_VISIBLE_DEVICES"] == "4,5,6,7"
    cpu_env = {"CUDA_VISIBLE_DEVICES": "0,1"}
    assert assign_worker_devices("cpu", "gw1", 2, cpu_env) is None
    assert cpu_env["CUDA_VISIBLE_DEVICES"] == "0,1"


# -- a session without jax: a torch user's install ------------------------------------------
def test_without_jax_the_cpu_has_the_same_platform_key() -> None:
    from pytest_accelperf.provision.accel import provision, provision_without_jax

    pytest.importorskip("jax")
    with_jax = provision("cpu", 8)
    alone = provision_without_jax("cpu", 8)
    assert (alone.name, alone.platform, alone.device_count) == ("cpu", "cpu-x8", 8)
    assert alone.platform == with_jax.platform  # the same baselines with or without jax
    assert provision_without_jax("cpu", 8, "ci-runner").platform == "ci-runner"


def test_without_jax_gpus_are_found_through_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch's CUDA devices (a stand-in for the GPUs this machine lacks): the same device
    names as jax's, so the same platform keys and peak FLOPs."""
    import pytest_accelperf.provision.accel as accel
    from pytest_accelperf.provision.accel import AcceleratorUnavailable, provision_without_jax

    class Properties:
        total_memory = 85_520_809_984

    class Cuda:
        count = 2

        def is_available(self) -> bool:
            return self.count > 0

        def device_count(self) -> int:
            return self.count

        def get_device_name(self, index: int) -> str:
            return "NVIDIA H100 80GB HBM3"

        def get_device_properties(self, index: int) -> Properties:
            return Properties()

    cuda = Cuda()
    monkeypatch.setattr(accel, "_torch_cuda", lambda: cuda)
    for asked in ("gpu", "auto"):
        gpu = provision_without_jax(asked, 8)
        assert (gpu.name, gpu.platform, gpu.device_count) == (
            "gpu", "gpu-nvidia-h100-80gb-hbm3-x2", 2)
        assert gpu.memory_capacity == 85_520_809_984 and gpu.peak_flops == 989e12
    cuda.count = 0
    assert provision_without_jax("auto", 8).platform == "cpu-x8"
    with pytest.raises(AcceleratorUnavailable, match="or pass --accel=cpu"):
        provision_without_jax("gpu", 8)
    with pytest.raises(AcceleratorUnavailable, match=r"pytest-accelperf\[jax\]"):
        provision_without_jax("tpu", 8)


HIDE = """
import importlib.machinery

# An install without these packages: not found on the path, so importlib.util.find_spec
# says None and an import raises ModuleNotFoundError.
BLOCKED = {blocked!r}
_find = importlib.machinery.PathFinder.find_spec


def find_spec(cls, name, path=None, target=None):
    if name.partition(".")[0] in BLOCKED:
        return None
    return _find(name, path, target)


importlib.machinery.PathFinder.find_spec = classmethod(find_spec)
"""
JAX_FAMILY = ("jax", "jaxlib", "flax", "optax")


def hide(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch,
         packages: tuple[str, ...]) -> None:
    """Make the inner sessions of ``pytester`` (subprocesses) an install without
    ``packages``: a torch user's, or a JAX user's."""
    where = pytester.path / "hidden"
    where.mkdir()
    (where / "sitecustomize.py").write_text(HIDE.format(blocked=set(packages)))
    monkeypatch.setenv("PYTHONPATH", str(where))


TORCH_AND_JAX_CASES = '''
import torch

from pytest_accelperf import cases
from pytest_accelperf.torch import TorchTask


def make_task(case):
    def make_batch(step):
        x = torch.randn(case.batch, 8, generator=torch.Generator().manual_seed(step))
        return {"x": x, "y": x.sum(1, keepdim=True)}

    return TorchTask(make_model=lambda: torch.nn.Linear(8, 1),
                     loss_fn=lambda m, b: ((m(b["x"]) - b["y"]) ** 2).mean(),
                     make_batch=make_batch, make_optimizer=lambda p: torch.optim.SGD(p, 0.1))


@cases(backend="torch", batch=[16], steps=5, warmup=1)
def test_torch(accelperf):
    assert accelperf.train(make_task(accelperf.case)).run.outcome == "ok"


@cases(backend="jax", batch=[16], steps=5, warmup=1)
def test_jax(accelperf):
    raise AssertionError("a jax case ran without jax")
'''


@pytest.mark.slow
def test_a_torch_suite_runs_where_jax_is_not_installed(pytester: pytest.Pytester,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A torch user's first command (``pip install 'pytest-accelperf[torch]'``): the torch
    cases record and pass on ``cpu-x8``, the JAX case skips with the install line."""
    pytest.importorskip("torch")
    hide(pytester, monkeypatch, JAX_FAMILY)
    pytester.makepyfile(test_mixed=TORCH_AND_JAX_CASES)
    args = ("-p", "no:cacheprovider", *NO_HYPOTHESIS, "--accel=cpu", "-rs")
    recorded = pytester.runpytest_subprocess(*args, "--accelperf-update")
    recorded.assert_outcomes(passed=1, skipped=1)
    recorded.stdout.fnmatch_lines(["*jax*pip install*pytest-accelperf[[]jax[]]*"])
    assert (pytester.path / "baselines" / "cpu-x8" / "test_mixed.json").is_file()
    gated = pytester.runpytest_subprocess(*args)
    gated.assert_outcomes(passed=1, skipped=1)
    gated.stdout.fnmatch_lines(["accelperf: 1 case(s) on cpu-x8: * pass*"])


ROOT = Path(__file__).resolve().parents[3]

WHICH_IMPORTED = """
import json
import sys


def pytest_sessionfinish(session):
    with open("imported.json", "w") as out:
        json.dump({name: name in sys.modules for name in ("jax", "torch")}, out)
"""


@pytest.mark.slow
def test_describing_the_cpu_imports_neither_jax_nor_torch(pytester: pytest.Pytester) -> None:
    """The CPU is described without jax; its jax devices are found when a JAX case first
    asks (a torch session with jax installed saved ~0.6 s and the XLA client's threads)."""
    pytest.importorskip("torch")
    pytest.importorskip("jax")
    from pytest_accelperf.provision.accel import JaxDevices, provision

    devices = provision("cpu", 8).devices
    assert isinstance(devices, JaxDevices)
    assert len(devices) == 8 and devices[0].platform == "cpu"  # found on first use
    # A process whose jax has other devices than the session was described with (a worker
    # that started jax without the plugin's XLA_FLAGS) is told so at first use, with the fix.
    from pytest_accelperf.provision.accel import AcceleratorUnavailable

    with pytest.raises(AcceleratorUnavailable, match=r"jax has 8 cpu device.* not the 4 .*"
                       r"XLA_FLAGS=--xla_force_host_platform_device_count=4"):
        len(provision("cpu", 4).devices)
    pytester.makepyfile(test_mixed=TORCH_AND_JAX_CASES.replace(
        'raise AssertionError("a jax case ran without jax")', 'pass'))
    pytester.makeconftest(WHICH_IMPORTED)
    args = ("-p", "no:cacheprovider", "--accel=cpu", "--accelperf-update")
    pytester.runpytest_subprocess(*args, "-k", "torch").assert_outcomes(passed=1)
    assert not json.loads((pytester.path / "imported.json").read_text())["jax"]
    # ... nor does describing the CPU import torch (~1 s) in a session that has no torch case
    pytester.makepyfile(test_mixed="def test_cpu(accelerator):\n"
                                   "    assert accelerator.platform == 'cpu-x8'\n")
    pytester.runpytest_subprocess(*args).assert_outcomes(passed=1)
    assert not json.loads((pytester.path / "imported.json").read_text())["torch"]


@pytest.mark.parametrize("missing", [JAX_FAMILY, ("torch",)], ids=["no-jax", "no-torch"])
@pytest.mark.slow  # 20 s: a fresh interpreter per framework left out
def test_the_suites_collect_without_a_framework(pytester: pytest.Pytester,
                                                monkeypatch: pytest.MonkeyPatch,
                                                missing: tuple[str, ...]) -> None:
    """The README's promise: where a framework is not installed its cases skip with the
    install line; seen, the suites' modules that import it failed to collect instead and
    interrupted the session."""
    import shutil

    shutil.copytree(ROOT / "suites", pytester.path / "suites")
    hide(pytester, monkeypatch, missing)
    result = pytester.runpytest_subprocess("suites", "--co", "-q", "-rs", "-p",
                                           "no:cacheprovider", "--accel=cpu")
    assert result.ret == 0, result.stdout.str()
    skipped = "jax" if missing == JAX_FAMILY else "torch"
    result.stdout.fnmatch_lines([f"SKIPPED * the {skipped} suites need {skipped}: pip install*"])


def test_a_case_needing_more_accelerators_than_the_host_has_is_skipped_naming_them(
        pytester: pytest.Pytester) -> None:
    """Seen on a one-GPU H100 with --accel=gpu: every 4x2 / 8x1 mesh case and every
    two-rank DeepSpeed case failed as an error; the hardware is missing, not the suite
    wrong, so they skip with the count they need (on the CPU a mesh too large stays an
    error naming --accelperf-cpu-devices: test_user_errors.py)."""
    pytester.makeconftest('''
        import pytest
        from pytest_accelperf.provision.accel import Accelerator

        @pytest.fixture(scope="session")
        def accelerator():
            return Accelerator(name="gpu", platform="gpu-fake-x1", device_kind="fake",
                               device_count=1)
    ''')
    pytester.makepyfile(test_mesh='''
        from pytest_accelperf import cases

        @cases(backend="jax", mesh=[(4, 2)], batch=[32], steps=2, warmup=1)
        def test_big(accelperf):
            accelperf.train(None)
    ''')
    result = pytester.runpytest("-p", "no:cacheprovider", "-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*jax-mesh4x2-b32 needs 8 devices; gpu-fake-x1 has 1*"])
