"""Issue 15, part 2: recording refuses a blind baseline.

Seen: a compiled case recorded under contention stored a median of 173 ms (IQR/median 4.4)
against a true 8 ms; every later run said ``improvement`` and a real 15 % slowdown was
invisible. Now ``--accelperf-update`` and ``--accelperf-add-session`` re-measure a recording
whose step times are far more dispersed than a quiet machine gives (over twice the measured
steps), and one that stays so is stored marked ``noisy``: a warning in the terminal and the
reports, and a throughput verdict of ``inconclusive`` until it is re-recorded.

Issue 24: the drift probe's spread is no part of that. Flax MNIST's short ``[nomesh-b64]``
case timed its probe at IQR 64-78 % of its median on an idle machine, was stored noisy in
3 of 3 recordings, and was never judged again; an unsteady probe now only turns drift
correction off.

The noise is injected for real: the step sleeps 0.5 s in 1 of every 3 steps in the
trainings a marker file asks for, so the step times' IQR is 20x their median or more, twice
the bound, where the quiet steps' median is 25 ms or less (one torch thread; 11 ms at the
fastest, 15-25 ms at load 6, 2026-11-30). These tests are ``timing``: CI runs them apart
from its background jobs. It was 1 s (a 54 ms median was once seen here beside other
sessions' load, where a few steps were slowed by the load too), and the sleeps, which hold
the host lock, were 18 s of a noisy recording (issue 47: CI within 30 minutes). At 0.3 s
the IQR was 11-14x at load 6, too near the bound; at 0.5 s, 13x and 25x at load 7.5.

A training is 12 measured steps (:data:`STEPS`): a multiple of 3, so that exactly a third of
its measured steps sleep wherever the count of the loss's calls stands when they begin (and
so 8 of a re-measurement's 24), and the upper quartile is a sleeping step; the median is a
quiet one. The sleeps were most of these tests' time (26 s of a noisy recording at 20 steps,
18 s at 12, 1 s each), all of it holding the host lock.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import Suite, verdicts

from pytest_accelperf.checks.summary import summarize
from pytest_accelperf.checks.throughput import check_throughput, recording_noise, spread
from pytest_accelperf.records.run import Run
from pytest_accelperf.records.verdict import Tolerances, Verdict
from pytest_accelperf.store.schema import validate_block

NOISY_TASK = '''
import time
from pathlib import Path

import torch

from pytest_accelperf.torch import TorchTask

NOISY = Path(__file__).with_name("noisy.flag")
STATE = {"calls": 0, "noisy": False}


def make_task(case):
    def make_model():
        # Called once per training: the flag counts the trainings left to be noisy.
        left = int(NOISY.read_text()) if NOISY.exists() else 0
        STATE["noisy"] = left != 0
        if left > 0:
            NOISY.write_text(str(left - 1))
        # ~200 MFLOP a step, milliseconds: a quiet step's own jitter under another job's
        # load stays far under the bound (a 0.1 ms step's did not)
        return torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU(),
                                   torch.nn.Linear(512, 1))

    def loss_fn(model, batch):
        STATE["calls"] += 1
        if STATE["noisy"] and STATE["calls"] % 3 == 1:
            time.sleep(0.5)  # 20x a quiet step or more: see the module's docstring
        return torch.nn.functional.mse_loss(model(batch[0]), batch[1])

    def make_batch(step):
        g = torch.Generator().manual_seed(step)
        x = torch.randn(case.batch, 512, generator=g)
        return x, x.sum(dim=1, keepdim=True)

    return TorchTask(make_model=make_model, loss_fn=loss_fn, make_batch=make_batch,
                     make_optimizer=lambda p: torch.optim.SGD(p, lr=0.01))
'''

#: Measured steps of a training of the noisy case (a multiple of 3: see the module's doc).
STEPS = 12
NOISY_SUITE = f'''
from noisytask import make_task
from pytest_accelperf import cases

@cases(backend="torch", batch=[128], steps={STEPS}, warmup=1, accels=("cpu",))
def test_lin(accelperf):
    accelperf.train(make_task(accelperf.case))
'''

CASE = "test_lin[torch-nomesh-b128]"
PATTERN = "test_lin?torch-nomesh-b128?"  # CASE for fnmatch_lines, where [...] is a set
#: The bound the tests record under (the suite's pyproject turns the criterion off for the
#: other tests, as it does the probe's): under the injected noise (IQR 15x the median or
#: more), far over what another job's load gives these millisecond steps (4.3x was seen
#: beside an A/B session holding 1.5 of the 2 cores, and re-measuring cannot make that
#: quiet).
BOUND = "--accelperf-max-step-spread=10.0"
@pytest.fixture(autouse=True)
def one_torch_thread() -> Iterator[None]:
    """The in-process sessions' torch steps on one thread, restored after each test. On
    two loaded cores (CI's other xdist worker, its lint and TPU jobs) two OpenMP threads
    that spin at their barriers make a quiet millisecond step vary by more than the bound:
    a re-recording meant to be quiet was stored marked noisy again in CI (2026-11-28)."""
    try:
        import torch
    except ImportError:  # the torch tests skip
        yield
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def noisy_suite(suite: Suite) -> Suite:
    pytest.importorskip("torch")
    suite.pytester.makepyfile(noisytask=NOISY_TASK)
    suite.write(NOISY_SUITE)
    return suite


def noise_for(suite: Suite, trainings: int) -> None:
    """Noisy steps in the next ``trainings`` trainings of the case (-1: all)."""
    (suite.pytester.path / "noisy.flag").write_text(str(trainings))


def block(suite: Suite) -> dict[str, Any]:
    stored: dict[str, Any] = suite.load()["cases"][CASE]
    return stored


def throughput(report: dict[str, Any]) -> dict[str, Any]:
    check: dict[str, Any] = next(c for c in report["cases"][0]["checks"]
                                 if c["metric"] == "throughput")
    return check


# -- the criterion, on runs built by hand -----------------------------------------------------
def _run(times: list[float], probes: list[float] | None = None) -> Run:
    return Run(case_id="c", samples_per_step=8, n_devices=1, step_times=times,
               probe_times=probes or [], probe_kind="numpy" if probes else "")


def test_the_criterion_is_the_step_times_dispersion_not_the_probes() -> None:
    tol = Tolerances(max_step_spread=2.0, max_probe_spread=0.5)
    quiet = _run([0.010, 0.011, 0.0105, 0.0102, 0.0108, 0.0101] * 3)
    assert recording_noise(quiet, tol) == ""
    # the recording of issue 15: a median of 173 ms with IQR/median 4.4 (a true 8 ms)
    blind = _run([0.008] * 9 + [0.173] * 2 + [0.8] * 9)
    assert 4.4 < spread(blind.step_times) < 4.8
    why = recording_noise(blind, tol)
    assert why.startswith("its step times varied by IQR ")
    assert "(bound 200%, --accelperf-max-step-spread)" in why
    # Issue 24: steady steps beside an unsteady probe (Flax MNIST's short case: IQR 64-78 %
    # on an idle machine) are a level; the probe only stops correcting drift.
    probe = _run([0.010, 0.011, 0.0105, 0.0102] * 3, probes=[0.001, 0.004, 0.001, 0.009] * 3)
    assert spread(probe.probe_times) > tol.max_probe_spread
    assert recording_noise(probe, tol) == ""
    assert recording_noise(probe, Tolerances(max_probe_spread=0.0)) == ""
    assert recording_noise(blind, Tolerances(max_step_spread=100.0)) == ""  # the bound counts
    assert recording_noise(_run([0.1, 5.0, 0.1]), tol) == ""  # too few steps to say


def test_a_baseline_stored_noisy_is_inconclusive_whatever_the_ratio() -> None:
    base = summarize(_run([0.010, 0.0101, 0.0099, 0.0102, 0.0098] * 4)).to_json()
    tol = Tolerances(throughput_tolerance=0.1)
    for now_median, clean in ((0.010, Verdict.PASS), (0.020, Verdict.REGRESSION),
                              (0.005, Verdict.IMPROVEMENT)):
        now = _run([now_median * f for f in (1.0, 1.01, 0.99, 1.02, 0.98)] * 4)
        r = check_throughput(now, summarize(now), base, tol)
        assert r is not None and r.verdict is clean, r.detail
        marked = check_throughput(now, summarize(now), {**base, "noisy": "its step times "
                                                        "varied by IQR 440%"}, tol)
        assert marked is not None and marked.verdict is Verdict.INCONCLUSIVE
        assert marked.detail.startswith("not judged, the baseline was stored marked noisy "
                                        "(its step times varied by IQR 440%)")
        assert "re-record it with --accelperf-update on a quiet machine" in marked.detail
        assert marked.data["noisy_baseline"]
    validate_block({**base, "noisy": "why"})  # the schema types the mark


def test_a_session_added_noisy_gives_no_level() -> None:
    base = summarize(_run([0.010] * 20)).to_json()
    base["step_time"]["sessions"] = [{"median": 0.010, "probe_median": None},
                                     {"median": 0.0101, "probe_median": None},
                                     {"median": 0.5, "probe_median": None, "noisy": "why"},
                                     {"median": 0.0099, "probe_median": None}]
    validate_block(base)
    now = _run([0.010, 0.0101, 0.0099, 0.0102, 0.0098] * 4)
    r = check_throughput(now, summarize(now), base, Tolerances())
    assert r is not None and r.data["sessions"] == 3 and not r.data["session_outliers"]
    assert r.verdict is Verdict.PASS, r.detail


# -- end to end --------------------------------------------------------------------------------
#: A backend of the suite's own: a short, steady step (a 2 ms sleep) and a drift probe that is
#: not (sleeps of 0.5, 1, 2 and 3 ms in turn: IQR over median ~1.6, past any bound whatever
#: the machine adds to a sleep; Flax MNIST's probe was at 0.64-0.78 on an idle machine).
WOBBLY_CONFTEST = '''
import itertools
import time

from pytest_accelperf.backends import BackendSpec, TrainResult
from pytest_accelperf.backends.measure.probe import Probe
from pytest_accelperf.backends.measure import progress
from pytest_accelperf.records.run import Run


class Wobbly:
    name = "wobbly"

    def unavailable_reason(self):
        return None

    def train(self, case, task, accel, *, timeout=None):
        waits = itertools.cycle([0.0005, 0.001, 0.002, 0.003])
        probe = Probe("wobbly-sleep", lambda: time.sleep(next(waits)))
        run = Run(case_id=case.id, samples_per_step=case.batch, n_devices=1,
                  probe_kind=probe.kind)
        total = case.warmup + case.steps
        for step in range(total):
            t0 = time.perf_counter()
            time.sleep(0.002)
            seconds = time.perf_counter() - t0
            run.losses.append(1.0 / (step + 1))
            run.loss_steps.append(step)
            if step >= case.warmup:
                run.step_times.append(seconds)
                run.probe_times.append(probe.time())
            progress.step(step + 1, total, run.losses[-1], seconds)
        return TrainResult(run=run)


def pytest_accelperf_backends(config):
    return [BackendSpec("wobbly", backend=Wobbly())]
'''

WOBBLY_SUITE = '''
from pytest_accelperf import Case, cases

@cases(Case(backend="wobbly", batch=64, steps=30, warmup=2))
def test_short(accelperf):
    accelperf.train({})
'''

WOBBLY = "test_short[wobbly-nomesh-b64]"
#: The plugin's own bound, which the suite's pyproject raises for the other tests.
PROBE_BOUND = "--accelperf-max-probe-spread=0.5"


@pytest.mark.slow
@pytest.mark.timing
def test_a_short_case_whose_probe_is_unsteady_is_recorded_and_judged(suite: Suite) -> None:
    """Issue 24, end to end: recorded with an unsteady probe and steady steps, the case is
    not stored noisy, and later runs judge it on its step times, saying that drift
    correction was off: a pass as it is, a regression against a baseline 10x faster."""
    suite.pytester.makeconftest(WOBBLY_CONFTEST)
    suite.write(WOBBLY_SUITE)
    recorded = suite.run("--accelperf-update", PROBE_BOUND)
    recorded.assert_outcomes(passed=1)
    assert "recorded on a noisy machine" not in recorded.stdout.str()
    assert "re-measured before recording" not in recorded.stdout.str()
    stored = suite.load()["cases"][WOBBLY]
    assert "noisy" not in stored
    assert spread(stored["probe"]["samples"]) > 0.5  # the probe was past the bound
    assert spread(stored["step_time"]["samples"]) < 0.5  # the steps were not

    # A baseline stored noisy for its probe (as before issue 24) is healed by re-recording.
    why = ("the wobbly-sleep probe timed after each step varied by IQR 71% of its median "
           "(bound 50%, --accelperf-max-probe-spread)")
    suite.edit(lambda b: b.update(noisy=why))
    suite.run("--accelperf-json=report.json", PROBE_BOUND).assert_outcomes(passed=1)
    assert throughput(suite.report())["detail"].startswith(
        "not judged, the baseline was stored marked noisy (the wobbly-sleep probe")
    suite.run("--accelperf-update", PROBE_BOUND).assert_outcomes(passed=1)
    assert "noisy" not in suite.load()["cases"][WOBBLY]

    suite.run("--accelperf-json=report.json", PROBE_BOUND).assert_outcomes(passed=1)
    tp = throughput(suite.report())
    assert tp["verdict"] == "pass", tp["detail"]
    assert tp["detail"].startswith("within tolerance: step time "), tp["detail"]
    assert ("[drift correction off: this run's wobbly-sleep probe varied by IQR "
            in tp["detail"]), tp["detail"]
    assert tp["data"]["drift_corrected"] is False and not tp["data"]["contaminated"]

    suite.edit(lambda b: b["step_time"].update(
        samples=[t / 10 for t in b["step_time"]["samples"]]))
    suite.run("--accelperf-json=report.json", PROBE_BOUND, "--accelperf-confirm=0",
              "--accelperf-throughput-tolerance=3").assert_outcomes(failed=1)
    tp = throughput(suite.report())
    assert tp["verdict"] == "regression", tp["detail"]
    assert tp["detail"].startswith("slower: step time "), tp["detail"]
    assert "[drift correction off: " in tp["detail"]


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.timing
def test_a_noisy_recording_is_re_measured_and_the_quiet_one_stored(suite: Suite) -> None:
    noisy_suite(suite)
    for attempt in range(2):
        noise_for(suite, 1)  # the first training only
        result = suite.run("--accelperf-update", BOUND)
        result.assert_outcomes(passed=1)
        # The second measurement is quiet unless the machine is not: in a full test run
        # here, ten rank processes of another test starting beside it (load 10) gave its
        # 2 ms steps an IQR of 25x their median, past the bound, and it was stored noisy.
        # That says nothing of the code: recorded once more, on what is then a quieter
        # machine.
        if attempt or "recorded on a noisy machine" not in result.stdout.str():
            break
        suite.baseline_path().unlink()
    # The re-measurement is twice as long: two trainings, their 24 measured steps pooled.
    result.stdout.fnmatch_lines([
        f"*{PATTERN}: re-measured before recording: the first measurement was too noisy to be "
        f"a baseline: its step times varied by IQR *% of their median (bound 1000%, "
        f"--accelperf-max-step-spread); measurement 2 was not (re-measured over {2 * STEPS} "
        f"measured steps, the first over {STEPS})*"])
    stored = block(suite)
    assert "noisy" not in stored
    assert spread(stored["step_time"]["samples"]) < 10.0
    assert len(stored["step_time"]["samples"]) == len(stored["probe"]["samples"]) == 2 * STEPS


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.timing
def test_a_recording_that_stays_noisy_is_stored_marked_and_never_judged(suite: Suite) -> None:
    noisy_suite(suite)
    noise_for(suite, -1)
    result = suite.run("--accelperf-update", BOUND, "--accelperf-confirm=1",
                       "--accelperf-json=report.json", "--accelperf-markdown=report.md")
    result.assert_outcomes(passed=1)
    # the terminal: a warning that names the case, why, and the fix
    result.stdout.fnmatch_lines([
        f"*{PATTERN}: recorded on a noisy machine: its step times varied by IQR *; still noisy "
        f"after 1 re-measurement(s) (re-measured over {2 * STEPS} measured steps, the first "
        f"over {STEPS})*; "
        f"recorded measurement * of 2, the least dispersed; stored marked noisy: its "
        f"throughput is inconclusive until it is re-recorded with --accelperf-update on a "
        f"quiet machine"])
    stored = block(suite)
    assert stored["noisy"].startswith("its step times varied by IQR ")
    assert spread(stored["step_time"]["samples"]) > 10.0
    # the reports
    report = suite.report()
    assert report["recorded_noisy"] == [{"nodeid": f"test_suite.py::{CASE}",
                                         "platform": "cpu-x8", "why": stored["noisy"]}]
    assert report["cases"][0]["block"]["noisy"] == stored["noisy"]
    md = (suite.pytester.path / "report.md").read_text()
    assert "### ⚠️ Recorded noisy" in md and f"`{CASE}`" in md

    # The gate: the baseline is blind, whatever this (quiet) run measures.
    noise_for(suite, 0)
    result = suite.run("--accelperf-json=report.json", "--accelperf-throughput-tolerance=0.1")
    result.assert_outcomes(passed=1)
    tp = throughput(suite.report())
    assert tp["verdict"] == "inconclusive"
    assert tp["detail"].startswith("not judged, the baseline was stored marked noisy (its "
                                   "step times varied by IQR")

    # Re-recorded on a quiet machine, the mark is gone and the gate judges again.
    suite.run("--accelperf-update", BOUND).assert_outcomes(passed=1)
    assert "noisy" not in block(suite)
    suite.run("--accelperf-json=report.json").assert_outcomes(passed=1)
    assert "stored marked noisy" not in throughput(suite.report())["detail"]


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.timing
def test_without_re_measurement_a_noisy_recording_is_marked_at_once(suite: Suite) -> None:
    noisy_suite(suite)
    noise_for(suite, 1)  # a re-measurement would be quiet: there is none
    result = suite.run("--accelperf-update", BOUND, "--accelperf-confirm=0")
    result.assert_outcomes(passed=1)
    assert "re-measure" not in result.stdout.str()
    assert block(suite)["noisy"].startswith("its step times varied by IQR ")


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.timing
def test_a_session_added_noisy_is_kept_marked(suite: Suite) -> None:
    noisy_suite(suite)
    suite.run("--accelperf-update", BOUND).assert_outcomes(passed=1)
    noise_for(suite, -1)
    result = suite.run("--accelperf-add-session", BOUND, "--accelperf-json=report.json")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([
        f"*{PATTERN}: recorded on a noisy machine: *; this session's step-time level was stored "
        f"marked noisy: it is kept but gives the throughput check no level*"])
    stored = block(suite)
    assert "noisy" not in stored  # the recorded samples are the first, quiet session's
    first, added = stored["step_time"]["sessions"]
    assert "noisy" not in first and added["noisy"].startswith("its step times varied by IQR")
    assert suite.report()["recorded_noisy"][0]["why"] == added["noisy"]
    assert json.dumps(verdicts(suite.report()))  # the report still reads


def test_the_reports_name_a_case_recorded_noisy() -> None:
    from pytest_accelperf.report.data import CaseRecord, SessionReport
    from pytest_accelperf.report.markdown import markdown

    quiet = summarize(_run([0.010] * 8)).to_json()
    why = "its step times varied by IQR 440% of their median"
    records = [CaseRecord(nodeid="t.py::test_a[x]", case_id="x", platform="cpu-x8",
                          run=_run([0.010] * 8).to_json(), block={**quiet, "noisy": why}),
               CaseRecord(nodeid="t.py::test_b[y]", case_id="y", platform="cpu-x8",
                          run=_run([0.010] * 8).to_json(), block=quiet)]
    report = SessionReport(platform="cpu-x8", update=True, records=records)
    assert [r.case_id for r in report.recorded_noisy] == ["x"]
    assert report.to_json()["recorded_noisy"] == [
        {"nodeid": "t.py::test_a[x]", "platform": "cpu-x8", "why": why}]
    assert SessionReport.from_json(report.to_json()).recorded_noisy[0].recorded_noisy == why
    md = markdown(report)
    assert "### ⚠️ Recorded noisy" in md and f"| `test_a[x]` | {why} |" in md
    assert "test_b[y]" not in md.split("### ⚠️ Recorded noisy")[1].split("###")[0]
    pytest.importorskip("vl_convert")
    from pytest_accelperf.report.html import html_report

    html = html_report(report)
    assert ("recorded noisy: <code>test_a[x]</code>: its step times varied by IQR 440% of "
            "their median; stored marked noisy") in html
