"""Stage 5: attribute every chunk of batches into a :class:`BatchAccumulator`.

One pass over the events.  Per chunk: the in-flight union and who owns each instant of it,
the time with no read in flight (the reader's own loop vs scheduling hand-offs), each event's
components (computed once), and the per-batch figures.  The parts of a miss that depend on
figures known only after the pass (the normal miss service, the refault fraction per sample
interval) are kept compactly in :class:`MissParts` for stage 6 (engramprof.analysis.calibrate).
"""
from __future__ import annotations

import copy
import dataclasses
import errno
import os
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from engramprof.analysis.components import (
    PAGE_BYTES,
    Evidence,
    bytes_read_beside,
    device_ends,
    device_weights,
    distinct_per_batch,
    exit_holders,
    inflight_weights,
    miss_io_bytes,
    observed_miss_service,
    safe_div,
    split_components,
)
from engramprof.analysis.context import RefaultSeries
from engramprof.analysis.hint_calls import StepHints, hint_time
from engramprof.analysis.events import Chunk, ReadEvents, chunk_plan
from engramprof.analysis.threads import ReadingThreads
from engramprof.analysis.verdicts import CAUSES, is_slow
from engramprof.trace import EVIDENCE_COLUMNS

EAGAIN = errno.EAGAIN  # a refused RWF_NOWAIT read returns -EAGAIN
RWF_NOWAIT = os.RWF_NOWAIT

#: a call without misses on CPU longer than this is not a plausible cached copy (a few pages
#: copy in a few µs): noted as possible CPU steal (virtualised host) or lost evidence
SLOW_COPY_NS = 50_000

#: threads the chunks are attributed on (2 cores here; more buys little: the chunks' array
#: work is memory-bound)
ANALYSIS_THREADS = max(1, min(2, os.cpu_count() or 1))

_PER_BATCH_EVIDENCE = (("bio_count", "bio_count", 1.0), ("bio_ms", "bio_ns", 1e6),
                       ("reclaim_in_calls_ms", "reclaim_ns", 1e6), ("offcpu_ms", "offcpu_ns", 1e6),
                       ("runq_ms", "runq_ns", 1e6))


@dataclass
class Totals:
    """Counts and sums over every event in a batch."""

    slow: int = 0
    slow_with_misses: int = 0
    calls_with_misses: int = 0
    pages_inserted: float = 0.0
    bios: float = 0.0
    reclaim_ns: float = 0.0
    calls_with_reclaim: int = 0
    offcpu_ns: float = 0.0
    runq_ns: float = 0.0
    nowait: int = 0
    eagain: int = 0
    errors: int = 0
    slow_copy: int = 0
    miss_wait_ns: float = 0.0  # voluntary waits in a miss context (unscaled)
    refaulted_pages: float = 0.0  # pages inserted, weighted by their interval's refault fraction
    nulls: dict = field(default_factory=lambda: {c: 0 for c in EVIDENCE_COLUMNS})


@dataclass
class MissParts:
    """Of the events whose time a miss explains: batch, their scaled miss wait and other miss
    time (on-CPU miss path, wake-up), their observed service per miss I/O, their sample
    interval and their pages inserted.  Split in stage 6 once the normal service is known."""

    batch: list = field(default_factory=list)
    wait: list = field(default_factory=list)
    other: list = field(default_factory=list)
    observed: list = field(default_factory=list)
    interval: list = field(default_factory=list)
    pages: list = field(default_factory=list)
    io_bytes: list = field(default_factory=list)  # the size of the I/O ``observed`` is the service of
    beside: list = field(default_factory=list)  # bytes of the target's other reads in flight beside it

    def add(self, **parts: np.ndarray) -> None:
        for k, v in parts.items():
            getattr(self, k).append(v)

    def arrays(self) -> dict:
        """Each part as one array; the lists are emptied as they are joined (one part's
        pieces and its joined array in memory at a time, not all of them twice)."""
        out = {}
        for k in ("batch", "wait", "other", "observed", "interval", "pages", "io_bytes", "beside"):
            pieces = getattr(self, k)
            out[k] = np.concatenate(pieces) if pieces else np.empty(0)
            pieces.clear()
        return out


