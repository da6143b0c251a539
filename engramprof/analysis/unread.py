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
from engramprof.analysis.components import exit_holders
from engramprof.analysis.events import chunk_plan
from engramprof.analysis.hint_calls import StepHints, hint_time


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


def _span_groups(offcpu: pd.DataFrame, kinds: pd.DataFrame | None) -> tuple[np.ndarray, np.ndarray] | None:
    """Per off-CPU span: (a native thread woke it, a thread of the process that is not native
    woke it); None: no native thread known."""
    if kinds is None or "waker_tid" not in offcpu.columns:
        return None
    native = kinds.loc[kinds["kind"] == "native", "tid"].to_numpy(np.int64)
    if not len(native):
        return None
    waker = offcpu["waker_tid"].to_numpy(np.int64)
    by_native = np.isin(waker, native)
    by_own = np.isin(waker, kinds["tid"].to_numpy(np.int64)) & ~by_native
    return by_native, by_own


def native_pool_batches(offcpu: pd.DataFrame, kinds: pd.DataFrame, submitters: np.ndarray, start: np.ndarray,
                        end: np.ndarray) -> np.ndarray:
    """Per batch [start, end]: a native thread ran in it (came back on a CPU) and no thread of
    the process but the submitter that is not native did -- the batch's work ran on a native
    pool, so the submitter's waits for a CPU were that pool's."""
    native = kinds.loc[kinds["kind"] == "native", "tid"].to_numpy(np.int64)
    tid = offcpu["tid"].to_numpy(np.int64)
    t_in = offcpu["end_ns"].to_numpy(np.int64)
    others = ~np.isin(tid, submitters)
    is_nat = np.isin(tid, native)

    def ran(mask: np.ndarray) -> np.ndarray:
        t = np.sort(t_in[mask])
        return np.searchsorted(t, end, side="right") - np.searchsorted(t, start, side="left")

    return (ran(others & is_nat) > 0) & (ran(others & ~is_nat) == 0)


def attribute_unread_batches(acc: BatchAccumulator, seg, empty: np.ndarray, offcpu: pd.DataFrame | None,
                             notes: list[str], kinds: pd.DataFrame | None = None) -> dict:
    """Split the wall time of the batches in ``empty`` into python-scheduling (the submitting
    thread off-CPU) and cpu-copy (on a CPU: the gather).  An off-CPU span that a native thread
    ended (its waker: an OpenMP worker, a library's pool, thread_kinds.py) was a wait for that
    pool's work: a native pool wait, counted with the work (cpu-copy), not python-scheduling.
    Returns the summary's figures."""
    idx = np.flatnonzero(empty)
    if not len(idx):
        return {"batches": 0, "source": None}
    start, end = seg.start_ns[idx].astype(np.int64), seg.end_ns[idx].astype(np.int64)
    wall = (end - start).astype(np.float64)
    tids = seg.submit_tid[idx] if seg.submit_tid is not None else np.full(len(idx), -1)
    off = np.zeros(len(idx))
    nat = np.zeros(len(idx))
    known = np.zeros(len(idx), dtype=bool)
    if offcpu is not None and len(offcpu):
        groups = _span_groups(offcpu, kinds)
        pool = (native_pool_batches(offcpu, kinds, np.unique(tids), start, end) if groups is not None
                else np.zeros(len(idx), dtype=bool))
        for tid in np.unique(tids[tids >= 0]):
            sel = tids == tid
            off[sel] = offcpu_overlap(offcpu, int(tid), start[sel], end[sel])
            if groups is not None:
                # woken by a native thread: waited for it; woken by none of the process's threads
                # (a CPU it waited for, a timer): the pool's when the batch ran on a native pool
                by_native, by_own = groups
                woke = offcpu_overlap(offcpu[by_native], int(tid), start[sel], end[sel])
                other = offcpu_overlap(offcpu[~by_native & ~by_own], int(tid), start[sel], end[sel])
                nat[sel] = woke + np.where(pool[sel], other, 0.0)
            known[sel] = True
    off = np.minimum(off, wall)
    nat = np.minimum(nat, off)
    off = off - nat
    acc.native_wait[idx] += nat
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
    return {"batches": int(n), "source": source, "offcpu_share": float(off.sum() / wall.sum()) if wall.sum() > 0 else 0.0,
            "native_pool_wait_share": float(nat.sum() / wall.sum()) if wall.sum() > 0 else 0.0}


def _kind_is_fault(events, lo: int, hi: int) -> np.ndarray | None:
    if not events.cols.has("kind"):
        return None
    k = events.cols.series("kind", lo, hi)
    return (k.astype(object) == "fault").to_numpy() if len(k) else np.zeros(0, dtype=bool)


