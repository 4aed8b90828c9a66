"""The exit statuses of ``accelperf bisect``: their own module, imported by the bisection
(:mod:`.driver`) and by the command's parser (its ``--help`` lists them) without the
bisection itself."""

from __future__ import annotations

from enum import IntEnum


class Status(IntEnum):
    """The exit status of ``accelperf bisect`` (1 is an error in what it was given, 2 a
    usage error, as for every ``accelperf`` command)."""

    FOUND = 0
    #: BAD is not worse than GOOD: its program is no worse, and A/B finds them within the
    #: tolerance or cannot tell them apart.
    BAD_NOT_BAD = 3
    #: GOOD is already worse than BAD: A/B finds BAD faster.
    GOOD_ALREADY_BAD = 4
    #: Only skipped commits are left between the last good and the first bad one.
    NOT_FOUND = 5
    #: Ctrl-C or SIGTERM (128 + SIGINT).
    INTERRUPTED = 130
