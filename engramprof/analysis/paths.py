"""The read paths a trace saw, and the figures each path needs in the answer (issue 22).

A read event is a syscall (``preadv2``, ``preadv``, ``pread64``, ``read``, ``readv``), a page
fault, an io_uring request or a libaio iocb; each of the first and the last two says whether
it bypassed the page cache (``direct``, O_DIRECT).  :func:`read_paths` counts the events of
each (kind, syscall, direct) so that batch-tail and diagnose name what they analysed;
:func:`path_figures` adds, for the requests, how many were in flight per batch (queue depth),
how io_uring served them (inline / async / punted) and their submit -> complete time against
the device's bio service, and for O_DIRECT reads the sentence diagnose states as evidence.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from engramprof.analysis.advice import DIRECT_MAJORITY  # noqa: F401  (the one threshold)
from engramprof.analysis.calibrate import ms_pair, percentiles
from engramprof.analysis.events import code_faults
from engramprof.units import duration, pct

#: the evidence diagnose states when reads bypassed the page cache
DIRECT_EVIDENCE = "O_DIRECT: the page cache is bypassed; every read waits for the device"
URING_PATHS = ("inline", "async", "punted")


def _codes(calls: pd.DataFrame, name: str) -> tuple[np.ndarray, list[str]]:
    """A text column as small integer codes (-1: missing or absent) and the code's values, without
    turning millions of rows into Python strings (a categorical's own codes)."""
    if name not in calls.columns:
        return np.full(len(calls), -1, dtype=np.int64), []
    s = calls[name]
    if isinstance(s.dtype, pd.CategoricalDtype):  # its own codes: small integers, no copy
        return _one_if_constant(s.cat.codes.to_numpy()), [str(c) for c in s.cat.categories]
    codes, uniques = pd.factorize(s, use_na_sentinel=True)
    return codes.astype(np.int64), [str(u) for u in uniques]


def _direct(calls: pd.DataFrame) -> np.ndarray:
    """Per row: 1 O_DIRECT, 0 buffered, -1 not known (no flag, or a fault)."""
    if "direct" not in calls.columns:
        return np.full(len(calls), -1, dtype=np.int8)
    col = calls["direct"]
    if isinstance(col.dtype, np.dtype) and col.dtype.kind in "biuf":  # a plain column: no copy of it
        d = _one_if_constant(col.to_numpy()).astype(np.float64)
    else:
        d = pd.to_numeric(col, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
    return np.where(np.isnan(d), -1, d > 0).astype(np.int8)


def _one_if_constant(a: np.ndarray) -> np.ndarray:
    """A column one value fills (the trace reader's zero-stride view; small codes all equal) as
    that one value (a 1-element array: it broadcasts against the others), else the array."""
    if a.ndim != 1 or len(a) < 2:
        return a
    if a.strides[0] == 0 or (a.dtype.itemsize == 1 and a.dtype.kind == "i" and a.min() == a.max()):
        return a[:1]
    return a


def read_paths(calls: pd.DataFrame) -> list[dict]:
    """The read paths seen, most events first: ``{kind, syscall, direct, events, share}``;
    ``syscall`` names a syscall read's call (None for the other kinds), ``direct`` is True
    (O_DIRECT), False (buffered) or None (not known: a fault, or an older trace).  Page faults on
    the process's own code are not table reads and are not counted.  One bincount over the
    columns' codes: no per-row Python object."""
    if calls.empty:
        return []
    code = code_faults(calls)
    if code is not None and code.any():
        calls = calls[~code]
    if "kind" in calls.columns:
        kc, kinds = _codes(calls, "kind")
    else:
        kc, kinds = np.zeros(len(calls), dtype=np.int64), ["syscall"]
    kinds = kinds + ["syscall"]  # a missing kind is a syscall (format 1)
    kc = np.arange(len(kinds), dtype=np.int32)[kc]  # -1 (missing) -> the trailing syscall
    sc, names = _codes(calls, "syscall")
    names = names + [""]
    sc = np.arange(len(names), dtype=np.int32)[sc]  # -1 -> the trailing ""
    dc = _direct(calls).astype(np.int32) + 1  # 0 unknown, 1 buffered, 2 O_DIRECT
    key = (kc * len(names) + sc) * 3 + dc
    total = int(len(calls))
    if len(key) == 1 < total:  # every column one value: one path
        counts = np.zeros(len(kinds) * len(names) * 3, dtype=np.int64)
        counts[int(key[0])] = total
    else:
        counts = np.bincount(np.broadcast_to(key, (total,)), minlength=len(kinds) * len(names) * 3)
    merged: dict[tuple, int] = {}
    for k in np.flatnonzero(counts):
        kind = kinds[k // (3 * len(names))]
        sysname = names[(k // 3) % len(names)] if kind == "syscall" else ""
        d = int(k % 3) - 1
        merged[(kind, sysname, d)] = merged.get((kind, sysname, d), 0) + int(counts[k])
    out = [{"kind": kind, "syscall": (sysname or None) if kind == "syscall" else None,
            "direct": None if d < 0 else bool(d), "events": n, "share": float(n / total) if total else 0.0}
           for (kind, sysname, d), n in merged.items()]
    return sorted(out, key=lambda p: -p["events"])


def path_label(p: dict) -> str:
    """One read path in words: ``pread64 (O_DIRECT)``, ``io_uring (buffered)``, ``page fault``."""
    name = p.get("syscall") or {"fault": "page fault"}.get(p["kind"], p["kind"])
    how = {True: " (O_DIRECT)", False: " (buffered)"}.get(p.get("direct"), "")
    return name + how


def direct_share(paths: list[dict]) -> float:
    """Share of the read events that bypassed the page cache."""
    total = sum(p["events"] for p in paths)
    return float(sum(p["events"] for p in paths if p.get("direct")) / total) if total else 0.0


def device_ms(bio_hist: pd.DataFrame | None) -> dict | None:
    """p50 / p99 of the target's bios, queue -> complete, from the kernel's log2 histogram
    (``tables/bio_latency_log2``): the lower edge of the bucket, ms (the true value is below twice it)."""
    if bio_hist is None or not len(bio_hist) or not {"ns_lower", "count"} <= set(bio_hist.columns):
        return None
    h = bio_hist.sort_values("ns_lower")
    c = h["count"].to_numpy(np.float64)
    if c.sum() <= 0:
        return None
    cum = np.cumsum(c)
    lower = h["ns_lower"].to_numpy(np.float64)

    def q(x: float) -> float:
        return float(lower[int(np.searchsorted(cum, x * cum[-1], side="left"))]) / 1e6

    return {"p50": q(0.5), "p99": q(0.99), "bios": int(c.sum()), "method": "log2 histogram, lower bucket edge"}


def _own_bio_ms(calls: pd.DataFrame, req: np.ndarray) -> dict | None:
    """The device time of the requests' own bios (queue -> complete per bio, ms), where the
    source credits each request its bios; None where it does not (the columns null)."""
    if not {"bio_count", "bio_ns"} <= set(calls.columns):
        return None
    n = pd.to_numeric(calls["bio_count"], errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)[req]
    t = pd.to_numeric(calls["bio_ns"], errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)[req]
    ok = np.isfinite(n) & np.isfinite(t) & (n > 0)
    if not ok.any():
        return None
    return {**ms_pair(t[ok] / n[ok]), "bios": int(n[ok].sum()), "method": "the requests' own bios"}


def _uring_figures(calls: pd.DataFrame, batches: pd.DataFrame, device: dict | None) -> dict | None:
    if "uring_path" not in calls.columns:
        return None
    up = calls["uring_path"]
    req = up.notna().to_numpy()
    if not req.any():
        return None
    paths = up[req].astype(str).value_counts()
    n = int(req.sum())
    dur = calls["dur_ns"].to_numpy()[req]
    own = _own_bio_ms(calls, req)
    out = {
        "requests": n,
        "paths": {p: int(paths.get(p, 0)) for p in URING_PATHS},
        "path_shares": {p: float(paths.get(p, 0) / n) for p in URING_PATHS},
        "direct": int(np.count_nonzero(_direct(calls)[req] == 1)),
        "submit_complete_ms": ms_pair(dur),
        "device_ms": own or device,
    }
    if len(batches) and "uring_inline" in batches.columns:
        per = batches[[f"uring_{p}" for p in URING_PATHS]].sum(axis=1).to_numpy()
        qd = batches["queue_depth_max"].to_numpy(np.float64)[per > 0] if "queue_depth_max" in batches else []
        p50, p99 = percentiles(np.asarray(qd, dtype=np.float64), (50, 99))
        out["queue_depth_max"] = {"p50": p50, "p99": p99}
        out["batches_with_requests"] = int((per > 0).sum())
    return out


def path_figures(calls: pd.DataFrame, batches: pd.DataFrame, bio_hist: pd.DataFrame | None) -> dict:
    """The summary keys of the read paths: ``read_paths`` (:func:`read_paths`), ``queue_depth``
    (per batch, the most reads in flight at once, and the time-weighted mean while any was:
    p50 / p99 over batches), ``io_uring`` (requests, paths, submit -> complete against the
    device's bio time, queue depth; None without io_uring requests) and ``direct`` (the O_DIRECT
    share and its evidence sentence; None when no read bypassed the page cache)."""
    paths = read_paths(calls)
    qd = {}
    if len(batches) and "queue_depth_max" in batches.columns:
        has = batches["calls"].to_numpy() > 0 if "calls" in batches.columns else np.ones(len(batches), bool)
        for key, name in (("queue_depth_max", "max"), ("queue_depth", "mean")):
            p50, p99 = percentiles(batches[key].to_numpy(np.float64)[has], (50, 99))
            qd[name] = {"p50": p50, "p99": p99}
    device = device_ms(bio_hist)
    share = direct_share(paths)
    direct = None
    if share > 0:
        direct = {"share": share, "events": int(sum(p["events"] for p in paths if p.get("direct"))),
                  "evidence": DIRECT_EVIDENCE, "device_ms": device}
    return {"read_paths": paths, "queue_depth": qd or None, "io_uring": _uring_figures(calls, batches, device),
            "direct": direct}


def sqpoll_notes(meta: dict | None) -> list[str]:
    """Where the analysis is blind on an SQPOLL ring: its requests start when the kernel's SQ
    thread takes them from the ring, so the time an SQE waited there before (the SQ thread asleep
    or waiting for a CPU) lies in the gap before the request, not in it."""
    u = (meta or {}).get("uring") or {}
    n, total = int(u.get("sqpoll") or 0), int(u.get("submitted") or 0)
    if n <= 0:
        return []
    return [f"{n:,} of {total:,} io_uring requests were taken from the ring by its SQPOLL thread "
            "(iou-sqp): a request is timed from then, so the time an SQE waited in the ring before "
            "(the SQ thread asleep or waiting for a CPU) is in the gaps between reads, not in them"]


def read_path_of(bt: dict) -> str:
    """The read path the trace saw: ``syscalls``, ``faults`` (a memory-mapped reader),
    ``io_uring`` (read requests of an io_uring), ``libaio`` (iocbs of io_submit), ``both`` (more
    than one of them), ``none``."""
    ev = bt.get("read_events") or {}
    n = {k: int(ev.get(k, 0)) for k in ("syscall", "fault", "io_uring", "libaio")}
    if sum(v > 0 for v in n.values()) > 1:
        return "both"
    if n["io_uring"]:
        return "io_uring"
    if n["libaio"]:
        return "libaio"
    if n["fault"] or (not n["syscall"] and (bt.get("batches_without_read_events") or {}).get("batches")):
        return "faults"
    return "syscalls" if n["syscall"] else "none"


def _uring_finding(u: dict) -> str:
    sh, sc, dev = u["path_shares"], u["submit_complete_ms"], u.get("device_ms")
    text = (f"{u['requests']:,} io_uring read requests: inline {pct(sh['inline'])}, async {pct(sh['async'])}, "
            f"punted to io-wq {pct(sh['punted'])}; submit -> complete p50 {duration(sc['p50'])}, "
            f"p99 {duration(sc['p99'])}")
    if dev:
        ge = ">= " if "histogram" in dev.get("method", "") else ""
        text += (f" against device service (bio queue -> complete) p50 {ge}{duration(dev['p50'])}, "
                 f"p99 {ge}{duration(dev['p99'])}")
    else:
        text += " (the device's bio time of these requests was not measured by this recording)"
    qd = u.get("queue_depth_max") or {}
    if qd.get("p50") is not None:
        text += f"; queue depth (requests in flight at once per batch) p50 {qd['p50']:.0f}, p99 {qd['p99']:.0f}"
    return text


def read_path_steps(bt: dict) -> list[dict]:
    """diagnose's evidence on the read paths: which it saw (and how many reads each batch had
    in flight), O_DIRECT when reads bypassed the page cache, and how io_uring served its requests."""
    paths = bt.get("read_paths") or []
    if not paths:
        return []
    seen = "; ".join(f"{path_label(p)} {p['events']:,} ({pct(p['share'])})" for p in paths)
    qd = (bt.get("queue_depth") or {}).get("max") or {}
    if qd.get("p50") is not None:
        seen += f"; reads in flight at once per batch p50 {qd['p50']:.0f}, p99 {qd['p99']:.0f}"
    reap = (bt.get("evidence") or {}).get("reap_wait_share")
    if reap:
        seen += (f"; requests done at the device (their bios complete) and not yet reaped {pct(reap)} of "
                 "batch time (in residency: the reaping thread's wait, never storage)")
    steps = [{"step": "read paths", "finding": seen, "value": paths}]
    d = bt.get("direct")
    if d:
        steps.append({"step": "O_DIRECT", "finding": f"{d['evidence']} ({pct(d['share'])} of the reads, "
                                                      f"{d['events']:,})", "value": d["share"]})
    u = bt.get("io_uring")
    if u:
        steps.append({"step": "io_uring", "finding": _uring_finding(u), "value": u["path_shares"]})
    return steps
