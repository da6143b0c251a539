"""Percentiles and time shares with bootstrap confidence intervals (numpy's Generator).

A side's batches, possibly from several strata, each stratum s with a weight w_s (its share of
the common mix; one stratum of weight 1 for a per-stratum figure).  Batch i of stratum s weighs
w_s / n_s.  A quantile is the weighted "inverted CDF" quantile: the smallest batch time whose
cumulative weight reaches q (with equal weights: numpy's ``method="inverted_cdf"``).  A cause's
share is the weighted sum of that cause's ms over the weighted sum of wall ms.

The bootstrap resamples each stratum's batches with replacement (multinomial counts: a
stratified bootstrap), ``resamples`` times, and recomputes every figure; the interval is the
percentile interval.  The ratio after / before pairs independent replicates of the two sides,
so its interval holds both sides' uncertainty.  Batches are taken as independent (LIMITS in
docs/commands/compare.md: consecutive steps are not quite).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

QUANTILES = (0.5, 0.99)
CONFIDENCE = 0.95
#: counts matrices are made this many cells at a time (memory: 8 bytes a cell)
_CHUNK_CELLS = 4_000_000


@dataclass
class Sample:
    """One side's batches under a mix: wall ms, causes ms, stratum of each, weight per stratum."""
    wall: np.ndarray        # (n,)
    causes: np.ndarray      # (n, K)
    group: np.ndarray       # (n,) int stratum index
    weight: np.ndarray      # (G,) weight per stratum (sums to 1 over the strata present)


@dataclass
class Estimate:
    point: dict             # "p50", "p99" -> ms; "share" -> (K,) array
    reps: dict              # the same, one value (row) per bootstrap replicate


def _elem_weights(s: Sample, counts: np.ndarray | None = None) -> np.ndarray:
    n_per = np.bincount(s.group, minlength=len(s.weight)).astype(np.float64)
    base = s.weight[s.group] / np.maximum(n_per[s.group], 1)
    return base if counts is None else counts * base


def _quantiles(sorted_wall: np.ndarray, cumw: np.ndarray, qs) -> dict:
    """Weighted inverted-CDF quantiles; ``cumw`` (rows, n) or (n,) cumulative weights."""
    total = cumw[..., -1:]
    out = {}
    for q in qs:
        # the first element whose cumulative weight reaches q of the total (a tolerance for sums)
        idx = (cumw < q * total * (1 - 1e-12)).sum(axis=-1)
        out[f"p{round(q * 100):g}"] = sorted_wall[np.minimum(idx, len(sorted_wall) - 1)]
    return out


def estimate(s: Sample, resamples: int, rng: np.random.Generator) -> Estimate:
    order = np.argsort(s.wall, kind="stable")
    wall, causes, group = s.wall[order], s.causes[order], s.group[order]
    ss = Sample(wall, causes, group, s.weight)
    w = _elem_weights(ss)
    point = _quantiles(wall, np.cumsum(w), QUANTILES)
    point = {k: float(v) for k, v in point.items()}
    point["share"] = (w @ causes) / max(float(w @ wall), 1e-300)
    reps = {k: [] for k in point}
    n = len(wall)
    if resamples > 0 and n:
        members = [np.flatnonzero(group == g) for g in range(len(s.weight))]
        chunk = max(1, _CHUNK_CELLS // max(n, 1))
        done = 0
        while done < resamples:
            b = min(chunk, resamples - done)
            counts = np.zeros((b, n), dtype=np.float64)
            for m in members:
                if len(m):
                    counts[:, m] = rng.multinomial(len(m), np.full(len(m), 1.0 / len(m)), size=b)
            wr = _elem_weights(ss, counts)
            q = _quantiles(wall, np.cumsum(wr, axis=1), QUANTILES)
            for k, v in q.items():
                reps[k].append(v)
            reps["share"].append((wr @ causes) / np.maximum(wr @ wall, 1e-300)[:, None])
            done += b
        reps = {k: np.concatenate(v) for k, v in reps.items()}
    else:
        reps = {k: np.empty((0,) + np.shape(point[k])) for k in point}
    return Estimate(point, reps)


def interval(reps: np.ndarray, confidence: float = CONFIDENCE) -> list | None:
    reps = np.asarray(reps, dtype=np.float64)
    reps = reps[np.isfinite(reps)] if reps.ndim == 1 else reps
    if not len(reps):
        return None
    a = (1 - confidence) / 2
    lo, hi = np.quantile(reps, [a, 1 - a], axis=0)
    return [lo.tolist() if np.ndim(lo) else float(lo), hi.tolist() if np.ndim(hi) else float(hi)]


def ratio(before: Estimate, after: Estimate, key: str, confidence: float = CONFIDENCE) -> tuple[float | None, list | None]:
    """after / before of a quantile, with the percentile interval of the paired replicates."""
    b, a = before.point[key], after.point[key]
    point = a / b if b > 0 else None
    rb, ra = before.reps[key], after.reps[key]
    m = min(len(rb), len(ra))
    if not m:
        return point, None
    with np.errstate(divide="ignore", invalid="ignore"):
        r = ra[:m] / rb[:m]
    return point, interval(r[np.isfinite(r)], confidence)


def difference(before: Estimate, after: Estimate, key: str, confidence: float = CONFIDENCE) -> tuple[float, list | None]:
    d = after.point[key] - before.point[key]
    rb, ra = before.reps[key], after.reps[key]
    m = min(len(rb), len(ra))
    return d, (interval(ra[:m] - rb[:m], confidence) if m else None)
