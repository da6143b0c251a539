"""Running aggregates of the recorded calls, for the live view and the final summary.

Updated once per drain from a batch, vectorised (bincount per file / tensor code); the 10
slowest calls are kept by looking only at records that beat the current 10th.
"""
from __future__ import annotations

import errno
import os
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from engramprof.record.decode import ReadBatch
from engramprof.record.strings import Interner

# user-space latency histogram: 32 sub-buckets per power of two of ns (~2% resolution)
_SUB = 32
SLOWEST = 10


def _lat_index(ns: np.ndarray) -> np.ndarray:
    ns = np.maximum(ns.astype(np.float64), 1.0)
    e = np.floor(np.log2(ns))
    frac = ns / np.exp2(e) - 1.0
    return (e * _SUB + np.floor(frac * _SUB)).astype(np.int64)


def _lat_value(idx: np.ndarray | int) -> np.ndarray:
    idx = np.asarray(idx, dtype=np.float64)
    e = np.floor(idx / _SUB)
    sub = idx - e * _SUB
    return np.exp2(e) * (1.0 + (sub + 0.5) / _SUB)


class LatencyHist:
    """Mergeable log-linear histogram of call durations (ns)."""

    def __init__(self):
        self.counts = np.zeros(64 * _SUB, dtype=np.int64)
        self.max_ns = 0
        self.n = 0

    def add(self, ns: np.ndarray, index: np.ndarray | None = None) -> None:
        """Add durations (``index``: their _lat_index, when the caller has it already)."""
        if len(ns) == 0:
            return
        idx = _lat_index(ns) if index is None else index
        self.counts += np.bincount(idx, minlength=len(self.counts))[: len(self.counts)]
        self.max_ns = max(self.max_ns, int(ns.max()))
        self.n += len(ns)

    def quantile(self, q: float) -> float:
        if self.n == 0:
            return float("nan")
        c = np.cumsum(self.counts)
        i = int(np.searchsorted(c, q * self.n, side="left"))
        return float(min(_lat_value(i), self.max_ns))


@dataclass
class FileStat:
    calls: int = 0
    total_ns: int = 0
    max_ns: int = 0
    misses: int = 0
    eagain: int = 0


@dataclass
class LiveState:
    """What the live view and the summary read; updated once per drain."""

    started_ns: int = 0
    recorded: int = 0
    eagain: int = 0
    nowait: int = 0
    pages_added: int = 0
    calls_with_misses: int = 0
    bio_ns: int = 0
    reclaim_ns: int = 0
    offcpu_ns: int = 0
    runq_ns: int = 0
    hist: LatencyHist = field(default_factory=LatencyHist)
    files: dict = field(default_factory=dict)
    tensors: dict = field(default_factory=dict)
    slowest: pd.DataFrame | None = None
    # per-second window for the live view
    window_calls: int = 0
    window_eagain: int = 0
    window_nowait: int = 0
    window_hist: LatencyHist = field(default_factory=LatencyHist)

    def reset_window(self) -> None:
        self.window_calls = self.window_eagain = self.window_nowait = 0
        self.window_hist = LatencyHist()


def _add_stats(into: dict, names: list, codes: np.ndarray, dur: np.ndarray, miss: np.ndarray,
               eagain: np.ndarray) -> None:
    """Per-name running totals (files, tensors) from one drain, vectorised over codes."""
    m = len(names)
    calls = np.bincount(codes, minlength=m)
    total = np.bincount(codes, weights=dur, minlength=m)
    nmiss = np.bincount(codes, weights=miss, minlength=m)
    neag = np.bincount(codes, weights=eagain, minlength=m)
    mx = np.zeros(m, dtype=np.int64)
    np.maximum.at(mx, codes, dur)
    for code in np.nonzero(calls)[0].tolist():
        fs = into.setdefault(names[code], FileStat())
        fs.calls += int(calls[code])
        fs.total_ns += int(total[code])
        fs.max_ns = max(fs.max_ns, int(mx[code]))
        fs.misses += int(nmiss[code])
        fs.eagain += int(neag[code])


class LiveAccount:
    """Folds each enriched batch into a :class:`LiveState`."""

    def __init__(self, state: LiveState, paths: Interner, tensors: Interner):
        self.state = state
        self.paths = paths
        self.tensors = tensors

    def add(self, batch: ReadBatch) -> None:
        s = self.state
        recs = batch.recs
        codes, tcodes = batch.cols["path"], batch.cols["tensor"]
        dur = recs["dur_ns"].astype(np.int64)
        n = len(recs)
        is_eagain = recs["ret"] == -errno.EAGAIN
        n_eagain = int(is_eagain.sum())
        nowait = int(((recs["flags"] & os.RWF_NOWAIT) != 0).sum())
        misses = recs["pages_added"]
        s.recorded += n
        s.eagain += n_eagain
        s.nowait += nowait
        s.pages_added += int(misses.sum())
        s.calls_with_misses += int((misses > 0).sum())
        s.bio_ns += int(recs["bio_ns"].sum())
        s.reclaim_ns += int(recs["reclaim_ns"].sum())
        s.offcpu_ns += int(recs["offcpu_ns"].sum())
        s.runq_ns += int(recs["runq_ns"].sum())
        idx = _lat_index(dur)  # once for both histograms
        s.hist.add(dur, idx)
        s.window_calls += n
        s.window_eagain += n_eagain
        s.window_nowait += nowait
        s.window_hist.add(dur, idx)
        _add_stats(s.files, self.paths.values, codes, dur, misses > 0, is_eagain)
        if (tcodes != 0).any():  # safetensors tensors (code 0 = no tensor)
            t = tcodes != 0
            _add_stats(s.tensors, self.tensors.values, tcodes[t], dur[t], (misses > 0)[t], is_eagain[t])
        self._keep_slowest(batch, dur)

    def _keep_slowest(self, batch: ReadBatch, dur: np.ndarray) -> None:
        """The 10 slowest calls so far: only records beating the current 10th are looked at."""
        s = self.state
        floor = int(s.slowest["dur_ns"].min()) if s.slowest is not None and len(s.slowest) >= SLOWEST else -1
        top = np.nonzero(dur > floor)[0]
        if len(top) > SLOWEST:
            top = top[np.argpartition(dur[top], len(top) - SLOWEST)[-SLOWEST:]]
        if not len(top):
            return
        r = batch.recs[top]
        paths = np.asarray(self.paths.values, dtype=object)
        tensors = np.asarray(self.tensors.values, dtype=object)
        cand = pd.DataFrame({
            "ts_ns": r["ts_ns"].astype(np.int64), "dur_ns": dur[top], "tid": r["tid"].astype(np.int64),
            "path": paths[batch.cols["path"][top]],
            "offset": r["offset"], "size": r["size"].astype(np.int64), "ret": r["ret"],
            "pages_added": r["pages_added"].astype(np.int64), "bio_count": r["bio_count"].astype(np.int64),
            "bio_ns": r["bio_ns"].astype(np.int64), "reclaim_ns": r["reclaim_ns"].astype(np.int64),
            "offcpu_ns": r["offcpu_ns"].astype(np.int64), "runq_ns": r["runq_ns"].astype(np.int64),
            "tensor": tensors[batch.cols["tensor"][top]], "row": batch.cols["row"][top].astype(np.int64),
        })
        s.slowest = (pd.concat([s.slowest, cand], ignore_index=True) if s.slowest is not None else cand).nlargest(SLOWEST, "dur_ns")
