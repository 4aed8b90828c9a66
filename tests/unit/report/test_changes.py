"""Change points over the run history (`accelperf history changes`, the HTML report's
marks): real ruptures and scipy calls on constructed series.

The series are built session by session as history lines (validated by the schema on
reading), with noise drawn from a seeded generator: the same series every run.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pytest_accelperf.cli import main
from pytest_accelperf.report.changes import (
    ENVIRONMENT,
    STACK,
    ChangesError,
    Detection,
    analyse,
    exact_changes,
    find_changes,
    noisy_changes,
    since_order,
    worse,
)
from pytest_accelperf.report.history import (
    HistoryError,
    append_history,
    entry,
    read_history,
)
from pytest_accelperf.report.html import html_report, report_specs
from pytest_accelperf.report.points import load_points, points_of
from pytest_accelperf.store.schema import HistoryLine
from unit.report.test_reports import synthetic_report

NODE = "suites/test_m.py::test_step[jax-b64]"
PROGRAM = {"source": "xla", "flops": 2.0e9, "bytes_accessed": 4.0e8,
           "collectives": {"all-reduce": {"count": 4, "bytes": 1 << 20}}, "host_callbacks": 0}


def commit(i: int) -> str:
    return f"{i:04x}" + "c" * 36


def line(i: int, *, sps: float | None = 1000.0, fingerprint: str = "f1",
         nodeid: str = NODE, program: dict[str, Any] | None = None,
         memory: float | None = 7.5e6, loss: float | None = 2.404) -> dict[str, Any]:
    """The history line of session ``i`` (one a minute, commit ``commit(i)``)."""
    return {"schema_version": 1, "session": f"s{i:04d}",
            "time": f"2026-11-{1 + i // 1440:02d}T{i // 60 % 24:02d}:{i % 60:02d}:00+00:00",
            "commit": commit(i), "dirty": False, "platform": "cpu-x8", "nodeid": nodeid,
            "fingerprint": fingerprint, "samples_per_second": sps,
            "median_step_time": 64 / sps if sps else None, "peak_memory": memory,
            "final_loss": loss, "program": program if program is not None else PROGRAM}


def write(directory: Path, lines: list[dict[str, Any]]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "cpu-x8.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in lines))
    return directory


def noisy(n: int, *, seed: int, cv: float = 0.03, step_at: int | None = None,
          step: float = 0.0) -> list[float]:
    rng = np.random.default_rng(seed)
    values = 1000.0 * np.exp(rng.standard_normal(n) * cv)
    if step_at is not None:
        values[step_at:] *= 1 + step
    return [float(v) for v in values]


# -- one series --------------------------------------------------------------------------------
def test_a_planted_step_is_found_at_its_session_with_its_commit_range(tmp_path: Path) -> None:
    values = noisy(60, seed=1, step_at=37, step=-0.10)
    hist = write(tmp_path / "h", [line(i, sps=v) for i, v in enumerate(values)])
    changes = find_changes(load_points(hist))
    assert [(c.metric, c.first_after.session) for c in changes] == [("throughput", "s0037")]
    (c,) = changes
    assert (c.last_before.commit, c.first_after.commit) == (commit(36), commit(37))
    assert c.commits == f"{commit(36)[:9]}..{commit(37)[:9]}"
    assert c.before == pytest.approx(float(np.median(values[:37])))
    assert c.after == pytest.approx(float(np.median(values[37:])))
    assert c.change == pytest.approx(-0.10, abs=0.02)
    assert c.p_value is not None and c.p_value < 1e-6
    assert (c.sessions_before, c.sessions_after) == (37, 23)


@pytest.mark.parametrize("seed", range(5))
def test_a_flat_noisy_series_has_no_change_point(seed: int) -> None:
    values = noisy(100, seed=100 + seed, cv=0.05)
    assert noisy_changes(values, Detection(), log=True) == []


def test_a_timing_change_counts_only_once_it_held_three_sessions() -> None:
    base = noisy(40, seed=7, cv=0.01)
    for held, found in ((2, False), (3, True)):
        values = base + [v * 0.7 for v in noisy(held, seed=8, cv=0.01)]
        changes = noisy_changes(values, Detection(), log=True)
        assert ([i for i, _ in changes] == [40]) is found, (held, changes)


def test_one_wild_session_is_not_a_change() -> None:
    values = noisy(50, seed=3)
    values[25] *= 3  # a session beside a compile job: 3x slower, once
    assert noisy_changes(values, Detection(), log=True) == []


def test_exact_changes_skip_sessions_that_did_not_record_the_field() -> None:
    assert exact_changes([4, 4, None, 4, 6, 6, None, 6, 4]) == [4, 8]


# -- a whole history ---------------------------------------------------------------------------
def test_a_deterministic_field_changes_exactly_with_its_commit_range(tmp_path: Path) -> None:
    more = {**PROGRAM, "flops": 3.0e9,
            "collectives": {"all-reduce": {"count": 4, "bytes": 1 << 20},
                            "all-gather": {"count": 2, "bytes": 1 << 18}}}
    lines = [line(i, sps=v, program=PROGRAM if i < 12 else more,
                  memory=7.5e6 if i < 20 else 9.0e6)
             for i, v in enumerate(noisy(30, seed=2, cv=0.01))]
    changes = find_changes(load_points(write(tmp_path / "h", lines)))
    got = {(c.metric, c.first_after.session, c.before, c.after, c.p_value) for c in changes}
    assert got == {("FLOPs", "s0012", 2.0e9, 3.0e9, None),
                   ("all-gather count", "s0012", 0.0, 2.0, None),
                   ("all-gather bytes", "s0012", 0.0, float(1 << 18), None),
                   ("peak memory", "s0020", 7.5e6, 9.0e6, None)}
    flops = next(c for c in changes if c.metric == "FLOPs")
    assert (flops.last_before.commit, flops.first_after.commit) == (commit(11), commit(12))
    assert flops.exact and flops.sure == "exact" and flops.change == pytest.approx(0.5)
    assert (flops.sessions_before, flops.sessions_after) == (12, 18)


def test_a_series_that_does_not_repeat_is_judged_as_measured(tmp_path: Path) -> None:
    # a final loss with noise in its last digits (non-deterministic reductions): a
    # change of 1e-7 is not a change point, a step of 5 % held 10 sessions is
    rng = np.random.default_rng(4)
    losses = [2.4 * (1 + 1e-7 * float(x)) * (1.05 if i >= 30 else 1)
              for i, x in enumerate(rng.standard_normal(40))]
    lines = [line(i, loss=v) for i, v in enumerate(losses)]
    (c,) = find_changes(load_points(write(tmp_path / "h", lines)))
    assert (c.metric, c.first_after.session, c.exact) == ("final loss", "s0030", False)


def test_a_new_fingerprint_is_a_change_and_starts_a_new_series(tmp_path: Path) -> None:
    # another runner from session 20 on: 40 % faster, FLOPs counted by another XLA
    values = noisy(20, seed=5) + [v * 1.4 for v in noisy(20, seed=6)]
    lines = [line(i, sps=v, fingerprint="f1" if i < 20 else "f2",
                  program=PROGRAM if i < 20 else {**PROGRAM, "flops": 2.1e9})
             for i, v in enumerate(values)]
    changes = find_changes(load_points(write(tmp_path / "h", lines)))
    assert {(c.metric, c.first_after.session, c.new_environment) for c in changes} == {
        (ENVIRONMENT, "s0020", True), ("FLOPs", "s0020", True)}  # no throughput change
    env = next(c for c in changes if c.metric == ENVIRONMENT)
    assert env.levels() == "f1 → f2" and env.sure == "exact (new fingerprint)"


def test_since_a_commit_or_a_date(tmp_path: Path) -> None:
    lines = [line(i, program=PROGRAM if i < 10 else {**PROGRAM, "flops": 3e9 if i < 20
                                                      else 4e9})
             for i in range(30)]
    found = analyse(write(tmp_path / "h", lines))
    changes = found.changes
    assert [c.first_after.session for c in changes] == ["s0010", "s0020"]

    def since(ref: str) -> list[str]:
        cut = since_order(found.sessions, ref, tmp_path)
        return [c.first_after.session for c in changes if c.first_after.order > cut]

    assert since(commit(5)[:8]) == ["s0010", "s0020"]
    assert since(commit(10)) == ["s0020"]  # REF's own session is not after it
    assert since(commit(15)[:7].upper()) == ["s0020"]
    assert since("2026-11-01T00:20") == ["s0020"]  # the session at 00:20 on
    assert since("2026-11-01T00:21") == []
    with pytest.raises(ChangesError, match="--since 0badc0de: no session of the history ran"):
        since("0badc0de")


def test_the_history_keeps_the_gated_program_fields() -> None:
    report = synthetic_report()
    record = report.records[0]
    record.run["program"] = {"source": "xla", "flops": 1e9, "ops": {"dot": 3},
                             "collectives": {}, "break_reasons": ["x"], "host_callbacks": 1}
    e = entry(record, session="s", time="t", commit=None, dirty=None, update=False)
    assert e["program"] == {"source": "xla", "flops": 1e9, "collectives": {},
                            "host_callbacks": 1}
    HistoryLine.model_validate(e)


# -- the command -------------------------------------------------------------------------------
def test_the_command_lists_change_points_as_a_table_and_as_json(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    values = noisy(40, seed=11, step_at=25, step=-0.2)
    lines = [line(i, sps=v, program=PROGRAM if i < 10 else {**PROGRAM, "flops": 3e9})
             for i, v in enumerate(values)]
    hist = write(tmp_path / "h", lines)
    assert main(["history", "changes", str(hist)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert re.split(r"\s{2,}", out[0]) == ["case", "metric", "before → after", "change",
                                           "commits", "how sure"]
    assert re.split(r"\s{2,}", out[2]) == [
        f"cpu-x8:{NODE}", "FLOPs", "2.00 GFLOP → 3.00 GFLOP", "+50.0%",
        f"{commit(9)[:9]}..{commit(10)[:9]}", "exact"]
    row = re.split(r"\s{2,}", out[3].strip())
    assert row[0] == "throughput" and row[3] == f"{commit(24)[:9]}..{commit(25)[:9]}"
    assert re.fullmatch(r"p=\de-\d+ \(25 → 15 sessions\)", row[4])
    assert out[-1] == f"2 change point(s) in 1 case(s) over 40 session(s) of {hist}"

    assert main(["history", "changes", str(hist), "--json", "--since", commit(12)]) == 0
    (only,) = json.loads(capsys.readouterr().out)
    assert (only["metric"], only["exact"], only["first_after"]["commit"]) == (
        "throughput", False, commit(25))
    assert only["change"] == pytest.approx(-0.2, abs=0.03)


@pytest.mark.parametrize(("text", "message"), [
    ('{"nodeid": "a", "session": \n', "cpu-x8.jsonl:2: not a history entry (not JSON: "),
    ('{"nodeid": "a", "session": "s", "samples_per_second": "fast"}\n',
     "cpu-x8.jsonl:2: not a history entry (samples_per_second: Input should be a valid "
     "number"),
    ('{"session": "s"}\n', "cpu-x8.jsonl:2: not a history entry (nodeid: missing"),
])
def test_the_command_names_the_file_and_line_that_is_not_a_history_entry(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, message: str) -> None:
    hist = write(tmp_path / "h", [line(0)])
    with (hist / "cpu-x8.jsonl").open("a") as f:
        f.write(text)
    assert main(["history", "changes", str(hist)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"accelperf: error: {hist}/{message}"), err
    assert err.rstrip().endswith("delete or fix that line") and err.count("\n") == 1
    with pytest.raises(HistoryError, match=re.escape(message)):
        read_history(hist)


def test_the_command_without_a_history(tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["history", "changes", str(tmp_path / "none")]) == 1
    assert capsys.readouterr().err == (
        f"accelperf: error: {tmp_path}/none: no history directory; write one with "
        f"--accelperf-history={tmp_path}/none\n")
    (tmp_path / "empty").mkdir()
    assert main(["history", "changes", str(tmp_path / "empty")]) == 1
    assert "no history lines; write them with pytest" in capsys.readouterr().err


def test_many_cases_each_with_its_own_change_points(tmp_path: Path) -> None:
    # 210 cases x 100 sessions, every tenth case 15 % slower from session 60 and every
    # 21st with more FLOPs from session 30
    lines = [line(i, nodeid=f"m.py::t[c{c}]",
                  sps=v * (0.85 if c % 10 == 0 and i >= 60 else 1.0),
                  program={**PROGRAM, "flops": 3e9} if c % 21 == 0 and i >= 30 else None)
             for c in range(210) for i, v in enumerate(noisy(100, seed=c))]
    hist = write(tmp_path / "h", lines)
    found = analyse(hist)
    assert (found.cases, len(found.sessions)) == (210, 100)
    got = {(c.nodeid, c.metric, c.first_after.session) for c in found.changes}
    assert got >= {(f"m.py::t[c{c}]", "throughput", "s0060") for c in range(0, 210, 10)}
    assert got >= {(f"m.py::t[c{c}]", "FLOPs", "s0030") for c in range(0, 210, 21)}
    false = got - {(f"m.py::t[c{c}]", "throughput", "s0060") for c in range(0, 210, 10)} - {
        (f"m.py::t[c{c}]", "FLOPs", "s0030") for c in range(0, 210, 21)}
    # the rest are false: the p-value is not corrected for the search (benchmarks/changes.py
    # measures the rate over recorded noise); on these Gaussian series, under 1 in 10
    assert len(false) < 21, false
    with (hist / "cpu-x8.jsonl").open("a") as f:
        f.write('{"nodeid": "m.py::t[c1]", "session": "s", "dirty": "no"}\n')
        f.write('{"nodeid": 1, "session": "s"}\n')
    with pytest.raises(HistoryError, match=r"cpu-x8.jsonl:21001: not a history entry \("
                                           r"dirty: Input should be a valid boolean"):
        analyse(hist)


# -- the HTML report ---------------------------------------------------------------------------
def test_the_html_report_lists_and_marks_the_change_points(tmp_path: Path) -> None:
    report = synthetic_report()
    record = report.records[0]  # jax-mesh2x1-b64
    hist = tmp_path / "hist"
    speeds = noisy(30, seed=21, step_at=20, step=-0.25)
    for i, sps in enumerate(speeds):
        record.run["derived"]["samples_per_second"] = sps
        record.run["program"] = {"source": "xla", "flops": 1e9 if i < 9 else 2e9}
        append_history(hist, report, cwd=tmp_path,
                       now=dt.datetime(2026, 11, 1, 12, i, tzinfo=dt.timezone.utc))
    history = read_history(hist)
    changes = find_changes(points_of(history))
    assert {(c.nodeid, c.metric, c.first_after.time[11:16]) for c in changes} == {
        (record.nodeid, "FLOPs", "12:09"), (record.nodeid, "throughput", "12:20")}
    text = html_report(report, history=history)
    assert "<h3>Change points (2)</h3>" in text
    name = record.nodeid.split("::", 1)[-1]
    assert f"<td>{name}</td><td>FLOPs</td><td class=\"num\">1.00 GFLOP → 2.00 GFLOP" in text
    assert f"<td>{name}</td><td>throughput</td>" in text
    without = html_report(report, history=history[:len(report.records) * 8])
    assert "No change point in the history of these cases" in without


def test_a_change_point_is_a_labelled_rule_on_the_trend(tmp_path: Path) -> None:
    report = synthetic_report()
    record = report.records[0]  # jax-mesh2x1-b64
    report.records = [record]
    hist = tmp_path / "hist"
    for i, sps in enumerate(noisy(30, seed=21, step_at=20, step=-0.25)):
        record.run["derived"]["samples_per_second"] = sps
        record.run["program"] = {"source": "xla", "flops": 1e9 if i < 9 else 2e9}
        append_history(hist, report, cwd=tmp_path,
                       now=dt.datetime(2026, 11, 1, 12, i, tzinfo=dt.timezone.utc))
    text = html_report(report, history=read_history(hist))
    trend = next(s for s in report_specs(text) if "datasets" in s)
    marks = {(m["label"], m["kind"], m["x"]) for m in trend["datasets"]["marks"]}
    # a rule before the first session after each change: red where worse
    assert marks == {("FLOPs +100%", "worse", 8.5), ("throughput -26%", "worse", 19.5)}
    assert len(trend["datasets"]["sessions"]) == 30


def test_the_schema_of_a_history_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["schema", "history"]) == 0
    schema = json.loads(capsys.readouterr().out)
    assert schema["title"] == "HistoryLine" and schema["required"] == ["nodeid", "session"]
    assert {"samples_per_second", "program", "fingerprint", "commit"} <= set(
        schema["properties"])


def test_which_way_is_worse(tmp_path: Path) -> None:
    from pytest_accelperf.report.changes import worse

    values = noisy(30, seed=9, step_at=15, step=-0.3)
    lines = [line(i, sps=v, memory=7.5e6 if i < 20 else 6e6,
                  program=PROGRAM if i < 10 else {**PROGRAM, "host_callbacks": 2})
             for i, v in enumerate(values)]
    got = {c.metric: worse(c) for c in find_changes(load_points(write(tmp_path / "h", lines)))}
    assert got == {"throughput": True, "peak memory": False, "host callbacks": True}


def test_the_command_takes_one_platform_and_refuses_a_p_value_out_of_range(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    hist = write(tmp_path / "h", [line(i, program=PROGRAM if i < 5 else {**PROGRAM, "flops": 1e9})
                                  for i in range(10)])
    (hist / "tpu-v5e-x8.jsonl").write_text("")
    assert main(["history", "changes", str(hist), "--platform", "cpu-x8"]) == 0
    assert capsys.readouterr().out.endswith(
        f"1 change point(s) in 1 case(s) over 10 session(s) of {hist}\n")
    assert main(["history", "changes", str(hist), "--platform", "tpu-v5e-x8"]) == 1
    assert "no history lines of platform tpu-v5e-x8" in capsys.readouterr().err
    assert main(["history", "changes", str(hist), "--max-pvalue", "2"]) == 1
    assert capsys.readouterr().err == ("accelperf: error: --max-pvalue 2.0: a p-value between "
                                       "0 and 1, such as 0.001\n")


# -- the machine and the stack (issue 37) ------------------------------------------------------
def machine_env(jax: str, *, host_cpu: str = "AMD EPYC 7B13", torch: str = "2.13.0"
                ) -> dict[str, Any]:
    """An environment as :func:`pytest_accelperf.provision.describe.environment` writes it: the
    machine (platform, device, host CPU) and the stack (python, packages, libraries)."""
    return {"platform": "cpu-x2", "accel": "cpu", "device_kind": "cpu", "device_count": 2,
            "host_cpu": host_cpu, "cpu_isa": "avx avx2 fma", "python": "3.11.7",
            "packages": {"jax": jax, "jaxlib": jax, "torch": torch}, "libraries": {}}


def upgrade_history(tmp_path: Path) -> tuple[Path, str, str]:
    """Through the real writer: two jax cases, 14 sessions under jax 0.8.3 then 14 under
    0.10.2 on the same machine (torch upgraded too, which no jax case runs), where the first
    case's step is 10 % slower and its FLOPs counted anew, the second's unchanged; then 6
    sessions on another host CPU. ``(history, slower case, unchanged case)``."""
    report = synthetic_report()
    slow, same = (r for r in report.records if r.case_id in ("jax-nomesh-b64",
                                                             "jax-nomesh-b128"))
    report.records = [slow, same]
    hist = tmp_path / "hist"
    for i in range(34):
        upgraded = i >= 14
        env = machine_env("0.10.2" if upgraded else "0.8.3",
                          torch="2.14.0" if upgraded else "2.13.0",
                          host_cpu="Intel Xeon 8481C" if i >= 28 else "AMD EPYC 7B13")
        for k, record in enumerate(report.records):
            rng = np.random.default_rng(1000 * k + i)
            step = 0.010 * (1.10 if k == 0 and upgraded else 1.0) * (
                1 + 0.01 * float(rng.standard_normal()))
            record.run["environment"] = env
            record.run["derived"]["median_step_time"] = step
            record.run["derived"]["samples_per_second"] = 64 * (k + 1) / step
            record.run["program"] = {"source": "xla",
                                     "flops": 2e9 if k == 0 and upgraded else 1e9}
        append_history(hist, report, cwd=tmp_path,
                       now=dt.datetime(2026, 11, 1, 12, i, tzinfo=dt.timezone.utc))
    return hist, slow.nodeid, same.nodeid


def test_a_stack_change_on_one_machine_is_named_and_measured_across(tmp_path: Path) -> None:
    hist, slow, same = upgrade_history(tmp_path)
    first = read_history(hist)[0]
    assert {"fingerprint", "machine", "stack"} <= set(first)  # the line carries both hashes
    changes = analyse(hist).changes
    at = [c for c in changes if c.first_after.time.endswith("12:14:00+00:00")]
    got = {(c.nodeid, c.metric, c.new_stack, c.exact, c.significant) for c in at}
    assert got == {
        (slow, STACK, True, True, True), (same, STACK, True, True, True),
        (slow, "throughput", True, False, True), (slow, "step time", True, False, True),
        (slow, "FLOPs", True, True, True),
        # measured across the upgrade, and unchanged: listed, not a change
        (same, "throughput", True, False, False), (same, "step time", True, False, False)}
    for c in at:  # the versions: the torch upgrade is no jax case's
        assert c.stack == ("jax 0.8.3 → 0.10.2", "jaxlib 0.8.3 → 0.10.2"), c
    stack = next(c for c in at if c.nodeid == slow and c.metric == STACK)
    assert stack.levels() == "jax 0.8.3 → 0.10.2, jaxlib 0.8.3 → 0.10.2"
    assert stack.sure == "exact (new stack)" and worse(stack) is None
    assert (stack.sessions_before, stack.sessions_after) == (14, 14)
    step = next(c for c in at if c.nodeid == slow and c.metric == "step time")
    assert step.change == pytest.approx(0.10, abs=0.02) and worse(step) is True
    assert step.p_value is not None and step.p_value < 1e-4
    assert (step.sessions_before, step.sessions_after) == (14, 14)
    assert re.fullmatch(r"p=\de-\d+ \(14 → 14 sessions, new stack\)", step.sure)
    flops = next(c for c in at if c.metric == "FLOPs")
    assert (flops.before, flops.after, flops.sure) == (1e9, 2e9, "exact (new stack)")
    unchanged = next(c for c in at if c.nodeid == same and c.metric == "step time")
    assert unchanged.p_value is not None and unchanged.p_value > 0.001
    assert unchanged.sure.startswith(f"p={unchanged.p_value:.1g}, no change (14 → 14")
    assert worse(unchanged) is None
    # not found again by the search: the series is searched within each stack
    assert [c for c in changes if c.metric in ("throughput", "step time")
            and not c.new_stack] == []
    # another host CPU is another machine: an environment change, a new series
    moved = [c for c in changes if c.first_after.time.endswith("12:28:00+00:00")]
    assert {(c.nodeid, c.metric) for c in moved} == {(slow, ENVIRONMENT), (same, ENVIRONMENT)}


def test_the_command_and_the_html_report_name_the_versions(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    hist, slow, _ = upgrade_history(tmp_path)
    assert main(["history", "changes", str(hist)]) == 0
    out = capsys.readouterr().out.splitlines()
    rows = [re.split(r"\s{2,}", row.strip()) for row in out[2:-1]]
    stack = next(r for r in rows if r[0] == f"cpu-x2:{slow}")
    assert stack[1:3] == ["stack", "jax 0.8.3 → 0.10.2, jaxlib 0.8.3 → 0.10.2"]
    assert stack[-1] == "exact (new stack)"
    at = rows.index(stack)
    assert rows[at + 1][0] == "FLOPs" and rows[at + 1][-1] == "exact (new stack)"
    assert rows[at + 2][:4] == ["step time", "10.00 ms → 11.00 ms", "+10.0%", "?..?"]
    assert re.fullmatch(r"p=\de-\d+ \(14 → 14 sessions, new stack\)", rows[at + 2][4])
    assert rows[at + 3][0] == "throughput" and rows[at + 4][:2] == ["environment",
                                                                    rows[at + 4][1]]
    assert main(["history", "changes", str(hist), "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    named = [c for c in listed if c["metric"] == STACK]
    assert len(named) == 2 and all(
        c["stack"] == ["jax 0.8.3 → 0.10.2", "jaxlib 0.8.3 → 0.10.2"] and c["new_stack"]
        and c["first_after"]["stack"] != c["last_before"]["stack"]
        and c["first_after"]["machine"] == c["last_before"]["machine"] for c in named)

    report = synthetic_report()
    report.records = [r for r in report.records if r.nodeid == slow]
    text = html_report(report, history=read_history(hist))
    name = slow.split("::", 1)[-1]
    assert (f"<td>{name}</td><td>stack</td><td class=\"num\">jax 0.8.3 → 0.10.2, "
            f"jaxlib 0.8.3 → 0.10.2</td>") in text


def test_a_stack_change_point_is_marked_with_its_versions(tmp_path: Path) -> None:
    from pytest_accelperf.report.html import _mark_label

    hist, _, _ = upgrade_history(tmp_path)
    changes = find_changes(load_points(hist))
    labels = {_mark_label(c, False) for c in changes
              if c.first_after.time.endswith("12:14:00+00:00")}
    assert "stack: jax 0.8.3 → 0.10.2, jaxlib 0.8.3 → 0.10.2" in labels
    assert "step time no change" in labels and "step time +10%" in labels


def test_the_cache_keeps_the_machine_and_the_stack(tmp_path: Path) -> None:
    hist, _, _ = upgrade_history(tmp_path)
    fresh = load_points(hist, cache=False)
    load_points(hist)  # writes the cache
    cached = load_points(hist)
    assert cached == fresh == points_of(read_history(hist))
    assert {p.versions["packages"]["jax"] for p in cached if p.versions} == {"0.8.3", "0.10.2"}
    assert len({id(p.versions) for p in cached}) == 2  # one object per stack
    assert find_changes(cached) == find_changes(fresh)


def test_a_history_written_before_the_stack_was_kept_splits_by_fingerprint(
        tmp_path: Path) -> None:
    # old lines: a fingerprint, no machine or stack; a jax upgrade changed the fingerprint
    old = [line(i, sps=v, fingerprint="f1" if i < 20 else "f2")
           for i, v in enumerate(noisy(30, seed=31))]
    points = load_points(write(tmp_path / "h", old))
    assert {(p.machine, p.stack, p.versions) for p in points} == {(None, None, None)}
    changes = find_changes(points)
    assert [(c.metric, c.first_after.session, c.new_stack) for c in changes] == [
        (ENVIRONMENT, "s0020", False)]
    # the first line written with the machine and the stack starts a series of its own
    new = {"machine": "m1", "stack": "k1", "environment": machine_env("0.10.2")}
    lines = old + [{**line(i), "fingerprint": "f3", **new} for i in range(30, 36)]
    changes = find_changes(load_points(write(tmp_path / "h2", lines)))
    assert [(c.metric, c.first_after.session) for c in changes] == [
        (ENVIRONMENT, "s0020"), (ENVIRONMENT, "s0030")]
