"""JSON files on disk: read strictly with errors located by line, written atomically.

:func:`loads` is :func:`json.loads` that refuses duplicate keys (the standard parser keeps
the last one silently, so a hand-merged baseline file would compare against whichever case
happened to come second); it parses with orjson, ~3x the standard library's speed, and
gives exactly what the standard library gives (:func:`_fast`). :func:`locate` finds the
line of a value by its path, for error messages only: the normal read never computes a
line, so reading stays one linear pass.

:func:`atomic_write` writes through a temporary file in the same directory and
``os.replace``; the temporary file is created with mode ``0o666`` so the umask decides the
permissions, as for any file the user writes. :func:`remove_leftovers` deletes the
temporaries an interrupted write (SIGKILL between create and replace) left behind.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import re
import secrets
from collections.abc import Iterable, Iterator, Mapping, Sequence
from json.decoder import scanstring  # type: ignore[attr-defined]
from pathlib import Path
from types import MappingProxyType
from typing import Any

import orjson

#: ``.<name>.<8 characters>.tmp``: the temporary file of an atomic write of ``<name>``
#: (the characters are those of :func:`tempfile.mkstemp`, which earlier versions used).
_TEMP_CHARS = "abcdefghijklmnopqrstuvwxyz0123456789_"
_TEMP_SUFFIX = ".tmp"
_WS = re.compile(r"[ \t\n\r]*")


class JsonFileError(ValueError):
    """Text that is not the JSON a file of pytest-accelperf holds: ``line``/``column`` are
    1-based, ``msg`` says what is wrong."""

    def __init__(self, msg: str, line: int, column: int) -> None:
        super().__init__(f"{line}:{column}: {msg}")
        self.msg, self.line, self.column = msg, line, column


class _DuplicateKey(Exception):
    pass


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        raise _DuplicateKey
    return obj


#: Digits as ``0``, to find a run of 19 of them (:func:`_long_integer`).
_DIGITS = str.maketrans("123456789", "000000000")
_LONG_RUN = "0" * 19


def _long_integer(text: str) -> bool:
    """Whether ``text`` may hold an integer of 19 digits or more (one beyond 64 bits has
    them): a run of 19 digits not after a decimal point (digits in a string count too:
    they only send the text to the standard parser)."""
    digits = text.translate(_DIGITS)
    pos = digits.find(_LONG_RUN)
    while pos >= 0:  # the first of a run (what precedes it is no digit)
        if digits[pos - 1:pos] != ".":
            return True
        end = pos + len(_LONG_RUN)
        while digits[end:end + 1] == "0":
            end += 1
        pos = digits.find(_LONG_RUN, end)
    return False


def _escaped_colon(text: str) -> bool:
    """Whether ``text`` may hold a colon written as an escape (``\\u003a``), which the
    parsed strings hold as ``:`` (an escaped backslash before ``u003a`` counts too: it
    only sends the text to the standard parser)."""
    pos = text.find("\\u003")
    while pos >= 0:
        if text[pos + 5:pos + 6] in ("a", "A"):
            return True
        pos = text.find("\\u003", pos + 5)
    return False


def _fast(text: str) -> object:
    """``text`` parsed by orjson, where that is what :func:`json.loads` gives and no object
    has a repeated key; else :data:`_NOT_FAST` (the standard parser then reads it, and
    names what is wrong).

    orjson keeps one value of a repeated key, as the standard parser does. It is found by
    counting colons: outside strings a colon ends a key, so the text holds one per key it
    writes plus those inside its strings, and orjson's compact dump of what it parsed one
    per key kept plus the same strings' (it escapes no colon). The counts differ exactly
    when a key was written twice, unless a string writes a colon as ``\\u003a`` (then the
    standard parser reads the file). Where orjson and the standard parser differ on what
    they accept, the text goes to the standard parser: orjson refuses NaN, Infinity, a
    number beyond a double and a lone surrogate, which it accepts; and it reads an integer
    beyond 64 bits as a float (:func:`_long_integer` sends the text there).
    """
    if _long_integer(text) or _escaped_colon(text):
        return _NOT_FAST
    try:
        value = orjson.loads(text)
        dumped = orjson.dumps(value)
    except (orjson.JSONDecodeError, orjson.JSONEncodeError):
        return _NOT_FAST
    return value if dumped.count(b":") == text.count(":") else _NOT_FAST


_NOT_FAST = object()


def loads(text: str) -> object:
    """``json.loads(text)`` (any JSON value: the caller checks its form), except that an
    object with a repeated key is a :class:`JsonFileError` at the repetition (as is a
    syntax error, at its position). The one JSON read of the files this package keeps
    (baselines, reports): :func:`_fast`, else the standard parser."""
    value = _fast(text)
    if value is not _NOT_FAST:
        return value
    try:
        return json.loads(text, object_pairs_hook=_pairs)
    except json.JSONDecodeError as exc:
        raise JsonFileError(exc.msg, exc.lineno, exc.colno) from None
    except _DuplicateKey:
        pass
    path, key, pos = _first_duplicate(text)
    where = f" in {field_path(path)}" if path else ""
    line, column = line_column(text, pos)
    raise JsonFileError(f"duplicate key {key!r}{where} (JSON keeps only one of them: keep "
                        f"the right one and delete the other)", line, column)


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """The cyclic garbage collector paused (and restored as it was) while a large document
    is parsed and validated.

    A parsed JSON document is a tree: the collector has nothing to free in it, yet it scans
    the young objects again and again as they are made (every few hundred allocations) and
    the whole heap now and then, which doubled the time to read a 10,000-case store.
    Reference counting still frees everything as usual.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def line_column(text: str, pos: int) -> tuple[int, int]:
    """1-based line and column of the character at ``pos``."""
    line = text.count("\n", 0, pos) + 1
    return line, pos - (text.rfind("\n", 0, pos) + 1) + 1


