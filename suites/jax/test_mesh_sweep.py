"""The JAX mesh sweep of seed 000 (a character-level LM on TPU), scaled to run on CPU.

The seed trains over no mesh / mesh 4x2 / mesh 8x1 at batch 128, 1024 and 4096 and runs
out of HBM at batch 4096 without a mesh ("Used 20.93G of 15.48G hbm"). Here the grid is
the same shape at batch 16/64/256 (the seed's /8, /16, /16: seconds per case on 8 virtual
CPU devices), and the out-of-memory case keeps its full size: the model at batch 4096 on
one device is compiled, not run, against the 16 GiB the seed's TPU had. That verdict is
XLA:CPU's memory plan (35.6 GiB), not a TPU's: the TPU compiler plans 13.14 GiB for the
same step, which fits (``test_mesh_sweep_tpu.py``, ``--accelperf-target=tpu-v5e:2x4``), so
the case is for the CPU only.
"""

from __future__ import annotations

from charlm import make_task

from pytest_accelperf import Case, CaseRunner, cases

GIB = 2**30

MESHES = [None, (4, 2), (8, 1)]


@cases(backend="jax", mesh=MESHES, batch=[16, 64, 256], steps=40, warmup=2)
def test_mesh_sweep(accelperf: CaseRunner) -> None:
    result = accelperf.train(make_task(accelperf.case))
    assert result.run.outcome == "ok"


@cases(Case(backend="jax", batch=4096, label="full", memory_capacity=16 * GIB,
            params={"size": "full"}, accels=("cpu",)))
def test_full_batch_out_of_memory(accelperf: CaseRunner) -> None:
    """Seed 000's batch 4096 without a mesh in XLA:CPU's memory plan: predicted out of
    memory against 16 GiB, recorded as an outcome. XLA:CPU's plan, not the TPU's (which
    fits: test_mesh_sweep_tpu.py)."""
    result = accelperf.train(make_task(accelperf.case))
    assert result.run.outcome == "oom"


@cases(backend="jax", mesh=[(4, 2), (8, 1)], batch=[32], steps=10, warmup=0, reference=True,
       label="ref")
def test_sharded_matches_single_device(accelperf: CaseRunner) -> None:
    """Seed 004's check: parameters after sharded training allclose(atol=5e-3) to one device."""
    result = accelperf.train(make_task(accelperf.case))
    assert result.check("reference").verdict.value == "pass"