def _zeros(n: int) -> np.ndarray:
    return np.zeros(n)


#: the per-batch arrays of a BatchAccumulator (length n each)
PER_BATCH_ARRAYS = ("inflight", "loop_gap", "handoff_gap", "before_first_read", "after_last_read", "sum_call",
                    "slow_calls", "rows", "bytes", "runq_preempt", "runq_wake", "slowest_ms", "queue_depth_max",
                    "native_wait", "reap_wait", "hint_wait")
#: per batch, its io_uring requests by how each was served (evidence keys, uring_path values)
URING_PATH_COUNTS = ("uring_inline", "uring_async", "uring_punted")


@dataclass
class BatchAccumulator:
    """Per batch (arrays of length n) and in total, what the pass found."""

    n: int
    n_events: int = 0  # events in batches
    cause_ns: dict = field(init=False)
    inflight: np.ndarray = field(init=False)
    loop_gap: np.ndarray = field(init=False)
    handoff_gap: np.ndarray = field(init=False)
    before_first_read: np.ndarray = field(init=False)
    after_last_read: np.ndarray = field(init=False)
    sum_call: np.ndarray = field(init=False)
    slow_calls: np.ndarray = field(init=False)
    rows: np.ndarray = field(init=False)
    bytes: np.ndarray = field(init=False)
    runq_preempt: np.ndarray = field(init=False)
    runq_wake: np.ndarray = field(init=False)
    slowest_ms: np.ndarray = field(init=False)
    queue_depth_max: np.ndarray = field(init=False)  # most reads in flight at once
    native_wait: np.ndarray = field(init=False)  # of cpu-copy: native threads' own waits (thread_kinds.py)
    reap_wait: np.ndarray = field(init=False)  # of residency: requests done at the device, not yet reaped
    hint_wait: np.ndarray = field(init=False)  # of residency: the target's prefetch hints, no read in flight
    slowest_pos: np.ndarray = field(init=False)
    evidence: dict = field(init=False)  # per-batch evidence sums and the slowest event's
    totals: Totals = field(default_factory=Totals)
    miss: MissParts = field(default_factory=MissParts)
    observed_own: list = field(default_factory=list)  # observed miss service of own-I/O events
    observed_waited: list = field(default_factory=list)  # ... of every event that waited on a miss
    per_bio: list = field(default_factory=list)  # bio queue->complete per bio of events with bios
    pages_per_interval: np.ndarray | None = None  # pages inserted per refault sample interval

    def __post_init__(self):
        n = self.n
        self.cause_ns = {c: _zeros(n) for c in CAUSES}
        for name in PER_BATCH_ARRAYS:
            setattr(self, name, _zeros(n))
        self.slowest_pos = np.zeros(n, dtype=np.int64)
        self.evidence = {k: _zeros(n) for k in ("misses", "calls_with_misses", "bio_count", "bio_ms",
                                                "reclaim_in_calls_ms", "offcpu_ms", "runq_ms", "slowest_misses",
                                                "slowest_bio_ms", "slowest_reclaim_ms", "slowest_offcpu_ms",
                                                "slowest_runq_ms", "direct_calls", *URING_PATH_COUNTS)}

    @property
    def no_read(self) -> np.ndarray:
        """Time with no read in flight, per batch (ns)."""
        return self.before_first_read + self.after_last_read + self.handoff_gap + self.loop_gap

    def expanded(self, rows: np.ndarray, n: int) -> "BatchAccumulator":
        """This accumulator's batches placed at positions ``rows`` of ``n`` batches (the others,
        batches without a read event, start at zero; their slowest event is -1)."""
        full = BatchAccumulator(n, n_events=self.n_events)
        for name in PER_BATCH_ARRAYS:
            getattr(full, name)[rows] = getattr(self, name)
        full.slowest_pos[:] = -1
        full.slowest_pos[rows] = self.slowest_pos
        for c in self.cause_ns:
            full.cause_ns[c][rows] = self.cause_ns[c]
        for k in self.evidence:
            full.evidence[k][rows] = self.evidence[k]
        full.totals, full.miss = self.totals, self.miss
        full.observed_own, full.observed_waited, full.per_bio = self.observed_own, self.observed_waited, self.per_bio
        full.pages_per_interval = self.pages_per_interval
        return full

    def for_chunk(self) -> "BatchAccumulator":
        """A view for one chunk: the same per-batch arrays (a chunk writes only its own
        batches' slices), its own totals and lists, merged back in chunk order by :meth:`merge`
        (so that chunks can run on several threads and the sums stay deterministic)."""
        part = copy.copy(self)
        part.totals = Totals()
        part.miss = MissParts()
        part.observed_own, part.observed_waited, part.per_bio = [], [], []
        if self.pages_per_interval is not None:
            part.pages_per_interval = np.zeros_like(self.pages_per_interval)
        return part

    def merge(self, part: "BatchAccumulator") -> None:
        for f in dataclasses.fields(Totals):
            if f.name == "nulls":
                for c, k in part.totals.nulls.items():
                    self.totals.nulls[c] += k
            else:
                setattr(self.totals, f.name, getattr(self.totals, f.name) + getattr(part.totals, f.name))
        for f in dataclasses.fields(MissParts):
            getattr(self.miss, f.name).extend(getattr(part.miss, f.name))
        self.observed_own += part.observed_own
        self.observed_waited += part.observed_waited
        self.per_bio += part.per_bio
        if self.pages_per_interval is not None:
            self.pages_per_interval += part.pages_per_interval


