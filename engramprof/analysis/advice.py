"""The advice for each verdict: the hint batch-tail prints, the fix diagnose recommends and how
to confirm it, worded once so that two commands never word the same verdict differently.

The fix is part of the answer (it is in the JSON), so it is made here, in the analysis; the
report layer only renders it.
"""
from __future__ import annotations

from engramprof.analysis.baseline import writing_devices
from engramprof.units import pct

#: O_DIRECT reads are the story from this share of the read events on (analysis/paths.py)
DIRECT_MAJORITY = 0.5

ADVICE = {
    "python-scheduling": {
        "hint": "reads are cheap but the batch waits on futures, wake-ups and GIL hand-offs: "
                "read cached rows synchronously with RWF_NOWAIT and send only EAGAIN rows to the pool",
        "fix": "Serve cached rows without the thread pool: try each row synchronously with "
               "preadv(..., RWF_NOWAIT), retry the EAGAIN rows once, send only the rows still "
               "missing to the existing blocking pool (keep the pool as the fallback where NOWAIT "
               "is unsupported).",
        "confirm": "engramprof replay TRACE --strategies pool,nowait (component A/B on these rows), "
                   "then a second `engramprof diagnose --pid PID` after the change, same load",
    },
    "residency": {
        "hint": "requested rows are not in the page cache and calls wait for the device: check residency of "
                "the hot rows (engramprof residency) and keep them cached",
        "fix": "The rows the batches need are not in the page cache: keep the hot rows resident "
               "(give the page cache room for the table's working set, prefetch the hot tensors, "
               "avoid evicting them with DONTNEED or other large readers), or shrink the hot set.",
        "confirm": "engramprof residency --rows TRACE (hot rows resident?), then a second "
                   "`engramprof diagnose --pid PID`",
    },
    "reclaim": {
        "hint": "memory pressure evicts the rows or the readers stall in reclaim: check the cgroup memory limit, "
                "refaults and memory PSI",
        "fix": "Rows were cached but memory pressure evicted them (refaults) or the readers stall "
               "in reclaim: give the process or its cgroup memory headroom (raise memory limit / "
               "memory.high, move other memory users out), and check for stale shared memory.",
        "confirm": "engramprof sample --pid PID (refaults, PSI memory, cgroup reclaim ~0), then a "
                   "second `engramprof diagnose --pid PID`",
    },
    "storage": {
        "hint": "misses are served slower than normal device service: check io PSI, blkio throttles and the "
                "device queue",
        "fix": "Misses wait far longer than the device's normal service: check the I/O path "
               "(blkio / io.max throttles, queue depth, a saturated or degraded device, noisy "
               "neighbours on the same disk); raise queue depth only if the device has headroom.",
        "confirm": "engramprof diagnose --pid PID again after the change; iostat -x for device "
                   "utilisation and await",
    },
    "healthy": {
        "hint": "no cause explains a meaningful share of batch time",
        "fix": "No cause explains a meaningful share of batch time: the read path is not what "
               "holds this window back. Look upstream (queueing, prefill, collectives) before "
               "changing the reader.",
        "confirm": "repeat `engramprof diagnose` on a window where decode steps are slow",
    },
}


#: where a memory-mapped reader (page faults) needs other advice than a syscall reader
ADVICE_FAULTS = {
    "python-scheduling": {
        "hint": "the rows are mapped and cheap to gather, but the batch waits on the pool's futures and "
                "wake-ups: gather on the calling thread",
        "fix": "Gather the rows on the calling thread: a fancy-index gather from mapped, resident pages is a "
               "memory copy, and splitting it across a thread pool only adds futures, wake-ups and GIL "
               "hand-offs. Keep the pool for batches whose pages are not resident, if at all.",
        "confirm": "engramprof diagnose --pid PID after the change, same load (python-scheduling share down, "
                   "batch p50 down)",
    },
    "residency": {
        "hint": "the mapped rows are not in the page cache: each cold row is a major fault that waits for "
                "the device",
        "fix": "Keep the hot rows resident or fetch them ahead: madvise(MADV_RANDOM) on the mapping (no "
               "readahead of pages the gather never uses), madvise(MADV_WILLNEED) on the next batch's rows "
               "early enough, or room in the page cache for the table's working set.",
        "confirm": "engramprof residency --rows TRACE (hot rows resident?), then a second "
                   "`engramprof diagnose --pid PID`",
    },
}


