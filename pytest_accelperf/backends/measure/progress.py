"""Progress of a long case on the terminal line: steps done, current loss, step time.

Backends call :func:`step` once per training step, *after* the step's timer has stopped
(and after the drift probe), so the callback is never inside a timed region. With no sink
installed, which is the case unless the plugin installed one for a test on an interactive
terminal, :func:`step` is one global read and a comparison.

The terminal sink writes at the end of pytest's current line (after the test's dots, or
its name under ``-v``), throttled, and erases what it wrote before the test's own result is
printed, so the line reads exactly as it would without it. It stays off under ``-q``, when
stdout is not a terminal, in CI (``CI``/``GITHUB_ACTIONS`` set), and on xdist workers.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from typing import Protocol

import pytest

from pytest_accelperf.provision.xdist_role import is_worker


class ProgressSink(Protocol):
    def update(self, done: int, total: int, loss: float, step_time: float) -> None: ...

    def close(self) -> None: ...


_sink: ProgressSink | None = None


def step(done: int, total: int, loss: float, step_time: float) -> None:
    """Report that ``done`` of ``total`` steps have run; the last had ``loss`` and took
    ``step_time`` seconds. Call it outside any timed region."""
    sink = _sink
    if sink is not None:
        sink.update(done, total, loss, step_time)


def active() -> bool:
    """Whether a sink that shows progress is installed (a caller that must do work to learn
    its progress, like reading another process's file, can skip it when nobody is
    watching); a :class:`StepRecord` alone shows nothing."""
    sink = _sink
    while isinstance(sink, StepRecord):
        sink = sink.inner
    return sink is not None


@contextlib.contextmanager
def reporting(sink: ProgressSink) -> Iterator[ProgressSink]:
    """Install ``sink`` for the duration of the block (one test), then close it."""
    global _sink
    previous, _sink = _sink, sink
    try:
        yield sink
    finally:
        _sink = previous
        sink.close()


class StepRecord:
    """A sink that keeps every step reported while it is installed (:func:`recording`) and
    passes it on to the sink that was installed before, if any: what the plugin keeps of a
    case that it had to interrupt mid-step, when the backend never got to return a run."""

    def __init__(self, inner: ProgressSink | None) -> None:
        self.inner = inner
        #: ``(done, total, loss, step_time)`` of each step, in the order reported.
        self.steps: list[tuple[int, int, float, float]] = []

    def update(self, done: int, total: int, loss: float, step_time: float) -> None:
        self.steps.append((done, total, loss, step_time))
        if self.inner is not None:
            self.inner.update(done, total, loss, step_time)

    def close(self) -> None:
        pass  # the inner sink is closed by the reporting() that installed it

    def first_training(self) -> list[tuple[int, int, float, float]]:
        """The steps of the first training reported (a backend that trains again, like
        the JAX backend's single-device reference run, starts over at step 1)."""
        out: list[tuple[int, int, float, float]] = []
        for entry in self.steps:
            if out and entry[0] <= out[-1][0]:
                break
            out.append(entry)
        return out


@contextlib.contextmanager
def recording() -> Iterator[StepRecord]:
    """Keep the steps reported in the block (they still reach the installed sink)."""
    global _sink
    previous = _sink
    record = StepRecord(previous)
    _sink = record
    try:
        yield record
    finally:
        _sink = previous


def progress_text(done: int, total: int, loss: float, step_time: float) -> str:
    """`` [step 12/40 · loss 2.412 · 13.2 ms/step]``."""
    ms = step_time * 1e3
    timing = f"{ms:.1f} ms/step" if ms < 10_000 else f"{step_time:.1f} s/step"
    return f" [step {done}/{total} · loss {loss:.4g} · {timing}]"


class LineProgress:
    """Writes progress after the cursor and erases it (backspaces, blanks, backspaces), so
    the terminal line is left as it was found. ``room()`` says how many columns are free.

    Nothing shows for the first ``delay`` seconds (short cases never flicker), then at most
    every ``interval`` seconds.
    """

    def __init__(self, write: Callable[[str], None], room: Callable[[], int], *,
                 delay: float = 1.0, interval: float = 0.25,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._write = write
        self._room = room
        self._delay = delay
        self._interval = interval
        self._clock = clock
        self._start = clock()
        self._last = -float("inf")
        self._shown = 0

    def update(self, done: int, total: int, loss: float, step_time: float) -> None:
        now = self._clock()
        if now - self._start < self._delay or now - self._last < self._interval:
            return
        self._last = now
        text = progress_text(done, total, loss, step_time)
        room = self._room() - 1
        if len(text) > room:
            text = ""  # no room: show nothing rather than wrap the line
        pad = max(0, self._shown - len(text))
        self._write("\b" * self._shown + text + " " * pad + "\b" * pad)
        self._shown = len(text)

    def close(self) -> None:
        if self._shown:
            n = self._shown
            self._write("\b" * n + " " * n + "\b" * n)
            self._shown = 0


def _enabled(config: pytest.Config, reporter: object) -> bool:
    if is_worker(config) or reporter is None:
        return False
    if config.get_verbosity() < 0 or os.environ.get("CI") or os.environ.get("GITHUB_ACTIONS"):
        return False
    return bool(getattr(reporter, "isatty", False)) and os.environ.get("TERM") != "dumb"


def terminal_progress(config: pytest.Config) -> LineProgress | None:
    """A sink on pytest's terminal line, or None where progress must stay quiet."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    capture = config.pluginmanager.get_plugin("capturemanager")
    if not _enabled(config, reporter) or capture is None:
        return None
    # pytest's TerminalWriter knows the column its line has reached; there is no public
    # accessor, so read it where it is and show nothing if it is not there.
    writer = getattr(reporter, "_tw", None)

    def write(text: str) -> None:
        # Straight to the real stdout (capture suspended, so sys.stdout is the terminal), not
        # through pytest's TerminalWriter: what is written is erased again, so the writer's
        # column count stays true and its "[ 50%]" lands where it always does.
        with capture.global_and_fixture_disabled():
            sys.stdout.write(text)
            sys.stdout.flush()

    def room() -> int:
        used = getattr(writer, "width_of_current_line", None)
        if not isinstance(used, int):
            return 0
        return shutil.get_terminal_size().columns - used

    return LineProgress(write, room)
