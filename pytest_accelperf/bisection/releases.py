"""``accelperf bisect --package NAME LOW HIGH -- NODEIDS``: the first release of a package
that made the cases worse, the working tree's code held fixed (see
:mod:`pytest_accelperf.bisection`).

The range is the package's releases from LOW to HIGH on the index, both included, oldest
first (:func:`~pytest_accelperf.envs.releases.list_releases`: yanked ones, ones without
files and pre-releases left out). Each release runs in an environment of its own from the
cache (:func:`~pytest_accelperf.envs.cache.env_from_pins`): an overlay of the session's
environment with the release pinned, and its companions (:data:`COMPANIONS`: jaxlib follows
jax, at the same version where it has one; a companion without that version is left to the
release's own requirement, which uv resolves). torch needs no companion: triton and its
CUDA libraries are torch's own wheel dependencies, and uv installs the versions that
release asks for.

The search is the one of commits (:mod:`.driver`, :mod:`.search`, :mod:`.evidence`):
LOW's session records the baseline under LOW's interpreter, every other release's session
is checked against it under its own interpreter (the baseline's stack differs, so every
check judges and names it: the program first), and where HIGH's programs agree with LOW's,
A/B mode under the release's interpreter with LOW's as the base arm
(``--accelperf-compare-python``): the same code, two environments. The working tree is
never changed: every session runs in the current directory.
"""

from __future__ import annotations

import os
import shlex
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from importlib import metadata
from pathlib import Path
from types import TracebackType

from packaging.version import Version

from pytest_accelperf.bisection import BisectError
from pytest_accelperf.bisection.commits import Commit, CommitRange, GitError, git
from pytest_accelperf.bisection.driver import Result, Settings, Step, reproduced
from pytest_accelperf.bisection.status import Status
from pytest_accelperf.bisection.trial import (
    Session,
    pytest_argv,
    read_session,
    report_paths,
    run_logged,
)
from pytest_accelperf.envs import EnvError
from pytest_accelperf.envs.cache import Env, env_from_pins
from pytest_accelperf.envs.releases import list_releases, released

#: Packages released in step with another, pinned to the same version where they have it:
#: always, and where they are installed in this session (jax's CUDA plugins).
COMPANIONS: Mapping[str, tuple[str, ...]] = {"jax": ("jaxlib",)}
INSTALLED_COMPANIONS: Mapping[str, tuple[str, ...]] = {
    "jax": ("jax-cuda12-plugin", "jax-cuda12-pjrt", "jax-cuda13-plugin", "jax-cuda13-pjrt")}


def _installed(name: str) -> bool:
    try:
        metadata.version(name)
    except metadata.PackageNotFoundError:
        return False
    return True


def companions(package: str) -> tuple[str, ...]:
    """The packages pinned with each release of ``package``.

    >>> companions("jax")[0], companions("torch")
    ('jaxlib', ())
    """
    key = package.lower()
    return (*COMPANIONS.get(key, ()),
            *(c for c in INSTALLED_COMPANIONS.get(key, ()) if _installed(c)))


def release_pins(package: str, version: str,
                 others: Mapping[str, Sequence[Version]]) -> tuple[tuple[str, ...], str]:
    """The pins of one release and its words: each companion of ``others`` (its
    releases) at the same version where it has one, else left to the release's own
    requirement.

    >>> release_pins("jax", "0.9.1", {"jaxlib": [Version("0.9.1")]})
    (('jax==0.9.1', 'jaxlib==0.9.1'), 'jax 0.9.1, jaxlib 0.9.1')
    >>> release_pins("jax", "0.9.0.1", {"jaxlib": [Version("0.9.0")]})
    (('jax==0.9.0.1',), 'jax 0.9.0.1, jaxlib as it requires')
    """
    pins, words = [f"{package}=={version}"], [f"{package} {version}"]
    for name, versions in others.items():
        if Version(version) in versions:
            pins.append(f"{name}=={version}")
            words.append(f"{name} {version}")
        else:
            words.append(f"{name} as it requires")
    return tuple(pins), ", ".join(words)


def release_range(cwd: Path, package: str, low: str, high: str
                  ) -> tuple[CommitRange, dict[str, tuple[str, ...]]]:
    """The releases of ``package`` from ``low`` to ``high`` as a range (each "commit" a
    release: its ``sha`` the version) and each one's pins; an :class:`EnvError` of one line
    for a release that does not exist, a backwards range or no network, a
    :class:`BisectError` for a range of one release."""
    try:
        git(cwd, "rev-parse", "--show-toplevel")
    except GitError as exc:
        raise BisectError(f"{cwd} is not in a git repository ({exc}); run accelperf bisect "
                          f"--package in the repository of the code to test (where the "
                          f"programs agree, A/B mode compares the releases on a copy of the "
                          f"files git sees)") from None
    versions = list_releases(package, low, high)
    if len(versions) < 2:
        raise BisectError(f"{package} {low} and {high} are the same release: nothing to "
                          f"bisect; pass two releases, the older (good) one first")
    others = {name: released(name) for name in companions(package)}
    pins: dict[str, tuple[str, ...]] = {}
    points = []
    for version in versions:
        pins[version], words = release_pins(package, version, others)
        points.append(Commit(version, words))
    return (CommitRange(cwd.resolve(), points[0], points[-1], tuple(points[1:]), Path(),
                        low, high, package=package), pins)


