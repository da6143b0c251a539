"""`engramprof diagnose`: record, analyse, and answer which cause holds the batches back.

The recording is `engramprof syscalls` (calls + samples) for a window; the analysis is
`batch-tail`'s per-batch time split (engramprof.analysis.attribution); on top of it this module adds
the residency of the hot rows as they are now (mincore / cachestat, never a read), and turns
the numbers into the field report's evidence chain:

  slow calls -> residency of their pages -> reclaim signals -> device service
             -> batch time outside the read path -> verdict, runner-up, limits, the fix

Every number in the answer is computed from the trace it recorded (kept with --output).
"""
from __future__ import annotations

import os
import shutil
import sys
import tempfile

import numpy as np
import pandas as pd

from engramprof import trace as tracefmt
from engramprof.bpf import progstats
from engramprof.analysis import attribution, batches, codeview, prefetch, readahead
from engramprof.analysis.advice import advice, advice_for, miss_story  # noqa: F401  (advice: diagnose.advice)
from engramprof.analysis.baseline import writing_devices
from engramprof.analysis.components import REQUEST_KINDS, WAITED_URING_PATHS
from engramprof.analysis.events import code_faults
from engramprof.analysis.paths import read_path_of, read_path_steps
from engramprof.analysis.verdicts import is_slow, rank_causes
from engramprof.errors import UserError
from engramprof.host import residency
from engramprof.jsonable import jsonable  # noqa: F401  (commands print diagnose.jsonable)
from engramprof.record.recorder import Recorder
from engramprof.sampling.stacks import DEFAULT_STACK_HZ
from engramprof.units import duration, pct

#: a second cause is named as runner-up from this share of batch time on
RUNNER_UP_MIN_SHARE = 0.15
#: most distinct rows whose residency is looked up now (the most read first)
HOT_ROWS = 20_000

def verdict_and_confidence(share: dict, meaningful: float) -> tuple[str, float, str | None, float | None]:
    """(verdict, confidence 0..1, runner-up or None, runner-up share).

    The verdict is the cause with the largest share of batch time when it reaches
    ``meaningful`` (else healthy).  Confidence for a cause: its share over its share plus
    the runner-up's (0.5 = a tie, 1 = nothing else); for healthy: how far the largest cause
    stays below ``meaningful`` (1 = no cause at all, 0 = at the threshold).
    """
    (c1, s1), (c2, s2) = rank_causes(share)[:2]  # the one ranking (ties: VERDICT_CAUSES order)
    if s1 < meaningful:
        conf = max(0.0, 1.0 - s1 / meaningful) if meaningful > 0 else 1.0
        runner = c1 if s1 >= RUNNER_UP_MIN_SHARE else None  # below the verdict threshold, still worth a look
        return "healthy", round(conf, 2), runner, (round(s1, 3) if runner else None)
    conf = s1 / (s1 + s2) if (s1 + s2) > 0 else 1.0
    runner = c2 if s2 >= RUNNER_UP_MIN_SHARE else None
    return c1, round(conf, 2), runner, (round(s2, 3) if runner else None)


def hot_row_residency(calls: pd.DataFrame, limit: int = HOT_ROWS) -> dict | None:
    """Resident share, now, of the most-read distinct rows of the trace (never reads a page)."""
    if calls.empty:
        return None
    code = code_faults(calls)  # page faults on the process's own code are not table rows
    ok = calls[(calls["offset"] >= 0) & (calls["size"] > 0) & (calls["path"] != "")
               & (~code if code is not None else True)]
    if ok.empty:
        return None
    rows = ok.groupby(["path", "offset", "size"], sort=False).size().rename("reads").reset_index()
    distinct = int(len(rows))
    rows = rows.nlargest(limit, "reads")
    fractions, weights, skipped = [], [], []
    for path, g in rows.groupby("path", sort=False):
        try:
            fr = residency.classify_rows(path, g["offset"].to_numpy(), g["size"].to_numpy())
        except (UserError, OSError, ValueError) as exc:
            skipped.append(f"{path}: {exc}")
            continue
        fractions.append(fr)
        weights.append(g["reads"].to_numpy())
    if not fractions:
        return {"rows": 0, "distinct_rows": distinct, "skipped": skipped}
    fr = np.concatenate(fractions)
    w = np.concatenate(weights)
    return {
        "rows": int(len(fr)),
        "distinct_rows": distinct,
        "resident_frac": float((fr >= 1.0).mean()),
        "cold_frac": float((fr <= 0.0).mean()),
        "resident_frac_by_reads": float((w * (fr >= 1.0)).sum() / w.sum()),
        "skipped": skipped,
    }


