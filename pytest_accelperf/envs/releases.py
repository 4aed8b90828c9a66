"""A package's released versions in a range: what a bisection over releases walks.

They are listed from the indexes the user configured for their installer
(:func:`~pytest_accelperf.envs.indexes.configured_indexes`: uv's or pip's configuration,
else PyPI), through the Simple API (PEP 503), in its JSON form where the index offers it
(PEP 691/700), and from their find-links. A release counts only with a file that installs
on this interpreter and platform: a wheel whose tags are among this interpreter's
(``packaging.tags.sys_tags``) or a source distribution, whose ``Requires-Python`` admits
this Python and which is not yanked. Pre-releases are left out unless an end of the range
is one.

``$ACCELPERF_INDEX_JSON`` overrides the configuration with a JSON API of PyPI's shape
(``https://pypi.org/pypi/{name}/json``; e.g. a ``file://`` folder of ``<name>/json``
files).
"""

from __future__ import annotations

import json
import os
import platform
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from functools import cache
from html.parser import HTMLParser
from pathlib import Path

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.tags import Tag, sys_tags
from packaging.utils import (
    InvalidSdistFilename,
    InvalidWheelFilename,
    canonicalize_name,
    parse_sdist_filename,
    parse_wheel_filename,
)
from packaging.version import InvalidVersion, Version
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from pytest_accelperf.envs import EnvError
from pytest_accelperf.envs.indexes import Indexes, configured_indexes

#: A JSON API of PyPI's shape that replaces the configured indexes; ``{name}`` is the
#: package's normalized name.
INDEX_JSON_ENV = "ACCELPERF_INDEX_JSON"
#: Seconds an index may take to answer.
INDEX_TIMEOUT_S = 60.0
#: What the Simple API is asked for: its JSON form first (PEP 691), else HTML.
SIMPLE_ACCEPT = ("application/vnd.pypi.simple.v1+json, "
                 "application/vnd.pypi.simple.v1+html;q=0.2, text/html;q=0.01")
_SIMPLE_JSON = "application/vnd.pypi.simple.v1+json"


def _version(package: str, text: str) -> Version:
    try:
        return Version(text)
    except InvalidVersion:
        raise EnvError(f"{package} {text!r} is not a version (e.g. 0.8.3)") from None


@dataclass(frozen=True)
class IndexedFile:
    """A file an index lists for a package: its name, ``Requires-Python`` and whether it
    was yanked (None: the index does not say which file it is)."""

    filename: str | None
    requires_python: str | None = None
    yanked: bool = False


class SimpleFile(BaseModel):
    """A file of the Simple API's JSON form (PEP 691)."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    filename: str
    requires_python: str | None = Field(default=None, alias="requires-python")
    yanked: bool | str = False


class SimpleAnswer(BaseModel):
    """The Simple API's JSON for a project: only its files are read."""

    model_config = ConfigDict(extra="ignore")

    files: list[SimpleFile]


class IndexFile(BaseModel):
    """A file of a release in a JSON API of PyPI's shape."""

    model_config = ConfigDict(extra="ignore")

    filename: str | None = None
    requires_python: str | None = None
    yanked: bool | None = False


class IndexAnswer(BaseModel):
    """A JSON API's answer for a package (PyPI's shape): only its releases are read."""

    model_config = ConfigDict(extra="ignore")

    releases: dict[str, list[IndexFile]] | None = None


class _Links(HTMLParser):
    """The anchors of a Simple API page (PEP 503) or a find-links page."""

    def __init__(self) -> None:
        super().__init__()
        self.files: list[IndexedFile] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag != "a":
            return
        found = dict(attrs)
        href = found.get("href")
        if not href:
            return
        name = urllib.parse.unquote(urllib.parse.urlsplit(href).path.rsplit("/", 1)[-1])
        self.files.append(IndexedFile(name, found.get("data-requires-python"),
                                      "data-yanked" in found))


def parse_links(html: str) -> list[IndexedFile]:
    """The files a Simple API page lists.

    >>> parse_links('<a href="../f/jax-0.9.2-py3-none-any.whl#sha256=1" '
    ...             'data-requires-python="&gt;=3.11">x</a>')
    [IndexedFile(filename='jax-0.9.2-py3-none-any.whl', requires_python='>=3.11', yanked=False)]
    """
    parser = _Links()
    parser.feed(html)
    parser.close()
    return parser.files


