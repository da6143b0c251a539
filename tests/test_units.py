"""The one format per unit (engramprof/units.py): a table of inputs and the text each must print."""
from __future__ import annotations

import math

import numpy as np
import pytest

from engramprof import units

CASES = [
    # pct: whole percent; never 0% or 100% for a share that is neither none nor all
    (units.pct, None, "-"),
    (units.pct, math.nan, "-"),
    (units.pct, 0, "0%"),
    (units.pct, 0.0, "0%"),
    (units.pct, 0.64, "64%"),
    (units.pct, 0.015, "2%"),
    (units.pct, 0.01, "1%"),
    (units.pct, 0.004, "0.4%"),
    (units.pct, 0.0005, "0.05%"),
    (units.pct, 0.00000004, "<0.01%"),
    (units.pct, 0.99, "99%"),
    (units.pct, 0.9997, "99.9%"),
    (units.pct, 0.995, "99.5%"),
    (units.pct, 1.0, "100%"),
    (units.pct, 1.5, "150%"),
    (units.pct, -0.25, "-25%"),
    (units.pct, np.float64(0.5), "50%"),
    # percent_of: a number for JSON
    (lambda a: units.percent_of(*a), (1.0, 3.0), 33.333),
    (lambda a: units.percent_of(*a), (5, 0), None),
    (lambda a: units.percent_of(*a), (None, 10), None),
    # ms: the number only, three significant digits
    (units.ms, None, "-"),
    (units.ms, math.inf, "-"),
    (units.ms, 0, "0"),
    (units.ms, 1234.5, "1,234"),
    (units.ms, 123.4, "123"),
    (units.ms, 12.34, "12.3"),
    (units.ms, 1.234, "1.23"),
    (units.ms, 0.1234, "0.123"),
    (units.ms, 0.00123, "0.00123"),
    (units.ms, 0.000123, "0.00012"),
    # duration: with the unit that reads best
    (units.duration, None, "-"),
    (units.duration, 0, "0 ms"),
    (units.duration, 0.237, "237.0 µs"),
    (units.duration, 0.0032, "3.2 µs"),
    (units.duration, 0.99996, "1.00 ms"),
    (units.duration, 1.1605, "1.16 ms"),
    (units.duration, 250.0, "250 ms"),
    (units.duration, 9_999.0, "9,999 ms"),
    (units.duration, 12_345.0, "12.3 s"),
    # count and mib
    (units.count, None, "-"),
    (units.count, 1234567, "1,234,567"),
    (units.count, 12.6, "13"),
    (units.count, np.int64(4096), "4,096"),
    (units.count, "n/a", "n/a"),
    (units.mib, 3 * 2**20 + 2**19, "3.5 MiB"),
    (units.mib, None, "-"),
]


@pytest.mark.parametrize("fmt, value, want", CASES,
                         ids=[f"{getattr(f, '__name__', 'percent_of')}({v!r})" for f, v, _ in CASES])
def test_format(fmt, value, want):
    assert fmt(value) == want
