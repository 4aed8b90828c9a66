"""Round trips of the typed records (``pytest_accelperf.records``): each record written as
JSON and read back is the same record, and the store's models accept what is written."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from pytest_accelperf.backends.measure.common import fingerprint
from pytest_accelperf.collect.cases import CaseJSON
from pytest_accelperf.records.environment import Environment
from pytest_accelperf.records.fingerprint import CompactFingerprint, ParamsFingerprint, compact
from pytest_accelperf.records.run import InputSeries, Run
from pytest_accelperf.store.block import CompactNumerics, Leaf


def _round_trip(value: object) -> object:
    return json.loads(json.dumps(value))


def _fingerprint() -> ParamsFingerprint:
    return fingerprint({"w": np.arange(6.0).reshape(2, 3), "step": np.array(3)},
                       state=("step",))


def test_a_leaf_fingerprint_round_trips_and_is_a_stored_leaf() -> None:
    fp = _fingerprint()
    assert _round_trip(fp) == fp
    assert fp["w"]["shape"] == [2, 3] and "state" not in fp["w"] and fp["step"]["state"]
    for leaf in fp.values():
        assert Leaf.model_validate(leaf).model_dump(exclude_unset=True) == leaf


def test_a_compact_fingerprint_round_trips_and_is_what_the_store_validates() -> None:
    stored: CompactFingerprint = compact(_fingerprint())
    assert _round_trip(stored) == stored
    assert set(stored) == {"sketch", "structure", "tags", "state"}
    assert len(stored["sketch"]) == 1 and len(stored["state"]["sketch"]) == 1
    model = CompactNumerics.model_validate(stored)
    assert model.model_dump(exclude_unset=True) == stored


def test_a_run_with_a_fingerprint_round_trips() -> None:
    run = Run(case_id="c", params_fingerprint=_fingerprint())
    again = Run.from_json(json.loads(json.dumps(run.to_json())))
    assert again.params_fingerprint == run.params_fingerprint


def test_check_data_round_trips_through_a_check_result() -> None:
    from pytest_accelperf.records.verdict import CheckData, CheckResult, CountChange, Verdict

    data: CheckData = {
        "tolerance": 0.1, "ratio": 1.2, "ci": [1.1, 1.3], "contaminated": None,
        "n": {"now": 20, "baseline": 18}, "stack": ["jax 0.4 → 0.5"],
        "changes": [CountChange(name="flops", baseline=1.0, now=2.0)],
        "per_device": {"cpu:0": {"baseline": 1.0, "now": 2.0, "ratio": 2.0}},
        "ab": {"ref": "main", "skipped": "no A/B step"}}
    result = CheckResult("throughput", Verdict.REGRESSION, "slower", data=data)
    again = CheckResult.from_json(json.loads(json.dumps(result.to_json())))
    assert again == result and again.data == data


def test_the_recorded_sections_round_trip_and_validate_as_the_block() -> None:
    from pytest_accelperf.checks.input import input_block
    from pytest_accelperf.checks.memory import CHECK as MEMORY
    from pytest_accelperf.checks.throughput import CHECK as THROUGHPUT
    from pytest_accelperf.store.block import InputTime, Memory, Probe, StepTime

    run = Run(case_id="c", step_times=[0.1, 0.2, 0.3], probe_times=[0.01, 0.02, 0.03],
              probe_kind="matmul", samples_per_step=8,
              inputs=InputSeries(times=[0.01, 0.02, 0.03], wall_times=[0.02, 0.03, 0.04]),
              memory_per_device={"cpu:0": 1024},
              memory_source="memory_stats",
              memory_growth={"bytes_per_step": 0.0, "steps": 3, "after_warmup": 1.0,
                             "after_steps": 1.0, "source": "tracemalloc"})
    sections = {**THROUGHPUT.record(run), **MEMORY.record(run),
                "input": input_block(run).to_json()}
    assert _round_trip(sections) == sections
    for name, model in (("step_time", StepTime), ("probe", Probe), ("memory", Memory),
                        ("input", InputTime)):
        assert model.model_validate(sections[name]).model_dump(exclude_unset=True) \
            == sections[name]


# -- the environment --------------------------------------------------------------------------
def _environment() -> Environment:
    """An environment as this host's fingerprint makes it (the machine and the stack)."""
    from pytest_accelperf.provision.accel import Accelerator
    from pytest_accelperf.provision.describe import environment

    return environment(Accelerator(name="cpu", platform="cpu-x1", device_kind="cpu",
                                   device_count=1), ("numpy", "not-installed-anywhere"))


