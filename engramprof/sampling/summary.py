"""Summaries of recorded sample series: the JSON ``engramprof sample --json`` prints, and a
plain-language reading of it.  Pure functions: frames (and run info) in, dict out.
"""
from __future__ import annotations

import os
from typing import Any, Mapping

import pandas as pd

from engramprof.trace import load_bundle
from engramprof.trace.schema import CGROUP_COUNTERS, SAMPLE_NAMES
from engramprof.units import percent_of

UNLIMITED = 1 << 62  # a cgroup limit at or above this is "no limit"
VMSTAT_RATES = ("workingset_refault_file", "pgscan_kswapd", "pgscan_direct", "pgscan_memcg", "allocstall", "pgmajfault", "pgpgin")
MAX_THREADS_LISTED = 64


def _py(x):
    """numpy/pandas scalar -> JSON-able Python value (NaN/NA -> None)."""
    if x is None:
        return None
    try:
        if pd.isna(x):
            return None
    except (TypeError, ValueError):
        pass
    if hasattr(x, "item"):
        x = x.item()
    if isinstance(x, float):
        return round(x, 6)
    return x


def _sum(s: pd.Series):
    """Sum of a counter column; int (nullable int columns arrive as float from Parquet)."""
    s = s.dropna()
    if s.empty:
        return None
    v = _py(s.sum())
    return int(v) if isinstance(v, float) and v.is_integer() else v


def _window(frames: Mapping[str, pd.DataFrame | None], info: Mapping | None) -> tuple[int | None, int | None]:
    lo, hi = None, None
    for df in frames.values():
        if df is None or df.empty:
            continue
        a, b = int(df["ts_ns"].min()), int(df["ts_ns"].max())
        lo = a if lo is None else min(lo, a)
        hi = b if hi is None else max(hi, b)
    return lo, hi


def _window_section(frames: Mapping[str, pd.DataFrame | None], info: Mapping, lo, hi) -> dict:
    dur_ns = (hi - lo) if lo is not None else 0
    stamps = set().union(*(set(df["ts_ns"].unique()) for df in frames.values() if df is not None and not df.empty)) if lo is not None else set()
    return {"start_ns": lo, "end_ns": hi, "duration_s": round(dur_ns / 1e9, 3), "samples": len(stamps), "hz": info.get("hz")}


def _psi_section(psi: pd.DataFrame | None, win_us: float, notes: list[str]) -> dict:
    out: dict[str, Any] = {}
    if psi is None or psi.empty:
        notes.append("no PSI data: pressure stall time not reported")
        return out
    for r, g in psi.sort_values("ts_ns").groupby("resource", sort=False):
        some, full = _sum(g["some_us"]), _sum(g["full_us"])
        dt = g["ts_ns"].diff() / 1e3
        peak = (g["some_us"] / dt).where(dt > 0).max()
        out[r] = {
            "some_us": some,
            "full_us": full,
            "some_pct": percent_of(some, win_us),
            "full_pct": percent_of(full, win_us),
            "some_peak_pct": None if pd.isna(peak) else round(100 * float(peak), 3),
            "some_avg10_end": _py(g["some_avg10"].iloc[-1]),
            "full_avg10_end": _py(g["full_avg10"].iloc[-1]),
        }
    return out


def _vmstat_section(vm: pd.DataFrame | None, dur_ns: int, notes: list[str]) -> tuple[dict, dict | None]:
    """(window totals, per-second rates of the main counters); ({}, None) without data."""
    if vm is None or vm.empty:
        notes.append("no /proc/vmstat data")
        return {}, None
    totals = {c: _sum(vm[c]) for c in vm.columns if c != "ts_ns"}
    secs = dur_ns / 1e9
    rates = {c: (round(v / secs, 3) if v is not None and secs else None) for c, v in totals.items() if c in VMSTAT_RATES}
    return totals, rates


def _kswapd_section(ks: pd.DataFrame | None, win_us: float) -> dict | None:
    if ks is None or ks.empty:
        return None
    threads = []
    for (pid, name), g in ks.groupby(["pid", "name"]):
        threads.append({"pid": int(pid), "name": name, "cpu_s": _py(g["cpu_s"].sum()),
                        "busy_intervals": int((g["cpu_s"] > 0).sum()), "intervals": max(0, len(g) - 1)})
    tot = sum(t["cpu_s"] or 0 for t in threads)
    return {"cpu_s": round(tot, 6), "cpu_pct": percent_of(tot * 1e6, win_us), "threads": threads}


