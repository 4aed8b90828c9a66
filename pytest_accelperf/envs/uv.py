"""Finding and running uv (https://docs.astral.sh/uv/): the installer of the environment
cache. A failure is an :class:`~pytest_accelperf.envs.EnvError` of one line with uv's own
words (:func:`said`)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from pytest_accelperf.envs import EnvError

#: Set to the uv executable to use (else ``uv`` on PATH, beside this interpreter, or the
#: ``uv`` Python package's binary).
UV_ENV = "ACCELPERF_UV"
#: Seconds one uv command may take (a cold install of a large framework downloads GBs).
UV_TIMEOUT_S = 1800.0
#: The longest quote of uv's words in a message.
SAID_MAX = 400

#: uv's decoration of an error: a multiplication sign and box drawing.
_DECORATION = re.compile("[\u00d7\u25b6\u2500-\u257f]+")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
#: uv's lines of progress, not of its complaint.
_PROGRESS = ("Using ", "Resolved ", "Prepared ", "Installed ", "Audited ", "Creating ")


def find_uv() -> str:
    """The uv executable: ``$ACCELPERF_UV``, ``uv`` on PATH, beside this interpreter, or
    the ``uv`` package's; an :class:`EnvError` saying how to install it."""
    given = os.environ.get(UV_ENV)
    if given:
        if shutil.which(given) is None:
            raise EnvError(f"{UV_ENV}={given}: no such executable")
        return given
    found = shutil.which("uv") or shutil.which("uv", path=str(Path(sys.executable).parent))
    if found:
        return found
    try:
        import uv  # type: ignore[import-not-found,unused-ignore]  # optional

        return str(uv.find_uv_bin())
    except (ImportError, FileNotFoundError):
        pass
    raise EnvError("uv is not installed (environments are built with it): pip install uv, "
                   "or set ACCELPERF_UV to its path")


def said(text: str) -> str:
    """uv's output as one line: colours, box drawing and blank lines gone, hints kept.

    >>> said("error: No solution found:\\n  ╰─▶ Because there is no version of jax==0.0.9\\n")
    'No solution found: Because there is no version of jax==0.0.9'
    """
    lines = [" ".join(_DECORATION.sub(" ", _ANSI.sub("", line)).split())
             for line in text.splitlines()]
    out = ""
    for line in lines:
        line = re.sub(r"^(error|cause|caused by):\s*", "", line, flags=re.IGNORECASE)
        if not line or line.startswith(_PROGRESS):
            continue
        sep = " " if not out or out.endswith((":", ".")) else ": "
        out = f"{out}{sep}{line}".strip()
    return out if len(out) <= SAID_MAX else out[:SAID_MAX - 1] + "…"


def run_uv(args: Sequence[str], *, what: str, env: Mapping[str, str] | None = None,
           timeout: float = UV_TIMEOUT_S) -> str:
    """``uv ARGS``'s standard output; an :class:`EnvError` ``"{what}: uv said: ..."`` when
    it fails, does not finish within ``timeout`` seconds, or cannot start."""
    command = [find_uv(), *args]
    full_env = {**os.environ, "NO_COLOR": "1", "UV_PYTHON_DOWNLOADS": "never",
                "UV_NO_PROGRESS": "1", **(env or {})}
    full_env.pop("VIRTUAL_ENV", None)  # never the user's: every command names its target
    try:
        proc = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True,
                              env=full_env, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise EnvError(f"{what}: uv {args[0]} did not finish within {timeout:g} s "
                       f"(it was stopped)") from None
    except OSError as exc:
        raise EnvError(f"{what}: uv could not start: {exc}") from None
    if proc.returncode:
        words = said(proc.stderr.decode(errors="replace")) or f"exit {proc.returncode}"
        raise EnvError(f"{what}: uv said: {words}")
    return proc.stdout.decode(errors="replace")