def evidence_chain(bt: dict, calls: pd.DataFrame, ctx: dict, device: dict | None, hot: dict | None,
                   trace_summary: dict) -> list[dict]:
    """The field report's chain, one step per line, each with the number it rests on."""
    steps: list[dict] = []
    slow = calls[is_slow(calls["dur_ns"].to_numpy(), bt["slow_ms"])] if not calls.empty else calls
    cm = bt.get("call_ms") or {}
    # what a read event is on this read path: a call, a page fault, or either
    one, many = {"faults": ("page fault", "page faults"), "both": ("read", "reads"),
                 "io_uring": ("io_uring read", "io_uring reads"),
                 "libaio": ("libaio read", "libaio reads")}.get(read_path_of(bt),
                                                                                        ("call", "calls"))
    steps.append({
        "step": f"slow {many}",
        "finding": (f"{pct(bt['frac_batches_with_slow_call'])} of {bt['batches']} batches had at least one {one} slower "
                    f"than {bt['slow_ms']:g} ms; {one} p50 {duration(cm.get('p50'))}, p99 {duration(cm.get('p99'))}"),
        "value": bt["frac_batches_with_slow_call"],
    })
    # an evidence column the kernel could not measure is written all-null: not "0 misses"
    have_miss = "pages_added" not in (bt.get("missing_evidence") or []) and "pages_added" in calls.columns
    if have_miss and len(calls):
        missed, io_wait = _missed(calls), _uring_waited(calls)
        miss_any = float(missed.mean())
        miss_slow = float(missed[slow.index].mean()) if len(slow) else None
        blocked = (calls["offcpu_ns"] - calls["runq_ns"]) > 0 if "offcpu_ns" in calls.columns else None
        waited = ((slow["offcpu_ns"] - slow["runq_ns"]) > 0).to_numpy() | io_wait[slow.index].to_numpy() if len(slow) else None
        wait_slow = float(waited.mean()) if (len(slow) and blocked is not None) else None
        finding = f"{pct(miss_any)} of {many} brought pages into the page cache (misses)"
        if (missed & ~(calls["pages_added"].fillna(0) > 0)).any():  # bios without a page: O_DIRECT
            finding = f"{pct(miss_any)} of {many} brought pages into the page cache or queued bios of their own (misses)"
        if io_wait.any() or _direct(calls).any():
            finding = (f"{pct(miss_any)} of {many} missed (brought pages into the page cache, bypassed it with "
                       "O_DIRECT, or were requests served async / punted: they waited for the device)")
        if miss_slow is not None:
            finding += f"; of the slow {many} {pct(miss_slow)} missed and {pct(wait_slow)} waited off-CPU"
        if hot and hot.get("rows"):
            n, of = hot["rows"], hot.get("distinct_rows", hot["rows"])
            which = f"all {n:,} distinct rows read" if n >= of else f"the {n:,} most-read of {of:,} distinct rows"
            finding += (f"; hot rows resident now: {pct(hot['resident_frac_by_reads'])} (by reads, "
                        f"{which}, mincore/cachestat)")
        steps.append({"step": "residency of their pages", "finding": finding, "value": miss_any})
    story = miss_story(bt)  # who evicted the missed pages (eviction records, analysis/misses.py)
    if story:
        steps.append({"step": "why the pages were missing", "finding": story, "value": bt.get("miss_causes")})
    vm = ctx.get("vmstat") or {}
    psi = (ctx.get("psi") or {}).get("memory") or {}
    cg = ctx.get("cgroup") or {}
    rec_ms = float(calls["reclaim_ns"].sum() / 1e6) if "reclaim_ns" in calls.columns else None
    # the span the recorder really had (the sampler's window may run past it)
    window = trace_summary.get("duration_s") or (ctx.get("window") or {}).get("duration_s") or 0
    refaults = vm.get("workingset_refault_file")
    cg_ref = cg.get("refault_file")
    parts = [f"workingset refaults {int(refaults or 0):,} system-wide"
             + (f", {int(cg_ref):,} in the target's cgroup" if cg_ref is not None else ""),
             f"kswapd scanned {int(vm.get('pgscan_kswapd') or 0):,} pages, direct reclaim {int(vm.get('pgscan_direct') or 0):,}",
             f"PSI memory some {pct((psi.get('some_pct') or 0) / 100)} of the window",
             f"reclaim inside calls {rec_ms:.1f} ms" if rec_ms is not None else "reclaim inside calls not measured"]
    steps.append({"step": "reclaim signals", "finding": "; ".join(parts) + (f" (over {window:.0f} s)" if window else ""),
                  "value": {"refaults": refaults, "cgroup_refaults": cg_ref, "psi_memory_some_pct": psi.get("some_pct"),
                            "reclaim_in_calls_ms": rec_ms}})
    normal = bt.get("normal_miss_us")
    miss = calls[_missed(calls)] if have_miss else calls.iloc[0:0]
    miss_wait = None
    if len(miss) and "offcpu_ns" in calls.columns:
        # a request that waited: its whole submit -> complete (its evidence is null)
        waits = (miss["offcpu_ns"] - miss["runq_ns"]).where(~_uring_waited(miss), miss["dur_ns"])
        miss_wait = float(waits.median() / 1e3)
    base = bt.get("device_baseline")
    if device and device.get("bios"):
        dev = f"device service (bio queue->complete) p50 >= {device['p50_us_lower']:.0f} us over {device['bios']:,} bios"
    elif base:
        dev = f"device service per read size from {base['source']}: {baseline_line(base)}"
    else:
        dev = "no bios of the target were matched (all hits, or I/O submitted by another thread, e.g. a throttle)"
    if base and device and device.get("bios"):
        dev += f"; normal per read size ({base['source']}): {baseline_line(base)}"
    dev += (f"; a missing read waited p50 {miss_wait:,.0f} us off-CPU" if miss_wait is not None else "")
    dev += f"; normal miss service taken as {normal:,.0f} us ({bt.get('normal_miss_source')})" if normal else ""
    traffic = bt.get("device_traffic")
    dev += traffic_line(traffic)
    steps.append({"step": "device service", "finding": dev,
                  "value": {"bio_p50_us_lower": device["p50_us_lower"] if device else None, "miss_wait_p50_us": miss_wait,
                            "normal_miss_us": normal, "baseline": base, "traffic": traffic}})
    bm, im = bt.get("batch_ms") or {}, bt.get("inflight_ms") or {}
    outside = bt.get("outside_read_path_frac")
    steps.append({
        "step": "batch time outside the read path",
        "finding": (f"median batch {duration(bm.get('p50'))} while reads were in flight for {duration(im.get('p50'))}: "
                    f"{pct(outside)} of batch time is outside the kernel read path"),
        "value": outside,
    })
    share = bt.get("share") or {}
    steps.append({
        "step": "time split",
        "finding": ", ".join(f"{c} {pct(share.get(c, 0))}" for c in attribution.CAUSES),
        "value": share,
    })
    return steps