def resplit_fault_gaps(acc: BatchAccumulator, events, seg, threads, offcpu: pd.DataFrame | None,
                       loop_gap_us: float, notes: list[str], hints: StepHints | None = None) -> dict:
    """A gather split across a pool faults on its workers: the time with no fault in flight
    before a worker's fault is that worker gathering rows on a CPU (cpu-copy) while it is on
    one, and waiting (a GIL hand-off, a CPU it did not get: python-scheduling) while it is off
    one.  Stage 5 counts a gap between reads as the reading thread's loop up to ``loop_gap_us``
    and the rest as a hand-off, the right rule for a pool's syscalls (the executor machinery
    runs between them) but not for a gather; here each gap that a page fault ends is split by
    the off-CPU spans of the faulting thread inside it instead.  Adjusts ``acc`` in place
    (loop_gap / handoff_gap and cpu-copy / python-scheduling move together); returns what it did.
    ``hints``: the target's prefetch hints, whose time stage 5 took out of the gaps first (the
    same is taken out here)."""
    out = {"gaps": 0, "moved_ms": 0.0, "source": None}
    if offcpu is None or not len(offcpu) or seg.n == 0:
        return out
    loop_gap_ns = loop_gap_us * 1e3
    bend_all = seg.end_ns.astype(np.int64)
    submit = threads.submitter
    moved = 0.0
    gaps = 0
    for ch in chunk_plan(seg):
        fault = _kind_is_fault(events, ch.lo, ch.hi)
        if fault is None:
            return out
        fault = ch.pick(fault)
        if not fault.any():
            continue
        s = ch.pick(events.ts[ch.lo:ch.hi]).astype(np.int64)
        e = np.minimum(s + ch.pick(events.dur[ch.lo:ch.hi]).astype(np.int64), bend_all[ch.batches][ch.batch])
        tcode = ch.pick(threads.code[ch.lo:ch.hi])
        n = len(s)
        reach = np.maximum.accumulate(e)
        holder = exit_holders(e, reach)
        gap = np.zeros(n)
        gap[1:] = np.clip(s[1:] - reach[:-1], 0, None)
        gap[ch.firsts] = 0.0
        if hints is not None:
            bs, be = seg.start_ns[ch.batches].astype(np.int64), bend_all[ch.batches]
            latest = np.maximum.reduceat(e, ch.firsts)
            zero = np.zeros(ch.n_batches)
            hinted = hint_time(hints, ch.batches, ch.batch, ch.firsts, s, reach, gap, bs, be, latest, zero, zero)
            if hinted is not None:
                gap = gap - hinted[0]
        same_thread = np.zeros(n, dtype=bool)
        same_thread[1:] = tcode[1:] == tcode[holder[:-1]]
        on_submitter = tcode == submit[ch.batches][ch.batch]
        old_loop = np.where(same_thread, np.where(on_submitter, gap, np.minimum(gap, loop_gap_ns)), 0.0)
        native = threads.native[tcode] if threads.native is not None else np.zeros(n, dtype=bool)
        # a native thread's gaps were counted as its pool's work in stage 5 (thread_kinds.py)
        sel = np.flatnonzero(fault & (gap > 0) & ~on_submitter & ~native)
        if not len(sel):
            continue
        off = np.zeros(len(sel))
        tids = threads.tids[tcode[sel]]
        for tid in np.unique(tids):
            k = tids == tid
            off[k] = offcpu_overlap(offcpu, int(tid), s[sel][k] - gap[sel][k].astype(np.int64), s[sel][k])
        off = np.minimum(off, gap[sel])
        delta = np.zeros(n)
        delta[sel] = (gap[sel] - off) - old_loop[sel]  # the new on-CPU gather less what stage 5 gave it
        per = ch.per_batch(delta)
        acc.loop_gap[ch.batches] += per
        acc.handoff_gap[ch.batches] -= per
        acc.cause_ns["cpu-copy"][ch.batches] += per
        acc.cause_ns["python-scheduling"][ch.batches] -= per
        moved += float(per.sum())
        gaps += len(sel)
    if gaps:
        out = {"gaps": int(gaps), "moved_ms": moved / 1e6, "source": "offcpu spans of the faulting threads"}
        notes.append(f"{gaps} gap(s) with no fault in flight before a pool worker's page fault were split by that "
                     "worker's off-CPU spans: on a CPU it was gathering rows (cpu-copy), off it waiting "
                     "(python-scheduling)")
    return out
