"""Timing per machine (store/machines.py): a block's timing is the machine's that recorded
it, every other machine's sits beside it under ``machines``, and writes add a machine's
timing without touching anything else. Store files only: no training."""

from __future__ import annotations

import copy
import doctest
import json
import re
from pathlib import Path
from typing import Any

import pytest

from pytest_accelperf import cli
from pytest_accelperf.checks import run_checks
from pytest_accelperf.checks.recordable import shared_unchanged
from pytest_accelperf.checks.summary import summarize
from pytest_accelperf.records.environment import Environment
from pytest_accelperf.records.run import InputSeries, Run
from pytest_accelperf.records.verdict import CheckResult, Tolerances, Verdict
from pytest_accelperf.report.data import CaseRecord, SessionReport
from pytest_accelperf.store import machines
from pytest_accelperf.store.baselines import (
    BaselineError,
    BaselineFile,
    BaselineStore,
    InvalidBlockError,
    parse,
    read,
)
from pytest_accelperf.store.block import TIMING_SECTIONS
from pytest_accelperf.store.machines import (
    MachineError,
    default_machine,
    machines_of,
    merge,
    other_host,
    recorder,
    validate_machine,
    view,
)

REPO = Path(__file__).resolve().parents[3]
COMMITTED = REPO / "baselines" / "cpu-x8" / "suites" / "jax" / "test_mesh_sweep.json"
MODULE = "suites/jax/test_mesh_sweep"
CASE = "test_mesh_sweep[jax-mesh4x2-b64]"
NODEID = f"{MODULE}.py::{CASE}"
#: A host like the one that recorded the committed store, less avx_vnni (CI's host).
LACKS_VNNI = "avx avx2 avx512_bf16 avx512_vnni avx512bw avx512cd avx512dq avx512f avx512ifma " \
             "avx512vbmi avx512vl f16c fma sse4_2"


def _committed() -> dict[str, Any]:
    """The committed module file as version 1 wrote it: one machine's timing per block
    (the other machines' the committed store holds now are left out)."""
    data: dict[str, Any] = json.loads(COMMITTED.read_text())
    for block in data["cases"].values():
        block.pop("machines", None)
    data.pop("environments", None)  # of the machines left out (schema 3)
    data["schema_version"] = 1
    return data


V1_TEXT = json.dumps(_committed(), indent=2, sort_keys=True) + "\n"


def _block() -> dict[str, Any]:
    block: dict[str, Any] = copy.deepcopy(_committed()["cases"][CASE])
    return block


def _on(block: dict[str, Any], cpu_isa: str = LACKS_VNNI, factor: float = 2.0,
        recorded_at: str = "2026-11-29T08:00:00+00:00") -> dict[str, Any]:
    """``block`` as another host recorded it: its cpu_isa, step times ``factor`` as long."""
    out = copy.deepcopy(block)
    out["environment"]["cpu_isa"] = cpu_isa
    out["step_time"]["samples"] = [t * factor for t in out["step_time"]["samples"]]
    out["step_time"]["median"] *= factor
    out["step_time"].pop("sessions", None)
    out["samples_per_second"] /= factor
    out["recorded_at"] = recorded_at
    return out


def _store(root: Path, text: str | None = None) -> BaselineStore:
    path = root / "cpu-x8" / f"{MODULE}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text if text is not None else V1_TEXT)
    return BaselineStore(root, "cpu-x8")


def test_the_docstring_examples_hold() -> None:
    result = doctest.testmod(machines)
    assert result.failed == 0 and result.attempted > 0


# -- names -------------------------------------------------------------------------------------
def test_a_default_name_is_stable_one_path_component_and_tells_hosts_apart() -> None:
    env = _block()["environment"]
    name = default_machine(env)
    assert re.fullmatch(r"amd-epyc-[0-9a-f]{8}", name)
    assert validate_machine(name) == name
    assert default_machine(dict(env)) == name  # the same fields, the same name
    assert default_machine({**env, "cpu_isa": LACKS_VNNI}) != name
    assert default_machine({**env, "python": "3.12.0", "packages": {}}) == name  # not the stack
    odd = default_machine({"host_cpu": "Intel(R) Xeon(R) CPU @ 2.20GHz / \\..", "cpu_isa": None})
    assert validate_machine(odd) == odd and "/" not in odd
    assert default_machine({}).startswith("host-")


