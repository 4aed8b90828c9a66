"""Where in the user's code something happened, keyed by the code rather than its line: a
host sync's site (``host_sync_sites``) and a graph break's (``break_reasons``).

A site is the file, the function and the source text of the line, stripped of its
indentation and of a trailing comment::

    train.py in build.train_step: logged = loss.item()

so a line that only moved (a comment inserted above it, a function added before it) is
the same site, and a program record of unchanged code is the same record. The function is
the innermost ``def`` around the line, named with the classes and functions around it
(``GPT.forward``, ``build.train_step``; a comprehension or lambda inside it adds its own
name: ``step.<listcomp>``). The same text twice in one function is told apart by its
order there: the second is ``... (occurrence 2)``. The path is relative to the working
directory when under it, else to the ``site-packages`` it is installed in
(``deepspeed/runtime/zero/utils.py``: the same on every machine).

Where the source cannot be read (code compiled from a string, a file gone), the site keeps
its line, in the form every site had before (``train.py:183 in step``): such a site is
*line-keyed* (:func:`is_line_keyed`), and so is every site of a baseline recorded before
this form. Sites are compared by their keys only where neither side has a line-keyed one;
otherwise both sides are summed per file (and, for host syncs, per op) and those sums are
compared (:func:`compare_counts`, :func:`new_reasons`), so an old baseline shows no
spurious move either.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import io
import linecache
import os
import re
import tokenize
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

#: A line-keyed site: ``path:line in function`` (``?`` for a line not known).
_LINE_KEYED = re.compile(r"^(?P<path>.+):(?:\d+|\?) in (?P<function>[^\s:]+)$")
#: A graph break's reason, ``text (site)``, whose site is line-keyed.
_REASON_BY_LINE = re.compile(
    r"^(?P<text>.*) \((?P<path>[^()]+):(?:\d+|\?) in (?P<function>[^\s:()]+)\)$", re.DOTALL)
#: The start of a code-keyed site in a reason: `` (path in function: ``.
_REASON_BY_CODE = re.compile(r" \((?P<path>[^()]+?) in (?P<function>[^\s:()]+): ")


def display_path(filename: str) -> str:
    """``filename`` relative to the working directory when under it, else to the
    ``site-packages`` (or ``dist-packages``) it is installed in, else as given."""
    path = filename
    with contextlib.suppress(ValueError):
        rel = os.path.relpath(path)
        if not rel.startswith(".."):
            path = rel
    for packages in ("site-packages", "dist-packages"):
        if f"{os.sep}{packages}{os.sep}" in path:
            path = path.rsplit(f"{os.sep}{packages}{os.sep}", 1)[1]
    return path


def code_text(line: str) -> str:
    """A source line as a site names it: stripped, without a trailing comment (a ``#``
    in a string is kept; a line Python cannot tokenize alone is only stripped)."""
    text = line.strip()
    if "#" not in text:
        return text
    with contextlib.suppress(tokenize.TokenError, SyntaxError):
        for token in tokenize.generate_tokens(io.StringIO(text).readline):
            if token.type == tokenize.COMMENT:
                return text[:token.start[1]].rstrip()
    return text


@dataclass(frozen=True)
class _Function:
    """A ``def`` of a file: its qualified name and the lines it spans."""

    name: str  #: the last part of ``qualname``: what a frame calls it
    qualname: str  #: ``GPT.forward``, ``build.train_step``
    first: int
    last: int


def _functions(tree: ast.AST) -> list[_Function]:
    out: list[_Function] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                qualname = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    first = min([child.lineno, *(d.lineno for d in child.decorator_list)])
                    out.append(_Function(child.name, qualname, first,
                                         child.end_lineno or child.lineno))
                visit(child, qualname + ".")
            else:
                visit(child, prefix)

    visit(tree, "")
    return out


@dataclass(frozen=True)
class _Source:
    """A file's lines and its functions (none where it does not parse)."""

    lines: tuple[str, ...]
    functions: tuple[_Function, ...]

    def function(self, lineno: int) -> _Function | None:
        """The innermost function around line ``lineno``."""
        around = [f for f in self.functions if f.first <= lineno <= f.last]
        return min(around, key=lambda f: f.last - f.first, default=None)


