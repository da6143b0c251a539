"""Per-call and per-batch time split into causes, and the verdict (``batch-tail``).

The model (README.md, "engramprof batch-tail", has the long form):

* A batch's wall time W is its marker span (markers) or first-call entry -> last-call exit
  (inferred).  W = time with no read in flight + the in-flight union U.
* Time with no read in flight is **python-scheduling** (futures, wake-ups, GIL hand-offs)
  except the reader's own work, counted as **cpu-copy**: a gap between two reads of the
  submitting thread (the marker's tid, else the thread reading in >= 90% of the batches), the
  first ``loop_gap_us`` of a gap between two reads of one pool worker, and the time before the
  first / after the last read of a marked batch when that read ran on the submitting thread.
* Each instant of U is shared equally among the calls in flight at that instant (a sweep over
  entry/exit events), so call c owns u_c of U and sum(u_c) = U.  u_c is split in the
  proportions of the call's own duration d_c:
    reclaim_ns -> reclaim;  the rest of offcpu_ns (voluntary waits) -> a miss wait when the
    call or its batch had misses, else unexplained;  runq_ns -> residency when the call slept
    on a miss (the wake-up: waiting for a CPU once the page is there), else python-scheduling
    (preemption, CPU contention);  on-CPU time (d - offcpu - reclaim) -> residency when the
    call inserted pages (the miss path), else cpu-copy (copying cached pages).
* A miss wait is split into storage and residency by how far the I/O exceeded normal service:
  storage fraction = max(0, 1 - normal / observed), observed = the service of one miss I/O as
  the call saw it: max(mean bio queue->complete, voluntary wait per bio) for a call that
  queued bios (a throttle holds bios before the block layer: only the wait shows it), its
  whole wait for a call waiting on another thread's I/O.  normal = ``--normal-miss-us`` or the
  median observed service of the calls that did their own I/O, capped at
  NORMAL_MISS_CEILING_US.
* Refault-driven misses: the share of miss time matching the system's workingset refaults
  per page inserted by the target in the same 10 Hz sample interval (capped at 1) moves from
  residency/storage to reclaim.
* Shares sum to 1 per batch.  Verdict: the largest of residency / reclaim / storage /
  python-scheduling when it reaches ``meaningful_share``, else healthy.

Vectorised numpy: no Python loop runs per call (one loop runs per sampled thread).
"""
from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple

import numpy as np
import pandas as pd

from engramprof import batches as _batches
from engramprof.errors import UserError
from engramprof.trace import CONTRACT_COLUMNS, EVIDENCE_COLUMNS

CAUSES = ("residency", "reclaim", "storage", "python-scheduling", "cpu-copy", "unexplained")
VERDICT_CAUSES = ("residency", "reclaim", "storage", "python-scheduling")
VERDICTS = VERDICT_CAUSES + ("healthy",)

DEFAULT_SLOW_MS = 4.0
#: a cause explains a "meaningful share" of batch time from this share on (else: healthy)
DEFAULT_MEANINGFUL_SHARE = 0.25
#: of a gap between two reads of one pool worker (not the submitting thread), this much is the
#: worker's own read loop (cpu-copy); the rest is executor machinery and GIL waits (a tight
#: Python preadv loop spends ~1-2 µs between calls, KERNEL.md)
DEFAULT_LOOP_GAP_US = 2.0
#: without a marker tid, a thread reading in at least this share of the batches is taken to be
#: the submitting thread (a serial or NOWAIT-first reader); else every reading thread is a worker
SUBMITTER_COVERAGE = 0.9
#: a miss I/O slower than this is never "normal device service" unless --normal-miss-us says so
NORMAL_MISS_CEILING_US = 1000.0
#: the tail: batches whose wall time is above this percentile
TAIL_PERCENTILE = 90.0
#: a call without misses on CPU longer than this is not a plausible cached copy (a few pages
#: copy in a few µs): noted as possible CPU steal (virtualised host) or lost evidence
SLOW_COPY_NS = 50_000
#: warn when unexplained time is at least this share of all batch time
UNEXPLAINED_NOTE_SHARE = 0.25
RWF_NOWAIT = 0x8
EAGAIN = 11

# sample tables and the columns this module reads from them (the samplers' contract)
SAMPLE_COLUMNS = {
    "threads": ["ts_ns", "tid", "ctx_voluntary", "ctx_involuntary"],
    "vmstat": ["ts_ns", "workingset_refault_file"],
    "psi": ["ts_ns", "resource", "some_us"],
    "cgroup": ["ts_ns", "refault_file"],
}


def col(cause: str) -> str:
    """Column-safe form of a cause name (python-scheduling -> python_scheduling)."""
    return cause.replace("-", "_")


class BatchTailResult(NamedTuple):
    batches: pd.DataFrame
    summary: dict


# ------------------------------------------------------------------ small helpers --

def _pct(a: np.ndarray, q: float) -> float | None:
    a = np.asarray(a, dtype=np.float64)
    a = a[np.isfinite(a)]
    return float(np.percentile(a, q)) if len(a) else None


def _ms_pair(a_ns: np.ndarray) -> dict:
    p50, p99 = _pct(a_ns, 50), _pct(a_ns, 99)
    return {"p50": None if p50 is None else p50 / 1e6, "p99": None if p99 is None else p99 / 1e6}


def _nan0(a: np.ndarray | None) -> np.ndarray | None:
    if a is None:
        return None
    return np.where(np.isfinite(a), a, 0.0)


