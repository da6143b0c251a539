"""The one format per unit: percentages, durations, counts and sizes as text.

In the base layer because the analysis layer writes numbers into its evidence strings (which
end up in JSON) and may not import ``report/``; the report layer uses these same functions.
Every one of them prints ``-`` for a value that is missing (None, NaN, infinite).
"""
from __future__ import annotations

import math
import numbers

MISSING = "-"


def _missing(v) -> bool:
    if v is None:
        return True
    try:
        return not math.isfinite(v)
    except TypeError:  # not a number
        return False


def pct(frac: float | None) -> str:
    """A fraction (0.64) as a percentage ("64%").

    Whole percent, except that a share that is neither none nor all never reads as 0% or
    100%: below 1% one significant digit (0.4%, 0.05%, under 0.01% "<0.01%"), between 99% and
    100% one decimal, rounded down (99.9%).
    """
    if _missing(frac):
        return MISSING
    p = 100.0 * frac
    a = abs(p)
    if a == 0 or 1 <= a <= 99 or a >= 100:
        return f"{p:.0f}%"
    if a < 0.01:
        return "<0.01%" if p > 0 else ">-0.01%"
    if a < 1:
        return f"{p:.1g}%"
    return f"{math.copysign(math.floor(a * 10) / 10, p):.1f}%"


def percent_of(part: float | None, whole: float | None, ndigits: int = 3) -> float | None:
    """``part`` as a percentage of ``whole``, as a number for JSON (None when either is missing
    or ``whole`` is 0)."""
    if _missing(part) or _missing(whole) or not whole:
        return None
    return round(100.0 * part / whole, ndigits)


def ms(v: float | None) -> str:
    """A duration in milliseconds as a number, without the unit (for columns headed "ms" and
    text that writes "ms" after it): three significant digits, all of them from 100 up
    (1,234 / 123 / 12.3 / 1.23 / 0.123 / 0.0012)."""
    if _missing(v):
        return MISSING
    a = abs(v)
    if a >= 100:
        return f"{v:,.0f}"
    if a >= 10:
        return f"{v:.1f}"
    if a >= 1:
        return f"{v:.2f}"
    if a >= 0.001:
        return f"{v:.3g}"
    return f"{v:.2g}" if v else "0"


def duration(ms_: float | None) -> str:
    """A duration given in milliseconds, with the unit that reads best: µs below 1 ms (one
    decimal: 237.0 µs), ms up to 10 s (as :func:`ms`: 1.16 ms), s from 10 s (12.3 s)."""
    if _missing(ms_):
        return MISSING
    a = abs(ms_)
    if a and a < 1:
        if round(a * 1e3, 1) < 1000:
            return f"{ms_ * 1e3:.1f} µs"
        ms_ = math.copysign(1.0, ms_)  # 999.96 µs: 1.00 ms
    if a >= 10_000:
        return f"{ms_ / 1e3:.3g} s"
    return f"{ms(ms_)} ms"


def count(x) -> str:
    """A count with thousands separators (12,345); a value that is not a number as it is."""
    if _missing(x):
        return MISSING
    return f"{x:,.0f}" if isinstance(x, numbers.Real) else str(x)


def mib(nbytes: float | None) -> str:
    """A size in bytes as MiB with one decimal (12.5 MiB)."""
    return MISSING if _missing(nbytes) else f"{nbytes / 2**20:,.1f} MiB"
