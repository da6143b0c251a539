"""Checks of command-line numbers, worded with the flag the user typed (one place, so every
command rejects a bad number the same way)."""
from __future__ import annotations

import math

from engramprof.errors import UserError


def positive(flag: str, value: float | None) -> None:
    """A finite number > 0 (None: not given)."""
    if value is not None and not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
        raise UserError(f"{flag} must be a positive number (got {value})")


def share(flag: str, value: float) -> None:
    """A share of time in (0, 1]."""
    if not (isinstance(value, (int, float)) and 0.0 < value <= 1.0):
        raise UserError(f"{flag} must be in (0, 1] (got {value})")
