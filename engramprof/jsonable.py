"""JSON shaping, once: numpy / pandas values to JSON-safe Python, NaN and inf to null.

Every ``--json`` document and every summary dict goes through :func:`jsonable`; commands print
:func:`to_json`.  Anything else unknown becomes its string.
"""
from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pandas as pd


def jsonable(v: Any) -> Any:
    """``v`` with numpy / pandas values turned into JSON-safe Python ones (NaN -> None)."""
    if isinstance(v, dict):
        return {str(k): jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [jsonable(x) for x in v]
    if isinstance(v, np.ndarray):
        return [jsonable(x) for x in v.tolist()]
    if isinstance(v, np.integer):
        return int(v)
    if isinstance(v, (float, np.floating)):
        f = float(v)
        return f if math.isfinite(f) else None
    if isinstance(v, np.bool_):
        return bool(v)
    if v is None or isinstance(v, (str, int, bool)):
        return v
    try:
        if pd.isna(v):
            return None
    except (TypeError, ValueError):
        pass
    return str(v)


def to_json(obj: Any, indent: int | None = 2) -> str:
    """Strict JSON (no NaN / Infinity) of a summary document."""
    return json.dumps(jsonable(obj), indent=indent, allow_nan=False)