@pytest.mark.parametrize("name", ["../x", "a/b", ".hidden", "", "x" * 101, "a..b", "a b"])
def test_a_machine_name_that_is_not_one_path_component_is_one_line(name: str) -> None:
    with pytest.raises(MachineError) as exc:
        validate_machine(name)
    assert "\n" not in str(exc.value) and "--accelperf-machine" in str(exc.value)


def test_the_option_refuses_a_bad_name_in_one_line(tmp_path: Path) -> None:
    from pytest_accelperf.gate.options import Settings

    def resolve(flag: object = None, ini: object = None, table: dict[str, object] | None = None
                ) -> Settings:
        return Settings.resolve(lambda d: flag if d == "accelperf_machine" else None,
                                lambda i: ini if i == "accelperf_machine" else None,
                                tmp_path, table or {})

    assert resolve("ci-x86").machine == "ci-x86"
    assert resolve(ini="laptop").machine == "laptop"
    assert resolve(table={"machine": "from-pyproject"}).machine == "from-pyproject"
    assert resolve().machine is None
    for source, kwargs in (("command line --accelperf-machine", {"flag": "../up"}),
                           ("ini option accelperf_machine", {"ini": "a/b"})):
        with pytest.raises(pytest.UsageError) as exc:
            resolve(**kwargs)  # type: ignore[arg-type]
        assert str(exc.value).startswith(f"{source}: invalid machine name")
        assert "\n" not in str(exc.value)


# -- a block's machines ------------------------------------------------------------------------
def test_a_block_recorded_before_is_its_recording_machines() -> None:
    block = _block()
    own = default_machine(block["environment"])
    assert recorder(block) == own and machines_of(block) == [own]
    mine = view(block, own)
    assert not mine.new and mine.block == block and mine.timing_env == block["environment"]
    other = view(block, "ci")
    assert other.new and other.machines == (own,)
    assert not set(TIMING_SECTIONS) & set(other.block)
    assert {k: v for k, v in block.items() if k not in TIMING_SECTIONS} == other.block


def test_adding_a_machine_adds_its_timing_and_nothing_else() -> None:
    block = _block()
    own = recorder(block)
    ci = _on(block)
    merged = merge(block, ci, "ci", timing_only=True)
    assert merged is not None
    assert {k: v for k, v in merged.items() if k != "machines"} == block
    entry = merged["machines"]["ci"]
    assert entry["environment"]["cpu_isa"] == LACKS_VNNI
    assert entry["recorded_at"] == ci["recorded_at"]
    assert entry["step_time"] == ci["step_time"]
    assert set(entry) == {"environment", "recorded_at", *(k for k in TIMING_SECTIONS if k in ci)}
    assert machines_of(merged) == sorted([own, "ci"])
    # each machine reads its own timing
    assert view(merged, "ci").block["step_time"] == ci["step_time"]
    assert view(merged, own).block["step_time"] == block["step_time"]
    # a third adds itself beside them; a second write of one replaces its entry only
    third = merge(merged, _on(block, "avx avx2", 3.0), "third", timing_only=True)
    again = merge(third, _on(block, factor=4.0), "ci", timing_only=True)
    assert again is not None and third is not None
    assert again["machines"]["third"] == third["machines"]["third"]
    assert again["machines"]["ci"]["step_time"]["median"] == pytest.approx(
        4 * block["step_time"]["median"])
    # a run with no timing (out of memory) adds nothing where only timing was to be written
    oom = {k: v for k, v in ci.items() if k not in TIMING_SECTIONS}
    assert merge(block, oom, "ci", timing_only=True) is None


