"""A/B mode's memory, numerics and loss checks against the base arm's record (issue 37):
the head's run against the run the base arm trained once, by the stored-baseline path's
own checks, worded as A/B verdicts; where the base arm has no record, the stored check
stands with a note. Real runs' records: fingerprints from the backends' own function."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from pytest_accelperf.ab.rounds import ABMeasurement
from pytest_accelperf.ab.verdict import ab_record_checks, in_ab_words, record_not_compared
from pytest_accelperf.backends.measure.common import fingerprint
from pytest_accelperf.checks import run_checks
from pytest_accelperf.checks.recordable import not_cleared_by_a_baseline
from pytest_accelperf.checks.summary import summarize
from pytest_accelperf.records.run import InputSeries, Run
from pytest_accelperf.records.verdict import CheckResult, Tolerances, Verdict
from pytest_accelperf.report.failure import failure_message
from pytest_accelperf.stats.contention import Load

LABEL = "origin/main (0123456789)"
TOL = Tolerances()


def _params(scale: float = 1.0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {"w1": (rng.normal(size=(16, 8)) * scale).astype(np.float32),
            "w2": rng.normal(size=(8, 2)).astype(np.float32)}


def _run(*, memory: int = 1 << 20, scale: float = 1.0, losses: tuple[float, ...] = (),
         outcome: str = "ok", metrics: dict[str, list[float]] | None = None) -> Run:
    curve = list(losses) or [1.0 / (1 + i) for i in range(20)]
    return Run(case_id="c", outcome=outcome, step_times=[0.01] * 5, losses=curve,
               loss_steps=list(range(len(curve))), memory_per_device={"cpu:0": memory},
               memory_source="memory_analysis", params_fingerprint=fingerprint(_params(scale)),
               metrics=metrics or {})


def _checks(head: Run, base: Run, stack: tuple[str, ...] = ()) -> dict[str, CheckResult]:
    return ab_record_checks(LABEL, ABMeasurement(base_run=base), head, summarize(head), TOL,
                            stack=stack)


def test_the_same_run_passes_every_check_against_the_base() -> None:
    found = ab_record_checks(LABEL, ABMeasurement(base_run=_run()), _run(), summarize(_run()),
                             TOL)
    assert sorted(found) == ["loss", "memory", "numerics", "outcome"]
    words = {"memory": "as much memory as", "numerics": "same numerics as",
             "loss": "same loss curve as", "outcome": "same outcome as"}
    for metric, check in found.items():
        assert check.verdict is Verdict.PASS, check
        assert check.data["mode"] == "ab" and check.data["against"] == LABEL
        assert check.detail.startswith(f"{words[metric]} {LABEL}: "), check.detail
        assert "baseline" not in check.detail and "--accelperf-update" not in check.detail
    assert "fingerprints of 2 parameter leaves match origin/main (0123456789) " \
           "(max |Δ| = 0" in found["numerics"].detail


def test_twice_the_memory_and_a_slower_loss_are_regressions_against_the_base() -> None:
    head = _run(memory=2 << 20, losses=tuple(2.0 / (1 + i) for i in range(20)))
    found = ab_record_checks(LABEL, ABMeasurement(base_run=_run()), head, summarize(head), TOL)
    memory, loss = found["memory"], found["loss"]
    assert memory.verdict is Verdict.REGRESSION and memory.data["mode"] == "ab"
    assert memory.detail == (f"more memory than {LABEL}: peak memory on cpu:0 is 2.00 MiB, "
                             f"{LABEL} 1.00 MiB (+100.0%, tolerance 10%)")
    assert loss.verdict is Verdict.REGRESSION
    assert loss.detail.startswith(f"higher loss than {LABEL}: loss at step 1 is ")
    assert f"above {LABEL}'s " in loss.detail
    # and the same checks say the same against a stored baseline of the base's run: one
    # implementation each, only the words and the mode differ
    stored = {c.metric: c for c in run_checks(head, summarize(head), summarize(_run()), TOL)}
    for metric in ("memory", "loss", "numerics"):
        assert stored[metric].verdict is found[metric].verdict
        ours = {k: v for k, v in found[metric].data.items() if k not in ("mode", "against")}
        assert ours == stored[metric].data, metric
    # a regression against the base is A/B's: not cleared by a baseline, and said so
    assert not_cleared_by_a_baseline(memory) is not None
    message = failure_message("t.py::c", "cpu-x1", [memory, loss], has_baseline=False,
                              unstorable=None, accept="accelperf baselines accept ...")
    assert "t.py::c: 2 regression(s) against the base revision (A/B):" in message
    assert "if this change is intended, the base revision is what changes it" in message


def test_numerics_across_stacks_are_judged_at_the_cross_environment_tolerance_and_named() -> None:
    """Two stacks round differently: a change in the last bits (relative 5e-4, past the
    same-stack rtol 1e-4) passes at the cross-environment tolerance, naming the stacks;
    a change of the arithmetic fails, naming them too."""
    stack = ("jax 0.8.3 \u2192 0.10.2", "jaxlib 0.8.3 \u2192 0.10.2")
    rounding = _run(scale=1.0005)
    same_stack = _checks(rounding, _run())["numerics"]
    assert same_stack.verdict is Verdict.REGRESSION  # one stack: no rounding to excuse
    upgraded = _checks(rounding, _run(), stack=stack)["numerics"]
    assert upgraded.verdict is Verdict.PASS, upgraded.detail
    assert upgraded.data["stack"] == list(stack)
    assert "the cross-environment tolerance" in upgraded.detail
    assert upgraded.detail.endswith("; stack: jax 0.8.3 \u2192 0.10.2, jaxlib 0.8.3 \u2192 "
                                    "0.10.2"), upgraded.detail
    changed = _checks(_run(scale=1.2), _run(), stack=stack)["numerics"]
    assert changed.verdict is Verdict.REGRESSION
    assert changed.detail.startswith(f"other numerics than {LABEL}: w1 differs from {LABEL}'s "
                                     f"fingerprint: max |Δ| = ")
    assert "stack: jax 0.8.3 \u2192 0.10.2" in changed.detail
    assert changed.data["rtol"] == TOL.numerics_cross_rtol


@pytest.mark.parametrize(("base", "note", "why"), [
    (None, "test_x.py does not exist", "test_x.py does not exist"),
    (None, "", "the base arm has no record of the case"),
    (replace(Run(case_id="c"), outcome="timeout", message="stopped after 30 s"), "",
     "its run of the case ended timeout: stopped after 30 s"),
])
def test_without_a_record_of_the_base_the_stored_check_stands_with_a_note(
        base: Run | None, note: str, why: str) -> None:
    head = _run()
    measured = ABMeasurement(base_run=base, base_run_note=note)
    assert ab_record_checks(LABEL, measured, head, summarize(head), TOL) == {}
    stored = {c.metric: c for c in run_checks(head, summarize(head), None, TOL)}["memory"]
    kept = record_not_compared(LABEL, measured, stored)
    assert kept.verdict is stored.verdict is Verdict.NEW
    assert kept.detail.endswith(f" [not compared with {LABEL}: {why}]"), kept.detail
    assert kept.data["ab"] == {"ref": LABEL, "skipped": why}
    assert "mode" not in kept.data


def test_a_base_without_a_metric_leaves_it_to_the_stored_check() -> None:
    head = _run()
    base = replace(_run(), memory_per_device={}, memory_source="")
    found = ab_record_checks(LABEL, ABMeasurement(base_run=base), head, summarize(head), TOL)
    assert "memory" not in found and "numerics" in found


def test_a_leak_is_the_heads_alone_and_keeps_its_words() -> None:
    head = replace(_run(), memory_growth={"bytes_per_step": 1e6, "steps": 10,
                                          "after_warmup": 1e6, "after_steps": 1.1e7,
                                          "source": "live_arrays"})
    found = ab_record_checks(LABEL, ABMeasurement(base_run=_run()), head, summarize(head), TOL)
    memory = found["memory"]
    assert memory.verdict is Verdict.REGRESSION and memory.data["leak"] is True
    assert memory.detail.startswith("live memory grew "), memory.detail
    assert "mode" not in memory.data  # not A/B's: its own check says what clears it
    assert "--accelperf-leak-bytes-per-step" in str(not_cleared_by_a_baseline(memory))


def test_in_ab_words_drops_the_remedies_of_a_stored_baseline() -> None:
    assert in_ab_words("final loss is 0.2, below the baseline's 0.3 ± 0.016 (rtol 5%, atol "
                       "0.001); run with --accelperf-update to record the new baseline",
                       "main") == \
        "final loss is 0.2, below main's 0.3 ± 0.016 (rtol 5%, atol 0.001)"
    assert in_ab_words("devices differ from the baseline's (only now: cpu:1); re-record with "
                       "--accelperf-update", "main") == \
        "devices differ from main's (only now: cpu:1)"


def test_a_step_metric_is_judged_against_the_base_arms_curve() -> None:
    """The learning rate and the accuracy a step returns are judged against the base arm's
    run as the loss is (they were ``new`` in A/B mode): a schedule that warms up twice as
    fast is another ``lr`` curve than the base's, a regression of the working tree; a
    metric the base's step did not return is not judged."""
    lr = [1e-3 * min(1.0, (i + 1) / 10) for i in range(20)]
    faster = [1e-3 * min(1.0, (i + 1) / 5) for i in range(20)]
    base = _run(metrics={"lr": lr})
    same = _checks(_run(metrics={"lr": lr, "accuracy": [0.5] * 20}), base)
    assert same["lr"].verdict is Verdict.PASS, same["lr"].detail
    assert same["lr"].detail.startswith(f"same lr curve as {LABEL}: ")
    assert same["lr"].data["mode"] == "ab" and "accuracy" not in same
    other = _checks(_run(metrics={"lr": faster}), base)["lr"]
    assert other.verdict is Verdict.REGRESSION, other.detail
    assert other.detail.startswith(f"other lr curve than {LABEL}: lr at step ")
    assert "--accelperf-update" not in other.detail and "baseline" not in other.detail