@dataclass
class AttributionInputs:
    """What the pass needs besides the events: the batches, their threads and the settings."""

    seg: object
    threads: ReadingThreads
    refaults: RefaultSeries | None
    slow_ms: float
    loop_gap_us: float
    path_codes: np.ndarray | None  # entry-order codes + 1 (0: missing), None: no path column
    #: per batch, the target inserted pages of its files outside its read events (a miss
    #: context: own_insertions.inserting_batches); None: not known or none
    inserting: np.ndarray | None = None
    #: the prefetch hint calls of each batch's step thread on its read files (hint_calls.py)
    hints: StepHints | None = None


def _no_read_time(acc: BatchAccumulator, ch: Chunk, s, e, tcode, submit, bstart, bend, loop_gap_ns,
                  native: np.ndarray | None = None, hints: StepHints | None = None) -> None:
    """Time with no read in flight: a gap on one thread is the submitting thread's own work,
    or a pool worker's loop (``loop_gap_ns`` of it) plus executor machinery / GIL waits (the
    rest); before the first read / after the last (markers) is the submitter's own work when
    that read ran on it, else a hand-off (futures, wake-up, result collection).  The part of
    any of these the step thread spent inside its own prefetch hints (``hints``) is taken out
    first (``acc.hint_wait``: residency, hint_calls.py)."""
    b, sl = ch.batch, ch.batches
    n = len(s)
    firsts = ch.firsts
    reach = np.maximum.accumulate(e)  # the latest exit so far
    holder = exit_holders(e, reach)  # the event holding it
    gap = np.zeros(n)
    gap[1:] = np.clip(s[1:] - reach[:-1], 0, None)
    same_thread = np.zeros(n, dtype=bool)
    same_thread[1:] = tcode[1:] == tcode[holder[:-1]]
    gap[firsts] = 0.0
    st = submit[sl]
    on_submitter = tcode == st[b]
    pre = np.clip(s[firsts] - bstart[sl], 0, None).astype(np.float64)
    latest = np.maximum.reduceat(e, firsts)
    post = np.clip(bend[sl] - latest, 0, None).astype(np.float64)
    hinted = hint_time(hints, sl, b, firsts, s, reach, gap, bstart[sl], bend[sl], latest, pre, post) \
        if hints is not None else None
    if hinted is not None:
        in_gap, in_pre, in_post = hinted
        gap = gap - in_gap
        pre = pre - in_pre
        post = post - in_post
        acc.hint_wait[sl] = ch.per_batch(in_gap) + in_pre + in_post
    loop = np.where(same_thread, np.where(on_submitter, gap, np.minimum(gap, loop_gap_ns)), 0.0)
    last = holder[np.r_[firsts[1:], n] - 1]  # the event holding the batch's latest exit
    own_pre = (st >= 0) & (tcode[firsts] == st)
    own_post = (st >= 0) & (tcode[last] == st)
    if native is not None:
        # a gap a native thread ends or holds is that pool's own work and waits (its own
        # hand-offs, not the interpreter's): all of it with the batch's work, named apart
        nat = native[tcode]
        nat_gap = np.zeros(n, dtype=bool)
        nat_gap[1:] = nat[1:] | nat[holder[:-1]]
        nat_gap[firsts] = False
        moved = np.where(nat_gap, gap - loop, 0.0)
        loop = loop + moved
        nat_pre = ~own_pre & nat[firsts]
        nat_post = ~own_post & nat[last]
        acc.native_wait[sl] = ch.per_batch(moved) + np.where(nat_pre, pre, 0.0) + np.where(nat_post, post, 0.0)
        own_pre, own_post = own_pre | nat_pre, own_post | nat_post
    acc.loop_gap[sl] = ch.per_batch(loop)
    acc.handoff_gap[sl] = ch.per_batch(gap - loop)
    acc.loop_gap[sl] += np.where(own_pre, pre, 0.0) + np.where(own_post, post, 0.0)
    acc.before_first_read[sl] = np.where(own_pre, 0.0, pre)
    acc.after_last_read[sl] = np.where(own_post, 0.0, post)