def _cgroup_section(cg: pd.DataFrame | None, cgi: Mapping, win_us: float) -> dict:
    sec: dict[str, Any] = {"version": cgi.get("version"), "v1_memory": cgi.get("v1_memory"), "v2": cgi.get("v2")}
    if cg is None or cg.empty:
        return sec
    cg = cg.sort_values("ts_ns")
    usage = cg["usage_bytes"].dropna()
    lim = cg["limit_bytes"].dropna()
    sec["usage_bytes"] = _py(usage.iloc[-1]) if not usage.empty else None
    sec["usage_max_bytes"] = _py(usage.max()) if not usage.empty else None
    limit = _py(lim.iloc[-1]) if not lim.empty else None
    sec["limit_bytes"] = limit if limit is not None and limit < UNLIMITED else None
    sec["limited"] = limit is not None and limit < UNLIMITED
    for c in CGROUP_COUNTERS:
        sec[c] = _sum(cg[c])
    sec["pressure"] = {
        "memory": {"some_us": sec.pop("mem_some_us"), "full_us": sec.pop("mem_full_us")},
        "io": {"some_us": sec.pop("io_some_us"), "full_us": sec.pop("io_full_us")},
    }
    for r in ("memory", "io"):
        p = sec["pressure"][r]
        p["some_pct"], p["full_pct"] = percent_of(p["some_us"], win_us), percent_of(p["full_us"], win_us)
    return sec


def _process_section(pr: pd.DataFrame | None, info: Mapping, lo) -> dict:
    psec: dict[str, Any] = {"pid": info.get("pid"), "name": info.get("target_name"), "exited": bool(info.get("target_exited"))}
    if info.get("target_exit_ns") is not None and lo is not None:
        psec["exited_after_s"] = round((info["target_exit_ns"] - lo) / 1e9, 3)
    if pr is None or pr.empty:
        psec["samples"] = 0
        return psec
    pr = pr.sort_values("ts_ns")
    span = (int(pr["ts_ns"].iloc[-1]) - int(pr["ts_ns"].iloc[0])) / 1e9
    cpu = _sum(pr["cpu_s"])
    psec.update(
        samples=int(len(pr)),
        span_s=round(span, 3),
        cpu_user_s=round(float(pr["utime_s"].iloc[-1] - pr["utime_s"].iloc[0]), 3),
        cpu_system_s=round(float(pr["stime_s"].iloc[-1] - pr["stime_s"].iloc[0]), 3),
        cpu_pct=round(100 * cpu / span, 2) if cpu is not None and span else None,
        num_threads=_py(pr["num_threads"].iloc[-1]),
        rss_bytes=_py(pr["rss_bytes"].iloc[-1]),
        minflt=_sum(pr["minflt"]),
        majflt=_sum(pr["majflt"]),
        rchar=_sum(pr["rchar"]),
        read_bytes=_sum(pr["read_bytes"]),
        syscr=_sum(pr["syscr"]),
    )
    return psec


def _threads_section(th: pd.DataFrame, span: float, notes: list[str]) -> dict:
    """Context switches and CPU per thread of the target, busiest first."""
    g = th.sort_values("ts_ns").groupby("tid")
    cols = {
        "name": g["name"].last(),
        "ctx_voluntary": g["ctx_voluntary_delta"].sum(),
        "ctx_involuntary": g["ctx_involuntary_delta"].sum(),
        "cpu_s": g["cpu_s"].sum(),
    }
    has_sched = "run_ns" in th.columns and th["run_ns"].notna().any()
    if has_sched:
        cols["run_s"] = g["run_ns"].sum() / 1e9
        cols["runq_s"] = g["runq_ns"].sum() / 1e9
    per = pd.DataFrame(cols).sort_values(["ctx_voluntary", "ctx_involuntary"], ascending=False)
    vol, invol = int(per["ctx_voluntary"].sum()), int(per["ctx_involuntary"].sum())
    if len(per) > MAX_THREADS_LISTED:
        notes.append(f"process.threads lists the {MAX_THREADS_LISTED} busiest of {len(per)} threads")
    return dict(
        threads_seen=int(len(per)),
        ctx_voluntary=vol,
        ctx_involuntary=invol,
        ctx_per_s=round((vol + invol) / span, 1) if span else None,
        run_s=round(float(per["run_s"].sum()), 6) if has_sched else None,
        runq_s=round(float(per["runq_s"].sum()), 6) if has_sched else None,
        threads=[
            {"tid": int(tid), "name": r["name"], "ctx_voluntary": int(r["ctx_voluntary"]), "ctx_involuntary": int(r["ctx_involuntary"]), "cpu_s": round(float(r["cpu_s"]), 3)}
            | ({"run_s": round(float(r["run_s"]), 6), "runq_s": round(float(r["runq_s"]), 6)} if has_sched else {})
            for tid, r in per.head(MAX_THREADS_LISTED).iterrows()
        ],
    )


