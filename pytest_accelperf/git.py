"""Running git: the one place the plugin starts a ``git`` process (A/B mode's revisions,
``accelperf bisect``'s commits and worktrees, the history's commit of a session).

git runs without a prompt (a partial clone that must fetch from a remote asking for
credentials fails at once instead of waiting for a terminal nobody watches), with stdin
closed and with a timeout: a command that does not end is stuck (a network filesystem, a
remote that does not answer, an fsmonitor hook) and is stopped. A failure is a
:class:`GitError` quoting git; the callers say what it means for their command.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import IO

#: Seconds a git command that reads the repository (``rev-parse``, ``ls-files``, ``log``)
#: may take: instant on a healthy checkout.
READ_TIMEOUT_S = 120.0


class GitError(Exception):
    """A git command that failed, or that is not installed; the message quotes git, and
    ``said`` is git's own words (its stderr), or the message where git said nothing."""

    def __init__(self, message: str, said: str = "") -> None:
        super().__init__(message)
        self.said = said or message


class GitTimeout(GitError):
    """A git command that did not finish within its timeout (it was stopped)."""


def _env() -> dict[str, str]:
    return {**os.environ, "GIT_TERMINAL_PROMPT": "0"}


def _call(repo: Path, args: tuple[str, ...], timeout: float,
          stdout: IO[bytes] | None = None) -> subprocess.CompletedProcess[bytes]:
    try:
        return subprocess.run(["git", "-C", str(repo), *args],
                              stdout=subprocess.PIPE if stdout is None else stdout,
                              stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=_env(),
                              check=False, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise GitTimeout(f"git {args[0]} in {repo} did not finish within {timeout:g} s "
                         f"(it was stopped)") from None
    except FileNotFoundError:
        raise GitError(f"git is not installed (git {args[0]} was needed): install git") from None
    except OSError as exc:
        raise GitError(f"git {args[0]} in {repo} could not start: {exc}") from None


def _failure(args: tuple[str, ...], proc: subprocess.CompletedProcess[bytes]) -> GitError:
    said = proc.stderr.decode(errors="replace").strip()
    return GitError(f"git {' '.join(args)} failed" + (f": {said}" if said else ""), said)


def git(repo: Path, *args: str, timeout: float = READ_TIMEOUT_S) -> str:
    """``git -C repo ARGS``'s output, stripped; a :class:`GitError` quoting git when it
    fails, a :class:`GitTimeout` when it does not finish within ``timeout`` seconds."""
    proc = _call(repo, args, timeout)
    if proc.returncode:
        raise _failure(args, proc)
    return proc.stdout.decode(errors="replace").strip()


def git_test(repo: Path, *args: str, timeout: float = READ_TIMEOUT_S) -> bool:
    """Whether a git command that answers by its status (``merge-base --is-ancestor``)
    said yes (0) or no (1); a :class:`GitError` for any other status."""
    proc = _call(repo, args, timeout)
    if proc.returncode not in (0, 1):
        raise _failure(args, proc)
    return proc.returncode == 0


def git_to(repo: Path, out: IO[bytes], *args: str, timeout: float) -> None:
    """``git -C repo ARGS`` with its output written to ``out`` (``git archive``)."""
    proc = _call(repo, args, timeout, stdout=out)
    if proc.returncode:
        raise _failure(args, proc)


def git_or_none(repo: Path, *args: str, timeout: float = 10.0) -> str | None:
    """``git -C repo ARGS``'s raw output, or ``None`` where there is no git, no repository
    or no answer in time (for what is only recorded when git can say it)."""
    try:
        proc = _call(repo, args, timeout)
    except GitError:
        return None
    return proc.stdout.decode(errors="replace") if proc.returncode == 0 else None
