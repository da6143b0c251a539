"""Optional dependencies (pyproject extras): a one-line error naming the extra when one is missing."""
from __future__ import annotations

import importlib

from engramprof.errors import UserError


def require(module: str, extra: str, for_what: str) -> None:
    """Raise UserError unless ``module`` imports (it comes with ``engramprof[extra]``)."""
    try:
        importlib.import_module(module)
    except ImportError:
        raise UserError(f"{for_what} needs {module}, which is not installed: pip install 'engramprof[{extra}]'") from None


def require_plot() -> None:
    """matplotlib, for ``batch-tail --plot`` (the ``plot`` extra)."""
    require("matplotlib", "plot", "--plot")
