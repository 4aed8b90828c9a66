"""The one exception type for a mistake in what the user gave the plugin, and how it reads.

A :class:`UserError` is the user's to fix: a step that returns the wrong thing, a batch whose
shape changed, a log that is not text, a mesh larger than the devices, a cluster address
where nothing listens, a report path that cannot be written, a git revision that does not
exist. Wherever it is raised (a ``Case``, a step API, ingest, the CLI, a cluster, git), it
is shown the same way: one line, or a short block, naming the user's file, line or option,
with no frame of ``pytest_accelperf`` (the plugin's hooks render it in a test, at
collection and in the session's own errors; the ``accelperf`` command prints it as
``accelperf: error: ...``). Anything else the plugin raises is a bug of ours, and keeps its
traceback.

This module imports nothing of the plugin's and no framework: every layer may raise it.
"""

from __future__ import annotations

import sysconfig
from pathlib import Path
from types import TracebackType

__all__ = ["UserError", "render", "user_frame"]


class UserError(Exception):
    """A mistake in the user's input, with what to change.

    ``where`` names the place when the message does not: an option (``--accelperf-json``),
    a file (``suites/x/log.txt:12``); when it is None, the rendering names the user's
    innermost frame of the traceback, if any.
    """

    where: str | None = None

    def __init__(self, message: str, *, where: str | None = None) -> None:
        super().__init__(message)
        if where is not None:
            self.where = where


#: Path fragments of frames that are not the user's: frameworks and this plugin.
_NOT_USER = ("/site-packages/", "/dist-packages/", "<frozen ", "<string>",
             sysconfig.get_paths()["stdlib"] + "/",
             str(Path(__file__).resolve().parent) + "/")


def shown(path: str) -> str:
    """``path`` relative to the working directory when it is under it."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd()))
    except (ValueError, OSError):
        return path


def user_frame(exc: BaseException) -> str | None:
    """``file:line (in function)`` of the last frame of ``exc``'s traceback (or of its
    causes') that is the user's code rather than a framework's or this plugin's."""
    seen: BaseException | None = exc
    for _ in range(32):  # a cycle of causes is possible in principle
        if seen is None:
            break
        found = None
        tb: TracebackType | None = seen.__traceback__
        while tb is not None:
            code = tb.tb_frame.f_code
            if not any(part in code.co_filename for part in _NOT_USER):
                found = f"{shown(code.co_filename)}:{tb.tb_lineno} (in {code.co_name})"
            tb = tb.tb_next
        if found is not None:
            return found
        seen = seen.__cause__ or seen.__context__
    return None


def render(exc: BaseException) -> str:
    """How a :class:`UserError` reads: its message, after the place it names (its
    ``where``, else the user's innermost frame when the message does not already name
    that file). Never a frame of this plugin."""
    text = str(exc).strip() or type(exc).__name__
    where = getattr(exc, "where", None)
    if where:
        return text if text.startswith(where) else f"{where}: {text}"
    frame = user_frame(exc)
    if frame is None or frame.split(":", 1)[0] in text:
        return text
    return f"{text}\n  (at {frame})"


class ConfigError(UserError, ValueError):
    """A value the user wrote that cannot be used as written: a ``Case`` field, a case's
    ``params``, a mesh larger than the devices, a scaling group. Also a ``ValueError``, as
    such a value is."""


class AccelperfWarning(UserWarning):
    """A warning of pytest-accelperf (e.g. a baseline from another environment, or a
    trainer setting the gate replaced). Defined here, at the bottom of the layers, so that
    a backend can warn without importing the gate."""