def _causes(acc: BatchAccumulator, ch: Chunk, d, u, comp, ev: Evidence, obs, s, refaults, io_bytes=None,
            native_ev: np.ndarray | None = None, beside: np.ndarray | None = None) -> None:
    """Each event's share of the union (u) split in the proportions of its components; the
    miss parts whose split waits for stage 6 go to ``acc.miss``."""
    sl = ch.batches
    scale = safe_div(u, d)
    t = acc.totals
    acc.runq_preempt[sl] = ch.per_batch(comp.preempt * scale)
    acc.runq_wake[sl] = ch.per_batch(comp.wake * scale)
    # a native thread waiting for a CPU is its pool's wait, not the interpreter's
    nat_preempt = ch.per_batch(comp.preempt * scale * native_ev) if native_ev is not None else 0.0
    acc.native_wait[sl] += nat_preempt
    acc.cause_ns["python-scheduling"][sl] = (acc.before_first_read[sl] + acc.after_last_read[sl]
                                             + acc.handoff_gap[sl] + acc.runq_preempt[sl] - nat_preempt)
    acc.cause_ns["cpu-copy"][sl] = acc.loop_gap[sl] + ch.per_batch(comp.copy * scale) + nat_preempt
    acc.cause_ns["unexplained"][sl] = ch.per_batch(comp.unexplained * scale)
    acc.cause_ns["reclaim"][sl] = ch.per_batch(comp.reclaim * scale)  # + refault-driven misses (stage 6)
    acc.cause_ns["residency"][sl] = acc.hint_wait[sl]  # + the misses' split (stage 6)
    t.miss_wait_ns += float(comp.miss_wait.sum())
    pages = ev.pages_added
    if comp.reap is not None:  # a request's wait for its reap: the miss's cost, never storage
        acc.reap_wait[sl] = ch.per_batch(comp.reap * scale)
    sel, other = _miss_events(comp, ev)
    sel = np.flatnonzero(sel)  # indices: one scan of the flags, then gathers (not 8 mask scans)
    m = len(sel)
    if refaults is not None and pages is not None:
        j, valid = refaults.interval_of_sorted(s)  # entries are in time order
        inserted = np.flatnonzero(valid & (pages > 0))  # the others add nothing to the sums
        acc.pages_per_interval += np.bincount(j[inserted], weights=pages[inserted], minlength=len(refaults.at))
        interval = np.where(valid[sel], j[sel], -1).astype(_index_type(len(refaults.at)), copy=False)
    else:
        interval = np.full(m, -1, dtype=np.int32)
    scale_sel = scale[sel]
    # batch and interval as int32 (stage 6 widens them): 8 bytes less per miss event kept
    acc.miss.add(batch=np.add(ch.batch[sel], ch.first_batch, dtype=_index_type(acc.n)),
                 wait=comp.miss_wait[sel] * scale_sel, other=other[sel] * scale_sel,
                 observed=obs[sel] if obs is not None else np.full(m, np.nan),
                 interval=interval, pages=pages[sel] if pages is not None else np.zeros(m),
                 io_bytes=io_bytes[sel] if io_bytes is not None else np.full(m, np.nan),
                 beside=beside[sel] if beside is not None else np.zeros(m))