def baseline_line(base: dict, most: int = 4) -> str:
    """The device baseline's best-measured size classes, one phrase: "32 KiB 149 us, 1 MiB 10.2 ms"."""
    rows = sorted(base.get("classes") or [], key=lambda r: -r["ios"])[:most]
    return ", ".join(f"{_size(r['bytes'])} {duration(r['normal_us'] / 1e3)} ({r['ios']:,} reads)"
                     for r in sorted(rows, key=lambda r: r["bytes"])) or "none measured"


def _size(b: int) -> str:
    return f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB" if b >= 1024 else f"{b} B"


END_REASONS = {
    "duration": "ran for the requested {asked:g} s",
    "target-exit": "the target exited after {got:.1f} s of the {asked:g} s asked",
    "signal": "interrupted after {got:.1f} s of the {asked:g} s asked",
    "disk-full": "the disk filled after {got:.1f} s of the {asked:g} s asked",
}


def traffic_line(traffic: dict | None) -> str:
    """"; meanwhile the device (vda) wrote 190 MiB in 1,520 writes and 12 cache flushes over 9 s
    (reads queue behind them)": what else the table's device served, from its own counters;
    "" when it wrote nothing or the trace has no write counters."""
    if not traffic or (traffic.get("write_bytes", 0) <= 0 and traffic.get("flushes", 0) <= 0):
        return ""
    secs = traffic.get("seconds")
    return (f"; meanwhile the device ({writing_devices(traffic)}) wrote {traffic['write_bytes'] / 2**20:,.1f} MiB in "
            f"{traffic['writes']:,} writes and {traffic['flushes']:,} cache flushes"
            + (f" over {secs:,.0f} s" if secs else "") + " (reads queue behind writeback and flushes)")


