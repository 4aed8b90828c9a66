"""Writing a report where the user points it, without replacing what is there.

Every output of a session (the JSON report, Markdown, HTML, the history, the GitHub step
summary) and of ``accelperf report`` goes through :func:`write_output` or
:func:`append_output`. What happens depends on what the path is:

* ``-``, ``/dev/stdout``, ``/dev/stderr``, ``/dev/fd/N``, ``/proc/self/fd/N`` (and symlinks
  that lead to one of them): written to a duplicate of that already-open descriptor, at its
  current offset. Opening the name again would start a redirected file over at offset 0
  (``O_TRUNC``) and lose what pytest printed before; renaming over it is what replaced the
  user's file, and failed outright on a pipe (``/proc/<pid>/fd/pipe:[...]`` is no path).
* an existing character or block device, FIFO or terminal: opened and written in place;
  a Unix socket is connected to. Never renamed over: run as root, the atomic write used to
  leave a regular file where ``/dev/full``'s node had been. A FIFO is opened without
  blocking first, so that one nobody reads is an error instead of a hang.
* a regular file or a new path: the atomic write of :func:`~pytest_accelperf.store.jsonfile.
  atomic_write` (readers see the old report or the new one, never half), at the end of any
  symlinks (the link stays a link; a dangling one creates its target). A file that existed
  keeps its permission bits.

A write that fails is an :class:`OutputError` naming the option, the path and the OS error
(``--accelperf-json: cannot write /x/y: [Errno 28] No space left on device``); the session
turns it into one of its errors (exit status 1), the CLI into ``accelperf: error: ...``.
The baseline store does not write through here: its files are always regular files, and
keep :mod:`pytest_accelperf.store.baselines`' own guarantees.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import select
import socket
import stat
import sys
from pathlib import Path

from pytest_accelperf.errors import UserError
from pytest_accelperf.store.jsonfile import atomic_write

__all__ = ["OutputError", "append_output", "describe", "readable_back", "stream_fd",
           "write_output"]

#: Symlinks followed while looking for a descriptor's name (the kernel's own limit is 40).
_MAX_LINKS = 40

_STD_NAMES = {"/dev/stdout": 1, "/dev/stderr": 2, "/dev/stdin": 0}


class OutputError(UserError):
    """An output that cannot be written; ``where`` is the option (or variable) that named
    ``path``."""

    def __init__(self, message: str, *, where: str, path: Path | str) -> None:
        super().__init__(message, where=where)
        self.path = path


def describe(exc: OSError) -> str:
    """``[Errno 28] No space left on device``: the OS error without the file name Python
    adds, which would be a temporary file's or repeat the path the message already names."""
    if exc.errno is not None and exc.strerror:
        return f"[Errno {exc.errno}] {exc.strerror}"
    return str(exc) or type(exc).__name__


def _fd_named(path: str) -> int | None:
    """The descriptor a name stands for by itself: ``/dev/stdout`` is 1, ``/dev/fd/3`` is 3;
    the ``/proc`` spelling too, with this process's own pid (the pid can change in a fork,
    so it is read each time)."""
    if path in _STD_NAMES:
        return _STD_NAMES[path]
    match = re.fullmatch(rf"/(?:dev/fd|proc/(?:self|thread-self|{os.getpid()})/fd)/(\d+)",
                         path)
    return int(match.group(1)) if match else None


def stream_fd(path: Path | str) -> int | None:
    """The open descriptor of this process that ``path`` names: ``-`` (stdout), a name of
    :func:`_fd_named`, or a chain of symlinks that reaches one; None for anything else.

    The chain is walked by name, one ``readlink`` at a time, because resolving it would go
    through ``/proc/self/fd/1`` to what the descriptor is open on (``pipe:[123]``, or the
    file stdout was redirected to), which is exactly what must not be reopened.
    """
    current = str(path)
    if current == "-":
        return 1
    current = os.path.abspath(current)
    for _ in range(_MAX_LINKS):
        fd = _fd_named(current)
        if fd is not None:
            return fd
        try:
            target = os.readlink(current)
        except OSError:  # not a link, or nothing there: a path like any other
            return None
        current = os.path.abspath(os.path.join(os.path.dirname(current), target))
    return None


def readable_back(path: Path | str) -> bool:
    """Whether a report written to ``path`` can be read from it afterwards (``accelperf
    baselines accept PATH``): a regular file or a new path; not a descriptor, a device, a
    FIFO or a socket, whose report is gone once written."""
    if stream_fd(path) is not None:
        return False
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:  # nothing there yet (or unreachable: then the write says why)
        return True


