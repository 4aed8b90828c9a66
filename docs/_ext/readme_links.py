"""The README's links into docs/ must lead somewhere.

The README is not a page of the site, so Sphinx does not check its links. This extension
does, when the docs are built: every relative link of README.md must name a file that exists,
and a link to `docs/PAGE.md#anchor` a heading of that page (the anchor as GitHub and MyST
derive it from the heading's text, `myst_heading_anchors` levels deep). A broken one is a
warning, which fails the strict build (`sphinx-build -W`).
"""

from __future__ import annotations

import re
from pathlib import Path

DOCS = Path(__file__).resolve().parent.parent
ROOT = DOCS.parent
README = ROOT / "README.md"

LINK = re.compile(r"\]\((?P<target>[^)\s]+)\)")
HEADING = re.compile(r"^(?P<level>#{1,6}) (?P<text>.+?)\s*#*\s*$")


def slug(heading: str) -> str:
    """The anchor of a heading, as GitHub and MyST's default slugify derive it."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path, depth: int) -> set[str]:
    found: set[str] = set()
    fenced = False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
            continue
        match = HEADING.match(line)
        if match and not fenced and len(match["level"]) <= depth:
            found.add(slug(match["text"]))
    return found


def broken_links(depth: int = 3) -> list[str]:
    problems = []
    text = README.read_text(encoding="utf-8")
    for number, line in enumerate(text.splitlines(), start=1):
        for match in LINK.finditer(line):
            target = match["target"]
            if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
                continue  # a URL, or an anchor of the README itself (GitHub checks those)
            path, _, anchor = target.partition("#")
            where = f"README.md:{number}: link {target!r}"
            if not (ROOT / path).exists():
                problems.append(f"{where}: {path} does not exist")
            elif anchor and path.endswith(".md") and anchor not in anchors(ROOT / path, depth):
                problems.append(f"{where}: {path} has no heading with that anchor")
    return problems


def setup(app):  # type: ignore[no-untyped-def]  # Sphinx's entry point
    from sphinx.util import logging

    logger = logging.getLogger(__name__)

    def on_builder_inited(app):  # type: ignore[no-untyped-def]
        for problem in broken_links(app.config.myst_heading_anchors or 0):
            logger.warning(problem, type="readme_links", subtype="broken")

    app.connect("builder-inited", on_builder_inited)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