def test_an_environment_round_trips_through_a_run_and_is_a_stored_environment() -> None:
    env = _environment()
    data = env.to_json()
    assert list(data) == ["platform", "accel", "device_kind", "device_count", "host_cpu",
                          "cpu_isa", "python", "packages", "libraries"]  # as it always was
    assert set(data["packages"]) == {"numpy"} and env.added == {}
    assert Environment.from_json(_round_trip(data)) == env
    run = Run(case_id="c", environment=env)
    again = Run.from_json(json.loads(json.dumps(run.to_json())))
    assert again.environment == env and again.to_json()["environment"] == data
    assert Environment.model_validate(data).to_json() == data  # what the store validates


def test_a_hook_s_keys_are_added_beside_the_machine_and_the_stack() -> None:
    env = _environment().with_added({"packages": {"libfoo": "1.2"}, "driver": "550.54",
                                     "device_kind": "cpu (hooked)"})
    data = env.to_json()
    assert data["packages"] == {"numpy": np.__version__, "libfoo": "1.2"}
    assert env.added == {"driver": "550.54"} and env.device_kind == "cpu (hooked)"
    assert list(data)[-1] == "driver"  # after the others, as the hook added it
    assert Environment.from_json(_round_trip(data)) == env


def test_an_old_or_odd_environment_is_written_back_as_it_was_read() -> None:
    # Before libraries were fingerprinted; a log's null device count; a key of a hook's
    # first; a value the store would refuse (a report keeps what it was given).
    for data in ({"platform": "cpu", "python": "3.11.7", "packages": {"jax": "0.4.30"}},
                 {"source": "ingested", "platform": "neuron-trn1", "device_count": None},
                 {"platform": "x", "device_count": "8"}, {}):
        env = Environment.from_json(data)
        assert env.to_json() == data and list(env.to_json()) == list(data)
        assert Run.from_json(Run(case_id="c", environment=env).to_json()).environment == env
    assert Environment.from_json({"cpu_isa": None}).cpu_isa is None
    assert "cpu_isa" in Environment.from_json({"cpu_isa": None}).to_json()
    assert Environment.from_json({}) != Environment.from_json({"cpu_isa": None})


# -- a case as JSON, a history line ----------------------------------------------------------
def _case_json() -> CaseJSON:
    from pytest_accelperf.collect.cases import Case

    return Case(backend="jax", batch=8, mesh=(2, 1), model="mlp", label="wide",
                tolerances={"throughput_tolerance": 0.2}, params={"width": 64, "acts": ["relu"]},
                grad_clip=1.0).to_json()


def test_a_case_s_json_round_trips_through_a_report_record() -> None:
    from pytest_accelperf.report.data import CaseRecord

    case = _case_json()
    assert _round_trip(case) == case
    from dataclasses import fields

    from pytest_accelperf.collect.cases import NOT_IN_JSON, Case

    # to_json writes every field of the case (their one declaration) but NOT_IN_JSON
    assert set(case) == {f.name for f in fields(Case)} - set(NOT_IN_JSON)
    assert case["mesh"] == [2, 1] and case["params"] == {"width": 64, "acts": ["relu"]}
    record = CaseRecord(nodeid="m.py::t[c]", case_id="c", platform="cpu-x1",
                        run=Run(case_id="c").to_json(), case=case)
    again = CaseRecord.from_json(json.loads(json.dumps(record.to_json())))
    assert again.case == case and again.to_json() == record.to_json()


def test_a_history_entry_round_trips_and_is_a_history_line(tmp_path: Path) -> None:
    from pytest_accelperf.report.data import CaseRecord, SessionReport
    from pytest_accelperf.report.history import (
        append_history,
        entry,
        fingerprint_hash,
        read_history,
    )
    from pytest_accelperf.store.schema import HistoryLine

    env = _environment().with_added({"driver": "550.54"})
    run = Run(case_id="c", samples_per_step=8, step_times=[0.01, 0.012], losses=[2.0, 1.5],
              loss_steps=[0, 1], environment=env)
    record = CaseRecord(nodeid="m.py::t[c]", case_id="c", platform="cpu-x1",
                        run=run.to_json(), case=_case_json())
    line = entry(record, session="s1", time="2026-11-28T00:00:00+00:00", commit="abc",
                 dirty=False, update=False)
    # entry writes a key for every field HistoryLine declares (their one declaration), and
    # none it does not: a typo would be kept as an unknown key, unvalidated
    assert set(line) == set(HistoryLine.model_fields)
    assert line["environment"] == env.to_json() and line["case"] == record.case
    assert line["fingerprint"] == fingerprint_hash(env.to_json())
    assert _round_trip(line) == line
    HistoryLine.model_validate(_round_trip(line))
    append_history(tmp_path, SessionReport(platform="cpu-x1", environment=env,
                                           records=[record]), cwd=tmp_path)
    (read,) = read_history(tmp_path)
    assert {k: v for k, v in read.items() if k not in ("session", "time", "commit",
                                                      "dirty")} == \
        {k: v for k, v in line.items() if k not in ("session", "time", "commit", "dirty")}
