"""Sphinx configuration of the pytest-accelperf documentation (MyST markdown pages).

Build it strictly, as CI does (a broken cross-reference, a missing page, a page outside
every toctree, a stale pasted help text or a broken link of the README fails the build):

    pip install -e '.[docs]'
    sphinx-build -W --keep-going -n -b html docs docs/_build/html
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent / "_ext"))

project = "pytest-accelperf"
author = "pytest-accelperf contributors"
copyright = "2026, pytest-accelperf contributors"

# Our own checks (docs/_ext/): real_output, the pasted help texts must be what the commands
# print now (it runs them, so the package must be installed where Sphinx runs);
# readme_links, every link of README.md into docs/ must lead to a page and heading.
extensions = ["myst_parser", "real_output", "readme_links"]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "_ext"]

# Headings down to ### get GitHub-style anchors, so [text](page.md#some-heading) resolves and
# a link to a heading that does not exist is a warning (an error under -W).
myst_heading_anchors = 3

# Every reference must resolve (-n); the pages only reference each other.
nitpicky = True

# A fence without a language (pasted terminal output) is shown as written, no lexer guessing.
highlight_language = "none"
# Real output pasted in ```json and ```xml fences is often abridged ("{...}", "..."), which
# is not valid JSON or XML: Pygments then highlights it in relaxed mode, which is what we
# want, and this warning about it would fail the strict build. Nothing else is suppressed.
suppress_warnings = ["misc.highlighting_failure"]

html_theme = "alabaster"
html_title = "pytest-accelperf"
html_theme_options = {"description": "Performance regression gates for ML training"}
