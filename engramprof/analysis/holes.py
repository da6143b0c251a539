"""Stage 2b: holes in the record stream (lost records) and the batches they blind.

When the ring buffer is full the kernel drops records and counts them; the recorder writes,
per drain interval in which the count grew, a ``lost_records`` sample (start_ns, end_ns,
lost).  Inside such an interval the trace is blind: a batch overlapping it may have lost calls
(its attribution would be wrong), and a hole looks like a forward-pass gap to the inference.
Those batches are left out of the shares and counted; the summary says how much of the
recording window was blind.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from engramprof.bpf import progstats
from engramprof.errors import UserError
from engramprof.units import pct


@dataclass
class RecordHoles:
    start_ns: np.ndarray
    end_ns: np.ndarray
    lost: np.ndarray
    total_lost: int  # the recorder's total (meta), which may exceed the intervals' sum
    source: str  # "intervals" | "total only" | "none"

    def blind_ns(self, t0: int, t1: int) -> float:
        """Length of the union of the holes inside [t0, t1]."""
        if not len(self.start_ns):
            return 0.0
        s = np.clip(self.start_ns, t0, t1)
        e = np.clip(self.end_ns, t0, t1)
        o = np.argsort(s, kind="stable")
        s, e = s[o], e[o]
        reach = np.maximum.accumulate(e)
        starts = np.maximum(s, np.r_[t0, reach[:-1]])
        return float(np.clip(reach - starts, 0, None).sum())

    def overlapping(self, bstart: np.ndarray, bend: np.ndarray) -> np.ndarray:
        """Per batch [bstart, bend]: does it overlap a hole?"""
        if not len(self.start_ns):
            return np.zeros(len(bstart), dtype=bool)
        o = np.argsort(self.start_ns, kind="stable")
        hs, he = self.start_ns[o], np.maximum.accumulate(self.end_ns[o])
        k = np.searchsorted(hs, bend, side="right") - 1  # the last hole starting before the batch ends
        return (k >= 0) & (he[np.maximum(k, 0)] >= bstart)


def _meta_lost(meta: dict) -> int:
    for v in ((meta.get("totals") or {}).get("lost_records"), meta.get("lost_records")):
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return int(v)
    return 0


def read_holes(getter, meta: dict) -> RecordHoles:
    """The holes the recorder wrote (samples/lost_records) and its total of lost records."""
    try:
        df = getter("lost_records")
    except UserError:
        df = None
    total = _meta_lost(meta)
    if df is not None and len(df) and {"start_ns", "end_ns", "lost"} <= set(df.columns):
        df = df[["start_ns", "end_ns", "lost"]].apply(pd.to_numeric, errors="coerce").dropna()
        df = df[(df["end_ns"] >= df["start_ns"]) & (df["lost"] > 0)]
        lost = df["lost"].to_numpy(np.int64)
        return RecordHoles(df["start_ns"].to_numpy(np.int64), df["end_ns"].to_numpy(np.int64), lost,
                           max(total, int(lost.sum())), "intervals")
    empty = np.empty(0, dtype=np.int64)
    return RecordHoles(empty, empty, empty, total, "total only" if total else "none")


def exclude_blind_batches(seg, holes: RecordHoles, window: tuple[int, int], notes: list[str]):
    """(batches without the blind ones, the ``lost_records`` summary)."""
    t0, t1 = window
    blind = holes.overlapping(seg.start_ns.astype(np.int64), seg.end_ns.astype(np.int64)) if seg.n else \
        np.zeros(0, dtype=bool)
    span = max(1, t1 - t0)
    blind_ns = holes.blind_ns(t0, t1)
    summary = {"records": int(holes.total_lost), "intervals": int(len(holes.start_ns)), "source": holes.source,
               "blind_ms": blind_ns / 1e6, "blind_frac": blind_ns / span, "batches_excluded": int(blind.sum())}
    if holes.source == "total only":
        notes.append(f"{holes.total_lost:,} call records were lost (ring buffer full) and this recording does not "
                     "say when: batches that lost calls cannot be told apart, their shares may be wrong")
    elif holes.total_lost:
        notes.append(f"{holes.total_lost:,} call records were lost in {len(holes.start_ns)} interval(s): the trace "
                     f"was blind for {blind_ns / 1e6:,.0f} ms ({pct(blind_ns / span)} of the window); "
                     f"{int(blind.sum())} batch(es) overlapping a hole were left out of the shares")
    if blind.any() and not blind.all():
        seg = seg.subset(~blind)
    elif blind.all() and blind.any():
        raise UserError("every batch overlaps a hole of lost records: nothing can be attributed "
                        f"({holes.total_lost:,} records lost)", code=1)
    return seg, summary


def skipped_runs_notes(meta: dict) -> list[str]:
    """The runs of the probes' programs the kernel skipped (meta ``kernel_skipped``, written by the
    recorder: engramprof/bpf/progstats.py): where the trace was blind without a hole in the
    record stream.  Skips are not timed, so no batch is left out for them."""
    s = progstats.sentence(meta.get("kernel_skipped") if isinstance(meta.get("kernel_skipped"), dict) else None)
    return [s + " (when is not known: no batch was left out)"] if s else []
