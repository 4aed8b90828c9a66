"""``accelperf history publish``: the history as a static site (report/site.py), and what
the history lines carry for it (branch, the interval of the median step time, memory per
device)."""

from __future__ import annotations

import datetime as dt
import json
import math
import random
import re
from pathlib import Path
from typing import Any

import pytest

from pytest_accelperf.cli import main
from pytest_accelperf.provision.describe import case_stack, machine
from pytest_accelperf.report.history import append_history, fingerprint_hash, read_history
from pytest_accelperf.report.site import MARKER, read_lines
from pytest_accelperf.store.machines import default_machine
from unit.report.test_reports import synthetic_report

pytest.importorskip("vl_convert")  # the plotting library's JavaScript

ENV: dict[str, Any] = {
    "accel": "cpu", "cpu_isa": "avx avx2 fma", "device_count": 2, "device_kind": "cpu",
    "host_cpu": "AMD EPYC", "libraries": {}, "packages": {"jax": "0.10.2", "jaxlib": "0.10.2"},
    "platform": "cpu-x2", "python": "3.11.7"}
CASES = ("jax-a", "jax-b")
NODE = "suites/test_s.py::test_s[{}]"


def write_history(directory: Path, sessions: int = 30, seed: int = 0) -> Path:
    """A history of two cases: a second machine from session 10 (every other session), a
    jax upgrade at session 20, the first case's FLOPs doubled at session 8 (one commit
    range to bisect), two branches; each line as pytest --accelperf-history writes it."""
    rng = random.Random(seed)
    directory.mkdir(parents=True, exist_ok=True)
    lines: list[str] = []
    start = dt.datetime(2026, 11, 1, tzinfo=dt.timezone.utc)
    for s in range(sessions):
        moment = start + dt.timedelta(hours=s)
        env = json.loads(json.dumps(ENV))
        if s >= 10 and s % 2:
            env["cpu_isa"] += " avx_vnni"
        if s >= 20:
            env["packages"].update(jax="0.10.3", jaxlib="0.10.3")
        for k, case in enumerate(CASES):
            step = 0.01 * (k + 1) * math.exp(rng.gauss(0, 0.02))
            flops = 1e9 * (2 if k == 0 and s >= 8 else 1)
            lines.append(json.dumps({
                "schema_version": 1, "session": f"{moment:%Y%m%dT%H%M%SZ}-{s:08x}",
                "time": moment.isoformat(), "commit": f"{s:02d}" + "c" * 38, "dirty": False,
                "platform": "cpu-x2", "branch": "main" if s % 3 else "feature",
                "nodeid": NODE.format(case), "case_id": case,
                "case": {"backend": "jax", "batch": 16}, "outcome": "ok",
                "verdict": "regression" if k == 0 and s == 8 else "pass",
                "checks": {"throughput": "pass"}, "samples_per_second": 16 / step,
                "median_step_time": step, "step_time_interval": [step * 0.98, step * 1.03],
                "peak_memory": 3e6, "compile_time": 1.5, "final_loss": 2.5,
                "memory_per_device": {"cpu0": 3e6, "cpu1": 2.9e6},
                "fingerprint": fingerprint_hash(env), "machine": fingerprint_hash(machine(env)),
                "stack": fingerprint_hash(case_stack(env, "jax")), "environment": env,
                "program": {"source": "xla", "flops": flops, "bytes_accessed": 4e6,
                            "host_syncs": 0}}))
    path = directory / "cpu-x2.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def _data(page: str) -> dict[str, Any]:
    found = re.search(r'<script type="application/json" id="accelperf-data">(.*?)</script>',
                      page)
    assert found is not None
    data: dict[str, Any] = json.loads(found.group(1))
    return data


def _column(col: Any) -> list[Any]:
    if isinstance(col, dict):
        return [v for v, n in col["r"] for _ in range(n)]
    return list(col)