def _uring_waited(calls: pd.DataFrame) -> pd.Series:
    """Per row (indexed like ``calls``): a read request (an io_uring SQE or a libaio iocb) that
    waited for the device (io_uring: served async or punted; either: O_DIRECT): a miss although
    its evidence columns are null (engramprof.analysis.components, the same rule)."""
    out = pd.Series(False, index=calls.index)
    req = pd.Series(False, index=calls.index)
    if "uring_path" in calls.columns:
        out |= calls["uring_path"].astype(object).isin(WAITED_URING_PATHS)
        req |= calls["uring_path"].notna()
    if "kind" in calls.columns:
        req |= calls["kind"].astype(object).isin(REQUEST_KINDS)
    return out | (req & _direct(calls))


def _direct(calls: pd.DataFrame) -> pd.Series:
    """Per row: the read bypassed the page cache (O_DIRECT)."""
    if "direct" not in calls.columns:
        return pd.Series(False, index=calls.index)
    return calls["direct"].astype(object).eq(True)


def _missed(calls: pd.DataFrame) -> pd.Series:
    """Per row: the read event missed (inserted pages, queued bios, read an O_DIRECT file, or a
    request that waited) -- components.missed_events' rule."""
    out = calls["pages_added"].fillna(0) > 0
    if "bio_count" in calls.columns:
        out |= calls["bio_count"].fillna(0) > 0
    return out | _direct(calls) | _uring_waited(calls)


def recorded_window(trace_summary: dict, requested_s: float) -> dict:
    """The window the recording really had: its span, why it ended, and the one-line wording."""
    got = float(trace_summary.get("duration_s") or 0.0)
    reason = trace_summary.get("end_reason") or "unknown"
    how = END_REASONS.get(reason, "ended ({reason}) after {got:.1f} s of the {asked:g} s asked")
    return {"requested_s": float(requested_s), "recorded_s": round(got, 3), "end_reason": reason,
            "text": f"one {got:.1f}-second window ({how.format(asked=requested_s, got=got, reason=reason)})"}


def limits(bt: dict, trace_summary: dict, duration: float, markers: bool) -> list[str]:
    win = recorded_window(trace_summary, duration)
    out = [f"{win['text']} with no control run: it says what held these batches back, "
           "not that changing it will speed up the model end to end (prove that with a matched before/after)"]
    if not markers:
        kinds = (bt.get("thread_kinds") or {}).get("counts") or {}
        python = bool(kinds.get("python") or kinds.get("unknown")) or not kinds
        out.append("batches were inferred from gaps in the read stream (no --markers): time before a batch's "
                   "first read is not seen, so " + ("Python scheduling is under-counted" if python else
                                                    "the reader's hand-offs to its threads are under-counted"))
    out.append("residency of the hot rows is observed after the window and can change right after it is observed")
    lost = bt.get("lost_records") or {}
    if lost.get("records") or trace_summary.get("lost_records"):
        n = int(lost.get("records") or trace_summary.get("lost_records") or 0)
        where = (f": the trace was blind for {pct(lost.get('blind_frac', 0))} of the window and "
                 f"{lost.get('batches_excluded', 0)} batch(es) overlapping a hole were left out"
                 if lost.get("source") == "intervals" else ": when is not known, so no batch could be left out")
        out.append(f"{n:,} call records were lost (ring buffer full){where}; call totals and latency "
                   "percentiles come from the kernel's counters")
    skipped = progstats.sentence(trace_summary.get("kernel_skipped"))
    if skipped:
        out.append(skipped)
    untracked = int(trace_summary.get("bios_untracked") or 0) + sum(
        int((trace_summary.get(path) or {}).get("bios_untracked") or 0) for path in ("faults", "uring", "libaio"))
    if untracked:
        out.append(f"{untracked:,} bios were counted but not timed (their slot of the probe's in-flight bio table was "
                   "held by another bio): the bio time of the reads that queued them is short of the device wait")
    if bt.get("missing_evidence"):
        out.append("not measured on this kernel: " + ", ".join(bt["missing_evidence"]))
    if bt.get("batches", 0) < 20:
        out.append(f"only {bt.get('batches', 0)} batches: shares are noisy")
    return out