def _safe_div(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    den = np.asarray(den, dtype=np.float64)
    return np.where(den > 0, np.asarray(num, dtype=np.float64) / np.where(den > 0, den, 1.0), 0.0)


def inflight_weights(s: np.ndarray, e: np.ndarray) -> np.ndarray:
    """Per call, its part of the in-flight union: each instant is shared equally among the
    calls in flight then.  ``s`` (entries) must be sorted; returns float64 ns, sum = union.

    A merge of the sorted entries with the sorted exits gives the concurrency k between
    consecutive events; F(t) = integral of 1/k over in-flight time; u_c = F(e_c) - F(s_c).
    At equal times entries sort before exits, so zero-length overlaps never drop k to 0.
    """
    n = len(s)
    if n == 0:
        return np.empty(0, dtype=np.float64)
    s = np.asarray(s, dtype=np.int64)
    e = np.asarray(e, dtype=np.int64)
    eo = np.argsort(e, kind="stable")
    es = e[eo]
    # merge the two sorted runs (a stable sort of two runs is one timsort merge); stability puts
    # an entry before an exit at the same time
    order = np.argsort(np.concatenate([s, es]), kind="stable")
    pos = np.empty(2 * n, dtype=np.int64)
    pos[order] = np.arange(2 * n)
    del order
    pos_s, pos_e_sorted = pos[:n], pos[n:]
    t = np.empty(2 * n, dtype=np.int64)
    t[pos_s] = s
    t[pos_e_sorted] = es
    delta = np.empty(2 * n, dtype=np.int64)
    delta[pos_s] = 1
    delta[pos_e_sorted] = -1
    k = np.cumsum(delta)[:-1]
    dt = np.diff(t).astype(np.float64)
    del t, delta
    w = np.where(k > 0, dt / np.maximum(k, 1), 0.0)
    del dt, k
    F = np.empty(2 * n, dtype=np.float64)
    F[0] = 0.0
    np.cumsum(w, out=F[1:])
    del w
    pos_e = np.empty(n, dtype=np.int64)
    pos_e[eo] = pos_e_sorted
    return F[pos_e] - F[pos_s]


def _distinct_per_batch(b: np.ndarray, nb: int, *cols: np.ndarray) -> np.ndarray:
    """Number of distinct tuples of the (non-negative int) ``cols`` per batch ``b``."""
    if len(b) == 0:
        return np.zeros(nb, dtype=np.int64)
    widths = [max(1, int(c.max()).bit_length()) for c in cols]
    total = sum(widths)
    if max(1, int(nb).bit_length()) + total <= 63:
        key = b.astype(np.int64) << total
        shift = total
        for c, w in zip(cols, widths):
            shift -= w
            key |= c.astype(np.int64) << shift
        key.sort()
        run = np.empty(len(key), dtype=bool)
        run[0] = True
        np.not_equal(key[1:], key[:-1], out=run[1:])
        return np.bincount(key[run] >> total, minlength=nb)
    frame = pd.DataFrame({"b": b, **{f"c{i}": c for i, c in enumerate(cols)}})
    dup = frame.duplicated().to_numpy()
    return np.bincount(b[~dup], minlength=nb)


def verdict_of(shares: dict, meaningful_share: float = DEFAULT_MEANINGFUL_SHARE) -> str:
    """The largest of residency / reclaim / storage / python-scheduling if it reaches
    ``meaningful_share`` of batch time, else ``healthy``."""
    best = max(VERDICT_CAUSES, key=lambda c: shares.get(c, 0.0) or 0.0)
    return best if (shares.get(best) or 0.0) >= meaningful_share else "healthy"


def _verdicts(share_matrix: np.ndarray, meaningful_share: float) -> np.ndarray:
    """Vectorised verdict_of over rows of shares in VERDICT_CAUSES order."""
    names = np.array(VERDICTS, dtype=object)
    if len(share_matrix) == 0:
        return np.empty(0, dtype=object)
    k = np.argmax(share_matrix, axis=1)
    best = share_matrix[np.arange(len(k)), k]
    return np.where(best >= meaningful_share, names[k], "healthy")


# ------------------------------------------------------------------------- inputs --

def _inputs(obj: Any, samples: dict | None, meta: dict | None):
    notes: list[str] = []
    if isinstance(obj, pd.DataFrame):
        calls = obj
        smp = dict(samples or {})

        def getter(name: str):
            return smp.get(name)

        return calls, getter, dict(meta or {}), notes
    if hasattr(obj, "calls") and isinstance(getattr(obj, "calls"), pd.DataFrame):
        notes.extend(getattr(obj, "notes", []) or [])
        smp = dict(samples or {})

        def getter(name: str):
            if name in smp:
                return smp[name]
            return obj.samples(name)

        return obj.calls, getter, dict(meta if meta is not None else (getattr(obj, "meta", {}) or {})), notes
    raise UserError("batch-tail: expected a trace or a per-call DataFrame")


def _sample(getter: Callable, name: str, notes: list[str], used: dict, missing: list[str]) -> pd.DataFrame | None:
    need = SAMPLE_COLUMNS[name]
    try:
        df = getter(name)
    except UserError as exc:
        notes.append(f"samples/{name} unreadable ({exc}); not used")
        missing.append(name)
        return None
    if df is None or len(df) == 0:
        missing.append(name)
        return None
    lacking = [c for c in need if c not in df.columns]
    if lacking:
        notes.append(f"samples/{name} lacks {', '.join(lacking)}; not used")
        missing.append(name)
        return None
    df = df[need].copy()
    for c in need:
        if c != "resource":
            df[c] = pd.to_numeric(df[c], errors="coerce")
    df = df.dropna()
    if len(df) == 0:
        missing.append(name)
        return None
    used[name] = list(need)
    return df


def _ctx_switches(thr: pd.DataFrame, tids: np.ndarray, bstart: np.ndarray, bend: np.ndarray):
    """Per batch, context switches of the reading threads, linearly interpolated from the
    cumulative per-thread counters (10 Hz samples: an estimate for ms-long batches)."""
    nb = len(bstart)
    vol = np.zeros(nb)
    inv = np.zeros(nb)
    covered = np.zeros(nb, dtype=bool)
    t = thr[thr["tid"].isin(tids)].sort_values(["tid", "ts_ns"], kind="stable")
    totals = {"voluntary": 0.0, "involuntary": 0.0, "threads_sampled": 0}
    x0, x1 = bstart.astype(np.float64), bend.astype(np.float64)
    for _, g in t.groupby("tid", sort=False):  # one iteration per thread, not per call
        x = g["ts_ns"].to_numpy(np.float64)
        if len(x) < 2:
            continue
        cv = g["ctx_voluntary"].to_numpy(np.float64)
        ci = g["ctx_involuntary"].to_numpy(np.float64)
        vol += np.interp(x1, x, cv) - np.interp(x0, x, cv)
        inv += np.interp(x1, x, ci) - np.interp(x0, x, ci)
        covered |= (x0 >= x[0]) & (x1 <= x[-1])
        totals["voluntary"] += float(max(0.0, cv[-1] - cv[0]))
        totals["involuntary"] += float(max(0.0, ci[-1] - ci[0]))
        totals["threads_sampled"] += 1
    vol = np.clip(vol, 0, None)
    inv = np.clip(inv, 0, None)
    return np.where(covered, vol + inv, np.nan), np.where(covered, inv, np.nan), totals


def _psi(psi: pd.DataFrame, t0: int, t1: int) -> dict:
    """Average PSI 'some' (% of time) per resource over the trace window.  ``some_us`` is the
    stall time in the interval ending at ``ts_ns`` (the samplers' contract), so the window's
    stall is the sum over the samples after the first one inside it."""
    out: dict = {}
    for res, g in psi.groupby("resource", sort=True):
        g = g.sort_values("ts_ns", kind="stable")
        x = g["ts_ns"].to_numpy(np.float64)
        y = g["some_us"].to_numpy(np.float64)
        inwin = (x >= t0) & (x <= t1 + 1e8)
        if inwin.sum() < 2:
            continue
        x, y = x[inwin], y[inwin]
        span_us = (x[-1] - x[0]) / 1e3
        if span_us > 0:
            out[str(res)] = round(100.0 * float(np.clip(y[1:], 0, None).sum()) / span_us, 3)
    return out


# ------------------------------------------------------------------- per-call work --

#: calls handled at a time (whole batches per chunk): bounds memory and keeps arrays cache-sized
CHUNK_CALLS = 1 << 20


class _Columns:
    """Per-call columns in entry-time order, read a slice at a time (no DataFrame copy).

    ``idx`` maps positions in that order to DataFrame rows (None when the DataFrame is
    already sorted and every row is usable)."""

    def __init__(self, calls: pd.DataFrame, idx: np.ndarray | None):
        self.calls = calls
        self.idx = idx
        self._has: dict[str, bool] = {}

    def has(self, name: str) -> bool:
        """The column exists and holds at least one value (a recorder writes an evidence
        column all-null when the kernel could not measure it)."""
        if name not in self._has:
            self._has[name] = name in self.calls.columns and bool(self.calls[name].notna().any())
        return self._has[name]

    def series(self, name: str, lo: int, hi: int) -> pd.Series:
        s = self.calls[name]
        return s.iloc[lo:hi] if self.idx is None else s.take(self.idx[lo:hi])

    def num(self, name: str, lo: int, hi: int) -> np.ndarray | None:
        if name not in self.calls.columns:
            return None
        s = self.series(name, lo, hi)
        if not pd.api.types.is_numeric_dtype(s.dtype):
            s = pd.to_numeric(s, errors="coerce")
        return s.to_numpy(dtype=np.float64, na_value=np.nan)

    def rows(self, pos: np.ndarray) -> np.ndarray:
        return pos if self.idx is None else self.idx[pos]


def _components(d, b, nbc, ev):
    """Split each call's duration d into components (ns, float64); they sum to d.

    R reclaim; Q run-queue wait (preemption: CPU contention); wake: run-queue wait of a call
    that slept on a miss (waiting for a CPU once its page is there: part of the miss's cost);
    wait_miss: voluntary off-CPU time in a miss context (the call or its batch had misses);
    unexpl: voluntary off-CPU time otherwise; miss_cpu: on-CPU time of a call with misses;
    copy: on-CPU time of a call without misses.  Without offcpu_ns the time left after R and
    the run-queue wait is a miss wait in calls with misses and unexplained otherwise."""
    pages, bio_n, recl, off, rq = ev["pages_added"], ev["bio_count"], ev["reclaim_ns"], ev["offcpu_ns"], ev["runq_ns"]
    n = len(d)
    R = np.clip(recl, 0, d) if recl is not None else np.zeros(n)
    Q = np.clip(rq, 0, d - R) if rq is not None else np.zeros(n)
    if pages is not None:
        miss = pages > 0
    elif bio_n is not None:
        miss = bio_n > 0
    else:
        miss = None
    ctx = (miss | (np.bincount(b, weights=miss, minlength=nbc) > 0)[b]) if miss is not None else None
    if off is not None:
        vol = np.clip(off - (rq if rq is not None else 0.0), 0, d - R - Q)
        oncpu = d - R - Q - vol
        if miss is not None:
            wait_miss = np.where(ctx, vol, 0.0)
            wake = np.where(ctx & (vol > 0), Q, 0.0)
            miss_cpu = np.where(miss, oncpu, 0.0)
        else:
            wait_miss = np.zeros(n)
            wake = np.zeros(n)
            miss_cpu = np.zeros(n)
        unexpl = vol - wait_miss
        copy = oncpu - miss_cpu
    else:
        rest = d - R - Q
        wait_miss = np.where(miss, rest, 0.0) if miss is not None else np.zeros(n)
        wake = np.where(miss, Q, 0.0) if miss is not None else np.zeros(n)
        unexpl = rest - wait_miss
        miss_cpu = np.zeros(n)
        copy = np.zeros(n)
    return {"R": R, "Q": Q - wake, "wake": wake, "miss": miss, "wait_miss": wait_miss, "miss_cpu": miss_cpu,
            "copy": copy, "unexpl": unexpl}


def _observed_miss_service(b, nbc, ev, wait_miss):
    """Per call, the observed service time of one miss I/O, as the call experienced it.

    A call that queued bios: max(its mean bio queue->complete time, its voluntary miss wait
    per bio) -- the wait shows what bio timing cannot: bios held by a throttle before they
    reach the block layer, queueing ahead of it.  A call that waited without queueing a bio
    (on a page another thread's read or readahead is bringing in): its whole voluntary miss
    wait.  Otherwise the batch's mean bio time.  Without bio columns the same with pages
    inserted as the I/O count.  Returns (observed, own): ``own`` marks calls that did their
    own I/O, whose observed times define the trace's normal."""
    bio_n, bio_ns, pages = ev["bio_count"], ev["bio_ns"], ev["pages_added"]
    if bio_n is not None and bio_ns is not None:
        num, den = np.clip(bio_ns, 0, None), bio_n
    elif pages is not None:
        num, den = wait_miss, pages
    else:
        return None, None
    own = den > 0
    b_den = np.bincount(b, weights=den, minlength=nbc)
    b_num = np.bincount(b, weights=num, minlength=nbc)
    per_batch = np.where(b_den > 0, _safe_div(b_num, b_den), np.nan)
    mine = np.maximum(_safe_div(num, den), _safe_div(wait_miss, den))
    other = np.where(wait_miss > 0, wait_miss, per_batch[b])
    return np.where(own, mine, other), own


class _Plan:
    """Chunks of whole batches, ~CHUNK_CALLS calls each."""

    def __init__(self, seg):
        self.seg = seg
        nb = seg.n
        csum = np.cumsum(seg.counts)
        bounds = [0]
        while bounds[-1] < nb:
            done = int(csum[bounds[-1] - 1]) if bounds[-1] else 0
            nxt = int(np.searchsorted(csum, done + CHUNK_CALLS, side="right"))
            bounds.append(min(nb, max(nxt, bounds[-1] + 1)))
        self.bounds = bounds
        self.contiguous = bool(np.all(seg.first[1:] == seg.stop[:-1])) if nb else True

    def __iter__(self):
        seg = self.seg
        for bl, bh in zip(self.bounds[:-1], self.bounds[1:]):
            lo, hi = int(seg.first[bl]), int(seg.stop[bh - 1])
            counts = seg.counts[bl:bh]
            if self.contiguous:
                b = np.repeat(np.arange(bh - bl), counts)
                keep = None
            else:  # markers mode: calls outside every marker sit between batches
                pos = np.arange(lo, hi)
                k = np.searchsorted(seg.first[bl:bh], pos, side="right") - 1
                keep = pos < seg.stop[bl:bh][k]
                b = k[keep]
            yield bl, bh, lo, hi, b, keep


def _evidence_chunk(cols: _Columns, lo: int, hi: int, keep) -> dict:
    ev = {}
    for c in EVIDENCE_COLUMNS:
        v = cols.num(c, lo, hi)
        if v is not None and keep is not None:
            v = v[keep]
        ev[c] = v
    return ev


# ------------------------------------------------------------------------ analyse --

def analyse(
    trace_or_calls: Any,
    markers_df: pd.DataFrame | None = None,
    slow_ms: float = DEFAULT_SLOW_MS,
    gap_ms: float | None = None,
    normal_miss_us: float | None = None,
    *,
    meaningful_share: float = DEFAULT_MEANINGFUL_SHARE,
    loop_gap_us: float = DEFAULT_LOOP_GAP_US,
    samples: dict | None = None,
    meta: dict | None = None,
    markers_bad_lines: int = 0,
    top: int = 10,
) -> BatchTailResult:
    """Segment a trace into batches and split each batch's wall time into causes.

    ``trace_or_calls``: an :class:`engramprof.trace.Trace` (its samples are used) or a per-call
    DataFrame (pass ``samples={"threads": df, "vmstat": df, "psi": df}`` to use samples).
    ``markers_df``: DataFrame with start_ns/end_ns (see :func:`engramprof.batches.read_markers`);
    None infers batches from gaps (``gap_ms`` overrides the inferred threshold).
    Returns ``(batches DataFrame, summary dict)``; the summary is the ``--json`` document.
    Raises :class:`UserError` when nothing can be said (no calls, unusable markers...).
    """
    for name, v in (("--slow-ms", slow_ms), ("--gap-ms", gap_ms), ("--normal-miss-us", normal_miss_us)):
        if v is not None and not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
            raise UserError(f"{name} must be a positive number (got {v})")
    if not (0.0 < meaningful_share <= 1.0):
        raise UserError(f"meaningful share must be in (0, 1] (got {meaningful_share})")
    if not loop_gap_us >= 0:
        raise UserError(f"loop gap allowance must be >= 0 (got {loop_gap_us})")

    calls, getter, meta, notes = _inputs(trace_or_calls, samples, meta)
    lacking = [c for c in ("ts_ns", "dur_ns", "tid") if c not in calls.columns]
    if lacking:
        raise UserError(f"per-call table lacks required columns: {', '.join(lacking)}")
    absent_contract = [c for c in CONTRACT_COLUMNS if c not in calls.columns]
    if absent_contract:
        notes.append(f"per-call table lacks {', '.join(absent_contract)}: related figures are not shown")
    n_total = len(calls)
    if n_total == 0:
        raise UserError("the trace has no calls: nothing to analyse (was the target reading while traced?)")

    # ---- entry times and durations in entry-time order (views when the table is clean) -----
    def exact_int(name: str):
        c = calls[name]
        if pd.api.types.is_integer_dtype(c.dtype) and not getattr(c.dtype, "na_value", None) is pd.NA:
            return c.to_numpy(dtype=np.int64), None
        f = pd.to_numeric(c, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
        bad = ~np.isfinite(f)
        return np.where(bad, 0, f).astype(np.int64), bad

    ts, ts_bad = exact_int("ts_ns")
    dur, dur_bad = exact_int("dur_ns")
    good = dur >= 0
    for bad in (ts_bad, dur_bad):
        if bad is not None:
            good &= ~bad
    idx = None
    if not good.all():
        notes.append(f"{int((~good).sum())} call(s) with a missing or negative ts_ns/dur_ns were left out")
        idx = np.flatnonzero(good)
        if len(idx) == 0:
            raise UserError("no call has a usable ts_ns and dur_ns: nothing to analyse")
        ts, dur = ts[idx], dur[idx]
    del good, ts_bad, dur_bad
    if len(ts) > 1 and not bool(np.all(ts[1:] >= ts[:-1])):
        o = np.argsort(ts, kind="stable")
        idx = o if idx is None else idx[o]
        ts, dur = ts[o], dur[o]
        del o
    cols = _Columns(calls, idx)

    # ---- segmentation -------------------------------------------------------------------------
    end = ts + dur
    if markers_df is not None:
        if gap_ms is not None:
            notes.append("--gap-ms is ignored when --markers are given")
        seg = _batches.from_markers(ts, end, markers_df, meta, markers_bad_lines)
    else:
        seg = _batches.drop_truncated(_batches.infer(ts, end, gap_ms), meta)
    t_first, t_last = int(ts[0]), int(end.max())
    del end
    notes.extend(seg.notes)
    nb = seg.n
    bstart = seg.start_ns.astype(np.int64)
    bend = seg.end_ns.astype(np.int64)
    wall = (bend - bstart).astype(np.float64)
    plan = _Plan(seg)
    missing = [c for c in EVIDENCE_COLUMNS if not cols.has(c)]
    slow_ns = slow_ms * 1e6

    # ---- samples ------------------------------------------------------------------------------
    used: dict = {}
    smissing: list[str] = []
    thr = _sample(getter, "threads", notes, used, smissing)
    psi = _sample(getter, "psi", notes, used, smissing)
    # refaults: the target's memory cgroup when recorded (its own refaults), else system-wide
    cg = _sample(getter, "cgroup", notes, used, smissing)
    vm = _sample(getter, "vmstat", notes, used, smissing)
    refault_source = None
    if cg is not None:
        vm, refault_source = cg.rename(columns={"refault_file": "workingset_refault_file"}), "cgroup refault_file"
    elif vm is not None:
        refault_source = "vmstat workingset_refault_file (system-wide)"
    if vm is not None:
        vm = vm.sort_values("ts_ns", kind="stable")
        vm_x = vm["ts_ns"].to_numpy(np.int64)
        vm_r = np.clip(vm["workingset_refault_file"].to_numpy(np.float64), 0, None)
        vm_pages = np.zeros(len(vm_x))

    # ---- pass 1: what "normal" miss service is, and pages inserted per vmstat interval -------
    need_obs = (cols.has("bio_count") and cols.has("bio_ns")) or cols.has("pages_added")
    obs_parts: list[np.ndarray] = []
    bio_parts: list[np.ndarray] = []
    has_bio = cols.has("bio_count") and cols.has("bio_ns")
    cover_tid: list[np.ndarray] = []
    waited_parts: list[np.ndarray] = []
    for bl, bh, lo, hi, b, keep in plan:
        # which threads read in which batches (to find the submitting thread)
        tid_c = cols.series("tid", lo, hi).to_numpy().astype(np.int64)
        if keep is not None:
            tid_c = tid_c[keep]
        pairs = np.unique((b.astype(np.int64) + bl) * (1 << 32) + (tid_c & 0xFFFFFFFF))
        cover_tid.append(pairs & 0xFFFFFFFF)
        if need_obs or (vm is not None and cols.has("pages_added")):
                ev = _evidence_chunk(cols, lo, hi, keep)
                ev = {k: _nan0(v) for k, v in ev.items()}
                d = dur[lo:hi].astype(np.float64)
                if keep is not None:
                    d = d[keep]
                comp = _components(d, b, bh - bl, ev)
                obs, own = _observed_miss_service(b, bh - bl, ev, comp["wait_miss"])
                if obs is not None:
                    obs_parts.append(obs[own])
                    waited_parts.append(obs[own | (comp["wait_miss"] > 0)])
                if has_bio:
                    bio_parts.append(_safe_div(np.clip(ev["bio_ns"], 0, None), ev["bio_count"])[ev["bio_count"] > 0])
                if vm is not None and ev["pages_added"] is not None:
                    s_ = ts[lo:hi] if keep is None else ts[lo:hi][keep]
                    j = np.searchsorted(vm_x, s_, side="left")
                    valid = (j > 0) & (j < len(vm_x))
                    vm_pages += np.bincount(j[valid], weights=ev["pages_added"][valid], minlength=len(vm_x))
    tids_cov, cov = np.unique(np.concatenate(cover_tid), return_counts=True) if cover_tid else (np.empty(0), np.empty(0))
    del cover_tid
    submitter_info: dict = {"tid": None, "source": "none"}
    global_sub = -1
    if len(cov) and nb:
        k = int(np.argmax(cov))
        if cov[k] >= SUBMITTER_COVERAGE * nb and int((cov >= SUBMITTER_COVERAGE * nb).sum()) == 1:
            global_sub = int(tids_cov[k])
            submitter_info = {"tid": global_sub, "source": f"inferred: reads in {cov[k] / nb:.0%} of the batches"}
    submit = np.full(nb, global_sub, dtype=np.int64)
    if seg.submit_tid is not None:
        given = seg.submit_tid >= 0
        submit = np.where(given, seg.submit_tid, submit)
        if given.any():
            vals, cnt = np.unique(seg.submit_tid[given], return_counts=True)
            submitter_info = {"tid": int(vals[np.argmax(cnt)]),  # the most frequent one
                              "source": "markers" + ("" if given.all() else " (some markers lack it)")}
    obs_all = np.concatenate(obs_parts) if obs_parts else np.empty(0)
    trace_normal = _pct(obs_all, 50) if len(obs_all) else None
    basis = ("median service per miss I/O of the trace (max of bio queue->complete and the wait per bio)"
             if has_bio else "median miss wait per inserted page of the trace (no bio columns)")
    if normal_miss_us is not None:
        normal_ns: float | None = float(normal_miss_us) * 1e3
        normal_src: str | None = "--normal-miss-us"
    elif trace_normal is not None:
        normal_ns, normal_src = float(trace_normal), basis
        if normal_ns > NORMAL_MISS_CEILING_US * 1e3:
            normal_ns = NORMAL_MISS_CEILING_US * 1e3
            normal_src = f"{basis}, capped at {NORMAL_MISS_CEILING_US:g} µs"
    else:
        normal_ns, normal_src = None, None
    per_bio = np.concatenate(bio_parts) if bio_parts else None
    waited = np.concatenate(waited_parts) if waited_parts else np.empty(0)
    miss_io = _ms_pair(waited) if len(waited) else None
    del obs_parts, bio_parts, obs_all, waited_parts, waited
    vm_frac = None
    if vm is not None and cols.has("pages_added"):
        vm_frac = np.minimum(1.0, _safe_div(vm_r, vm_pages))

    # ---- pass 2: per chunk of batches ---------------------------------------------------------
    zeros = lambda: np.zeros(nb)  # noqa: E731
    cause_ns = {c: zeros() for c in CAUSES}
    per_b = {k: zeros() for k in ("inflight", "loop_gap", "handoff_gap", "pre", "post", "sum_call", "slow_calls",
                                   "rows", "threads", "bytes", "slowest_ms", "runq_preempt", "runq_wake")}
    ev_b = {k: zeros() for k in ("misses", "calls_with_misses", "bio_count", "bio_ms", "reclaim_in_calls_ms",
                                  "offcpu_ms", "runq_ms", "slowest_misses", "slowest_bio_ms", "slowest_reclaim_ms",
                                  "slowest_offcpu_ms", "slowest_runq_ms")}
    slowest_pos = np.zeros(nb, dtype=np.int64)
    tot = dict(slow=0, slow_miss=0, miss_calls=0, misses=0.0, bio=0.0, recl=0.0, recl_calls=0, off=0.0, rq=0.0,
               nowait=0, eagain=0, err=0, rf_pages=0.0, pages=0.0, wait_unsplit=0.0, slow_copy=0)
    nulls = {c: 0 for c in EVIDENCE_COLUMNS}
    tid_set: set = set()
    pid_set: set = set()
    has_offset, has_path = cols.has("offset"), cols.has("path")
    # path -> small int codes once (Arrow dictionary encoding; no Python string objects)
    path_codes, path_uniques = pd.factorize(calls["path"], use_na_sentinel=False) if has_path else (None, None)
    if has_path:
        path_codes = path_codes.astype(np.int64)
    lgap = loop_gap_us * 1e3
    slowest_text: dict[str, list] = {c: [] for c in ("tensor", "offset", "row", "tid")
                                     if cols.has(c) and (c == "tensor" or not pd.api.types.is_numeric_dtype(calls[c].dtype))}
    for bl, bh, lo, hi, b, keep in plan:
        nbc = bh - bl
        sl = slice(bl, bh)
        pick = (lambda a: a) if keep is None else (lambda a: a[keep])  # noqa: E731
        s = pick(ts[lo:hi])
        d = pick(dur[lo:hi]).astype(np.float64)
        e = np.minimum(s + d.astype(np.int64), bend[sl][b])
        n = len(s)
        tid = pick(cols.series("tid", lo, hi).to_numpy())
        tid_set.update(np.unique(tid).tolist())
        if cols.has("pid"):
            pid_set.update(pd.unique(pick(cols.series("pid", lo, hi).to_numpy())).tolist())

        # in-flight union and its owners
        u = inflight_weights(s, e)
        per_b["inflight"][sl] = np.bincount(b, weights=u, minlength=nbc)

        # time with no read in flight: reader loop (same thread, short) or scheduling
        firsts = np.flatnonzero(np.r_[True, b[1:] != b[:-1]])
        cm = np.maximum.accumulate(e)
        holder = np.maximum.accumulate(np.where(e >= cm, np.arange(n), 0))
        gap = np.zeros(n)
        gap[1:] = np.clip(s[1:] - cm[:-1], 0, None)
        same = np.zeros(n, dtype=bool)
        same[1:] = tid[1:] == tid[holder[:-1]]
        gap[firsts] = 0.0
        tc, _ = pd.factorize(tid)
        per_b["threads"][sl] = _distinct_per_batch(b, nbc, tc.astype(np.int64))
        st = submit[sl]
        # a gap on one thread: the submitting thread's own work, or a pool worker's loop
        # (loop_gap_us of it) plus executor machinery / GIL waits (the rest)
        own_thread = tid == st[b]
        loop = np.where(same, np.where(own_thread, gap, np.minimum(gap, lgap)), 0.0)
        per_b["loop_gap"][sl] = np.bincount(b, weights=loop, minlength=nbc)
        per_b["handoff_gap"][sl] = np.bincount(b, weights=gap - loop, minlength=nbc)
        del loop, own_thread
        pre = np.clip(s[firsts] - bstart[sl], 0, None).astype(np.float64)
        last_end = np.maximum.reduceat(e, firsts)
        post = np.clip(bend[sl] - last_end, 0, None).astype(np.float64)
        # before the first read / after the last (markers): the submitting thread's own work
        # when that read ran on it, else a hand-off (futures, wake-up, result collection)
        lastc = holder[np.r_[firsts[1:], n] - 1]  # the call holding the batch's max end
        own_pre = (st >= 0) & (tid[firsts] == st)
        own_post = (st >= 0) & (tid[lastc] == st)
        per_b["loop_gap"][sl] += np.where(own_pre, pre, 0.0) + np.where(own_post, post, 0.0)
        pre = np.where(own_pre, 0.0, pre)
        post = np.where(own_post, 0.0, post)
        per_b["pre"][sl] = pre
        per_b["post"][sl] = post
        del cm, holder, gap, same, pre, post, last_end

        # evidence and components
        ev = _evidence_chunk(cols, lo, hi, keep)
        for c, v in ev.items():
            if v is not None:
                nulls[c] += int(np.isnan(v).sum())
        ev = {k: _nan0(v) for k, v in ev.items()}
        comp = _components(d, b, nbc, ev)
        obs, _ = _observed_miss_service(b, nbc, ev, comp["wait_miss"])
        if obs is not None and normal_ns is not None:
            f_sto = np.where(np.isfinite(obs) & (obs > 0),
                             np.clip(1.0 - normal_ns / np.where(obs > 0, obs, 1.0), 0, 1), 0.0)
        else:
            f_sto = 0.0
            tot["wait_unsplit"] += float(comp["wait_miss"].sum())
        pages = ev["pages_added"]
        if vm_frac is not None:
            j = np.searchsorted(vm_x, s, side="left")
            valid = (j > 0) & (j < len(vm_x))
            rf = np.where(valid, vm_frac[np.where(valid, j, 0)], 0.0)
            tot["rf_pages"] += float((rf * pages).sum())
        else:
            rf = 0.0
        if cols.has("offcpu_ns"):
            tot["slow_copy"] += int((comp["copy"] > SLOW_COPY_NS).sum())
        wm, mc, wk = comp["wait_miss"], comp["miss_cpu"], comp["wake"]
        scale = _safe_div(u, d)
        bc = lambda w: np.bincount(b, weights=w, minlength=nbc)  # noqa: E731
        cause_ns["residency"][sl] = bc((wm * (1.0 - f_sto) + mc + wk) * (1.0 - rf) * scale)
        cause_ns["storage"][sl] = bc(wm * f_sto * (1.0 - rf) * scale)
        cause_ns["reclaim"][sl] = bc((comp["R"] + rf * (wm + mc + wk)) * scale)
        cause_ns["python-scheduling"][sl] = (per_b["pre"][sl] + per_b["post"][sl] + per_b["handoff_gap"][sl]
                                             + bc(comp["Q"] * scale))
        cause_ns["cpu-copy"][sl] = per_b["loop_gap"][sl] + bc(comp["copy"] * scale)
        cause_ns["unexplained"][sl] = bc(comp["unexpl"] * scale)
        per_b["runq_preempt"][sl] = bc(comp["Q"] * scale)
        per_b["runq_wake"][sl] = bc(wk * scale)
        del comp, wm, mc, wk, scale, u, f_sto, rf, obs

        # per-batch figures
        per_b["sum_call"][sl] = bc(d)
        slow = d > slow_ns
        per_b["slow_calls"][sl] = bc(slow)
        tot["slow"] += int(slow.sum())
        if has_offset:
            off_ = np.nan_to_num(pick(cols.num("offset", lo, hi)), nan=-1.0)
            off_ = np.clip(off_ + 1, 0, None).astype(np.int64)
            if has_path:
                pc = path_codes[lo:hi] if cols.idx is None else path_codes[cols.idx[lo:hi]]
                per_b["rows"][sl] = _distinct_per_batch(b, nbc, pick(pc), off_)
            else:
                per_b["rows"][sl] = _distinct_per_batch(b, nbc, off_)
        ret = pick(cols.num("ret", lo, hi)) if cols.has("ret") else None
        if ret is not None:
            per_b["bytes"][sl] = bc(np.clip(np.nan_to_num(ret), 0, None))
            tot["eagain"] += int((ret == -EAGAIN).sum())
            tot["err"] += int(((ret < 0) & (ret != -EAGAIN)).sum())
        if cols.has("flags"):
            fl = np.nan_to_num(pick(cols.num("flags", lo, hi))).astype(np.int64)
            tot["nowait"] += int(((fl & RWF_NOWAIT) != 0).sum())
        maxd = np.maximum.reduceat(d, firsts)
        cand = np.flatnonzero(d == maxd[b])
        first_c = np.r_[True, b[cand][1:] != b[cand][:-1]]
        sp = cand[first_c]
        per_b["slowest_ms"][sl] = d[sp] / 1e6
        for c in slowest_text:  # text columns: take from this chunk's slice (cheap), not the whole column
            ser = cols.series(c, lo, hi)
            spos = np.flatnonzero(keep)[sp] if keep is not None else sp
            slowest_text[c].append(ser.iloc[spos].to_numpy(dtype=object))
        gpos = np.arange(lo, hi) if keep is not None else None
        slowest_pos[sl] = (gpos[keep][sp] if keep is not None else lo + sp)
        if pages is not None:
            ev_b["misses"][sl] = bc(pages)
            ev_b["calls_with_misses"][sl] = bc(pages > 0)
            ev_b["slowest_misses"][sl] = pages[sp]
            tot["miss_calls"] += int((pages > 0).sum())
            tot["misses"] += float(pages.sum())
            tot["pages"] += float(pages.sum())
            tot["slow_miss"] += int((pages[slow] > 0).sum())
        for key, name, div in (("bio_count", "bio_count", 1), ("bio_ms", "bio_ns", 1e6),
                               ("reclaim_in_calls_ms", "reclaim_ns", 1e6), ("offcpu_ms", "offcpu_ns", 1e6),
                               ("runq_ms", "runq_ns", 1e6)):
            v = ev[name]
            if v is not None:
                ev_b[key][sl] = bc(v) / div
                if name != "bio_count":
                    ev_b["slowest_" + key.replace("_in_calls", "")][sl] = v[sp] / div
        if ev["bio_count"] is not None:
            tot["bio"] += float(ev["bio_count"].sum())
        if ev["reclaim_ns"] is not None:
            tot["recl"] += float(ev["reclaim_ns"].sum())
            tot["recl_calls"] += int((ev["reclaim_ns"] > 0).sum())
        if ev["offcpu_ns"] is not None:
            tot["off"] += float(ev["offcpu_ns"].sum())
        if ev["runq_ns"] is not None:
            tot["rq"] += float(ev["runq_ns"].sum())
        del ev, d, s, e, b, tid

    if tot["slow_copy"] and tot["slow_copy"] >= 0.001 * max(1, int(seg.counts.sum())):
        notes.append(f"{tot['slow_copy']:,} call(s) without misses spent over {SLOW_COPY_NS / 1e3:.0f} µs on CPU: "
                     "not a plausible cached copy; CPU steal on a virtualised host, or evidence lost? "
                     "(counted as cpu-copy)")
    nullcols = [f"{c} ({k})" for c, k in nulls.items() if k]
    if nullcols:
        notes.append("evidence values missing on some calls, taken as 0: " + ", ".join(nullcols))
    if tot["wait_unsplit"] > 0:
        notes.append("no bio_ns/bio_count and no pages_added: miss waits cannot be split into residency and storage")
    if vm is None and tot["miss_calls"]:
        notes.append("no cgroup or vmstat refault samples: refault-driven misses cannot be told from plain "
                     "misses (reclaim shows only reclaim inside calls)")
    elif refault_source and "system-wide" in refault_source and tot["rf_pages"] > 0:
        notes.append("refaults are system-wide (no cgroup samples): other processes' refaults may be "
                     "counted as this reader's")

    # ---- shares and verdicts --------------------------------------------------------------------
    parts = sum(cause_ns.values())
    denom = np.maximum(wall, parts)
    zero = denom <= 0
    if zero.any():  # batches of zero length (zero-duration calls only)
        cause_ns["unexplained"] = np.where(zero, 1.0, cause_ns["unexplained"])
        denom = np.where(zero, 1.0, denom)
    shares = {c: cause_ns[c] / denom for c in CAUSES}

    no_read = per_b["pre"] + per_b["post"] + per_b["handoff_gap"] + per_b["loop_gap"]
    out = pd.DataFrame({
        "batch": np.arange(nb),
        "start_ns": bstart,
        "end_ns": bend,
        "start_s": (bstart - min(t_first, int(bstart[0]))) / 1e9,
        "wall_ms": wall / 1e6,
        "calls": seg.counts if seg.source == "inferred" else np.zeros(nb, dtype=np.int64),
    })
    if has_offset:
        out["rows"] = per_b["rows"].astype(np.int64)
    out["threads"] = per_b["threads"].astype(np.int64)
    if cols.has("ret"):
        out["bytes"] = per_b["bytes"].astype(np.int64)
    out["inflight_ms"] = per_b["inflight"] / 1e6
    out["sum_call_ms"] = per_b["sum_call"] / 1e6
    out["slow_calls"] = per_b["slow_calls"].astype(np.int64)
    out["no_read_ms"] = no_read / 1e6
    if cols.has("pages_added"):
        out["misses"] = ev_b["misses"].astype(np.int64)
    if cols.has("bio_count"):
        out["bio_count"] = ev_b["bio_count"].astype(np.int64)
    if cols.has("pages_added"):
        out["calls_with_misses"] = ev_b["calls_with_misses"].astype(np.int64)
    for key, name in (("bio_ms", "bio_ns"), ("reclaim_in_calls_ms", "reclaim_ns"), ("offcpu_ms", "offcpu_ns"),
                      ("runq_ms", "runq_ns")):
        if cols.has(name):
            out[key] = ev_b[key]
    out["slowest_call_ms"] = per_b["slowest_ms"]
    srows = cols.rows(slowest_pos)
    for c in ("tid", "path", "offset", "tensor", "row"):
        if not cols.has(c):
            continue
        name = "slowest_" + c
        if c == "path":  # via codes: an Arrow take on the whole column would copy all strings
            out[name] = path_uniques.take(path_codes[srows])
        elif c == "tensor" or not pd.api.types.is_numeric_dtype(calls[c].dtype):
            out[name] = np.concatenate(slowest_text[c]) if slowest_text[c] else np.empty(0, dtype=object)
        else:
            out[name] = calls[c].to_numpy()[srows]
    for key, name in (("slowest_misses", "pages_added"), ("slowest_bio_ms", "bio_ns"),
                      ("slowest_reclaim_ms", "reclaim_ns"), ("slowest_offcpu_ms", "offcpu_ns"),
                      ("slowest_runq_ms", "runq_ns")):
        if cols.has(name):
            out[key] = ev_b[key]
    tid_uniques = np.array(sorted(tid_set))
    ctx = None
    if thr is not None:
        ctx, ctx_inv, ctx_tot = _ctx_switches(thr, tid_uniques, bstart, bend)
        if ctx_tot["threads_sampled"] == 0:
            notes.append("threads samples hold none of the reading threads: no context-switch counts")
            ctx = None
        else:
            out["ctx_switches_est"] = ctx
            out["ctx_involuntary_est"] = ctx_inv
    for c in CAUSES:
        out[f"ms_{col(c)}"] = cause_ns[c] / 1e6
    for c in CAUSES:
        out[f"share_{col(c)}"] = shares[c]
    smat = np.column_stack([shares[c] for c in VERDICT_CAUSES]) if nb else np.empty((0, 4))
    out["verdict"] = _verdicts(smat, meaningful_share)
    if seg.source != "inferred":
        out["calls"] = seg.counts

    # ---- summary ------------------------------------------------------------------------------
    tot_wall = float(denom.sum())
    share_all = {c: float(cause_ns[c].sum() / tot_wall) if tot_wall > 0 else 0.0 for c in CAUSES}
    p90 = float(np.percentile(wall, TAIL_PERCENTILE)) if nb else 0.0
    tail = wall > p90
    if not tail.any():
        tail = wall >= p90
    tw = float(denom[tail].sum())
    share_tail = {c: float(cause_ns[c][tail].sum() / tw) if tw > 0 else 0.0 for c in CAUSES}
    verdict = verdict_of(share_all, meaningful_share)
    tail_verdict = verdict_of(share_tail, meaningful_share)

    batch_p50 = _pct(wall, 50)
    infl_p50 = _pct(per_b["inflight"], 50)
    outside = max(0.0, 1.0 - infl_p50 / batch_p50) if batch_p50 and infl_p50 is not None else None
    n_in = int(seg.counts.sum())
    evidence: dict = {
        "threads": int(len(tid_uniques)),
        "slow_calls": int(tot["slow"]),
        "concurrency_p50": _pct(_safe_div(per_b["sum_call"], per_b["inflight"]), 50),
        "no_read_ms": _ms_pair(no_read),
    }
    if cols.has("flags"):
        evidence["nowait_calls"] = int(tot["nowait"])
    if cols.has("ret"):
        evidence["eagain_calls"] = int(tot["eagain"])
        evidence["error_calls"] = int(tot["err"])
    if cols.has("pages_added"):
        evidence["misses"] = int(tot["misses"])
        evidence["calls_with_misses_frac"] = tot["miss_calls"] / n_in if n_in else None
        evidence["slow_calls_with_misses_frac"] = tot["slow_miss"] / tot["slow"] if tot["slow"] else None
    if cols.has("bio_count"):
        evidence["bio_count"] = int(tot["bio"])
    if has_bio and per_bio is not None and len(per_bio):
        evidence["bio_ms_per_bio"] = _ms_pair(per_bio)
    if miss_io is not None:
        evidence["miss_io_ms"] = miss_io
        bio_p50 = evidence.get("bio_ms_per_bio", {}).get("p50")
        if bio_p50 and miss_io["p99"] and miss_io["p99"] > 4 * max(bio_p50, evidence["bio_ms_per_bio"]["p99"] or 0):
            notes.append(f"readers waited up to {miss_io['p99']:.3g} ms (p99) per miss I/O while bio queue->complete "
                         f"was at most {evidence['bio_ms_per_bio']['p99']:.3g} ms (p99): the I/O was held outside the "
                         "device queue (a blkio throttle dispatches held bios from a worker, so they are not seen "
                         "in the reader's calls; or queueing before the block layer)")
    if cols.has("reclaim_ns"):
        evidence["reclaim_ms"] = tot["recl"] / 1e6
        evidence["calls_with_reclaim"] = int(tot["recl_calls"])
    if cols.has("offcpu_ns"):
        evidence["offcpu_ms"] = tot["off"] / 1e6
        evidence["slow_copy_calls"] = int(tot["slow_copy"])
    if cols.has("runq_ns"):
        evidence["runq_ms"] = tot["rq"] / 1e6
        if tot_wall > 0:
            # attributed to batch time: preemption (in python-scheduling) and the wake-up of
            # calls that slept on a miss (in residency / reclaim)
            evidence["runq_preempt_share"] = float(per_b["runq_preempt"].sum() / tot_wall)
            evidence["runq_wake_share"] = float(per_b["runq_wake"].sum() / tot_wall)
    if ctx is not None:
        evidence["ctx_switches_per_batch"] = {"p50": _pct(ctx, 50), "p99": _pct(ctx, 99)}
        evidence["ctx_switches_sampled"] = dict(ctx_tot)
        if np.isnan(ctx).any():
            evidence["ctx_switches_batches_not_covered"] = int(np.isnan(ctx).sum())
    if vm is not None:
        evidence["refault_source"] = refault_source
        win = (vm_x > t_first) & (np.r_[np.iinfo(np.int64).min, vm_x[:-1]] <= t_last)
        evidence["refaults_in_window"] = float(vm_r[win].sum())
        if vm_frac is not None:
            evidence["refault_frac_of_misses_est"] = tot["rf_pages"] / tot["pages"] if tot["pages"] > 0 else None
    if psi is not None:
        evidence["psi_some_pct"] = _psi(psi, t_first, t_last)

    show = ["batch", "start_s", "wall_ms", "inflight_ms", "calls", "slow_calls", "slowest_call_ms", "verdict"]
    show += [c for c in ("misses", "bio_ms", "reclaim_in_calls_ms", "offcpu_ms", "runq_ms", "ctx_switches_est",
                         "slowest_path", "slowest_offset", "slowest_row", "slowest_misses", "slowest_bio_ms",
                         "slowest_reclaim_ms", "slowest_offcpu_ms", "slowest_runq_ms") if c in out.columns]
    top_df = out.nlargest(min(top, nb), "wall_ms")
    slowest_batches = []
    for rec in top_df[show].to_dict("records"):
        rec = {k: _jsonable(v) for k, v in rec.items()}
        rec["share"] = {c: float(top_df.loc[rec["batch"], f"share_{col(c)}"]) for c in CAUSES}
        slowest_batches.append(rec)

    if share_all["unexplained"] >= UNEXPLAINED_NOTE_SHARE:
        why = (f" (missing evidence: {', '.join(missing)})" if missing
               else " (off-CPU waits in batches without misses: locks? page faults on the buffers?)")
        notes.append(f"{share_all['unexplained']:.0%} of batch time is unexplained{why}")
    if len(pid_set) > 1:
        notes.append(f"calls from {len(pid_set)} processes were segmented as one read stream")

    summary: dict = {
        "batches": int(nb),
        "batch_source": seg.source,
        "gap_ms": None if seg.gap_ns is None else seg.gap_ns / 1e6,
        "gap_source": seg.gap_source,
        "slow_ms": float(slow_ms),
        "frac_batches_with_slow_call": float((per_b["slow_calls"] > 0).mean()) if nb else 0.0,
        "calls": int(n_total),
        "calls_in_batches": n_in,
        "call_ms": _ms_pair(dur),
        "batch_ms": _ms_pair(wall),
        "inflight_ms": _ms_pair(per_b["inflight"]),
        "sum_call_ms": _ms_pair(per_b["sum_call"]),
        "outside_read_path_frac": outside,
        "share": share_all,
        "tail_share": share_tail,
        "tail_threshold_ms": p90 / 1e6,
        "tail_batches": int(tail.sum()),
        "verdict": verdict,
        "tail_verdict": tail_verdict,
        "verdict_counts": {v: int((out["verdict"] == v).sum()) for v in VERDICTS},
        "submitter": submitter_info,
        "normal_miss_us": None if normal_ns is None else normal_ns / 1e3,
        "normal_miss_source": normal_src,
        "thresholds": {
            "meaningful_share": float(meaningful_share),
            "loop_gap_us": float(loop_gap_us),
            "submitter_coverage": SUBMITTER_COVERAGE,
            "normal_miss_ceiling_us": NORMAL_MISS_CEILING_US,
            "tail_percentile": TAIL_PERCENTILE,
        },
        "evidence": {k: _jsonable(v) for k, v in evidence.items()},
        "slowest_batches": slowest_batches,
        "missing_evidence": missing,
        "samples_used": used,
        "samples_missing": smissing,
        "notes": notes,
    }
    if seg.source == "markers":
        summary["markers"] = {k: int(v) for k, v in seg.info.items()}
    else:
        summary["gap_inference"] = {k: _jsonable(v) for k, v in seg.info.items()}
    return BatchTailResult(out, summary)




def _jsonable(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (np.floating, float)):
        f = float(v)
        return f if math.isfinite(f) else None
    if isinstance(v, np.bool_):
        return bool(v)
    if v is pd.NA or v is pd.NaT:
        return None
    return v
