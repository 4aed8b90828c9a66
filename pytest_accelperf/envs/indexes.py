"""The package indexes the user configured, where their installer reads them
(:func:`configured_indexes`): what :mod:`.releases` lists a package's releases from, so
that a bisection over releases walks those a build here can install.

uv's configuration first (it builds the environments: :mod:`.uv`), then pip's, then PyPI:

- uv: ``UV_DEFAULT_INDEX`` / ``UV_INDEX_URL``, ``UV_INDEX`` / ``UV_EXTRA_INDEX_URL``,
  ``UV_FIND_LINKS``, ``UV_NO_INDEX``; else the project's ``uv.toml`` or ``pyproject.toml``'s
  ``[tool.uv]`` (``index``, ``index-url``, ``extra-index-url``, ``find-links``,
  ``no-index``; an ``explicit`` index serves only the packages pinned to it, so it is left
  out), then the user's and the system's ``uv.toml`` (``$UV_CONFIG_FILE`` in their place);
- pip: ``PIP_INDEX_URL``, ``PIP_EXTRA_INDEX_URL``, ``PIP_FIND_LINKS``, ``PIP_NO_INDEX``
  over its configuration files in pip's own order (global: ``$XDG_CONFIG_DIRS/pip/pip.conf``
  and ``/etc/pip.conf``; user: ``~/.pip/pip.conf``, ``~/.config/pip/pip.conf``; site:
  ``sys.prefix/pip.conf``; then ``$PIP_CONFIG_FILE``), ``[global]`` then ``[install]``.

A configuration file that cannot be read is an :class:`~pytest_accelperf.envs.EnvError`
naming it.
"""

from __future__ import annotations

import configparser
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from pytest_accelperf.envs import EnvError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

#: The index an installer asks when nothing else is configured.
PYPI_SIMPLE = "https://pypi.org/simple"


@dataclass(frozen=True)
class Indexes:
    """Where a package's files are listed: Simple API roots (``.../simple``, PEP 503/691),
    and find-links locations (a folder or a page of links), with where they were set."""

    urls: tuple[str, ...]
    find_links: tuple[str, ...] = ()
    #: Where they were configured, in words (``pip: /etc/xdg/pip/pip.conf``).
    source: str = "the default"

    def describe(self) -> str:
        """``https://pypi.org/simple, file:///opt/pypi/simple (pip: /etc/pip.conf)``."""
        where = [*self.urls, *self.find_links] or ["no index"]
        return f"{', '.join(where)} ({self.source})"


class UvIndex(BaseModel):
    """One ``[[tool.uv.index]]`` (or ``[[index]]`` of ``uv.toml``)."""

    model_config = ConfigDict(extra="ignore")

    url: str
    default: bool = False
    explicit: bool = False


class UvSettings(BaseModel):
    """The index settings of ``[tool.uv]`` or ``uv.toml`` (the rest is not read)."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    index: list[UvIndex] = Field(default_factory=list)
    index_url: str | None = Field(default=None, alias="index-url")
    extra_index_url: list[str] = Field(default_factory=list, alias="extra-index-url")
    find_links: list[str] = Field(default_factory=list, alias="find-links")
    no_index: bool = Field(default=False, alias="no-index")

    def indexes(self, source: str) -> Indexes | None:
        """These settings' indexes, or None where they set none."""
        if not (self.index or self.index_url or self.extra_index_url or self.find_links
                or self.no_index):
            return None
        default = [i.url for i in self.index if i.default] or (
            [self.index_url] if self.index_url else [PYPI_SIMPLE])
        # uv asks ``index`` entries, then the extra indexes, then the default
        first = [i.url for i in self.index if not i.default and not i.explicit]
        urls = [] if self.no_index else [*first, *self.extra_index_url, *default]
        return Indexes(tuple(dict.fromkeys(u.rstrip("/") for u in urls)),
                       tuple(self.find_links), source)


def _split(text: str, commas: bool = False) -> list[str]:
    return (text.replace(",", " ") if commas else text).split()


def _truthy(text: str | None) -> bool:
    return (text or "").strip().lower() in ("1", "true", "yes", "on")


def _uv_env(environ: Mapping[str, str]) -> Indexes | None:
    default = environ.get("UV_DEFAULT_INDEX") or environ.get("UV_INDEX_URL")
    extra = [u.split("=", 1)[-1] if "=" in u.split("://", 1)[0] else u
             for u in _split(environ.get("UV_INDEX", ""))]
    extra += _split(environ.get("UV_EXTRA_INDEX_URL", ""))
    links = _split(environ.get("UV_FIND_LINKS", ""), commas=True)
    if not (default or extra or links or _truthy(environ.get("UV_NO_INDEX"))):
        return None
    names = [n for n in ("UV_DEFAULT_INDEX", "UV_INDEX_URL", "UV_INDEX", "UV_EXTRA_INDEX_URL",
                         "UV_FIND_LINKS", "UV_NO_INDEX") if environ.get(n)]
    settings = UvSettings.model_validate({
        "index": [{"url": default, "default": True}] if default else [],
        "extra-index-url": extra, "find-links": links,
        "no-index": _truthy(environ.get("UV_NO_INDEX"))})
    return settings.indexes(f"uv: {', '.join(names)}")


def _read_toml(path: Path) -> dict[str, object]:
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise EnvError(f"{path}: cannot read it for the package index: {exc}") from None


