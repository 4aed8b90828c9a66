"""Formatting of the numbers that checks and reports show: bytes, percentages, ratios.

Every sentence a check writes goes through these helpers, so the terminal table, the JSON
report and a failing test's message spell the same quantity the same way. They are pure
functions of plain numbers and never raise on ``nan``/``inf``: a broken measurement should
still produce a readable message, not a ``ValueError`` from a format string.

>>> fmt_bytes(20.93 * 2**30)
'20.93 GiB'
>>> fmt_percent(0.123)
'12.3%'
>>> fmt_signed_percent(-0.05)
'-5.0%'
>>> fmt_num(1.23456789e-6)
'1.235e-06'
"""

from __future__ import annotations

import math

from pytest_accelperf.errors import UserError

#: Binary prefixes, smallest first; ``fmt_bytes`` picks the largest that keeps the value >= 1.
_BYTE_UNITS: tuple[str, ...] = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def fmt_bytes(n: float) -> str:
    """A byte count with a binary prefix and two decimals.

    >>> fmt_bytes(0)
    '0 B'
    >>> fmt_bytes(512)
    '512 B'
    >>> fmt_bytes(1536)
    '1.50 KiB'
    >>> fmt_bytes(16_620_000_000)
    '15.48 GiB'
    >>> fmt_bytes(-3 * 2**20)
    '-3.00 MiB'
    """
    if not math.isfinite(n):
        return f"{n} B"
    sign = "-" if n < 0 else ""
    value = abs(float(n))
    if value < 1024:
        return f"{sign}{value:.0f} B"
    exp = min(int(math.log(value, 1024)), len(_BYTE_UNITS) - 1)
    scaled = value / 1024**exp
    if scaled >= 1023.995 and exp < len(_BYTE_UNITS) - 1:  # 1023.999 MiB would print 1024.00
        exp += 1
        scaled = value / 1024**exp
    return f"{sign}{scaled:.2f} {_BYTE_UNITS[exp]}"


def fmt_flops(n: float) -> str:
    """A FLOP count with a decimal prefix.

    >>> fmt_flops(2.5e9), fmt_flops(640), fmt_flops(3.2e13)
    ('2.50 GFLOP', '640 FLOP', '32.00 TFLOP')
    """
    value = abs(float(n))
    for prefix, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if value >= scale:
            return f"{n / scale:.2f} {prefix}FLOP"
    return f"{n:.0f} FLOP"


def fmt_value(value: float | None, unit: str) -> str:
    """``value`` in ``unit`` as the reports and ``accelperf baselines`` show it (``-`` for
    none): bytes as MiB/GiB, samples/s, a step's seconds as ms, FLOPs, else 4 digits."""
    if value is None:
        return "-"
    if unit == "bytes":
        return fmt_bytes(int(value))
    if unit == "samples/s":
        return f"{value:,.1f}/s"
    if unit == "s":  # a compile time: 18.02 ms, 2.34 s
        return f"{value * 1e3:.2f} ms" if abs(value) < 1 else f"{value:.2f} s"
    if unit == "flop":
        return fmt_flops(value)
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.4g}"


def fmt_percent(x: float, digits: int = 1) -> str:
    """A fraction as a percentage, no sign added: ``0.1 -> '10.0%'``.

    >>> fmt_percent(0.1, digits=0)
    '10%'
    """
    if not math.isfinite(x):
        return f"{x}%"
    return f"{x * 100:.{digits}f}%"


def fmt_signed_percent(x: float, digits: int = 1) -> str:
    """A relative change with its sign: ``0.25 -> '+25.0%'``.

    >>> fmt_signed_percent(0.25)
    '+25.0%'
    """
    if not math.isfinite(x):
        return f"{x}%"
    return f"{x * 100:+.{digits}f}%"


def fmt_tolerance(x: float) -> str:
    """A relative tolerance as the user wrote it: whole percentages without decimals.

    >>> fmt_tolerance(0.1)
    '10%'
    >>> fmt_tolerance(0.025)
    '2.5%'
    >>> fmt_tolerance(0.0001)
    '0.01%'
    """
    pct = x * 100
    return f"{pct:.4g}%"


def fmt_num(x: float, digits: int = 4) -> str:
    """A plain number with ``digits`` significant digits (``nan``/``inf`` spelled out).

    >>> fmt_num(2.0)
    '2'
    >>> fmt_num(float("nan"))
    'nan'
    """
    return f"{x:.{digits}g}"


def fmt_ratio(x: float) -> str:
    """A ratio near one, with two decimals: ``1.1234 -> '1.12'``.

    >>> fmt_ratio(1.1234)
    '1.12'
    """
    return f"{x:.2f}"


#: Significant digits of each stored step-time, probe and input sample: a rounding error of
#: at most 0.05 %, far below what one step's time varies by, and 2 to 3 characters less per
#: sample (a block holds 20 to 100 of each) than the 6 digits of a median.
SAMPLE_DIGITS = 4


def round_sig(x: float, digits: int = 6) -> float:
    """Round to significant digits, so a baseline diff shows measurement, not float noise.

    >>> round_sig(0.0633551987, 6)
    0.0633552
    """
    if x == 0 or not math.isfinite(x):
        return x
    return round(x, digits - 1 - math.floor(math.log10(abs(x))))


# -- parsing quantities that outside tools print (pytest_accelperf.ingest) -----------------
class UnitError(UserError, ValueError):
    """A unit this table does not know: never guessed, so never a silently wrong number."""


#: Unit -> (dimension, factor to the base unit). Bytes are binary as the Neuron profiler
#: prints them; "KB"/"MB"/"GB" are left out on purpose (tools disagree on 1000 vs 1024).
#: FLOP counts are decimal (the profiler's "GFLOPS" is a count despite the S).
QUANTITY_UNITS: dict[str, tuple[str, float]] = {
    "B": ("bytes", 1.0), "KiB": ("bytes", 2.0**10), "MiB": ("bytes", 2.0**20),
    "GiB": ("bytes", 2.0**30), "TiB": ("bytes", 2.0**40),
    "ns": ("seconds", 1e-9), "us": ("seconds", 1e-6), "µs": ("seconds", 1e-6),
    "ms": ("seconds", 1e-3), "s": ("seconds", 1.0),
    "FLOPS": ("flops", 1.0), "KFLOPS": ("flops", 1e3), "MFLOPS": ("flops", 1e6),
    "GFLOPS": ("flops", 1e9), "TFLOPS": ("flops", 1e12), "PFLOPS": ("flops", 1e15),
    "%": ("percent", 1.0),
    "flops/byte": ("flops/byte", 1.0),
    "samples/sec": ("samples/s", 1.0), "samples/s": ("samples/s", 1.0),
}


def to_base_unit(value: float, unit: str) -> tuple[float, str]:
    """``value`` in ``unit`` converted to its dimension's base unit, and the dimension.

    >>> to_base_unit(4.334, "GiB")
    (4653597065.216, 'bytes')
    >>> to_base_unit(322.1, "us")[1]
    'seconds'
    >>> to_base_unit(1.0, "furlongs")
    Traceback (most recent call last):
    ...
    pytest_accelperf.stats.units.UnitError: unknown unit 'furlongs'; known: B, KiB, MiB, ...
    """
    try:
        dimension, factor = QUANTITY_UNITS[unit]
    except KeyError:
        raise UnitError(f"unknown unit {unit!r}; known: {', '.join(QUANTITY_UNITS)}") from None
    return value * factor, dimension