def _batched(run: Run, cpu_ms: float = 0.3, blocked_ms: float = 0.0,
             load: Load | None = None) -> Run:
    """``run`` with 20 measured steps of 20 ms whose batches took ``cpu_ms`` of CPU and
    were blocked ``blocked_ms`` (a sleep, a slow read), a little noise on each; the thread's
    yardstick 0.3 ms each time (its speed unchanged)."""
    jitter = [1 + 0.02 * ((i * 7) % 5 - 2) for i in range(20)]
    return replace(run, step_times=[0.02] * 20,
                   inputs=InputSeries(
                       times=[cpu_ms * 1e-3 * j for j in jitter],
                       wall_times=[(cpu_ms + blocked_ms) * 1e-3 * j for j in jitter],
                       blocked_times=[blocked_ms * 1e-3 * j for j in jitter],
                       yardstick_times=[3e-4] * 20), step_load=load)


def test_the_making_of_the_batch_is_judged_against_the_base_arms_run() -> None:
    """No A/B step time includes the making of the batch (a thread beside the step): a
    working tree whose batch function sleeps 8 ms, or burns 10 ms of CPU, passed A/B mode
    whenever no baseline was stored (``new``). Now each is judged against the base arm's
    own run by the input checks' rules, and fails the case, whatever a baseline says."""
    base = _batched(_run())
    same = _checks(_batched(_run()), base)
    assert same["input"].verdict is same["input_wait"].verdict is Verdict.PASS
    assert same["input"].detail.startswith(f"as much CPU a batch as {LABEL}: "), same["input"]
    assert same["input_wait"].detail.startswith(f"as long waits a batch as {LABEL}: ")
    assert same["input"].data["mode"] == "ab" and same["input"].data["against"] == LABEL

    waits = _checks(_batched(_run(), blocked_ms=8.0), base)["input_wait"]
    assert waits.verdict is Verdict.REGRESSION, waits.detail
    assert waits.detail.startswith(f"longer waits a batch than {LABEL}: blocked 8 ms "
                                   f"per step making the batch"), waits.detail
    assert "baseline" not in waits.detail and "--accelperf-update" not in waits.detail
    assert not_cleared_by_a_baseline(waits) is not None

    burns = _checks(_batched(_run(), cpu_ms=10.0), base)["input"]
    assert burns.verdict is Verdict.REGRESSION, burns.detail
    assert burns.detail.startswith(f"more CPU a batch than {LABEL}: "), burns.detail
    faster = _checks(base, _batched(_run(), cpu_ms=10.0))["input"]
    assert faster.verdict is Verdict.IMPROVEMENT, faster.detail
    assert faster.detail.startswith(f"less CPU a batch than {LABEL}: ")


