"""Stage 4: which threads read in which batches, and which one submits the batches.

The submitting thread is the marker's ``tid`` when the application wrote one, else the one
thread that reads in at least SUBMITTER_COVERAGE of the batches (a serial or NOWAIT-first
reader); else every reading thread is a pool worker.  Threads are handled as small integer
codes (one factorisation of the tid column), so nothing here loops over events in Python.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from engramprof.analysis.events import ReadEvents, chunk_plan
from engramprof.units import pct

#: without a marker tid, a thread reading in at least this share of the batches is taken to be
#: the submitting thread (a serial or NOWAIT-first reader); else every reading thread is a worker
SUBMITTER_COVERAGE = 0.9
#: batches x threads at most this many cells are counted in a dense matrix (else by sorting)
_DENSE_CELLS = 1 << 26
NO_THREAD = -2  # a code no event has


@dataclass
class ReadingThreads:
    """``code``: each event's thread code in entry-time order; ``tids``: the tid of a code."""

    code: np.ndarray  # int32 per event position
    tids: np.ndarray  # tid of each code
    per_batch: np.ndarray  # distinct reading threads per batch
    in_batches: np.ndarray  # tids (sorted) that read in at least one batch
    submitter: np.ndarray  # per batch, the submitting thread's code (NO_THREAD: none)
    submitter_info: dict
    processes: int  # distinct pids among the events in batches (0: no pid column)
    native: np.ndarray | None = None  # per code: a native thread (engramprof.analysis.thread_kinds); None: none

    def code_of(self, tid: int) -> int:
        hit = np.flatnonzero(self.tids == tid)
        return int(hit[0]) if len(hit) else NO_THREAD


#: integer ids (tid, pid) below this are coded through a lookup table (O(n), no hashing)
_LOOKUP_MAX = 1 << 24
_SLICE = 1 << 20


def _codes_in_order(events: ReadEvents, name: str) -> tuple[np.ndarray, np.ndarray]:
    values = events.cols.calls[name].to_numpy()
    if np.issubdtype(values.dtype, np.integer) and len(values) and 0 <= values.min() and values.max() < _LOOKUP_MAX:
        # counted and coded a slice at a time: NumPy casts indices to intp, a slice's copy is small
        top = int(values.max())
        counts = np.zeros(top + 1, dtype=np.int64)
        for i in range(0, len(values), _SLICE):
            counts += np.bincount(values[i:i + _SLICE], minlength=top + 1)
        present = counts > 0
        uniques = np.flatnonzero(present)
        lookup = (np.cumsum(present, dtype=np.int64) - 1).astype(_code_type(len(uniques)))
        code = np.empty(len(values), dtype=lookup.dtype)
        for i in range(0, len(values), _SLICE):
            code[i:i + _SLICE] = lookup[values[i:i + _SLICE]]
        return events.cols.in_order(code), uniques
    c, uniques = pd.factorize(values, use_na_sentinel=True)
    uniques = np.asarray(uniques)
    if (c < 0).any():  # a missing value is one more "thread" of its own
        c = np.where(c < 0, len(uniques), c)
        uniques = np.r_[uniques.astype(np.float64), np.nan]
    return events.cols.in_order(c.astype(_code_type(len(uniques)))), uniques


def _code_type(n_codes: int) -> np.dtype:
    """The smallest signed integer holding codes 0..n_codes-1 (1 byte an event for a pool of
    threads, not 4: 30 MB less at 10M events)."""
    return np.dtype(np.int8 if n_codes <= 127 else np.int16 if n_codes <= 32767 else np.int32)


def _coverage(seg, code: np.ndarray, n_codes: int) -> tuple[np.ndarray, np.ndarray]:
    """(batches each code reads in, distinct codes per batch)."""
    nb = seg.n
    width = max(n_codes, 1)
    if nb * width <= _DENSE_CELLS:
        seen = np.zeros(nb * width, dtype=bool)
        for ch in chunk_plan(seg):  # each chunk counts only its own batches' cells
            key = ch.batch.astype(np.int64) * width + ch.pick(code[ch.lo:ch.hi])
            seen[ch.first_batch * width:ch.stop_batch * width] = np.bincount(key, minlength=ch.n_batches * width) > 0
        seen = seen.reshape(nb, width)
        return seen.sum(axis=0), seen.sum(axis=1)
    pairs = []
    for ch in chunk_plan(seg):
        pairs.append(np.unique((ch.batch + ch.first_batch).astype(np.int64) * n_codes + ch.pick(code[ch.lo:ch.hi])))
    p = np.unique(np.concatenate(pairs)) if pairs else np.empty(0, np.int64)
    return np.bincount(p % n_codes, minlength=n_codes), np.bincount(p // n_codes, minlength=nb)


def _present(tids: np.ndarray, coverage: np.ndarray) -> np.ndarray:
    t = tids[coverage[:len(tids)] > 0]
    return np.sort(t[pd.notna(t)].astype(np.int64))


def find_reading_threads(events: ReadEvents, seg) -> ReadingThreads:
    """Thread codes, threads per batch, and the submitting thread of each batch."""
    code, tids = _codes_in_order(events, "tid")
    coverage, per_batch = _coverage(seg, code, len(tids))
    nb = seg.n
    info: dict = {"tid": None, "source": "none"}
    submit = np.full(nb, NO_THREAD, dtype=np.int64)
    if len(coverage) and nb:
        k = int(np.argmax(coverage))
        if coverage[k] >= SUBMITTER_COVERAGE * nb and int((coverage >= SUBMITTER_COVERAGE * nb).sum()) == 1:
            submit[:] = k
            info = {"tid": int(tids[k]), "source": f"inferred: reads in {pct(coverage[k] / nb)} of the batches"}
    threads = ReadingThreads(code=code, tids=tids, per_batch=per_batch,
                             in_batches=_present(tids, coverage), submitter=submit,
                             submitter_info=info, processes=0)
    if seg.submit_tid is not None:
        given = seg.submit_tid >= 0
        if given.any():
            vals, inverse, cnt = np.unique(seg.submit_tid[given], return_inverse=True, return_counts=True)
            submit[given] = np.array([threads.code_of(int(t)) for t in vals], dtype=np.int64)[inverse]
            threads.submitter_info = {"tid": int(vals[np.argmax(cnt)]),  # the most frequent one
                                      "source": "markers" + ("" if given.all() else " (some markers lack it)")}
    pids = events.cols.calls["pid"] if "pid" in events.cols.calls.columns else None
    if pids is not None and len(pids) and pids.min() == pids.max():
        threads.processes = 1  # one process: nothing to count per batch
    elif pids is not None:
        pcode, puniq = _codes_in_order(events, "pid")
        pcov, _ = _coverage(seg, np.maximum(pcode, 0), max(len(puniq), 1))
        threads.processes = int((pcov > 0).sum())
    return threads
