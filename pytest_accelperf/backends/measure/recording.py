"""What a backend writes into its :class:`~pytest_accelperf.records.run.Run` around the
measured-step loop (:mod:`.loop`): written once for every in-process backend (JAX, torch,
Neuron, Alpa), so that a figure means the same whoever trained the case.

A backend's ``train`` has one shape:

1. :func:`deadline_after` the case's timeout (everything after it counts: building,
   counting, compiling);
2. :func:`new_run`: the case's record, with what the case declares;
3. its own work before the loop (compile, memory, FLOPs, the program), then the loop;
4. :func:`record_loop`: the loop's losses, metrics, step, probe and input times and the
   machine's load into the record;
5. its own work after the loop (the fingerprint, a reference run);
6. :func:`record_end`: a loss that was not finite or a deadline that passed, as the run's
   outcome and message.
"""

from __future__ import annotations

import time

from pytest_accelperf.backends.measure.loop import LoopResult
from pytest_accelperf.backends.measure.probe import Probe
from pytest_accelperf.collect.cases import Case
from pytest_accelperf.records.run import Run


def deadline_after(timeout: float | None) -> float | None:
    """The ``time.monotonic()`` by which the case must be done: None without a timeout."""
    return time.monotonic() + timeout if timeout else None


def new_run(case: Case, peak_flops: float | None, *, n_devices: int,
            tokens_per_sample: int | None = None) -> Run:
    """The case's record before anything ran: its samples (and tokens) per step, its
    devices and their peak FLOP/s."""
    return Run(case_id=case.id, samples_per_step=case.batch,
               tokens_per_step=case.batch * tokens_per_sample if tokens_per_sample else None,
               n_devices=n_devices, peak_flops_per_device=peak_flops)


def record_loop(run: Run, trained: LoopResult, probe: Probe | None = None) -> None:
    """The loop's measurements into ``run``: the loss of every step and its step number,
    the other metrics, the measured step times, the drift probe's times and kind, the
    batch's input times (CPU, wall, blocked, queued), page faults and yardstick times, and
    what the machine's other processes used meanwhile."""
    run.losses = trained.losses
    run.loss_steps = list(range(len(trained.losses)))
    run.metrics = trained.metrics
    run.step_times = trained.step_times
    if probe is not None:
        run.probe_times, run.probe_kind = trained.probe_times, probe.kind
    run.input_times, run.input_wall_times = trained.input_times, trained.input_wall_times
    run.input_blocked_times = trained.input_blocked_times
    run.input_queued_times, run.input_faults = trained.input_queued_times, trained.input_faults
    run.input_yardstick_times = trained.input_yardstick_times
    run.step_load, run.batch_time = trained.load, trained.batch_time
    run.trainer_times = trained.trainer_times or None


def timeout_message(timeout: float | None, done: int, case: Case) -> str:
    """What a run that hit ``--accelperf-timeout`` reports."""
    return (f"exceeded the {timeout:g} s timeout after {done} of {case.warmup + case.steps} "
            f"steps (raise --accelperf-timeout, or give the case fewer steps)")


def record_end(run: Run, trained: LoopResult, timeout: float | None, case: Case) -> bool:
    """How the loop ended, where it ended early, as ``run``'s outcome and message: a loss
    that was not finite (``nan``, at its step) first, else the deadline (``timeout``).
    An outcome already set (an out-of-memory) is kept. True when the loop ended early."""
    if run.outcome != "ok":
        return trained.nan_step is not None or trained.timed_out
    if trained.nan_step is not None:
        run.outcome, run.nan_step = "nan", trained.nan_step
        run.message = f"loss is {trained.losses[-1]} at step {trained.nan_step}"
        return True
    if trained.timed_out:
        run.outcome = "timeout"
        run.message = timeout_message(timeout, len(trained.losses), case)
        return True
    return False