def test_a_wait_measured_beside_another_job_is_not_judged_against_the_base() -> None:
    """The blocked time grows with what the batch waits for, which another job slows: past
    ``--accelperf-max-foreign-load`` the head's run is not judged against the base arm's,
    as it is not against a stored baseline."""
    busy = Load(foreign_cores=1.5, steal_cores=0.0, cores=2, seconds=1.0, foreign_ticks=150)
    head = _batched(_run(), blocked_ms=8.0, load=busy)
    found = ab_record_checks(LABEL, ABMeasurement(base_run=_batched(_run())), head,
                             summarize(head), TOL, max_foreign_load=0.25)
    waits = found["input_wait"]
    assert waits.verdict is Verdict.INCONCLUSIVE, waits.detail
    assert "measured beside another job" in waits.detail and waits.data["contaminated"]
    unbounded = ab_record_checks(LABEL, ABMeasurement(base_run=_batched(_run())), head,
                                 summarize(head), TOL)
    assert unbounded["input_wait"].verdict is Verdict.REGRESSION


def test_a_batch_cpu_time_measured_beside_another_job_is_not_judged_against_the_base() -> None:
    """The two runs are not interleaved, and a batch's CPU time moves with the machine's
    load (unchanged code measured 5.41 ms in the base arm's run and 3.38 ms in the head's,
    A/A beside CI's tests): a change measured while either run had company is
    ``inconclusive``, saying which and what was measured; a pass holds."""
    busy = Load(foreign_cores=1.5, steal_cores=0.0, cores=2, seconds=1.0, foreign_ticks=150)
    quiet = _batched(_run())
    for head, base, which in ((_batched(_run(), cpu_ms=10.0, load=busy), quiet, "this run"),
                              (_batched(_run(), cpu_ms=10.0), _batched(_run(), load=busy),
                               f"{LABEL}'s run")):
        found = ab_record_checks(LABEL, ABMeasurement(base_run=base), head, summarize(head),
                                 TOL, max_foreign_load=0.25)
        cpu = found["input"]
        assert cpu.verdict is Verdict.INCONCLUSIVE, cpu.detail
        assert cpu.data["measured_verdict"] == "regression"
        assert str(cpu.data["contaminated"]).startswith(f"{which}: other processes used 1.50")
        assert cpu.detail.startswith("not judged, measured beside another job ("), cpu.detail
        assert f"measured: more CPU a batch than {LABEL}: " in cpu.detail
        assert not cpu.failed
    same = ab_record_checks(LABEL, ABMeasurement(base_run=quiet), _batched(_run(), load=busy),
                            summarize(quiet), TOL, max_foreign_load=0.25)
    assert same["input"].verdict is Verdict.PASS, same["input"].detail
