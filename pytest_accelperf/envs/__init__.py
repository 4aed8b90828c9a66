"""Python environments other than the session's own, for A/B mode across environments
(``--accelperf-compare-python``, and ``--accelperf-compare=REF`` where REF's dependency
files differ) and, later, a bisection over a package's releases.

One job per module:

- :mod:`.uv`: finding and running uv; what uv said, as one line.
- :mod:`.cache`: a virtual environment built with uv from a list of requirements, cached
  under ``$XDG_CACHE_HOME/accelperf/envs/<key>`` keyed by a hash of its inputs, built
  atomically under a file lock (:func:`~.cache.build_env`, :func:`~.cache.env_from_pins`).
- :mod:`.depfiles`: a revision's dependency files (pyproject.toml, requirements*.txt,
  uv.lock, poetry.lock, ...) and the requirements in which they differ from the working
  tree's.
- :mod:`.indexes`: the package indexes the user configured (uv's, else pip's).
- :mod:`.releases`: a package's released versions in a range that install here, from them.
- :mod:`.stack`: a Python environment's framework packages and their versions (the
  *stack*), a check of a given interpreter, and the words for two stacks that differ.

Every mistake of the user's (a release that does not exist, no network, a failed build, a
Python that lacks the plugin) is an :class:`EnvError`: one line naming the package, version
or path and what the installer said. Nothing of the user's own environment is changed:
environments are built in the cache, never in the running interpreter's.
"""

from __future__ import annotations

from pytest_accelperf.errors import UserError


class EnvError(UserError):
    """An environment cannot be built, listed or used; the message is one line naming the
    package, version or path and what the installer said."""
