"""Reports from real Run/CheckResult data: Markdown, JUnit properties, history, HTML, progress.

The records are built from synthetic runs checked by the real checks (``run_checks``), so
every verdict and number in them is one the plugin could have produced.
"""

from __future__ import annotations

import base64
import dataclasses
import gzip
import json
import math
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pytest_accelperf.backends.measure.progress import LineProgress, progress_text, reporting, step
from pytest_accelperf.checks import run_checks
from pytest_accelperf.checks.summary import summarize
from pytest_accelperf.collect.cases import Case
from pytest_accelperf.gate.options import Settings
from pytest_accelperf.gate.outputs import write_outputs
from pytest_accelperf.records.environment import Environment
from pytest_accelperf.records.run import Run
from pytest_accelperf.records.verdict import CheckResult, Tolerances, Verdict
from pytest_accelperf.report.data import CaseRecord, SessionReport, baseline_view
from pytest_accelperf.report.history import (
    HistoryError,
    append_history,
    fingerprint_hash,
    read_history,
)
from pytest_accelperf.report.html import html_report, report_specs
from pytest_accelperf.report.junit import junit_properties, suite_properties
from pytest_accelperf.report.loading import ReportFileError, load_report
from pytest_accelperf.report.markdown import markdown
from pytest_accelperf.report.terminal import table_lines

PLATFORM = "cpu-x2"
MODULE = "suites/test_m.py"


def make_run(case: Case, *, step_time: float, noise: float = 0.02, n: int = 30,
             seed: int = 0, memory: int = 3 << 20, loss_scale: float = 1.0) -> Run:
    rng = np.random.default_rng(seed)
    steps = [float(step_time * (1 + noise * abs(x))) for x in rng.standard_normal(n)]
    probe = [0.002] * n
    total = case.warmup + n
    losses = [float(loss_scale * (2.0 * math.exp(-i / 12) + 0.3)) for i in range(total)]
    return Run(case_id=case.id, samples_per_step=case.batch, n_devices=2, step_times=steps,
               compile_time=0.4, losses=losses, loss_steps=list(range(total)),
               memory_per_device={"cpu:0": memory, "cpu:1": memory + (1 << 18)},
               memory_source="memory_analysis", probe_times=probe, probe_kind="test-probe",
               environment=Environment.from_json({"platform": PLATFORM,
                                                    "packages": {"jax": "0.10.2"}}))


def make_record(case: Case, now: Run, base: Run | None, test: str = "test_sweep"
                ) -> CaseRecord:
    baseline = summarize(base).to_json() if base is not None else None
    checks = run_checks(now, None, baseline, Tolerances(), comparable=True)
    return CaseRecord(nodeid=f"{MODULE}::{test}[{case.id}]", case_id=case.id,
                      platform=PLATFORM, run=now.to_json(), checks=checks,
                      case=case.to_json(), baseline=baseline_view(baseline))


def synthetic_report() -> SessionReport:
    """Six cases: a throughput regression, an improvement, an inconclusive one, two passes
    (batch 64 and 128, for the batch-size plot), a new one, and one that raised."""
    c_reg = Case(backend="jax", batch=64, mesh=(2, 1))
    c_imp = Case(backend="jax", batch=128, mesh=(2, 1))
    c_inc = Case(backend="jax", batch=32, label="noisy")
    c_p64 = Case(backend="jax", batch=64)
    c_p128 = Case(backend="jax", batch=128)
    c_new = Case(backend="jax", batch=16, label="fresh")
    c_err = Case(backend="jax", batch=8, label="broken")
    records = [
        make_record(c_reg, make_run(c_reg, step_time=0.030, seed=1),
                    make_run(c_reg, step_time=0.010, seed=2)),
        make_record(c_imp, make_run(c_imp, step_time=0.010, seed=3),
                    make_run(c_imp, step_time=0.030, seed=4)),
        make_record(c_inc, make_run(c_inc, step_time=0.010, noise=2.0, n=6, seed=5),
                    make_run(c_inc, step_time=0.010, noise=2.0, n=6, seed=6)),
        make_record(c_p64, make_run(c_p64, step_time=0.010, seed=7),
                    make_run(c_p64, step_time=0.010, seed=8)),
        make_record(c_p128, make_run(c_p128, step_time=0.018, seed=9),
                    make_run(c_p128, step_time=0.018, seed=10)),
        make_record(c_new, make_run(c_new, step_time=0.005, seed=11), None),
    ]
    err_run = Run(case_id=c_err.id, outcome="error", message="RuntimeError: boom | bang")
    records.append(CaseRecord(nodeid=f"{MODULE}::test_sweep[{c_err.id}]", case_id=c_err.id,
                              platform=PLATFORM, run=err_run.to_json(), checks=[],
                              case=c_err.to_json(), error=err_run.message))
    return SessionReport(accel="cpu", platform=PLATFORM,
                         environment=Environment.from_json(
                             {"device_kind": "cpu", "packages": {"jax": "0.10.2"}}),
                         records=records)