def _uv_file(path: Path, table: str | None) -> Indexes | None:
    """The indexes of a ``uv.toml`` (``table`` None) or of ``[tool.uv]`` of a
    ``pyproject.toml`` (``table="tool.uv"``)."""
    data: object = _read_toml(path)
    for key in (table.split(".") if table else []):
        data = data.get(key) if isinstance(data, dict) else None
    if data is None:
        return None
    try:
        settings = UvSettings.model_validate(data)
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(p) for p in error["loc"])
        raise EnvError(f"{path}: {f'[{table}] ' if table else ''}{where}: {error['msg']}"
                       ) from None
    return settings.indexes(f"uv: {path}")


def _project(start: Path) -> Path | None:
    """The nearest folder at or above ``start`` with a ``pyproject.toml`` or ``uv.toml``:
    the project uv would find."""
    for folder in (start, *start.parents):
        if (folder / "uv.toml").is_file() or (folder / "pyproject.toml").is_file():
            return folder
    return None


def uv_config_files(environ: Mapping[str, str]) -> list[Path]:
    """The user's and the system's ``uv.toml``, the user's first (``$UV_CONFIG_FILE`` in
    their place)."""
    if environ.get("UV_CONFIG_FILE"):
        return [Path(environ["UV_CONFIG_FILE"])]
    user = Path(environ.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "uv" / "uv.toml"
    dirs = (environ.get("XDG_CONFIG_DIRS") or "/etc/xdg").split(os.pathsep)
    return [user, *(Path(d) / "uv" / "uv.toml" for d in dirs), Path("/etc/uv/uv.toml")]


def uv_indexes(environ: Mapping[str, str], cwd: Path) -> Indexes | None:
    """The indexes uv's own configuration names, or None where it names none."""
    found = _uv_env(environ)
    if found is not None:
        return found
    if _truthy(environ.get("UV_NO_CONFIG")):
        return None
    project = _project(cwd)
    if project is not None:
        if (project / "uv.toml").is_file():
            found = _uv_file(project / "uv.toml", None)
        elif (project / "pyproject.toml").is_file():
            found = _uv_file(project / "pyproject.toml", "tool.uv")
        if found is not None:
            return found
    for path in uv_config_files(environ):
        if path.is_file():
            found = _uv_file(path, None)
            if found is not None:
                return found
    return None


def pip_config_files(environ: Mapping[str, str]) -> list[Path]:
    """pip's configuration files in the order it reads them (a later one overrides an
    earlier one): global, user, site, then ``$PIP_CONFIG_FILE``; none where that is
    ``os.devnull``."""
    given = environ.get("PIP_CONFIG_FILE")
    if given == os.devnull:
        return []
    dirs = (environ.get("XDG_CONFIG_DIRS") or "/etc/xdg").split(os.pathsep)
    home = Path(environ.get("HOME") or Path.home())
    user = [home / ".pip" / "pip.conf",
            Path(environ.get("XDG_CONFIG_HOME") or home / ".config") / "pip" / "pip.conf"]
    files = [*(Path(d) / "pip" / "pip.conf" for d in dirs), Path("/etc/pip.conf")]
    if not (given and Path(given).exists()):
        files += user
    files.append(Path(sys.prefix) / "pip.conf")
    return [*files, *([Path(given)] if given else [])]


def pip_indexes(environ: Mapping[str, str], files: Sequence[Path] | None = None
                ) -> Indexes | None:
    """The indexes pip's environment variables and configuration files name, or None where
    they name none (pip then asks PyPI)."""
    values: dict[str, tuple[str, str]] = {}  # key: (value, where)
    for path in pip_config_files(environ) if files is None else files:
        if not path.is_file():
            continue
        parser = configparser.RawConfigParser()
        try:
            parser.read(path, encoding="utf-8")
        except (configparser.Error, OSError, UnicodeDecodeError) as exc:
            raise EnvError(f"{path}: cannot read it for the package index: "
                           f"{' '.join(str(exc).split())}") from None
        for section in ("global", "install"):
            if parser.has_section(section):
                for key, value in parser.items(section):
                    values[key.replace("_", "-")] = (value, str(path))
    for key in ("index-url", "extra-index-url", "find-links", "no-index"):
        env = f"PIP_{key.upper().replace('-', '_')}"
        if environ.get(env):
            values[key] = (environ[env], env)
    wanted = ("index-url", "extra-index-url", "find-links", "no-index")
    if not any(k in values for k in wanted):
        return None
    index = values.get("index-url", (PYPI_SIMPLE, ""))[0].strip()
    extra = _split(values.get("extra-index-url", ("", ""))[0])
    urls = [] if _truthy(values.get("no-index", ("", ""))[0]) else [index, *extra]
    where = ", ".join(dict.fromkeys(w for k, (_, w) in values.items() if k in wanted and w))
    return Indexes(tuple(dict.fromkeys(u.rstrip("/") for u in urls)),
                   tuple(_split(values.get("find-links", ("", ""))[0])), f"pip: {where}")


def configured_indexes(environ: Mapping[str, str] | None = None, cwd: Path | None = None
                       ) -> Indexes:
    """The indexes to list releases from: uv's configuration, else pip's, else PyPI."""
    environ = os.environ if environ is None else environ
    cwd = Path.cwd() if cwd is None else cwd
    return (uv_indexes(environ, cwd) or pip_indexes(environ)
            or Indexes((PYPI_SIMPLE,), (), "the default: no uv or pip configuration names one"))
