"""The environment cache: a virtual environment built with uv (``uv venv`` and ``uv pip
install``) from a list of requirements, kept under :func:`cache_root` in a folder named by
a hash of its inputs (:func:`env_key`), so that the same inputs are built once.

Two kinds of environment:

- an *overlay* (``over`` = the site-packages folders of another environment, by default
  this session's: :func:`session_site`): only the given requirements are installed, and
  everything else is imported from the environment below, which a ``.pth`` file puts after
  the overlay's own site-packages. A comparison of ``jax==0.8.3`` with the session's jax
  then differs in jax (and what uv installed with it) only, and costs one install;
- a *standalone* environment (``over=None``): the requirements and the plugin's own
  dependencies (:func:`plugin_requirements`), nothing else.

A build is atomic: it happens in ``<root>/.tmp-<key>-XXXX`` and is renamed to
``<root>/<key>`` once ``accelperf-env.json`` is written in it, under a file lock
(``<root>/<key>.lock``), so two sessions never build one key twice and a build that fails
or is killed halfway leaves no entry (its temporary folder is removed, or by the next build
of that key). The user's own environment is never written to.

An entry is checked before it is used (:func:`broken`): its interpreter runs, is the
Python it was built with, and has its requirements. A broken entry is built again, and
:meth:`Env.describe` says so. The key holds the base interpreter's path and version
(:func:`interpreter_identity`): an upgraded Python gets an entry of its own.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import site
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from importlib import metadata
from pathlib import Path

from filelock import FileLock, Timeout
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from pytest_accelperf.envs import EnvError
from pytest_accelperf.envs.uv import run_uv

#: Where the cache is: ``$ACCELPERF_ENV_CACHE``, else ``$XDG_CACHE_HOME/accelperf/envs``,
#: else ``~/.cache/accelperf/envs``.
CACHE_ENV = "ACCELPERF_ENV_CACHE"
#: The file a finished environment holds (its inputs); written last, before the rename.
META = "accelperf-env.json"
#: The ``.pth`` file of an overlay that puts the environment below on the path.
OVERLAY_PTH = "_accelperf_overlay.pth"
#: Changes whenever the way an environment is built changes: old entries are not reused.
LAYOUT = 2
#: Seconds a session waits for another that builds the same key.
LOCK_TIMEOUT_S = 3600.0
#: The plugin's dependencies, where its own metadata cannot be read (a plain checkout).
_FALLBACK_REQUIREMENTS = ("pytest>=8.0", "numpy>=1.26", "scipy>=1.11", "filelock>=3.12",
                          "tabulate>=0.9", "pydantic>=2.6,<3", "orjson>=3.10",
                          "typing_extensions>=4.6",
                          "ruptures>=1.1.9,<2", "packaging>=23")


@dataclass(frozen=True)
class Env:
    """A built environment in the cache."""

    path: Path
    key: str
    requirements: tuple[str, ...]
    #: The site-packages folders it is layered over (empty: standalone).
    over: tuple[str, ...]
    #: Whether this call built it (cold) or found it in the cache (warm).
    built: bool
    #: Seconds this call took: the build, or finding it.
    seconds: float
    #: Why the entry the cache held was built again ("": it was not): its interpreter
    #: no longer ran, or it lacked what its entry says.
    rebuilt: str = ""

    @property
    def python(self) -> Path:
        """Its interpreter."""
        scripts = "Scripts" if os.name == "nt" else "bin"
        return self.path / scripts / ("python.exe" if os.name == "nt" else "python")

    def describe(self) -> str:
        """One line: what it holds and how it was had.

        >>> Env(Path("/c/ab12"), "ab12", ("jax==0.8.3",), ("/v/site",), True, 5.2).describe()
        'environment ab12 (jax==0.8.3 over /v/site), built cold in 5.2 s'
        """
        what = ", ".join(self.requirements) or "no requirements"
        below = f" over {', '.join(self.over)}" if self.over else ""
        how = (f"built cold in {self.seconds:.1f} s" if self.built
               else f"warm from the cache ({self.seconds:.1f} s)")
        if self.rebuilt:
            how = f"rebuilt in {self.seconds:.1f} s: the cached one was broken ({self.rebuilt})"
        return f"environment {self.key} ({what}{below}), {how}"


def cache_root() -> Path:
    """The cache's folder (not created here)."""
    given = os.environ.get(CACHE_ENV)
    if given:
        return Path(given).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "accelperf" / "envs"