def _by_case(report: SessionReport) -> dict[str, CaseRecord]:
    return {r.case_id: r for r in report.records}


def test_synthetic_report_has_the_verdicts_it_claims() -> None:
    recs = _by_case(synthetic_report())
    assert recs["jax-mesh2x1-b64"].verdict is Verdict.REGRESSION
    assert recs["jax-mesh2x1-b128"].verdict is Verdict.IMPROVEMENT
    assert recs["jax-nomesh-b32-noisy"].verdict is Verdict.INCONCLUSIVE
    assert recs["jax-nomesh-b64"].verdict is Verdict.PASS
    assert recs["jax-nomesh-b16-fresh"].verdict is Verdict.NEW


# -- Markdown ----------------------------------------------------------------------------------
def test_markdown_orders_regressions_improvements_inconclusive_then_folded_passes() -> None:
    text = markdown(synthetic_report(), accept_hint="accelperf baselines accept r.json")
    heads = [text.index(h) for h in ("### ❌ Regressions", "### 🚀 Improvements",
                                     "### ❔ Inconclusive", "### 🆕 Not compared",
                                     "<details>")]
    assert heads == sorted(heads)
    regressions = text[heads[0]:heads[1]]
    assert "`test_sweep[jax-mesh2x1-b64]` | throughput" in regressions
    assert "REGRESSION" not in regressions  # the section says it; rows carry numbers
    assert "slower: step time" in regressions
    # the error row, with its pipe escaped so the table keeps its columns
    assert "| `test_sweep[jax-nomesh-b8-broken]` | error |" in regressions
    assert "RuntimeError: boom \\| bang" in regressions
    assert "accept it: `accelperf baselines accept r.json`" in regressions
    folded = text[heads[4]:]
    assert "2 case(s) passed every check" in folded
    assert "`test_sweep[jax-nomesh-b64]`" in folded
    assert "`test_sweep[jax-nomesh-b64]`" not in text[:heads[4]]
    assert folded.rstrip().endswith("</details>")
    assert text.startswith("## accelperf\n\n❌ regression · 7 case(s) on `cpu-x2`")


def test_markdown_of_a_clean_session_has_no_regression_section() -> None:
    report = synthetic_report()
    report.records = [r for r in report.records if r.verdict is Verdict.PASS and r.checks]
    text = markdown(report)
    assert "Regressions" not in text
    assert text.startswith("## accelperf\n\n✅ no regression · 2 case(s)")


def _settings(tmp_path: Path, **kw: Any) -> Settings:
    base = Settings.resolve(lambda _: None, lambda _: None, tmp_path, table={})
    return dataclasses.replace(base, **kw)


