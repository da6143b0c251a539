"""Batches in which the target brought pages of its own files into the page cache outside its
read events (docs/model.md, section 3, "Miss context").

A read that sleeps on a page another of the target's threads is reading in inserted nothing
itself: its wait is a miss's all the same.  The analysis counts a read's voluntary sleep as a
miss wait when the read missed or its batch had a read that missed; a reader that hints first
and reads after (pyarrow's Parquet reader: ``posix_fadvise(WILLNEED)`` of the row groups on the
calling thread, then ``pread64`` of them on its I/O threads) inserts every page in the hint, so
no read event of the batch missed and the waits were "unexplained".  samples/pagecache (the
page-cache probe's insertion runs, every thread of the target, inside hints or not) says which
batches the target inserted pages in: those are in a miss context too.
"""
from __future__ import annotations

import numpy as np
import pandas as pd


def inserting_batches(pagecache: pd.DataFrame | None, read_paths, start_ns: np.ndarray,
                      end_ns: np.ndarray) -> np.ndarray | None:
    """Per batch (``start_ns``/``end_ns``, sorted and disjoint), whether an insertion run of the
    target into one of ``read_paths`` (the files its read events read) overlaps it.  None: no
    page-cache samples (the probe did not run, an older bundle), or no such run."""
    if pagecache is None or not len(pagecache) or not len(start_ns) \
            or not {"event", "target", "path", "ts_ns"} <= set(pagecache.columns):
        return None
    paths = {p for p in read_paths if isinstance(p, str) and p}
    m = (pagecache["event"] == "insert").to_numpy() & pagecache["target"].astype(bool).to_numpy()
    m &= pagecache["path"].astype(object).isin(paths).to_numpy()
    if not m.any():
        return None
    ts = pagecache["ts_ns"].to_numpy(np.int64)[m]
    dur = pagecache["dur_ns"].to_numpy(np.int64)[m] if "dur_ns" in pagecache.columns else np.zeros(len(ts), np.int64)
    te = ts + np.maximum(dur, 0)
    start, end = np.asarray(start_ns, np.int64), np.asarray(end_ns, np.int64)
    # the batches a run [ts, te] overlaps: from the first whose end is >= ts to the last whose
    # start is <= te (a difference array over batch indices)
    lo = np.searchsorted(end, ts, side="left")
    hi = np.searchsorted(start, te, side="right")
    ok = lo < hi
    if not ok.any():
        return None
    mark = np.zeros(len(start) + 1, dtype=np.int64)
    np.add.at(mark, lo[ok], 1)
    np.add.at(mark, hi[ok], -1)
    return np.cumsum(mark[:-1]) > 0