def parse_simple(package: str, url: str, content_type: str, body: bytes
                 ) -> list[IndexedFile]:
    """The files of a Simple API answer, JSON (PEP 691) or HTML; an :class:`EnvError` of
    one line naming ``url`` for one that cannot be read."""
    try:
        if content_type.split(";")[0].strip() == _SIMPLE_JSON:
            answer = SimpleAnswer.model_validate_json(body)
            return [IndexedFile(f.filename, f.requires_python, f.yanked not in (False, ""))
                    for f in answer.files]
        return parse_links(body.decode("utf-8"))
    except ValidationError as exc:
        raise EnvError(f"{package}: cannot read the index's answer ({url}): "
                       f"{exc.errors()[0]['msg']}") from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise EnvError(f"{package}: cannot read the index's answer ({url}): {exc}") from None


def _unreachable(package: str, url: str, exc: urllib.error.URLError, where: str) -> EnvError:
    reason = exc.reason.strerror if isinstance(exc.reason, OSError) else exc.reason
    return EnvError(f"{package}: cannot reach the index ({url}{where}): {reason}; is there "
                    f"a network?")


def _get(package: str, url: str, where: str = "") -> tuple[str, bytes] | None:
    """``(content type, body)`` of ``url``, asking for the Simple API's JSON; None where
    the index has no such page (the package is not on it)."""
    request = urllib.request.Request(url, headers={"Accept": SIMPLE_ACCEPT})
    try:
        with urllib.request.urlopen(request, timeout=INDEX_TIMEOUT_S) as reply:
            return reply.headers.get("Content-Type", "text/html"), reply.read()
    except urllib.error.HTTPError as exc:
        if exc.code in (404, 410):
            return None
        raise EnvError(f"{package}: the index answered {exc.code} {exc.reason} "
                       f"({url}{where})") from None
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, FileNotFoundError | NotADirectoryError):
            return None
        raise _unreachable(package, url, exc, where) from None
    except OSError as exc:
        raise EnvError(f"{package}: cannot read the index's answer ({url}{where}): "
                       f"{exc}") from None


def _local(location: str) -> Path | None:
    """The folder or file a ``file://`` URL or a plain path names, or None for a URL."""
    parts = urllib.parse.urlsplit(location)
    if parts.scheme == "file":
        return Path(urllib.request.url2pathname(parts.path))
    return Path(location) if parts.scheme in ("", ) or len(parts.scheme) == 1 else None


def _from_index(package: str, root: str, where: str) -> list[IndexedFile] | None:
    """The files of ``package`` on the Simple API at ``root``; None where it has none."""
    url = f"{root.rstrip('/')}/{canonicalize_name(package)}/"
    local = _local(url)
    if local is not None:  # a static index on disk: its page is index.html (as pip reads it)
        page = local / "index.html"
        if not page.is_file():
            return None
        try:
            got: tuple[str, bytes] | None = ("text/html", page.read_bytes())
        except OSError as exc:
            raise EnvError(f"{package}: cannot read the index's page {page}{where}: "
                           f"{exc.strerror}") from None
    else:
        got = _get(package, url, where)
    return None if got is None else parse_simple(package, url, got[0], got[1])


def _from_links(package: str, location: str, where: str) -> list[IndexedFile]:
    """The files a find-links location (a folder, or a page of links) lists."""
    local = _local(location)
    if local is not None:
        try:
            if local.is_dir():
                return [IndexedFile(p.name) for p in sorted(local.iterdir())]
            return parse_links(local.read_text(errors="replace")) if local.is_file() else []
        except OSError as exc:
            raise EnvError(f"{package}: cannot read the find-links location {local}{where}: "
                           f"{exc.strerror}") from None
    got = _get(package, location, where)
    return [] if got is None else parse_simple(package, location, got[0], got[1])


@cache
def _tags() -> frozenset[Tag]:
    return frozenset(sys_tags())


def _python() -> str:
    return platform.python_version()


def installable(package: str, file: IndexedFile) -> Version | None:
    """The version of ``package`` that ``file`` installs here, or None where it does not:
    yanked, a ``Requires-Python`` that excludes this Python, a wheel for another
    interpreter or platform, another package's file, or no distribution. A file the index
    does not name (the JSON API's bare ``{"yanked": false}``) counts."""
    if file.yanked:
        return None
    if file.requires_python:
        try:
            if not SpecifierSet(file.requires_python).contains(_python(), prereleases=True):
                return None
        except InvalidSpecifier:
            pass  # pip ignores a Requires-Python it cannot read
    if file.filename is None:
        return Version("0")
    name = canonicalize_name(package)
    try:
        if file.filename.endswith(".whl"):
            wheel, version, _, tags = parse_wheel_filename(file.filename)
            return version if wheel == name and tags & _tags() else None
        sdist, version = parse_sdist_filename(file.filename)
        return version if sdist == name else None
    except (InvalidWheelFilename, InvalidSdistFilename, InvalidVersion):
        return None


