"""Releases listed through the index the user configured (envs.indexes, envs.releases):
uv's and pip's configuration, the Simple API in its JSON form from a local HTTP server
and in HTML from a ``file://`` folder, and only the releases with a file that installs on
this interpreter and platform. Nothing leaves the machine: every index is on 127.0.0.1 or
on disk, and the machine's own pip and uv configuration is hidden."""

from __future__ import annotations

import json
import os
import platform
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest
from packaging.tags import sys_tags

from pytest_accelperf.envs import EnvError
from pytest_accelperf.envs.indexes import PYPI_SIMPLE, configured_indexes
from pytest_accelperf.envs.releases import list_releases, released

HERE = next(iter(sys_tags()))  # a wheel tag this interpreter installs
THIS = f"{platform.python_version_tuple()[0]}.{platform.python_version_tuple()[1]}"
NEXT = f"3.{int(platform.python_version_tuple()[1]) + 1}"

#: jax's files as an index lists them: 0.9.x for this Python, 0.11.x only for the next
#: one (Requires-Python), 0.10.1 yanked, 0.10.3 a wheel for another platform only.
FILES = [
    {"filename": "jax-0.9.1-py3-none-any.whl", "requires-python": f">={THIS}"},
    {"filename": "jax-0.9.2.tar.gz", "requires-python": f">={THIS}"},
    {"filename": "jax-0.10.0-py3-none-any.whl", "requires-python": f">={THIS}"},
    {"filename": "jax-0.10.1-py3-none-any.whl", "requires-python": f">={THIS}",
     "yanked": "broken"},
    {"filename": "jax-0.10.3-cp27-cp27m-win32.whl"},
    {"filename": "jax-0.11.0-py3-none-any.whl", "requires-python": f">={NEXT}"},
    {"filename": "jax-0.11.2.tar.gz", "requires-python": f">={NEXT}"},
]


@pytest.fixture(autouse=True)
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No pip or uv configuration of the machine's, no JSON API override."""
    for name in list(os.environ):
        if name.startswith(("PIP_", "UV_")) or name in ("ACCELPERF_INDEX_JSON",):
            monkeypatch.delenv(name)
    home = tmp_path / "home"
    home.mkdir()
    for name, value in (("HOME", home), ("XDG_CONFIG_HOME", home / ".config"),
                        ("XDG_CONFIG_DIRS", tmp_path / "etc-xdg"),
                        ("PIP_CONFIG_FILE", os.devnull)):
        monkeypatch.setenv(name, str(value))
    monkeypatch.setenv("UV_CONFIG_FILE", str(tmp_path / "no-uv.toml"))
    monkeypatch.chdir(tmp_path)
    return tmp_path


