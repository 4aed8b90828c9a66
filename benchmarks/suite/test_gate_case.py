"""The two gates of the benchmark, on the same compiled train step.

``test_step`` is an accelperf case: its throughput verdict against the stored baseline is
the accelperf arm. ``test_step_benchmark`` times the same step with pytest-benchmark's
``benchmark`` fixture: the same program (compiled by the JAX backend's ``_compile``), the
same batches, the same per-step ``block_until_ready`` and the same injected slowdown
(the measured-step loop's ``timed``, which spins in ``stretch`` inside the step), so the two
gates see one workload and one fault.

The benchmark holds the same host-wide lock that accelperf takes around a CPU case's
training (``exclusive_host``): with it, neither arm ever times its steps while another
accelperf session on the machine trains, so both gates run under the same conditions.
"""

from __future__ import annotations

import time
from typing import Any

from steptask import CASE, make_task

from pytest_accelperf import CaseRunner, cases
from pytest_accelperf.backends.measure.common import injected_slowdown


@cases(CASE)
def test_step(accelperf: CaseRunner) -> None:
    result = accelperf.train(make_task(accelperf.case))
    assert result.run.outcome == "ok"


def test_step_benchmark(benchmark: Any, accelerator: Any) -> None:
    import jax

    from pytest_accelperf.backends.jax.backend import _init_state, _step_fns
    from pytest_accelperf.backends.jax.compile import _compile
    from pytest_accelperf.backends.measure.loop import timed
    from pytest_accelperf.gate.session import exclusive_host

    task = make_task(CASE)
    program = _compile(CASE, task, accelerator, CASE.mesh)
    n_batches = CASE.warmup + CASE.steps  # the batches the accelperf case trains on
    batches = [jax.device_put(task.make_batch(i), program.batch_shardings)
               for i in range(n_batches)]
    jax.block_until_ready(batches)  # transfers outside the timer, as the backend does
    slower = injected_slowdown()
    fns, _ = _step_fns(program, _init_state(program))
    state: dict[str, Any] = {"i": 0}

    def step() -> None:
        i = state["i"]
        state["i"] += 1
        timed(fns, i, batches[i % n_batches], slower)

    t_lock = time.perf_counter()
    with exclusive_host(accelerator):
        benchmark.extra_info["lock_wait_s"] = time.perf_counter() - t_lock
        for _ in range(CASE.warmup):
            step()
        benchmark(step)
