"""What every parser shares: the error that names file and line, and number parsing.

A parser reads text some other tool wrote and returns :class:`~pytest_accelperf.records.run.Run`
objects. It must never return a number it is not sure of: anything it does not recognize
where a number should be (a unit it does not know, a row cut short, steps out of order, a
log that ends before its summary) raises :class:`IngestError`, which says where
(``file:line``) and what to do.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from pytest_accelperf.errors import UserError
from pytest_accelperf.stats.units import UnitError, round_sig, to_base_unit

#: A decimal number as tools print it (no thousands separators). Each digit can be matched
#: one way only (``\d+(\.\d*)?``, not ``\d+\.?\d*``): a long run of digits that is no
#: number backtracks in linear time, not quadratic.
NUMBER = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?"
_QUANTITY = re.compile(rf"^({NUMBER})\s*(\S.*)?$")
#: The longest message an :class:`IngestError` shows: a log's line quoted in it may be
#: megabytes long (a file that is one huge line).
MAX_MESSAGE = 500


class IngestError(UserError, ValueError):
    """An outside log that cannot be read into a run, with where and why.

    ``str()`` is ``"path:line: message"`` (``line`` 0 when the problem is the file as a
    whole, e.g. a missing summary at its end), on one line and at most
    :data:`MAX_MESSAGE` characters of message, whatever the log's lines quoted in it.
    """

    def __init__(self, source: str, line: int, message: str) -> None:
        message = " ".join(message.splitlines())
        if len(message) > MAX_MESSAGE:
            message = f"{message[:MAX_MESSAGE - 60]} ... ({len(message)} characters)"
        self.source, self.line, self.reason = source, line, message
        where = f"{source}:{line}" if line else source
        super().__init__(f"{where}: {message}")


def clip(text: str, limit: int = 80) -> str:
    """``repr(text)``, cut at ``limit`` characters (``'aaaa'...``): how a message quotes a
    log's text, which may be one line of megabytes."""
    return repr(text) if len(text) <= limit else f"{text[:limit]!r}..."


def finite(value: float, source: str, line: int, what: str) -> float:
    """``value`` when it is a finite number; ``inf`` or ``nan`` (a number too large to be
    one, ``1e999``) is an :class:`IngestError` naming ``what``."""
    if not math.isfinite(value):
        raise IngestError(source, line, f"{what} is {value}: not a finite number")
    return value


@dataclass(frozen=True)
class Quantity:
    """A parsed value in its dimension's base unit (bytes, seconds, flops, percent)."""

    value: float
    dimension: str  # "count" for a bare number


def parse_quantity(text: str, source: str, line: int, what: str) -> Quantity:
    """``"4.334 GiB"`` -> 4.334 * 2**30 bytes; ``"488839"`` -> a count.

    Raises :class:`IngestError` naming ``what`` for anything else.
    """
    match = _QUANTITY.match(text.strip())
    if match is None:
        raise IngestError(source, line, f"{what}: {clip(text.strip())} is not a number with a "
                                        f"unit")
    number = finite(float(match.group(1)), source, line, what)
    unit = (match.group(2) or "").strip()
    if not unit:
        return Quantity(number, "count")
    try:
        value, dimension = to_base_unit(number, unit)
    except UnitError as exc:
        raise IngestError(source, line, f"{what}: {exc}") from None
    value = finite(value, source, line, what)  # 1e308 GiB overflows to inf
    return Quantity(round_sig(value, 12), dimension)  # 536.363 GFLOPS: no 0.00006 tail


def parse_number(text: str, source: str, line: int, what: str) -> float:
    """A bare number (no unit), or :class:`IngestError`."""
    if re.fullmatch(NUMBER, text.strip()) is None:
        raise IngestError(source, line, f"{what}: {clip(text.strip())} is not a number")
    return finite(float(text), source, line, what)


def parse_int(digits: str, source: str, line: int, what: str) -> int:
    """A count a pattern matched as ``\\d+``: more than 18 digits is no count a tool
    printed (and ``int()`` refuses more than 4300 with a ValueError)."""
    if len(digits) > 18:
        raise IngestError(source, line, f"{what}: {clip(digits, 24)} is out of range")
    return int(digits)


def near_int(x: float, source: str, line: int, what: str, rel: float = 0.01) -> int:
    """``x`` rounded, when it is within ``rel`` of an integer (a derived count)."""
    if not math.isfinite(x):  # round() of it raises OverflowError or ValueError
        raise IngestError(source, line, f"{what} comes out as {x}, not a whole number: the "
                                        f"numbers it is derived from are out of range")
    n = round(x)
    if n <= 0 or abs(x - n) > rel * n:
        raise IngestError(source, line, f"{what} comes out as {x:.4g}, not a whole number: "
                                        f"the numbers it is derived from disagree")
    return n


def slug(text: str) -> str:
    """``"Batch32 CC optim"`` -> ``"batch32-cc-optim"``."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
