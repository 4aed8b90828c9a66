"""The JAX backend's program record and leak reading, on real compiled programs.

Each test trains (or compiles) a tiny step on 8 virtual CPU devices and checks what
:mod:`pytest_accelperf.backends.jax.hlo` read from XLA's cost analysis and optimized
HLO: FLOPs against a count made by hand (2·m·n·k per matmul, forward and backward), the
collectives a sharding change adds or removes, a host callback left in the loss, a matmul
precision change, and that an unchanged program reads the same twice. The leak reading
(``Run.memory_growth``) and the compile time of the init are checked on the same runs.
"""

from __future__ import annotations

from typing import Any

from pytest_accelperf.provision.accel import prepare_environment

# Before jax is imported anywhere: 8 virtual CPU devices for the (4, 2) and (8, 1) meshes.
prepare_environment("cpu", 8)

import pytest  # noqa: E402

# The JAX backend's own frameworks (pip install 'pytest-accelperf[jax]').
pytest.importorskip("flax")
pytest.importorskip("optax")
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec  # noqa: E402

from pytest_accelperf.backends.jax.backend import BACKEND  # noqa: E402
from pytest_accelperf.backends.jax.hlo import program_of, read_hlo, shape_bytes  # noqa: E402
from pytest_accelperf.collect.cases import Case  # noqa: E402
from pytest_accelperf.jax import JaxStep  # noqa: E402
from pytest_accelperf.provision.accel import Accelerator, provision  # noqa: E402
from pytest_accelperf.records.program import changes, describe_changes  # noqa: E402
from pytest_accelperf.records.run import Run  # noqa: E402

P: Any = PartitionSpec  # untyped in jax
TOL = 0.02  # the program check's default tolerance on amounts
B, D = 64, 256  # the MLP: batch, width (two D x D layers)
LEAK = 33_000  # float32 elements a leaking make_batch keeps per step (132,000 bytes)


@pytest.fixture(scope="module")
def accel() -> Accelerator:
    return provision("cpu", 8)


