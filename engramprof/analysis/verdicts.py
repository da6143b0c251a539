"""Cause names, the one verdict ranking, and the one definition of a slow call.

Every command that names a verdict (batch-tail per batch and overall, diagnose with its
confidence and runner-up) ranks causes here, so a tie is broken the same way everywhere:
by the order of :data:`VERDICT_CAUSES`.
"""
from __future__ import annotations

import numpy as np

CAUSES = ("residency", "reclaim", "storage", "python-scheduling", "cpu-copy", "unexplained")
VERDICT_CAUSES = ("residency", "reclaim", "storage", "python-scheduling")
VERDICTS = VERDICT_CAUSES + ("healthy",)

DEFAULT_SLOW_MS = 4.0
#: a cause explains a "meaningful share" of batch time from this share on (else: healthy)
DEFAULT_MEANINGFUL_SHARE = 0.25


def col(cause: str) -> str:
    """Column-safe form of a cause name (python-scheduling -> python_scheduling)."""
    return cause.replace("-", "_")


def is_slow(dur_ns, slow_ms: float):
    """A read event is slow when it lasted longer than ``slow_ms`` (strictly)."""
    return np.asarray(dur_ns) > slow_ms * 1e6


def rank_causes(shares: dict) -> list[tuple[str, float]]:
    """VERDICT_CAUSES with their shares, largest first; ties in VERDICT_CAUSES order."""
    vals = [(c, float(shares.get(c, 0.0) or 0.0)) for c in VERDICT_CAUSES]
    return sorted(vals, key=lambda cv: -cv[1])  # sorted() is stable: ties keep the order


def verdict_of(shares: dict, meaningful_share: float = DEFAULT_MEANINGFUL_SHARE) -> str:
    """The largest of residency / reclaim / storage / python-scheduling if it reaches
    ``meaningful_share`` of batch time, else ``healthy``."""
    best, share = rank_causes(shares)[0]
    return best if share >= meaningful_share else "healthy"


def verdicts_of_rows(share_matrix: np.ndarray, meaningful_share: float) -> np.ndarray:
    """:func:`verdict_of` for each row of shares in VERDICT_CAUSES order (argmax takes the
    first of equal maxima: the same tie rule)."""
    names = np.array(VERDICTS, dtype=object)
    if len(share_matrix) == 0:
        return np.empty(0, dtype=object)
    k = np.argmax(share_matrix, axis=1)
    best = share_matrix[np.arange(len(k)), k]
    return np.where(best >= meaningful_share, names[k], "healthy")