def test_a_change_of_the_shared_sections_is_recorded_whole_and_keeps_every_timing() -> None:
    block = merge(_block(), _on(_block()), "ci", timing_only=True)
    assert block is not None
    own = recorder(block)
    changed = _on(_block(), factor=1.5)
    changed["loss"]["final"] = 1.25
    merged = merge(block, changed, "ci", timing_only=False)
    assert merged is not None
    assert merged["loss"]["final"] == 1.25 and merged["machine"] == "ci"
    assert merged["step_time"] == changed["step_time"]  # the top-level timing is ci's now
    assert "ci" not in merged["machines"]
    moved = merged["machines"][own]  # the previous recorder's timing beside it, unchanged
    assert moved["step_time"] == block["step_time"]
    assert moved["environment"] == block["environment"]
    assert moved["recorded_at"] == block["recorded_at"]
    assert view(merged, own).block["step_time"] == block["step_time"]
    # the recording machine refreshes its whole block; the others' timing stays
    refreshed = merge(merged, _on(_block(), factor=1.1), "ci", timing_only=True)
    assert refreshed is not None and refreshed["machines"] == merged["machines"]
    assert refreshed["loss"]["final"] != 1.25
    # the same block again but for its date (an ingested log, re-read by every update) is
    # not written: a refresh that changed nothing is no diff of dates
    again = copy.deepcopy(refreshed)
    again.pop("machines")
    again["recorded_at"] = "2026-11-30T08:00:00+00:00"
    assert merge(refreshed, again, "ci", timing_only=False) is None
    again["loss"]["final"] = 2.5
    assert merge(refreshed, again, "ci", timing_only=False) is not None
    # a default name is not written: it is derived from the environment
    assert "machine" not in merge(None, _block(), own, timing_only=False)  # type: ignore[operator]


def test_two_hosts_of_one_name_are_one_line_naming_both() -> None:
    env = _block()["environment"]
    assert other_host("ci", env, dict(env)) == ""
    message = other_host("ci", {**env, "cpu_isa": LACKS_VNNI}, env)
    assert "\n" not in message
    assert message.startswith("machine 'ci' names two hosts with different fingerprints")
    assert default_machine(env) in message and default_machine(
        {**env, "cpu_isa": LACKS_VNNI}) in message
    assert "--accelperf-machine" in message and "--accelperf-update" in message


# -- the file: versions and validation ---------------------------------------------------------
def test_a_version_1_file_loads_and_the_next_write_makes_it_version_3(tmp_path: Path) -> None:
    store = _store(tmp_path)
    mine = store.get_view(NODEID, recorder(_block()))
    assert mine is not None and not mine.new
    store.write({NODEID: _on(_block())}, timing_only={NODEID})
    written = json.loads((tmp_path / "cpu-x8" / f"{MODULE}.json").read_text())
    assert written["schema_version"] == 3
    before = _committed()
    # every other case as it was; this one gained one machine's timing, nothing else
    assert {k: v for k, v in written["cases"].items() if k != CASE} == {
        k: v for k, v in before["cases"].items() if k != CASE}
    case = written["cases"][CASE]
    added = default_machine({**case["environment"], "cpu_isa": LACKS_VNNI})
    assert list(case["machines"]) == [added]
    # its environment once in the file, named by the machine (schema 3)
    assert case["machines"][added]["environment"] == added
    assert written["environments"][added]["cpu_isa"] == LACKS_VNNI
    assert {k: v for k, v in case.items() if k != "machines"} == before["cases"][CASE]
    fresh = BaselineStore(tmp_path, "cpu-x8")
    found = fresh.get_view(NODEID, added)
    assert found is not None and not found.new and found.block["step_time"]["median"] > 0
    typed = fresh.get(NODEID)
    assert typed is not None and typed.machines is not None and added in typed.machines


def test_a_version_this_one_does_not_read_names_the_versions_it_does() -> None:
    text = json.dumps({**_committed(), "schema_version": 4})
    with pytest.raises(BaselineError, match=r"schema_version is 4, this pytest-accelperf "
                                            r"reads 1, 2 and 3"):
        parse(Path("m.json"), text)