def _index_type(n: int) -> np.dtype:
    """int32 for indices below ``n`` (and -1) where they fit, else int64."""
    return np.dtype(np.int32 if n < np.iinfo(np.int32).max else np.int64)


def _uring_paths_per_batch(acc: BatchAccumulator, ch: Chunk, events: ReadEvents) -> None:
    """Per batch, its io_uring requests served inline, async and punted."""
    cols = events.cols
    if "uring_path" not in cols.calls.columns or not cols.has("uring_path"):
        return
    codes, uniques = cols.codes("uring_path")
    c = ch.pick(codes[ch.lo:ch.hi] if cols.order is None else codes[cols.order[ch.lo:ch.hi]])
    vals = [str(u) for u in uniques]
    for key in URING_PATH_COUNTS:
        name = key[len("uring_"):]
        if name in vals:
            acc.evidence[key][ch.batches] = ch.per_batch(c == vals.index(name))


def queue_depth_max(ch: Chunk, s: np.ndarray, e: np.ndarray, e_sorted: np.ndarray | None = None) -> np.ndarray:
    """Per batch of the chunk, the most read events in flight at once (its queue depth).  The
    batches are disjoint in time and every event's [s, e] lies in its batch's span, so one time
    order of the entries and exits is also batch order: the entries (``s``, sorted) and exits
    (nearly sorted) are merged as one sort of keys time * 2 (+ 1 for an entry: at equal times
    exits first), and the level after each entry follows from its merged position; a batch's
    depth is the highest at its entries.  ``e_sorted``: ``e`` sorted, when the caller has it."""
    n = len(s)
    out = np.zeros(ch.n_batches)
    if n == 0:
        return out
    s = s.astype(np.int64, copy=False)  # read, never written
    e = e.astype(np.int64, copy=False)
    if max(int(np.abs(s).max()), int(np.abs(e).max())) >= (1 << 61):
        return _queue_depth_max_slow(ch, s, e)
    starts = s[ch.firsts]
    if len(starts) > 1 and not (starts[1:] > starts[:-1]).all():  # two batches begin at one instant
        return _queue_depth_max_slow(ch, s, e)
    key = np.concatenate([s * 2 + 1, (np.sort(e, kind="stable") if e_sorted is None else e_sorted) * 2])
    key.sort(kind="stable")  # two sorted runs: one merge
    # the level peaks at entries: after entry i (at merged position p_i, i entries and p_i - i
    # exits before it) it is i + 1 - (p_i - i); a batch's peak is the highest at its entries
    level = np.flatnonzero((key & 1).astype(bool))  # p_i, in entry order (int64)
    del key
    np.subtract(np.arange(1, 2 * n, 2), level, out=level)
    out[ch.batch[ch.firsts]] = np.maximum.reduceat(level, ch.firsts)
    return out


