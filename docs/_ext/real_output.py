"""Keep the help texts pasted in the docs what the commands print today.

Some blocks of the docs are the real output of cheap commands (`pytest --help`'s accelperf
group, `accelperf ... --help`). Each sits between two markers in its page::

    <!-- real-output: pytest-help -->
    ```console
    $ pytest --help   # the accelperf group
    ...
    ```
    <!-- end real-output -->

As a Sphinx extension (docs/conf.py), this module runs the commands when the docs are built
and warns, which fails the strict build (`sphinx-build -W`), where a block differs from
their output now, or where a block is missing. As a script, it rewrites the blocks:

    python docs/_ext/real_output.py          # regenerate every block in place
    python docs/_ext/real_output.py --check  # exit 1 where a block is stale

It runs the commands with the Python that runs it, so the package must be installed there
(`pip install -e '.[docs]'`), and from the repository root (the rootdir of `pytest --help`).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

DOCS = Path(__file__).resolve().parent.parent
ROOT = DOCS.parent

END = "<!-- end real-output -->"
BLOCK = re.compile(
    r"(?P<head><!-- real-output: (?P<name>[a-z0-9-]+) -->\n)(?P<body>.*?)(?P<tail>" + END + ")",
    re.S,
)


def _run(*args: str) -> str:
    """Output of a command as a reader's 80-column terminal would show it (no colour)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS", "FORCE_COLOR")}
    env.update(COLUMNS="80", LINES="24", NO_COLOR="1", PYTHON_COLORS="0")
    proc = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} exited {proc.returncode}: {proc.stderr[-2000:]}")
    return proc.stdout


def _pytest_help_group() -> str:
    # --noconftest: tests/conftest.py imports jax, which a docs environment need not have.
    lines = _run("-m", "pytest", "--noconftest", "--help").splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("pytest-accelperf")),
                 None)
    if start is None:
        raise RuntimeError("pytest --help has no pytest-accelperf group: is the plugin installed?")
    end = next((i for i in range(start + 1, len(lines)) if not lines[i].strip()), len(lines))
    return "$ pytest --help   # the accelperf group\n" + "\n".join(lines[start:end]) + "\n"


CLI_COMMANDS = ("", "baselines show", "baselines check", "baselines diff", "baselines accept",
                "baselines prune", "baselines rewrite", "report", "history changes", "history publish", "bisect",
                "schema")


def _accelperf_help() -> str:
    parts = []
    for sub in CLI_COMMANDS:
        words = [*sub.split(), "--help"]
        out = _run("-m", "pytest_accelperf.cli", *words)
        parts.append(f"$ accelperf {' '.join(words)}\n{out.rstrip()}\n")
    return "\n".join(parts)


GENERATORS: dict[str, Callable[[], str]] = {
    "pytest-help": _pytest_help_group,
    "accelperf-help": _accelperf_help,
}


def _fenced(text: str) -> str:
    return f"```console\n{text}```\n"


def blocks(text: str) -> list[re.Match[str]]:
    return list(BLOCK.finditer(text))


def check(pages: list[Path] | None = None) -> list[str]:
    """Problems with the real-output blocks of the pages: stale, unknown or missing ones."""
    problems: list[str] = []
    seen: set[str] = set()
    cache: dict[str, str] = {}
    for page in pages or sorted(DOCS.glob("*.md")):
        text = page.read_text(encoding="utf-8")
        for match in blocks(text):
            name = match["name"]
            seen.add(name)
            where = f"{page.relative_to(ROOT)}: real-output block {name!r}"
            if name not in GENERATORS:
                problems.append(f"{where} names no known command ({', '.join(GENERATORS)})")
                continue
            if name not in cache:
                cache[name] = _fenced(GENERATORS[name]())
            if match["body"] != cache[name]:
                problems.append(f"{where} is not what the command prints now: regenerate it "
                                "with python docs/_ext/real_output.py and review the diff")
    if pages is None:
        problems += [f"no page has the real-output block {name!r}"
                     for name in GENERATORS if name not in seen]
    return problems


def regenerate() -> list[Path]:
    changed = []
    for page in sorted(DOCS.glob("*.md")):
        text = page.read_text(encoding="utf-8")
        new = BLOCK.sub(lambda m: m["head"] + _fenced(GENERATORS[m["name"]]()) + m["tail"], text)
        if new != text:
            page.write_text(new, encoding="utf-8")
            changed.append(page)
    return changed


def setup(app):  # type: ignore[no-untyped-def]  # Sphinx's entry point
    from sphinx.util import logging

    logger = logging.getLogger(__name__)

    def on_builder_inited(app):  # type: ignore[no-untyped-def]
        try:
            problems = check()
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
            problems = [f"could not run the commands whose output the docs show ({exc}); "
                        "install the package where Sphinx runs: pip install -e '.[docs]'"]
        for problem in problems:
            logger.warning(problem, type="real_output", subtype="stale")

    app.connect("builder-inited", on_builder_inited)
    return {"parallel_read_safe": True, "parallel_write_safe": True}


if __name__ == "__main__":
    if sys.argv[1:] == ["--check"]:
        found = check()
        print("\n".join(found) or "every real-output block is current")
        sys.exit(1 if found else 0)
    if sys.argv[1:]:
        sys.exit(__doc__)
    for page in regenerate():
        print(f"regenerated {page.relative_to(ROOT)}")
