"""The one place a :class:`~pytest_accelperf.records.run.Run` is written:
:class:`RunBuilder`. A backend records each measurement through it as it is taken, and
gets a frozen run at the end; its methods say what each figure means, so that a figure
means the same whoever trained the case (JAX, torch and its ranks, Neuron, Alpa, the
trainers).

A backend's ``train`` has one shape:

1. :func:`deadline_after` the case's timeout (everything after it counts: building,
   counting, compiling);
2. :meth:`RunBuilder.for_case`: the case's record, with what the case declares;
3. its own work before the loop (compile, memory, FLOPs, the program), each figure
   recorded by its method (:meth:`~RunBuilder.compiled`, :meth:`~RunBuilder.memory`,
   :meth:`~RunBuilder.counted`, ...), then the loop;
4. :meth:`~RunBuilder.loop`: the loop's losses, metrics, step, probe and input times and
   the machine's load;
5. its own work after the loop (:meth:`~RunBuilder.fingerprint`, a reference run);
6. :meth:`~RunBuilder.end`: a loss that was not finite or a deadline that passed, as the
   run's outcome and message; :meth:`~RunBuilder.build` hands the run over.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Unpack

from pytest_accelperf.backends.measure.loop import LoopResult
from pytest_accelperf.backends.measure.probe import Probe
from pytest_accelperf.collect.cases import Case
from pytest_accelperf.records.environment import Environment
from pytest_accelperf.records.fingerprint import ParamsFingerprint
from pytest_accelperf.records.program import ProgramRecord
from pytest_accelperf.records.run import (
    MemoryGrowth,
    OomRecord,
    Outcome,
    Replay,
    Run,
    RunDetails,
)
from pytest_accelperf.stats.contention import Load


def deadline_after(timeout: float | None) -> float | None:
    """The ``time.monotonic()`` by which the case must be done: None without a timeout."""
    return time.monotonic() + timeout if timeout else None


def timeout_message(timeout: float | None, done: int, case: Case) -> str:
    """What a run that hit ``--accelperf-timeout`` reports."""
    return (f"exceeded the {timeout:g} s timeout after {done} of {case.warmup + case.steps} "
            f"steps (raise --accelperf-timeout, or give the case fewer steps)")


class RunBuilder:
    """A case's run while it is measured: each method records one measurement (or one
    group taken together) and says what it means; :meth:`build` gives the frozen
    :class:`Run`. :attr:`run` is the record so far, to read back (an outcome already set,
    the FLOPs counted)."""

    def __init__(self, case_id: str, *, samples_per_step: int = 0,
                 tokens_per_step: int | None = None, n_devices: int = 1,
                 peak_flops_per_device: float | None = None) -> None:
        self._run = Run(case_id=case_id, samples_per_step=samples_per_step,
                        tokens_per_step=tokens_per_step, n_devices=n_devices,
                        peak_flops_per_device=peak_flops_per_device)

    @classmethod
    def for_case(cls, case: Case, peak_flops: float | None, *, n_devices: int,
                 tokens_per_sample: int | None = None) -> RunBuilder:
        """The case's record before anything ran: its samples (and tokens) per step, its
        devices and their peak FLOP/s."""
        draft = cls(case.id)
        draft.declared(case, peak_flops, n_devices=n_devices, tokens_per_sample=tokens_per_sample)
        return draft

    def declared(self, case: Case, peak_flops: float | None, *, n_devices: int,
                 tokens_per_sample: int | None = None) -> None:
        """What the case declares, once the backend knows its tokens per sample: samples
        (and tokens) per step, its devices and their peak FLOP/s."""
        self._set(samples_per_step=case.batch,
                  tokens_per_step=case.batch * tokens_per_sample if tokens_per_sample else None,
                  n_devices=n_devices, peak_flops_per_device=peak_flops)

    @property
    def run(self) -> Run:
        """The record so far (frozen: a snapshot)."""
        return self._run

    def build(self) -> Run:
        """The finished run."""
        return self._run

    def _set(self, **changes: object) -> None:
        self._run = replace(self._run, **changes)  # type: ignore[arg-type]

    # -- what the case ran on --------------------------------------------------------------
    def devices(self, n_devices: int) -> None:
        """The devices the step ran over (a mesh's size, the ranks)."""
        self._set(n_devices=n_devices)

    def tokens(self, tokens_per_step: int | None) -> None:
        """Tokens per optimizer step, where only the training found them (a collator's
        padding)."""
        self._set(tokens_per_step=tokens_per_step)

    def environment(self, environment: Environment) -> None:
        self._set(environment=environment)

    def compile_only(self, target: str, message: str) -> None:
        """A compile-only target (``--accelperf-target``): no step executes, and every
        result of the case says so."""
        self._set(compile_only=target, message=message)

    # -- before the loop -------------------------------------------------------------------
    def compiled(self, seconds: float | None, *, parts: dict[str, float] | None = None,
                 covers: str | None = None, load: Load | None = None,
                 trace_time: float | None = None) -> None:
        """The step's compile time in seconds, and what it timed: its ``parts`` by name,
        what it ``covers`` (torch.compile's first steps), what the machine's other
        processes used meanwhile, the tracing apart. An argument left None keeps what was
        recorded."""
        changes: dict[str, object] = {"compile_time": seconds}
        for name, value in (("compile_time_parts", parts), ("compile_time_covers", covers),
                            ("compile_load", load), ("trace_time", trace_time)):
            if value is not None:
                changes[name] = value
        self._set(**changes)

    def memory(self, per_device: dict[str, int], source: str) -> None:
        """Peak bytes per device (or rank), and who counted them: the runtime
        (``memory_stats``, ``cuda_allocator``, ``mem_tracker``) or the compiler's plan
        (``memory_analysis``)."""
        self._set(memory_per_device=per_device, memory_source=source)

    def memory_growth(self, growth: MemoryGrowth | None) -> None:
        """How live memory grew over the measured steps (the memory check's leak)."""
        self._set(memory_growth=growth)

    def counted(self, *, flops: float | None = None,
                program: ProgramRecord | None = None) -> None:
        """What one step does, counted, not timed: its FLOPs (summed over devices) and its
        program record (:mod:`pytest_accelperf.records.program`). An argument left None
        keeps what was recorded."""
        changes: dict[str, object] = {}
        if flops is not None:
            changes["flops_per_step"] = flops
        if program is not None:
            changes["program"] = program
        self._set(**changes)

    # -- the loop --------------------------------------------------------------------------
    def loop(self, trained: LoopResult, probe: Probe | None = None) -> None:
        """The loop's measurements: the loss of every step and its step number, the other
        metrics, the measured step times, the drift probe's times and kind, the batch's
        input times (CPU, wall, blocked, queued), page faults and yardstick times, the
        trainer's own time, and what the machine's other processes used meanwhile."""
        changes: dict[str, object] = dict(
            losses=trained.losses, loss_steps=list(range(len(trained.losses))),
            metrics=trained.metrics, step_times=trained.step_times,
            inputs=trained.inputs,
            step_load=trained.load, batch_time=trained.batch_time,
            trainer_times=trained.trainer_times or None)
        if probe is not None:
            changes.update(probe_times=trained.probe_times, probe_kind=probe.kind)
        self._set(**changes)

    def losses(self, losses: list[float], steps: list[int]) -> None:
        """Losses and their step numbers, where no loop of this process ran the steps (the
        ranks of a multi-process case, a cluster's worker)."""
        self._set(losses=losses, loss_steps=steps)

    def rank_times(self, *, metrics: dict[str, list[float]], step_times: list[float],
                   probe_times: list[float], probe_kind: str, load: Load | None) -> None:
        """What rank 0's loop measured, where the ranks ran it in processes of their own
        (DDP, DeepSpeed): the other metrics, the measured step and probe times, and what
        the machine's other processes used meanwhile. Batch input is not timed apart
        there: its preparation waits for the other ranks."""
        self._set(metrics=metrics, step_times=step_times, probe_times=probe_times,
                  probe_kind=probe_kind, step_load=load)

    def warmup_step_times(self, times: list[float]) -> None:
        """The warm-up steps' times, where they are not all compilation (Neuron)."""
        self._set(warmup_step_times=times)

    # -- after the loop --------------------------------------------------------------------
    def fingerprint(self, fingerprint: ParamsFingerprint) -> None:
        """The trained state's fingerprint (:mod:`pytest_accelperf.records.fingerprint`)."""
        self._set(params_fingerprint=fingerprint)

    def replay(self, replay: Replay) -> None:
        """How far a replay of the same steps moved the parameters."""
        self._set(replay=replay)

    def phases(self, phases: dict[str, float]) -> None:
        """Where the case's wall time went, by phase."""
        self._set(phases=phases)

    def detail(self, **details: Unpack[RunDetails]) -> None:
        """What this backend notes about its own run (:class:`RunDetails`), beside what
        it noted before."""
        self._run = self._run.noted(**details)

    # -- how it ended ----------------------------------------------------------------------
    def failed(self, outcome: Outcome, message: str, *, oom: OomRecord | None = None,
               nan_step: int | None = None) -> None:
        """The case did not finish: why (``oom``, ``nan``, ``error``, ``timeout``), what
        was seen, what an out-of-memory needed and had, the step whose loss was not
        finite."""
        changes: dict[str, object] = {"outcome": outcome, "message": message}
        if oom is not None:
            changes["oom"] = oom
        if nan_step is not None:
            changes["nan_step"] = nan_step
        self._set(**changes)

    def end(self, trained: LoopResult, timeout: float | None, case: Case) -> bool:
        """How the loop ended, where it ended early, as the outcome and message: a loss
        that was not finite (``nan``, at its step) first, else the deadline
        (``timeout``). An outcome already set (an out-of-memory) is kept. True when the
        loop ended early."""
        if self._run.outcome != "ok":
            return trained.nan_step is not None or trained.timed_out
        if trained.nan_step is not None:
            self.failed("nan", f"loss is {trained.losses[-1]} at step {trained.nan_step}",
                        nan_step=trained.nan_step)
            return True
        if trained.timed_out:
            self.failed("timeout", timeout_message(timeout, len(trained.losses), case))
            return True
        return False

    def stopped(self, trained: LoopResult, timeout: float | None, case: Case, who: str,
                why: str) -> None:
        """:meth:`end` for a trainer that owns its loop, which may also stop before the
        case's steps without a loss or a deadline to blame: then an ``error`` naming
        ``who`` stopped (``"<label>: Lightning"``) and ``why`` it may have."""
        if self.end(trained, timeout, case):
            return
        wanted = case.warmup + case.steps
        if trained.steps_done < wanted:
            self.failed("error", f"{who} stopped after {trained.steps_done} of {wanted} "
                                 f"optimizer steps ({why})")
