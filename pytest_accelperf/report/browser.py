"""A page of the report or the published history, loaded in headless Chromium and checked.

The browser is the one installed on the machine (Debian's ``chromium``; ``apt-get install
chromium``), driven through the DevTools protocol over a WebSocket (``websocket-client``):
nothing is downloaded. :func:`load_page` opens a page, waits until its plots are drawn, and
returns what a reader would have met: every console error and uncaught exception (a
resource that did not load is one), each plot's count of drawn marks, the text hovering a
point of each plot shows (a real mouse move, through the protocol's input events), the time
to the load event and to the last plot drawn, and a screenshot.

Used by the browser tests (``tests/unit/report/test_browser.py``) and by
``benchmarks/site.py`` (the index's load time).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeAlias

INSTALL = "apt-get install chromium"

#: A message of the DevTools protocol, or a chart's description read from the page: JSON
#: whose shape is Chromium's (or Vega's) to define.
DevToolsJSON: TypeAlias = dict[str, Any]

#: What the page reports of its plots (run in the page once it is drawn).
_SURVEY = r"""
(() => {
  const charts = [...document.querySelectorAll("[data-spec]")].map((el) => {
    const data = [...el.querySelectorAll("g.mark-symbol path, g.mark-line path, "
      + "g.mark-area path, g.mark-rect path, g.mark-rule line")]
      .filter((m) => !m.closest(".role-axis, .role-legend, .role-title"));
    const title = el.querySelector(".role-title-text");
    return {spec: +el.dataset.spec, title: title ? title.textContent : "",
            marks: data.length, svg: el.querySelectorAll("svg").length};
  });
  const sparks = [...document.querySelectorAll("svg.spark")].map(
    (s) => s.querySelectorAll("path").length);
  const rows = [...document.querySelectorAll("tr[data-machine]")].filter(
    (tr) => tr.style.display !== "none").length;
  const nav = performance.getEntriesByType("navigation")[0];
  return {charts, sparks, rows, load_ms: nav ? nav.loadEventEnd : null,
          drawn_ms: window.accelperf && window.accelperf.drawnAt || null,
          errors: (window.accelperf && window.accelperf.errors) || [],
          state: document.documentElement.dataset.accelperf || null,
          height: document.documentElement.scrollHeight};
})()
"""

#: Where to hover over plot ``N``: the centre of one of its points or bars, scrolled into
#: view (viewport coordinates), or null.
_TARGET = r"""
((n) => {
  const el = document.querySelector(`[data-spec="${n}"]`);
  if (!el) return null;
  const hits = [...el.querySelectorAll("g.mark-symbol path, g.mark-rect path")]
    .filter((m) => !m.closest(".role-axis, .role-legend, .role-title"));
  const order = hits.map((m, k) => k).sort(
    (a, b) => Math.abs(a - hits.length / 2) - Math.abs(b - hits.length / 2));
  for (const k of order) {  // the one nearest the middle that is on top at its centre
    const m = hits[k];
    m.scrollIntoView({block: "center", inline: "center"});
    const r = m.getBoundingClientRect();
    const x = r.left + r.width / 2, y = r.top + r.height / 2;
    if (r.width > 0 && r.height > 0 && document.elementFromPoint(x, y) === m) return {x, y};
  }
  return null;
})
"""

_TOOLTIP = r"""
(() => {
  const t = document.getElementById("vg-tooltip-element");
  return t && t.classList.contains("visible") ? t.innerText : "";
})()
"""


def chromium() -> str | None:
    """The Chromium on the PATH (``chromium``, ``chromium-browser``, ``google-chrome``)."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


@dataclass
class Page:
    """What loading one page showed."""

    url: str
    errors: list[str] = field(default_factory=list)
    charts: list[DevToolsJSON] = field(default_factory=list)
    sparks: list[int] = field(default_factory=list)
    #: Rows of the index's table shown (not hidden by a filter).
    rows: int = 0
    hovers: dict[int, str] = field(default_factory=dict)
    load_ms: float | None = None
    drawn_ms: float | None = None
    state: str | None = None
    screenshot: Path | None = None

    @property
    def empty(self) -> list[DevToolsJSON]:
        """The plots that drew nothing."""
        return [c for c in self.charts if not c["marks"]]


class _Session:
    """One page target of a running Chromium, spoken to over its WebSocket."""

    def __init__(self, url: str) -> None:
        import websocket

        self.ws = websocket.create_connection(url, timeout=60, suppress_origin=True)
        self.next_id = 0
        self.events: list[DevToolsJSON] = []

    def call(self, method: str, **params: object) -> DevToolsJSON:
        self.next_id += 1
        ident = self.next_id
        self.ws.send(json.dumps({"id": ident, "method": method, "params": params}))
        while True:
            message = json.loads(self.ws.recv())
            if message.get("id") == ident:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                result: DevToolsJSON = message.get("result", {})
                return result
            self.events.append(message)

    def wait_event(self, method: str, timeout: float) -> None:
        end = time.monotonic() + timeout
        if any(e.get("method") == method for e in self.events):
            return
        while time.monotonic() < end:
            self.ws.settimeout(max(0.1, end - time.monotonic()))
            message = json.loads(self.ws.recv())
            self.events.append(message)
            if message.get("method") == method:
                return
        raise TimeoutError(method)

    def evaluate(self, expression: str, *, await_promise: bool = False) -> Any:  # noqa: ANN401 (a page's JSON)
        done = self.call("Runtime.evaluate", expression=expression, returnByValue=True,
                         awaitPromise=await_promise)
        if "exceptionDetails" in done:
            raise RuntimeError(f"page script failed: {done['exceptionDetails']}")
        return done.get("result", {}).get("value")

    def errors(self) -> list[str]:
        """Console errors, uncaught exceptions and failed loads among the events."""
        out: list[str] = []
        for e in self.events:
            method, params = e.get("method"), e.get("params", {})
            if method == "Runtime.consoleAPICalled" and params.get("type") in ("error",
                                                                                "assert"):
                out.append(" ".join(str(a.get("value", a.get("description", "")))
                                    for a in params.get("args", [])))
            elif method == "Runtime.exceptionThrown":
                details = params.get("exceptionDetails", {})
                out.append(str(details.get("exception", {}).get("description")
                               or details.get("text")))
            elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
                entry = params["entry"]
                out.append(f"{entry.get('text')} {entry.get('url', '')}".strip())
        return out

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.ws.close()


