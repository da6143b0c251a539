"""Stage 8: the summary (the ``--json`` document of batch-tail) and the notes on what the
analysis could not see."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from engramprof.analysis.attribute import SLOW_COPY_NS, BatchAccumulator
from engramprof.analysis.calibrate import (
    NORMAL_MISS_CEILING_US,
    MissService,
    ms_pair,
    percentile,
)
from engramprof.analysis.components import safe_div
from engramprof.analysis.context import SampleContext, psi_average
from engramprof.analysis.events import ReadEvents, misses_known
from engramprof.analysis.threads import SUBMITTER_COVERAGE, ReadingThreads
from engramprof.analysis.verdicts import CAUSES, VERDICTS, col, verdict_of
from engramprof.jsonable import jsonable
from engramprof.units import pct

#: the tail: batches whose wall time is above this percentile
TAIL_PERCENTILE = 90.0
#: warn when unexplained time is at least this share of all batch time
UNEXPLAINED_NOTE_SHARE = 0.25


@dataclass
class Settings:
    slow_ms: float
    normal_miss_us: float | None
    meaningful_share: float
    loop_gap_us: float
    top: int


def evidence_notes(acc: BatchAccumulator, context: SampleContext, unsplit_ns: float) -> list[str]:
    """What the evidence could not show (notes for the reader of the answer)."""
    notes: list[str] = []
    t = acc.totals
    nulls = [f"{c} ({k})" for c, k in t.nulls.items() if k]
    if nulls:
        notes.append("evidence values missing on some calls, taken as 0: " + ", ".join(nulls))
    if unsplit_ns > 0:
        notes.append("no bio_ns/bio_count and no pages_added: miss waits cannot be split into residency and storage")
    src = context.refaults.source if context.refaults is not None else None
    if context.refaults is None and t.calls_with_misses:
        notes.append("no cgroup or vmstat refault samples: refault-driven misses cannot be told from plain "
                     "misses (reclaim shows only reclaim inside calls)")
    elif src and "system-wide" in src and t.refaulted_pages > 0:
        notes.append("refaults are system-wide (no cgroup samples): other processes' refaults may be "
                     "counted as this reader's")
    return notes


def slow_copy_note(acc: BatchAccumulator, n_in_batches: int) -> list[str]:
    t = acc.totals
    if t.slow_copy and t.slow_copy >= 0.001 * max(1, n_in_batches):
        return [f"{t.slow_copy:,} call(s) without misses spent over {SLOW_COPY_NS / 1e3:.0f} µs on CPU: "
                "not a plausible cached copy; CPU steal on a virtualised host, or evidence lost? "
                "(counted as cpu-copy)"]
    return []


def _evidence(acc, events, threads, context, service, ctx, tot_wall, t_first, t_last, notes) -> dict:
    cols, t = events.cols, acc.totals
    evidence: dict = {
        "threads": int(len(threads.in_batches)),
        "slow_calls": int(t.slow),
        "concurrency_p50": percentile(safe_div(acc.sum_call, acc.inflight), 50),
        "no_read_ms": ms_pair(acc.no_read),
    }
    if cols.has("flags"):
        evidence["nowait_calls"] = int(t.nowait)
    if cols.has("ret"):
        evidence["eagain_calls"] = int(t.eagain)
        evidence["error_calls"] = int(t.errors)
    if cols.has("pages_added"):
        evidence["misses"] = int(t.pages_inserted)
    if misses_known(cols):  # pages inserted, bios, O_DIRECT, or a request that waited
        n_in = int(acc.n_events)
        evidence["calls_with_misses_frac"] = t.calls_with_misses / n_in if n_in else None
        evidence["slow_calls_with_misses_frac"] = t.slow_with_misses / t.slow if t.slow else None
    if cols.has("bio_count"):
        evidence["bio_count"] = int(t.bios)
    has_bio = cols.has("bio_count") and cols.has("bio_ns")
    if has_bio and service.per_bio is not None and len(service.per_bio):
        evidence["bio_ms_per_bio"] = ms_pair(service.per_bio)
    miss_io = service.waited_ms
    if miss_io is not None:
        evidence["miss_io_ms"] = miss_io
        bio_p50 = evidence.get("bio_ms_per_bio", {}).get("p50")
        if bio_p50 and miss_io["p99"] and miss_io["p99"] > 4 * max(bio_p50, evidence["bio_ms_per_bio"]["p99"] or 0):
            notes.append(f"readers waited up to {miss_io['p99']:.3g} ms (p99) per miss I/O while bio queue->complete "
                         f"was at most {evidence['bio_ms_per_bio']['p99']:.3g} ms (p99): the I/O was held outside the "
                         "device queue (a blkio throttle dispatches held bios from a worker, so they are not seen "
                         "in the reader's calls; or queueing before the block layer)")
    if cols.has("reclaim_ns"):
        evidence["reclaim_ms"] = t.reclaim_ns / 1e6
        evidence["calls_with_reclaim"] = int(t.calls_with_reclaim)
    if cols.has("offcpu_ns"):
        evidence["offcpu_ms"] = t.offcpu_ns / 1e6
        evidence["slow_copy_calls"] = int(t.slow_copy)
    if cols.has("runq_ns"):
        evidence["runq_ms"] = t.runq_ns / 1e6
        if tot_wall > 0:
            # attributed to batch time: preemption (in python-scheduling) and the wake-up of
            # calls that slept on a miss (in residency / reclaim)
            evidence["runq_preempt_share"] = float(acc.runq_preempt.sum() / tot_wall)
            evidence["runq_wake_share"] = float(acc.runq_wake.sum() / tot_wall)
    if tot_wall > 0 and acc.reap_wait.any():
        # of residency / reclaim: requests done at the device (their bios complete), not yet reaped
        evidence["reap_wait_share"] = float(acc.reap_wait.sum() / tot_wall)
    if tot_wall > 0 and acc.hint_wait.any():
        # of residency: the target inside its own prefetch hints, no read in flight (hint_calls.py)
        share = float(acc.hint_wait.sum() / tot_wall)
        evidence["hint_call_share"] = share
        notes.append(f"{share:.0%} of batch time the target spent inside its own prefetch hints (fadvise / madvise "
                     "WILLNEED, readahead(2)) on the files it reads, with no read in flight: the cost of bringing "
                     "the rows in, counted as residency")
    if ctx is not None:
        sw, _inv, totals = ctx
        evidence["ctx_switches_per_batch"] = {"p50": percentile(sw, 50), "p99": percentile(sw, 99)}
        evidence["ctx_switches_sampled"] = dict(totals)
        if np.isnan(sw).any():
            evidence["ctx_switches_batches_not_covered"] = int(np.isnan(sw).sum())
    rs = context.refaults
    if rs is not None:
        evidence["refault_source"] = rs.source
        win = (rs.at > t_first) & (np.r_[np.iinfo(np.int64).min, rs.at[:-1]] <= t_last)
        evidence["refaults_in_window"] = float(rs.refaults[win].sum())
        if acc.pages_per_interval is not None and cols.has("pages_added"):
            evidence["refault_frac_of_misses_est"] = (t.refaulted_pages / t.pages_inserted
                                                      if t.pages_inserted > 0 else None)
    if context.psi is not None:
        evidence["psi_some_pct"] = psi_average(context.psi, t_first, t_last)
    return evidence


def _slowest_batches(table: pd.DataFrame, top: int) -> list[dict]:
    show = ["batch", "start_s", "wall_ms", "inflight_ms", "calls", "slow_calls", "slowest_call_ms", "verdict"]
    show += [c for c in ("misses", "bio_ms", "reclaim_in_calls_ms", "offcpu_ms", "runq_ms", "ctx_switches_est",
                         "slowest_path", "slowest_offset", "slowest_row", "slowest_misses", "slowest_bio_ms",
                         "slowest_reclaim_ms", "slowest_offcpu_ms", "slowest_runq_ms", "queue_depth",
                         "queue_depth_max", "direct_calls", "uring_inline", "uring_async", "uring_punted")
             if c in table.columns]
    top_df = table.nlargest(min(top, len(table)), "wall_ms")
    out = []
    for rec in top_df[show].to_dict("records"):
        rec = {k: jsonable(v) for k, v in rec.items()}
        rec["share"] = {c: float(top_df.loc[rec["batch"], f"share_{col(c)}"]) for c in CAUSES}
        out.append(rec)
    return out


def summarize(acc, seg, events: ReadEvents, threads: ReadingThreads, context: SampleContext, service: MissService,
              table: pd.DataFrame, denom: np.ndarray, settings: Settings, ctx, notes: list[str]) -> dict:
    """The summary document: shares over all batches and over the tail, verdicts, evidence."""
    wall = (seg.end_ns - seg.start_ns).astype(np.float64)
    nb = acc.n
    if len(events.ts):
        t_first, t_last = int(events.ts[0]), events.end_max
    else:  # no read event: the batches' span
        t_first, t_last = (int(seg.start_ns.min()), int(seg.end_ns.max())) if nb else (0, 0)
    tot_wall = float(denom.sum())
    share_all = {c: float(acc.cause_ns[c].sum() / tot_wall) if tot_wall > 0 else 0.0 for c in CAUSES}
    p90 = float(np.percentile(wall, TAIL_PERCENTILE)) if nb else 0.0
    tail = wall > p90
    if not tail.any():
        tail = wall >= p90
    tw = float(denom[tail].sum())
    share_tail = {c: float(acc.cause_ns[c][tail].sum() / tw) if tw > 0 else 0.0 for c in CAUSES}
    batch_p50 = percentile(wall, 50)
    infl_p50 = percentile(acc.inflight, 50)
    outside = max(0.0, 1.0 - infl_p50 / batch_p50) if batch_p50 and infl_p50 is not None else None
    evidence = _evidence(acc, events, threads, context, service, ctx, tot_wall, t_first, t_last, notes)
    missing = events.missing_evidence
    if share_all["unexplained"] >= UNEXPLAINED_NOTE_SHARE:
        why = (f" (missing evidence: {', '.join(missing)})" if missing
               else " (off-CPU waits in batches without misses: locks? page faults on the buffers?)")
        notes.append(f"{pct(share_all['unexplained'])} of batch time is unexplained{why}")
    if threads.processes > 1:
        notes.append(f"calls from {threads.processes} processes were segmented as one read stream")
    summary: dict = {
        "batches": int(nb),
        "batch_source": seg.source,
        "gap_ms": None if seg.gap_ns is None else seg.gap_ns / 1e6,
        "gap_source": seg.gap_source,
        "gap_excludes_runnable": (None if seg.source != "inferred" or seg.gap_source == "user"
                                  else bool((seg.info or {}).get("runnable_spans"))),
        "slow_ms": float(settings.slow_ms),
        "frac_batches_with_slow_call": float((acc.slow_calls > 0).mean()) if nb else 0.0,
        "calls": int(events.n_total),
        "calls_in_batches": int(acc.n_events),
        "call_ms": ms_pair(events.dur) if events.call_ms is None else events.call_ms.result(),
        "batch_ms": ms_pair(wall),
        "inflight_ms": ms_pair(acc.inflight),
        "sum_call_ms": ms_pair(acc.sum_call),
        "outside_read_path_frac": outside,
        "share": share_all,
        "tail_share": share_tail,
        "tail_threshold_ms": p90 / 1e6,
        "tail_batches": int(tail.sum()),
        "verdict": verdict_of(share_all, settings.meaningful_share),
        "tail_verdict": verdict_of(share_tail, settings.meaningful_share),
        "verdict_counts": {v: int((table["verdict"] == v).sum()) for v in VERDICTS},
        "submitter": threads.submitter_info,
        "normal_miss_us": None if service.normal_ns is None else service.normal_ns / 1e3,
        "normal_miss_source": service.source,
        "thresholds": {
            "meaningful_share": float(settings.meaningful_share),
            "loop_gap_us": float(settings.loop_gap_us),
            "submitter_coverage": SUBMITTER_COVERAGE,
            "normal_miss_ceiling_us": NORMAL_MISS_CEILING_US,
            "tail_percentile": TAIL_PERCENTILE,
        },
        "evidence": {k: jsonable(v) for k, v in evidence.items()},
        "slowest_batches": _slowest_batches(table, settings.top),
        "missing_evidence": missing,
        "samples_used": context.used,
        "samples_missing": context.missing,
        "notes": notes,
    }
    if seg.source == "markers":
        summary["markers"] = {k: int(v) for k, v in seg.info.items()}
    else:
        summary["gap_inference"] = {k: jsonable(v) for k, v in seg.info.items()}
    return summary
