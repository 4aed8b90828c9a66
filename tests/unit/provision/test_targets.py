"""Compile-only targets (``--accelperf-target``): a TPU's own program, compiled without a TPU.

The first tests need nothing but the plugin: how a target is named, the HBM table, the
environment libtpu gets and gives back, its log kept off the terminal, the skip line where
libtpu is missing, the options a target refuses. The rest compile real programs through
libtpu for TPU topologies (skipped where libtpu is not installed, with its install line):
a matmul's FLOPs per device against 2·m·n·k over the mesh, its argument bytes against the
shards' sizes, a program larger than a v5e's HBM against one that fits a v6e's, the
baselines' platform key, what a compile-only case did not run, and a lost sharding spec
failing the gate by the collective it changed. Each compile takes well under a second.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
from typing import Any

from pytest_accelperf.provision.accel import prepare_environment

prepare_environment("cpu", 8)

import pytest  # noqa: E402

# JAX's own extra (pip install 'pytest-accelperf[jax]')
pytest.importorskip("jax")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from conftest import Suite, verdicts  # noqa: E402
from jax.sharding import PartitionSpec  # noqa: E402

from pytest_accelperf.backends.jax.backend import BACKEND  # noqa: E402
from pytest_accelperf.backends.jax.hlo import read_hlo  # noqa: E402
from pytest_accelperf.checks.outcome import oom_sentence  # noqa: E402
from pytest_accelperf.collect.cases import Case  # noqa: E402
from pytest_accelperf.jax import JaxStep  # noqa: E402
from pytest_accelperf.provision.targets import (  # noqa: E402
    CHIPS,
    GIB,
    INSTALL,
    LIBTPU_ENV,
    NOT_RUN,
    captured_stderr,
    libtpu_environment,
    libtpu_missing,
    parse_target,
    provision_target,
)

P: Any = PartitionSpec  # untyped in jax
needs_libtpu = pytest.mark.skipif(
    importlib.util.find_spec("libtpu") is None,
    reason=f"compiles through libtpu, which is not installed: {INSTALL}")


# -- without libtpu ---------------------------------------------------------------------------
def test_a_target_names_a_chip_and_its_topology() -> None:
    target = parse_target(" TPU-v5e:2x4 ")
    assert (target.name, target.topology_name, target.n_devices, target.platform) == (
        "tpu-v5e:2x4", "v5e:2x4", 8, "tpu-v5e-x8")
    assert parse_target("tpu-v4:2x2x1").platform == "tpu-v4-x4"
    assert parse_target("tpu-v5p:2x2x2").platform == "tpu-v5p-x8"
    assert parse_target("tpu-v6e:4x4").platform == "tpu-v6e-x16"
    for bad, says in (("v5e:2x4", "tpu-<chip>:<topology>"), ("tpu-v9:2x4", "no TPU chip 'v9'"),
                      ("tpu-v5e:2x2x1", "2 dimensions"), ("tpu-v4:2x2", "3 dimensions"),
                      ("tpu-v5e:0x4", "at least 1 chip")):
        with pytest.raises(ValueError, match=f"invalid target '{bad}'") as info:
            parse_target(bad)
        assert says in str(info.value) and "\n" not in str(info.value)


def test_the_hbm_table_is_each_chips_documented_capacity() -> None:
    assert {name: chip.hbm_bytes // GIB for name, chip in CHIPS.items()} == {
        "v4": 32, "v5e": 16, "v5p": 95, "v6e": 32}
    for name, chip in CHIPS.items():
        assert chip.source.startswith(f"cloud.google.com/tpu/docs/{name}:")


def test_libtpu_environment_is_set_for_the_block_and_restored() -> None:
    env = {"PATH": "/bin", "TPU_WORKER_ID": "3"}  # the user's own value is kept
    with libtpu_environment(env):
        assert env == {"PATH": "/bin", **LIBTPU_ENV, "TPU_WORKER_ID": "3"}
    assert env == {"PATH": "/bin", "TPU_WORKER_ID": "3"}
    with pytest.raises(RuntimeError), libtpu_environment(env):
        raise RuntimeError("a compile that failed")
    assert env == {"PATH": "/bin", "TPU_WORKER_ID": "3"}


def test_what_is_written_to_descriptor_2_is_kept_off_the_terminal(
        capfd: pytest.CaptureFixture[str]) -> None:
    with captured_stderr() as log:
        os.write(2, b"E0000 common_lib.cc:554] unexpected worker hostname\n\nsecond\n")
    os.write(2, b"after\n")
    assert log.lines == ["E0000 common_lib.cc:554] unexpected worker hostname", "second"]
    assert capfd.readouterr().err == "after\n"
    assert log.summary("compiling").startswith("libtpu wrote 2 log line(s) while compiling")


#: A callback as XLA:TPU compiles it (libtpu 0.0.42, a compile-only v5e: jax.debug.callback
#: in a loss), trimmed: its operand sent to the host, a result received back.
TPU_CALLBACK_HLO = """
ENTRY %main (p: f32[]) -> f32[] {
  %p = f32[] parameter(0)
  %t = token[] after-all()
  %s = (f32[]{:T(128)}, u32[], token[]) send(%p, %t), channel_id=1, is_host_transfer=true
  %sd = token[] send-done(%s), channel_id=1, is_host_transfer=true
  %r = (f32[]{:T(128)}, u32[], token[]) recv(%sd), channel_id=2, is_host_transfer=true
  %rd = (f32[]{:T(128)}, token[]) recv-done(%r), channel_id=2, is_host_transfer=true
  ROOT %v = f32[] get-tuple-element(%rd), index=0
}
"""


def test_a_callback_in_a_tpu_program_is_a_host_callback() -> None:
    counts = read_hlo(TPU_CALLBACK_HLO)
    assert (counts.host_callbacks, counts.custom_calls) == (1, 0)
    assert counts.ops["send"] == counts.ops["recv"] == 1


def test_an_out_of_memory_names_whose_memory_plan_it_is() -> None:
    oom = {"required_bytes": 38229874136, "capacity_bytes": 16 * GIB, "planned_by": "XLA:CPU"}
    assert oom_sentence(oom) == "needs 35.60 GiB of 16.00 GiB (XLA:CPU's memory plan)"
    assert oom_sentence({**oom, "planned_by": None}) == "needs 35.60 GiB of 16.00 GiB"


def _hide_libtpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process as CI's, where the README's extras are installed and libtpu is not."""
    find = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "libtpu" else find(name, *a))


