"""The shape every in-process backend's training shares (:mod:`.measure.recording`) and
its block stepper (:mod:`.measure.stepper`)."""

from __future__ import annotations

import math

from pytest_accelperf.backends.measure.loop import LoopResult, StepFns
from pytest_accelperf.backends.measure.probe import Probe
from pytest_accelperf.backends.measure.recording import RunBuilder, timeout_message
from pytest_accelperf.backends.measure.stepper import BlockStepper
from pytest_accelperf.collect.cases import Case
from pytest_accelperf.records.run import InputSeries

CASE = Case(backend="torch", batch=8, steps=4, warmup=1)


def _loop(**kw: object) -> LoopResult:
    out = LoopResult(losses=[2.0, 1.5, 1.0], metrics={"acc": [0.1, 0.2, 0.3]},
                     step_times=[0.01, 0.02], probe_times=[0.001, 0.001],
                     inputs=InputSeries(times=[1e-4, 2e-4], wall_times=[2e-4, 3e-4],
                                        blocked_times=[0.0, 1e-5]), batch_time=0.5)
    for key, value in kw.items():
        setattr(out, key, value)
    return out


def test_a_new_run_counts_tokens_only_where_a_sample_has_them() -> None:
    run = RunBuilder.for_case(CASE, 1e12, n_devices=2, tokens_per_sample=128).build()
    assert (run.case_id, run.samples_per_step, run.tokens_per_step, run.n_devices,
            run.peak_flops_per_device) == (CASE.id, 8, 8 * 128, 2, 1e12)
    assert RunBuilder.for_case(CASE, None, n_devices=1).build().tokens_per_step is None


def test_the_loop_is_recorded_whole_and_the_probe_only_where_one_ran() -> None:
    draft = RunBuilder.for_case(CASE, None, n_devices=1)
    draft.loop(_loop(), Probe("torch-cpu-matmul128", lambda: None))
    run = draft.build()
    assert run.losses == [2.0, 1.5, 1.0] and run.loss_steps == [0, 1, 2]
    assert run.metrics == {"acc": [0.1, 0.2, 0.3]} and run.step_times == [0.01, 0.02]
    assert (run.probe_times, run.probe_kind) == ([0.001, 0.001], "torch-cpu-matmul128")
    assert run.inputs.blocked_times == [0.0, 1e-5] and run.batch_time == 0.5
    bare = RunBuilder.for_case(CASE, None, n_devices=1)
    bare.loop(_loop())
    assert bare.build().probe_kind == "" and bare.build().probe_times == []


def test_a_loss_that_is_not_finite_comes_before_the_deadline() -> None:
    draft = RunBuilder.for_case(CASE, None, n_devices=1)
    assert draft.end(_loop(nan_step=2, timed_out=True, losses=[1.0, math.nan]), 5, CASE)
    run = draft.build()
    assert (run.outcome, run.nan_step, run.message) == ("nan", 2, "loss is nan at step 2")
    late = RunBuilder.for_case(CASE, None, n_devices=1)
    assert late.end(_loop(timed_out=True), 5.0, CASE)
    assert late.build().outcome == "timeout"
    assert late.build().message == timeout_message(5.0, 3, CASE)
    assert late.build().message.startswith("exceeded the 5 s timeout after 3 of 5 steps")


def test_an_outcome_already_set_is_kept_and_a_whole_run_is_ok() -> None:
    draft = RunBuilder.for_case(CASE, None, n_devices=1)
    draft.failed("oom", "out of memory")
    assert draft.end(_loop(timed_out=True), 5, CASE)
    assert (draft.build().outcome, draft.build().message) == ("oom", "out of memory")
    whole = RunBuilder.for_case(CASE, None, n_devices=1)
    assert not whole.end(_loop(), 5, CASE)
    assert whole.build().outcome == "ok" and whole.build().message == ""


def test_a_trainer_that_stopped_early_is_an_error_naming_who_and_why() -> None:
    short = RunBuilder.for_case(CASE, None, n_devices=1)
    short.stopped(_loop(), 5, CASE, "cpu:0: Lightning", "the data ended")
    assert (short.build().outcome, short.build().message) == (
        "error", "cpu:0: Lightning stopped after 3 of 5 optimizer steps (the data ended)")
    whole = RunBuilder.for_case(CASE, None, n_devices=1)
    whole.stopped(_loop(losses=[1.0] * 5), 5, CASE, "cpu:0: Lightning", "the data ended")
    assert whole.build().outcome == "ok"


def test_what_is_recorded_is_kept_and_each_build_is_frozen() -> None:
    draft = RunBuilder.for_case(CASE, None, n_devices=1)
    draft.compiled(2.0, parts={"step": 2.0}, trace_time=0.5)
    draft.compiled(3.0, parts={"step": 2.0, "init": 1.0})  # the trace time is kept
    draft.counted(flops=10.0)
    draft.counted(program={"source": "eager"})  # the FLOPs are kept
    draft.detail(notes=["max_steps=5 (yours: 100)"])
    draft.detail(device="cpu")
    first = draft.build()
    assert (first.compile_time, first.compile_time_parts, first.trace_time) == (
        3.0, {"step": 2.0, "init": 1.0}, 0.5)
    assert first.flops_per_step == 10.0 and first.program == {"source": "eager"}
    assert first.details == {"notes": ["max_steps=5 (yours: 100)"], "device": "cpu"}
    draft.fingerprint({})
    assert first.params_fingerprint == {} and draft.build() is not first


class _Counting(BlockStepper[int, int]):
    def __init__(self) -> None:
        self.seen: list[tuple[str, int]] = []
        self.lasts: list[int] = []
        super().__init__(StepFns(prepare=self._prepare, run=self._run,
                                 read=lambda h: (float(h), {})), cycle=3)

    def _prepare(self, i: int) -> int:
        self.seen.append(("batch", i))
        return i

    def _run(self, i: int, batch: int) -> int:
        self.seen.append(("step", i))
        return 10 * i + batch

    def after_block(self, last: int) -> None:
        self.lasts.append(last)


def test_blocks_go_on_where_the_last_ended_with_a_run_s_batches() -> None:
    stepper = _Counting()
    assert len(stepper.run(2)) == 2 and len(stepper.run(3)) == 3
    assert [i for kind, i in stepper.seen if kind == "step"] == [0, 1, 2, 3, 4]
    assert [i for kind, i in stepper.seen if kind == "batch"] == [0, 1, 2, 0, 1]
    assert stepper.lasts == [10 * 1 + 1, 10 * 4 + 1]
    assert stepper.program is None
