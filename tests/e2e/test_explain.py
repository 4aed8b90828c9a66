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


# Issue 36: an explanation is bounded as training is. A batch source that blocks from its Nth
# call on (ACCELPERF_TEST_BLOCK_AFTER: that many batches come; unset: none block), for each
# in-process backend and each way a batch comes in: make_batch(step), and data=.
BLOCKING_HEAD = '''
import dataclasses
import os
import time
from pytest_accelperf import cases

calls = [0]
AFTER = int(os.environ.get("ACCELPERF_TEST_BLOCK_AFTER", "-1"))


def blocking(make_batch):
    def wrapped(step):
        calls[0] += 1
        if 0 <= AFTER < calls[0]:
            time.sleep(int(os.environ["ACCELPERF_TEST_BLOCK_S"]))  # a data source that hangs
        return make_batch(step)
    return wrapped


def counted(train):
    try:
        train()
    finally:
        with open("calls.txt", "w") as f:  # how many batches a session of this case makes
            f.write(str(calls[0]))
'''

BLOCKING = {
    "jax-make_batch": BLOCKING_HEAD + '''
from tinytask import make_task

@cases(backend="jax", batch=[16], steps=4, warmup=1)
def test_small(accelperf):
    task = make_task(accelperf.case)
    task = dataclasses.replace(task, make_batch=blocking(task.make_batch))
    counted(lambda: accelperf.train(task))
''',
    "jax-data": BLOCKING_HEAD + '''
import jax.numpy as jnp
import numpy as np
from pytest_accelperf.jax import JaxStep

@cases(backend="jax", batch=[16], steps=4, warmup=1)
def test_small(accelperf):
    rng = np.random.default_rng(0)
    xs = rng.normal(size=(64, 16, 8)).astype(np.float32)
    batch = blocking(lambda i: {"x": xs[i % 64], "y": xs[i % 64].sum(axis=1)})

    def data():  # the user's own pipeline: a generator function
        i = 0
        while True:
            yield batch(i)
            i += 1

    def step(w, b):
        loss, g = __import__("jax").value_and_grad(
            lambda w: jnp.mean((b["x"] @ w - b["y"]) ** 2))(w)
        return w - 0.01 * g, {"loss": loss}

    counted(lambda: accelperf.train(JaxStep(jnp.zeros((8,)), step, data=data)))
''',
    "torch-make_batch": BLOCKING_HEAD + '''
from torchtask import make_task

@cases(backend="torch", batch=[16], steps=4, warmup=1, accels=("cpu",))
def test_small(accelperf):
    task = make_task(accelperf.case)
    task = dataclasses.replace(task, make_batch=blocking(task.make_batch))
    counted(lambda: accelperf.train(task))
''',
}


#: Seconds a blocked batch source sleeps: a hang, as the session sees it. The session's own
#: bound (the timeout, the alarm's 2 s grace, starting the subprocess) is seconds, but under
#: xdist it may first wait minutes for the CPU host lock behind the other worker's case (a
#: DeepSpeed case), so the test tells a bounded session from a hang by half of this.
BLOCK_S = 600


def _blocked_session(suite: Suite, monkeypatch: pytest.MonkeyPatch, *, after: int | None,
                     block_s: int, timeout: int, edit: bool,
                     kind: str = "jax-make_batch") -> tuple[pytest.RunResult, float]:
    """Record the case unblocked, then run it again in a subprocess (a hang fails the test
    instead of hanging it; the alarm is the inner session's own) with its batches blocking
    ``block_s`` seconds from the ``after + 1``-th on (None: once the case has made as many
    as its recording did: its explanation's), under ``--accelperf-timeout``."""
    import time

    if kind.startswith("torch"):
        from e2e.test_confirm import TORCH_TASK

        pytest.importorskip("torch")
        suite.pytester.makepyfile(torchtask=TORCH_TASK)
    suite.write(BLOCKING[kind])
    suite.run("--accelperf-update").assert_outcomes(passed=1)
    if after is None:
        after = int((suite.pytester.path / "calls.txt").read_text())
    if edit:
        suite.edit(halve_the_flops)
    monkeypatch.setenv("ACCELPERF_TEST_BLOCK_AFTER", str(after))
    monkeypatch.setenv("ACCELPERF_TEST_BLOCK_S", str(block_s))
    start = time.monotonic()
    result = suite.pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", f"--accelperf-timeout={timeout}",
        "--accelperf-json=report.json", timeout=block_s + 60)
    return result, time.monotonic() - start


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.parametrize("kind", sorted(BLOCKING))
def test_a_case_that_timed_out_is_not_trained_again_for_its_explanation(
        suite: Suite, monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    # Before: the timeout fired at ~6 s, then the explanation trained the case again under
    # the profiler with no deadline and blocked on the same batch source for all BLOCK_S.
    result, elapsed = _blocked_session(suite, monkeypatch, after=3, block_s=BLOCK_S,
                                       timeout=4, edit=False, kind=kind)
    result.assert_outcomes(failed=1)
    assert elapsed < BLOCK_S / 2, elapsed
    result.stdout.fnmatch_lines(["*Profiler no trace: the case ran past its 4 s timeout "
                                 "(outcome timeout), so it was not trained again under the "
                                 "profiler (a step that blocked would block again)"])
    run = suite.report()["cases"][0]["run"]
    assert run["outcome"] == "timeout"
    assert run["extra"]["explain"]["path"] is None


@pytest.mark.slow
def test_an_explanation_that_blocks_is_cut_short_at_the_case_timeout(
        suite: Suite, monkeypatch: pytest.MonkeyPatch) -> None:
    # The case trains as it did when recorded and regresses (the program check: the
    # baseline claims half the FLOPs); its explanation's steps then block.
    result, elapsed = _blocked_session(suite, monkeypatch, after=None, block_s=BLOCK_S,
                                       timeout=8, edit=True)
    result.assert_outcomes(failed=1)
    assert elapsed < BLOCK_S / 2, elapsed
    result.stdout.fnmatch_lines(["*Profiler trace cut short: the profiled steps ran past "
                                 "the 8 s timeout (--accelperf-timeout) and were interrupted "
                                 "in wrapped (test_suite.py:*); nothing was kept"])
    run = suite.report()["cases"][0]["run"]
    assert run["outcome"] == "ok"
    assert run["extra"]["explain"]["path"] is None
    assert not (suite.pytester.path / "accelperf-explain" / "jax-nomesh-b16").exists()