def test_a_machine_entry_is_validated_as_the_block_is(tmp_path: Path) -> None:
    block = merge(_block(), _on(_block()), "ci", timing_only=True)
    assert block is not None
    block["machines"]["ci"]["step_time"]["median"] = -1.0
    block["machines"]["../up"] = block["machines"]["ci"]
    del block["machines"]["ci"]["environment"]
    text = BaselineFile(Path("m.json"), "cpu-x8", {CASE: block}).to_text()
    loaded = parse(Path("m.json"), text)
    message = loaded.invalid[CASE].message
    assert "machines.ci.step_time.median: Input should be greater than 0" in message
    assert "machines.ci.environment: missing" in message
    assert "machines.../up" in message  # the name, checked as a path component
    store = _store(tmp_path, text)
    with pytest.raises(InvalidBlockError):
        store.get_view(NODEID.replace(CASE, CASE), "ci")
    # show reads the machines' names (and, for --machine, their headline timing), so it
    # refuses the bad name, and the bad value where it shows it
    from pytest_accelperf.cli.baselines import SHOWN, SHOWN_MACHINES

    assert SHOWN.read(text.encode()) is None
    assert SHOWN_MACHINES.read(text.encode()) is None
    del block["machines"]["../up"]
    block["machines"]["ci"]["environment"] = block["environment"]
    text = BaselineFile(Path("m.json"), "cpu-x8", {CASE: block}).to_text()
    assert SHOWN.read(text.encode()) is not None  # the bad median is not shown without it
    assert SHOWN_MACHINES.read(text.encode()) is None


def test_a_write_with_a_bad_machine_name_writes_nothing(tmp_path: Path) -> None:
    store = _store(tmp_path)
    before = (tmp_path / "cpu-x8" / f"{MODULE}.json").read_text()
    with pytest.raises(BaselineError, match=re.escape("invalid machine name '../up'")):
        store.write({NODEID: _on(_block())}, machine="../up")
    assert (tmp_path / "cpu-x8" / f"{MODULE}.json").read_text() == before


# -- checks: new for this machine --------------------------------------------------------------
def _run(**overrides: Any) -> Run:
    fields: dict[str, Any] = {
        "case_id": "jax-mesh2x1-b32", "samples_per_step": 32, "n_devices": 2,
        "step_times": [0.010 + 0.0001 * (i % 5) for i in range(30)],
        "probe_times": [0.001] * 30, "probe_kind": "jax-cpu-matmul256x8",
        "compile_time": 0.9, "losses": [2.0 * 0.98**i for i in range(40)],
        "loss_steps": list(range(40)),
        "memory_per_device": {"cpu:0": 1 << 20, "cpu:1": 1 << 20},
        "memory_source": "memory_analysis",
        "inputs": InputSeries(times=[0.002] * 30),
        "params_fingerprint": {"params/w": {"shape": [4], "dtype": "float32", "rms": 0.5,
                                            "sample": [0.1, -0.2]}},
        "environment": Environment.from_json({"host_cpu": "Test CPU"}),
    }
    fields.update(overrides)
    return Run(**fields)


def test_a_machine_without_timing_of_its_own_is_new_for_it_and_deterministic_is_judged() -> None:
    run = _run()
    stored = json.loads(json.dumps(summarize(run).to_json()))
    other = view(stored, "ci")
    assert other.new
    results = {r.metric: r for r in run_checks(run, None, other.block, Tolerances(),
                                                machine_new="ci")}
    for metric in ("throughput", "compile", "input"):
        assert results[metric].verdict is Verdict.NEW, metric
        assert results[metric].detail.startswith("new for this machine (ci): "), metric
        assert results[metric].data["machine_new"] == "ci"
        assert not results[metric].failed
    for metric in ("outcome", "loss", "memory", "numerics"):
        assert results[metric].verdict is Verdict.PASS, (metric, results[metric].detail)
    # a slower step on the machine's own timing is judged there
    mine = view(stored, recorder(stored))
    slow = _run(step_times=[t * 3 for t in _run().step_times])
    judged = {r.metric: r for r in run_checks(slow, None, mine.block, Tolerances())}
    assert judged["throughput"].verdict is Verdict.REGRESSION


