"""Why each miss happened: every missed page matched to the eviction that removed it.

A miss is a read event that inserted pages into the page cache (``pages_added`` > 0: a
syscall that missed, a major fault).  Its pages are the ones it read (a syscall: the pages of
``[offset, offset + ret)``, each weighted ``min(1, pages_added / pages read)`` because the
kernel does not say which of them were absent; a fault: its page).  Each page is matched to
the last event on the same (file, page) before it, from the ``evictions`` samples
(probes/evictions.bpf.c) and the other misses:

* an eviction -> **reclaim** (kswapd, direct or memcg reclaim, DAMON's proactive reclaim), **dropped** (fadvise DONTNEED,
  drop_caches, truncate / invalidate, madvise PAGEOUT / REMOVE) or **unknown** (its context was not seen), with who
  removed it and how long before the read;
* an earlier miss of the same page with no eviction between -> **unknown** (an eviction the
  probe did not see, or a page of the range that was in fact resident);
* nothing -> **first touch** (never seen resident in the trace), unless the file was watched
  only after the read or eviction records were lost before it, or the target's memory cgroup
  has a limit of its own and its refault counter rose over the window (then **unknown**: the
  page may have been evicted by the group's limit before the trace began; reclaim leaves a
  shadow entry and the kernel counts the page's return as a refault, which the time split's
  estimate weighs).

Reclaim-evicted pages count as reclaim in the time split; first touches and dropped pages as
residency; unknown pages keep the proportional refault estimate (engramprof.analysis.calibrate).
A bundle recorded without the eviction probe has no ``evictions`` samples: :func:`classify`
returns None and the estimate is used everywhere (``miss_cause_method``).  docs/model.md,
"Why pages were missing", says where this can be wrong.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from engramprof.errors import UserError
from engramprof.trace.schema import sample_schema

PAGE = 4096
CAUSES = ("first_touch", "reclaim", "dropped", "unknown")
FIRST_TOUCH, RECLAIM, DROPPED, UNKNOWN = range(4)
RECLAIM_CONTEXTS = ("kswapd", "direct-reclaim", "memcg-reclaim", "proactive-reclaim")
DROP_CONTEXTS = ("fadvise", "drop-caches", "truncate", "madvise")
MAX_PAGES_PER_EVENT = 4096  # a read of more than 16 MiB: its first 16 MiB are classified
METHOD_EVICTIONS = "eviction records (probes/evictions.bpf.c)"
#: a memory cgroup limit at or above this is no limit (cgroup v1's root reports 2**63 - 4096)
NO_LIMIT_BYTES = 1 << 62
METHOD_ESTIMATE = "refault estimate (refaults per page inserted in each sample interval)"


@dataclass
class MissPages:
    """One row per missed page (numpy arrays of equal length) and the evictions they point at."""

    ts: np.ndarray  # entry of the read event that missed it
    pid: np.ndarray
    weight: np.ndarray  # share of the page the event is known to have inserted
    cause: np.ndarray  # FIRST_TOUCH | RECLAIM | DROPPED | UNKNOWN
    eviction: np.ndarray  # row of ``evictions`` that removed it, -1: none
    age_ns: np.ndarray  # read entry - eviction time (0 without an eviction)
    evictions: pd.DataFrame

    def __len__(self) -> int:
        return len(self.ts)


def _col(df: pd.DataFrame, name: str, default=0) -> np.ndarray:
    if name not in df.columns:
        return np.full(len(df), default)
    return pd.to_numeric(df[name], errors="coerce").fillna(default).to_numpy()


def _expand(first: np.ndarray, n: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(owner row, page) for rows each covering pages first..first+n-1."""
    n = np.maximum(n.astype(np.int64), 0)
    owner = np.repeat(np.arange(len(n)), n)
    starts = np.cumsum(n) - n
    within = np.arange(len(owner)) - np.repeat(starts, n)
    return owner, first.astype(np.int64)[owner] + within


