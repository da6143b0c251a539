"""Stage 6: what normal miss service is, how many misses were refaults, and the split of each
miss's time into residency, storage and reclaim (docs/model.md, "Misses").

* normal: ``--normal-miss-us``; else the device baseline for the size of each miss's I/O
  (engramprof.analysis.baseline: the trace's own bios per size class, else the device's own
  counters); else the median observed service per miss I/O of the events that did their own
  I/O, capped at NORMAL_MISS_CEILING_US;
* storage fraction of a miss wait = max(0, 1 - normal / observed), where a read that was in
  flight beside other reads of the target (a queue of its own readahead windows) has their
  bytes at the throughput floor added to its normal (baseline.queued_ns);
* refault fraction of a sample interval = the target's (or the system's) refaults in it per
  page the target inserted in it, capped at 1: that share of the miss time is reclaim.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engramprof.analysis.attribute import BatchAccumulator
from engramprof.analysis.baseline import DeviceBaseline, queued_ns
from engramprof.analysis.components import safe_div
from engramprof.analysis.context import RefaultSeries

#: a miss I/O slower than this is never "normal device service" unless the caller says so
NORMAL_MISS_CEILING_US = 1000.0


def percentiles(a: np.ndarray, qs) -> list[float | None]:
    """Percentiles of the finite values of ``a`` (one partition for all of ``qs``)."""
    a = np.asarray(a)
    if not np.issubdtype(a.dtype, np.integer):
        a = np.asarray(a, dtype=np.float64)
        a = a[np.isfinite(a)]
    if not len(a):
        return [None] * len(qs)
    return [float(v) for v in np.percentile(a, list(qs))]


def percentile(a: np.ndarray, q: float) -> float | None:
    return percentiles(a, (q,))[0]


def ms_pair(a_ns: np.ndarray) -> dict:
    p50, p99 = percentiles(a_ns, (50, 99))
    return {"p50": None if p50 is None else p50 / 1e6, "p99": None if p99 is None else p99 / 1e6}


@dataclass
class MissService:
    normal_ns: float | None
    source: str | None
    per_bio: np.ndarray | None  # bio queue->complete per bio, ns
    waited_ms: dict | None  # p50/p99 of the observed service of every event that waited on a miss
    baseline: DeviceBaseline | None = None  # normal per I/O size (used when it is known)


def calibrate_miss_service(acc: BatchAccumulator, normal_miss_us: float | None, has_bio: bool,
                           requests_only: bool = False, baseline: DeviceBaseline | None = None) -> MissService:
    """The normal service of one miss I/O on this trace (or the caller's figure).
    ``requests_only``: every read event is a request (io_uring, libaio), whose wait is its
    submit -> complete (components.observed_miss_service).  With a known device ``baseline``
    the normal is per I/O size (``normal_ns`` then holds the normal of the median miss I/O, for
    display)."""
    own = np.concatenate(acc.observed_own) if acc.observed_own else np.empty(0)
    trace_normal = percentile(own, 50) if len(own) else None
    basis = ("median submit -> complete of the read requests that waited for the device (one read each)"
             if requests_only else
             "median service per miss I/O of the trace (max of bio queue->complete and the wait per bio)"
             if has_bio else "median miss wait per inserted page of the trace (no bio columns)")
    # requests alone (io_uring, libaio): their service is measured as each batch's completion
    # interval, which a deep queue does not inflate; a bio's queue -> complete does (it holds the
    # queue), so the device baseline is for calls and faults
    use_baseline = normal_miss_us is None and baseline is not None and baseline.known and not requests_only
    if normal_miss_us is not None:
        normal_ns, source = float(normal_miss_us) * 1e3, "--normal-miss-us"
    elif use_baseline:
        sizes = np.concatenate(acc.miss.io_bytes) if acc.miss.io_bytes else np.empty(0)
        sizes = sizes[np.isfinite(sizes)]
        typical = float(np.median(sizes)) if len(sizes) else 4096.0
        normal_ns = float(baseline.normal_ns_for(typical))
        source = f"device baseline per I/O size, from {baseline.source} ({typical / 1024:,.0f} KiB: the median miss I/O)"
    elif trace_normal is not None:
        normal_ns, source = float(trace_normal), basis
        if normal_ns > NORMAL_MISS_CEILING_US * 1e3:
            normal_ns = NORMAL_MISS_CEILING_US * 1e3
            source = f"{basis}, capped at {NORMAL_MISS_CEILING_US:g} µs"
    else:
        normal_ns, source = None, None
    waited = np.concatenate(acc.observed_waited) if acc.observed_waited else np.empty(0)
    per_bio = np.concatenate(acc.per_bio) if acc.per_bio else None
    return MissService(normal_ns=normal_ns, source=source, per_bio=per_bio,
                       waited_ms=ms_pair(waited) if len(waited) else None,
                       baseline=baseline if use_baseline else None)


def refault_fractions(acc: BatchAccumulator, refaults: RefaultSeries | None) -> np.ndarray | None:
    """Per sample interval, refaults per page the target inserted (at most 1); None: unknown."""
    if refaults is None or acc.pages_per_interval is None:
        return None
    return np.minimum(1.0, safe_div(refaults.refaults, acc.pages_per_interval))


def split_miss_time(acc: BatchAccumulator, service: MissService, fractions: np.ndarray | None,
                    evicted: tuple[np.ndarray, np.ndarray] | None = None) -> None:
    """Add each miss's time to residency, storage and reclaim (stage 6 of the pipeline).

    ``evicted``: per batch, the shares of its missed pages evicted by reclaim and of unknown
    cause (engramprof.analysis.misses.batch_shares; NaN: none classified).  Where given, the
    reclaim fraction of a miss is the reclaim share plus the unknown share times the refault
    estimate, instead of the estimate alone."""
    parts = acc.miss.arrays()
    acc.miss = type(acc.miss)()  # free the lists
    b = parts["batch"].astype(np.int64)
    obs = parts["observed"]
    if service.normal_ns is not None:
        normal = np.full(len(obs), service.normal_ns)
        if service.baseline is not None and len(obs):
            sized = service.baseline.normal_ns_for(np.nan_to_num(parts["io_bytes"], nan=4096.0))
            normal = np.where(np.isfinite(sized), sized, normal)
        # behind the target's own reads in flight beside it a read waits for them too
        normal = normal + queued_ns(parts["beside"])
        ok = np.isfinite(obs) & (obs > 0)
        f_storage = np.where(ok, np.clip(1.0 - normal / np.where(ok, obs, 1.0), 0, 1), 0.0)
    else:
        f_storage = np.zeros(len(b))
    if fractions is not None:
        j = parts["interval"].astype(np.int64)
        rf = np.where(j >= 0, fractions[np.maximum(j, 0)] if len(fractions) else 0.0, 0.0)
        acc.totals.refaulted_pages += float((rf * parts["pages"]).sum())
    else:
        rf = np.zeros(len(b))
    if evicted is not None and len(b):
        rec, unk = evicted[0][b], evicted[1][b]
        rf = np.where(np.isfinite(rec), rec + np.nan_to_num(unk) * rf, rf)
    wait, other = parts["wait"], parts["other"]
    n = acc.n
    acc.cause_ns["residency"] += np.bincount(b, weights=(wait * (1.0 - f_storage) + other) * (1.0 - rf), minlength=n)
    acc.cause_ns["storage"] += np.bincount(b, weights=wait * f_storage * (1.0 - rf), minlength=n)
    acc.cause_ns["reclaim"] += np.bincount(b, weights=rf * (wait + other), minlength=n)


def unsplit_wait_ns(acc: BatchAccumulator, service: MissService, has_observed: bool) -> float:
    """Miss-wait time that could not be split into residency and storage (no evidence)."""
    return acc.totals.miss_wait_ns if (service.normal_ns is None or not has_observed) else 0.0