def _queue_depth_max_slow(ch: Chunk, s: np.ndarray, e: np.ndarray) -> np.ndarray:
    """:func:`queue_depth_max` by a sort on (batch, time, exit first): times beyond +-2**61 ns."""
    n = len(s)
    t = np.concatenate([s, e])
    step = np.r_[np.ones(n, dtype=np.int64), -np.ones(n, dtype=np.int64)]
    b = np.concatenate([ch.batch, ch.batch])
    o = np.lexsort((step, t, b))
    level = np.cumsum(step[o])
    bo = b[o]
    first = np.flatnonzero(np.r_[True, bo[1:] != bo[:-1]])
    out = np.zeros(ch.n_batches)
    out[bo[first]] = np.maximum.reduceat(level, first)
    return out


def _per_batch_figures(acc: BatchAccumulator, ch: Chunk, events: ReadEvents, inp: AttributionInputs, d, ev,
                       missed=None):
    """Counts and sums per batch, the slowest event of each, and the totals; ``missed``: per
    event, it missed (``Components.missed``: pages inserted, bios, O_DIRECT, or a request
    that waited; None: the trace cannot tell)."""
    cols, sl, t = events.cols, ch.batches, acc.totals
    acc.sum_call[sl] = ch.per_batch(d)
    slow = is_slow(d, inp.slow_ms)
    acc.slow_calls[sl] = ch.per_batch(slow)
    t.slow += int(slow.sum())
    if cols.has("offset"):
        off = ch.pick(cols.raw("offset", ch.lo, ch.hi))
        if off.dtype.kind in "iub":  # offset + 1, 0 for a negative one (no float round trip)
            off = np.add(off, 1, dtype=np.int64)
            np.clip(off, 0, None, out=off)
        else:  # missing offsets (NaN) count as one value
            off = np.clip(np.nan_to_num(off.astype(np.float64), nan=-1.0) + 1, 0, None).astype(np.int64)
        if inp.path_codes is not None:
            acc.rows[sl] = distinct_per_batch(ch.batch, ch.n_batches, ch.pick(inp.path_codes[ch.lo:ch.hi]), off,
                                              firsts=ch.firsts)
        else:
            acc.rows[sl] = distinct_per_batch(ch.batch, ch.n_batches, off, firsts=ch.firsts)
    if cols.has("ret"):
        ret = ch.pick(cols.raw("ret", ch.lo, ch.hi))
        if ret.dtype.kind not in "iu":  # missing values (NaN) count as no bytes, no error
            ret = np.nan_to_num(ret.astype(np.float64))
        acc.bytes[sl] = ch.per_batch(np.maximum(ret, 0))
        eagain = int(np.count_nonzero(ret == -EAGAIN))
        t.eagain += eagain
        t.errors += int(np.count_nonzero(ret < 0)) - eagain
    if cols.has("flags"):
        fl = ch.pick(cols.raw("flags", ch.lo, ch.hi))
        if fl.dtype.kind not in "iu":
            fl = np.nan_to_num(fl.astype(np.float64)).astype(np.int64)
        t.nowait += int(np.count_nonzero(fl & RWF_NOWAIT))
    longest = np.maximum.reduceat(d, ch.firsts)
    cand = np.flatnonzero(d == longest[ch.batch])
    sp = cand[np.r_[True, ch.batch[cand][1:] != ch.batch[cand][:-1]]]  # the first longest per batch
    acc.slowest_ms[sl] = d[sp] / 1e6
    acc.slowest_pos[sl] = ch.positions()[sp]
    evb = acc.evidence
    pages = ev.pages_added
    if pages is not None:
        evb["misses"][sl] = ch.per_batch(pages)
        evb["slowest_misses"][sl] = pages[sp]
        t.pages_inserted += float(pages.sum())
    if missed is not None:  # inserted pages, queued bios, O_DIRECT, or a request that waited
        evb["calls_with_misses"][sl] = ch.per_batch(missed)
        t.calls_with_misses += int(missed.sum())
        t.slow_with_misses += int(missed[slow].sum())
    if ev.direct is not None:
        evb["direct_calls"][sl] = ch.per_batch(ev.direct)
    _uring_paths_per_batch(acc, ch, events)
    for key, name, div in _PER_BATCH_EVIDENCE:
        v = getattr(ev, name)
        if v is not None:
            evb[key][sl] = ch.per_batch(v) / div
            if name != "bio_count":
                evb["slowest_" + key.replace("_in_calls", "")][sl] = v[sp] / div
    if ev.bio_count is not None:
        t.bios += float(ev.bio_count.sum())
    if ev.reclaim_ns is not None:
        t.reclaim_ns += float(ev.reclaim_ns.sum())
        t.calls_with_reclaim += int((ev.reclaim_ns > 0).sum())
    if ev.offcpu_ns is not None:
        t.offcpu_ns += float(ev.offcpu_ns.sum())
    if ev.runq_ns is not None:
        t.runq_ns += float(ev.runq_ns.sum())