def analyse_trace(trace_dir: str, markers: str | None, slow_ms: float, trace_summary: dict,
                  duration: float) -> dict:
    """The diagnosis of a recorded bundle (pure over the trace, plus residency now)."""
    bundle = tracefmt.load_bundle(trace_dir)
    markers_df, bad = (None, 0)
    if markers:
        markers_df, bad = batches.read_markers(markers)
    faults_traced = "fault" in (bundle.meta.get("read_paths") or []) or bool(bundle.meta.get("fault_probe"))
    code = code_faults(bundle.calls)  # faults on the process's own code are not table reads
    no_reads = bundle.calls.empty or (code is not None and bool(code.all()))
    if no_reads and not (faults_traced and markers_df is not None):
        what = ("preadv2/preadv/pread64 calls" + (", no io_uring read requests" if bundle.meta.get("uring_probe") else "")
                + (", no libaio reads" if bundle.meta.get("libaio_probe") else "")
                + (" and no page faults on mapped data files" if faults_traced else ""))
        more = (" (a memory-mapped reader whose rows are all resident makes neither: pass --markers to "
                "analyse its batches)" if faults_traced else " (is it the reader process? is it serving?)")
        raise UserError(f"pid {trace_summary.get('pid')} made no {what} in {duration:g} s: nothing to diagnose{more}",
                        code=1)
    res = attribution.analyse(bundle, markers_df, slow_ms=slow_ms, markers_bad_lines=bad)
    bt = res.summary
    bt.update(prefetch.json_keys(bundle))  # readahead, prefetch (analysis/readahead.py, prefetch.py)
    bt.update(codeview.json_keys(bundle, res.batches, slow_ms, bt))  # code_view (analysis/codeview.py)
    if bt.get("batches", 0) == 0:
        raise UserError("no batches found in the window (markers outside the trace? see `engramprof batch-tail`)", code=1)
    meaningful = bt.get("thresholds", {}).get("meaningful_share", attribution.DEFAULT_MEANINGFUL_SHARE)
    verdict, conf, runner, runner_share = verdict_and_confidence(bt["share"], meaningful)
    hot = hot_row_residency(bundle.calls)
    ctx = trace_summary.get("context") or {}
    chain = evidence_chain(bt, bundle.calls, ctx, trace_summary.get("device"), hot, trace_summary)
    chain[1:1] = read_path_steps(bt)  # after the slow reads: the paths they took
    chain += pagecache_steps(bt)
    return {
        "verdict": verdict,
        "confidence": conf,
        "runner_up": runner,
        "runner_up_share": runner_share,
        "verdict_share": round(float(bt["share"].get(verdict, 0.0)), 3) if verdict != "healthy" else None,
        "evidence": chain,
        "limits": limits(bt, trace_summary, duration, markers is not None),
        "window": {k: v for k, v in recorded_window(trace_summary, duration).items() if k != "text"},
        "read_path": read_path_of(bt),
        # page faults on the process's own code and libraries: not table reads, not in read_path
        "code_faults": int(code.sum()) if code is not None else 0,
        "recommendation": {**readahead_fix(verdict, {k: advice_for(verdict, read_path_of(bt), bt)[k]
                                                     for k in ("fix", "confirm")}, bt),
                           "code_site": (bt.get("code_view") or {}).get("fix")},  # the fix at the code's site
        "code_view": bt.get("code_view"),
        "readahead": bt.get("readahead"),
        "prefetch": bt.get("prefetch"),
        "pagecache_note": bt.get("pagecache_note"),
        "evicted_by": bt.get("evicted_by"),
        "miss_causes": bt.get("miss_causes"),
        "miss_cause_method": bt.get("miss_cause_method"),
        "hot_rows": hot,
        # one row per traced process (rank), each analysed on its own; the verdict above is the
        # slowest process's (batch p99); one row when the trace holds one process
        "processes": bt.get("processes") or [],
        "slowest_process": bt.get("slowest_process", (bt.get("processes") or [{}])[0].get("pid")),
        "batch_tail": bt,
        "trace": {k: trace_summary.get(k) for k in ("pid", "duration_s", "calls", "recorded", "lost_records",
                                                    "eagain_rate", "nowait_share", "latency_us", "device", "stacks",
                                                    "kernel_skipped")},
    }


def pagecache_steps(bt: dict) -> list[dict]:
    """Evidence from the page-cache probe: readahead amplification above 4x, prefetch hit rate."""
    steps = []
    line = readahead.finding(bt.get("readahead") or [])
    if line:
        cost = readahead_cost(bt)
        if cost is not None:
            line += (f"; about {pct(cost)} of batch time went to reading pages nobody asked for (the miss time "
                     "times the share of read-ahead pages never read)")
        steps.append({"step": "readahead", "finding": line,
                      "value": {e["path"]: e["amplification"] for e in bt["readahead"] if e.get("flagged")},
                      "unrequested_read_share": cost})
    pf = bt.get("prefetch") or {}
    if pf.get("hints"):
        rate = pf.get("hit_rate")
        steps.append({"step": "prefetch hints", "finding": (
            f"{pf['hints']:,} WILLNEED / readahead hints named {pf['hinted_pages']:,} pages; of the {pf['read_pages']:,} "
            f"read since, {pct(rate)} were ready (hit rate) and {pf['late_pages']:,} were not resident or still "
            "in flight when read (late)"), "value": rate})
    return steps


