"""The `accelperf` CLI, and the reports of a real session end to end.

The end-to-end test is the flow a reviewer follows: a run with a regression writes the
Markdown, JUnit properties, HTML and history; `accelperf baselines accept` on its JSON report
stores the measured run; the next run passes.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from conftest import Suite, verdicts

from pytest_accelperf.checks.summary import summarize
from pytest_accelperf.cli import main
from pytest_accelperf.collect.cases import Case
from pytest_accelperf.gate.options import tomllib  # tomllib, or tomli on Python 3.10
from pytest_accelperf.report.history import fingerprint_hash
from pytest_accelperf.store import jsonfile
from pytest_accelperf.store.baselines import BaselineStore
from unit.report.test_reports import MODULE, PLATFORM, make_run, synthetic_report


def _junit_props(path: Path) -> dict[str, dict[str, str]]:
    """``{test name: {property: value}}`` of a JUnit XML file."""
    out: dict[str, dict[str, str]] = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        out[case.attrib["name"]] = {p.attrib["name"]: p.attrib["value"]
                                    for p in case.iter("property")}
    return out


def _claim_forty_times_the_throughput(block: dict[str, Any]) -> None:
    # 40x, not 4x: beside another xdist worker the run's step times scattered so widely that
    # a claimed 4x (measured 2.3x) was inconclusive at the 50 % tolerance (CI at a9d1fe8).
    st = block["step_time"]
    st["samples"] = [t / 40 for t in st["samples"]]
    st["median"] /= 40
    for session in st.get("sessions") or []:
        session["median"] /= 40
    block["samples_per_second"] *= 40


ONE_CASE = '''
from tinytask import make_task
from pytest_accelperf import cases

@cases(backend="jax", batch=[256], steps=20, warmup=2, params={"dim": 512, "out": 512})
def test_sweep(accelperf):
    accelperf.train(make_task(accelperf.case))
'''


@pytest.mark.slow  # 63 s under -n 2 (2026-11-29)
def test_regression_writes_every_report_and_accept_makes_the_next_run_pass(
        suite: Suite, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("vl_convert")  # --accelperf-html
    suite.write(ONE_CASE)
    suite.run("--accelperf-update").assert_outcomes(passed=1)
    suite.edit(_claim_forty_times_the_throughput)
    result = suite.run("--accelperf-json=report.json", "--accelperf-markdown=pr.md",
                       "--accelperf-html=report.html", "--accelperf-history=history",
                       "--junitxml=junit.xml", "--accelperf-confirm=0",
                       "--accelperf-throughput-tolerance=0.5")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*throughput*REGRESSION*",
                                 "accelperf: history appended to history/cpu-x8.jsonl",
                                 "accelperf: Markdown summary written to pr.md",
                                 "accelperf: HTML report written to report.html"])
    root = suite.pytester.path
    case = "test_sweep[jax-nomesh-b256]"

    md = (root / "pr.md").read_text()
    assert "### ❌ Regressions" in md
    assert f"| `{case}` | throughput |" in md
    assert f"accelperf baselines accept report.json --case '{case}'" in md

    props = _junit_props(root / "junit.xml")[case]
    assert props["accelperf.verdict"] == "regression"
    assert props["accelperf.throughput.verdict"] == "regression"
    assert props["accelperf.loss.verdict"] == "pass"
    assert float(props["accelperf.throughput.change"]) < 0

    html = (root / "report.html").read_text()
    assert html.count("data-spec=") >= 1 and "accelperf-vega-gz" in html
    assert f'{case} <span class="v v-regression">REGRESSION</span>' in html

    lines = (root / "history" / "cpu-x8.jsonl").read_text().splitlines()
    assert len(lines) == 1
    entry = json.loads(lines[0])
    assert entry["nodeid"] == f"test_suite.py::{case}"
    assert entry["verdict"] == "regression"
    assert {"commit", "dirty", "fingerprint", "environment"} <= set(entry)

    measured = suite.report()["cases"][0]["run"]["derived"]["samples_per_second"]
    capsys.readouterr()
    assert main(["baselines", "accept", "report.json", "--case", case,
                 "--baselines", "baselines"]) == 0
    out = capsys.readouterr().out
    assert f"accept test_suite.py::{case} [cpu-x8]: throughput regression" in out
    assert "written baselines/cpu-x8/test_suite.json" in out
    stored = suite.load()["cases"][case]
    assert stored["samples_per_second"] == pytest.approx(measured, rel=1e-4)
    assert stored["outcome"] == "ok"

    after = suite.run("--accelperf-json=after.json", "--accelperf-history=history")
    after.assert_outcomes(passed=1)
    assert verdicts(suite.report("after.json"))[case]["throughput"] in ("pass", "inconclusive")
    assert len((root / "history" / "cpu-x8.jsonl").read_text().splitlines()) == 2


TWO_SMALL = '''
from tinytask import make_task
from pytest_accelperf import cases

@cases(backend="jax", mesh=[None, (4, 2)], batch=[16], steps=4, warmup=1)
def test_small(accelperf):
    accelperf.train(make_task(accelperf.case))
'''


@pytest.mark.slow  # 21 s under -n 2 (2026-11-29)
def test_junit_properties_survive_xdist(suite: Suite) -> None:
    suite.write(TWO_SMALL)
    result = suite.run("-n", "2", "--accelperf-update", "--junitxml=junit.xml",
                       "--accelperf-json=report.json")
    result.assert_outcomes(passed=2)
    props = _junit_props(suite.pytester.path / "junit.xml")
    assert sorted(props) == ["test_small[jax-mesh4x2-b16]", "test_small[jax-nomesh-b16]"]
    for values in props.values():
        assert values["accelperf.verdict"] == "new"
        assert values["accelperf.outcome"] == "ok"
        assert values["accelperf.platform"] == "cpu-x8"
        assert float(values["accelperf.samples_per_second"]) > 0
    # The session's own properties, once, on the <testsuite>: written by the controller
    # after it merged both workers' cases.
    suite_props = _suite_props(suite.pytester.path / "junit.xml")
    assert suite_props["accelperf.platform"] == "cpu-x8"
    assert suite_props["accelperf.accel"] == "cpu"
    assert suite_props["accelperf.cases"] == "2"
    assert suite_props["accelperf.cases_regressed"] == "0"
    assert suite_props["accelperf.update"] == "true"
    assert int(suite_props["accelperf.checks.new"]) >= 2 * 4
    assert suite_props["accelperf.checks.regression"] == "0"
    assert suite_props["accelperf.package.jax"] == importlib.metadata.version("jax")
    # the environment fingerprint's hash, as the history lines carry it
    environment = suite.report()["environment"]
    assert suite_props["accelperf.fingerprint"] == fingerprint_hash(environment)


def _suite_props(path: Path) -> dict[str, str]:
    """``{property: value}`` of the ``<testsuite>``'s own ``<properties>``."""
    suite = ET.parse(path).getroot().find("testsuite")
    assert suite is not None
    props = suite.find("properties")
    assert props is not None, "no <properties> on the <testsuite>"
    return {p.attrib["name"]: p.attrib["value"] for p in props.iter("property")}