@functools.lru_cache(maxsize=64)
def _parsed(filename: str, lines: tuple[str, ...]) -> _Source:
    try:
        tree = ast.parse("".join(lines), filename)
    except (SyntaxError, ValueError):
        return _Source(lines, ())
    return _Source(lines, tuple(_functions(tree)))


def _source(filename: str) -> _Source | None:
    linecache.checkcache(filename)  # the file as it is now, not as first read
    lines = linecache.getlines(filename)
    return _parsed(filename, tuple(lines)) if lines else None


def code_site(filename: str, lineno: int | None, function: str) -> str:
    """The site of line ``lineno`` of ``filename``, run in the function a frame calls
    ``function``: ``path in qualname: text`` (see the module docstring), else the
    line-keyed ``path:line in function`` where the source cannot be read."""
    path = display_path(filename)
    source = _source(filename) if lineno else None
    if source is None or not lineno or lineno > len(source.lines):
        return f"{path}:{lineno if lineno else '?'} in {function}"
    text = code_text(source.lines[lineno - 1])
    if not text:
        return f"{path}:{lineno} in {function}"
    around = source.function(lineno)
    first, name = 1, function
    if around is not None:
        first = around.first
        if around.name == function:
            name = around.qualname
        elif function.startswith("<"):  # a comprehension, a lambda: inside the function
            name = f"{around.qualname}.{function}"
    occurrence = sum(1 for n in range(first, lineno)
                     if text in source.lines[n - 1] and code_text(source.lines[n - 1]) == text)
    tag = f" (occurrence {occurrence + 1})" if occurrence else ""
    return f"{path} in {name}: {text}{tag}"


def is_line_keyed(site: str) -> bool:
    """Whether a site (or a host sync's key, ``op at site``) names a line rather than the
    code: recorded before sites were keyed by the code, or where the source was not read.
    (``?``, no Python frame at all, is the same in both forms: not line-keyed.)"""
    where = site.split(" at ", 1)[1] if " at " in site else site
    return ": " not in where and _LINE_KEYED.match(where) is not None


def site_file(site: str) -> str:
    """The file of a site, code- or line-keyed (``?`` where none is known)."""
    line_keyed = _LINE_KEYED.match(site)
    if line_keyed and ": " not in site:
        return line_keyed.group("path")
    return site.split(" in ", 1)[0] if " in " in site else site


def _per_file(key: str) -> str:
    """A host sync's key (``op at site``) as ``op at file``."""
    kind, sep, site = key.partition(" at ")
    return f"{kind}{sep}{site_file(site)}" if sep else key


def compare_counts(baseline: Mapping[str, int], now: Mapping[str, int]
                   ) -> list[tuple[str, int, int]]:
    """``(site, baseline, now)`` for each host-sync site whose count differs, in order:
    by the sites' keys, or, where either side has a line-keyed site, by op and file."""
    if any(is_line_keyed(k) for k in (*baseline, *now)):
        baseline, now = _summed(baseline), _summed(now)
    return [(key, int(baseline.get(key, 0)), int(now.get(key, 0)))
            for key in sorted(set(baseline) | set(now))
            if int(baseline.get(key, 0)) != int(now.get(key, 0))]


def _summed(sites: Mapping[str, int]) -> dict[str, int]:
    out: dict[str, int] = {}
    for key, count in sites.items():
        out[_per_file(key)] = out.get(_per_file(key), 0) + int(count)
    return out


def _reason_per_file(reason: str) -> str:
    """``text (file)`` of a graph break's reason, ``text (site)``, either form."""
    by_line = _REASON_BY_LINE.match(reason)
    if by_line is not None:
        return f"{by_line['text']} ({by_line['path']})"
    by_code = _REASON_BY_CODE.search(reason)
    if by_code is not None:
        return f"{reason[:by_code.start()]} ({by_code['path']})"
    return reason


def new_reasons(baseline: Iterable[str], now: Iterable[str]) -> list[str]:
    """The reasons of ``now`` (``text (site)``, a graph break's) that ``baseline`` has not,
    by site, or by their text and file where either side has a line-keyed site."""
    old, new = [str(r) for r in baseline], [str(r) for r in now]
    if any(_REASON_BY_LINE.match(r) for r in (*old, *new)):
        known = {_reason_per_file(r) for r in old}
        return [r for r in new if _reason_per_file(r) not in known]
    return [r for r in new if r not in old]
