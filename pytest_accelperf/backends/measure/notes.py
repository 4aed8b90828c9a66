"""A trainer backend's notes (a setting the gate replaced, a short dataset) as warnings at
the user's line: :func:`say`.

Importing this module imports no framework.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Sequence

#: The plugin's own files: a note points at the first frame outside them.
_PLUGIN = os.path.dirname(os.path.dirname(os.path.dirname(__file__))) + os.sep


def say(notes: Sequence[str]) -> None:
    """Each of ``notes`` as an ``AccelperfWarning`` pointing at the user's line that
    trained the case (the first frame outside the plugin: ``accelperf.train(task)``)."""
    if not notes:
        return
    from pytest_accelperf.errors import AccelperfWarning

    level, frame = 2, sys._getframe(1)  # stacklevel 2: the caller of say
    while frame.f_back is not None and frame.f_code.co_filename.startswith(_PLUGIN):
        level, frame = level + 1, frame.f_back
    for note in notes:
        warnings.warn(AccelperfWarning(note), stacklevel=level)