def test_without_libtpu_every_case_skips_with_the_install_line(
        suite: Suite, monkeypatch: pytest.MonkeyPatch) -> None:
    _hide_libtpu(monkeypatch)
    assert libtpu_missing("tpu-v5e:2x4") == (
        "--accelperf-target=tpu-v5e:2x4 compiles through libtpu, which is not installed: "
        "pip install 'pytest-accelperf[tpu-aot]'")
    suite.write()
    result = suite.run("--accelperf-target=tpu-v5e:2x4", "-rs")
    result.assert_outcomes(skipped=2)
    skips = [line for line in result.outlines if line.startswith("SKIPPED")]
    assert len(skips) == 1 and skips[0].endswith(
        "compiles through libtpu, which is not installed: pip install "
        "'pytest-accelperf[tpu-aot]'")


def test_a_case_for_a_tpu_only_skips_on_the_cpu_naming_the_target(suite: Suite) -> None:
    suite.write('''
        from tinytask import make_task
        from pytest_accelperf import cases

        @cases(backend="jax", batch=[16], accels=("tpu",))
        def test_tpu_only(accelperf):
            accelperf.train(make_task(accelperf.case))
    ''')
    result = suite.run("--accel=cpu", "-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["SKIPPED * case jax-nomesh-b16 runs on tpu, not --accel=cpu; "
                                 "pass --accel=tpu, or compile it for a TPU on this host with "
                                 "--accelperf-target=tpu-v5e:2x4 (docs/compile-targets.md)"])


