"""Seed 003: BERT-large on a Cerebras CS-X at batch 512, 1024 and 2048, from its run log.

The log (``data/003_cerebras_bert_large.log``, the seed verbatim) is ingested into one run
per batch size: 10 step-time samples (batch / the Rate of each 100-step window), the loss
every 100 steps, compile time apart, programming time and the processed-samples summary in
``run.extra``. The three runs form a batch-size scaling series.

The seed says "the scaling is pretty linear": it is, for *total time* (175 s, 209 s, 303 s
for 2x and 4x the samples), but not for throughput. Measured from the log: 2,926/s at 512,
4,886/s at 1024 (efficiency 84% of linear), 6,756/s at 2048 (58%). The series declares what
the hardware gives, linear at >= 50% efficiency, so a future log whose curve bends further
fails; ``tests/unit/checks/test_scaling.py`` shows the 80% expectation flagging the bend at 2048.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_accelperf import CaseRunner, cases
from pytest_accelperf.checks.scaling import Scaling

LOG = Path(__file__).parent / "data" / "003_cerebras_bert_large.log"
BATCHES = [512, 1024, 2048]
SERIES = Scaling(exponent=1.0, min_efficiency=0.5, axis="batch")


@pytest.mark.xdist_group("cerebras-bert-large")  # one scaling group: one worker (loadgroup)
@cases(backend="external", batch=BATCHES, label="bert-large")
def test_cerebras_bert_large(accelperf: CaseRunner) -> None:
    batch = accelperf.case.batch
    result = accelperf.ingest(LOG, parser="cerebras", section=f"Batch size {batch}")
    run = result.run
    assert run.samples_per_step == batch
    assert run.loss_steps == list(range(100, 1001, 100))
    assert run.details["total_samples"] == batch * 1000
    accelperf.scaling("bert-large-batch", result, expect=SERIES, points=len(BATCHES))
