"""Stage 5's arithmetic: how one read event's time splits into components, and who owns
each instant of the in-flight union.  Pure functions over arrays (docs/model.md).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from engramprof.analysis.events import REQUEST_KINDS
from engramprof.trace import EVIDENCE_COLUMNS

PAGE_BYTES = 4096  # the page cache's page (pages_added counts these)


def safe_div(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """num / den where den > 0, else 0 (float64)."""
    num = np.asarray(num, dtype=np.float64)
    den = np.asarray(den, dtype=np.float64)
    out = np.zeros(np.broadcast_shapes(num.shape, den.shape))
    np.divide(num, den, out=out, where=den > 0)
    return out


def inflight_weights(s: np.ndarray, e: np.ndarray, eo: np.ndarray | None = None) -> np.ndarray:
    """Per call, its part of the in-flight union: each instant is shared equally among the
    calls in flight then.  ``s`` (entries) must be sorted; returns float64 ns, sum = union.

    A merge of the sorted entries with the sorted exits gives the concurrency k between
    consecutive events; F(t) = integral of 1/k over in-flight time; u_c = F(e_c) - F(s_c).
    At equal times entries sort before exits, so zero-length overlaps never drop k to 0.
    The merge is one sort of values, time * 2 (+ 1 for an exit): entries come out in call order
    and exits in exit order (events at equal times have equal F), so no permutation is
    inverted.  ``eo``: the stable argsort of ``e`` when the caller has it.
    """
    n = len(s)
    if n == 0:
        return np.empty(0, dtype=np.float64)
    s = np.asarray(s, dtype=np.int64)
    e = np.asarray(e, dtype=np.int64)
    if eo is None:
        eo = np.argsort(e, kind="stable")  # exits are nearly sorted: one timsort pass
    if min(s[0], e[eo[0]]) < -_KEY_LIMIT or max(s[-1], e[eo[-1]]) >= _KEY_LIMIT:  # time * 2 would overflow
        return _inflight_weights_by_argsort(s, e, eo)
    key = np.empty(2 * n, dtype=np.int64)
    np.multiply(s, 2, out=key[:n])
    np.multiply(e[eo], 2, out=key[n:])
    key[n:] += 1
    key.sort(kind="stable")  # two sorted runs: one merge
    is_exit = (key & 1).astype(bool)
    key >>= 1  # the merged times
    # concurrency after each merged event (exact small integers): +1 an entry, -1 an exit,
    # summed as int32 (|k| <= n; 4x quicker than a float64 cumsum), then float64: same values.
    # (Arithmetic on the flags, and below indices from flatnonzero, not np.where or a boolean
    # mask: those branch on every element, 3-4x slower on flags in no order; same values.)
    k = np.subtract(1, is_exit.view(np.int8) * np.int8(2), dtype=np.int32)
    np.cumsum(k, out=k)
    k = k.astype(np.float64)
    w = np.diff(key).astype(np.float64)  # integer differences first: times beyond 2**53 ns stay exact
    del key
    k = k[:-1]
    np.putmask(k, k == 0, np.inf)  # nothing in flight: no share (dt / inf = 0)
    w /= k
    del k
    F = np.empty(2 * n, dtype=np.float64)
    F[0] = 0.0
    np.cumsum(w, out=F[1:])
    del w
    u = np.empty(n, dtype=np.float64)
    u[eo] = F[np.flatnonzero(is_exit)]  # F at each exit, back in call order
    np.logical_not(is_exit, out=is_exit)
    u -= F[np.flatnonzero(is_exit)]  # F at each entry (already in call order)
    return u


_KEY_LIMIT = 1 << 62


def _inflight_weights_by_argsort(s: np.ndarray, e: np.ndarray, eo: np.ndarray) -> np.ndarray:
    """:func:`inflight_weights` for times beyond +-2**62 ns: the merge as a stable argsort."""
    n = len(s)
    both = np.concatenate([s, e[eo]])
    order = np.argsort(both, kind="stable")
    t = both[order]
    is_entry = order < n
    k = np.cumsum(is_entry, dtype=np.int64) * 2 - np.arange(1, 2 * n + 1)
    dt = np.diff(t).astype(np.float64)
    w = np.where(k[:-1] > 0, dt / np.maximum(k[:-1], 1), 0.0)
    F = np.empty(2 * n, dtype=np.float64)
    F[0] = 0.0
    np.cumsum(w, out=F[1:])
    u = np.empty(n, dtype=np.float64)
    u[eo] = F[~is_entry]
    u -= F[is_entry]
    return u


def exit_holders(e: np.ndarray, reach: np.ndarray) -> np.ndarray:
    """Per event (entry order), the index of the event holding the latest exit so far
    (``reach``: the running maximum of the exits ``e``): the last event up to it whose exit is
    that maximum.  Each event that sets or equals the maximum, repeated over the events it holds
    it for (int64; the first event always holds)."""
    holds = np.flatnonzero(e >= reach)
    return np.repeat(holds, np.diff(holds, append=len(e)))


def distinct_per_batch(b: np.ndarray, nb: int, *cols: np.ndarray, firsts: np.ndarray | None = None) -> np.ndarray:
    """Number of distinct tuples of the (non-negative int) ``cols`` per batch ``b``.
    ``firsts``: where ``b`` never decreases and every batch has an event, each batch's first
    index (the count is then taken between them, not from the keys' batch bits)."""
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
        # the batch bits never decrease: a merge sort finds them in order and only sorts
        # within batches (3x quicker than the default quicksort here, the same values)
        key.sort(kind="stable")
        run = np.empty(len(key), dtype=bool)
        run[0] = True
        np.not_equal(key[1:], key[:-1], out=run[1:])
        if firsts is not None and len(firsts) == nb:  # sorted keys keep b's order: b's segments
            return np.diff(np.searchsorted(np.flatnonzero(run), np.r_[firsts, len(key)]))
        return np.bincount(key[np.flatnonzero(run)] >> total, minlength=nb)
    frame = pd.DataFrame({"b": b, **{f"c{i}": c for i, c in enumerate(cols)}})
    dup = frame.duplicated().to_numpy()
    return np.bincount(b[~dup], minlength=nb)


@dataclass
class Evidence:
    """The evidence columns of a chunk's kept events (float64, missing values as 0; None:
    the trace has no such column).  ``nulls``: per column, how many values were missing."""

    pages_added: np.ndarray | None
    bio_count: np.ndarray | None
    bio_ns: np.ndarray | None
    reclaim_ns: np.ndarray | None
    offcpu_ns: np.ndarray | None
    runq_ns: np.ndarray | None
    nulls: dict

    #: per event, a read request (io_uring or libaio) that waited for I/O (served async or
    #: punted to io-wq, or O_DIRECT): its submit -> complete time is an I/O wait of the
    #: submitting thread (a miss), never on-CPU work nor scheduling; None: no request in the chunk
    io_wait: np.ndarray | None = None
    #: per event, a read request (None: none in the chunk); the probe that records it does not
    #: measure the evidence columns on it: their nulls are not "missing".  An io_uring request's
    #: copy time includes the submission of the requests submitted with it (CQEs come after it)
    uring: np.ndarray | None = None
    #: per event, the file was open with O_DIRECT: the read bypassed the page cache and waited
    #: for the device (None: no event says so)
    direct: np.ndarray | None = None

    @classmethod
    def read(cls, cols, chunk) -> "Evidence":
        uring, io_wait, direct = _requests(cols, chunk)
        vals, nulls = {}, {}
        for c in EVIDENCE_COLUMNS:
            v = None
            if c in cols.calls.columns:
                raw = chunk.pick(cols.raw(c, chunk.lo, chunk.hi))
                v = raw.astype(np.float64)  # a copy: the stages may write to it
                nulls[c] = 0
                if raw.dtype.kind == "f":  # an integer column has no missing value
                    bad = np.isnan(v)
                    # a request's evidence is not measured by its probe: not "missing"
                    nulls[c] = int(np.count_nonzero(bad if uring is None else bad & ~uring))
                    if bad.any():
                        v[bad] = 0.0
            vals[c] = v
        return cls(nulls=nulls, io_wait=io_wait, uring=uring, direct=direct, **vals)


#: io_uring paths on which a request waited for its data (not read inline in the submit)
WAITED_URING_PATHS = ("async", "punted")


def _codes_of(cols, name: str, chunk) -> tuple[np.ndarray, list[str]] | None:
    """Per kept event of the chunk, the code of a text column, and the code's values (None: no
    such column or no value in it)."""
    if name not in cols.calls.columns or not cols.has(name):
        return None
    codes, uniques = cols.codes(name)
    lo, hi = chunk.lo, chunk.hi
    c = chunk.pick(codes[lo:hi] if cols.order is None else codes[cols.order[lo:hi]])  # int8/16/32: compared only
    return c, [str(u) for u in uniques]


def _requests(cols, chunk) -> tuple[np.ndarray | None, np.ndarray | None, np.ndarray | None]:
    """(requests, those that waited for I/O, O_DIRECT events) among a chunk's kept events; None
    where the chunk has none.  A request is an io_uring SQE (its ``uring_path`` set) or a libaio
    iocb (``kind``).  An io_uring request served ``inline`` read the page cache in the submitting
    thread's io_uring_enter (on its CPU); ``async`` and ``punted`` ones, and every O_DIRECT
    request, waited for the device (engramprof/bpf/uring.py, docs/model.md).  A buffered libaio
    read is done inside io_submit (Linux AIO is asynchronous only with O_DIRECT): it counts as
    waited only when its own evidence says it missed (split_components)."""
    lo, hi = chunk.lo, chunk.hi
    direct = None
    if "direct" in cols.calls.columns and cols.has("direct"):
        d = np.nan_to_num(chunk.pick(cols.raw("direct", lo, hi)).astype(np.float64)) > 0
        direct = d if d.any() else None
    n = len(chunk.batch)
    req = np.zeros(n, dtype=bool)
    waited = np.zeros(n, dtype=bool)
    up = _codes_of(cols, "uring_path", chunk)
    if up is not None:
        c, vals = up
        req |= c >= 0
        waited |= np.isin(c, [i for i, v in enumerate(vals) if v in WAITED_URING_PATHS])
    kind = _codes_of(cols, "kind", chunk)
    if kind is not None:
        c, vals = kind
        req |= np.isin(c, [i for i, v in enumerate(vals) if v in REQUEST_KINDS])
    if not req.any():
        return None, None, direct
    if direct is not None:
        waited |= req & direct
    return req, waited, direct


@dataclass
class Components:
    """Each event's duration split into parts (ns, float64) that sum to it.

    reclaim: direct + memcg reclaim; preempt: run-queue wait not caused by a miss (CPU
    contention); wake: run-queue wait of an event that slept on a miss (waiting for a CPU once
    its page is there: part of the miss's cost); miss_wait: voluntary off-CPU time in a miss
    context (the event or its batch had misses); unexplained: voluntary off-CPU time otherwise;
    miss_cpu: on-CPU time of an event with misses; copy: on-CPU time of an event without;
    reap: of a request, the time after its device part (its bios done) until its completion
    reached the process (the reaping thread's wake-up or late reap: the miss's cost, never
    storage; :func:`device_weights`).
    ``missed``: the event inserted pages (or queued bios); None when the trace cannot tell."""

    reclaim: np.ndarray
    preempt: np.ndarray
    wake: np.ndarray
    miss_wait: np.ndarray
    miss_cpu: np.ndarray
    copy: np.ndarray
    unexplained: np.ndarray
    missed: np.ndarray | None
    reap: np.ndarray | None = None


def missed_events(ev: Evidence) -> np.ndarray | None:
    """Per event, it missed: it inserted pages into the page cache, or queued bios (an O_DIRECT
    read inserts nothing: its bios are the device read), or read an O_DIRECT file (the page cache
    was bypassed: the read waited for the device whatever else was measured).  None when the
    trace cannot tell (no evidence column, no O_DIRECT flag).  A request's own wait (io_wait) is
    added by :func:`split_components`."""
    missed = None
    for v in (ev.pages_added, ev.bio_count):
        if v is not None:
            missed = (v > 0) if missed is None else (missed | (v > 0))
    if ev.direct is not None:
        missed = ev.direct.copy() if missed is None else (missed | ev.direct)
    return missed


def _bincounter(batch: np.ndarray, n_batches: int):
    return lambda w: np.bincount(batch, weights=w, minlength=n_batches)


def split_components(d: np.ndarray, batch: np.ndarray, n_batches: int, ev: Evidence, per_batch=None,
                     any_per_batch=None, tail_frac: np.ndarray | None = None,
                     batch_inserting: np.ndarray | None = None) -> Components:
    """Split durations ``d`` into :class:`Components`.  Without offcpu_ns the time left after
    reclaim and the run-queue wait is a miss wait in events with misses, unexplained otherwise.
    ``per_batch(weights)``: per-batch sums (default: a bincount over ``batch``);
    ``any_per_batch(flags)``: per batch, whether any flag is set (default: from per_batch);
    ``tail_frac``: per event, the share of its time after its device part (a request's wait for
    its reap, :func:`device_weights`): taken from a request's miss wait as ``reap``;
    ``batch_inserting``: per batch, the target inserted pages of the files it reads outside its
    read events (engramprof/analysis/own_insertions.py): a miss context as a batch whose reads
    missed."""
    per_batch = per_batch or _bincounter(batch, n_batches)
    n = len(d)
    recl = np.clip(ev.reclaim_ns, 0, d) if ev.reclaim_ns is not None else np.zeros(n)
    runq = np.clip(ev.runq_ns, 0, d - recl) if ev.runq_ns is not None else np.zeros(n)
    missed = missed_events(ev)
    offcpu = ev.offcpu_ns
    if ev.io_wait is not None and ev.io_wait.any():
        # a request that waited for I/O: submit -> complete is a miss's wait (the thread sleeps
        # in io_uring_enter / io_getevents, or works on while the device serves the read)
        w = ev.io_wait
        missed = w.copy() if missed is None else (missed | w)
        base = offcpu if offcpu is not None else np.zeros(n)
        offcpu = np.where(w, np.maximum(base, d - recl), base)
    if missed is not None:
        batch_missed = any_per_batch(missed) if any_per_batch else per_batch(missed) > 0
        if batch_inserting is not None:
            batch_missed = batch_missed | batch_inserting
        in_miss_ctx = missed | batch_missed[batch]
    if offcpu is not None:
        vol = np.clip(offcpu - (ev.runq_ns if ev.runq_ns is not None else 0.0), 0, d - recl - runq)
        oncpu = d - recl - runq - vol
        if missed is not None:
            miss_wait = np.where(in_miss_ctx, vol, 0.0)
            wake = np.where(in_miss_ctx & (vol > 0), runq, 0.0)
            miss_cpu = np.where(missed, oncpu, 0.0)
        else:
            miss_wait = wake = miss_cpu = np.zeros(n)
        unexplained = vol - miss_wait
        copy = oncpu - miss_cpu
    else:
        rest = d - recl - runq
        miss_wait = np.where(missed, rest, 0.0) if missed is not None else np.zeros(n)
        wake = np.where(missed, runq, 0.0) if missed is not None else np.zeros(n)
        unexplained = rest - miss_wait
        miss_cpu = copy = np.zeros(n)
    reap = None
    if tail_frac is not None and ev.uring is not None:
        # a request's time after its bios were done: waiting for its reap, not for the device
        reap = np.where(ev.uring, np.minimum(miss_wait, d * tail_frac), 0.0)
        miss_wait = miss_wait - reap
    return Components(reclaim=recl, preempt=runq - wake, wake=wake, miss_wait=miss_wait, miss_cpu=miss_cpu,
                      copy=copy, unexplained=unexplained, missed=missed, reap=reap)


def device_ends(s: np.ndarray, e: np.ndarray, ev: Evidence, batch: np.ndarray, n_batches: int,
                offset: np.ndarray | None = None) -> np.ndarray | None:
    """Per event, when its device part ended (int64 ns; None when no request has timed bios:
    nothing changes).

    * a request (io_uring, libaio) with timed bios of its own: its submit plus its bios' mean
      queue -> complete (the bios of one request are queued together at its issue);
    * a request whose bios were counted but not timed (merged into another request's, or the
      bio table's slot was taken; or timed longer than its own interval, which no bio credited
      inside it can be), with no bio because another request of its batch read the
      same offset (the libaio probe credits one of them), or buffered with neither a bio nor a
      page inserted (it waited for a page another read brought in): the latest device end of
      its batch's timed requests (its data came with one of theirs);
    * every other event: its exit.  A call's whole interval is its own service; a request with
      no bio of its own keeps its whole interval as the device's: bios held by a throttle before
      the block layer are queued by the throttle's worker, never credited to the request."""
    if ev.uring is None or ev.bio_count is None or ev.bio_ns is None:
        return None
    req = ev.uring
    # a bio's queue -> complete is credited only inside its request's interval: a mean beyond the
    # interval is not a measure of it (seen on io_uring requests with readahead: seconds)
    per_bio = safe_div(ev.bio_ns, ev.bio_count)
    timed = req & (ev.bio_count > 0) & (ev.bio_ns > 0) & (per_bio <= e - s)
    if not timed.any():
        return None
    t = e.astype(np.int64, copy=True)
    t[timed] = np.clip(s[timed] + np.ceil(per_bio[timed]).astype(np.int64), s[timed], e[timed])
    untimed = req & (ev.bio_count > 0) & ~timed
    if ev.pages_added is not None:
        # buffered, no page inserted, no bio: it waited for a page another read brought in
        # (readahead, or a request reading the same page); a throttle-held buffered request did
        # insert its pages (before its bios were held), an O_DIRECT one inserts none: both stay whole
        buffered = ~ev.direct if ev.direct is not None else np.ones(len(req), dtype=bool)
        untimed |= req & buffered & (ev.bio_count <= 0) & (ev.pages_added <= 0)
    if offset is not None:
        lost = np.flatnonzero(req & (ev.bio_count <= 0))
        if len(lost):
            with_bio = np.flatnonzero(req & (ev.bio_count > 0))
            mine = pd.MultiIndex.from_arrays([batch[lost], offset[lost]])
            untimed[lost[mine.isin(pd.MultiIndex.from_arrays([batch[with_bio], offset[with_bio]]))]] = True
    if untimed.any():
        latest = np.full(n_batches, np.iinfo(np.int64).min)
        np.maximum.at(latest, batch[timed], t[timed])
        lb = latest[batch[untimed]]
        known = lb > np.iinfo(np.int64).min
        idx = np.flatnonzero(untimed)[known]
        t[idx] = np.clip(lb[known], s[idx], e[idx])
    return t


def device_weights(s: np.ndarray, e: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per event, its part of the in-flight union split into (device, tail): each instant at
    which some event is in its device part ([s, t]) is shared among those events; each instant
    at which events are in flight but none is in its device part (every one of them done at the
    device, waiting to be reaped) is shared among the events in flight, as their tail.  The two
    sum, over the events, to the union of [s, e] (:func:`inflight_weights` shares it by
    in-flight events alone); an event with ``t == e`` has no tail.  A sweep over the entries,
    device ends and exits (at equal times in that order)."""
    n = len(s)
    if n == 0:
        return np.empty(0), np.empty(0)
    times = np.concatenate([np.asarray(s, np.int64), np.asarray(t, np.int64), np.asarray(e, np.int64)])
    what = np.repeat(np.arange(3, dtype=np.int8), n)  # 0 entry, 1 device end, 2 exit
    if -_KEY_LIMIT // 2 <= times.min() and times.max() < _KEY_LIMIT // 2:  # time * 4 + what fits
        order = np.argsort(times * 4 + what, kind="stable")
    else:
        order = np.lexsort((what, times))
    w = what[order]
    k = np.cumsum(np.where(w == 0, 1, np.where(w == 2, -1, 0)))[:-1]  # in flight after each point
    m = np.cumsum(np.where(w == 0, 1, np.where(w == 1, -1, 0)))[:-1]  # in their device part
    dt = np.diff(times[order]).astype(np.float64)
    dev = np.zeros(len(order))
    tail = np.zeros(len(order))
    np.cumsum(np.where(m > 0, dt / np.maximum(m, 1), 0.0), out=dev[1:])
    np.cumsum(np.where((m == 0) & (k > 0), dt / np.maximum(k, 1), 0.0), out=tail[1:])
    pos = np.empty(3 * n, dtype=np.int64)
    pos[order] = np.arange(3 * n)
    return dev[pos[n:2 * n]] - dev[pos[:n]], tail[pos[2 * n:]] - tail[pos[:n]]


def observed_miss_service(batch: np.ndarray, n_batches: int, ev: Evidence, miss_wait: np.ndarray, per_batch=None,
                          union_share: np.ndarray | None = None):
    """Per event, the observed service time of one miss I/O, as the event experienced it.

    An event that queued bios: max(its mean bio queue->complete time, its voluntary miss wait
    per bio) -- the wait shows what bio timing cannot: bios held by a throttle before they
    reach the block layer, queueing ahead of it.  An event that waited without queueing a bio
    (on a page another thread's read or readahead is bringing in): its whole voluntary miss
    wait.  Otherwise the batch's mean bio time.  Without bio columns the same with pages
    inserted as the I/O count.  A request that waited (io_uring, libaio) is one I/O of its own,
    served at the interval its batch's waited requests came back at from the device: their part
    of the union while in their device part (``union_share``, :func:`device_weights`: up to their
    bios' completion, not their reap) over their number -- not its own
    submit -> complete nor its bios' queue -> complete, which at queue depth N hold the N - 1
    requests ahead of it (a batch submitted at once would make half its requests "slower than
    normal" on a device at its normal speed).  Returns (observed, own): ``own`` marks events that did
    their own I/O, whose observed times define the trace's normal; (None, None) without evidence."""
    if ev.bio_count is not None and ev.bio_ns is not None:
        num, den = np.clip(ev.bio_ns, 0, None), ev.bio_count
    elif ev.pages_added is not None:
        num, den = miss_wait, ev.pages_added
    elif ev.io_wait is not None:
        num, den = np.zeros(len(miss_wait)), np.zeros(len(miss_wait))
    else:
        return None, None
    per_batch = per_batch or _bincounter(batch, n_batches)
    b_den = per_batch(den)
    b_num = per_batch(num)
    batch_mean = np.where(b_den > 0, safe_div(b_num, b_den), np.nan)
    observed = np.where(miss_wait > 0, miss_wait, batch_mean[batch])
    own = den > 0
    mine = np.flatnonzero(own)  # the few events with their own I/O
    den_own = np.asarray(den[mine], dtype=np.float64)
    observed[mine] = np.maximum(num[mine] / den_own, miss_wait[mine] / den_own)
    if ev.io_wait is not None and ev.io_wait.any():
        # every request that waited, with bios of its own or not: at queue depth N its bios'
        # queue -> complete holds the N - 1 ahead of it in the device queue too
        req = ev.io_wait
        share = union_share if union_share is not None else miss_wait
        interval = safe_div(per_batch(np.where(req, share, 0.0)), per_batch(req))
        observed = np.where(req, interval[batch], observed)
        own = own | req
    return observed, own


def _finite(x: np.ndarray) -> np.ndarray:
    """``np.nan_to_num(x)`` without its five passes where every value is finite already (an
    integer column's values, an evidence column whose missing values were zeroed)."""
    return x if np.isfinite(x).all() else np.nan_to_num(x)


def miss_io_bytes(batch: np.ndarray, n_batches: int, ev: Evidence, own: np.ndarray, ret: np.ndarray | None,
                  max_per_batch=None) -> np.ndarray:
    """Per event, the size of the I/O its observed miss service (:func:`observed_miss_service`)
    is one of, for the device baseline of that size (engramprof.analysis.baseline): an event
    that did its own I/O, the bytes per bio it queued (pages inserted, or the bytes returned
    when the page cache was bypassed); without bio columns one page; an event that waited on
    another's read, the largest read any event of its batch started (it waited for one of them:
    a readahead window is a large read)."""
    from_pages = _finite(ev.pages_added) * PAGE_BYTES if ev.pages_added is not None else np.zeros(len(batch))
    if ret is not None:
        whole = np.where(from_pages > 0, from_pages, np.maximum(_finite(ret.astype(np.float64, copy=False)), 0.0))
    else:
        whole = from_pages
    if ev.bio_count is not None and ev.bio_ns is not None:
        per_io = whole / np.maximum(ev.bio_count, 1.0)
    else:
        per_io = np.full(len(batch), float(PAGE_BYTES))
    if max_per_batch is None:
        biggest = np.zeros(n_batches)
        np.maximum.at(biggest, batch, whole)
    else:
        biggest = max_per_batch(whole)
    return np.where(own, per_io, np.maximum(biggest[batch], PAGE_BYTES))


def bytes_read_beside(s: np.ndarray, e: np.ndarray, own: np.ndarray, nbytes: np.ndarray,
                      at: np.ndarray | None = None) -> np.ndarray:
    """Per event, the bytes the target's *other* reads brought in while it was in flight: the
    device's queue of the target's own I/O beside it (docs/model.md, "Queued behind its own
    reads").  Each event of ``own`` (it queued bios of its own) spreads its ``nbytes`` evenly
    over its [s, e); the sum of those rates is integrated over each event's own [s, e), less
    its own bytes.  ``s`` sorted or not; int64 ns.  ``at``: only these events' figures are
    computed (the others 0): the rate is every own event's, the integrals only where asked."""
    n = len(s)
    out = np.zeros(n)
    s = np.asarray(s, dtype=np.int64)
    e = np.asarray(e, dtype=np.int64)
    b = np.nan_to_num(np.asarray(nbytes, dtype=np.float64))
    sel = np.asarray(own, dtype=bool) & (e > s) & (b > 0)
    if not sel.any():
        return out
    r = b[sel] / (e[sel] - s[sel]).astype(np.float64)  # bytes per ns over its interval
    t = np.concatenate([s[sel], e[sel]])
    d = np.concatenate([r, -r])
    o = np.argsort(t, kind="stable")
    t, d = t[o], d[o]
    rate = np.cumsum(d)  # the summed rate from breakpoint k to k + 1
    g = np.zeros(len(t))
    np.cumsum(rate[:-1] * np.diff(t).astype(np.float64), out=g[1:])

    def integral(x: np.ndarray) -> np.ndarray:  # of the summed rate from the first breakpoint to x
        ox = np.argsort(x, kind="stable")  # sorted needles: searchsorted walks t once (10x faster)
        k = np.empty(len(x), dtype=np.int64)
        k[ox] = np.searchsorted(t, x[ox], side="right") - 1
        kk = np.maximum(k, 0)
        return np.where(k >= 0, g[kk] + rate[kk] * (x - t[kk]).astype(np.float64), 0.0)

    if at is None:
        at = np.ones(n, dtype=bool)
    if not at.any():
        return out
    out[at] = np.clip(integral(e[at]) - integral(s[at]) - np.where(sel[at], b[at], 0.0), 0.0, None)
    return out