def session_site() -> tuple[str, ...]:
    """This interpreter's site-packages folders: what an overlay is layered over by
    default."""
    return tuple(str(Path(p).resolve()) for p in site.getsitepackages() if Path(p).is_dir())


def plugin_requirements() -> tuple[str, ...]:
    """The plugin's own dependencies (not its extras), from its installed metadata."""
    try:
        listed = metadata.requires("pytest-accelperf") or []
    except metadata.PackageNotFoundError:
        return _FALLBACK_REQUIREMENTS
    return tuple(r for r in listed if "extra ==" not in r.replace('"', "").replace("'", ""))


def checked_requirements(requirements: Sequence[str]) -> tuple[str, ...]:
    """The requirements, each as packaging writes it; an :class:`EnvError` naming the
    first one that is not a requirement.

    >>> checked_requirements(["jax == 0.8.3", "flax"])
    ('jax==0.8.3', 'flax')
    """
    out = []
    for text in requirements:
        try:
            out.append(str(Requirement(text)))
        except InvalidRequirement as exc:
            raise EnvError(f"{text!r} is not a requirement (e.g. jax==0.8.3): {exc}") from None
    return tuple(out)


def _installed_digest(over: Sequence[str]) -> str:
    """A hash of the distributions (names and versions) installed in ``over``: an overlay
    is rebuilt when the environment below it changed."""
    found = sorted(f"{d.metadata['Name']}=={d.version}"
                   for d in metadata.distributions(path=list(over)))
    return hashlib.sha256("\n".join(found).encode()).hexdigest()


def env_key(requirements: Sequence[str], python: str, over: Sequence[str]) -> str:
    """The cache key of an environment: a hash of its requirements (in any order), its
    interpreter (its :func:`interpreter_identity`: path and version) and what it is
    layered over (the folders and what is installed in them).

    >>> env_key(["b", "a"], "/py", []) == env_key(["a", "b"], "/py", [])
    True
    """
    inputs = {"layout": LAYOUT, "requirements": sorted(requirements), "python": python,
              "over": list(over), "below": _installed_digest(over) if over else ""}
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:20]


def _interpreter(python: str | None) -> str:
    """The interpreter an environment is made with: ``python``, or this one's base (the
    interpreter a virtual environment of this session's was made from)."""
    if python is not None:
        return python
    return str(Path(getattr(sys, "_base_executable", sys.executable)).resolve())


#: What an interpreter prints to say which it is (its ``sys.version``, the build's date
#: included: an upgraded Python of the same X.Y is another interpreter).
_VERSION = "import sys; print(sys.version.replace(chr(10), ' '))"


def interpreter_version(python: str) -> str:
    """``python``'s ``sys.version`` (this session's without running it, for its base);
    an :class:`EnvError` where it does not run."""
    if python == _interpreter(None):
        return sys.version.replace("\n", " ")
    try:
        return subprocess.run([python, "-c", _VERSION], capture_output=True, text=True,
                              check=True, timeout=120, stdin=subprocess.DEVNULL
                              ).stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        raise EnvError(f"the interpreter {python} does not run: {exc}") from None


def interpreter_identity(python: str, version: str | None = None) -> str:
    """The identity an environment's key holds of its base interpreter: its path and
    version (``/usr/bin/python3.11 3.11.7 (main, Dec  4 2023, ...)``), so that an upgraded
    Python gets a new entry."""
    return f"{python} {interpreter_version(python) if version is None else version}"


def _site_folders(env: Path) -> list[str]:
    """An environment's own site-packages folders (found on disk, not by running it)."""
    return [str(p) for p in [*env.glob("lib/python*/site-packages"), env / "Lib/site-packages"]
            if p.is_dir()]


