"""Readahead amplification per file: pages brought in for the target's missing reads.

Inputs (all in the bundle): the read events (calls/: syscalls and page faults), the page-cache
insertion runs of samples/pagecache (probes/pagecache.bpf.c) and, when the eviction probe ran,
samples/evictions.  Per file:

- a *missing read* is a read event of the target during which its own thread inserted pages
  into the file (an insertion run of the same thread that starts inside the event's
  [ts_ns, ts_ns + dur_ns]; insertions inside a hint syscall are the hint's, not a read's:
  engramprof/analysis/prefetch.py);
- ``inserted_pages``: the pages those runs inserted -- the read's own pages, sync and async
  readahead, the mmap read-around of a fault;
- ``touched_pages``: the distinct pages the missing reads themselves asked for (a syscall's
  [offset, offset + size), a fault's page): a 256-byte row read from a cold page is 1 page;
- ``amplification`` = inserted_pages / touched_pages (1.0: no readahead);
- ``used_pages``: inserted pages some read event of the target asked for later in the trace; a
  sequential syscall reader has a high amplification and most pages used, a random gather a
  high amplification and few used: only the second is flagged (:data:`FLAG_AMPLIFICATION`).
  For a mapped reader it is a lower bound: a page that fault-around mapped (it was cached
  already) and that the gather then read makes no event, so a *sequential* mapped reader is
  flagged too (docs/model.md, "Readahead amplification");
- ``wasted_pages``: read-ahead pages evicted (samples/evictions) before any read touched them;
  None when the trace has no eviction record (the waste is then unknown, and said).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from engramprof.trace import Trace, load_bundle

PAGE = os.sysconf("SC_PAGE_SIZE")
#: diagnose flags a file above this amplification whose read-ahead pages were mostly unused
FLAG_AMPLIFICATION = 4.0
FLAG_MAX_USED_SHARE = 0.5
CALL_COLUMNS = ["ts_ns", "dur_ns", "pid", "tid", "kind", "path", "offset", "size", "ret", "pages_added",
                "offcpu_ns", "runq_ns", "bio_count", "major", "mapped_pages"]
RA_EVENTS = ("sync_ra", "async_ra", "ra_order", "ra_unbounded")


@dataclass
class PagecacheInputs:
    """What the readahead and prefetch analyses read from one bundle."""

    calls: pd.DataFrame
    pagecache: pd.DataFrame | None  # samples/pagecache (None: the probe did not run)
    hints: pd.DataFrame | None  # samples/pagecache_hints
    evictions: pd.DataFrame | None  # samples/evictions (EVICT's probe)
    evictions_recorded: bool
    notes: list[str] = field(default_factory=list)


def load_inputs(trace) -> PagecacheInputs:
    """From a bundle path, or a loaded :class:`~engramprof.trace.Trace` (its calls are used as
    they are).  The read events are read only when the bundle has page-cache samples."""
    tr = trace if isinstance(trace, Trace) else None
    if tr is None:
        from pathlib import Path

        if not Path(trace).is_dir():  # a bare per-call table: no samples
            return PagecacheInputs(pd.DataFrame(), None, None, None, False)
        tr = load_bundle(trace, columns=["ts_ns"])  # meta and samples first
    pc = tr.samples("pagecache")
    hints = tr.samples("pagecache_hints")
    ev = tr.samples("evictions")
    recorded = ev is not None or isinstance(tr.meta.get("evictions"), dict)
    calls = tr.calls
    if _worth_reading(pc, hints) and not isinstance(trace, Trace):  # else: nothing to match reads to
        calls = load_bundle(trace, columns=CALL_COLUMNS).calls
    return PagecacheInputs(calls, pc, hints, ev, recorded, list(tr.notes))


def _worth_reading(pc: pd.DataFrame | None, hints: pd.DataFrame | None) -> bool:
    """The target inserted pages outside hints, or made a prefetch hint: the read events matter."""
    if pc is not None and len(insertion_runs(pc)):
        return True
    return hints is not None and bool(((hints["advice"].isin(("WILLNEED", "POPULATE_READ")))
                                      | (hints["call"] == "readahead")).any())


def read_pages(calls: pd.DataFrame) -> pd.DataFrame:
    """One row per (read event, page it asked for): ``event`` (row of calls), ``path``, ``page``.
    A syscall asks for [offset, offset + max(size, 1)); a fault for its page."""
    if not len(calls):
        return pd.DataFrame({"event": np.zeros(0, np.int64), "path": pd.Series([], dtype=object),
                             "page": np.zeros(0, np.int64)})
    off = calls["offset"].to_numpy(dtype=np.int64)
    size = np.maximum(calls["size"].fillna(PAGE).to_numpy(dtype=np.int64), 1) if "size" in calls else np.full(len(off), 1)
    ok = off >= 0
    first = np.where(ok, off // PAGE, 0)
    n = np.where(ok, (off + size - 1) // PAGE - first + 1, 0)
    event = np.repeat(np.arange(len(calls)), n)
    start = np.repeat(np.cumsum(n) - n, n)
    page = np.repeat(first, n) + (np.arange(int(n.sum())) - start)
    path = calls["path"]
    cat = path.array if isinstance(path.dtype, pd.CategoricalDtype) else pd.Categorical(path)
    return pd.DataFrame({"event": event, "path": pd.Categorical.from_codes(cat.codes[event], cat.categories),
                         "page": page})


def insertion_runs(pc: pd.DataFrame | None) -> pd.DataFrame:
    """The target's insertion runs outside hints (the ones a read can own)."""
    if pc is None or not len(pc):
        return pd.DataFrame(columns=["ts_ns", "tid", "path", "first_page", "pages"])
    m = (pc["event"] == "insert") & pc["target"].astype(bool) & ~pc["in_hint"].astype(bool)
    return pc.loc[m, ["ts_ns", "tid", "path", "first_page", "pages"]].reset_index(drop=True)


