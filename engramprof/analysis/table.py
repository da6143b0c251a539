"""Stage 7: the per-batch table (one row per batch: wall time, causes, evidence, slowest event)."""
from __future__ import annotations

import numpy as np
import pandas as pd

from engramprof.analysis.attribute import URING_PATH_COUNTS, BatchAccumulator
from engramprof.analysis.events import ReadEvents, misses_known
from engramprof.analysis.verdicts import CAUSES, VERDICT_CAUSES, col, verdicts_of_rows

_EVIDENCE_COLUMNS_OUT = (("bio_ms", "bio_ns"), ("reclaim_in_calls_ms", "reclaim_ns"), ("offcpu_ms", "offcpu_ns"),
                         ("runq_ms", "runq_ns"))
_SLOWEST_EVIDENCE = (("slowest_misses", "pages_added"), ("slowest_bio_ms", "bio_ns"),
                     ("slowest_reclaim_ms", "reclaim_ns"), ("slowest_offcpu_ms", "offcpu_ns"),
                     ("slowest_runq_ms", "runq_ns"))


def batch_shares(acc: BatchAccumulator, wall: np.ndarray) -> tuple[dict, np.ndarray]:
    """Per batch, each cause's share of max(wall, sum of causes); and that denominator.
    A batch of zero length (zero-duration events only) is all unexplained."""
    parts = sum(acc.cause_ns.values())
    denom = np.maximum(wall, parts)
    zero = denom <= 0
    if zero.any():
        acc.cause_ns["unexplained"] = np.where(zero, 1.0, acc.cause_ns["unexplained"])
        denom = np.where(zero, 1.0, denom)
    return {c: acc.cause_ns[c] / denom for c in CAUSES}, denom


def _slowest_values(events: ReadEvents, name: str, rows: np.ndarray) -> np.ndarray:
    """The column's value at each table row; None (NaN for numbers) where the row is -1 (a
    batch without a read event)."""
    none = rows < 0
    if none.any():
        vals = _slowest_values(events, name, np.where(none, 0, rows)) if len(events.ts) else \
            np.full(len(rows), None, dtype=object)
        vals = vals.astype(object if vals.dtype.kind in "OUS" else np.float64)
        vals[none] = None if vals.dtype == object else np.nan
        return vals
    cols = events.cols
    if name in ("path", "tensor"):
        codes, uniques = cols.codes(name)
        c = codes[rows]
        vals = np.asarray(uniques, dtype=object)
        return np.where(c >= 0, vals[np.maximum(c, 0)] if len(vals) else None, None)
    if name not in cols.calls.columns:  # left on disk by the load: read at these rows only
        return cols.later[name].values_at(rows)
    s = cols.calls[name]
    if not pd.api.types.is_numeric_dtype(s.dtype):
        return s.iloc[rows].to_numpy(dtype=object)
    return s.to_numpy()[rows]


def batch_table(acc: BatchAccumulator, seg, events: ReadEvents, threads_per_batch: np.ndarray,
                shares: dict, meaningful_share: float, ctx=None) -> pd.DataFrame:
    """One row per batch; ``ctx``: (context switches, involuntary) per batch, or None."""
    cols = events.cols
    nb = acc.n
    bstart, bend = seg.start_ns.astype(np.int64), seg.end_ns.astype(np.int64)
    starts = ([int(bstart[0])] if nb else []) + ([int(events.ts[0])] if len(events.ts) else [])
    t0 = min(starts) if starts else 0
    out = pd.DataFrame({
        "batch": np.arange(nb), "start_ns": bstart, "end_ns": bend, "start_s": (bstart - t0) / 1e9,
        "wall_ms": (bend - bstart) / 1e6, "calls": seg.counts,
    })
    if cols.has("offset"):
        out["rows"] = acc.rows.astype(np.int64)
    out["threads"] = threads_per_batch.astype(np.int64)
    if cols.has("ret"):
        out["bytes"] = acc.bytes.astype(np.int64)
    out["inflight_ms"] = acc.inflight / 1e6
    out["sum_call_ms"] = acc.sum_call / 1e6
    out["slow_calls"] = acc.slow_calls.astype(np.int64)
    out["no_read_ms"] = acc.no_read / 1e6
    evb = acc.evidence
    if cols.has("pages_added"):
        out["misses"] = evb["misses"].astype(np.int64)
    if cols.has("bio_count"):
        out["bio_count"] = evb["bio_count"].astype(np.int64)
    if misses_known(cols):
        out["calls_with_misses"] = evb["calls_with_misses"].astype(np.int64)
    out["queue_depth"] = np.where(acc.inflight > 0, acc.sum_call / np.where(acc.inflight > 0, acc.inflight, 1), 0.0)
    out["queue_depth_max"] = acc.queue_depth_max.astype(np.int64)
    if cols.has("direct"):
        out["direct_calls"] = evb["direct_calls"].astype(np.int64)
    if cols.has("uring_path"):
        for key in URING_PATH_COUNTS:
            out[key] = evb[key].astype(np.int64)
    for key, name in _EVIDENCE_COLUMNS_OUT:
        if cols.has(name):
            out[key] = evb[key]
    out["slowest_call_ms"] = acc.slowest_ms
    pos = acc.slowest_pos
    rows = np.where(pos >= 0, cols.rows(np.maximum(pos, 0)) if len(events.ts) else 0, -1)
    for c in ("tid", "path", "offset", "tensor", "row"):
        if cols.has(c):
            out["slowest_" + c] = _slowest_values(events, c, rows)
    for key, name in _SLOWEST_EVIDENCE:
        if cols.has(name):
            out[key] = evb[key]
    if ctx is not None:
        out["ctx_switches_est"], out["ctx_involuntary_est"] = ctx
    for c in CAUSES:
        out[f"ms_{col(c)}"] = acc.cause_ns[c] / 1e6
    for c in CAUSES:
        out[f"share_{col(c)}"] = shares[c]
    smat = np.column_stack([shares[c] for c in VERDICT_CAUSES]) if nb else np.empty((0, 4))
    out["verdict"] = verdicts_of_rows(smat, meaningful_share)
    return out