def broken(env: Env) -> str:
    """Why a cached environment cannot be used (``""``: it can): its interpreter does not
    run or is another version than it was built with (uv's environments link to the
    interpreter they were made from, which pyenv, the distribution or a runner image may
    have upgraded or removed), or a requirement of its entry is not installed in it (or
    below it) at a version that meets it."""
    try:
        meta = json.loads((env.path / META).read_text())
    except (OSError, ValueError) as exc:
        return f"its {META} cannot be read: {exc}"
    try:
        now = subprocess.run([str(env.python), "-c", _VERSION], capture_output=True,
                             text=True, timeout=120, check=False, stdin=subprocess.DEVNULL)
    except OSError as exc:
        return f"its interpreter {env.python} does not run: {exc.strerror}"
    except subprocess.SubprocessError as exc:
        return f"its interpreter {env.python} does not run: {exc}"
    if now.returncode:
        tail = " ".join(now.stderr.strip().splitlines()[-1:]) or f"exit {now.returncode}"
        return f"its interpreter {env.python} does not run: {tail}"
    built_with = meta.get("python_version") if isinstance(meta, dict) else None
    if built_with and now.stdout.strip() != built_with:
        return (f"its interpreter is Python {now.stdout.split()[0]}, built with "
                f"{str(built_with).split()[0]}")
    folders = [*_site_folders(env.path), *env.over]  # what it imports, its own first
    for text in env.requirements:
        req = Requirement(text)
        if req.marker is not None and not req.marker.evaluate():
            continue
        found = next(iter(metadata.distributions(name=req.name, path=folders)), None)
        version = found.version if found is not None else None
        if version is None:
            return f"it lacks {text}"
        if not req.specifier.contains(version, prereleases=True):
            return f"it has {req.name} {version}, not {text}"
    return ""


def build_env(requirements: Sequence[str], *, over: Sequence[str] | None = None,
              python: str | None = None, root: Path | None = None,
              offline: bool = False) -> Env:
    """The environment of ``requirements`` from the cache, built first if it is not there.

    ``over``: the site-packages folders to layer it over (:func:`session_site`); None
    for a standalone environment, which also gets the plugin's dependencies; ``()`` for
    one of exactly ``requirements``. ``python``:
    the interpreter (default: this session's). ``offline``: uv may not use the network
    (only its cache). An :class:`EnvError` of one line when it cannot be built; then no
    entry is left in the cache.
    """
    reqs = checked_requirements(requirements)
    if over is None:
        reqs = tuple(dict.fromkeys((*plugin_requirements(), *reqs)))
    below = tuple(over or ())
    interpreter = _interpreter(python)
    version = interpreter_version(interpreter)
    key = env_key(reqs, interpreter_identity(interpreter, version), below)
    root = (root or cache_root()).expanduser()
    final = root / key
    t0 = time.monotonic()
    what = f"building an environment with {' '.join(requirements) or 'no requirements'}"
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise EnvError(f"{what}: cannot create the cache folder {root}: {exc.strerror} "
                       f"(set {CACHE_ENV} to a writable folder)") from None
    found = Env(final, key, reqs, below, False, 0.0)
    if (final / META).is_file() and not broken(found):
        return replace(found, seconds=time.monotonic() - t0)
    why = ""
    try:
        with FileLock(str(root / f"{key}.lock"), timeout=LOCK_TIMEOUT_S):
            if (final / META).is_file():  # another session built it while we waited
                why = broken(found)
                if not why:
                    return replace(found, seconds=time.monotonic() - t0)
                _discard(root, key)
            _build(root, key, reqs, below, interpreter, version, offline=offline, what=what)
    except Timeout:
        raise EnvError(f"{what}: another process held {root / (key + '.lock')} for "
                       f"{LOCK_TIMEOUT_S:g} s (a build that hangs?)") from None
    return Env(final, key, reqs, below, True, time.monotonic() - t0, rebuilt=why)


def _discard(root: Path, key: str) -> None:
    """Take the broken entry ``root/key`` out of the cache (under its lock): renamed
    first, so that no session finds half of it, then removed."""
    gone = Path(tempfile.mkdtemp(prefix=f".tmp-{key}-broken-", dir=root)) / "env"
    os.rename(root / key, gone)
    shutil.rmtree(gone.parent, ignore_errors=True)


