"""Time the target spent inside its own prefetch hints, with no read in flight (docs/model.md,
"Hint calls").

A reader that hints before it reads (pyarrow's Parquet reader: ``posix_fadvise(WILLNEED)`` of
the column chunks on the calling thread, then ``pread64`` of them on its I/O threads) spends the
hint call's own time allocating the pages and queueing their bios: 1-3.5 ms a hint on a cold
file there.  No read event is in flight then, so stage 5 would count that time as the thread's
own loop (cpu-copy) or a hand-off (python-scheduling).  It is the cost of bringing the rows in:
residency.  The hints are samples/pagecache_hints (the page-cache probe: entry -> exit of every
``fadvise64`` / ``madvise`` / ``readahead`` call of the target); the prefetching ones (WILLNEED,
POPULATE_READ, readahead(2)) on a file the process's read events read count.  Their union is
taken out of each stretch with no read in flight (a gap between reads, before a batch's first
read, after its last) before stage 5 splits that stretch (attribute.py, ``_no_read_time``).

Only the hints of the thread the step waits on count: a batch's step thread (its markers' tid,
else the submitter inferred from the reads), else, where no step thread is known, the threads
that read.  A prefetcher thread hinting the next step's rows while the step computes does not
hold the step back, and its hints are not counted.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

#: advice values that ask the kernel to read pages in (the ``readahead`` call always does)
PREFETCH_ADVICE = ("WILLNEED", "POPULATE_READ")


def prefetching(hints: pd.DataFrame) -> pd.Series:
    """Per hint row: a prefetching hint (fadvise / madvise WILLNEED, madvise POPULATE_READ,
    readahead(2))."""
    return hints["advice"].isin(PREFETCH_ADVICE) | (hints["call"] == "readahead")


@dataclass
class HintCover:
    """The union of the hint calls' [entry, exit] spans as sorted, disjoint intervals, and the
    covered ns before each (int64 ns throughout: exact)."""

    starts: np.ndarray
    ends: np.ndarray
    before: np.ndarray

    @classmethod
    def of(cls, hints: pd.DataFrame | None, pids, read_paths, tids=None) -> "HintCover | None":
        """The prefetching hints of processes ``pids`` (threads ``tids``: all when None) on
        ``read_paths``; None when there is none."""
        m = _prefetch_rows(hints, pids, read_paths)
        return None if m is None else cls.of_rows(hints, m, tids)

    @classmethod
    def of_rows(cls, hints: pd.DataFrame, rows: np.ndarray, tids=None) -> "HintCover | None":
        """The hints of the rows ``rows`` marks (threads ``tids``: all when None)."""
        m = rows if tids is None else rows & hints["tid"].isin([int(t) for t in tids]).to_numpy(dtype=bool)
        if not m.any():
            return None
        ts = hints["ts_ns"].to_numpy(np.int64)[m]
        te = ts + hints["dur_ns"].to_numpy(np.int64)[m]
        o = np.argsort(ts, kind="stable")
        ts, te = ts[o], te[o]
        reach = np.maximum.accumulate(te)
        new = np.flatnonzero(np.r_[True, ts[1:] > reach[:-1]])  # a span that begins a union interval
        starts = ts[new]
        ends = np.maximum.reduceat(te, new)
        lengths = ends - starts
        before = np.zeros(len(starts), dtype=np.int64)
        np.cumsum(lengths[:-1], out=before[1:])
        return cls(starts, ends, before)

    @property
    def total_ns(self) -> int:
        return int((self.ends - self.starts).sum())

    def upto(self, t: np.ndarray) -> np.ndarray:
        """Covered ns up to each instant of ``t`` (int64)."""
        t = np.asarray(t, dtype=np.int64)
        k = np.searchsorted(self.starts, t, side="right") - 1
        kk = np.maximum(k, 0)
        inside = np.clip(t - self.starts[kk], 0, self.ends[kk] - self.starts[kk])
        return np.where(k >= 0, self.before[kk] + inside, 0)

    def within(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Covered ns in each [a, b] (0 where b <= a), float64."""
        return np.clip(self.upto(b) - self.upto(a), 0, None).astype(np.float64)

    def overlaps(self, lo: int, hi: int) -> bool:
        """Some hint span meets [lo, hi]."""
        k = int(np.searchsorted(self.starts, hi, side="right"))
        return k > 0 and int(self.ends[k - 1]) >= lo  # disjoint, sorted: the ends increase