def field_path(path: Sequence[str | int]) -> str:
    """``("step_time", "samples", 2)`` -> ``step_time.samples[2]``."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


# -- positions, for error messages -------------------------------------------------------------
# A small walk over the text with the standard library's scanner: containers are entered
# by hand, every other value is skipped with ``scan_once``. Only error paths use it.
_SCAN = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


def _ws(text: str, pos: int) -> int:
    match = _WS.match(text, pos)
    return match.end() if match else pos


def _skip_value(text: str, pos: int) -> int:
    try:
        _, end = _SCAN(text, pos)
    except (StopIteration, ValueError):
        return len(text)
    return int(end)


def _members(text: str, pos: int) -> list[tuple[str | int, int, int]]:
    """``(key or index, position of the key or element, position of its value)`` of the
    object or array at ``pos``; empty for anything else."""
    out: list[tuple[str | int, int, int]] = []
    if pos >= len(text) or text[pos] not in "{[":
        return out
    is_object = text[pos] == "{"
    close = "}" if is_object else "]"
    pos = _ws(text, pos + 1)
    index = 0
    while pos < len(text) and text[pos] != close:
        start = pos
        key: str | int = index
        if is_object:
            if text[pos] != '"':
                break
            key, pos = scanstring(text, pos + 1)
            pos = _ws(text, pos)
            if text[pos:pos + 1] != ":":
                break
            pos = _ws(text, pos + 1)
        out.append((key, start, pos))
        pos = _ws(text, _skip_value(text, pos))
        if text[pos:pos + 1] == ",":
            pos = _ws(text, pos + 1)
        index += 1
    return out


def members(text: str, path: Sequence[str | int] = ()) -> dict[str | int, int]:
    """``{key: position of its value}`` of the object (or array) at ``path``: one pass, so
    that the errors of many members of one object are located in linear time."""
    pos = position(text, path, value=True)
    return {key: value for key, _, value in _members(text, pos)}


def position(text: str, path: Sequence[str | int], *, start: int | None = None,
             value: bool = False) -> int:
    """The position of ``path`` in the JSON ``text``: of the key (the element, for an array)
    of its last part, or of its value with ``value``; as deep as the path exists. Walking
    starts at the value at ``start`` (default: the document)."""
    pos = _ws(text, 0) if start is None else start
    for depth, part in enumerate(path, 1):
        for key, key_pos, value_pos in _members(text, pos):
            if key == part:
                pos = value_pos
                if not value and depth == len(path):
                    return key_pos
                break
        else:
            return pos
    return pos


def locate(text: str, path: Sequence[str | int], *, start: int | None = None) -> int:
    """The 1-based line of :func:`position`."""
    return line_column(text, position(text, path, start=start))[0]


def lines_of(text: str, positions: Iterable[int]) -> dict[int, int]:
    """``{position: 1-based line}``, counted in one pass over ``text`` (many errors of one
    file cost no more than one)."""
    out: dict[int, int] = {}
    line, done = 1, 0
    for pos in sorted(set(positions)):
        line += text.count("\n", done, pos)
        out[pos] = line
        done = pos
    return out


def _first_duplicate(text: str) -> tuple[list[str | int], str, int]:
    """``(path of the object, key, position of its second occurrence)`` of the first
    repeated key, in document order."""
    stack: list[tuple[list[str | int], int]] = [([], _ws(text, 0))]
    while stack:
        path, pos = stack.pop()
        seen: set[str] = set()
        children = []
        for key, key_pos, value_pos in _members(text, pos):
            if isinstance(key, str):
                if key in seen:
                    return path, key, key_pos
                seen.add(key)
            children.append(([*path, key], value_pos))
        stack.extend(reversed(children))
    return [], "", 0


# -- writing -----------------------------------------------------------------------------------
#: Arrays of scalars written a fixed number of elements per line, however short: a compact
#: numerics fingerprint's ``sketch``, 5 parameter leaves a line (line ``k`` of the array
#: holds leaves ``5k-4`` to ``5k``, so that a diff shows which leaves moved, at ~12 bytes
#: a leaf instead of the ~22 of a line each).
WRAPPED: Mapping[str, int] = MappingProxyType({"sketch": 5})


def _scalar(value: object) -> bool:
    return not isinstance(value, (list, dict))


def _number(value: object) -> bool:
    """A number, or null (a session's ``probe_median`` without a probe)."""
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool))