@contextlib.contextmanager
def _browser(binary: str, profile: Path, width: int, height: int) -> Iterator[int]:
    """A headless Chromium listening for the DevTools protocol; its port."""
    profile.mkdir(parents=True, exist_ok=True)
    (profile / "DevToolsActivePort").unlink(missing_ok=True)
    args = [binary, "--headless", "--disable-gpu", "--no-first-run", "--disable-sync",
            "--disable-background-networking", "--disable-component-update",
            "--disable-default-apps", "--mute-audio", "--hide-scrollbars",
            f"--window-size={width},{height}", "--remote-debugging-port=0",
            "--remote-allow-origins=*", f"--user-data-dir={profile}", "about:blank"]
    if os.geteuid() == 0:  # as root (CI's containers) Chromium's sandbox refuses to start
        args.insert(1, "--no-sandbox")
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        port_file = profile / "DevToolsActivePort"
        end = time.monotonic() + 60
        while not port_file.is_file() or not port_file.read_text().strip():
            if proc.poll() is not None or time.monotonic() > end:
                raise RuntimeError(f"{binary} did not start (exit status {proc.poll()})")
            time.sleep(0.05)
        yield int(port_file.read_text().split()[0])
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _page_socket(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=30) as r:
        targets = json.loads(r.read())
    for target in targets:
        if target.get("type") == "page":
            return str(target["webSocketDebuggerUrl"])
    raise RuntimeError("Chromium has no page to drive")


def load_page(binary: str, path: Path | str, profile: Path, *, screenshot: Path | None = None,
              hover: int | None = None, width: int = 1280, height: int = 900,
              timeout: float = 120.0, before: str | None = None) -> Page:
    """Open ``path`` (a file, or a URL) in headless ``binary``, wait until its plots are drawn, and
    return what it showed (see the module). ``hover``: how many plots to hover over (all
    with points or bars by default; 0 none); ``screenshot``: a PNG of the whole page;
    ``before``: a script run (and awaited) once the plots are drawn, before they are
    counted (a filter chosen, say)."""
    url = path if isinstance(path, str) else path.resolve().as_uri()
    page = Page(url)
    with _browser(binary, profile, width, height) as port:
        session = _Session(_page_socket(port))
        try:
            for domain in ("Page", "Runtime", "Log"):
                session.call(f"{domain}.enable")
            session.call("Page.navigate", url=url)
            session.wait_event("Page.loadEventFired", timeout)
            session.evaluate(
                "new Promise((ok) => { const t0 = Date.now(); (function poll() {"
                " const s = document.documentElement.dataset.accelperf;"
                " if (s || !document.querySelector('[data-spec]') && document.readyState"
                " === 'complete' || Date.now() - t0 > " + str(int(timeout * 1000)) + ")"
                " { window.accelperf = window.accelperf || {};"
                " window.accelperf.drawnAt = performance.now(); ok(); }"
                " else setTimeout(poll, 20); })(); })", await_promise=True)
            if before is not None:
                session.evaluate(before, await_promise=True)
            survey = session.evaluate(_SURVEY)
            page.charts, page.sparks = survey["charts"], survey["sparks"]
            page.rows = survey["rows"]
            page.load_ms, page.drawn_ms = survey["load_ms"], survey["drawn_ms"]
            page.state = survey["state"]
            page.errors += [f"accelperf: {e}" for e in survey["errors"]]
            wanted = [c["spec"] for c in page.charts]
            for n in wanted[:hover] if hover is not None else wanted:
                at = session.evaluate(f"{_TARGET}({n})")
                if at is None:
                    continue
                session.call("Input.dispatchMouseEvent", type="mouseMoved", x=at["x"],
                             y=at["y"])
                text = session.evaluate(
                    f"new Promise((ok) => requestAnimationFrame(() => ok({_TOOLTIP})))",
                    await_promise=True)
                page.hovers[n] = str(text or "")
                session.call("Input.dispatchMouseEvent", type="mouseMoved", x=0, y=0)
            if screenshot is not None:
                session.evaluate("window.scrollTo(0, 0)")
                shot = session.call("Page.captureScreenshot", format="png",
                                    captureBeyondViewport=True)
                screenshot.parent.mkdir(parents=True, exist_ok=True)
                screenshot.write_bytes(base64.b64decode(shot["data"]))
                page.screenshot = screenshot
            page.errors = session.errors() + page.errors
        finally:
            session.close()
    return page
