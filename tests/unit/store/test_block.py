"""pytest_accelperf.store.block: a block read as the typed Block the checks take, not validated."""

from __future__ import annotations

import json
import math

from pytest_accelperf.checks.summary import summarize
from pytest_accelperf.records.environment import Environment
from pytest_accelperf.records.run import Run
from pytest_accelperf.store.block import (
    Block,
    CompactNumerics,
    CompactSection,
    Leaf,
    Loss,
    StepSession,
    StepTime,
    json_of,
    read_block,
)
from pytest_accelperf.store.schema import validate_block

RUN = Run(case_id="c", samples_per_step=4, step_times=[0.010, 0.012, 0.011],
          losses=[3.0, 2.0, 1.5], loss_steps=[0, 1, 2], probe_times=[0.001, 0.001, 0.0012],
          probe_kind="matmul", memory_per_device={"cpu:0": 100}, memory_source="nbytes",
          params_fingerprint={"w": {"shape": [2], "dtype": "float32", "rms": 1.0,
                                    "sample": [1.0, 2.0], "sketch": 0.3}},
          max_batch={"value": 8, "probes": [[8, True, 1.0], [16, False, None]]},
          environment=Environment.from_json({"host_cpu": "Test CPU"}))


def test_a_run_s_block_reads_typed_and_gives_back_its_json() -> None:
    block = summarize(RUN)
    assert isinstance(block, Block) and isinstance(block.step_time, StepTime)
    assert block.step_time.samples == [0.01, 0.012, 0.011]
    assert isinstance(block.step_time.sessions, list)
    assert isinstance(block.step_time.sessions[0], StepSession)
    assert isinstance(block.loss, Loss) and block.loss.final == 1.5 and block.loss.steps == 3
    assert block.max_batch is not None and block.max_batch.multiple_of == 1
    assert block.memory is not None and block.memory.per_device == {"cpu:0": 100}
    assert isinstance(block.numerics, dict) and isinstance(block.numerics["w"], Leaf)
    as_json = block.to_json()
    json.dumps(as_json)  # plain JSON again
    assert as_json == json.loads(json.dumps(as_json))
    assert json_of(block.numerics) == RUN.params_fingerprint
    assert block.max_batch.to_json() == RUN.max_batch
    # what the store validates is the same JSON
    valid = validate_block(as_json)
    assert valid.step_time is not None
    assert valid.step_time.model_dump() == block.step_time.model_dump()


def test_the_json_given_back_is_a_copy() -> None:
    block = summarize(RUN)
    as_json = block.to_json()
    as_json["step_time"]["samples"].append(99.0)
    assert block.to_json()["step_time"]["samples"] == [0.01, 0.012, 0.011]


def test_what_the_store_refuses_is_read_as_it_is() -> None:
    """A failed run's block (outcome nan, a NaN loss) is judged by the checks, not refused:
    read, a missing field is None or its default, a value of another type stays as it is."""
    failed = read_block({"outcome": "nan", "loss": {"checkpoints": [[1, math.nan]],
                                                    "final": math.nan},
                         "step_time": {"samples": "not a list"}, "mine": {"x": 1}})
    assert failed.outcome == "nan"
    assert failed.loss is not None and math.isnan(failed.loss.final or 0.0)
    assert failed.loss.steps is None  # required, missing: None
    assert failed.step_time is not None and failed.step_time.samples == "not a list"
    assert failed.step_time.median is None
    assert failed.samples_per_step == 0  # a default
    assert failed.model_extra == {"mine": {"x": 1}}
    assert read_block(None) is None and read_block(failed) is failed


def test_a_compact_fingerprint_reads_as_its_model() -> None:
    compact = {"sketch": [0.1], "structure": "0123456789ab", "tags": "00",
               "state": {"sketch": [], "structure": "ba9876543210", "tags": ""}}
    block = read_block({"outcome": "ok", "numerics": compact})
    assert isinstance(block.numerics, CompactNumerics)
    assert isinstance(block.numerics.state, CompactSection)
    assert block.numerics.sketch == [0.1]
    assert json_of(block.numerics) == compact