#: where every read bypasses the page cache (O_DIRECT): a miss is every read, by design
ADVICE_DIRECT = {
    "residency": {
        "hint": "every read bypasses the page cache (O_DIRECT) and waits for the device: keep more reads in flight "
                "per batch, or keep the hot rows in memory",
        "fix": "Every read bypasses the page cache (O_DIRECT), so every row waits for the device, which serves at "
               "its normal speed: keep more reads in flight per batch ({depth}) so that their device waits overlap "
               "(submit the batch's rows together through io_uring or libaio, or widen the pool), or keep the hot "
               "rows in memory (an application-side cache of the hot rows, or buffered reads for the hot tensors "
               "so that the page cache holds them).",
        "confirm": "engramprof diagnose --pid PID after the change, same load (queue depth up or residency share "
                   "down, batch p50 down)",
    },
}


def queue_depth_words(bt: dict) -> str:
    """How many reads each batch had in flight, in words (batch-tail's ``queue_depth``)."""
    qd = ((bt.get("queue_depth") or {}).get("max") or {})
    if qd.get("p50") is None:
        return "the queue depth was not measured"
    return f"now at most {qd['p50']:.0f} at once in a median batch, {qd['p99']:.0f} at p99"


def direct_share_of(bt: dict) -> float:
    return float((bt.get("direct") or {}).get("share") or 0.0)


def advice(verdict: str, read_path: str = "syscalls") -> dict:
    """The advice for a verdict, fitted to the read path seen (``syscalls``, ``faults``, ``both``)."""
    if read_path == "faults" and verdict in ADVICE_FAULTS:
        return ADVICE_FAULTS[verdict]
    return ADVICE[verdict]


# ---------------------------------------------------------------- why the pages were missing

def _gib(n) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def _who(e: dict) -> str:
    """One evictor in words: `pid 4242 (`sh -c ...`)`, memcg reclaim of /group (limit ...)."""
    ctx = e.get("context")
    cmd = e.get("cmdline") or e.get("comm") or "?"
    cmd = cmd if len(cmd) <= 100 else cmd[:97] + "..."  # the JSON keeps it whole
    if ctx == "kswapd":
        return f"kswapd (global reclaim, {e.get('comm')})"
    if ctx == "proactive-reclaim":
        return f"proactive reclaim ({e.get('comm')}: DAMON)"
    if ctx == "memcg-reclaim":
        lim, use = e.get("cgroup_limit_bytes"), e.get("cgroup_usage_bytes")
        extra = ", ".join(x for x in ((f"limit {_gib(lim)}" if lim else ""),
                                      (f"usage {_gib(use)} when first seen" if use else "")) if x)
        who = "the traced process itself" if e.get("target") else f"`{cmd}`"
        return (f"memcg reclaim of {e.get('cgroup') or '?'}" + (f" ({extra})" if extra else "")
                + f" in pid {e['pid']} ({who})")
    if ctx == "direct-reclaim":
        who = "the traced process itself" if e.get("target") else f"`{cmd}`"
        return f"direct reclaim in pid {e['pid']} ({who})"
    how = {"fadvise": "POSIX_FADV_DONTNEED", "drop-caches": "a drop_caches write", "truncate": "truncation",
           "madvise": "MADV_PAGEOUT / MADV_REMOVE"}.get(ctx)
    who = "the traced process itself" if e.get("target") else f"`{cmd}`"
    return f"pid {e['pid']} ({who})" + (f" with {how}" if how else " (context not seen)")


def miss_story(bt: dict) -> str | None:
    """The sentence that says why the missed pages were missing (``miss_causes`` and
    ``evicted_by`` of a batch-tail summary), or None without eviction records."""
    causes, by = bt.get("miss_causes"), bt.get("evicted_by") or []
    if not causes or not causes.get("pages"):
        return None
    main = max(("first_touch", "reclaim", "dropped", "unknown"), key=lambda c: causes.get(c) or 0)
    if main == "first_touch":
        return (f"residency: {pct(causes['first_touch'])} of the {causes['pages']:,.0f} missed pages were first touches "
                "(never seen resident in the trace)")
    if main == "unknown" or not by:
        ev = bt.get("evidence") or {}
        est = ev.get("refault_frac_of_misses_est")
        kernel = (f"; the kernel counted {pct(est)} of the pages brought in as refaults ({ev.get('refault_source')}: "
                  "pages reclaim had evicted)" if est else "")
        return (f"{pct(causes['unknown'])} of the {causes['pages']:,.0f} missed pages could not be matched to an "
                "eviction (evicted before the trace or while records were lost)" + kernel)
    want = (("kswapd", "direct-reclaim", "memcg-reclaim", "proactive-reclaim") if main == "reclaim"
            else ("fadvise", "drop-caches", "truncate", "madvise"))
    top = next((e for e in by if e.get("context") in want), by[0])
    cause = "reclaim" if main == "reclaim" else "residency"
    lo, hi = (top.get("before_read_s") or [None, None])[:2]
    when = f" {lo:.1f}-{hi:.1f} s before they were read" if lo is not None and hi is not None else ""
    return (f"{cause}: {pct(top['share'])} of the missed pages had been evicted by {_who(top)}{when}"
            + (f" ({pct(causes[main])} by {main} in all)" if causes[main] - top["share"] > 0.05 else ""))