def mlp(spec: Any = None, *, extra: bool = False, callback: bool = False,
        precision: str | None = None, leak: list[Any] | None = None) -> JaxStep:
    """``relu(x @ w1) @ w2`` against a target, plain SGD. ``extra``: one more ``@ w2`` in
    the loss; ``callback``: a ``jax.debug.callback`` left in it; ``precision``: the step
    traced under ``jax.default_matmul_precision``; ``leak``: ``make_batch`` keeps a fresh
    device array in it every step (what a leaking data pipeline does)."""
    spec = P() if spec is None else spec

    def init(key: Any) -> dict[str, Any]:
        k1, k2 = jax.random.split(key)
        return {"w1": jax.random.normal(k1, (D, D)) * 0.05,
                "w2": jax.random.normal(k2, (D, D)) * 0.05}

    def loss(p: dict[str, Any], b: dict[str, Any]) -> Any:
        h = jax.nn.relu(b["x"] @ p["w1"])
        if extra:
            h = h @ p["w2"]
        y = h @ p["w2"]
        if callback:
            jax.debug.callback(lambda v: None, y.sum())
        return jnp.mean((y - b["y"]) ** 2)

    def step(p: dict[str, Any], b: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        if precision:
            with jax.default_matmul_precision(precision):
                value, grads = jax.value_and_grad(loss)(p, b)
        else:
            value, grads = jax.value_and_grad(loss)(p, b)
        return jax.tree.map(lambda w, g: w - 0.01 * g, p, grads), {"loss": value}

    def make_batch(i: int) -> dict[str, np.ndarray]:
        if leak is not None:
            leak.append(jnp.ones(LEAK, jnp.float32))
        r = np.random.default_rng(i)
        return {"x": r.normal(size=(B, D)).astype(np.float32),
                "y": r.normal(size=(B, D)).astype(np.float32)}

    return JaxStep(init=init, step=step, make_batch=make_batch,
                   state_specs={"w1": spec, "w2": spec})


def train(accel: Accelerator, mesh: tuple[int, ...] | None, step: JaxStep,
          batch: int = B, steps: int = 3, warmup: int = 1) -> Run:
    case = Case(backend="jax", batch=batch, mesh=mesh, steps=steps, warmup=warmup)
    run = BACKEND.train(case, step, accel).run
    assert run.outcome == "ok", run.message
    assert run.program is not None
    return run


def program(run: Run) -> dict[str, Any]:
    assert run.program is not None
    return run.program


# The MLP's runs, shared: no mesh, data-parallel 8x1, 4x2 replicated, 4x2 with both
# parameters split over "model" (columns).
@pytest.fixture(scope="module")
def nomesh(accel: Accelerator) -> Run:
    return train(accel, None, mlp())


@pytest.fixture(scope="module")
def dp8(accel: Accelerator) -> Run:
    return train(accel, (8, 1), mlp())


@pytest.fixture(scope="module")
def replicated(accel: Accelerator) -> Run:
    return train(accel, (4, 2), mlp())


@pytest.fixture(scope="module")
def sharded(accel: Accelerator) -> Run:
    return train(accel, (4, 2), mlp(P(None, "model")))


# -- analytic FLOPs ---------------------------------------------------------------------------
def matmul(m: int, n: int, k: int) -> int:
    return 2 * m * n * k


def mlp_model_flops(extra: bool = False) -> int:
    """Forward, and backward at twice the forward (the gradients of both operands), but
    for ``x @ w1``: ``x`` is data, so only ``w1``'s gradient is computed."""
    layers = 2 if extra else 1  # the matmuls by w2
    return 2 * matmul(B, D, D) + layers * 3 * matmul(B, D, D)


def mlp_hardware_flops(model_copies: int, param_copies: int) -> int:
    """What all devices do: the matmuls on ``model_copies`` devices each (the batch is
    split over ``data``; a replica over ``model`` repeats them), and the SGD update
    (``w - lr * g``: 2 flops a parameter) on every device holding a parameter."""
    return model_copies * mlp_model_flops() + 2 * (2 * D * D) * param_copies


def near(value: Any, expected: float, rel: float = 0.05) -> bool:
    return isinstance(value, float) and abs(value / expected - 1) <= rel


@pytest.mark.parametrize(("which", "model_copies", "param_copies"), [
    ("nomesh", 1, 1),
    ("dp8", 1, 8),  # the parameters (and their update) on all 8 devices
    ("replicated", 2, 8),  # each matmul on both devices of "model"
    ("sharded", 1, 4),  # columns split over "model": each parameter on 4 devices
])
def test_mlp_flops_match_the_analytic_count(request: pytest.FixtureRequest, which: str,
                                            model_copies: int, param_copies: int) -> None:
    """Model FLOPs are the analytic count on every mesh (the same number: the
    unpartitioned program); hardware FLOPs count the work the mesh repeats."""
    prog = program(request.getfixturevalue(which))
    assert near(prog["flops"], mlp_model_flops()), (prog["flops"], mlp_model_flops())
    assert prog["flops"] == program(request.getfixturevalue("nomesh"))["flops"]
    hardware = mlp_hardware_flops(model_copies, param_copies)
    assert near(prog["hardware_flops"], hardware), (prog["hardware_flops"], hardware)
    assert prog["bytes_accessed"] > 0


BLOCK = {"batch": 8, "seq": 32, "dim": 128, "heads": 4, "ff": 512}


def transformer_block() -> JaxStep:
    """One pre-residual attention + GELU MLP block, Megatron-sharded: q, k, v and the MLP's
    first matrix split by columns over ``model``, the output projections by rows."""
    b, s, d, h, f = (BLOCK[k] for k in ("batch", "seq", "dim", "heads", "ff"))
    shapes = {"wq": (d, d), "wk": (d, d), "wv": (d, d), "wo": (d, d), "w_in": (d, f),
              "w_out": (f, d)}

    def init(key: Any) -> dict[str, Any]:
        keys = jax.random.split(key, len(shapes))
        return {n: jax.random.normal(k, shape) * 0.02
                for k, (n, shape) in zip(keys, shapes.items(), strict=True)}

    def loss(p: dict[str, Any], batch: dict[str, Any]) -> Any:
        x = batch["x"]

        def heads(t: Any) -> Any:
            return t.reshape(t.shape[0], s, h, d // h)

        q, k, v = heads(x @ p["wq"]), heads(x @ p["wk"]), heads(x @ p["wv"])
        att = jax.nn.softmax(jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(d // h), axis=-1)
        y = x + jnp.einsum("bhqk,bkhd->bqhd", att, v).reshape(x.shape) @ p["wo"]
        y = y + jax.nn.gelu(y @ p["w_in"]) @ p["w_out"]
        return jnp.mean((y - batch["y"]) ** 2)

    def step(p: dict[str, Any], batch: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        value, grads = jax.value_and_grad(loss)(p, batch)
        return jax.tree.map(lambda w, g: w - 0.01 * g, p, grads), {"loss": value}

    def make_batch(i: int) -> dict[str, np.ndarray]:
        r = np.random.default_rng(i)
        return {"x": r.normal(size=(b, s, d)).astype(np.float32),
                "y": r.normal(size=(b, s, d)).astype(np.float32)}

    col, row = P(None, "model"), P("model", None)
    return JaxStep(init=init, step=step, make_batch=make_batch,
                   state_specs={"wq": col, "wk": col, "wv": col, "wo": row, "w_in": col,
                                "w_out": row})


def test_transformer_block_flops_match_the_analytic_count(accel: Accelerator) -> None:
    b, s, d, f = (BLOCK[k] for k in ("batch", "seq", "dim", "ff"))
    tokens = b * s
    qkv = 3 * matmul(tokens, d, d)  # x is data: forward and the weights' gradient only
    attention = 2 * matmul(b * s, s, d)  # q·kᵀ and att·v, all heads
    rest = matmul(tokens, d, d) + matmul(tokens, d, f) + matmul(tokens, f, d)
    model = 2 * qkv + 3 * (attention + rest)
    run = train(accel, (4, 2), transformer_block(), batch=b, steps=2)
    prog = program(run)
    assert near(prog["flops"], model), (prog["flops"], model)
    # Megatron sharding: no matmul is repeated on the model axis; the SGD update runs on
    # the 4 devices holding each parameter.
    params = 4 * d * d + 2 * d * f
    assert near(prog["hardware_flops"], model + 2 * params * 4), prog["hardware_flops"]
    # Row-parallel outputs are summed over "model": forward and backward all-reduces.
    assert prog["collectives"]["all-reduce"]["count"] >= 2


# -- changes between two programs -------------------------------------------------------------
def test_an_extra_matmul_is_named_as_more_flops(accel: Accelerator, nomesh: Run) -> None:
    base, now = program(nomesh), program(train(accel, None, mlp(extra=True)))
    found = {c.name: c for c in changes(base, now, TOL)}
    assert "flops" in found and found["flops"].more
    assert near(found["flops"].ratio, mlp_model_flops(extra=True) / mlp_model_flops())
    lines = describe_changes(base, now, TOL)
    assert lines[0].startswith("FLOPs +"), lines
    assert now["ops"]["dot"] > base["ops"]["dot"]
    assert any(line.startswith("ops: dot ") for line in lines), lines


def test_a_debug_callback_in_the_loss_is_a_host_callback(accel: Accelerator,
                                                         replicated: Run) -> None:
    """XLA:CPU runs ``jax.debug.callback`` as a custom-call to
    ``xla_ffi_python_cpu_callback`` inside a conditional on partition 0: one a step."""
    base, now = program(replicated), program(train(accel, (4, 2), mlp(callback=True)))
    assert base["host_callbacks"] == 0
    assert now["host_callbacks"] == 1
    assert now["custom_calls"] == base["custom_calls"]  # a callback is not a custom call
    assert now["ops"]["custom-call[xla_ffi_python_cpu_callback]"] == 1
    assert [c.name for c in changes(base, now, TOL)] == ["host_callbacks"]
    assert "host callbacks: 0 → 1 per step" in describe_changes(base, now, TOL)


def test_a_parameter_losing_its_sharding_changes_the_collectives(sharded: Run,
                                                                 replicated: Run) -> None:
    """Columns split over ``model`` (baseline) against replicated (now), 4x2 mesh.

    Split: ``h`` (``B/4 x D/2`` a device) is all-gathered over ``model`` before ``@ w2``,
    and the gradient all-reduces carry half of each parameter. Replicated: no all-gather,
    one all-reduce of the whole gradient (and the loss), and every matmul done twice."""
    base, now = program(sharded), program(replicated)
    assert base["collectives"]["all-gather"] == {"count": 1, "bytes": B // 4 * D * 4}
    assert "all-gather" not in now["collectives"]
    assert now["collectives"]["all-reduce"] == {"count": 1, "bytes": 2 * D * D * 4 + 4}
    assert base["collectives"]["all-reduce"]["count"] == 2
    # half of each gradient, the backward's partial sums of dh, the loss
    assert 2 * D * (D // 2) * 4 < base["collectives"]["all-reduce"]["bytes"] < 2 * D * D * 4
    found = {c.name: c for c in changes(base, now, TOL)}
    assert {"collectives.all-gather.count", "collectives.all-reduce.count",
            "hardware_flops"} <= set(found)
    assert near(found["hardware_flops"].ratio, 2.0)  # every matmul on both "model" devices
    assert "flops" not in found  # the model did not change
    lines = describe_changes(base, now, TOL)
    assert "all-gather: 1 → 0 per step (-16.00 KiB)" in lines, lines
    assert any(line.startswith("all-reduce: 2 → 1 per step (+") for line in lines), lines
    assert "FLOPs +0.0%" in lines


def test_matmul_precision_is_a_gated_change_of_the_ops(accel: Accelerator,
                                                      nomesh: Run) -> None:
    """``jax.default_matmul_precision("highest")``: XLA:CPU keeps ``operand_precision=
    {highest,highest}`` on its dots (fused ones included), so every dot turns into
    ``dot[highest]``. The cost model counts the same FLOPs; the precision change is gated
    by itself (more ``dot[highest]``: a regression)."""
    base = program(nomesh)
    now = program(train(accel, None, mlp(precision="highest")))
    dots = base["ops"]["dot"]
    assert dots >= 5 and "dot[highest]" not in base["ops"]  # 2 forward, 3 backward
    assert now["ops"].get("dot", 0) == 0 and now["ops"]["dot[highest]"] == dots
    found = changes(base, now, TOL)
    assert [(c.name, c.baseline, c.now) for c in found] == [("ops.dot[highest]", 0, dots)]
    assert found[0].more
    assert describe_changes(base, now, TOL) == [
        f"dot[highest] (matmul precision): 0 → {dots} per step", "FLOPs +0.0%",
        f"ops: dot {dots} → 0, dot[highest] 0 → {dots}"]


def test_the_same_program_reads_the_same_twice(accel: Accelerator, replicated: Run) -> None:
    again = train(accel, (4, 2), mlp())
    assert changes(program(replicated), program(again), 0.0) == []
    assert program(again) == program(replicated)
    assert describe_changes(program(replicated), program(again), 0.0) == []


# -- the loop counts, the parser's edges -------------------------------------------------------
def test_collectives_in_a_loop_count_per_iteration(accel: Accelerator) -> None:
    """A ``lax.scan`` of 5 row-parallel matmuls: XLA knows the trip count
    (``known_trip_count``), and the body's all-reduce counts 5 times."""
    mesh = accel.mesh((4, 2))
    x_sh, w_sh = NamedSharding(mesh, P("data", "model")), NamedSharding(mesh, P("model"))

    def f(w: Any, x: Any) -> Any:
        def body(c: Any, _: Any) -> tuple[Any, None]:
            return jax.lax.with_sharding_constraint(jnp.tanh(c @ w), x_sh), None
        return jax.lax.scan(body, x, None, length=5)[0]

    jitted = jax.jit(f, in_shardings=(w_sh, x_sh), out_shardings=x_sh)
    lowered = jitted.lower(jax.ShapeDtypeStruct((32, 32), jnp.float32),
                           jax.ShapeDtypeStruct((64, 32), jnp.float32))
    compiled = lowered.compile()
    assert '"known_trip_count":{"n":"5"}' in compiled.as_text()
    counts = read_hlo(compiled.as_text())
    # the partial product (16 x 32 floats a device) summed over "model", each iteration
    assert counts.collectives == {"all-reduce": {"count": 5, "bytes": 5 * 16 * 32 * 4}}
    assert counts.unknown_trip_counts == 0
    assert counts.ops["all-reduce"] == 1  # the histogram is static
    record = program_of(lowered, compiled, 8)
    assert record["collectives"] == counts.collectives


def _scanned(length: int, inner: int = 0) -> Any:
    """``length`` iterations of ``tanh(c @ w)`` (each of ``inner`` iterations, nested)."""
    def step(c: Any, w: Any) -> Any:
        return jnp.tanh(c @ w)

    def f(x: Any, w: Any) -> Any:
        def body(c: Any, _: Any) -> tuple[Any, None]:
            if inner:
                return jax.lax.scan(lambda d, _: (step(d, w), None), c, None,
                                    length=inner)[0], None
            return step(c, w), None
        return jax.lax.scan(body, x, None, length=length)[0]
    return f


def _record(f: Any) -> dict[str, Any]:
    x, w = jnp.ones((32, 64)), jnp.ones((64, 64))
    lowered = jax.jit(f).lower(x, w)
    record: dict[str, Any] = dict(program_of(lowered, lowered.compile(), 1))
    return record


def test_a_loop_body_counts_once_per_iteration() -> None:
    """XLA's cost analysis counts a ``while`` body once: a ``lax.scan`` of 10 matmuls
    cost one (67 MFLOP for 671, seen on Flax's seq2seq LSTM: 1.69 GFLOP a step for
    12.46). Counted per iteration, the scan, the same matmuls unrolled and the analytic
    count agree, nested loops and a static ``fori_loop`` too; more iterations are more
    FLOPs (a change of the trip count changed no amount before)."""
    matmul = 2 * 32 * 64 * 64
    unrolled = _record(lambda x, w: jax.lax.fori_loop(0, 10, lambda i, c: jnp.tanh(c @ w), x,
                                                      unroll=True))
    assert "loops" not in unrolled
    assert unrolled["flops"] == pytest.approx(10 * matmul, rel=0.01)
    for f, loops in ((_scanned(10), 1), (_scanned(2, inner=5), 2),
                     (lambda x, w: jax.lax.fori_loop(0, 10, lambda i, c: jnp.tanh(c @ w), x),
                      1)):
        record = _record(f)
        assert record["loops"] == loops
        for amount in ("flops", "hardware_flops"):  # the lowered and the compiled program
            assert record[amount] == pytest.approx(unrolled[amount], rel=0.01), amount
        assert record["bytes_accessed"] >= unrolled["bytes_accessed"]
    longer = _record(_scanned(20))
    assert longer["flops"] == pytest.approx(20 * matmul, rel=0.01)
    assert describe_changes(_record(_scanned(10)), longer, TOL)[0].startswith("FLOPs +100.0%")


def test_a_loop_of_unknown_trip_count_counts_once() -> None:
    """A ``while_loop`` on data: its trip count is not known, its body counted once, and
    the record does not claim to count it per iteration."""
    def f(x: Any, w: Any) -> Any:
        return jax.lax.while_loop(lambda c: c.sum() < 1e9, lambda c: jnp.tanh(c @ w) + c, x)
    record = _record(f)
    assert "loops" not in record
    assert record["flops"] == pytest.approx(2 * 32 * 64 * 64, rel=0.05)


def test_a_counter_that_steps_by_two_is_not_read_as_a_scan() -> None:
    """``while_loop`` from 0 while below 10, stepping by 2: 5 iterations, which XLA knows
    in the compiled program (the hardware FLOPs); the lowered program's pattern is not a
    scan's, so the model's FLOPs are not counted 10 times (they stay XLA's, once)."""
    def f(x: Any, w: Any) -> Any:
        return jax.lax.while_loop(lambda c: c[0] < 10,
                                  lambda c: (c[0] + 2, jnp.tanh(c[1] @ w)), (0, x))[1]
    record = _record(f)
    matmul = 2 * 32 * 64 * 64
    assert record["hardware_flops"] == pytest.approx(5 * matmul, rel=0.01)
    assert record["flops"] == pytest.approx(matmul, rel=0.01)


def test_async_collectives_count_once_at_their_done() -> None:
    """XLA:CPU prints no async collectives; GPU's form (written here by hand): a
    ``-start`` whose shape is (operand, result), its ``-done`` the result."""
    text = """HloModule m, entry_computation_layout={(f32[8,32]{1,0})->f32[32,32]{1,0}}

ENTRY %main (p: f32[8,32]) -> f32[32,32] {
  %p = f32[8,32]{1,0} parameter(0)
  %all-gather-start = (f32[8,32]{1,0}, f32[32,32]{1,0}) all-gather-start(%p), channel_id=1, replica_groups={{0,1,2,3}}, dimensions={0}
  %all-gather-done = f32[32,32]{1,0} all-gather-done(%all-gather-start)
  %ar-start = bf16[32,32]{1,0} all-reduce-start(%all-gather-done), channel_id=2, to_apply=%add
  ROOT %ar-done = bf16[32,32]{1,0} all-reduce-done(%ar-start), metadata={op_name="calls=%x"}
}
"""  # noqa: E501
    counts = read_hlo(text)
    assert counts.collectives == {"all-gather": {"count": 1, "bytes": 32 * 32 * 4},
                                  "all-reduce": {"count": 1, "bytes": 32 * 32 * 2}}


@pytest.mark.parametrize("text", ["", "not hlo at all {\n  %x = ???\n}", "ENTRY %m (", "}}}"])
def test_unknown_text_reads_as_nothing(text: str) -> None:
    counts = read_hlo(text)
    assert counts.collectives == {} and counts.host_callbacks == 0 and counts.ops == {}


def test_a_program_that_cannot_be_read_records_only_its_source() -> None:
    class Broken:
        def cost_analysis(self) -> Any:
            raise RuntimeError("no cost model")

        def as_text(self) -> Any:
            raise RuntimeError("no text")

    assert program_of(Broken(), Broken(), 8) == {"source": "xla"}


def test_shape_bytes() -> None:
    assert shape_bytes("f32[16,32]{1,0}") == 2048
    assert shape_bytes("(f32[], bf16[4,4]{1,0}, pred[3])") == 4 + 32 + 3
    assert shape_bytes("f32[<=16,2]") == 128
    assert shape_bytes("token[]") == 0 and shape_bytes("()") == 0


# -- leak reading, compile time ----------------------------------------------------------------
@pytest.mark.parametrize("which", ["nomesh", "replicated", "sharded"])
def test_a_normal_step_does_not_grow(request: pytest.FixtureRequest, which: str) -> None:
    run: Run = request.getfixturevalue(which)
    growth = run.memory_growth
    assert growth is not None and growth["source"] == "live_arrays"
    assert growth["steps"] == 3
    assert growth["bytes_per_step"] == 0
    # what stays live: the state (the two D x D parameters) on every device holding it
    copies = {"nomesh": 1, "replicated": 8, "sharded": 4}[which]
    assert growth["after_warmup"] >= 2 * D * D * 4 * copies


@pytest.mark.parametrize(("mesh", "warmup"), [(None, 1), ((4, 2), 0)])
def test_a_leaking_step_grows_by_what_it_keeps(accel: Accelerator,
                                               mesh: tuple[int, ...] | None,
                                               warmup: int) -> None:
    kept: list[Any] = []
    run = train(accel, mesh, mlp(leak=kept), steps=4, warmup=warmup)
    growth = run.memory_growth
    assert growth is not None
    assert growth["bytes_per_step"] == pytest.approx(LEAK * 4, rel=0.01)
    assert growth["after_steps"] - growth["after_warmup"] == pytest.approx(4 * LEAK * 4,
                                                                           rel=0.01)


def test_compile_time_includes_the_init(nomesh: Run, sharded: Run) -> None:
    for run in (nomesh, sharded):
        parts = run.compile_time_parts
        assert parts is not None
        assert set(parts) == {"step", "init"}
        assert parts["step"] > 0 and parts["init"] > 0
        assert run.compile_time == pytest.approx(parts["step"] + parts["init"])
        # what the rest of the machine used while the step compiled (Linux: /proc)
        load = run.compile_load
        assert load is not None and load.foreign_cores >= 0 and load.seconds > 0


def test_a_ready_state_compiles_its_copy(accel: Accelerator) -> None:
    """A state given ready (not a function of a key) is copied onto its shardings by a
    compiled copy: that compile is the init's part."""
    step = mlp()
    step.init = step.init(jax.random.key(0))
    run = train(accel, (4, 2), step)
    assert run.compile_time_parts is not None and run.compile_time_parts["init"] > 0
    assert run.memory_growth is not None and run.memory_growth["bytes_per_step"] == 0
