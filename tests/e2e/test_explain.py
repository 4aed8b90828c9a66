"""Issue 27, part 3: a regression gets a profiler trace of a few more steps, kept beside
the report under a size cap, linked from the Markdown and HTML reports, with the program
diff as a table. Real scratch suites: a stored baseline edited to claim half the FLOPs
makes the case regress (the program check), as a changed model would."""

from __future__ import annotations

import json
from typing import Any

import pytest
from conftest import Suite

SMALL = '''
from tinytask import make_task
from pytest_accelperf import cases

@cases(backend="jax", batch=[16], steps=4, warmup=1)
def test_small(accelperf):
    accelperf.train(make_task(accelperf.case))
'''


def halve_the_flops(block: dict[str, Any]) -> None:
    """A stored block whose program did half the FLOPs this one does."""
    block["program"]["flops"] = block["program"]["flops"] / 2


def _regressed(suite: Suite, *args: str) -> pytest.RunResult:
    suite.write(SMALL)
    suite.run("--accelperf-update").assert_outcomes(passed=1)
    suite.edit(halve_the_flops)
    result = suite.run("--accelperf-json=out/report.json", *args)
    result.assert_outcomes(failed=1)
    return result


@pytest.mark.slow
def test_a_jax_regression_keeps_a_real_trace_beside_the_report(suite: Suite) -> None:
    result = _regressed(suite, "--accelperf-markdown=out/summary.md",
                        "--accelperf-html=out/report.html")
    where = suite.pytester.path / "out" / "accelperf-explain" / "jax-nomesh-b16"
    traces = [f for f in where.rglob("*") if f.is_file()]
    assert any(f.name.endswith(".xplane.pb") for f in traces), traces
    size = sum(f.stat().st_size for f in traces)
    assert 0 < size <= 20_000_000
    result.stdout.fnmatch_lines([f"*Profiler trace of 3 step(s) (*): {where}"])
    explained = suite.report("out/report.json")["cases"][0]["run"]["extra"]["explain"]
    assert explained["path"] == str(where) and explained["size"] == size
    assert explained["steps"] == 3
    assert (where.parent / ".gitignore").read_text().endswith("*\n")
    # linked from both reports, with the program diff (the FLOPs doubled) as a table
    md = (suite.pytester.path / "out" / "summary.md").read_text()
    assert "### 🔎 Profiler traces of the regressions" in md
    assert f"| `test_small[jax-nomesh-b16]` | `{where}` | 3 step(s), " in md
    now = suite.report("out/report.json")["cases"][0]["run"]["program"]["flops"]
    assert f"| `test_small[jax-nomesh-b16]` | program | `flops` | {now / 2:g} | {now:g} |" in md
    html = (suite.pytester.path / "out" / "report.html").read_text()
    assert f'<a href="{where.as_uri()}">{where}</a>' in html
    assert "<code>flops</code>" in html


@pytest.mark.slow
def test_a_trace_over_the_cap_is_deleted_and_the_failure_says_so(suite: Suite) -> None:
    result = _regressed(suite, "--accelperf-explain-max-mb=0.000001")
    result.stdout.fnmatch_lines(["*Profiler trace of 3 step(s) deleted: * is over the "
                                 "1 B cap (raise --accelperf-explain-max-mb)"])
    where = suite.pytester.path / "out" / "accelperf-explain" / "jax-nomesh-b16"
    assert not where.exists()
    explained = suite.report("out/report.json")["cases"][0]["run"]["extra"]["explain"]
    assert explained["path"] is None and explained["size"] > 1


@pytest.mark.slow
def test_off_traces_nothing(suite: Suite) -> None:
    result = _regressed(suite, "--accelperf-explain=off")
    assert "Profiler" not in result.stdout.str()
    assert not (suite.pytester.path / "out" / "accelperf-explain").exists()
    assert "explain" not in suite.report("out/report.json")["cases"][0]["run"]["extra"]


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_a_torch_regression_keeps_a_chrome_trace(suite: Suite) -> None:
    from e2e.test_confirm import torch_suite

    torch_suite(suite)
    suite.run("--accelperf-update").assert_outcomes(passed=1)
    suite.edit(halve_the_flops)
    result = suite.run("--accelperf-json=report.json")
    result.assert_outcomes(failed=1)
    trace = suite.pytester.path / "accelperf-explain" / "torch-nomesh-b128" / "trace.json"
    events = json.loads(trace.read_text())["traceEvents"]
    assert any("aten::" in str(e.get("name")) for e in events)  # the step's own ops
    result.stdout.fnmatch_lines([f"*Profiler trace of 3 step(s) (*): {trace.parent}"])
