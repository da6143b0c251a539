"""The end-of-run summary of ``engramprof syscalls`` (printed, or ``--json``)."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from engramprof.record.live import LiveState


@dataclass
class RunFacts:
    """What the summary says about the run itself, beside the recorded calls."""

    pid: int
    tid: int
    end_reason: str
    partial_at_start: int
    kswapd_events: int
    missing_evidence: list[str]
    syscall_hook: str
    output: str | None
    notes: list[str] = field(default_factory=list)


def _us(ns: float) -> float | None:
    return None if ns != ns else round(ns / 1e3, 2)


def _log2_quantile(counts: np.ndarray, q: float) -> float:
    c = np.cumsum(counts)
    i = int(np.searchsorted(c, q * c[-1], side="left"))
    return float(1 << i)  # the lower edge of log2 slot i, which holds [2^i, 2^(i+1)) ns


def bio_summary(h: np.ndarray | None) -> dict | None:
    """Device service (bio queue -> complete) of the target's bios, from the kernel histogram."""
    if h is None or not h.sum():
        return None
    return {"bios": int(h.sum()), "p50_us_lower": _us(_log2_quantile(h, 0.5)),
            "p99_us_lower": _us(_log2_quantile(h, 0.99)),
            "note": "log2 buckets: true value is between the figure and twice it"}


def latency(s: LiveState, totals: dict, hists: dict) -> tuple[dict, str]:
    """p50/p99/max of the recorded calls; the kernel's histogram when records were lost or filtered."""
    lat = {"p50": _us(s.hist.quantile(0.5)), "p99": _us(s.hist.quantile(0.99)), "max": _us(s.hist.max_ns)}
    if int(totals.get("lost_records", 0)) or int(totals.get("filtered", 0)):
        kh = sum(hists.values()) if hists else None
        if kh is not None and kh.sum():
            return ({"p50": _us(_log2_quantile(kh, 0.5)), "p99": _us(_log2_quantile(kh, 0.99)),
                     "max": _us(totals.get("max_ns", 0))}, "kernel log2 histogram (records were lost or filtered)")
    return lat, "records"


def slowest(s: LiveState) -> list[dict]:
    if s.slowest is None:
        return []
    return [{"ts_ns": int(r.ts_ns), "tid": int(r.tid), "path": r.path, "offset": int(r.offset),
             "size": int(r.size), "ret": int(r.ret), "dur_us": round(r.dur_ns / 1e3, 1),
             "pages_added": int(r.pages_added), "bio_count": int(r.bio_count),
             "bio_us": round(r.bio_ns / 1e3, 1), "reclaim_us": round(r.reclaim_ns / 1e3, 1),
             "offcpu_us": round(r.offcpu_ns / 1e3, 1), "runq_us": round(r.runq_ns / 1e3, 1)}
            for r in s.slowest.itertuples()]


def top(stats: dict, key: str, n: int = 10) -> list[dict]:
    """The ``n`` names (files / tensors) with the most total time."""
    return [{key: name, "calls": f.calls, "total_ms": round(f.total_ns / 1e6, 3),
             "max_us": round(f.max_ns / 1e3, 1), "calls_with_misses": f.misses, "eagain": f.eagain}
            for name, f in sorted(stats.items(), key=lambda kv: -kv[1].total_ns)[:n]]


def summarize_run(run: RunFacts, s: LiveState, totals: dict, hists: dict, end_ns: int,
                  bio_hist: np.ndarray | None = None) -> dict:
    dur_s = max((end_ns - s.started_ns) / 1e9, 1e-9)
    calls = int(totals.get("calls", s.recorded))
    eagain = int(totals.get("eagain", s.eagain))
    lat, lat_source = latency(s, totals, hists)
    return {
        "pid": run.pid,
        "tid": run.tid or None,
        "duration_s": round(dur_s, 3),
        "end_reason": run.end_reason,
        "calls": calls,
        "calls_per_s": round(calls / dur_s, 1),
        "recorded": s.recorded,
        "lost_records": int(totals.get("lost_records", 0)),
        "bios_untracked": int(totals.get("bios_untracked", 0)),  # in bio_count, not in bio time (probes/bios.h)
        "filtered_short": int(totals.get("filtered", 0)),
        # read() / readv() of a pipe, socket, tty or pseudo-filesystem file: not table reads, not events
        "nonregular_skipped": int(totals.get("nonregular_skipped", 0)),
        "partial_at_start": run.partial_at_start,
        "kswapd_events": run.kswapd_events,
        "kswapd_events_lost": int(totals.get("vm_events_lost", 0)),
        "eagain": eagain,
        "eagain_rate": round(eagain / calls, 4) if calls else 0.0,
        "nowait_share": round(int(totals.get("nowait", s.nowait)) / calls, 4) if calls else 0.0,
        "latency_us": lat,
        "latency_source": lat_source,
        "evidence": {
            "calls_with_misses": s.calls_with_misses,
            "pages_added": s.pages_added,
            "bio_ms": round(s.bio_ns / 1e6, 3),
            "reclaim_ms": round(s.reclaim_ns / 1e6, 3),
            "offcpu_ms": round(s.offcpu_ns / 1e6, 3),
            "runq_ms": round(s.runq_ns / 1e6, 3),
        },
        "device": bio_summary(bio_hist),
        "files": top(s.files, "path"),
        "tensors": top(s.tensors, "tensor"),
        "slowest": slowest(s),
        "missing_evidence": run.missing_evidence,
        "syscall_hook": run.syscall_hook,
        "output": run.output,
        "notes": run.notes,
    }