def miss_events(calls: pd.DataFrame) -> pd.DataFrame:
    """The read events that inserted pages, with the pages they read (first_page, n_pages)."""
    need = {"ts_ns", "path", "offset", "pages_added"}
    if calls is None or not need <= set(calls.columns) or not len(calls):
        return pd.DataFrame(columns=["ts_ns", "pid", "path", "first_page", "n_pages", "weight"])
    added = _col(calls, "pages_added")
    off = _col(calls, "offset", -1).astype(np.int64)
    sel = np.flatnonzero((added > 0) & (off >= 0))
    sub = calls.iloc[sel]
    off = off[sel]
    ret = _col(sub, "ret", 0).astype(np.int64)
    fault = (sub["kind"].astype(str).to_numpy() == "fault") if "kind" in sub.columns else np.zeros(len(sub), bool)
    nbytes = np.where(fault | (ret <= 0), 1, ret)
    first = off // PAGE
    n = np.minimum((off + nbytes - 1) // PAGE - first + 1, MAX_PAGES_PER_EVENT)
    weight = np.minimum(1.0, added[sel] / np.maximum(n, 1))
    return pd.DataFrame({"ts_ns": _col(sub, "ts_ns").astype(np.int64), "pid": _col(sub, "pid").astype(np.int64),
                         "path": sub["path"].astype(str).to_numpy(), "first_page": first, "n_pages": n,
                         "weight": weight})


def _watched_since(paths: np.ndarray, files: pd.DataFrame | None) -> np.ndarray:
    """Per path, since when its evictions were watched (int64 ns); -1: from the start; max: never."""
    out = np.full(len(paths), -1, dtype=np.int64)
    if files is None or not len(files):
        return out
    first = files.groupby(files["path"].astype(str))["watched_ns"].min()
    v = pd.Series(paths).map(first).to_numpy(dtype=np.float64, na_value=np.nan)
    # "never" set in int64 itself: int64 max through a float64 array rounds to 2**63, which
    # casts to int64 min -- a never-watched file then read as watched from the start
    out = np.full(len(paths), np.iinfo(np.int64).max, dtype=np.int64)
    seen = ~np.isnan(v)
    out[seen] = v[seen].astype(np.int64)
    return out


def classify(calls: pd.DataFrame, evictions: pd.DataFrame | None, files: pd.DataFrame | None = None,
             lost: pd.DataFrame | None = None, start_ns: int | None = None) -> MissPages | None:
    """Every missed page of ``calls`` with its cause; None when there are no eviction records
    (the bundle was recorded without the eviction probe)."""
    if evictions is None:
        return None
    ev = evictions.reset_index(drop=True)
    miss = miss_events(calls)
    owner, page = _expand(miss["first_page"].to_numpy(), miss["n_pages"].to_numpy())
    e_owner, e_page = _expand(_col(ev, "index").astype(np.int64), _col(ev, "pages", 1).astype(np.int64))
    codes, uniq = pd.factorize(pd.concat([miss["path"].astype(str), ev["path"].astype(str)], ignore_index=True)
                               if len(ev) else miss["path"].astype(str))
    m_code, e_code = codes[:len(miss)].astype(np.int64), codes[len(miss):].astype(np.int64)
    mkey = (m_code[owner] << 40) | page
    ekey = (e_code[e_owner] << 40) | e_page
    m_ts = miss["ts_ns"].to_numpy()[owner] if len(owner) else np.empty(0, np.int64)
    e_ts = _col(ev, "ts_ns").astype(np.int64)[e_owner]
    keys = np.concatenate([ekey, mkey])
    ts = np.concatenate([e_ts, m_ts])
    is_miss = np.concatenate([np.zeros(len(ekey), bool), np.ones(len(mkey), bool)])
    order = np.lexsort((is_miss, ts, keys))  # an eviction at the same instant comes first
    pos = np.empty(len(order), dtype=np.int64)
    pos[order] = np.arange(len(order))
    mpos = pos[len(ekey):]  # each missed page's place in the merged order
    prev = mpos - 1
    has_prev = prev >= 0
    prev_c = np.where(has_prev, prev, 0)
    prev_row = order[prev_c]
    same = has_prev & (keys[prev_row] == mkey)
    by_eviction = same & ~is_miss[prev_row]
    eviction = np.where(by_eviction, e_owner[np.minimum(prev_row, max(len(e_owner) - 1, 0))] if len(e_owner) else -1, -1)
    ctx = ev["context"].astype(str).to_numpy() if len(ev) else np.empty(0, dtype=object)
    cause = np.full(len(mkey), UNKNOWN, dtype=np.int8)
    if len(ev):
        ctx_of = ctx[np.maximum(eviction, 0)]
        cause[by_eviction & np.isin(ctx_of, RECLAIM_CONTEXTS)] = RECLAIM
        cause[by_eviction & np.isin(ctx_of, DROP_CONTEXTS)] = DROPPED
    never = ~same
    since = _watched_since(miss["path"].to_numpy(), files)[owner] if len(owner) else np.empty(0, np.int64)
    # never watched, or watched only after this read: nothing can be said
    blind = (since == np.iinfo(np.int64).max) | (since > m_ts)
    if lost is not None and len(lost):
        blind |= m_ts > int(_col(lost, "start_ns").min())
    cause[never & ~blind] = FIRST_TOUCH
    age = np.where(by_eviction, m_ts - e_ts[np.minimum(prev_row, max(len(e_ts) - 1, 0))] if len(e_ts) else 0, 0)
    return MissPages(ts=m_ts, pid=miss["pid"].to_numpy()[owner] if len(owner) else np.empty(0, np.int64),
                     weight=miss["weight"].to_numpy()[owner] if len(owner) else np.empty(0),
                     cause=cause, eviction=eviction.astype(np.int64), age_ns=age.astype(np.int64), evictions=ev)


def miss_causes(mp: MissPages) -> dict:
    """Shares of the missed pages by cause, and how many pages were classified."""
    total = float(mp.weight.sum())
    out = {c: (round(float(mp.weight[mp.cause == i].sum()) / total, 4) if total else 0.0) for i, c in enumerate(CAUSES)}
    out["pages"] = round(total, 1)
    return out


def _evictor_facts(evictors: pd.DataFrame | None) -> dict[int, dict]:
    if evictors is None or not len(evictors):
        return {}
    return {int(r["pid"]): r for r in evictors.to_dict("records")}


def evicted_by(mp: MissPages, evictors: pd.DataFrame | None = None, top: int = 10) -> list[dict]:
    """Who removed the missed pages: one entry per (pid, context), most pages first."""
    total = float(mp.weight.sum())
    sel = mp.eviction >= 0
    if not total or not sel.any():
        return []
    ev = mp.evictions
    rows = mp.eviction[sel]
    df = pd.DataFrame({"pid": _col(ev, "pid").astype(np.int64)[rows],
                       "context": ev["context"].astype(str).to_numpy()[rows],
                       "comm": ev["comm"].astype(str).to_numpy()[rows] if "comm" in ev.columns else "",
                       "target": ev["by_target"].fillna(False).astype(bool).to_numpy()[rows]
                       if "by_target" in ev.columns else False,
                       "w": mp.weight[sel], "age": mp.age_ns[sel] / 1e9})
    facts = _evictor_facts(evictors)
    out = []
    for (pid, context), g in df.groupby(["pid", "context"], sort=False):
        f = facts.get(int(pid), {})
        lo, hi = np.percentile(g["age"].to_numpy(), [5, 95]) if len(g) else (None, None)
        limit = f.get("cgroup_limit_bytes", -1)
        usage = f.get("cgroup_usage_bytes", -1)
        out.append({"pid": int(pid), "comm": str(g["comm"].iloc[0]), "cmdline": f.get("cmdline") or "",
                    "context": context, "target": bool(g["target"].any()), "cgroup": f.get("cgroup") or "",
                    "cgroup_limit_bytes": int(limit) if limit is not None and limit >= 0 else None,
                    "cgroup_usage_bytes": int(usage) if usage is not None and usage >= 0 else None,
                    "pages": round(float(g["w"].sum()), 1), "share": round(float(g["w"].sum()) / total, 4),
                    "before_read_s": [round(float(lo), 3), round(float(hi), 3)]})
    out.sort(key=lambda r: -r["pages"])
    return out[:top]


def batch_shares(mp: MissPages | None, pid: int | None, start_ns: np.ndarray, end_ns: np.ndarray):
    """Per batch, the share of its missed pages evicted by reclaim and the share unknown (NaN:
    no classified page in the batch); None without eviction records."""
    if mp is None:
        return None
    n = len(start_ns)
    sel = np.ones(len(mp), bool) if pid is None else (mp.pid == pid)
    ts = mp.ts[sel]
    b = np.searchsorted(np.asarray(start_ns, dtype=np.int64), ts, side="right") - 1
    ok = b >= 0
    ok[ok] &= ts[ok] < np.asarray(end_ns, dtype=np.int64)[b[ok]]
    b, w, c = b[ok], mp.weight[sel][ok], mp.cause[sel][ok]
    total = np.bincount(b, weights=w, minlength=n)
    rec = np.bincount(b, weights=w * (c == RECLAIM), minlength=n)
    unk = np.bincount(b, weights=w * (c == UNKNOWN), minlength=n)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(total > 0, rec / total, np.nan), np.where(total > 0, unk / total, np.nan)


def summary_keys(mp: MissPages | None, evictors: pd.DataFrame | None = None) -> dict:
    """The ``evicted_by``, ``miss_causes`` and ``miss_cause_method`` keys of the JSON."""
    if mp is None:
        return {"evicted_by": None, "miss_causes": None, "miss_cause_method": METHOD_ESTIMATE}
    return {"evicted_by": evicted_by(mp, evictors), "miss_causes": miss_causes(mp),
            "miss_cause_method": METHOD_EVICTIONS}


def own_group_refaulted(cgroup: pd.DataFrame | None) -> bool:
    """The target's memory cgroup (``samples/cgroup``) has a limit of its own and its refault
    counter rose over the window: its members brought back pages its reclaim had evicted (a
    root group's counter is every process's)."""
    if cgroup is None or not len(cgroup) or not {"limit_bytes", "refault_file"} <= set(cgroup.columns):
        return False
    limit = pd.to_numeric(cgroup["limit_bytes"], errors="coerce")
    return bool((limit < NO_LIMIT_BYTES).any() and pd.to_numeric(cgroup["refault_file"], errors="coerce").sum() > 0)


def _cgroup_samples(getter) -> pd.DataFrame | None:
    try:
        return getter("cgroup") if getter else None
    except UserError:  # unreadable: the analysis's context notes it
        return None


def from_trace(calls: pd.DataFrame, getter, table, meta: dict) -> MissPages | None:
    """:func:`classify` of a bundle: its ``evictions`` / ``evictions_lost`` samples and
    ``eviction_files`` table (``getter``: samples by name, ``table``: tables by name, or None).
    Where the target's own memory cgroup refaulted (:func:`own_group_refaulted`), a page never
    seen resident is unknown, not a first touch."""
    ev = getter("evictions") if getter else None
    if ev is None:
        if not (meta or {}).get("evictions"):
            return None  # recorded without the eviction probe

        ev = sample_schema("evictions").empty_table().to_pandas()
    files = table("eviction_files") if table else None
    lost = getter("evictions_lost") if getter else None
    start = (meta or {}).get("start_ns")
    mp = classify(calls, ev, files, lost, start_ns=start)
    if mp is not None and own_group_refaulted(_cgroup_samples(getter)):
        mp.cause[mp.cause == FIRST_TOUCH] = UNKNOWN
    return mp