def test_publish_writes_one_folder_of_pages_sharing_one_copy_of_the_library(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_history(tmp_path / "hist")
    out = tmp_path / "site"
    assert main(["history", "publish", str(tmp_path / "hist"), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert re.fullmatch(r"published 2 case\(s\) over 30 session\(s\) on 2 machine\(s\) to "
                        rf"{re.escape(str(out))}/index\.html \(6 files, \d\.\d MiB\)\n", printed)
    files = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    pages = [f for f in files if f.startswith("cases/")]
    assert len(pages) == 2
    assert set(files) == {MARKER, "accelperf.css", "accelperf.js", "index.html", "vega.js",
                          *pages}
    assert json.loads((out / MARKER).read_text())["files"] == sorted(set(files) - {MARKER})
    # the library once, in the folder; every page refers to it, nothing to the network
    holders = [f for f in files if "vegaEmbed=" in (out / f).read_text()]
    assert holders == ["vega.js"]
    for page in ("index.html", *pages):
        text = (out / page).read_text()
        root = "../" if page.startswith("cases/") else ""
        assert f'<script src="{root}vega.js"></script>' in text
        assert not re.search(r"(src|href)=\"(https?:|//)", text)
    index = (out / "index.html").read_text()
    # a row per case and machine: its sparkline, latest verdict and machine
    rows = re.findall(r'<tr data-machine="(amd-epyc-[0-9a-f]{8})" data-branches="([^"]*)">', index)
    assert len(rows) == 4 and {b for _, b in rows} == {"feature main"}
    assert index.count('<svg class="spark"') == 4 and "<path d=\"M" in index
    assert index.count('<span class="v v-pass">pass</span>') == 4


def test_a_case_page_holds_its_series_and_marks_each_change(tmp_path: Path) -> None:
    write_history(tmp_path / "hist")
    assert main(["history", "publish", str(tmp_path / "hist"), "--out",
                 str(tmp_path / "site")]) == 0
    page = next(p for p in (tmp_path / "site" / "cases").iterdir() if "jax-a" in p.name)
    text = page.read_text()
    data = _data(text)
    assert data["n"] == 30
    step, lo, hi = (_column(data["cols"][k]) for k in ("step", "lo", "hi"))
    assert all(a < s < b for a, s, b in zip(lo, step, hi, strict=True))
    flops = _column(data["cols"]["flops"])
    assert flops[:8] == [1e9] * 8 and flops[8:] == [2e9] * 22
    assert isinstance(data["cols"]["flops"], dict)  # an exact series: two runs, not 30 values
    assert sorted(data["devices"]) == ["cpu0", "cpu1"]
    marks = {m["metric"]: m for m in data["marks"]}
    assert marks["FLOPs"]["label"] == "FLOPs +100.0%" and marks["FLOPs"]["kind"] == "worse"
    assert marks["FLOPs"]["x"] == 7.5
    assert marks["FLOPs"]["bisect"] == (f"accelperf bisect 07{'c' * 10} 08{'c' * 10} -- "
                                        f"'{NODE.format('jax-a')}' --accel=cpu")
    assert marks["stack"]["label"] == "jax 0.10.2 → 0.10.3, jaxlib 0.10.2 → 0.10.3"
    assert marks["environment"]["kind"] == "machine"
    assert re.fullmatch(r"machine: amd-epyc-[0-9a-f]{8}", marks["environment"]["label"])
    titles = re.findall(r'"title":"([^"]+)","width"', text)
    assert titles == ["median step time (band: each session's 95% interval)", "compile time",
                      "peak memory per device", "FLOPs per step (exact)",
                      "bytes accessed per step (exact)", "host syncs per step (exact)",
                      "final loss"]
    assert f"accelperf bisect 07{'c' * 10}" in text  # the table of change points too


def test_bad_lines_are_skipped_and_counted_in_one_line_per_file(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_history(tmp_path / "hist", sessions=6)
    with path.open("a") as f:
        f.write("{not json\n")
        f.write(json.dumps({"schema_version": 2, "nodeid": "a", "session": "s"}) + "\n")
        f.write(json.dumps({"nodeid": "a", "session": "s", "dirty": "yes"}) + "\n")
        f.write(b"\xff\xfe\n".decode("latin-1"))
    assert main(["history", "publish", str(path), "--out", str(tmp_path / "site")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == (f"accelperf: skipped 4 line(s) of {path} (line 13, 14, 15, 16: not "
                        f"JSON, not a history entry, schema version 2, not 1)")
    assert lines[1].startswith("published 2 case(s) over 6 session(s)")
    assert "skipped 4 line(s)" in (tmp_path / "site" / "index.html").read_text()
    assert len(read_lines([path]).entries) == 12


def test_an_output_folder_it_did_not_make_is_refused_and_left_as_it_was(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_history(tmp_path / "hist", sessions=4)
    mine = tmp_path / "docs"
    mine.mkdir()
    (mine / "index.html").write_text("my own page")
    assert main(["history", "publish", str(tmp_path / "hist"), "--out", str(mine)]) == 1
    err = capsys.readouterr().err
    assert err == (f"accelperf: error: --out {mine}: exists and is not a site accelperf "
                   f"history publish made (no {MARKER}); give a new or empty directory\n")
    assert [p.name for p in mine.iterdir()] == ["index.html"]
    assert (mine / "index.html").read_text() == "my own page"
    assert main(["history", "publish", str(tmp_path / "hist"), "--out",
                 str(tmp_path / "hist" / "cpu-x2.jsonl")]) == 1
    assert "not a directory" in capsys.readouterr().err
    assert main(["history", "publish", str(tmp_path / "nowhere"), "--out",
                 str(tmp_path / "s")]) == 1
    assert "no history file or directory" in capsys.readouterr().err
    assert not (tmp_path / "s").exists()


def test_publishing_again_replaces_its_own_files_only(tmp_path: Path) -> None:
    hist = tmp_path / "hist"
    path = write_history(hist, sessions=5)
    out = tmp_path / "site"
    assert main(["history", "publish", str(hist), "--out", str(out)]) == 0
    (out / "notes.txt").write_text("kept")
    # the second case leaves the history: its page goes, the user's file stays
    kept = [line for line in path.read_text().splitlines() if "jax-b" not in line]
    path.write_text("\n".join(kept) + "\n")
    assert main(["history", "publish", str(hist), "--out", str(out)]) == 0
    assert (out / "notes.txt").read_text() == "kept"
    assert [p.name.split("-")[1] for p in (out / "cases").iterdir()] == ["jax"]
    assert len(list((out / "cases").iterdir())) == 1
    # a file of the user's where the site would write one is refused, not overwritten
    (out / "cases" / "x.html").write_text("mine")
    marker = json.loads((out / MARKER).read_text())
    page = next(f for f in marker["files"] if f.startswith("cases/"))
    marker["files"].remove(page)
    (out / MARKER).write_text(json.dumps(marker))
    assert main(["history", "publish", str(hist), "--out", str(out)]) == 1
    assert (out / "cases" / "x.html").read_text() == "mine"


def test_history_lines_carry_the_branch_the_interval_and_memory_per_device(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GITHUB_HEAD_REF", "feature/plots")  # no git here: CI's variable
    report = synthetic_report()
    append_history(tmp_path / "hist", report, cwd=tmp_path)
    entries = {e["case_id"]: e for e in read_history(tmp_path / "hist")}
    record = next(r for r in report.records if r.case_id == "jax-mesh2x1-b64")
    line = entries["jax-mesh2x1-b64"]
    assert line["branch"] == "feature/plots"
    lo, hi = line["step_time_interval"]
    assert lo <= line["median_step_time"] <= hi
    assert line["memory_per_device"] == record.run["memory_per_device"]
    # the machine as the store names it (no --accelperf-machine: derived from the host)
    assert line["machine_name"] == default_machine(line["environment"])