def test_outputs_write_markdown_and_append_to_github_step_summary(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    summary = tmp_path / "summary.md"
    summary.write_text("earlier step\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    report = synthetic_report()
    settings = _settings(tmp_path, markdown=tmp_path / "out" / "pr.md",
                         json=tmp_path / "accelperf.json")
    lines = write_outputs(report, settings, tmp_path)
    text = (tmp_path / "out" / "pr.md").read_text()
    assert "accelperf baselines accept accelperf.json --case 'test_sweep[jax-mesh2x1-b64]'" \
        in text
    assert summary.read_text() == "earlier step\n" + text + "\n"
    assert lines == ["accelperf: Markdown summary written to out/pr.md",
                     f"accelperf: Markdown summary appended to {summary}"]
    assert oct((tmp_path / "out" / "pr.md").stat().st_mode & 0o044) == oct(0o044)
    assert report.errors == []


def test_outputs_report_an_unwritable_path_as_a_session_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    report = synthetic_report()
    write_outputs(report, _settings(tmp_path, markdown=tmp_path / "file" / "pr.md"), tmp_path)
    assert len(report.errors) == 1
    assert report.errors[0].startswith(f"--accelperf-markdown: cannot write {tmp_path}")


# -- JUnit -------------------------------------------------------------------------------------
def test_junit_properties_carry_metrics_and_verdicts() -> None:
    record = _by_case(synthetic_report())["jax-mesh2x1-b64"]
    props = dict(junit_properties(record))
    assert props["accelperf.verdict"] == "regression"
    assert props["accelperf.outcome"] == "ok"
    assert props["accelperf.platform"] == PLATFORM
    assert props["accelperf.throughput.verdict"] == "regression"
    assert props["accelperf.throughput.unit"] == "samples/s"
    assert float(props["accelperf.throughput.change"]) < -0.5
    assert float(props["accelperf.samples_per_second"]) == pytest.approx(
        float(props["accelperf.throughput.now"]), rel=1e-5)
    assert props["accelperf.memory.verdict"] == "pass"
    assert props["accelperf.peak_memory_bytes"] == str((3 << 20) + (1 << 18))
    assert props["accelperf.throughput.detail"].startswith("slower: step time")
    assert all(name.startswith("accelperf.") and isinstance(v, str) for name, v in props.items())



def test_suite_properties_count_the_session() -> None:
    report = synthetic_report()
    props = dict(suite_properties(report))
    assert (props["accelperf.accel"], props["accelperf.platform"]) == ("cpu", PLATFORM)
    assert props["accelperf.cases"] == "7"
    assert props["accelperf.cases_regressed"] == str(len(report.regressions)) != "0"
    counts = report.counts()
    assert {k: int(props[f"accelperf.checks.{k}"]) for k in counts} == counts
    assert props["accelperf.checks.regression"] != "0"
    assert props["accelperf.package.jax"] == "0.10.2"
    assert props["accelperf.fingerprint"] == fingerprint_hash(report.environment.to_json())
    assert props["accelperf.update"] == "false"
    assert "accelperf.errors" not in props  # a case's error is the case's, not the session's


# -- history -----------------------------------------------------------------------------------
def test_history_appends_one_line_per_case_with_commit_and_fingerprint(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    git = shutil.which("git")
    commit = None
    if git:
        env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
               "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
        for cmd in (["init", "-q"], ["commit", "-q", "--allow-empty", "-m", "x"]):
            subprocess.run([git, *cmd], cwd=repo, check=True, env=env)
        commit = subprocess.run([git, "rev-parse", "HEAD"], cwd=repo, check=True,
                                capture_output=True, text=True).stdout.strip()
    report = synthetic_report()
    paths = append_history(tmp_path / "hist", report, cwd=repo)
    append_history(tmp_path / "hist", report, cwd=repo)
    assert paths == [tmp_path / "hist" / f"{PLATFORM}.jsonl"]
    assert sorted(os.listdir(tmp_path / "hist")) == [f"{PLATFORM}.jsonl"]  # no lock file
    entries = read_history(tmp_path / "hist")
    assert len(entries) == 2 * len(report.records)
    first = next(e for e in entries if e["case_id"] == "jax-mesh2x1-b64")
    assert first["commit"] == commit
    assert first["verdict"] == "regression"
    assert first["checks"]["throughput"] == "regression"
    assert re.fullmatch(r"[0-9a-f]{16}", first["fingerprint"])
    assert first["environment"]["platform"] == PLATFORM
    assert first["samples_per_second"] == pytest.approx(
        _by_case(report)["jax-mesh2x1-b64"].run["derived"]["samples_per_second"])


def test_history_corrupt_line_names_file_and_line(tmp_path: Path) -> None:
    hist = tmp_path / "hist"
    hist.mkdir()
    (hist / "cpu-x2.jsonl").write_text('{"nodeid": "a", "session": "s"}\n{"nodeid": \n')
    with pytest.raises(HistoryError, match=r"cpu-x2.jsonl:2: not a history entry .*delete or"):
        read_history(hist)
    with pytest.raises(HistoryError, match="no history directory"):
        read_history(tmp_path / "absent")


@pytest.mark.parametrize(("field", "value"), [("branch", 1), ("machine_name", ["a"]),
                                              ("step_time_interval", [0.1]),
                                              ("memory_per_device", {"0": "big"})])
def test_history_fields_outside_the_printed_schema_are_validated(
        tmp_path: Path, field: str, value: object) -> None:
    # HistoryLine declares them (kept out of `accelperf schema history` as published), so
    # a line with a wrong one is refused by name instead of kept as an unknown key
    hist = tmp_path / "hist"
    hist.mkdir()
    (hist / "cpu-x2.jsonl").write_text(
        json.dumps({"nodeid": "a", "session": "s", field: value}) + "\n")
    with pytest.raises(HistoryError, match=rf"cpu-x2.jsonl:1: not a history entry \({field}"):
        read_history(hist)


# -- HTML --------------------------------------------------------------------------------------
def _history_for(report: SessionReport, tmp_path: Path) -> list[dict[str, Any]]:
    hist = tmp_path / "hist"
    for _ in range(3):
        append_history(hist, report, cwd=tmp_path)
    return read_history(hist)


def test_html_is_self_contained_with_plots_and_regressions_first(tmp_path: Path) -> None:
    pytest.importorskip("vl_convert")  # the plotting library's JavaScript
    from pytest_accelperf.report.vegajs import vega_js

    report = synthetic_report()
    text = html_report(report, history=_history_for(report, tmp_path))
    assert not re.search(r"(src|href)=\"(https?:|//|file:)", text)
    assert "<script src" not in text and "<img" not in text  # everything inline
    specs = report_specs(text)
    # 6 cases with runs (the error has none) x (loss, step time, memory) + 1 throughput
    # plot (mesh2x1 and no mesh share one test) + 1 history trend
    assert len(specs) == 6 * 3 + 1 + 1
    assert len(re.findall(r'<div class="chart" data-spec="\d+"></div>', text)) == len(specs)
    packed = re.search(r'id="accelperf-vega-gz">([A-Za-z0-9+/=]+)</script>', text).group(1)
    assert gzip.decompress(base64.b64decode(packed)).decode() == vega_js()  # once, gzipped
    throughput = next(s for s in specs if s["title"] == "test_sweep: samples/s")
    bars = {(r["case"], r["which"]): r for r in throughput["data"]["values"]}
    now = bars[("mesh2x1 · b64", "this run")]
    assert now["lo"] < now["sps"] < now["hi"]  # the interval of its median step time
    loss = next(s for s in specs if s["title"].startswith("loss"))
    band = loss["layer"][0]["data"]["values"]
    assert band and all(r["low"] < r["baseline"] < r["high"] for r in band)
    order = [text.index(f'">test_sweep[{cid}] <span class="v') for cid in
             ("jax-nomesh-b8-broken", "jax-mesh2x1-b64", "jax-mesh2x1-b128", "jax-nomesh-b64")]
    assert order == sorted(order)
    assert "Throughput across batch sizes and meshes" in text
    assert "21 entries over 3 session(s)" in text
    assert "RuntimeError: boom | bang" in text


def test_a_report_of_the_suites_size_stays_under_a_megabyte() -> None:
    pytest.importorskip("vl_convert")
    report = synthetic_report()
    base = [r for r in report.records if r.run.get("step_times")]
    # 63 cases as the suites have, each with 30 steps (the suites' blocks: 23 on average)
    report.records = [dataclasses.replace(r, nodeid=f"{r.nodeid[:-1]}-{k}]",
                                          case_id=f"{r.case_id}-{k}")
                      for k in range(11) for r in base][:63]
    size = len(html_report(report).encode())
    assert size < 1_000_000, size  # 4.3 MB of PNGs before; about 0.56 MB


# -- loading a saved report --------------------------------------------------------------------
def test_saved_report_round_trips(tmp_path: Path) -> None:
    report = synthetic_report()
    path = tmp_path / "r.json"
    path.write_text(json.dumps(report.to_json(1), default=str))
    loaded, raw = load_report(path)
    assert raw["exit_status"] == 1
    assert [r.nodeid for r in loaded.records] == [r.nodeid for r in report.sorted_records()]
    assert loaded.counts() == report.counts()
    assert markdown(loaded) == markdown(report)


@pytest.mark.parametrize(("text", "message"), [
    ('{"cases": [', r"r.json:1:12: corrupt JSON report .*pass the file that pytest "
                    r"--accelperf-json wrote"),
    ('{"summary": {}}', r"not an accelperf JSON report \(no 'cases' list\); write one with "
                        r"pytest --accelperf-json"),
    ('{"schema_version": 99, "cases": []}', r"schema_version is 99"),
    ('{"schema_version": 1, "cases": [{"nodeid": "a::b"}]}', r"case a::b lacks case_id"),
])
def test_bad_report_files_name_the_fix(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "r.json"
    path.write_text(text)
    with pytest.raises(ReportFileError, match=message):
        load_report(path)
    with pytest.raises(ReportFileError, match="no such report; write one with"):
        load_report(tmp_path / "missing.json")


# -- progress ----------------------------------------------------------------------------------
class _Line:
    """A terminal line that honours backspace, as a tty does."""

    def __init__(self, text: str) -> None:
        self.chars = list(text)
        self.col = len(text)

    def write(self, text: str) -> None:
        for ch in text:
            if ch == "\b":
                self.col = max(0, self.col - 1)
                continue
            if self.col < len(self.chars):
                self.chars[self.col] = ch
            else:
                self.chars.append(ch)
            self.col += 1

    @property
    def text(self) -> str:
        return "".join(self.chars).rstrip()


def test_progress_shows_on_the_line_then_leaves_it_as_it_was() -> None:
    line = _Line("suites/test_m.py ..")
    now = [0.0]
    sink = LineProgress(line.write, lambda: 80, delay=1.0, interval=0.25,
                        clock=lambda: now[0])
    with reporting(sink):
        step(1, 40, 2.5, 0.012)  # within the delay: nothing
        assert line.text == "suites/test_m.py .."
        now[0] = 1.5
        step(12, 40, 2.41234, 0.0132)
        assert line.text == "suites/test_m.py .. [step 12/40 · loss 2.412 · 13.2 ms/step]"
        now[0] = 1.6
        step(13, 40, 2.4, 0.013)  # throttled
        assert "step 12/40" in line.text
        now[0] = 2.0
        step(40, 40, 1.5, 2.5)
        assert line.text == "suites/test_m.py .. [step 40/40 · loss 1.5 · 2500.0 ms/step]"
    assert line.text == "suites/test_m.py .."
    assert line.col == len("suites/test_m.py ..")
    step(1, 2, 1.0, 1.0)  # no sink installed: a no-op
    assert line.text == "suites/test_m.py .."


def test_progress_hides_rather_than_wraps_a_full_line() -> None:
    line = _Line("x" * 70)
    sink = LineProgress(line.write, lambda: 10, delay=0.0, interval=0.0)
    sink.update(1, 2, 1.0, 0.5)
    sink.close()
    assert line.text == "x" * 70
    assert progress_text(3, 9, 0.5, 12.0) == " [step 3/9 · loss 0.5 · 12.0 s/step]"


def test_progress_is_quiet_when_not_a_tty_or_quiet(pytester: pytest.Pytester) -> None:
    pytester.makeconftest('''
        from pytest_accelperf.backends.measure.progress import terminal_progress

        def pytest_sessionfinish(session):
            print("SINK", terminal_progress(session.config))
    ''')
    pytester.makepyfile("def test_x(): pass")
    # pytester's output is a pipe, not a terminal
    pytester.runpytest("-s").stdout.fnmatch_lines(["*SINK None*"])


def test_terminal_marks_a_change_that_is_not_now_over_baseline() -> None:
    """A drift-corrected or session-centred throughput change is starred, with a footnote;
    a plain one (and A/B, and other metrics) is not."""
    def tp(**data: object) -> CheckResult:
        return CheckResult("throughput", Verdict.PASS, "d", baseline=900.0, now=980.0,
                           unit="samples/s", change=-0.013, data=dict(data))

    def lines(*checks: CheckResult) -> list[str]:
        record = CaseRecord(nodeid="m.py::t[x]", case_id="x", platform=PLATFORM, run={},
                            checks=list(checks))
        return table_lines(SessionReport(accel="cpu", platform=PLATFORM, records=[record]))

    plain = lines(tp(drift_corrected=False, sessions=1, session_sd=None),
                  tp(mode="ab", drift_corrected=True))
    assert not any("*" in line for line in plain), plain
    for check in (tp(drift_corrected=True),
                  tp(drift_corrected=False, sessions=3, session_sd=0.05)):
        out = lines(check)
        assert any(line.split()[-2:] == ["-1.3%*", "pass"] for line in out), out
        assert any(line.startswith("* the gate's estimate") for line in out), out
