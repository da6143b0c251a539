"""Batches with no read event: a memory-mapped reader whose rows were all mapped and resident.

A gather from mapped, resident pages makes no syscall and no page fault, so a marked batch can
hold no read event at all.  Its wall time is still the step's: the submitting thread was either
on a CPU (gathering rows from the mapping: cpu-copy) or off it (waiting for pool workers, a
future, the GIL, or a CPU: python-scheduling).  The off-CPU spans of the submitting thread
(``samples/offcpu``, probes/sched.bpf.c) tell the two apart; without them the whole batch is
counted as the on-CPU gather, and the summary says so.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from engramprof.analysis.attribute import BatchAccumulator


def fault_read_path(calls: pd.DataFrame, meta: dict) -> bool:
    """Did this recording trace page faults (so a batch may have no read event)?"""
    paths = meta.get("read_paths")
    if isinstance(paths, (list, tuple)) and "fault" in paths:
        return True
    if meta.get("fault_probe"):  # the recorder attached the page-fault probe (probes/faults.bpf.c)
        return True
    kind = calls["kind"] if "kind" in calls.columns else None
    if kind is None or not len(kind):
        return False
    if isinstance(kind.dtype, pd.CategoricalDtype):
        return "fault" in set(kind.cat.categories) and bool((kind == "fault").any())
    return bool((kind == "fault").any())


def offcpu_overlap(spans: pd.DataFrame, tid: int, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Per interval [start, end], the off-CPU time of thread ``tid`` inside it (ns)."""
    own = spans[spans["tid"] == tid]
    if not len(own) or not len(start):
        return np.zeros(len(start))
    s = own["start_ns"].to_numpy(np.int64)
    e = own["end_ns"].to_numpy(np.int64)
    o = np.argsort(s, kind="stable")
    s, e = s[o], np.maximum(e[o], s[o])
    e = np.maximum.accumulate(e)  # one thread's spans do not overlap; guard anyway
    s = np.maximum(s, np.r_[np.iinfo(np.int64).min, e[:-1]])
    length = np.clip(e - s, 0, None).astype(np.float64)
    before = np.r_[0.0, np.cumsum(length)]  # off-CPU time before span k

    def cumulative(t: np.ndarray) -> np.ndarray:
        k = np.searchsorted(s, t, side="right") - 1
        ok = k >= 0
        kk = np.maximum(k, 0)
        inside = np.clip(t - s[kk], 0, length[kk])
        return np.where(ok, before[kk] + inside, 0.0)

    return np.clip(cumulative(end.astype(np.int64)) - cumulative(start.astype(np.int64)), 0, None)


def attribute_unread_batches(acc: BatchAccumulator, seg, empty: np.ndarray, offcpu: pd.DataFrame | None,
                             notes: list[str]) -> dict:
    """Split the wall time of the batches in ``empty`` into python-scheduling (the submitting
    thread off-CPU) and cpu-copy (on a CPU: the gather).  Returns the summary's figures."""
    idx = np.flatnonzero(empty)
    if not len(idx):
        return {"batches": 0, "source": None}
    start, end = seg.start_ns[idx].astype(np.int64), seg.end_ns[idx].astype(np.int64)
    wall = (end - start).astype(np.float64)
    tids = seg.submit_tid[idx] if seg.submit_tid is not None else np.full(len(idx), -1)
    off = np.zeros(len(idx))
    known = np.zeros(len(idx), dtype=bool)
    if offcpu is not None and len(offcpu):
        for tid in np.unique(tids[tids >= 0]):
            sel = tids == tid
            off[sel] = offcpu_overlap(offcpu, int(tid), start[sel], end[sel])
            known[sel] = True
    off = np.minimum(off, wall)
    acc.cause_ns["python-scheduling"][idx] += off
    acc.cause_ns["cpu-copy"][idx] += wall - off
    acc.before_first_read[idx] += off  # no read in flight at all: all of it is time without a read
    acc.loop_gap[idx] += wall - off
    n = len(idx)
    source = ("offcpu spans of the submitting thread" if known.all()
              else "none (counted as the on-CPU gather)" if not known.any() else "offcpu spans for some batches")
    notes.append(f"{n} batch(es) had no read event (no syscall, no page fault): rows served from mapped, resident "
                 "pages; their time is the submitting thread's gather on a CPU (cpu-copy) and its waits off it "
                 "(python-scheduling)" + ("" if known.all() else
                                          ": without off-CPU spans of that thread (samples/offcpu, the marker's tid) "
                                          "the waits cannot be seen and all of it is counted as the gather"))
    return {"batches": int(n), "source": source, "offcpu_share": float(off.sum() / wall.sum()) if wall.sum() > 0 else 0.0}