@pytest.mark.parametrize(("args", "says"), [
    (("--accelperf-target=tpu-v9:2x4",), "no TPU chip 'v9'"),
    (("--accelperf-target=tpu-v5e:2x4", "--accel=gpu"), "drop one of them"),
    (("--accelperf-target=tpu-v5e:2x4", "--accelperf-compare=HEAD"), "cannot be combined"),
    (("--accelperf-target=tpu-v5e:2x4", "--accelperf-cluster=local"), "cannot be combined"),
])
def test_a_target_it_cannot_use_is_a_usage_error(suite: Suite, args: tuple[str, ...],
                                                  says: str) -> None:
    suite.write()
    result = suite.run(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    errors = [line for line in result.errlines if "ERROR" in line]
    assert len(errors) == 1 and says in errors[0], result.errlines


# -- with libtpu: real compiles for TPU topologies -------------------------------------------
M, K, N = 1024, 2048, 1024  # x: M x K over "data"; w: K x N over "model"


def matmul(spec: Any = None) -> JaxStep:
    """``loss = mean(x @ w)``, the state unchanged: one matmul of 2·M·K·N FLOPs, then a
    reduction of M·N; ``spec`` shards ``w`` (default ``P(None, "model")``)."""

    def step(state: dict[str, Any], batch: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        return state, {"loss": jnp.mean(batch["x"] @ state["w"])}

    return JaxStep(init=lambda key: {"w": jnp.zeros((K, N), jnp.float32)}, step=step,
                   make_batch=lambda i: {"x": np.zeros((M, K), np.float32)},
                   state_specs={"w": P(None, "model") if spec is None else spec})


@needs_libtpu
def test_each_chip_gets_its_hbm_and_key_and_the_environment_is_given_back() -> None:
    before = dict(os.environ)
    got = {}
    for name in ("tpu-v4:2x2x1", "tpu-v5e:2x4", "tpu-v5p:2x2x1", "tpu-v6e:2x4"):
        accel = provision_target(parse_target(name))
        got[name] = (accel.platform, accel.device_count, accel.memory_capacity // GIB,
                     accel.device_kind, accel.compile_only)
    assert got == {
        "tpu-v4:2x2x1": ("tpu-v4-x4", 4, 32, "TPU v4", "tpu-v4:2x2x1"),
        "tpu-v5e:2x4": ("tpu-v5e-x8", 8, 16, "TPU v5 lite", "tpu-v5e:2x4"),
        "tpu-v5p:2x2x1": ("tpu-v5p-x4", 4, 95, "TPU v5", "tpu-v5p:2x2x1"),
        "tpu-v6e:2x4": ("tpu-v6e-x8", 8, 32, "TPU v6 lite", "tpu-v6e:2x4")}
    assert dict(os.environ) == before


SIGPROF_AFTER_A_TARGET = """
import os, signal, time
from pytest_accelperf.provision.accel import prepare_environment
prepare_environment("cpu", 8)
from pytest_accelperf.provision.targets import parse_target, provision_target
provision_target(parse_target("tpu-v5e:2x4"))
timers = open(f"/proc/{os.getpid()}/timers").read().count("signal: 27/")
signal.signal(signal.SIGPROF, signal.getsignal(signal.SIGPROF))  # Lightning's teardown
t0 = time.process_time()
while time.process_time() - t0 < 1.5:
    pass
print(timers, "alive")
"""


@needs_libtpu
def test_a_handler_restored_after_libtpu_keeps_its_sigprof_ignored() -> None:
    """libtpu's threads carry CPU timers that send SIGPROF, ignored beneath Python, which
    still saw the default: Lightning's Trainer restores every handler Python reports at the
    end of fit, and an xdist worker that had run this module's tests died in its next
    Lightning case ("Profiling timer expired", exit 155). Python now sees the ignore."""
    out = subprocess.run([sys.executable, "-c", SIGPROF_AFTER_A_TARGET], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, (out.returncode, out.stderr[-2000:])
    timers, alive = out.stdout.split()
    assert int(timers) > 0 and alive == "alive"  # libtpu's timers were there to fire


@needs_libtpu
def test_a_matmul_for_v5e_counts_2mkn_over_the_mesh_and_its_shards_bytes() -> None:
    accel = provision_target(parse_target("tpu-v5e:2x4"))
    before = dict(os.environ)
    case = Case(backend="jax", batch=M, mesh=(4, 2))
    run = BACKEND.train(case, matmul(), accel).run
    assert dict(os.environ) == before
    assert run.outcome == "ok" and run.compile_only == "tpu-v5e:2x4"
    assert run.step_times == [] and run.losses == [] and run.params_fingerprint == {}
    program = run.program or {}
    flops = 2 * M * K * N
    # The model's count (unpartitioned) and what the 8 devices execute, each a 1/8 share:
    # the reduction of M·N and the mean's division are 0.02 % more.
    assert program["flops"] == pytest.approx(flops, rel=1e-3)
    assert program["hardware_flops"] / 8 == pytest.approx(flops / 8, rel=1e-3)
    plan = run.details["memory_plan"]
    # One device's arguments: its w shard (K x N/2) and x shard (M/4 x K), float32.
    assert plan["argument_bytes"] == 4 * (K * N // 2 + M // 4 * K)
    assert run.memory_per_device == {f"tpu:{i}": plan["required_bytes"] for i in range(8)}
    assert "all-reduce" in program["collectives"]  # the mean over the sharded product
    assert run.details["planned_by"] == "XLA:TPU"


@needs_libtpu
def test_a_callback_left_in_the_loss_is_one_in_the_tpu_program() -> None:
    accel = provision_target(parse_target("tpu-v5e:2x4"))
    case = Case(backend="jax", batch=M, mesh=(4, 2))

    def step(state: dict[str, Any], batch: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        loss = jnp.mean(batch["x"] @ state["w"])
        jax.debug.callback(lambda v: None, loss)
        return state, {"loss": loss}

    plain = matmul()
    with_callback = JaxStep(init=plain.init, step=step, make_batch=plain.make_batch,
                            state_specs=plain.state_specs)
    counts = [(BACKEND.train(case, s, accel).run.program or {})["host_callbacks"]
              for s in (plain, with_callback)]
    assert counts == [0, 1]


def big(gib: float) -> JaxStep:
    """A state of ``gib`` GiB of float32, decayed in place: never allocated, only compiled."""
    n = int(gib * GIB / 4 / 1024)

    def step(state: dict[str, Any], batch: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        return {"w": state["w"] * 0.99}, {"loss": jnp.mean(batch["x"]) + state["w"][0, 0]}

    return JaxStep(init=lambda key: {"w": jnp.zeros((n, 1024), jnp.float32)}, step=step,
                   make_batch=lambda i: {"x": np.zeros((8, 128), np.float32)})


@needs_libtpu
def test_a_program_larger_than_a_v5e_s_hbm_is_out_of_memory_and_fits_a_v6e() -> None:
    case = Case(backend="jax", batch=8)
    v5e = BACKEND.train(case, big(20), provision_target(parse_target("tpu-v5e:2x2"))).run
    # XLA:TPU refuses it itself, with its own capacity (15.75 GiB of the v5e's 16 GiB).
    assert v5e.outcome == "oom" and v5e.oom is not None
    assert v5e.oom["source"] == "compiler" and v5e.oom["planned_by"] == "XLA:TPU"
    assert 20 * GIB <= v5e.oom["required_bytes"] < 21 * GIB
    assert 15 * GIB < v5e.oom["capacity_bytes"] <= 16 * GIB
    v6e_accel = provision_target(parse_target("tpu-v6e:2x2"))
    v6e = BACKEND.train(case, big(20), v6e_accel).run
    assert v6e.outcome == "ok" and v6e.oom is None
    assert 20 * GIB <= v6e.peak_memory < 32 * GIB  # judged against the v6e's 32 GiB
    # A suite's declared capacity below the chip's is the one judged against.
    declared = Case(backend="jax", batch=8, memory_capacity=16 * GIB)
    oom = BACKEND.train(declared, big(20), v6e_accel).run
    assert oom.outcome == "oom" and oom.oom is not None
    assert oom.oom["capacity_bytes"] == 16 * GIB and oom.oom["source"] == "memory_analysis"
    assert oom.message.endswith("; XLA:TPU's memory plan)")


TARGET_SUITE = '''
import os

import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from pytest_accelperf import cases
from pytest_accelperf.jax import JaxStep

D = 512


def mlp():
    """relu(x @ w1) @ w2, Megatron-sharded over "model" (LOST_SPEC: w2 replicated)."""
    def loss(p, b):
        return jnp.mean((jnp.maximum(b["x"] @ p["w1"], 0) @ p["w2"] - b["y"]) ** 2)

    def step(p, b):
        import jax
        value, grads = jax.value_and_grad(loss)(p, b)
        return jax.tree.map(lambda w, g: w - 0.01 * g, p, grads), {"loss": value}

    w2 = P() if os.environ.get("LOST_SPEC") else P("model", None)
    return JaxStep(init=lambda key: {"w1": jnp.ones((D, D)) * 0.01, "w2": jnp.ones((D, D)) * 0.01},
                   step=step, state_specs={"w1": P(None, "model"), "w2": w2},
                   make_batch=lambda i: {"x": np.ones((64, D), np.float32),
                                         "y": np.ones((64, D), np.float32)})


@cases(backend="jax", mesh=[(4, 2)], batch=[64])
def test_mlp(accelperf):
    result = accelperf.train(mlp())
    assert result.run.outcome == "ok"
    if os.environ.get("READ_LOSSES"):
        print(result.run.losses)
'''


@needs_libtpu
def test_a_suite_gates_the_tpu_program_and_names_what_it_did_not_run(suite: Suite) -> None:
    suite.write(TARGET_SUITE)
    first = suite.run("--accelperf-target=tpu-v5e:2x4", "--accelperf-update")
    first.assert_outcomes(passed=1)
    block = suite.load(platform="tpu-v5e-x8")["cases"]["test_mlp[jax-mesh4x2-b64]"]
    assert block["environment"]["platform"] == "tpu-v5e-x8"
    assert block["environment"]["device_kind"] == "TPU v5 lite"
    assert "libtpu" in block["environment"]["packages"]
    assert "step_time" not in block and "loss" not in block and "numerics" not in block
    assert not suite.baseline_path(platform="cpu-x8").exists()

    again = suite.run("--accelperf-target=tpu-v5e:2x4", "--accelperf-json=report.json")
    again.assert_outcomes(passed=1)
    again.stdout.fnmatch_lines([
        "test_mlp[[]jax-mesh4x2-b64[]]  outcome (compile-only tpu-v5e:2x4) * pass",
        f"*{', '.join(NOT_RUN)} * not run",
        "*program *pass", "*memory (memory_analysis) *pass"])
    got = verdicts(suite.report())["test_mlp[jax-mesh4x2-b64]"]
    assert got == {"outcome": "pass", "compile": "pass", "program": "pass", "memory": "pass"}
    # Throughput is named once, in the row that says it did not run: never a verdict.
    assert [line.split()[-2:] for line in again.outlines if "throughput" in line] == [
        ["not", "run"]]


@needs_libtpu
def test_a_lost_sharding_spec_fails_naming_the_collective_it_changed(
        suite: Suite, monkeypatch: pytest.MonkeyPatch) -> None:
    suite.write(TARGET_SUITE)
    suite.run("--accelperf-target=tpu-v5e:2x4", "--accelperf-update").assert_outcomes(passed=1)
    monkeypatch.setenv("LOST_SPEC", "1")
    result = suite.run("--accelperf-target=tpu-v5e:2x4")
    result.assert_outcomes(failed=1)
    # w2 replicated over "model": the TPU program gathers the hidden activations instead
    # of reducing the product (all-gather 0 -> 2, all-reduce 2 -> 1), and computes more.
    result.stdout.fnmatch_lines([
        "*: 2 regression(s) against the tpu-v5e-x8 baseline:",
        "  program: hardware FLOPs +*; all-gather: 0 → 2 per step (+*); "
        "all-reduce: 2 → 1 per step (-*)*",
        "  memory: peak memory on tpu:0 is *"])
    result.stdout.fnmatch_lines([
        "*pytest 'test_suite.py::test_mlp[[]jax-mesh4x2-b64[]]' --accelperf-target=tpu-v5e:2x4 "
        "--accelperf-update"])


@needs_libtpu
def test_a_test_that_reads_what_only_steps_give_is_skipped_naming_it(
        suite: Suite, monkeypatch: pytest.MonkeyPatch) -> None:
    suite.write(TARGET_SUITE)
    monkeypatch.setenv("READ_LOSSES", "1")
    result = suite.run("--accelperf-target=tpu-v5e:2x4", "--accelperf-update", "-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines([
        "SKIPPED [[]1[]] test_suite.py:*: jax-mesh4x2-b64: the test asks for run.losses, which "
        "only executed steps "
        "give: compile-only (tpu-v5e:2x4): compiled for the target, no step executed; *"])
    # The gate ran and recorded before the test read what was not there.
    assert suite.load(platform="tpu-v5e-x8")["cases"]


@needs_libtpu
def test_libtpu_writes_nothing_to_the_terminal(tmp_path: Any) -> None:
    script = tmp_path / "compile.py"
    script.write_text(textwrap.dedent('''
        import os
        os.environ["JAX_PLATFORMS"] = "cpu"
        import jax.numpy as jnp
        import numpy as np
        from jax.sharding import PartitionSpec as P
        from pytest_accelperf.backends.jax.backend import BACKEND
        from pytest_accelperf.jax import JaxStep
        from pytest_accelperf.collect.cases import Case
        from pytest_accelperf.provision.targets import LIBTPU_ENV, parse_target, provision_target

        step = JaxStep(init=lambda key: {"w": jnp.zeros((256, 256))},
                       step=lambda s, b: (s, {"loss": jnp.mean(b["x"] @ s["w"])}),
                       make_batch=lambda i: {"x": np.zeros((64, 256), np.float32)},
                       state_specs={"w": P(None, "model")})
        import jax
        jax.devices()  # jax's own start (with libtpu installed it sets TPU_SKIP_MDS_QUERY)
        before = dict(os.environ)
        accel = provision_target(parse_target("tpu-v5e:2x4"))
        run = BACKEND.train(Case(backend="jax", batch=64, mesh=(4, 2)), step, accel).run
        print(run.outcome, dict(os.environ) == before)
    '''))
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    for key in LIBTPU_ENV:
        env.pop(key, None)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          env=env, cwd=root, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok True"
    assert done.stderr == ""


def test_jax_sees_the_cpu_after_a_target_was_provisioned() -> None:
    """A target's devices are compile-only: the host's own CPU devices stay jax's."""
    assert jax.devices()[0].platform == "cpu"