def test_only_a_case_whose_shared_sections_all_passed_writes_timing_only() -> None:
    def result(metric: str, verdict: Verdict) -> CheckResult:
        return CheckResult(metric, verdict, "x")

    passed = [result("outcome", Verdict.PASS), result("loss", Verdict.PASS),
              result("throughput", Verdict.NEW), result("compile", Verdict.REGRESSION)]
    assert shared_unchanged(passed)
    assert not shared_unchanged([*passed, result("program", Verdict.REGRESSION)])
    assert not shared_unchanged([*passed, result("memory", Verdict.NEW)])
    assert not shared_unchanged([result("throughput", Verdict.PASS)])


# -- the command -------------------------------------------------------------------------------
def test_show_lists_the_machines_and_shows_one_machines_timing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = _store(tmp_path)
    store.write({NODEID: _on(_block())}, machine="ci", timing_only={NODEID})
    own = recorder(_block())
    cases = len(_committed()["cases"])
    assert cli.main(["baselines", "show", "--baselines", str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == f"{cases} case(s) in {tmp_path}"
    listed = out[out.index("machines of cpu-x8 (cases with its timing; host CPU):") + 1:-1]
    assert listed == [f"  {own}: {cases - 1} case(s), recorded the shared sections of "
                      f"{cases}; AMD EPYC", "  ci: 1 case(s); AMD EPYC"]
    row = next(line for line in out if CASE in line)
    assert row.split()[-2] == "2"  # machines with timing of the case
    assert cli.main(["baselines", "show", "--baselines", str(tmp_path), "--machine", "ci",
                     CASE]) == 0
    shown = capsys.readouterr().out.splitlines()
    speed = _on(_block())["samples_per_second"]
    assert f"{speed:,.1f}/s" in next(line for line in shown if CASE in line)
    assert shown[-1].endswith("the timing shown is machine ci's (- where it has none)")
    assert cli.main(["baselines", "show", "--baselines", str(tmp_path), "--machine",
                     "a/b"]) == 1
    assert "invalid machine name 'a/b'" in capsys.readouterr().err


def test_accept_writes_the_reports_machine_beside_the_others(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _store(tmp_path)
    ci = _on(_block())
    run = Run(case_id="jax-mesh4x2-b64", samples_per_step=ci["samples_per_step"],
              step_times=ci["step_time"]["samples"],
              environment=Environment.from_json(ci["environment"]))
    checks = [CheckResult("outcome", Verdict.PASS, "x"), CheckResult("loss", Verdict.PASS, "x"),
              CheckResult("throughput", Verdict.NEW, "new for this machine")]
    record = CaseRecord(nodeid=NODEID, case_id="jax-mesh4x2-b64", platform="cpu-x8",
                        run=run.to_json(), checks=checks, block=ci)
    report = SessionReport(platform="cpu-x8", records=[record], update=True,
                           environment=Environment.from_json(ci["environment"]),
                           machine="ci-runner")
    path = tmp_path / "report.json"
    path.write_text(json.dumps(report.to_json()))
    assert cli.main(["baselines", "accept", str(path), "--all", "--baselines",
                     str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "as machine ci-runner (its timing only, where another machine recorded" in out
    written = read(tmp_path / "cpu-x8" / f"{MODULE}.json").cases
    assert list(written[CASE]["machines"]) == ["ci-runner"]
    assert {k: v for k, v in written[CASE].items() if k != "machines"} == \
        _committed()["cases"][CASE]
    # --machine names another
    assert cli.main(["baselines", "accept", str(path), "--all", "--machine", "other",
                     "--baselines", str(tmp_path)]) == 0
    capsys.readouterr()
    written = read(tmp_path / "cpu-x8" / f"{MODULE}.json").cases
    assert sorted(written[CASE]["machines"]) == ["ci-runner", "other"]