def advice_for(verdict: str, read_path: str, bt: dict) -> dict:
    """:func:`advice`, with the fix naming the evictor when the eviction records show one, and
    the O_DIRECT fix (queue depth, or the hot rows in memory) when most reads bypassed the page
    cache (``direct`` of a batch-tail summary, analysis/paths.py)."""
    base = dict(advice(verdict, read_path))
    if verdict in ADVICE_DIRECT and direct_share_of(bt) >= DIRECT_MAJORITY:
        base = dict(ADVICE_DIRECT[verdict])
        base["fix"] = base["fix"].format(depth=queue_depth_words(bt))
        return base
    by = bt.get("evicted_by") or []
    causes = bt.get("miss_causes") or {}
    if verdict == "residency" and (causes.get("dropped") or 0) >= 0.5:
        top = next((e for e in by if e.get("context") in ("fadvise", "drop-caches", "truncate", "madvise")), None)
        if top is not None:
            base["fix"] = (f"Stop the dropper: {_who(top)} evicted {pct(top['share'])} of the missed pages. Remove or "
                           "reschedule it (a drop_caches cron job, a DONTNEED on the table's file), or exclude the "
                           "table's files from it; then the rows stay resident. Otherwise: " + base["fix"])
    elif verdict == "reclaim" and by:
        top = next((e for e in by if e.get("context") in ("kswapd", "direct-reclaim", "memcg-reclaim",
                                                          "proactive-reclaim")), None)
        if top is not None and top["context"] == "memcg-reclaim":
            base["fix"] = (f"The table's pages were reclaimed by {_who(top)}: raise that cgroup's memory limit "
                           "(memory.max / memory.limit_in_bytes) above the table's working set plus the process's own "
                           "memory, move other page-cache users (streamed checkpoints, logs) out of the group, or "
                           "shrink the working set.")
        elif top is not None and top["context"] == "proactive-reclaim":
            base["fix"] = (f"The table's pages were reclaimed by {_who(top)}: DAMON_RECLAIM pages out memory it "
                           "sees idle for min_age; raise min_age (or its quota) above the table's reuse interval, or "
                           "turn it off for this host (/sys/module/damon_reclaim/parameters/enabled).")
        elif top is not None:
            base["fix"] = (f"The table's pages were reclaimed by {_who(top)} (system memory pressure): give the host "
                           "memory headroom (fewer or smaller co-located jobs, no large streaming reads through the page "
                           "cache: O_DIRECT or POSIX_FADV_DONTNEED on the streamed files), or pin the hot rows.")
    elif verdict == "storage" and busy_writing(bt.get("device_traffic")):
        t = bt["device_traffic"]
        base["fix"] = (f"The device ({writing_devices(t)}) wrote {_gib(t['write_bytes'])} in {t['writes']:,} writes and served "
                       f"{t['flushes']:,} cache flushes while it read {_gib(t['read_bytes'])}: the misses queue behind "
                       "writeback and flushes. Move the writers off the table's device (checkpoints, logs, swap, "
                       "other tenants), cap their bandwidth (io.max wbps for their cgroup), or smooth the writeback "
                       "(a lower vm.dirty_background_bytes: smaller bursts). Otherwise: " + base["fix"])
    return base


def busy_writing(traffic: dict | None) -> bool:
    """The table's device wrote at least as many bytes as it read over the window (the
    summary's ``device_traffic``): a storage verdict whose reads queued behind writes."""
    return bool(traffic) and traffic.get("write_bytes", 0) > 0 and \
        traffic.get("write_bytes", 0) >= traffic.get("read_bytes", 0)
