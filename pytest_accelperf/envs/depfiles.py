"""A revision's dependency files and what in them differs from the working tree's
(:func:`dependency_change`): the requirements the base arm of an A/B comparison needs on
top of the session's environment (:mod:`.cache` layers them over it).

Read, at the repository's root: ``pyproject.toml`` (``[project]`` dependencies and
optional dependencies, ``[dependency-groups]``), ``requirements*.txt`` and
``requirements/*.txt``, ``constraints*.txt``, ``uv.lock``, ``poetry.lock``,
``pylock*.toml`` and ``Pipfile.lock`` (their locked ``name==version``). ``setup.py``,
``setup.cfg`` and ``Pipfile`` are compared but not read: a change there is named, not
installed.

A requirement of the base that the working tree does not have is needed when it applies
here and the session's environment does not meet it already: a ``[project]`` dependency or
a requirements file's line always (its marker permitting), an extra's, a group's or a
lock's only when its package is installed in the session (an extra nobody installed stays
out, as does a lock's package for another platform). ``jax>=0.6`` against the session's
jax 0.10.2 needs nothing; ``jax==0.8.3`` needs jax 0.8.3.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path, PurePosixPath
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from pytest_accelperf.git import git

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

_NAMES = re.compile(r"^(pyproject\.toml|setup\.py|setup\.cfg|Pipfile|Pipfile\.lock|uv\.lock|"
                    r"poetry\.lock|pylock(\..+)?\.toml|requirements[^/]*\.txt|"
                    r"constraints[^/]*\.txt|requirements/[^/]+\.txt)$")
#: Files compared but not read for requirements.
_NOT_READ = ("setup.py", "setup.cfg", "Pipfile")


def is_dependency_file(rel: str) -> bool:
    """Whether ``rel`` (relative to the repository root, ``/``-separated) is one.

    >>> [is_dependency_file(p) for p in ("pyproject.toml", "requirements-dev.txt",
    ...  "requirements/gpu.txt", "suites/pyproject.toml", "uv.lock", "README.md")]
    [True, True, True, False, True, False]
    """
    return bool(_NAMES.match(rel))


def files_at(root: Path, sha: str) -> dict[str, bytes]:
    """The dependency files of commit ``sha``: ``{path: content}``."""
    listed = git(root, "ls-tree", "--name-only", "-z", sha).split("\0")  # the root only
    if "requirements" in listed:
        inner = git(root, "ls-tree", "--name-only", "-z", f"{sha}:requirements")
        listed += [f"requirements/{name}" for name in inner.split("\0") if name]
    out = {}
    for rel in filter(None, listed):
        if is_dependency_file(rel):
            out[rel] = git(root, "show", f"{sha}:{rel}").encode() + b"\n"
    return out


def files_here(root: Path) -> dict[str, bytes]:
    """The working tree's dependency files: ``{path: content}``."""
    out = {}
    for path in [*root.glob("*"), *root.glob("requirements/*")]:
        rel = str(PurePosixPath(*path.relative_to(root).parts))
        if path.is_file() and is_dependency_file(rel):
            out[rel] = path.read_bytes().strip() + b"\n"
    return out


@dataclass(frozen=True)
class Unreadable:
    """A part of a dependency file that cannot be read: its line (None: the whole file),
    the text there and why."""

    line: int | None
    text: str
    why: str

    def describe(self, rel: str) -> str:
        """``requirements.txt line 1 ('jax=>>0.8': Expected end or semicolon ...)``."""
        where = f"{rel} line {self.line}" if self.line else rel
        text = f"{self.text!r}: " if self.text else ""
        return f"{where} ({text}{self.why})"


@dataclass(frozen=True)
class Requirements:
    """A file's requirements: those that always apply, and those that apply only where
    their package is installed (extras, groups, locks); and what of it cannot be read."""

    always: frozenset[str] = frozenset()
    if_installed: frozenset[str] = frozenset()
    unreadable: tuple[Unreadable, ...] = ()


@dataclass
class DependencyChange:
    """How the base revision's dependency files differ from the working tree's."""

    #: The files that differ (added, removed or changed).
    files: list[str] = field(default_factory=list)
    #: The base's requirements the session's environment does not have, to install.
    requirements: list[str] = field(default_factory=list)
    #: What differs but is not installed (a file that is not read).
    notes: list[str] = field(default_factory=list)
    #: The parts of the base's files that cannot be read (a line that is not a
    #: requirement, a file that is not TOML), each ``file line N ('text': why)``: nothing
    #: of them is installed.
    unreadable: list[str] = field(default_factory=list)