class Releases:
    """The points of a range of releases: each session in the current directory under the
    interpreter of the release's environment (built, or found in the cache, when it is
    first needed; LOW's and HIGH's on entering, so that either failing is an error of one
    line). A release between whose environment cannot be built is skipped, as a commit
    that does not import is."""

    def __init__(self, rng: CommitRange, pins: Mapping[str, tuple[str, ...]],
                 settings: Settings, announce: Callable[[str], None] = lambda line: None,
                 build: Callable[[Sequence[str]], Env] = env_from_pins) -> None:
        self.rng, self.pins, self.settings = rng, pins, settings
        self.announce, self.build = announce, build
        self.envs: dict[str, Env] = {}
        self.failed: dict[str, str] = {}

    def env(self, point: Commit) -> Env:
        """The environment of a release, built once; an :class:`EnvError` when it cannot
        be had (not tried again)."""
        if point.sha in self.failed:
            raise EnvError(self.failed[point.sha])
        if point.sha not in self.envs:
            try:
                env = self.build(self.pins[point.sha])
            except EnvError as exc:
                self.failed[point.sha] = str(exc)
                self.announce(f"[env] {point.subject}: {exc}")
                raise
            self.envs[point.sha] = env
            self.announce(f"[env] {point.subject}: {env.describe()}")
        return self.envs[point.sha]

    def __enter__(self) -> Releases:
        self.env(self.rng.good)
        self.env(self.rng.bad)
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        return None  # the environments stay in the cache, for the next bisection

    def session(self, point: Commit, extra: Sequence[str], scratch: Path) -> Session:
        cwd = self.rng.root
        try:
            python = str(self.env(point).python)
        except EnvError as exc:
            return Session(point, (), cwd, -1, 0.0, why=f"no environment: {exc}")
        report, log = report_paths(scratch, point)
        argv = pytest_argv(self.settings.args, [*extra, f"--accelperf-json={report}"],
                           python)
        t0 = time.monotonic()
        status = run_logged(argv, cwd, os.environ, log)
        return read_session(point, argv, cwd, status, time.monotonic() - t0, report, log)

    def compare_with_good(self) -> list[str]:
        # The same code, LOW's environment as the base arm: an A/B across environments.
        return [f"--accelperf-compare-python={self.envs[self.rng.good.sha].python}"]

    def reproduce(self, steps: Sequence[Step], first_bad: Commit | None) -> tuple[str, ...]:
        """The last decisive session (and the first bad release's), in the current
        directory under the releases' interpreters (in the cache), LOW's recording first
        where it is a check against it."""
        shown = reproduced(steps, first_bad)
        if not shown:
            return ()
        store = Path(tempfile.gettempdir()) / "accelperf-bisect-store"
        recorded = any(s.kind != "A/B" for s in shown)
        if recorded:
            shown = [steps[0], *shown]
        cwd = shlex.quote(str(self.rng.root))
        lines = []
        for step in shown:
            argv = [f"--accelperf-baselines={store}" if a.startswith("--accelperf-baselines=")
                    else a for a in step.command]
            if step.kind == "A/B":
                argv = [a for a in argv if not a.startswith("--accelperf-baselines=")]
            lines.append(f"(cd {cwd} && {shlex.join(argv)})")
        if recorded:
            lines.append(f"rm -rf {shlex.quote(str(store))}")
        return tuple(lines)

    def environments(self) -> tuple[str, ...]:
        out = [f"{self.rng.package} {sha}: {env.describe()}" for sha, env in
               sorted(self.envs.items(), key=lambda item: Version(item[0]))]
        out += [f"{self.rng.package} {sha}: {why}" for sha, why in sorted(self.failed.items())]
        return tuple(out)

    def advice(self, result: Result) -> tuple[str, ...]:
        """First the release, then the commits: how to go on from this result."""
        rng, nodeids = self.rng, shlex.join(self.settings.args)

        def under(version: str) -> str:
            python = shlex.quote(str(self.envs[version].python))
            return f"{python} -m pytest_accelperf.cli bisect GOOD BAD -- {nodeids}"

        bad = result.first_bad
        if result.status is Status.FOUND and bad is not None:
            index = rng.commits.index(bad)
            before = (rng.commits[index - 1] if index else rng.good).sha
            return (f"the regression came with {rng.package} {bad.sha}: with this code, "
                    f"{before} is good and {bad.sha} is bad",
                    f"to bisect your own commits under one release (GOOD and BAD your "
                    f"commits), run today's bisect with that release's interpreter: "
                    f"{under(bad.sha)}",
                    f"which of {rng.package}'s own commits between {before} and {bad.sha} "
                    f"did it is out of accelperf's scope (it would build {rng.package} from "
                    f"source at each commit); the program diff above is what to report "
                    f"upstream")
        if result.status is Status.BAD_NOT_BAD:
            return (f"with this code, {rng.package} {rng.bad.sha} was not found worse than "
                    f"{rng.good.sha} (see above: its program, then A/B mode's step time); if "
                    f"your code got slower across the upgrade, look at your own commits "
                    f"under one release: {under(rng.bad.sha)}",)
        return ()