def _miss_events(comp, ev: Evidence) -> tuple[np.ndarray, np.ndarray]:
    """The events whose miss parts stage 6 splits (a miss wait, miss CPU or wake-up, a reap
    wait, or pages inserted), and their time other than the miss wait."""
    other = comp.miss_cpu + comp.wake
    if comp.reap is not None:  # a request's wait for its reap: the miss's cost, never storage
        other = other + comp.reap
    sel = (comp.miss_wait > 0) | (other > 0)
    if ev.pages_added is not None:
        sel |= ev.pages_added > 0
    return sel, other


def _bytes_beside(ev: Evidence, s: np.ndarray, e: np.ndarray, ret: np.ndarray | None,
                  at: np.ndarray) -> np.ndarray | None:
    """Per event, the bytes the target's other reads (calls and faults that queued bios of their
    own) brought in while it was in flight (components.bytes_read_beside); 0 for a read request
    (io_uring, libaio), whose observed service is already its batch's completion interval."""
    if ev.bio_count is not None:
        own = ev.bio_count > 0
    elif ev.pages_added is not None:
        own = ev.pages_added > 0  # Evidence: float64, missing values as 0
    else:
        return None
    request = ev.uring if ev.uring is not None else (ev.io_wait if ev.io_wait is not None else None)
    if request is not None:
        own = own & ~request
        at = at & ~request
    out = np.zeros(len(s))
    idx = np.flatnonzero(own | at)  # only these events take part: the others' figures are 0
    if not len(idx):
        return out
    pages = ev.pages_added[idx] * PAGE_BYTES if ev.pages_added is not None else np.zeros(len(idx))
    nbytes = np.where(pages > 0, pages, np.maximum(np.nan_to_num(np.asarray(ret[idx], dtype=np.float64)), 0.0)) \
        if ret is not None else pages
    out[idx] = bytes_read_beside(s[idx], e[idx], own[idx], nbytes, at[idx])
    return out