def _req(text: str) -> str | None:
    try:
        return str(Requirement(text.strip()))
    except InvalidRequirement:
        return None


def _why(text: str) -> str:
    """Why ``text`` is not a requirement, in packaging's words (one line)."""
    try:
        Requirement(text.strip())
    except InvalidRequirement as exc:
        return " ".join(str(exc).splitlines()[0].split())
    return ""


#: A pip option after a requirement on its line (``--hash=...``, ``--config-settings``).
_OPTION = re.compile(r"\s--?[A-Za-z]")


def _lines(text: str) -> Requirements:
    """A requirements file's requirements, its lines as pip joins them (a trailing
    backslash continues one); options (``-r``, ``-e``, ``--index-url``, a requirement's
    ``--hash``), comments, and a bare path or URL are not requirements by name. Every other
    line that is not a requirement is :class:`Unreadable`."""
    out, bad = set(), []
    joined: list[tuple[int, str]] = []
    pending: tuple[int, str] | None = None
    for number, raw in enumerate(text.splitlines(), start=1):
        first, part = pending if pending is not None else (number, "")
        line = part + raw
        if line.endswith("\\"):
            pending = (first, line[:-1] + " ")
            continue
        pending = None
        joined.append((first, line))
    if pending is not None:
        joined.append(pending)
    for number, raw in joined:
        line = re.split(r"(?:^|\s)#", raw, maxsplit=1)[0].strip()
        line = _OPTION.split(line, maxsplit=1)[0].strip()
        if not line or line.startswith("-"):
            continue
        if line.startswith((".", "/", "~")) or re.match(r"^[a-z+]+://", line):
            continue  # a path or a URL: installed as it is, no name to compare
        req = _req(line)
        if req:
            out.add(req)
        else:
            bad.append(Unreadable(number, line, _why(line)))
    return Requirements(always=frozenset(out), unreadable=tuple(bad))


def _locked(packages: object, skip: Callable[[Mapping[str, Any]], bool]) -> frozenset[str]:
    """The ``name==version`` pins of a lock file's ``packages`` (a TOML array of tables)."""
    out = set()
    for pkg in packages if isinstance(packages, list) else []:
        if isinstance(pkg, Mapping) and pkg.get("name") and pkg.get("version") and not skip(pkg):
            out.add(f"{canonicalize_name(str(pkg['name']))}=={pkg['version']}")
    return frozenset(out)


class Project(BaseModel):
    """``[project]`` of a ``pyproject.toml``: only its dependencies are read."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    dependencies: list[str] = Field(default_factory=list)
    optional_dependencies: dict[str, list[str]] = Field(
        default_factory=dict, alias="optional-dependencies")


class PyProject(BaseModel):
    """The parts of a ``pyproject.toml`` that name requirements (PEP 621, PEP 735)."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    project: Project = Field(default_factory=Project)
    #: A group's entry is a requirement or an ``{include-group = ...}`` table.
    dependency_groups: dict[str, list[str | dict[str, str]]] = Field(
        default_factory=dict, alias="dependency-groups")


def _line_of(text: str, needle: str) -> int | None:
    """The first line of ``text`` that holds ``needle``."""
    for number, line in enumerate(text.splitlines(), start=1):
        if needle in line:
            return number
    return None


def _error_line(message: str) -> int | None:
    """The line a TOML or JSON parser's message names (``... (at line 3, column 5)``)."""
    found = re.search(r"line (\d+)", message)
    return int(found.group(1)) if found else None


def _pyproject(text: str, toml: Mapping[str, Any]) -> Requirements:
    try:
        data = PyProject.model_validate(toml)
    except ValidationError as exc:
        error = exc.errors()[0]
        key = str(error["loc"][-1]) if error["loc"] else "project"
        return Requirements(unreadable=(Unreadable(
            _line_of(text, key), ".".join(str(p) for p in error["loc"]), error["msg"]),))
    bad: list[Unreadable] = []

    def read(texts: list[str]) -> set[str]:
        out = set()
        for item in texts:
            req = _req(item)
            if req:
                out.add(req)
            else:
                bad.append(Unreadable(_line_of(text, item), item, _why(item)))
        return out

    always = read(data.project.dependencies)
    optional = [r for reqs in data.project.optional_dependencies.values() for r in reqs]
    groups = [r for reqs in data.dependency_groups.values() for r in reqs if isinstance(r, str)]
    return Requirements(frozenset(always), frozenset(read([*optional, *groups])), tuple(bad))