def _flush_std() -> None:
    """Flush Python's buffered stdout and stderr before writing to the descriptor under
    them, so that what was printed before the report comes before it."""
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        if stream is not None:
            with contextlib.suppress(OSError, ValueError):  # closed or broken: not ours
                stream.flush()


def _write_all(fd: int, data: bytes) -> None:
    """Write every byte of ``data`` to ``fd``, then close it.

    A descriptor inherited in non-blocking mode (a parent set ``O_NONBLOCK`` on a shared
    pipe; the flag belongs to the open file, so clearing it would change the parent's too)
    is waited on until writable rather than failing with EAGAIN.
    """
    try:
        view = memoryview(data)
        while view:
            try:
                written = os.write(fd, view)
            except BlockingIOError:
                poll = select.poll()  # not select(): a descriptor may be numbered >= 1024
                poll.register(fd, select.POLLOUT)
                poll.poll()
                continue
            view = view[written:]
    finally:
        os.close(fd)


def _open_in_place(path: Path, mode: int) -> int:
    """Open the existing special file ``path`` for writing, without creating, truncating or
    becoming the process's controlling terminal. A FIFO is opened non-blocking: with no
    reader, ``open`` would wait forever; non-blocking, it fails with ENXIO, reported as
    such. Once open, the FIFO is made blocking again so the write waits for its reader
    instead of failing when the pipe's buffer is full."""
    fifo = stat.S_ISFIFO(mode)
    base = os.O_WRONLY | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, base | (os.O_NONBLOCK if fifo else 0))
    except OSError as exc:
        if fifo and exc.errno == errno.ENXIO:
            raise OSError(exc.errno, f"{exc.strerror} (a FIFO that nothing reads: start its "
                                     f"reader first)") from None
        raise
    if fifo:
        os.set_blocking(fd, True)
    return fd


def _send(path: Path, data: bytes) -> None:
    """A Unix socket: connect to the process listening on it and send ``data``."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(str(path))
        sock.sendall(data)


def _special(path: Path) -> int | None:
    """The mode of what ``path`` leads to when it exists and is not a regular file, None
    when it is a regular file or nothing (an error such as ENOTDIR or EACCES is raised:
    the write could not succeed either)."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:  # a new path, or a dangling link: the atomic write creates it
        return None
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR))
    return mode


def _write(path: Path, text: str, *, append: bool) -> None:
    data = text.encode("utf-8")
    fd = stream_fd(path)
    if fd is not None:
        _flush_std()
        # A duplicate, so that closing ours leaves the process's own descriptor open; it
        # shares the offset (and O_APPEND) with it, so the report lands after what was
        # already written there.
        _write_all(os.dup(fd), data)
        return
    mode = _special(path)
    if mode is not None:
        if stat.S_ISSOCK(mode):
            _send(path, data)
        else:
            _write_all(_open_in_place(path, mode), data)
        return
    # A regular file or a new path, through any symlinks to their end: the link stays, its
    # target is written (and created, when the link dangles).
    target = Path(os.path.realpath(path))
    target.parent.mkdir(parents=True, exist_ok=True)
    if append:
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0)
        _write_all(os.open(target, flags, 0o666), data)
        return
    try:
        kept: int | None = stat.S_IMODE(os.stat(target).st_mode)
    except FileNotFoundError:
        kept = None  # new: 0o666 less the umask, as any file the user creates
    atomic_write(target, text, mode=kept)


def write_output(path: Path, text: str, *, option: str) -> None:
    """Write ``text`` to ``path`` as the module docstring says; an :class:`OutputError`
    naming ``option`` when that fails."""
    try:
        _write(path, text, append=False)
    except OSError as exc:
        raise OutputError(f"cannot write {path}: {describe(exc)}", where=option,
                          path=path) from exc


def append_output(path: Path, text: str, *, option: str) -> None:
    """Append ``text`` to ``path`` (a regular file is opened ``O_APPEND`` and created when
    missing; anything else is written as :func:`write_output` writes it); an
    :class:`OutputError` naming ``option`` when that fails."""
    try:
        _write(path, text, append=True)
    except OSError as exc:
        raise OutputError(f"cannot write {path}: {describe(exc)}", where=option,
                          path=path) from exc