def owning_event(runs: pd.DataFrame, calls: pd.DataFrame) -> np.ndarray:
    """Per insertion run, the row of the read event of the same thread it happened in, or -1."""
    if not len(runs) or not len(calls):
        return np.full(len(runs), -1, dtype=np.int64)
    ev = pd.DataFrame({"ts_ns": calls["ts_ns"].to_numpy(np.int64), "tid": calls["tid"].to_numpy(np.int64),
                       "end": (calls["ts_ns"] + calls["dur_ns"]).to_numpy(np.int64), "event": np.arange(len(calls))})
    r = pd.DataFrame({"ts_ns": runs["ts_ns"].to_numpy(np.int64), "tid": runs["tid"].to_numpy(np.int64),
                      "run": np.arange(len(runs))})
    m = pd.merge_asof(r.sort_values("ts_ns"), ev.sort_values("ts_ns"), on="ts_ns", by="tid", direction="backward")
    inside = m["event"].notna() & (m["ts_ns"] <= m["end"])
    out = np.full(len(runs), -1, dtype=np.int64)
    out[m["run"].to_numpy()[inside.to_numpy()]] = m.loc[inside, "event"].to_numpy(np.int64)
    return out


def _expand(first: np.ndarray, n: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(index of the run, page) for every page of runs [first, first + n)."""
    n = np.maximum(n.astype(np.int64), 0)
    run = np.repeat(np.arange(len(first)), n)
    start = np.repeat(np.cumsum(n) - n, n)
    return run, np.repeat(first.astype(np.int64), n) + (np.arange(int(n.sum())) - start)


def _first_after(pages: pd.DataFrame, later: pd.DataFrame) -> np.ndarray:
    """Per row of ``pages`` (page, ts_ns), the first ts_ns of ``later`` (page, ts_ns) on the same
    page at or after it; NaN when none."""
    if not len(pages):
        return np.zeros(0)
    if not len(later):
        return np.full(len(pages), np.nan)
    a = pages.assign(i=np.arange(len(pages))).sort_values("ts_ns")
    b = later[["page", "ts_ns"]].assign(t=later["ts_ns"].astype(np.float64)).sort_values("ts_ns")
    m = pd.merge_asof(a, b[["ts_ns", "page", "t"]], on="ts_ns", by="page", direction="forward")
    out = np.full(len(pages), np.nan)
    out[m["i"].to_numpy()] = m["t"].to_numpy(dtype=np.float64)
    return out


def touched(calls: pd.DataFrame, rp: pd.DataFrame | None = None) -> pd.DataFrame:
    """Every page the target's reads asked for, with when: (path, page, ts_ns).  A lower bound for
    a mapped reader: a page mapped by a fault's fault-around and read later makes no event.
    ``rp``: :func:`read_pages` of calls, when the caller has it."""
    rp = read_pages(calls) if rp is None else rp
    ts = calls["ts_ns"].to_numpy(np.int64)
    return pd.DataFrame({"path": rp["path"], "page": rp["page"], "ts_ns": ts[rp["event"].to_numpy()]})


def per_file(inp: PagecacheInputs) -> list[dict]:
    """The ``readahead`` list: one entry per file the target's missing reads inserted pages into."""
    calls, runs = inp.calls, insertion_runs(inp.pagecache)
    if not len(runs):
        return []
    owner = owning_event(runs, calls)
    runs = runs.assign(event=owner)
    runs = runs[runs["event"] >= 0]
    if not len(runs):
        return []
    rp = read_pages(calls)
    touch = touched(calls, rp)
    ra = inp.pagecache[inp.pagecache["event"].isin(RA_EVENTS) & inp.pagecache["target"].astype(bool)] \
        if inp.pagecache is not None else None
    out = []
    for path, fr in runs.groupby("path", sort=True):
        missing = np.unique(fr["event"].to_numpy())
        own = rp[rp["event"].isin(missing) & (rp["path"] == path)]
        touched_pages = int(own["page"].nunique())
        run_i, page = _expand(fr["first_page"].to_numpy(), fr["pages"].to_numpy())
        ins = pd.DataFrame({"page": page, "ts_ns": fr["ts_ns"].to_numpy(np.int64)[run_i]})
        inserted = len(ins)
        req = calls["size"].to_numpy()[missing] if "size" in calls else np.full(len(missing), PAGE)
        req = np.where(np.isnan(req.astype(np.float64)), PAGE, req).astype(np.int64)
        ahead = ins[~ins["page"].isin(own["page"])]  # read-ahead pages: not asked for by the missing reads
        t = touch[touch["path"] == path]
        first_touch = _first_after(ahead, t[["page", "ts_ns"]])
        used = int(ins["page"].isin(own["page"]).sum() + np.isfinite(first_touch).sum())
        entry = {"path": str(path), "requested_bytes": int(req.sum()), "inserted_bytes": inserted * PAGE,
                 "amplification": round(inserted / touched_pages, 2) if touched_pages else None,
                 "wasted_pages": _wasted(inp, path, ahead, first_touch),
                 "missing_reads": int(len(missing)), "touched_pages": touched_pages, "inserted_pages": inserted,
                 "readahead_pages": int(len(ahead)), "used_pages": used,
                 "readahead_events": _ra_counts(ra, path), "read_kind": _read_kind(calls, missing)}
        entry["flagged"] = flagged(entry)
        out.append(entry)
    return out


def _ra_counts(ra: pd.DataFrame | None, path) -> dict:
    if ra is None or not len(ra):
        return {k: 0 for k in RA_EVENTS}
    c = ra.loc[ra["path"] == path, "event"].value_counts()
    return {k: int(c.get(k, 0)) for k in RA_EVENTS}


def _wasted(inp: PagecacheInputs, path, ahead: pd.DataFrame, first_touch: np.ndarray) -> int | None:
    """Read-ahead pages evicted before a read touched them; None when evictions were not recorded."""
    if not inp.evictions_recorded:
        return None
    ev = inp.evictions
    if ev is None or not len(ev) or not len(ahead):
        return 0
    e = ev[ev["path"] == path]
    if not len(e):
        return 0
    run_i, page = _expand(e["index"].to_numpy(), e["pages"].to_numpy())
    gone = pd.DataFrame({"page": page, "ts_ns": e["ts_ns"].to_numpy(np.int64)[run_i]})
    first_gone = _first_after(ahead, gone)
    return int((np.isfinite(first_gone) & ~(first_touch <= first_gone)).sum())


def flagged(entry: dict) -> bool:
    """Amplification above FLAG_AMPLIFICATION with most read-ahead pages never used."""
    amp = entry.get("amplification")
    if amp is None or amp <= FLAG_AMPLIFICATION or not entry.get("inserted_pages"):
        return False
    return entry["used_pages"] / entry["inserted_pages"] < FLAG_MAX_USED_SHARE


def finding(entries: list[dict]) -> str | None:
    """The sentence diagnose says about flagged files (None when none is flagged)."""
    bad = [e for e in entries if e.get("flagged")]
    if not bad:
        return None
    e = max(bad, key=lambda x: x["inserted_pages"])
    return (f"readahead amplification {e['amplification']:g}x on {os.path.basename(e['path'])}: "
            f"{e['inserted_pages']:,} pages brought in for {e['touched_pages']:,} pages the missing reads asked for, "
            f"{e['used_pages']:,} of them ever read")


def _read_kind(calls: pd.DataFrame, missing: np.ndarray) -> str:
    """How the missing reads reached the file: ``fault`` (a mapping) when most of them were page
    faults, else ``syscall`` (read / pread / io_uring / libaio through the page cache)."""
    if "kind" not in calls or not len(missing):
        return "syscall"
    kinds = calls["kind"].to_numpy()[missing]
    return "fault" if (kinds == "fault").mean() > 0.5 else "syscall"


#: the device-wide switch, named in every readahead fix
DEVICE_SWITCH = "lower the device's read_ahead_kb (/sys/block/DEV/queue/read_ahead_kb)"
#: file formats whose library has its own readahead switch: (test on the file name, the switch)
LIBRARY_SWITCHES = (
    (lambda name: name.endswith(".mdb"), "LMDB",
     "open the LMDB environment with MDB_NORDAHEAD (py-lmdb: lmdb.open(path, readahead=False))"),
)
MAPPING_SWITCH = ("madvise(MADV_RANDOM) on the mapping (numpy.memmap: m._mmap.madvise(mmap.MADV_RANDOM); "
                  "torch, faiss and other mappings: madvise on the mapped range)")
FD_SWITCH = "posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM) on the fd (Python: os.posix_fadvise)"


def fix(entries: list[dict]) -> str | None:
    """Readahead off, with the switch that fits the reader of the worst flagged file: the
    library's own (LMDB's MDB_NORDAHEAD), else MADV_RANDOM on a mapping or POSIX_FADV_RANDOM on
    an fd, whichever way its missing reads came; and the device's read_ahead_kb.  None when no
    file is flagged."""
    bad = [e for e in entries if e.get("flagged")]
    if not bad:
        return None
    e = max(bad, key=lambda x: x["inserted_pages"])
    name = os.path.basename(e["path"])
    lib = next(((lib, switch) for test, lib, switch in LIBRARY_SWITCHES if test(name)), None)
    if lib is not None:
        how = f"{lib[1]} ({name} is an {lib[0]} file)"
    else:
        how = MAPPING_SWITCH if e.get("read_kind") == "fault" else FD_SWITCH
    return f"Turn readahead off for {name}: {how}, or {DEVICE_SWITCH}."



def note(inp: PagecacheInputs) -> str | None:
    if inp.pagecache is None:
        return "page-cache insertions were not recorded: readahead and prefetch unknown"
    if not inp.evictions_recorded:
        return "evictions were not recorded: wasted_pages (read ahead, evicted unread) unknown"
    return None