def readahead_cost(bt: dict) -> float | None:
    """Share of batch time spent reading pages nobody asked for: the miss time (residency +
    storage shares) times the share of the flagged files' inserted pages never read."""
    bad = [e for e in bt.get("readahead") or [] if e.get("flagged") and e.get("inserted_pages")]
    if not bad:
        return None
    inserted = sum(e["inserted_pages"] for e in bad)
    unused = sum(max(0, e["inserted_pages"] - max(e.get("used_pages") or 0, e.get("touched_pages") or 0)) for e in bad)
    share = bt.get("share") or {}
    return round((share.get("residency", 0.0) + share.get("storage", 0.0)) * unused / inserted, 3)


def readahead_fix(verdict: str, rec: dict, bt: dict) -> dict:
    """The fix, led by turning readahead off when a file's readahead was flagged and the
    verdict is about misses."""
    ra_fix = readahead.fix(bt.get("readahead") or [])
    if verdict in ("residency", "reclaim", "storage") and ra_fix:
        rec = {**rec, "fix": f"{ra_fix} {rec['fix']}"}
    return rec


BUNDLE_MARKERS = "markers.jsonl"


def keep_markers(markers: str, trace_dir: str) -> None:
    """Copy the markers file into the bundle (TRACE/markers.jsonl), so that the bundle carries
    the batches it was analysed with (compare and batch-tail read them from there).  Created
    with O_EXCL | O_NOFOLLOW inside the bundle; the application's file is only read."""
    target = os.path.join(trace_dir, BUNDLE_MARKERS)
    try:
        with open(markers, "rb") as src:
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
            with os.fdopen(fd, "wb") as dst:
                shutil.copyfileobj(src, dst)
    except OSError as exc:  # the analysis still reads the application's file
        print(f"engramprof: note: markers not copied into the bundle ({exc.strerror})", file=sys.stderr)


def run(pid, duration: float = 20.0, markers: str | None = None, output: str | None = None,
        slow_ms: float = 4.0, sample_hz: float = 10.0, stop=None, on_tracing=None, argv=None,
        offcpu: bool = True, fault_address: bool = True, stack_hz: float = DEFAULT_STACK_HZ) -> dict:
    """Record the target (a pid or a Selection) for `duration` seconds, then diagnose.  `stop`
    (threading.Event) ends early; `offcpu` / `fault_address` / `stack_hz`: see
    record.sources.base.Options."""
    if not duration > 0:
        raise UserError(f"the recording's duration must be > 0 s (got {duration})")
    if markers and not os.path.isfile(markers):
        raise UserError(f"{markers}: no such markers file")
    tmpdir = None
    if output is None:
        tmpdir = tempfile.mkdtemp(prefix="engramprof-diagnose-")  # private (0700), ours alone
        trace_dir = os.path.join(tmpdir, "trace")
    else:
        trace_dir = output
    try:
        tracer = Recorder(pid, output=trace_dir, argv=argv, sample_hz=sample_hz, offcpu=offcpu,
                          fault_address=fault_address, stack_hz=stack_hz)
        if stop is not None:
            tracer.stop = stop
        tracer.start()
        if on_tracing:
            on_tracing(tracer)
        try:
            tracer.run(duration=duration)
        finally:
            summary = tracer.finish()
        if markers:
            keep_markers(markers, trace_dir)
        try:
            result = analyse_trace(trace_dir, markers, slow_ms, summary, duration)
        except UserError as exc:
            if tmpdir:  # keep what was recorded: the user may analyse it another way
                keep, tmpdir = trace_dir, None
                raise UserError(f"{exc} (the recording is kept in {keep})", code=exc.code) from None
            raise UserError(f"{exc} (the recording is in {trace_dir})", code=exc.code) from None
        result["output"] = output
        result["end_reason"] = summary.get("end_reason")
        return result
    finally:
        if tmpdir:
            shutil.rmtree(tmpdir, ignore_errors=True)