def env_from_pins(pins: Sequence[str], *, over: Sequence[str] | None = None,
                  python: str | None = None, root: Path | None = None,
                  offline: bool = False) -> Env:
    """An environment of exact releases, layered over this session's (``over``, default
    :func:`session_site`): e.g. ``env_from_pins(["jax==0.8.3", "jaxlib==0.8.3"])`` for a
    comparison or a bisection over jax's releases. Each pin must be ``name==version``."""
    for pin in checked_requirements(pins):
        req = Requirement(pin)
        specs = list(req.specifier)
        if len(specs) != 1 or specs[0].operator not in ("==", "==="):
            raise EnvError(f"{pin!r} is not a pin: give name==version (e.g. jax==0.8.3)")
    return build_env(pins, over=session_site() if over is None else over, python=python,
                     root=root, offline=offline)


def _build(root: Path, key: str, reqs: Sequence[str], over: Sequence[str],
           interpreter: str, version: str, *, offline: bool, what: str) -> None:
    """Build into a temporary folder and rename it to ``root/key`` (under the lock)."""
    for stale in root.glob(f".tmp-{key}-*"):  # left by a build that was killed
        shutil.rmtree(stale, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{key}-", dir=root))
    t0 = time.monotonic()
    try:
        venv = tmp / "env"
        run_uv(["venv", "--quiet", "--relocatable", "--python", interpreter, str(venv)],
               what=f"{what}: creating a virtual environment with {interpreter}")
        python = venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
        if over:
            _layer(python, over)
        how = _install(python, reqs, over, tmp, offline=offline, what=what) if reqs else ""
        meta = {"key": key, "requirements": list(reqs), "over": list(over), "install": how,
                "python": interpreter, "python_version": version,
                "seconds": round(time.monotonic() - t0, 3),
                "built": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        (venv / META).write_text(json.dumps(meta, indent=1) + "\n")
        os.rename(venv, root / key)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def below_constraints(over: Sequence[str], requirements: Sequence[str]) -> list[str]:
    """``name==version`` of every distribution installed in ``over`` that ``requirements``
    do not name: what an overlay must leave as it is below. Without them, a requirement's
    own dependencies are resolved afresh (``deepspeed==0.18.9`` brought the newest torch,
    a 5 GB CUDA build, over the session's CPU torch), and the two arms would differ in
    more than what was asked."""
    named = {canonicalize_name(Requirement(r).name) for r in requirements}
    out: dict[str, str] = {}
    for dist in metadata.distributions(path=list(over)):
        name = dist.metadata["Name"]
        if name and canonicalize_name(name) not in named:
            out.setdefault(canonicalize_name(name), f"{name}=={dist.version}")
    return sorted(out.values())


def _install(python: Path, reqs: Sequence[str], over: Sequence[str], tmp: Path, *,
             offline: bool, what: str) -> str:
    """Install ``reqs`` into the environment of ``python``; over ``over``, with what is
    installed there held at its versions (:func:`below_constraints`), or, where those
    cannot be met from the index (a local build such as torch ``2.13.0+cpu``), the
    requirements alone without their dependencies, which then come from below. Returns
    how, in words."""
    base = ["pip", "install", "--quiet", "--python", str(python),
            *(["--offline"] if offline else [])]
    if not over:
        run_uv([*base, *reqs], what=what)
        return "resolved"
    constraints = tmp / "below.txt"
    constraints.write_text("\n".join(below_constraints(over, reqs)) + "\n")
    try:
        run_uv([*base, "--constraint", str(constraints), *reqs], what=what)
        return "resolved, what is below held at its versions"
    except EnvError:
        run_uv([*base, "--no-deps", *reqs], what=what)
        return ("without dependencies: what is below could not be held at its versions "
                "from the index, so the requirements' dependencies come from below")


def _layer(python: Path, over: Sequence[str]) -> None:
    """Put ``over`` on the path of the environment of ``python``, after its own
    site-packages (``.pth`` files in them, editable installs among them, are read)."""
    try:
        purelib = subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
            capture_output=True, text=True, check=True, timeout=120).stdout.strip()
    except (subprocess.SubprocessError, OSError) as exc:
        raise EnvError(f"the new environment's interpreter {python} does not run: "
                       f"{exc}") from None
    lines = [f"import site; site.addsitedir({folder!r})" for folder in over]
    (Path(purelib) / OVERLAY_PTH).write_text("\n".join(lines) + "\n")
