"""The published history and the HTML report, loaded in a real browser: headless Chromium
(Debian's package; CI installs it), driven over the DevTools protocol
(pytest_accelperf/report/browser.py). Each page fails on any console error, any plot that
drew nothing, any plot whose points show no hover text.

Screenshots are kept in ``$ACCELPERF_ARTIFACTS/browser/`` where that is set (CI can keep
the folder as an artifact), else in the test's tmp dir (``pytest --basetemp`` keeps it
where you choose).
"""

from __future__ import annotations

import functools
import http.server
import os
import shutil
import socketserver
import threading
from pathlib import Path

import pytest

from pytest_accelperf.report.browser import INSTALL, Page, chromium, load_page
from pytest_accelperf.report.history import append_history, read_history
from pytest_accelperf.report.html import html_report
from unit.report.test_reports import synthetic_report
from unit.report.test_site import write_history

pytest.importorskip("vl_convert")  # the plotting library's JavaScript
pytest.importorskip("websocket")  # the DevTools protocol (test extra: websocket-client)
pytestmark = [pytest.mark.skipif(chromium() is None,
                                 reason=f"headless Chromium is not installed: {INSTALL}"),
              pytest.mark.slow]  # a browser started per page: 24 s for the four at load 5

CHOOSE = ("(async () => {{ const s = document.getElementById('f-{what}');"
          " s.value = s.options[{option}].value; await window.accelperf.applyFilters(); }})()")


def _shots(tmp_path: Path) -> Path:
    where = os.environ.get("ACCELPERF_ARTIFACTS")
    return Path(where) / "browser" if where else tmp_path / "screenshots"


def _clean(page: Page, name: str) -> None:
    """The page loaded as a reader would want it: no error, every plot drawn, each plot's
    points with hover text."""
    assert page.errors == [], f"{name}: console errors: {page.errors}"
    assert page.state == "drawn", f"{name}: the page did not finish drawing"
    assert page.empty == [], f"{name}: plots that drew nothing: {page.empty}"
    silent = [c["title"] for c in page.charts if not page.hovers.get(c["spec"])]
    assert silent == [], f"{name}: plots whose points show no hover text: {silent}"
    assert page.screenshot is not None and page.screenshot.stat().st_size > 20_000


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from pytest_accelperf.report.site import publish

    root = tmp_path_factory.mktemp("site")
    write_history(root / "hist")
    publish([root / "hist"], root / "site")
    return root / "site"


def test_the_history_site_draws_every_plot_with_hover_text(site: Path, tmp_path: Path) -> None:
    binary = chromium()
    assert binary is not None
    shots = _shots(tmp_path)
    index = load_page(binary, site / "index.html", tmp_path / "profile",
                      screenshot=shots / "history-index.png")
    _clean(index, "index.html")
    assert index.sparks == [1, 1, 1, 1] and index.rows == 4
    page = next((site / "cases").iterdir())
    case = load_page(binary, page, tmp_path / "profile", screenshot=shots / "history-case.png")
    _clean(case, page.name)
    assert len(case.charts) == 7
    step = case.hovers[0]  # the step-time plot: commit, value and interval
    for word in ("commit", "ms per step", "95% interval", "machine", "branch"):
        assert word in step


def test_the_site_served_over_http_draws_the_same(site: Path, tmp_path: Path) -> None:
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(site))
    with socketserver.TCPServer(("127.0.0.1", 0), handler) as server:
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            binary = chromium()
            assert binary is not None
            page = next((site / "cases").iterdir())
            url = f"http://127.0.0.1:{server.server_address[1]}/cases/{page.name}"
            served = load_page(binary, url, tmp_path / "profile", hover=1,
                               screenshot=_shots(tmp_path) / "history-served.png")
        finally:
            server.shutdown()
    assert served.errors == [] and served.state == "drawn"  # no favicon.ico asked for, too
    assert len(served.charts) == 7 and served.empty == [] and served.hovers[0]


def test_the_filters_hide_other_machines_and_branches(site: Path, tmp_path: Path) -> None:
    binary = chromium()
    assert binary is not None
    index = load_page(binary, site / "index.html", tmp_path / "profile", hover=0,
                      before=CHOOSE.format(what="machine", option=1))
    assert index.errors == [] and index.rows == 2  # the two cases on that machine
    page = next((site / "cases").iterdir())
    every = load_page(binary, page, tmp_path / "profile", hover=0)
    one = load_page(binary, page, tmp_path / "profile", hover=0,
                    before=CHOOSE.format(what="branch", option=1))
    assert one.errors == []
    assert one.charts[0]["marks"] < every.charts[0]["marks"]


def test_the_report_draws_every_plot_with_hover_text(tmp_path: Path) -> None:
    binary = chromium()
    assert binary is not None
    report = synthetic_report()
    for _ in range(3):
        append_history(tmp_path / "hist", report, cwd=tmp_path)
    path = tmp_path / "report.html"
    path.write_text(html_report(report, history=read_history(tmp_path / "hist")))
    page = load_page(binary, path, tmp_path / "profile",
                     screenshot=_shots(tmp_path) / "report.png")
    _clean(page, "report.html")
    assert len(page.charts) == 20
    assert "samples/s" in page.hovers[0] and "95% interval" in page.hovers[0]


def test_a_page_whose_library_did_not_load_fails_the_check(site: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(site, broken)
    (broken / "vega.js").unlink()
    binary = chromium()
    assert binary is not None
    page = load_page(binary, next((broken / "cases").iterdir()), tmp_path / "profile")
    assert any("vega.js" in e for e in page.errors), page.errors
    assert page.charts and all(c["marks"] == 0 for c in page.charts)
    assert page.hovers == {}