def _prefetch_rows(hints: pd.DataFrame | None, pids, read_paths) -> np.ndarray | None:
    """Per hint row: a prefetching hint with time in it, of ``pids``, on ``read_paths``."""
    need = {"ts_ns", "dur_ns", "pid", "tid", "call", "advice", "path"}
    if hints is None or not len(hints) or not need <= set(hints.columns):
        return None
    paths = {p for p in read_paths if isinstance(p, str) and p}
    dur = hints["dur_ns"].fillna(0).to_numpy(np.int64)
    m = (prefetching(hints).to_numpy(dtype=bool) & hints["path"].astype(object).isin(paths).to_numpy(dtype=bool)
         & hints["pid"].isin([int(p) for p in pids]).to_numpy(dtype=bool) & (dur > 0))
    return m if m.any() else None


@dataclass
class StepHints:
    """Per batch, the hints of the thread its step waits on: ``step_tid`` per batch (-1: not
    known) and a :class:`HintCover` per step thread, key -1 for the reading threads' hints."""

    step_tid: np.ndarray
    covers: dict

    @classmethod
    def of(cls, hints: pd.DataFrame | None, pids, read_paths, step_tid: np.ndarray,
           reader_tids) -> "StepHints | None":
        rows = _prefetch_rows(hints, pids, read_paths)
        if rows is None:
            return None
        step_tid = np.asarray(step_tid, dtype=np.int64)
        covers = {}
        for t in np.unique(step_tid).tolist():
            c = HintCover.of_rows(hints, rows, reader_tids if t < 0 else [t])
            if c is not None:
                covers[int(t)] = c
        return cls(step_tid, covers) if covers else None

    def groups(self, batches: slice) -> list[tuple[np.ndarray, HintCover]]:
        """(mask of the slice's batches, the cover of their step thread), one per step thread."""
        st = self.step_tid[batches]
        return [(st == t, c) for t, c in self.covers.items() if (st == t).any()]


def hint_time(steps: StepHints, batches: slice, batch: np.ndarray, firsts: np.ndarray, s: np.ndarray,
              reach: np.ndarray, gap: np.ndarray, bstart: np.ndarray, bend: np.ndarray, latest: np.ndarray,
              pre: np.ndarray, post: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Hint time of each batch's step thread inside each stretch with no read in flight of
    batches ``batches`` (events ``s``, their batch ``batch`` relative to the slice, ``firsts``;
    per event the gap before it, per batch the stretch before its first read and after its
    last): (per event, per batch before, per batch after); None when no hint meets them."""
    in_gap = in_pre = in_post = None
    for bmask, cover in steps.groups(batches):
        if not cover.overlaps(int(bstart[0]), int(bend[-1])):
            continue
        if in_gap is None:
            in_gap, in_pre, in_post = np.zeros(len(s)), np.zeros(len(pre)), np.zeros(len(post))
        in_gap += in_gaps(cover, s, reach, gap) * bmask[batch]
        in_pre += np.minimum(cover.within(bstart, s[firsts]), pre) * bmask
        in_post += np.minimum(cover.within(latest, bend), post) * bmask
    return None if in_gap is None else (in_gap, in_pre, in_post)


def in_gaps(hints: HintCover, s: np.ndarray, reach: np.ndarray, gap: np.ndarray) -> np.ndarray:
    """Per event, the hint time inside the gap before it (``gap[i]``: the time between the
    latest exit before event i, ``reach[i - 1]``, and its entry ``s[i]``; 0 where none)."""
    a = np.empty(len(s), dtype=np.int64)
    if len(s):
        a[0] = s[0]
        a[1:] = reach[:-1]
    return np.minimum(hints.within(a, s), gap)