class _Simple(BaseHTTPRequestHandler):
    """The Simple API of one package, ``jax``: JSON to whoever asks for it, else HTML."""

    asked: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        accept = self.headers.get("Accept", "")
        type(self).asked.append(accept)
        if self.path.rstrip("/") != "/simple/jax":
            self.send_error(404)
            return
        if "application/vnd.pypi.simple.v1+json" in accept:
            body = json.dumps({"meta": {"api-version": "1.1"}, "name": "jax",
                               "files": [{"url": f"../../f/{f['filename']}", "hashes": {},
                                          **f} for f in FILES]}).encode()
            kind = "application/vnd.pypi.simple.v1+json"
        else:
            body = b"".join(f'<a href="../../f/{f["filename"]}">x</a>'.encode()
                            for f in FILES)
            kind = "text/html"
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    """A Simple API on 127.0.0.1: its root URL."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Simple)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    _Simple.asked.clear()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/simple"
    httpd.shutdown()
    httpd.server_close()


def _static_index(root: Path, files: list[dict[str, str]]) -> str:
    """A PEP 503 index on disk (what ``pip.conf``'s ``file:///opt/pypi/simple`` is)."""
    page = root / "simple" / "jax"
    page.mkdir(parents=True)
    links = "".join(
        f'<a href="../../f/{f["filename"]}#sha256=0"'
        f'{" data-requires-python=" + chr(34) + f["requires-python"].replace(">", "&gt;") + chr(34) if "requires-python" in f else ""}'  # noqa: E501
        f'{" data-yanked" if "yanked" in f else ""}>{f["filename"]}</a>\n' for f in files)
    (page / "index.html").write_text(f"<!DOCTYPE html><html><body>{links}</body></html>")
    return f"file://{root}/simple"


# -- where the indexes are configured ------------------------------------------------------
def test_nothing_configured_is_pypi() -> None:
    assert configured_indexes().urls == (PYPI_SIMPLE,)


def test_pips_files_and_variables_name_the_indexes(isolated: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    conf = isolated / "pip.conf"
    conf.write_text("[global]\nindex-url = https://mirror.example/simple/\n"
                    "extra-index-url = file:///opt/pypi/simple\n  file:///opt/more/simple\n"
                    "find-links = /opt/wheels\n")
    monkeypatch.setenv("PIP_CONFIG_FILE", str(conf))
    found = configured_indexes()
    assert found.urls == ("https://mirror.example/simple", "file:///opt/pypi/simple",
                          "file:///opt/more/simple")
    assert found.find_links == ("/opt/wheels",) and str(conf) in found.source
    monkeypatch.setenv("PIP_INDEX_URL", "https://other.example/simple")
    assert configured_indexes().urls[0] == "https://other.example/simple"
    assert "PIP_INDEX_URL" in configured_indexes().source


def test_pips_global_file_is_read_where_pip_reads_it(isolated: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PIP_CONFIG_FILE")
    (isolated / "etc-xdg" / "pip").mkdir(parents=True)
    (isolated / "etc-xdg" / "pip" / "pip.conf").write_text(
        "[global]\nextra-index-url = file:///opt/pypi/simple\n")
    assert configured_indexes().urls == (PYPI_SIMPLE, "file:///opt/pypi/simple")


def test_uvs_variables_come_before_pips(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIP_INDEX_URL", "https://pip.example/simple")
    monkeypatch.setenv("UV_DEFAULT_INDEX", "https://uv.example/simple")
    monkeypatch.setenv("UV_INDEX", "internal=https://internal.example/simple")
    found = configured_indexes()
    assert found.urls == ("https://internal.example/simple", "https://uv.example/simple")
    assert found.source == "uv: UV_DEFAULT_INDEX, UV_INDEX"


def test_tool_uv_indexes_leave_out_the_explicit_ones(isolated: Path) -> None:
    (isolated / "pyproject.toml").write_text(
        '[project]\nname = "x"\n'
        '[[tool.uv.index]]\nname = "corp"\nurl = "https://corp.example/simple"\n'
        '[[tool.uv.index]]\nname = "torch"\nurl = "https://torch.example/cpu"\n'
        'explicit = true\n'
        '[[tool.uv.index]]\nname = "mirror"\nurl = "https://mirror.example/simple"\n'
        'default = true\n')
    found = configured_indexes()
    assert found.urls == ("https://corp.example/simple", "https://mirror.example/simple")
    assert found.source == f"uv: {isolated / 'pyproject.toml'}"


def test_a_configuration_that_cannot_be_read_is_one_line_naming_it(
        isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (isolated / "pyproject.toml").write_text('[tool.uv]\nindex = "https://x.example"\n')
    with pytest.raises(EnvError, match=rf"^{isolated / 'pyproject.toml'}: \[tool.uv\] index: "):
        configured_indexes()
    (isolated / "pyproject.toml").write_text('[tool.uv\n')
    with pytest.raises(EnvError, match=rf"^{isolated / 'pyproject.toml'}: cannot read it"):
        configured_indexes()
    (isolated / "pyproject.toml").unlink()
    conf = isolated / "pip.conf"
    conf.write_text("index-url = https://x.example\n")  # no section
    monkeypatch.setenv("PIP_CONFIG_FILE", str(conf))
    with pytest.raises(EnvError, match=rf"^{conf}: cannot read it for the package index"):
        configured_indexes()


# -- what the index lists ------------------------------------------------------------------
def test_the_simple_apis_json_lists_only_releases_installable_here(
        server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The issue's input: releases for a later Python (0.11.x), a yanked one and one for
    another platform are no releases here."""
    monkeypatch.setenv("UV_DEFAULT_INDEX", server)
    assert [str(v) for v in released("jax")] == ["0.9.1", "0.9.2", "0.10.0"]
    assert _Simple.asked[0].startswith("application/vnd.pypi.simple.v1+json")
    with pytest.raises(EnvError) as error:
        list_releases("jax", "9.9.9", "10.0.0")
    said = str(error.value)
    assert said.startswith("jax 9.9.9 was never released (or was yanked, or has no file for "
                           f"Python {platform.python_version()} on this platform) on {server} "
                           "(uv: UV_DEFAULT_INDEX); nearest: 0.9.1, 0.9.2, 0.10.0"), said
    with pytest.raises(EnvError, match=r"nearest: 0\.9\.1, 0\.9\.2, 0\.10\.0$"):
        list_releases("jax", "0.10.0", "0.11.2")


def test_a_static_html_index_on_disk_is_read_as_pip_reads_it(
        isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = _static_index(isolated, FILES)
    monkeypatch.setenv("PIP_INDEX_URL", url)
    assert list_releases("jax", "0.9.1", "0.10.0") == ["0.9.1", "0.9.2", "0.10.0"]


def test_indexes_and_find_links_are_listed_together(isolated: Path, server: str,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    wheels = isolated / "wheels"
    wheels.mkdir()
    (wheels / f"jax-0.10.2-{HERE}.whl").write_bytes(b"")
    (wheels / "torch-2.13.0-py3-none-any.whl").write_bytes(b"")
    monkeypatch.setenv("PIP_INDEX_URL", server)
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", _static_index(isolated, FILES[:1]))
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
    assert list_releases("jax", "0.9.1", "0.10.2") == ["0.9.1", "0.9.2", "0.10.0", "0.10.2"]


def test_a_dead_configured_index_is_one_line_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """The issue's input: UV_INDEX_URL at a dead address used to be passed over for PyPI."""
    monkeypatch.setenv("UV_INDEX_URL", "http://127.0.0.1:9/simple")  # nothing listens
    with pytest.raises(EnvError, match=r"^jax: cannot reach the index \(http://127.0.0.1:9/"
                                       r"simple/jax/, uv: UV_INDEX_URL\): .*is there a network"):
        list_releases("jax", "0.8.3", "0.10.2")


def test_a_package_on_no_configured_index_is_one_line(server: str,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UV_DEFAULT_INDEX", server)
    with pytest.raises(EnvError, match=rf"^nosuch: no such package on the index \({server} "):
        list_releases("nosuch", "1", "2")


def test_the_json_api_override_still_replaces_the_configuration(
        isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (isolated / "jax").mkdir()
    (isolated / "jax" / "json").write_text(json.dumps({"releases": {
        "0.9.0": [{"filename": "jax-0.9.0-py3-none-any.whl"}],
        "0.11.0": [{"filename": "jax-0.11.0-py3-none-any.whl", "requires_python": f">={NEXT}"}],
    }}))
    monkeypatch.setenv("UV_DEFAULT_INDEX", "http://127.0.0.1:9/simple")  # not asked
    monkeypatch.setenv("ACCELPERF_INDEX_JSON", f"file://{isolated}/{{name}}/json")
    assert [str(v) for v in released("jax")] == ["0.9.0"]