def _of_pid(df: pd.DataFrame | None, pid) -> pd.DataFrame | None:
    return None if df is None or df.empty else df[df["pid"] == pid]


PROCESS_KEYS = ("pid", "name", "samples", "span_s", "cpu_pct", "majflt", "read_bytes", "threads_seen",
                "ctx_voluntary", "ctx_involuntary", "ctx_per_s", "run_s", "runq_s")


def _processes_section(pr, th, info: Mapping, lo, dur_ns: int, pids: list[int]) -> list[dict]:
    """One short row per traced process (the per-thread lists stay in `process` for the first)."""
    names = {int(k): v for k, v in (info.get("followed") or {}).items()}
    if info.get("pid") is not None:
        names[int(info["pid"])] = info.get("target_name")
    rows = []
    for p in pids:
        sec = _process_section(_of_pid(pr, p), {"pid": p, "target_name": names.get(p)}, lo)
        t = _of_pid(th, p)
        if t is not None and not t.empty:
            sec.update(_threads_section(t, sec.get("span_s") or dur_ns / 1e9, []))
        rows.append({k: sec.get(k) for k in PROCESS_KEYS})
    return rows


def summarize(frames: Mapping[str, pd.DataFrame | None], info: Mapping | None = None) -> dict:
    """The JSON summary of recorded sample frames (pure: the frames and run info in, dict out).

    ``frames`` maps series names (``psi``, ``vmstat``, ``kswapd``, ``cgroup``, ``process``,
    ``threads``) to DataFrames with the columns of :func:`engramprof.trace.sample_schema`;
    missing ones are skipped.  ``info`` is :meth:`Sampler.info` (``meta["sampler"]`` in a
    TRACE); it adds the pid, cgroup paths and notes.
    """
    info = dict(info or {})
    notes = list(info.get("notes") or [])
    lo, hi = _window(frames, info)
    dur_ns = (hi - lo) if lo is not None else 0
    win_us = dur_ns / 1e3
    out: dict[str, Any] = {"window": _window_section(frames, info, lo, hi)}
    if dur_ns == 0:
        notes.append("fewer than two samples: no interval to report (window too short)")
    out["psi"] = _psi_section(frames.get("psi"), win_us, notes)
    out["vmstat"], rates = _vmstat_section(frames.get("vmstat"), dur_ns, notes)
    if rates is not None:
        out["vmstat_per_s"] = rates
    out["kswapd"] = _kswapd_section(frames.get("kswapd"), win_us)
    cg = frames.get("cgroup")
    cgi = info.get("cgroup") or {}
    if cgi.get("version") or (cg is not None and not cg.empty):
        out["cgroup"] = _cgroup_section(cg, cgi, win_us)
    elif info.get("pid") is not None:
        out["cgroup"] = None
    pr, th = frames.get("process"), frames.get("threads")
    pids = sorted(int(p) for p in pr["pid"].dropna().unique()) if pr is not None and not pr.empty else []
    if len(pids) > 1:  # several traced processes: `process` is the first, `processes` each
        out["processes"] = _processes_section(pr, th, info, lo, dur_ns, pids)
        first = info.get("pid") if info.get("pid") is not None else pids[0]
        pr, th = _of_pid(pr, first), _of_pid(th, first)
    if info.get("pid") is not None or (pr is not None and not pr.empty):
        psec = _process_section(pr, info, lo)
        if th is not None and not th.empty:
            psec.update(_threads_section(th, psec.get("span_s") or dur_ns / 1e9, notes))
        out["process"] = psec
    out["interpretation"] = interpret(out)
    out["notes"] = notes
    return out


PSI_MEM_PCT = 1.0  # memory some above this share of the window: pressure worth reporting
PSI_IO_PCT = 5.0
KSWAPD_BUSY_PCT = 1.0


