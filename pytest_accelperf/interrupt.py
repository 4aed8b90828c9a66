"""Starting a child process that an interrupt stops, as a shell starts a command.

A child inherits its parent's ignored signals and signal mask, and Python installs its
``KeyboardInterrupt`` handler only where SIGINT is not ignored at start. A shell script
that runs a command in the background (``cmd &`` without job control) starts it with
SIGINT ignored, and so does every process that command starts. A pytest session started
from such a process goes on through the SIGINT meant to stop it: it is killed at the end
of the grace period instead of stopping its workers and writing its report. (Seen twice:
an ``accelperf bisect`` in a full test run that ran every session to its end, and the
device script's sessions on a GPU machine, whose SIGINT 5 s in was never acted on.)

:func:`sigint_delivered` is held around starting such a child. While it is, this process
handles SIGINT (Python's default handler) and has it unblocked; a handled signal is reset
to its default by ``exec``, so the child starts with SIGINT at its default and Python
installs its handler there. Not in a ``preexec_fn``: that runs Python in the forked
child, and a process that imported JAX warns of a fork.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator


@contextlib.contextmanager
def sigint_delivered() -> Iterator[None]:
    """Around ``subprocess.Popen``: the child starts with SIGINT handled by default (see
    the module docstring). Outside the main thread, where Python cannot set a handler,
    it changes nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    blocked = signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        signal.signal(signal.SIGINT, previous)
