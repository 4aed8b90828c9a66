"""Seed 004's check (a pipelined step learns what a single-device step learns, atol=5e-3),
with a GPipe pipeline written in plain JAX (``jax.shard_map`` + ``lax.ppermute``) on
``--accel=cpu``: 4 stages on a stage-only mesh and on a 2x4 data x stage mesh, 4
microbatches. Each case also trains the sequential model on one device and compares every
parameter (``reference``).

A batch series on the 4-stage mesh checks the scaling shape: on a CPU host the step is
dominated by the fixed cost of the schedule (ticks, ppermutes), so throughput grows with the
batch; the suite declares linear at >= 40% (measured here: 63-92% at batch 128 over 32,
from run to run on the shared 2-core machine).
"""

from __future__ import annotations

import pytest
from mlp_stages import make_task

from pytest_accelperf import Case, CaseRunner, cases
from pytest_accelperf.checks.scaling import Scaling


@cases(Case(backend="jax-pipeline", batch=64, steps=20, reference=True, label="gpipe",
            mesh=(4,), axis_names=("stage",)),
       Case(backend="jax-pipeline", batch=64, steps=20, reference=True, label="gpipe",
            mesh=(2, 4), axis_names=("data", "stage")))
def test_pipeline_matches_single_device(accelperf: CaseRunner) -> None:
    result = accelperf.train(make_task(accelperf.case))
    assert result.check("reference").verdict.value == "pass"
    assert result.run.details["pipeline"]["stages"] == 4


BATCHES = [32, 64, 128]


@pytest.mark.xdist_group("gpipe-batch-scaling")  # one scaling group: one worker (loadgroup)
@cases(backend="jax-pipeline", batch=BATCHES, steps=20, label="scaling",
       mesh=[(4,)], axis_names=("stage",))
def test_pipeline_batch_scaling(accelperf: CaseRunner) -> None:
    result = accelperf.train(make_task(accelperf.case))
    accelperf.scaling("gpipe-4stage-batch", result, points=len(BATCHES),
                      expect=Scaling(exponent=1.0, min_efficiency=0.4, axis="batch"))
