"""An explanation attached to a regression: a few more steps of the case under its
framework's profiler, the trace kept beside the report.

When a case regresses (against its stored baseline, or in A/B mode), the runner trains it
:data:`STEPS` more steps through the backend's stepper (the one A/B mode alternates):
one step to compile and warm up outside the trace, then :data:`STEPS` steps inside
``jax.profiler.trace`` (the JAX backend: a TensorBoard/Perfetto ``.xplane.pb`` and
``.trace.json.gz``) or ``torch.profiler.profile`` (the in-process torch backend: a Chrome
trace, ``trace.json``). The trace goes to ``<explain dir>/<case id>/``; a trace larger than
the cap (``--accelperf-explain-max-mb``) is deleted and the note says so. The result is
frozen data that the run carries in ``Run.explain`` for the reports (under ``"extra"`` in
its JSON).

An explanation never changes the verdict: if the profiler cannot run, the note says why.

It is bounded as the case's training is (:mod:`pytest_accelperf.gate.hangs`): a case whose run
timed out is never trained again for its explanation (a step that blocked would block
again, after the timeout the user set had passed), and every other explanation runs under
the case's own timeout (``--accelperf-timeout``), its alarm and its watchdog: profiled
steps that run past it are interrupted, nothing is kept, and the note says the trace was
cut short and where.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from pytest_accelperf.backends.protocol import steps_in_blocks
from pytest_accelperf.collect.cases import Case
from pytest_accelperf.gate.hangs import CaseTimeout, case_alarm
from pytest_accelperf.provision.accel import Accelerator
from pytest_accelperf.records.run import Explained
from pytest_accelperf.stats.units import fmt_bytes

if TYPE_CHECKING:
    from pytest_accelperf.backends.protocol import Backend, Task

#: Steps traced (the issue's cap: at most 5).
STEPS = 3
MAX_STEPS = 5
#: The backends whose framework profiler is known here.
PROFILED = ("jax", "torch")


def untraced(note: str) -> Explained:
    """The explanation of a case of which no trace was kept: ``note`` says why."""
    return Explained(path=None, steps=0, size=0, note=note)


def trace_dir(root: Path, case_id: str) -> Path:
    """The directory of ``case_id``'s trace under ``root`` (one safe path component)."""
    return root / (re.sub(r"[^A-Za-z0-9._+-]", "_", case_id) or "case")


@contextlib.contextmanager
def _jax_trace(out: Path) -> Iterator[None]:
    import jax

    with jax.profiler.trace(str(out)):
        yield


#: torch's profiler warns that it "clears events at the end of each cycle" when it starts
#: (seen on an H200 with torch 2.11+cu130; torch warns once a process): the trace here is
#: one cycle, so nothing is cleared, and under a suite's ``filterwarnings = error`` the
#: warning had failed the explanation ("no trace: profiling failed: UserWarning: ...").
PROFILER_CYCLE_WARNING = r"Warning: Profiler clears events at the end of each cycle"


@contextlib.contextmanager
def _torch_trace(out: Path) -> Iterator[None]:
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=PROFILER_CYCLE_WARNING,
                                category=UserWarning)
        with profile(activities=activities) as prof:
            yield
    prof.export_chrome_trace(str(out / "trace.json"))


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


#: The outcomes of a run that is never trained again for a trace: it ran past its timeout.
NOT_RETRAINED = ("timeout",)


def skipped(outcome: str, timeout: float | None) -> Explained:
    """The explanation of a run that is not trained again (``outcome`` in
    :data:`NOT_RETRAINED`)."""
    bound = f"its {timeout:g} s timeout" if timeout else "its timeout"
    return untraced(
        f"no trace: the case ran past {bound} (outcome {outcome}), so it was not trained "
        f"again under the profiler (a step that blocked would block again)")


def explain(backend: Backend, case: Case, task: Task, accel: Accelerator, root: Path, *,
            max_bytes: int, steps: int = STEPS, timeout: float | None = None,
            on_stuck: Callable[[str], None] | None = None) -> Explained:
    """Train ``case`` ``steps`` more steps (at most :data:`MAX_STEPS`) under its
    framework's profiler and keep the trace under ``root`` if it is at most ``max_bytes``.

    ``timeout`` (the case's, ``--accelperf-timeout``) bounds the whole explanation as it
    bounds training (:func:`~pytest_accelperf.gate.hangs.case_alarm`): past it the profiled
    steps are interrupted and the note says the trace was cut short; ``on_stuck(why)``
    runs from the watchdog where they cannot be interrupted (a native call), and is
    expected to end the process."""
    __tracebackhide__ = True
    try:
        with case_alarm(timeout, None if on_stuck is None else lambda alarm: on_stuck(
                "the profiled steps of its explanation ran past the "
                f"{timeout or 0:g} s timeout inside a native call that cannot be "
                "interrupted")):
            return _explain(backend, case, task, accel, root, max_bytes=max_bytes,
                            steps=steps)
    except CaseTimeout as exc:
        shutil.rmtree(trace_dir(root, case.id), ignore_errors=True)
        return untraced(
            f"trace cut short: the profiled steps ran past the {exc.timeout:g} s timeout "
            f"(--accelperf-timeout) and were interrupted in {exc.where}; nothing was kept")


def _explain(backend: Backend, case: Case, task: Task, accel: Accelerator, root: Path, *,
             max_bytes: int, steps: int) -> Explained:
    steps = max(1, min(steps, MAX_STEPS))
    if case.backend not in PROFILED or not steps_in_blocks(backend):
        return untraced(f"no trace: the {case.backend!r} backend has no profiler here "
                        f"(only {', '.join(PROFILED)})")
    out = trace_dir(root, case.id)
    shutil.rmtree(out, ignore_errors=True)
    try:
        if not root.exists():  # a directory of ours: traces are not for version control
            root.mkdir(parents=True)
            (root / ".gitignore").write_text("# traces of pytest-accelperf\n*\n")
        out.mkdir(parents=True)
        stepper = backend.stepper(case, task, accel)
        try:
            stepper.run(1)  # compile and warm up outside the trace
            with (_jax_trace(out) if case.backend == "jax" else _torch_trace(out)):
                stepper.run(steps)
        finally:
            close = getattr(stepper, "close", None)
            if close is not None:
                close()
    except Exception as exc:  # the explanation never changes the verdict
        shutil.rmtree(out, ignore_errors=True)
        return untraced(f"no trace: profiling failed: {type(exc).__name__}: {exc}")
    size = _size(out)
    if size > max_bytes:
        shutil.rmtree(out, ignore_errors=True)
        return Explained(path=None, steps=steps, size=size, note=(
            f"trace of {steps} step(s) deleted: {fmt_bytes(size)} is over the "
            f"{fmt_bytes(max_bytes)} cap (raise --accelperf-explain-max-mb)"))
    return Explained(path=str(out), steps=steps, size=size, note=(
        f"trace of {steps} step(s) ({fmt_bytes(size)}): {out}"))
