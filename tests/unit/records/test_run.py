"""``Run`` round-trips through JSON, each typed record in the form reports always had."""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

import pytest

from pytest_accelperf.records.run import IN_EXTRA, Run, extra_fields
from pytest_accelperf.stats.contention import Load
from pytest_accelperf.store.schema import ReportRun

#: A run's JSON as reports wrote it before the ``extra`` keys were fields: the typed ones
#: under ``extra``, beside a backend's own notes.
OLD: dict[str, Any] = {
    "case_id": "c", "outcome": "oom", "message": "m", "samples_per_step": 8,
    "step_times": [0.1, 0.2], "losses": [1.0, "nan"], "loss_steps": [0, 1],
    "metrics": {"acc": [0.5, "inf"]},
    "oom": {"required_bytes": 10, "capacity_bytes": 8, "exceeded_by_bytes": 2,
            "source": "compiler", "planned_by": "XLA:TPU"},
    "max_batch": {"value": 64, "capacity_bytes": 1e9, "multiple_of": 8, "limit": None,
                  "probes": [[8, True, 100.0], [128, False, None]]},
    "memory_growth": {"bytes_per_step": 0.0, "steps": 3, "after_warmup": 1.0,
                      "after_steps": 1.0, "source": "live_arrays"},
    "environment": {"platform": "cpu-x2", "host_cpu": "Test CPU", "python": "3.11",
                    "packages": {"jax": "0.4"}, "driver": "550"},
    "extra": {
        "compile_only": "tpu-v5e:2x4",
        "step_load": {"foreign_cores": 0.5, "steal_cores": 0.0, "cores": 2, "seconds": 1.0,
                      "foreign_ticks": 12},
        "compile_load": {"foreign_cores": 0.1, "steal_cores": 0.0, "cores": 2,
                         "seconds": 3.0},
        "batch_time": 0.25, "warmup_step_times": [0.3], "injected_slowdown": 2.0,
        "compile_time_parts": {"step": 1.5, "init": 0.5}, "compile_time_covers": "step 0",
        "trace_time": 0.2, "phases": {"compile": 2.0, "total": 3.0}, "trainer_times": [0.001],
        "replay": {"steps": 4, "spread": 1e-6, "leaf": "w", "leaves": {"w": 1e-6}},
        "explain": {"path": None, "steps": 3, "size": 10, "note": "traced"},
        "engine": {"zero": 2}, "ranks": [{"rank": 0}],
    },
}


def _same_json(a: Any, b: Any) -> None:
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def test_an_old_report_run_loads_typed_and_writes_back_the_same() -> None:
    run = Run.from_json(OLD)
    assert run.step_load == Load(0.5, 0.0, 2, 1.0, foreign_ticks=12)
    assert run.compile_load == Load(0.1, 0.0, 2, 3.0)
    assert run.compile_only == "tpu-v5e:2x4" and run.batch_time == 0.25
    assert run.replay is not None and run.replay["leaves"] == {"w": 1e-6}
    assert run.explain is not None and run.explain["note"] == "traced"
    assert run.oom is not None and run.oom["required_bytes"] == 10
    assert run.max_batch is not None and run.max_batch["value"] == 64
    assert run.memory_growth is not None and run.memory_growth["steps"] == 3
    # a backend's own notes: each key declared (RunDetails), under "extra" in the JSON
    assert run.details == {"engine": {"zero": 2}, "ranks": [{"rank": 0}]}
    assert run.extra == {}
    data = run.to_json()
    derived = data.pop("derived")
    assert set(derived) == {"median_step_time", "samples_per_second", "mfu", "hfu",
                            "peak_memory"}
    expected = {**{f: v for f, v in Run(case_id="c").to_json().items() if f != "derived"},
                **OLD}
    _same_json(data, expected)
    again = Run.from_json(json.loads(json.dumps(run.to_json())))
    assert again.step_load == run.step_load and again.details == run.details
    assert math.isnan(again.losses[1])
    ReportRun.model_validate(run.to_json())  # the report's schema reads it


@pytest.mark.parametrize("name", extra_fields())
def test_each_typed_extra_is_under_extra_only_when_set(name: str) -> None:
    bare = Run(case_id="c").to_json()
    assert bare["extra"] == {} and name not in bare
    value = OLD["extra"][name]
    run = Run.from_json({"case_id": "c", "extra": {name: value}})
    assert getattr(run, name) is not None and run.extra == {}
    data = run.to_json()
    _same_json(data["extra"], {name: value})
    assert name not in data and name not in ReportRun.model_fields


def test_a_new_run_with_typed_records_round_trips() -> None:
    run = Run(case_id="c", step_times=[0.1], step_load=Load(1.0, 0.0, 4, 2.0),
              oom={"required_bytes": 3, "capacity_bytes": 2, "exceeded_by_bytes": 1,
                   "source": "cuda_allocator", "rank": 1, "step": None},
              memory_growth={"bytes_per_step": 1.0, "steps": 2, "after_warmup": 0.0,
                             "after_steps": 2.0, "source": "cuda_allocator"},
              replay={"steps": 1, "spread": 0.0, "leaf": None, "leaves": {}},
              explain={"path": "/t", "steps": 3, "size": 1, "note": "n"},
              phases={"total": 1.0}, details={"device": "trn1"}, extra={"mine": 1})
    back = Run.from_json(json.loads(json.dumps(run.to_json())))
    assert back == run


def test_the_extra_fields_are_marked() -> None:
    assert "step_load" in extra_fields() and "extra" not in extra_fields()
    assert all(f in Run.__dataclass_fields__ and
               Run.__dataclass_fields__[f].metadata[IN_EXTRA] for f in extra_fields())


def test_a_run_is_frozen_and_a_key_it_does_not_declare_stays_in_extra() -> None:
    run = Run.from_json({"case_id": "c", "extra": {"engine": {"zero": 1}, "mine": [1, 2]}})
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.losses = [1.0]  # type: ignore[misc]
    assert run.details == {"engine": {"zero": 1}} and run.extra == {"mine": [1, 2]}
    noted = run.noted(cluster={"host": "h"})
    assert noted.details == {"engine": {"zero": 1}, "cluster": {"host": "h"}}
    assert run.details == {"engine": {"zero": 1}}  # the original is untouched
    assert noted.to_json()["extra"] == {"engine": {"zero": 1}, "cluster": {"host": "h"},
                                        "mine": [1, 2]}