def attribute_chunk(acc: BatchAccumulator, ch: Chunk, events: ReadEvents, inp: AttributionInputs) -> None:
    """Everything the pass learns from one chunk of whole batches, into ``acc``."""
    seg = inp.seg
    bstart = seg.start_ns.astype(np.int64, copy=False)  # read, never written
    bend = seg.end_ns.astype(np.int64, copy=False)
    s = ch.pick(events.ts[ch.lo:ch.hi])
    dur = ch.pick(events.dur[ch.lo:ch.hi])
    d = dur.astype(np.float64)
    e = np.minimum(s + dur, bend[ch.batches][ch.batch])
    tcode = ch.pick(inp.threads.code[ch.lo:ch.hi])
    eo = np.argsort(e, kind="stable")  # exits in time order: the union's and the queue depth's
    ev = Evidence.read(events.cols, ch)
    for c, k in ev.nulls.items():
        acc.totals.nulls[c] += k
    off = ch.pick(events.cols.raw("offset", ch.lo, ch.hi)) if events.cols.has("offset") else None
    t_dev = device_ends(s, e, ev, ch.batch, ch.n_batches, off)
    if t_dev is None:
        u = u_dev = inflight_weights(s, e, eo)
        tail_frac = None
    else:  # requests with their own bios: the union by device part, then the wait for the reap
        u_dev, u_tail = device_weights(s, e, t_dev)
        u = u_dev + u_tail
        tail_frac = safe_div(u_tail, u)
    acc.inflight[ch.batches] = ch.per_batch(u)
    acc.queue_depth_max[ch.batches] = queue_depth_max(ch, s, e, e[eo].astype(np.int64, copy=False))
    del eo  # each event's arrays are freed once used: two chunks in flight at once (memory)
    _no_read_time(acc, ch, s, e, tcode, inp.threads.submitter, bstart, bend, inp.loop_gap_us * 1e3,
                  inp.threads.native, inp.hints)
    comp = split_components(d, ch.batch, ch.n_batches, ev, ch.per_batch, ch.any_per_batch, tail_frac,
                            inp.inserting[ch.batches] if inp.inserting is not None else None)
    obs, own = observed_miss_service(ch.batch, ch.n_batches, ev, comp.miss_wait, ch.per_batch, u_dev)
    io_bytes = beside = None
    if obs is not None:
        ret = ch.pick(events.cols.raw("ret", ch.lo, ch.hi)) if events.cols.has("ret") else None
        io_bytes = miss_io_bytes(ch.batch, ch.n_batches, ev, own, ret, lambda w: np.maximum.reduceat(w, ch.firsts))
        beside = _bytes_beside(ev, s, e, ret, _miss_events(comp, ev)[0])  # only the misses' are kept
        acc.observed_own.append(obs[own])
        acc.observed_waited.append(obs[own | (comp.miss_wait > 0)])
    if ev.bio_count is not None and ev.bio_ns is not None:
        with_bios = ev.bio_count > 0
        acc.per_bio.append(np.clip(ev.bio_ns[with_bios], 0, None) / ev.bio_count[with_bios])
    if events.cols.has("offcpu_ns"):
        long_copy = comp.copy > SLOW_COPY_NS
        if ev.uring is not None:  # an io_uring request's on-CPU time is its whole submission's
            long_copy &= ~ev.uring
        acc.totals.slow_copy += int(long_copy.sum())
    native_ev = inp.threads.native[tcode] if inp.threads.native is not None else None
    _causes(acc, ch, d, u, comp, ev, obs, s, inp.refaults, io_bytes, native_ev, beside)
    missed = comp.missed
    del comp, u, u_dev, t_dev, tail_frac, obs, own, io_bytes, native_ev, s, e, tcode, beside
    _per_batch_figures(acc, ch, events, inp, d, ev, missed)


def _attribute_part(acc: BatchAccumulator, ch: Chunk, events: ReadEvents, inp: AttributionInputs):
    part = acc.for_chunk()
    attribute_chunk(part, ch, events, inp)
    return part


def attribute_batches(events: ReadEvents, inp: AttributionInputs, threads: int | None = None) -> BatchAccumulator:
    """Stage 5: one pass over the chunks of whole batches, on ``threads`` threads (default
    ANALYSIS_THREADS: NumPy releases the GIL in the array work), merged in chunk order."""
    acc = BatchAccumulator(inp.seg.n, n_events=int(inp.seg.counts.sum()))
    if inp.refaults is not None:
        acc.pages_per_interval = np.zeros(len(inp.refaults.at))
    workers = ANALYSIS_THREADS if threads is None else threads
    chunks = chunk_plan(inp.seg)
    if workers <= 1:
        parts = (_attribute_part(acc, ch, events, inp) for ch in chunks)
        for part in parts:
            acc.merge(part)
        return acc
    pending: deque = deque()  # at most 2 chunks per thread in flight: memory stays bounded
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="engramprof-analysis") as pool:
        for ch in chunks:
            pending.append(pool.submit(_attribute_part, acc, ch, events, inp))
            if len(pending) >= 2 * workers:
                acc.merge(pending.popleft().result())
        while pending:
            acc.merge(pending.popleft().result())
    return acc
