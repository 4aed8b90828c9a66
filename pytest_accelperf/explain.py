"""An explanation attached to a regression: a few more steps of the case under its
framework's profiler, the trace kept beside the report.

When a case regresses (against its stored baseline, or in A/B mode), the runner trains it
:data:`STEPS` more steps through the backend's stepper (the one A/B mode alternates):
one step to compile and warm up outside the trace, then :data:`STEPS` steps inside
``jax.profiler.trace`` (the JAX backend: a TensorBoard/Perfetto ``.xplane.pb`` and
``.trace.json.gz``) or ``torch.profiler.profile`` (the in-process torch backend: a Chrome
trace, ``trace.json``). The trace goes to ``<explain dir>/<case id>/``; a trace larger than
the cap (``--accelperf-explain-max-mb``) is deleted and the note says so. The result is
frozen data that the run carries in ``Run.extra["explain"]`` for the reports.

An explanation never changes the verdict: if the profiler cannot run, the note says why.
"""

from __future__ import annotations

import contextlib
import re
import shutil
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pytest_accelperf.accel import Accelerator
from pytest_accelperf.cases import Case
from pytest_accelperf.units import fmt_bytes

#: ``Run.extra`` key of an explanation.
EXPLAIN_KEY = "explain"
#: Steps traced (the issue's cap: at most 5).
STEPS = 3
MAX_STEPS = 5
#: The backends whose framework profiler is known here.
PROFILED = ("jax", "torch")


@dataclass(frozen=True)
class Explanation:
    """What was traced: ``path`` (the trace's directory, None when none was kept),
    ``steps`` traced, ``size`` in bytes (of the trace written, kept or not) and a one-line
    ``note`` for the failure message and the reports."""

    path: str | None
    steps: int
    size: int
    note: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def trace_dir(root: Path, case_id: str) -> Path:
    """The directory of ``case_id``'s trace under ``root`` (one safe path component)."""
    return root / (re.sub(r"[^A-Za-z0-9._+-]", "_", case_id) or "case")


@contextlib.contextmanager
def _jax_trace(out: Path) -> Iterator[None]:
    import jax

    with jax.profiler.trace(str(out)):
        yield


@contextlib.contextmanager
def _torch_trace(out: Path) -> Iterator[None]:
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities) as prof:
        yield
    prof.export_chrome_trace(str(out / "trace.json"))


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def explain(backend: Any, case: Case, task: Any, accel: Accelerator, root: Path, *,
            max_bytes: int, steps: int = STEPS) -> Explanation:
    """Train ``case`` ``steps`` more steps (at most :data:`MAX_STEPS`) under its
    framework's profiler and keep the trace under ``root`` if it is at most ``max_bytes``."""
    steps = max(1, min(steps, MAX_STEPS))
    make_stepper = getattr(backend, "stepper", None)
    if case.backend not in PROFILED or make_stepper is None:
        return Explanation(None, 0, 0, f"no trace: the {case.backend!r} backend has no "
                                       f"profiler here (only {', '.join(PROFILED)})")
    out = trace_dir(root, case.id)
    shutil.rmtree(out, ignore_errors=True)
    try:
        if not root.exists():  # a directory of ours: traces are not for version control
            root.mkdir(parents=True)
            (root / ".gitignore").write_text("# traces of pytest-accelperf\n*\n")
        out.mkdir(parents=True)
        stepper = make_stepper(case, task, accel)
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
        return Explanation(None, 0, 0, f"no trace: profiling failed: "
                                       f"{type(exc).__name__}: {exc}")
    size = _size(out)
    if size > max_bytes:
        shutil.rmtree(out, ignore_errors=True)
        return Explanation(None, steps, size, (
            f"trace of {steps} step(s) deleted: {fmt_bytes(size)} is over the "
            f"{fmt_bytes(max_bytes)} cap (raise --accelperf-explain-max-mb)"))
    return Explanation(str(out), steps, size, (
        f"trace of {steps} step(s) ({fmt_bytes(size)}): {out}"))
