"""The step clock of a loop the trainer owns (measure/stamps.py), driven as a trainer's
callback drives it: fetch, batch end, loss; no framework, real clocks."""

from __future__ import annotations

import math
import time

import pytest

from pytest_accelperf.backends.measure.stamps import StepClock


def quiet(done: int, total: int, loss: float, seconds: float, measured: bool) -> None:
    pass


def batch(clock: StepClock, loss: float, stepped: bool, fetch: float = 0.0,
          work: float = 0.0) -> bool:
    """One batch as a trainer runs it: the fetch (``fetch`` s asleep), the step (``work``
    s of it), the end; then the loss read (the plugin's own time, outside the clock)."""
    clock.fetch_started()
    time.sleep(fetch)
    clock.fetch_ended()
    time.sleep(work)
    clock.batch_ended()
    time.sleep(0.002)  # reading the loss: not the step's
    return clock.after_batch(loss, {"lr": 0.1} if stepped else None)


@pytest.mark.timing
def test_optimizer_steps_of_accumulated_batches_with_the_fetch_apart() -> None:
    clock = StepClock(warmup=1, steps=2, sync=lambda: None, report=quiet)
    clock.start()
    for step in range(3):  # two micro-batches an optimizer step
        batch(clock, 1.0 + step, stepped=False, fetch=0.05, work=0.005)
        batch(clock, 2.0 + step, stepped=True, fetch=0.05, work=0.005)
    out = clock.finish()
    assert out.losses == [1.5, 2.5, 3.5]  # the mean of each step's micro-batches
    assert out.metrics == {"lr": [0.1, 0.1, 0.1]}
    assert len(out.warmup_times) == 1 and len(out.step_times) == 2
    # two 5 ms batches, not the two 50 ms fetches nor the loss reads (a wide margin: the
    # sleeps overshoot on a loaded machine, 0.02 s was exceeded at load 4)
    for seconds in out.step_times:
        assert 0.01 <= seconds < 0.1
    assert len(out.inputs.wall_times) == 2 and all(w >= 0.1 for w in out.inputs.wall_times)
    assert all(c < 0.01 for c in out.inputs.times)  # asleep: no CPU time
    assert len(out.inputs.yardstick_times) == 2  # one a measured step


def test_a_loss_not_finite_stops_at_its_step() -> None:
    clock = StepClock(warmup=0, steps=5, sync=lambda: None, report=quiet)
    clock.start()
    assert not batch(clock, 1.0, stepped=True)
    assert batch(clock, math.nan, stepped=True)
    out = clock.finish()
    assert out.nan_step == 1 and len(out.step_times) == 2


def test_the_deadline_stops_at_a_step_boundary() -> None:
    clock = StepClock(warmup=0, steps=5, sync=lambda: None, report=quiet,
                      deadline=time.monotonic() - 1)
    clock.start()
    assert batch(clock, 1.0, stepped=True)
    assert clock.finish().timed_out


def test_the_device_is_synchronized_at_each_boundary() -> None:
    calls: list[str] = []
    clock = StepClock(warmup=0, steps=1, sync=lambda: calls.append("sync"), report=quiet)
    clock.start()
    batch(clock, 1.0, stepped=True)
    assert calls == ["sync"] * 3  # start, before the fetch, at the batch's end
