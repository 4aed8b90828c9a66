"""What every parser shares: the error that names file and line, and number parsing.

A parser reads text some other tool wrote and returns :class:`~pytest_accelperf.run.Run`
objects. It must never return a number it is not sure of: anything it does not recognize
where a number should be (a unit it does not know, a row cut short, steps out of order, a
log that ends before its summary) raises :class:`IngestError`, which says where
(``file:line``) and what to do.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pytest_accelperf.errors import UserError
from pytest_accelperf.units import UnitError, round_sig, to_base_unit

#: A decimal number as tools print it (no thousands separators).
NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
_QUANTITY = re.compile(rf"^({NUMBER})\s*(\S.*)?$")


class IngestError(UserError, ValueError):
    """An outside log that cannot be read into a run, with where and why.

    ``str()`` is ``"path:line: message"`` (``line`` 0 when the problem is the file as a
    whole, e.g. a missing summary at its end).
    """

    def __init__(self, source: str, line: int, message: str) -> None:
        self.source, self.line, self.reason = source, line, message
        where = f"{source}:{line}" if line else source
        super().__init__(f"{where}: {message}")


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
        raise IngestError(source, line, f"{what}: {text.strip()!r} is not a number with a unit")
    number, unit = float(match.group(1)), (match.group(2) or "").strip()
    if not unit:
        return Quantity(number, "count")
    try:
        value, dimension = to_base_unit(number, unit)
    except UnitError as exc:
        raise IngestError(source, line, f"{what}: {exc}") from None
    return Quantity(round_sig(value, 12), dimension)  # 536.363 GFLOPS: no 0.00006 tail


def parse_number(text: str, source: str, line: int, what: str) -> float:
    """A bare number (no unit), or :class:`IngestError`."""
    if re.fullmatch(NUMBER, text.strip()) is None:
        raise IngestError(source, line, f"{what}: {text.strip()!r} is not a number")
    return float(text)


def near_int(x: float, source: str, line: int, what: str, rel: float = 0.01) -> int:
    """``x`` rounded, when it is within ``rel`` of an integer (a derived count)."""
    n = round(x)
    if n <= 0 or abs(x - n) > rel * n:
        raise IngestError(source, line, f"{what} comes out as {x:.4g}, not a whole number: "
                                        f"the numbers it is derived from disagree")
    return n


def slug(text: str) -> str:
    """``"Batch32 CC optim"`` -> ``"batch32-cc-optim"``."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