def test_console_script_is_declared() -> None:
    # Read from pyproject.toml, not the installed metadata: a stale *.egg-info in the
    # checkout can shadow the installed entry points of an editable install.
    project = tomllib.loads((Path(__file__).parents[3] / "pyproject.toml").read_text())
    target = project["project"]["scripts"]["accelperf"]
    module, _, name = target.partition(":")
    assert getattr(importlib.import_module(module), name) is main


# -- commands on a synthetic store -------------------------------------------------------------
def _store(root: Path, cases: dict[str, float]) -> BaselineStore:
    """A store of ``{case id suffix: step time}`` blocks of ``MODULE::test_sweep``."""
    store = BaselineStore(root, PLATFORM)
    blocks = {}
    for label, step_time in cases.items():
        case = Case(backend="jax", batch=64, label=label)
        blocks[f"{MODULE}::test_sweep[{case.id}]"] = summarize(
            make_run(case, step_time=step_time)).to_json()
    store.write(blocks)
    return store


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    status = main(list(argv))
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_show_lists_cases_and_filters(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = _store(workdir / "baselines", {"a": 0.01, "b": 0.02})
    status, out, _ = _run(capsys, "baselines", "show")
    assert status == 0
    row = next(line for line in out.splitlines() if "test_sweep[jax-nomesh-b64-a]" in line)
    block = store.get(f"{MODULE}::test_sweep[jax-nomesh-b64-a]")
    assert block is not None
    assert row.split()[:3] == [PLATFORM, f"{MODULE}::test_sweep[jax-nomesh-b64-a]", "ok"]
    assert f"{block.samples_per_second:,.1f}/s" in row
    assert out.rstrip().endswith("2 case(s) in baselines")
    status, out, _ = _run(capsys, "baselines", "show", "*-b")
    assert "b64-a]" not in out and "b64-b]" in out


def test_missing_store_and_unknown_platform_name_the_fix(
        workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err = _run(capsys, "baselines", "show")
    assert status == 1
    assert err.startswith("accelperf: error: no baseline store at baselines: pass --baselines")
    _store(workdir / "baselines", {"a": 0.01})
    status, _, err = _run(capsys, "baselines", "show", "--platform", "tpu-v4-x8")
    assert status == 1
    assert "no platform 'tpu-v4-x8' in baselines; it has: cpu-x2" in err


def test_diff_of_two_stores(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _store(workdir / "old", {"a": 0.01, "b": 0.02, "gone": 0.01})
    _store(workdir / "new", {"a": 0.01, "b": 0.04, "added": 0.01})
    status, out, _ = _run(capsys, "baselines", "diff", "old", "new")
    assert status == 0
    rows = {line.split()[0]: line for line in out.splitlines() if line.startswith("cpu-x2:")}
    assert "+0.0%" not in out
    assert "-50.0%" in rows[f"cpu-x2:{MODULE}::test_sweep[jax-nomesh-b64-b]"]
    assert "(removed)" in rows[f"cpu-x2:{MODULE}::test_sweep[jax-nomesh-b64-gone]"]
    assert "(added)" in rows[f"cpu-x2:{MODULE}::test_sweep[jax-nomesh-b64-added]"]
    assert out.rstrip().endswith("3 case(s) differ, 1 equal")


def test_diff_of_a_report_against_the_store(workdir: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    report = synthetic_report()
    (workdir / "r.json").write_text(json.dumps(report.to_json(1), default=str))
    _store(workdir / "baselines", {"unrelated": 0.01})
    status, out, _ = _run(capsys, "baselines", "diff", "baselines", "r.json")
    assert status == 0
    assert "(removed)" not in out  # a report covers only what ran
    assert f"cpu-x2:{MODULE}::test_sweep[jax-mesh2x1-b64]" in out


def test_show_and_diff_read_the_store_through_the_schema(
        workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A stored block the schema refuses (a loss that is a list, which ``show`` read as a
    dict: AttributeError) is one line naming the file, the line, the case and the field,
    from ``show`` as from ``diff`` and the pytest run."""
    _store(workdir / "baselines", {"a": 0.01, "b": 0.02})
    [path] = (workdir / "baselines").rglob("*.json")
    data = json.loads(path.read_text())
    key = next(k for k in data["cases"] if k.endswith("-b]"))
    data["cases"][key]["loss"] = [1, 2]
    path.write_text(json.dumps(data, indent=2))
    line = next(i for i, text in enumerate(path.read_text().splitlines(), 1)
                if '"loss": [' in text)
    for argv in (("baselines", "show"), ("baselines", "diff", "baselines", "baselines")):
        status, out, err = _run(capsys, *argv)
        assert status == 1, argv
        assert err.splitlines() == [
            f"accelperf: error: {path.relative_to(workdir)}:{line}: case {key!r}: invalid "
            f"baseline block: loss: should be a JSON object (found [1, 2]). Fix the block, or "
            f"re-record the case with --accelperf-update (which replaces an invalid block and "
            f"keeps the file's other cases)"], argv
        assert out == ""


def test_a_report_whose_stored_block_is_invalid_is_named_not_a_traceback(
        workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The block a report's case stored is read through the schema too: ``diff`` names the
    report's line and the case; ``accept`` refuses it before reading what the schema did
    not type (a ``numerics`` list ended in AttributeError)."""
    _store(workdir / "baselines", {"a": 0.01})
    good = json.loads(json.dumps(summarize(make_run(Case(backend="jax", batch=8),
                                                    step_time=0.01)).to_json()))
    for field, value, shown in (("loss", [1, 2], "loss: should be a JSON object (found [1, 2])"),
                                ("numerics", [1], "numerics: should be a JSON object (found "
                                                  "[1])")):
        data = json.loads(json.dumps(synthetic_report().to_json(1), default=str))
        data["cases"][0]["block"] = {**good, field: value}
        nodeid = data["cases"][0]["nodeid"]
        text = json.dumps(data, indent=1)
        (workdir / "r.json").write_text(text)
        line = jsonfile.locate(text, ["cases", 0])
        status, _, err = _run(capsys, "baselines", "diff", "baselines", "r.json")
        assert status == 1
        assert err.splitlines() == [
            f"accelperf: error: r.json:{line}: case {nodeid!r}: invalid baseline block: "
            f"{shown}; the report was edited or written by another version: write one with "
            f"pytest --accelperf-json=PATH"]
        status, _, err = _run(capsys, "baselines", "accept", "r.json", "--case", nodeid)
        assert status == 1
        assert err.startswith(f"accelperf: error: r.json:{line}: case {nodeid!r} "
                              f"[{data['cases'][0]['platform']}]: not stored as a baseline: "
                              f"invalid block: {shown}.")
        assert "Traceback" not in err and "nothing was written" in err


def test_accept_needs_a_choice_and_names_unknown_patterns(
        workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (workdir / "r.json").write_text(json.dumps(synthetic_report().to_json(1), default=str))
    (workdir / "baselines").mkdir()
    status, _, err = _run(capsys, "baselines", "accept", "r.json")
    assert status == 1 and "choose the cases to accept: --case PATTERN" in err
    status, _, err = _run(capsys, "baselines", "accept", "r.json", "--case", "nope[*]")
    assert status == 1
    assert "no case in r.json matches --case 'nope[*]'; it has: test_sweep[jax-mesh2x1-b128]" \
        in err
    status, _, err = _run(capsys, "baselines", "accept", "r.json", "--case", "*broken*")
    assert status == 1
    assert ("never stored as a baseline: the run ended with outcome error (RuntimeError: "
            "boom | bang)") in err
    assert not any((workdir / "baselines").iterdir())


def test_accept_writes_chosen_blocks_built_from_the_reported_run(
        workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = synthetic_report()
    (workdir / "r.json").write_text(json.dumps(report.to_json(1), default=str))
    store = _store(workdir / "baselines", {"keep": 0.01})
    status, out, _ = _run(capsys, "baselines", "accept", "r.json", "--case",
                          "jax-mesh2x1-*", "--dry-run")
    assert status == 0 and "dry run: 2 case(s) not written" in out
    status, out, _ = _run(capsys, "baselines", "accept", "r.json", "--case", "jax-mesh2x1-*")
    assert status == 0
    assert "accepted 2 case(s)" in out
    data = json.loads(store.path_for(f"{MODULE}::x").read_text())
    assert sorted(data["cases"]) == ["test_sweep[jax-mesh2x1-b128]",
                                     "test_sweep[jax-mesh2x1-b64]",
                                     "test_sweep[jax-nomesh-b64-keep]"]
    reg = next(r for r in report.records if r.case_id == "jax-mesh2x1-b64")
    block = data["cases"]["test_sweep[jax-mesh2x1-b64]"]
    assert block["samples_per_second"] == pytest.approx(
        reg.run["derived"]["samples_per_second"], rel=1e-4)
    assert len(block["step_time"]["samples"]) == len(reg.run["step_times"])


def test_accept_refuses_what_only_the_base_revision_clears(
        workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Seen: accept printed 'accepted 1 case(s)' for a case whose failure was the A/B
    comparison, and the next run failed the same way. An A/B-only failure is refused; a case
    with stored-baseline failures too is accepted, with a note that A/B stays."""
    from pytest_accelperf.records.verdict import CheckResult, Verdict

    report = synthetic_report()
    ab = CheckResult("throughput", Verdict.REGRESSION, "A/B slower than main (abc): step time "
                     "12% longer", unit="samples/s", data={"mode": "ab", "ref": "main (abc)"})
    for record in report.records:
        if record.case_id in ("jax-nomesh-b64", "jax-mesh2x1-b64"):
            record.checks[:] = [ab, *[c for c in record.checks if c.metric != "throughput"]]
    (workdir / "r.json").write_text(json.dumps(report.to_json(1), default=str))
    (workdir / "baselines").mkdir()
    status, _, err = _run(capsys, "baselines", "accept", "r.json", "--case", "*nomesh-b64")
    assert status == 1
    assert "its only failure is the A/B comparison (A/B slower than main (abc)" in err
    assert "the base revision is what changes them" in err
    assert not any((workdir / "baselines").iterdir())
    mesh = next(r for r in report.records if r.case_id == "jax-mesh2x1-b64")
    mesh.checks.append(CheckResult("memory", Verdict.REGRESSION, "peak memory 30% higher"))
    (workdir / "r.json").write_text(json.dumps(report.to_json(1), default=str))
    status, out, _ = _run(capsys, "baselines", "accept", "r.json", "--case", "*mesh2x1-b64")
    assert status == 0 and "accepted 1 case(s)" in out
    assert "note: its A/B throughput failure is not cleared by this" in out


def test_accept_of_a_corrupt_report_names_the_line(
        workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (workdir / "r.json").write_text('{"cases": [\n  {"nodeid": ')
    status, _, err = _run(capsys, "baselines", "accept", "r.json", "--all")
    assert status == 1
    assert err.startswith("accelperf: error: r.json:2:")
    assert "corrupt JSON report" in err


def test_prune_with_a_node_id_list(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = _store(workdir / "baselines", {"a": 0.01, "b": 0.01})
    other = BaselineStore(workdir / "baselines", PLATFORM)
    block = summarize(make_run(Case(backend="jax", batch=8), step_time=0.01)).to_json()
    other.write({"suites/test_gone.py::test_x[jax-nomesh-b8]": block,
                 "suites/test_other.py::test_y[jax-nomesh-b8]": block})
    (workdir / "suites").mkdir()
    (workdir / "suites" / "test_m.py").write_text("")
    (workdir / "suites" / "test_other.py").write_text("")
    (workdir / "ids.txt").write_text(f"{MODULE}::test_sweep[jax-nomesh-b64-a]\n\n"
                                     "1 test collected in 0.01s\n")
    status, out, _ = _run(capsys, "baselines", "prune", "--nodeids", "ids.txt", "--dry-run")
    assert status == 0
    assert "would drop 1 case(s)" in out
    status, out, _ = _run(capsys, "baselines", "prune", "--nodeids", "ids.txt")
    assert status == 0
    assert "left alone (not collected here): suites/test_other.py" in out
    assert f"drop {MODULE}::test_sweep[jax-nomesh-b64-b] [cpu-x2]" in out
    # a node id list does not say which rootdir its ids are relative to: a module that is
    # not in it is left alone, deleted or not (prune SUITES collects and knows)
    assert "left alone (not collected here): suites/test_gone.py" in out
    assert (workdir / "baselines" / PLATFORM / "suites" / "test_gone.json").exists()
    assert sorted(json.loads(store.path_for(MODULE + "::x").read_text())["cases"]) == [
        "test_sweep[jax-nomesh-b64-a]"]
    assert (workdir / "baselines" / PLATFORM / "suites" / "test_other.json").exists()


@pytest.mark.slow  # 16 s under -n 2 (2026-11-29)
def test_prune_collects_with_pytest(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = BaselineStore(workdir / "baselines", PLATFORM)
    block = summarize(make_run(Case(backend="jax", batch=8), step_time=0.01)).to_json()
    store.write({"test_p.py::test_p[1]": block, "test_p.py::test_p[3]": block})
    (workdir / "test_p.py").write_text(
        "import pytest\n\n@pytest.mark.parametrize('n', [1, 2])\ndef test_p(n):\n    pass\n")
    status, out, _ = _run(capsys, "baselines", "prune", "test_p.py")
    assert status == 0, out
    assert "drop test_p.py::test_p[3] [cpu-x2]" in out
    assert "dropped 1 case(s) no longer collected; 2 collected" in out
    assert sorted(json.loads((workdir / "baselines" / PLATFORM / "test_p.json").read_text())
                  ["cases"]) == ["test_p[1]"]
    (workdir / "test_p.py").write_text("def test_p(:\n")
    status, _, err = _run(capsys, "baselines", "prune", "test_p.py")
    assert status == 1 and "collection failed (exit 2)" in err and "nothing was pruned" in err


def test_report_renders_markdown_and_html(workdir: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("vl_convert")  # --html
    (workdir / "r.json").write_text(json.dumps(synthetic_report().to_json(1), default=str))
    status, out, _ = _run(capsys, "report", "r.json")
    assert status == 0
    assert out.startswith("## accelperf\n")
    assert "accelperf baselines accept r.json --case 'test_sweep[jax-mesh2x1-b64]'" in out
    status, out, _ = _run(capsys, "report", "r.json", "--html", "out/r.html", "--markdown",
                          "out/r.md")
    assert status == 0
    page = (workdir / "out" / "r.html").read_text()
    assert page.count('<div class="chart" data-spec=') >= 6 and "accelperf-vega-gz" in page
    assert (workdir / "out" / "r.md").read_text().startswith("## accelperf")
    status, _, err = _run(capsys, "report", "missing.json")
    assert status == 1 and "no such report; write one with pytest --accelperf-json" in err


def test_help_lists_the_commands(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for command in ("baselines", "report"):
        assert command in out
    with pytest.raises(SystemExit) as exc:
        main(["baselines", "--help"])
    out = capsys.readouterr().out
    for action in ("show", "diff", "accept", "prune"):
        assert action in out