def _inline(value: object) -> bool:
    """Whether a container is written on one line: an array of scalars or of arrays of
    scalars (samples, loss checkpoints), or an object of numbers or nulls (a histogram of
    ops, the bytes per device, a session's medians)."""
    if isinstance(value, list):
        return all(_scalar(v) or (isinstance(v, list) and all(map(_scalar, v)))
                   for v in value)
    return isinstance(value, dict) and bool(value) and all(map(_number, value.values()))


def dumps(value: object) -> str:
    """``value`` as the store writes JSON: keys sorted, an indent of 2, and plain containers
    on one line (:func:`_inline`; the arrays named in :data:`WRAPPED` that many elements
    a line). What ``json.dumps(value, indent=2, sort_keys=True)`` writes, less the line per
    number: a step-time sample cost a line of ~20 bytes, now ~9. ``json.loads`` reads it
    back as the same value."""
    out: list[str] = []
    _write(value, "", None, out)
    return "".join(out)


def _write(value: object, indent: str, key: str | None, out: list[str]) -> None:
    per_line = WRAPPED.get(key or "", 0)
    if _scalar(value) or (not per_line and _inline(value)):
        out.append(json.dumps(value, separators=(", ", ": "), sort_keys=True))
        return
    if not value:
        out.append("[]" if isinstance(value, list) else "{}")
        return
    inner = indent + "  "
    if per_line and isinstance(value, list) and all(map(_scalar, value)):
        rows = (json.dumps(value[i:i + per_line], separators=(", ", ": "))[1:-1]
                for i in range(0, len(value), per_line))
        out.append("[\n" + inner + (",\n" + inner).join(rows) + "\n" + indent + "]")
        return
    if isinstance(value, list):
        out.append("[")
        for i, item in enumerate(value):
            out.append(("," if i else "") + "\n" + inner)
            _write(item, inner, None, out)
        out.append("\n" + indent + "]")
        return
    assert isinstance(value, dict)  # what is not a list or a dict is a scalar, written above
    out.append("{")
    for i, name in enumerate(sorted(value)):
        out.append(("," if i else "") + "\n" + inner + json.dumps(name) + ": ")
        _write(value[name], inner, name, out)
    out.append("\n" + indent + "}")


def _temp_pattern(path: Path) -> re.Pattern[str]:
    return re.compile(re.escape(f".{path.name}.") + f"[{_TEMP_CHARS}]{{8}}"
                      + re.escape(_TEMP_SUFFIX))


def atomic_write(path: Path, text: str, *, mode: int | None = None) -> None:
    """Write ``text`` to ``path`` so that readers see the old file or the new one, never half.

    The new file gets the permissions any file the user creates gets (``0o666`` less the
    umask), so a teammate's checkout or a CI artifact step can read it; or ``mode``, set
    before the rename (a report replacing one the user made private stays private
    throughout).
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    for _ in range(100):
        name = "".join(secrets.choice(_TEMP_CHARS) for _ in range(8))
        tmp = path.parent / f".{path.name}.{name}{_TEMP_SUFFIX}"
        try:
            fd = os.open(tmp, flags, 0o666)
        except FileExistsError:
            continue
        break
    else:  # pragma: no cover - 100 collisions of 37**8 names
        raise FileExistsError(f"no free temporary name beside {path}")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            if mode is not None:
                os.fchmod(fh.fileno(), mode)
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def _fsync_dir(directory: Path) -> None:
    """Make the rename durable too (where the platform can sync a directory)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def leftovers(path: Path) -> list[Path]:
    """Temporary files of interrupted :func:`atomic_write` calls for ``path`` (only that
    pattern: ``.<name>.<8 characters>.tmp`` beside it)."""
    pattern = _temp_pattern(path)
    try:
        names = os.listdir(path.parent)
    except OSError:
        return []
    return sorted(path.parent / n for n in names if pattern.fullmatch(n))


def remove_leftovers(path: Path) -> list[Path]:
    """Delete :func:`leftovers` of ``path``; the caller must hold the lock every writer of
    ``path`` takes, so that none of them is a write in progress. The files removed."""
    removed = []
    for tmp in leftovers(path):
        try:
            tmp.unlink()
        except FileNotFoundError:
            continue
        removed.append(tmp)
    return removed
