"""The plotting library's JavaScript: Vega, Vega-Lite and vega-embed, as one classic script.

The HTML report and the published history draw their plots with Vega-Lite
(:mod:`pytest_accelperf.report.charts` writes the specifications; the browser draws them).
The JavaScript comes from `vl-convert <https://github.com/vega/vl-convert>`_ (the Vega
project's own package, which Altair uses for offline HTML): ``javascript_bundle()`` builds
vega, vega-lite and vega-embed into one script from the copies compiled into the package,
offline. Never from a CDN: runners and readers may be offline.

Bundling takes seconds (2.4 s on a quiet 2-core machine, 6.6 s under load), so the bundle is
kept in ``$XDG_CACHE_HOME/accelperf/vega/vl-convert-<version>.js`` (``~/.cache`` without
it), one file per vl-convert version; a cache that cannot be written is skipped (the bundle
is built again next time).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
from pathlib import Path

from pytest_accelperf.errors import UserError

INSTALL = "pip install 'pytest-accelperf[report]'"
#: What the bundle runs: the libraries made globals, for classic scripts (vl-convert's
#: default, said here).
_GLOBALS = "window.vegaEmbed = vegaEmbed; window.vegaLite = vegaLite; window.vega = vega;"


class ReportDependencyError(UserError, RuntimeError):
    """The plotting library is missing; the message says what to install."""


def require_vega() -> None:
    """A :class:`ReportDependencyError` naming the install line where vl-convert is missing."""
    if importlib.util.find_spec("vl_convert") is None:
        raise ReportDependencyError(f"the plots are drawn by Vega-Lite, whose JavaScript comes "
                                    f"from vl-convert-python, which is not installed: "
                                    f"{INSTALL}")


def cache_dir() -> Path:
    """Where bundles are kept (see the module)."""
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "accelperf" / "vega"


@functools.cache
def vega_js() -> str:
    """The bundle (a classic script that sets ``window.vega``, ``window.vegaLite`` and
    ``window.vegaEmbed``)."""
    require_vega()
    import vl_convert

    version = str(getattr(vl_convert, "__version__", "unknown"))
    snippet = hashlib.sha1(_GLOBALS.encode()).hexdigest()[:8]
    path = cache_dir() / f"vl-convert-{version}-{snippet}.js"
    try:
        text = path.read_text(encoding="utf-8")
        if text:  # written atomically: whole, or not there
            return text
    except OSError:
        pass
    text = str(vl_convert.javascript_bundle(_GLOBALS))
    try:
        from pytest_accelperf.store.jsonfile import atomic_write

        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, text)
    except OSError:
        pass
    return text


def versions() -> str:
    """``vega 6.2.0, vega-lite 6.x, vega-embed 7.0.2``: what the bundle holds."""
    require_vega()
    import vl_convert

    lite = vl_convert.get_vegalite_versions()
    return (f"vega {vl_convert.get_vega_version()}, vega-lite {lite[-1] if lite else '?'}, "
            f"vega-embed {vl_convert.get_vega_embed_version()}")