def _json_api(package: str, template: str) -> list[Version]:
    """The releases a JSON API of PyPI's shape lists with a file installable here."""
    url = template.format(name=canonicalize_name(package))
    got = _get(package, url, f", ${INDEX_JSON_ENV}")
    if got is None:
        raise EnvError(f"{package}: no such package on the index ({url})")
    try:
        data = IndexAnswer.model_validate(json.loads(got[1]))
    except ValidationError as exc:
        raise EnvError(f"{package}: cannot read the index's answer ({url}): "
                       f"{exc.errors()[0]['msg']}") from None
    except ValueError as exc:
        raise EnvError(f"{package}: cannot read the index's answer ({url}): {exc}") from None
    out = set()
    for text, files in (data.releases or {}).items():
        try:
            version = Version(text)
        except InvalidVersion:
            continue  # a legacy version string pip would not install either
        named = [IndexedFile(f.filename, f.requires_python, bool(f.yanked)) for f in files]
        if any(installable(package, f) is not None for f in named):
            out.add(version)
    return sorted(out)


def asked() -> str:
    """The indexes a listing asks, in words (for messages)."""
    template = os.environ.get(INDEX_JSON_ENV)
    if template:
        return f"{template} (${INDEX_JSON_ENV})"
    return configured_indexes().describe()


def _indexed(package: str, indexes: Indexes) -> list[Version]:
    """The releases the configured ``indexes`` list with a file installable here."""
    where = f", {indexes.source}"
    listed: list[IndexedFile] = []
    known = False  # whether any index has the package (its files may all be for elsewhere)
    for root in indexes.urls:
        files = _from_index(package, root, where)
        known |= files is not None
        listed += files or []
    for location in indexes.find_links:
        files = [f for f in _from_links(package, location, where) if _names(package, f)]
        known |= bool(files)
        listed += files
    if not known:
        raise EnvError(f"{package}: no such package on the index ({indexes.describe()})")
    return sorted({v for v in (installable(package, f) for f in listed) if v is not None})


def _names(package: str, file: IndexedFile) -> bool:
    """Whether ``file`` (of a find-links folder, which holds every package's) is one of
    ``package``'s."""
    name = canonicalize_name(package)
    try:
        if file.filename is None:
            return False
        if file.filename.endswith(".whl"):
            return parse_wheel_filename(file.filename)[0] == name
        return parse_sdist_filename(file.filename)[0] == name
    except (InvalidWheelFilename, InvalidSdistFilename, InvalidVersion):
        return False


def released(package: str) -> list[Version]:
    """Every release of ``package`` with a file installable here (not yanked, its
    ``Requires-Python`` and wheel tags met), oldest first, from the configured indexes
    (``$ACCELPERF_INDEX_JSON`` in their place)."""
    template = os.environ.get(INDEX_JSON_ENV)
    if template:
        return _json_api(package, template)
    return _indexed(package, configured_indexes())


def list_releases(package: str, low: str, high: str) -> list[str]:
    """The releases of ``package`` from ``low`` to ``high`` (both included, both must be
    releases installable here), oldest first: ``list_releases("jax", "0.8.3", "0.10.2")``.
    An :class:`EnvError` of one line for a backwards range, a version that was never
    released (or has no file for this interpreter and platform; the message names the
    indexes asked), an unknown package or no network."""
    lo, hi = _version(package, low), _version(package, high)
    if lo > hi:
        raise EnvError(f"{package} {low}..{high}: the range is backwards (the older release "
                       f"first: {high} {low})")
    every = released(package)
    for end, text in ((lo, low), (hi, high)):
        if end not in every:
            near = sorted(every, key=lambda v: abs(_ordinal(v) - _ordinal(end)))[:3]
            raise EnvError(f"{package} {text} was never released (or was yanked, or has no "
                           f"file for Python {_python()} on this platform) on {asked()}; "
                           f"nearest: {', '.join(str(v) for v in sorted(near)) or 'none'}")
    pre = lo.is_prerelease or hi.is_prerelease
    return [str(v) for v in every if lo <= v <= hi and (pre or not v.is_prerelease)]


def _ordinal(version: Version) -> float:
    """A number that orders releases roughly by distance (for naming the nearest)."""
    parts = [*version.release, 0, 0, 0][:3]
    return parts[0] * 1e6 + parts[1] * 1e3 + parts[2]
