"""Prefetch hit rate: of the pages the target hinted, how many were ready when it read them.

Hints (samples/pagecache_hints): ``fadvise`` / ``madvise`` WILLNEED, ``madvise``
POPULATE_READ and ``readahead(2)``, each with its file pages.  For every (hint, page) pair the
*first read after the hint* is the first read event of the target (a syscall whose range holds
the page, or a fault on it) that starts after the hint's entry and before the page's next hint.
That read found the page

- **ready** (a hit) when it neither inserted pages itself nor waited: no insertion run of its
  thread inside it, no voluntary sleep (``offcpu_ns - runq_ns`` = 0), not ``major`` (a fault
  that found the page still locked for I/O is retried: VM_FAULT_RETRY), not EAGAIN (an
  RWF_NOWAIT read of a page still in flight);
- **late** otherwise: the page was not in the page cache (the hint came too late, was dropped,
  or the page was evicted since) or its I/O had not completed.

This is what mincore(2) tells (a page counts as resident once it is in the page cache *and*
up to date), measured at the read instead of sampled.  ``hit_rate`` = ready / (pairs read);
pairs never read in the trace are ``unread_pages``.
"""
from __future__ import annotations

import errno

import numpy as np
import pandas as pd

from engramprof.analysis import readahead
from engramprof.analysis.hint_calls import prefetching
from engramprof.analysis.readahead import (
    PagecacheInputs,
    _expand,
    insertion_runs,
    owning_event,
    read_pages,
)

def hinted_pages(hints: pd.DataFrame | None) -> pd.DataFrame:
    """(hint row, path, page, ts_ns) of every page a prefetching hint named."""
    if hints is None or not len(hints):
        return pd.DataFrame({"hint": [], "path": [], "page": [], "ts_ns": []})
    h = hints[prefetching(hints) & (hints["pages"] > 0)
              & (hints["path"] != "")]
    h = h.reset_index(drop=True)
    run, page = _expand(h["first_page"].to_numpy(), h["pages"].to_numpy())
    return pd.DataFrame({"hint": run, "path": h["path"].to_numpy(dtype=object)[run], "page": page,
                         "ts_ns": h["ts_ns"].to_numpy(np.int64)[run]})


def late_events(calls: pd.DataFrame, pagecache: pd.DataFrame | None) -> np.ndarray:
    """Per read event: it inserted pages or waited (see the module doc)."""
    n = len(calls)
    late = np.zeros(n, dtype=bool)
    if not n:
        return late
    runs = insertion_runs(pagecache)
    own = owning_event(runs, calls)
    late[own[own >= 0]] = True
    if "pages_added" in calls:
        late |= calls["pages_added"].fillna(0).to_numpy() > 0
    if "offcpu_ns" in calls and "runq_ns" in calls:
        late |= (calls["offcpu_ns"].fillna(0) - calls["runq_ns"].fillna(0)).to_numpy() > 0
    if "major" in calls:
        late |= calls["major"].fillna(False).to_numpy(dtype=bool)
    if "ret" in calls:
        late |= calls["ret"].fillna(0).to_numpy() == -errno.EAGAIN
    return late


def summary(inp: PagecacheInputs) -> dict:
    """The ``prefetch`` object: hints, hinted_pages, hit_rate, late_pages (+ read / unread pages)."""
    hints = inp.hints
    n_prefetching = 0
    if hints is not None and len(hints):
        n_prefetching = int(prefetching(hints).sum())
    hp = hinted_pages(hints)
    out = {"hints": n_prefetching, "hinted_pages": int(len(hp)), "hit_rate": None, "late_pages": 0,
           "read_pages": 0, "unread_pages": int(len(hp))}
    if not len(hp) or not len(inp.calls):
        return out
    late = late_events(inp.calls, inp.pagecache)
    rp = read_pages(inp.calls)
    rp = rp.assign(ts_ns=inp.calls["ts_ns"].to_numpy(np.int64)[rp["event"].to_numpy()],
                   late=late[rp["event"].to_numpy()])
    key = {p: i for i, p in enumerate(pd.unique(hp["path"]))}
    hp = hp.assign(pk=hp["path"].map(key).astype(np.int64) * (1 << 40) + hp["page"], pair=np.arange(len(hp)))
    rp = rp[rp["path"].isin(key)]
    if not len(rp):
        return out
    rp = rp.assign(pk=rp["path"].map(key).astype(np.int64) * (1 << 40) + rp["page"])
    # each read -> the latest hint of its page at or before it; the first such read decides the pair
    m = pd.merge_asof(rp.sort_values("ts_ns"), hp[["ts_ns", "pk", "pair"]].sort_values("ts_ns"), on="ts_ns", by="pk",
                      direction="backward")
    m = m[m["pair"].notna()]
    first = m.sort_values("ts_ns", kind="stable").drop_duplicates("pair", keep="first")
    read = len(first)
    n_late = int(first["late"].sum())
    out.update(read_pages=read, unread_pages=int(len(hp) - read), late_pages=n_late,
               hit_rate=round((read - n_late) / read, 4) if read else None)
    return out


def json_keys(trace_dir) -> dict:
    """``readahead``, ``prefetch`` and ``pagecache_note`` for diagnose --json and batch-tail --json."""
    try:
        inp = readahead.load_inputs(trace_dir)
    except Exception as exc:  # a bare Parquet table, an unreadable bundle: the other keys still stand
        return {"readahead": [], "prefetch": summary(PagecacheInputs(pd.DataFrame(), None, None, None, False)),
                "pagecache_note": f"page-cache events not read ({type(exc).__name__})"}
    return {"readahead": readahead.per_file(inp), "prefetch": summary(inp), "pagecache_note": readahead.note(inp)}