def interpret(s: Mapping) -> list[str]:
    """Short plain-language reading of a summary (what the memory evidence says)."""
    lines: list[str] = []
    vm = s.get("vmstat") or {}
    psi = s.get("psi") or {}
    dur = (s.get("window") or {}).get("duration_s") or 0
    if not dur:
        return ["window too short to interpret"]
    mem = psi.get("memory") or {}
    ks = s.get("kswapd") or {}
    kcpu = ks.get("cpu_pct") or 0
    scan_k = vm.get("pgscan_kswapd") or 0
    scan_d = vm.get("pgscan_direct") or 0
    stalls = vm.get("allocstall") or 0
    memcg = vm.get("pgscan_memcg") or 0
    refaults = vm.get("workingset_refault_file") or 0
    mem_some = mem.get("some_pct")
    kswapd_idle = kcpu < KSWAPD_BUSY_PCT and scan_k == 0
    if kswapd_idle and scan_d == 0 and stalls == 0 and memcg == 0 and (mem_some or 0) < 0.05:
        psi_txt = "PSI memory 0" if mem_some is not None else "PSI n/a"
        lines.append(f"no reclaim: kswapd idle, no direct reclaim, {psi_txt}")
    else:
        bits = []
        if not kswapd_idle:
            bits.append(f"kswapd busy ({kcpu:.1f}% of a core, {scan_k:,} pages scanned)")
        if scan_d or stalls:
            bits.append(f"direct reclaim ({scan_d:,} pages scanned, {stalls:,} allocation stalls)")
        if memcg:
            bits.append(f"cgroup-limit reclaim ({memcg:,} pages scanned)")
        if bits:
            lines.append("reclaim: " + "; ".join(bits))
        if mem_some is not None and mem_some >= 0.05:
            lines.append(
                f"memory pressure: some task stalled on memory {mem_some:.1f}% of the window, "
                f"all non-idle tasks at once {mem.get('full_pct') or 0:.1f}%"
                + (" (significant)" if mem_some >= PSI_MEM_PCT else " (slight)")
            )
    if refaults:
        rate = refaults / dur
        if kswapd_idle and not scan_d and not memcg:
            lines.append(f"file refaults {refaults:,} ({rate:,.0f}/s) with no reclaim in the window: pages evicted earlier are being read back")
        else:
            lines.append(f"file refaults {refaults:,} ({rate:,.0f}/s): recently evicted pages are being read back (thrashing)")
    io = psi.get("io") or {}
    if (io.get("some_pct") or 0) >= PSI_IO_PCT:
        lines.append(f"io pressure: tasks waited on I/O {io['some_pct']:.1f}% of the window (full {io.get('full_pct') or 0:.1f}%)")
    cg = s.get("cgroup") or {}
    if cg.get("version"):
        cref = cg.get("refault_file") or 0
        hits = (cg.get("failcnt") or 0) + (cg.get("events_max") or 0)
        if cref or hits or cg.get("pgscan"):
            lim = cg.get("limit_bytes")
            use = cg.get("usage_max_bytes")
            at = f" (usage up to {use / 2**20:.1f} MiB of a {lim / 2**20:.1f} MiB limit)" if lim and use else ""
            lines.append(f"target's memory cgroup is reclaiming{at}: {cref:,} refaults, {hits:,} limit hits")
        cp = (cg.get("pressure") or {}).get("memory") or {}
        if (cp.get("some_pct") or 0) >= 0.05:
            lines.append(f"target's cgroup memory pressure: some {cp['some_pct']:.1f}%, full {cp.get('full_pct') or 0:.1f}% of the window")
    pr = s.get("process") or {}
    if pr.get("samples"):
        if pr.get("read_bytes") is not None and pr.get("rchar"):
            frac = pr["read_bytes"] / pr["rchar"] if pr["rchar"] else 0
            lines.append(
                f"target read {pr['rchar'] / 2**20:,.1f} MiB through syscalls, {pr['read_bytes'] / 2**20:,.1f} MiB of it from storage"
                + (" (page-cache hits)" if frac < 0.01 else "")
            )
        if pr.get("ctx_per_s") is not None:
            lines.append(f"target: {pr['ctx_per_s']:,.0f} context switches/s over {pr.get('threads_seen', 0)} threads, {pr.get('cpu_pct') or 0:.0f}% CPU")
    if pr.get("exited"):
        lines.append(f"target exited after {pr.get('exited_after_s', '?')} s")
    return lines


def summarize_bundle(path: str | os.PathLike) -> dict:
    """:func:`summarize` applied to the sample series of a recorded TRACE."""
    tr = load_bundle(path)
    frames = {n: tr.samples(n) for n in SAMPLE_NAMES}
    return summarize(frames, tr.meta.get("sampler") or {})