def _pins(pins: Iterable[str], text: str) -> Requirements:
    """A lock's pins, each a requirement only where its name and version make one."""
    good, bad = set(), []
    for pin in sorted(pins):
        req = _req(pin)
        if req:
            good.add(req)
        else:
            bad.append(Unreadable(_line_of(text, pin.split("==")[0]), pin, _why(pin)))
    return Requirements(if_installed=frozenset(good), unreadable=tuple(bad))


def read_requirements(rel: str, content: bytes) -> Requirements:
    """The requirements of one dependency file (empty for one that is not read), with
    what of it cannot be read (:class:`Unreadable`: a line that is not a requirement, a
    file that does not parse)."""
    name = PurePosixPath(rel).name
    text = content.decode(errors="replace")
    try:
        if name.endswith(".txt"):
            return _lines(text)
        if name == "Pipfile.lock":
            data = json.loads(text)
            pins = {f"{canonicalize_name(k)}{v['version']}"
                    for k, v in ((data.get("default") or {}) if isinstance(data, dict)
                                 else {}).items()
                    if isinstance(v, dict) and str(v.get("version", "")).startswith("==")}
            return _pins(pins, text)
        if not name.endswith((".toml", ".lock")):
            return Requirements()
        toml = tomllib.loads(text)
    except (ValueError, tomllib.TOMLDecodeError) as exc:
        why = " ".join(str(exc).split())
        return Requirements(unreadable=(Unreadable(_error_line(why), "", why),))
    if name == "pyproject.toml":
        return _pyproject(text, toml)
    if name in ("uv.lock", "poetry.lock"):
        def editable(pkg: Mapping[str, Any]) -> bool:
            source = pkg.get("source")
            return isinstance(source, Mapping) and bool({"editable", "virtual"} & set(source))
        return _pins(_locked(toml.get("package"), editable), text)
    if name.startswith("pylock"):
        return _pins(_locked(toml.get("packages"), lambda p: False), text)
    return Requirements()


def installed_version(name: str) -> str | None:
    """The version of the distribution ``name`` installed in this session, or None."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _satisfied(requirement: str, version: str | None) -> bool:
    """Whether the installed ``version`` meets ``requirement`` already."""
    if version is None:
        return False
    try:
        return Requirement(requirement).specifier.contains(version, prereleases=True)
    except InvalidVersion:
        return False


def _applies(requirement: str) -> bool:
    marker = Requirement(requirement).marker
    return marker is None or marker.evaluate()


def dependency_change(base: Mapping[str, bytes], head: Mapping[str, bytes],
                      have: Callable[[str], str | None] = installed_version
                      ) -> DependencyChange:
    """How the base's dependency files (``{path: content}``) differ from the head's, and
    the base's requirements to install over the session's environment for it: those the
    head's files do not have and the session does not meet already (``have`` gives the
    version of a package installed in the session, or None)."""
    out = DependencyChange(files=sorted(p for p in {*base, *head}
                                        if base.get(p) != head.get(p)))
    if not out.files:
        return out
    head_reqs: set[str] = set()
    for rel, content in head.items():
        reqs = read_requirements(rel, content)
        head_reqs |= reqs.always | reqs.if_installed
    wanted: dict[str, None] = {}
    for rel in out.files:
        if PurePosixPath(rel).name in _NOT_READ:
            out.notes.append(f"{rel} differs; its requirements are not read")
            continue
        if rel not in base:
            continue  # a file only the head has: the session's environment is the head's
        reqs = read_requirements(rel, base[rel])
        out.unreadable += [u.describe(rel) for u in reqs.unreadable]
        for req, only_installed in [*((r, False) for r in sorted(reqs.always - head_reqs)),
                                    *((r, True) for r in sorted(reqs.if_installed
                                                                - head_reqs))]:
            version = have(Requirement(req).name)
            if not _applies(req) or (only_installed and version is None):
                continue
            if not _satisfied(req, version):
                wanted[req] = None
    out.requirements = list(wanted)
    return out
