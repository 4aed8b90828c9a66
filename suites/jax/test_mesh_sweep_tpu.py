"""Seed 000 on its own hardware: the mesh sweep compiled for a TPU v5e 2x4, never run.

The seed trained a character-level LM on a TPU v5e-8 over no mesh / mesh 4x2 / mesh 8x1 at
batch 128, 1024 and 4096, and its batch 4096 without a mesh ran out of HBM at compile time
("Used 20.93G of 15.48G hbm"). Here the same grid, at the seed's batch sizes, is compiled
by libtpu's TPU compiler for a v5e 2x4 slice on whatever host runs the tests, and each
program is gated (memory per device against the v5e's 16 GiB, FLOPs, bytes, collectives)
against the committed ``tpu-v5e-x8`` baselines; no step runs::

    pytest suites/jax/test_mesh_sweep_tpu.py --accelperf-target=tpu-v5e:2x4

The model is charlm's "full" size: the seed does not give its model's size (no parameter
count, width, depth or sequence length: only batch sizes, losses and times), so it cannot
be matched. Without a target these cases are for a TPU only and skip, with that line.
"""

from __future__ import annotations

from charlm import make_task

from pytest_accelperf import CaseRunner, cases


@cases(backend="jax", mesh=[None, (4, 2), (8, 1)], batch=[128, 1024, 4096], label="full",
       params={"size": "full"}, accels=("tpu",))
def test_mesh_sweep_tpu(accelperf: CaseRunner) -> None:
    """Every case of the seed's grid fits a v5e's HBM in the TPU compiler's plan."""
    result = accelperf.train(make_task(accelperf.case))
    assert result.run.outcome == "ok"
