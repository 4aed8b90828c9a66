"""A package's released versions in a range, from the package index's JSON API
(``https://pypi.org/pypi/<name>/json``; ``$ACCELPERF_INDEX_JSON`` names another, e.g. a
mirror or a ``file://`` folder of ``<name>/json`` files): what a bisection over releases
walks. Yanked releases and releases without files are left out; pre-releases too, unless
an end of the range is one.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version
from pydantic import BaseModel, ConfigDict, ValidationError

from pytest_accelperf.envs import EnvError

#: The index's JSON API; ``{name}`` is the package's normalized name.
INDEX_JSON_ENV = "ACCELPERF_INDEX_JSON"
DEFAULT_INDEX_JSON = "https://pypi.org/pypi/{name}/json"
#: Seconds the index may take to answer.
INDEX_TIMEOUT_S = 60.0


def _version(package: str, text: str) -> Version:
    try:
        return Version(text)
    except InvalidVersion:
        raise EnvError(f"{package} {text!r} is not a version (e.g. 0.8.3)") from None


class IndexFile(BaseModel):
    """A file of a release in the index's JSON: only whether it was yanked is read."""

    model_config = ConfigDict(extra="ignore")

    yanked: bool | None = False


class IndexAnswer(BaseModel):
    """The index's JSON for a package (PyPI's JSON API): only its releases are read."""

    model_config = ConfigDict(extra="ignore")

    releases: dict[str, list[IndexFile]] | None = None


def _fetch(package: str) -> IndexAnswer:
    """The index's JSON for ``package``; an :class:`EnvError` for an unknown package or an
    index that cannot be reached."""
    url = os.environ.get(INDEX_JSON_ENV, DEFAULT_INDEX_JSON).format(
        name=canonicalize_name(package))
    try:
        with urllib.request.urlopen(url, timeout=INDEX_TIMEOUT_S) as reply:
            data = IndexAnswer.model_validate(json.loads(reply.read()))
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            raise EnvError(f"{package}: no such package on the index ({url})") from None
        raise EnvError(f"{package}: the index answered {exc.code} {exc.reason} ({url})"
                       ) from None
    except urllib.error.URLError as exc:
        reason = exc.reason.strerror if isinstance(exc.reason, OSError) else exc.reason
        if isinstance(exc.reason, FileNotFoundError):
            raise EnvError(f"{package}: no such package on the index ({url})") from None
        raise EnvError(f"{package}: cannot reach the index ({url}): {reason}; is there a "
                       f"network?") from None
    except ValidationError as exc:
        raise EnvError(f"{package}: cannot read the index's answer ({url}): "
                       f"{exc.errors()[0]['msg']}") from None
    except (OSError, ValueError) as exc:
        raise EnvError(f"{package}: cannot read the index's answer ({url}): {exc}") from None
    return data


def released(package: str) -> list[Version]:
    """Every release of ``package`` on the index with files that are not all yanked,
    oldest first."""
    data = _fetch(package)
    out = []
    for text, files in (data.releases or {}).items():
        try:
            version = Version(text)
        except InvalidVersion:
            continue  # a legacy version string pip would not install either
        if files and not all(f.yanked for f in files):
            out.append(version)
    return sorted(out)


def list_releases(package: str, low: str, high: str) -> list[str]:
    """The releases of ``package`` from ``low`` to ``high`` (both included, both must be
    releases), oldest first: ``list_releases("jax", "0.8.3", "0.10.2")``. An
    :class:`EnvError` of one line for a backwards range, a version that was never
    released, an unknown package or no network."""
    lo, hi = _version(package, low), _version(package, high)
    if lo > hi:
        raise EnvError(f"{package} {low}..{high}: the range is backwards (the older release "
                       f"first: {high} {low})")
    every = released(package)
    for end, text in ((lo, low), (hi, high)):
        if end not in every:
            near = sorted(every, key=lambda v: abs(_ordinal(v) - _ordinal(end)))[:3]
            raise EnvError(f"{package} {text} was never released (or was yanked); nearest: "
                           f"{', '.join(str(v) for v in sorted(near)) or 'none'}")
    pre = lo.is_prerelease or hi.is_prerelease
    return [str(v) for v in every if lo <= v <= hi and (pre or not v.is_prerelease)]


def _ordinal(version: Version) -> float:
    """A number that orders releases roughly by distance (for naming the nearest)."""
    parts = [*version.release, 0, 0, 0][:3]
    return parts[0] * 1e6 + parts[1] * 1e3 + parts[2]
