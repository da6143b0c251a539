"""batch-tail's analysis: each batch's wall time split into causes, and the verdict.

The model is documented once, in docs/model.md.  The analysis is a pipeline of named stages,
each a function over arrays / DataFrames in its own module:

1. :func:`~engramprof.analysis.events.prepare_read_events` -- usable read events in entry order
2. :func:`segment_batches` -- markers, else inferred from the gaps (engramprof.analysis.batches);
   :mod:`~engramprof.analysis.holes` leaves out the batches that overlap lost records
3. :func:`~engramprof.analysis.context.load_context` -- samples: threads, PSI, refaults
4. :func:`~engramprof.analysis.threads.find_reading_threads` -- threads per batch, the submitter
5. :func:`~engramprof.analysis.attribute.attribute_batches` -- one pass: in-flight union, gaps,
   each event's components (once), per-batch figures, into a BatchAccumulator
6. :mod:`~engramprof.analysis.calibrate` -- normal miss service, refault fractions, and the
   split of miss time into residency / storage / reclaim
7. :func:`~engramprof.analysis.table.batch_table` -- one row per batch
8. :func:`~engramprof.analysis.summary.summarize` -- the ``--json`` document

Vectorised numpy: no Python loop runs per event (one loop runs per sampled thread).
"""
from __future__ import annotations

import math
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, NamedTuple

import numpy as np
import pandas as pd

from engramprof.analysis import batches as _batches
from engramprof.analysis import baseline as _baseline
from engramprof.analysis import calibrate, hint_calls, misses, own_insertions, paths, thread_kinds
from engramprof.analysis.attribute import AttributionInputs, attribute_batches
from engramprof.analysis.context import SampleContext, context_switches, load_context
from engramprof.analysis.events import ReadEvents, code_faults, prepare_read_events
from engramprof.analysis.holes import exclude_blind_batches, read_holes, skipped_runs_notes
from engramprof.analysis.processes import analyse_each, process_ids, process_row
from engramprof.analysis.summary import (
    Settings,
    evidence_notes,
    slow_copy_note,
    summarize,
)
from engramprof.analysis.table import batch_shares, batch_table
from engramprof.analysis.threads import find_reading_threads
from engramprof.analysis.unread import (
    attribute_unread_batches,
    fault_read_path,
    resplit_fault_gaps,
)
from engramprof.analysis.verdicts import DEFAULT_MEANINGFUL_SHARE, DEFAULT_SLOW_MS
from engramprof.errors import UserError
from engramprof.host.pages import release_free_heap

#: of a gap between two reads of one pool worker (not the submitting thread), this much is the
#: worker's own read loop (cpu-copy); the rest is executor machinery and GIL waits (a tight
#: Python preadv loop spends ~1-2 µs between calls, docs/kernel.md)
DEFAULT_LOOP_GAP_US = 2.0


class BatchTailResult(NamedTuple):
    batches: pd.DataFrame
    summary: dict


def _inputs(obj: Any, samples: dict | None, meta: dict | None) -> tuple[pd.DataFrame, Callable, dict, list[str]]:
    """(per-event DataFrame, sample getter, metadata, notes) of a Trace or a DataFrame."""
    smp = dict(samples or {})
    if isinstance(obj, pd.DataFrame):
        return obj, smp.get, dict(meta or {}), []
    if hasattr(obj, "calls") and isinstance(getattr(obj, "calls"), pd.DataFrame):
        def getter(name: str):
            return smp[name] if name in smp else obj.samples(name)

        notes = list(getattr(obj, "notes", []) or [])
        return obj.calls, getter, dict(meta if meta is not None else (getattr(obj, "meta", {}) or {})), notes
    raise UserError("batch-tail: expected a trace or a per-call DataFrame")


def check_settings(slow_ms, gap_ms, normal_miss_us, meaningful_share, loop_gap_us) -> None:
    """Reject settings the analysis cannot use (one-line UserError naming the setting)."""
    for what, v in (("slow-call threshold (ms)", slow_ms), ("batch split gap (ms)", gap_ms),
                    ("normal miss service (µs)", normal_miss_us)):
        if v is not None and not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
            raise UserError(f"the {what} must be a positive number (got {v})")
    if not (0.0 < meaningful_share <= 1.0):
        raise UserError(f"meaningful share must be in (0, 1] (got {meaningful_share})")
    if not loop_gap_us >= 0:
        raise UserError(f"loop gap allowance must be >= 0 (got {loop_gap_us})")


def segment_batches(events: ReadEvents, markers_df: pd.DataFrame | None, gap_ms: float | None, meta: dict,
                    markers_bad_lines: int, notes: list[str], keep_unread: bool = False,
                    runnable: "_batches.RunnableSpans | None" = None):
    """Stage 2: batches from markers, else inferred (cut batches at the recording's edges left out).
    ``keep_unread``: marked batches without a read event are kept (a memory-mapped reader).
    ``runnable``: the threads' preempted spans (inferred splits judge idle gaps)."""
    end = events.end
    if markers_df is not None:
        if gap_ms is not None:
            notes.append("--gap-ms is ignored when --markers are given")
        seg = _batches.from_markers(events.ts, end, markers_df, meta, markers_bad_lines, keep_empty=keep_unread)
    else:
        seg = _batches.drop_truncated(_batches.infer(events.ts, end, gap_ms, runnable), meta)
    notes.extend(seg.notes)
    return seg


def _process_tids(calls: pd.DataFrame, threads: pd.DataFrame | None) -> np.ndarray | None:
    """The threads of the process these calls came from, to pick its off-CPU spans; None: take
    every span (the trace holds one process).  From the threads table's pid column, else the
    calls' own tids (a trace without a threads table)."""
    if threads is not None and {"tid", "pid"} <= set(threads.columns):
        tpid = threads["pid"].to_numpy()
        if len(tpid) and (tpid == tpid[0]).all():
            return None
        pids = process_ids(calls)
        return threads.loc[tpid == pids[0], "tid"].to_numpy() if len(pids) == 1 else None
    if "pid" not in calls.columns or "tid" not in calls.columns:
        return None
    pid = calls["pid"].to_numpy()
    if not len(pid) or (pid == pid[0]).all():
        return None
    return np.unique(calls["tid"].to_numpy())


def _thread_names(getter: Callable) -> pd.DataFrame | None:
    """samples/threads with names (the analysis' context reads only its numeric columns)."""
    return _samples_or_none(getter, "threads")


def _kinds_table(table_of) -> pd.DataFrame | None:
    """tables/thread_kinds (filled by a sampler that reads the interpreter), or None."""
    try:
        return table_of("thread_kinds") if table_of else None
    except (UserError, KeyError):
        return None


def native_pool_wait(acc, seg) -> dict | None:
    """Time native threads (a library's own pool) spent off their reads in batches: counted
    with the batch's work (cpu-copy), never as python-scheduling."""
    total = float(acc.native_wait.sum())
    if total <= 0:
        return None
    wall = float((seg.end_ns - seg.start_ns).astype(np.float64).sum())
    return {"ms": total / 1e6, "share": total / wall if wall > 0 else 0.0,
            "batches": int((acc.native_wait > 0).sum())}


def _disk_samples(getter: Callable) -> pd.DataFrame | None:
    """samples/disks (the devices' own read counters), or None (an older bundle, unreadable)."""
    return _samples_or_none(getter, "disks")


def _beside(*work: tuple) -> list[Future]:
    """Start each ``(function, *args)`` on one thread beside the pipeline, in order; their
    futures.  For figures that need only inputs already at hand (the device baseline and the
    durations' percentiles after the load, the context switches once the batches and reading
    threads are known: NumPy work that releases the GIL): done on a core the serial stages
    leave idle, and the same values."""
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="engramprof-beside")
    try:
        return [pool.submit(fn, *args) for fn, *args in work]
    finally:
        pool.shutdown(wait=False)  # the thread ends once its work is done


def _window(events: ReadEvents, meta: dict) -> tuple[int, int]:
    """The recording window: the recorder's start/end when it wrote them, else the events' span."""
    win = _batches.recording_window(meta)
    if win is not None or not len(events.ts):
        return win or (0, 1)
    return int(events.ts[0]), events.end_max


def read_event_counts(calls: pd.DataFrame, code: np.ndarray | None = None) -> dict:
    """Read events per kind (syscall, fault, io_uring); page faults on the process's own code
    (left out of the analysis: not table reads; counted apart as ``code_faults``) are not
    counted.  ``code``: :func:`code_faults` of ``calls`` when the caller has it."""
    if "kind" not in calls.columns:
        return {"syscall": int(len(calls))}
    if code is None:
        code = code_faults(calls)
    if code is not None and code.any():
        calls = calls[~code]
    kind = calls["kind"]
    if isinstance(kind.dtype, pd.CategoricalDtype) and len(kind.cat.categories) <= 16:
        # a few kinds: one pass over the small codes per kind (value_counts' order: most first)
        codes = np.asarray(kind.array.codes)  # the categorical's own (a .cat.codes Series is a copy)
        counts = pd.Series([np.count_nonzero(codes == i) for i in range(len(kind.cat.categories))],
                           index=kind.cat.categories, dtype=np.int64).sort_values(ascending=False)
    else:
        counts = kind.value_counts() if isinstance(kind.dtype, pd.CategoricalDtype) else kind.astype(object).value_counts()
    return {str(k): int(v) for k, v in counts.items() if v}


def _samples_or_none(getter: Callable, name: str) -> pd.DataFrame | None:
    try:
        return getter(name)
    except (UserError, KeyError):
        return None


def _step_tids(seg, threads) -> np.ndarray:
    """Per batch, the tid of the thread its step runs on: its markers' tid, else the submitter
    inferred from the reads; -1 where neither is known."""
    code = threads.submitter
    out = np.where(code >= 0, threads.tids[np.maximum(code, 0)] if len(threads.tids) else -1, -1).astype(np.int64)
    if seg.submit_tid is not None:
        given = seg.submit_tid >= 0
        out[given] = seg.submit_tid[given]
    return out


def _read_paths(events: ReadEvents) -> list:
    """The paths the read events name (the distinct values of their path column)."""
    return list(events.cols.codes("path")[1]) if events.cols.has("path") else []


def _path_codes(events: ReadEvents) -> np.ndarray | None:
    if not events.cols.has("path"):
        return None
    codes, uniques = events.cols.codes("path")
    small = (np.int8 if len(uniques) < np.iinfo(np.int8).max else np.int16 if len(uniques) < np.iinfo(np.int16).max
             else np.int32)
    return events.cols.in_order(np.add(codes, 1, dtype=small))  # 0: missing


def analyse(
    trace_or_calls: Any,
    markers_df: pd.DataFrame | None = None,
    slow_ms: float = DEFAULT_SLOW_MS,
    gap_ms: float | None = None,
    normal_miss_us: float | None = None,
    *,
    meaningful_share: float = DEFAULT_MEANINGFUL_SHARE,
    loop_gap_us: float = DEFAULT_LOOP_GAP_US,
    samples: dict | None = None,
    meta: dict | None = None,
    markers_bad_lines: int = 0,
    top: int = 10,
) -> BatchTailResult:
    """Segment a trace into batches and split each batch's wall time into causes.

    ``trace_or_calls``: an :class:`engramprof.trace.Trace` (its samples are used) or a per-event
    DataFrame (pass ``samples={"threads": df, "vmstat": df, "psi": df}`` to use samples).
    ``markers_df``: DataFrame with start_ns/end_ns (see :func:`engramprof.analysis.batches.read_markers`);
    None infers batches from gaps (``gap_ms`` overrides the inferred threshold).
    Returns ``(batches DataFrame, summary dict)``; the summary is the ``--json`` document.
    Raises :class:`UserError` when nothing can be said (no events, unusable markers...).
    """
    check_settings(slow_ms, gap_ms, normal_miss_us, meaningful_share, loop_gap_us)
    calls, getter, meta, notes = _inputs(trace_or_calls, samples, meta)
    notes.extend(paths.sqpoll_notes(meta))
    notes.extend(skipped_runs_notes(meta))  # blind without a hole in the records (analysis/holes.py)
    pids = process_ids(calls)
    # why each missed page was missing, where the bundle has eviction records (analysis/misses.py)
    table_of = getattr(trace_or_calls, "table", None)
    miss_pages = misses.from_trace(calls, getter, table_of, meta)
    settings = dict(slow_ms=slow_ms, gap_ms=gap_ms, normal_miss_us=normal_miss_us, meaningful_share=meaningful_share,
                    loop_gap_us=loop_gap_us, getter=getter, meta=meta, notes=notes,
                    markers_bad_lines=markers_bad_lines, top=top, miss_pages=miss_pages, table_of=table_of,
                    later=getattr(trace_or_calls, "later", None) or {})
    why = misses.summary_keys(miss_pages, table_of("evictors") if table_of and miss_pages is not None else None)
    bio_hist = table_of("bio_latency_log2") if table_of else None
    if len(pids) > 1:
        def one(c, m, **kw):
            kw["notes"] = list(kw["notes"])
            return _analyse_process(c, m, **kw)

        table, summary = analyse_each(one, calls, pids, markers_df, **settings)
        summary.update(why)
        summary.update(paths.path_figures(calls, table, bio_hist))
        return BatchTailResult(table, summary)
    table, summary = _analyse_process(calls, markers_df, **settings)
    summary.update(why)
    summary.update(paths.path_figures(calls, table, bio_hist))
    summary["processes"] = [process_row(int(pids[0]), summary, meta)] if len(pids) else []
    summary["slowest_process"] = int(pids[0]) if len(pids) else None
    return BatchTailResult(table, summary)


def _analyse_process(calls: pd.DataFrame, markers_df, *, slow_ms, gap_ms, normal_miss_us, meaningful_share,
                     loop_gap_us, getter, meta, notes, markers_bad_lines, top, miss_pages=None,
                     table_of=None, later=None) -> BatchTailResult:
    """Stages 1-8 on the events of one process (``later``: its columns the load left on disk)."""
    # a memory-mapped reader's marked batch may hold no read event (its rows mapped, resident)
    keep_unread = markers_df is not None and fault_read_path(calls, meta)
    events = prepare_read_events(calls, notes, allow_none=keep_unread)
    events.cols.later = later or {}
    disks, window = _disk_samples(getter), _window(events, meta)
    device, events.call_ms = _beside((_baseline.device_baseline, calls, disks, window), (calibrate.ms_pair, events.dur))
    context: SampleContext = load_context(getter, notes)
    runnable = (None if context.offcpu is None or markers_df is not None or gap_ms is not None
                else _batches.RunnableSpans.of(context.offcpu, _process_tids(calls, context.threads)))
    seg = segment_batches(events, markers_df, gap_ms, meta, markers_bad_lines, notes, keep_unread, runnable)
    seg, lost = exclude_blind_batches(seg, read_holes(getter, meta), _window(events, meta), notes)
    events.drop_end()  # 8 bytes an event, not needed past here (the latest exit is kept)
    read = ~seg.empty
    seg_read = seg if read.all() else seg.subset(read)
    threads = find_reading_threads(events, seg_read)
    # per batch, the reading threads' context switches (from the 10 Hz samples): beside the pass
    switches = (_beside((context_switches, context.threads, threads.in_batches, seg.start_ns.astype(np.int64),
                         seg.end_ns.astype(np.int64)))[0] if context.threads is not None else None)
    seen_tids = np.union1d(threads.tids[pd.notna(threads.tids)].astype(np.int64),
                           context.offcpu["tid"].to_numpy(np.int64) if context.offcpu is not None else [])
    pids_of = process_ids(calls)
    kinds = thread_kinds.thread_kinds(seen_tids, markers_df, _thread_names(getter), _kinds_table(table_of),
                                      thread_kinds.not_cpython_pids(meta), int(pids_of[0]) if len(pids_of) == 1 else None)
    threads.native = thread_kinds.native_mask(kinds, threads.tids)
    pagecache = _samples_or_none(getter, "pagecache")
    inserting = (own_insertions.inserting_batches(pagecache, _read_paths(events), seg_read.start_ns, seg_read.end_ns)
                 if pagecache is not None and len(pagecache) else None)
    del pagecache
    hints = hint_calls.StepHints.of(_samples_or_none(getter, "pagecache_hints"), pids_of, _read_paths(events),
                                    _step_tids(seg_read, threads), threads.in_batches)
    acc = attribute_batches(events, AttributionInputs(seg=seg_read, threads=threads, refaults=context.refaults,
                                                      slow_ms=slow_ms, loop_gap_us=loop_gap_us,
                                                      path_codes=_path_codes(events), inserting=inserting,
                                                      hints=hints))
    release_free_heap()  # the pass's per-chunk arrays, freed but kept by malloc (host/pages.py)
    has_bio = events.cols.has("bio_count") and events.cols.has("bio_ns")
    device = device.result()
    traffic = _baseline.device_traffic(disks, lambda: calls["dev"].dropna().unique() if "dev" in calls.columns
                                       else None, window)
    del disks
    service = calibrate.calibrate_miss_service(acc, normal_miss_us, has_bio, events.requests_only, device)
    pid = int(pids_of[0]) if len(pids_of) == 1 else None
    evicted = misses.batch_shares(miss_pages, pid, seg_read.start_ns, seg_read.end_ns)
    calibrate.split_miss_time(acc, service, calibrate.refault_fractions(acc, context.refaults), evicted)
    release_free_heap()  # the miss parts, joined and split
    resplit_fault_gaps(acc, events, seg_read, threads, context.offcpu, loop_gap_us, notes, hints)
    threads_per_batch = threads.per_batch
    unread = {"batches": 0, "source": None}
    if not read.all():
        acc = acc.expanded(np.flatnonzero(read), seg.n)
        threads_per_batch = np.zeros(seg.n, dtype=np.int64)
        threads_per_batch[read] = threads.per_batch
        unread = attribute_unread_batches(acc, seg, ~read, context.offcpu, notes, kinds)
    res = _report(calls, events, seg, acc, threads, threads_per_batch, context, switches, service, has_bio, notes,
                  Settings(slow_ms=slow_ms, normal_miss_us=normal_miss_us, meaningful_share=meaningful_share,
                           loop_gap_us=loop_gap_us, top=top), lost, unread)
    submitters = seg.submit_tid[seg.submit_tid >= 0] if seg.submit_tid is not None else []
    res.summary["thread_kinds"] = thread_kinds.summary(kinds, set(threads.in_batches.tolist()) | set(np.unique(submitters).tolist()))
    res.summary["native_pool_wait"] = native_pool_wait(acc, seg)
    res.summary["device_traffic"] = traffic
    return res


def _report(calls, events, seg, acc, threads, threads_per_batch, context, switches: Future | None, service, has_bio,
            notes, settings, lost: dict, unread: dict) -> BatchTailResult:
    """Stages 7-8: notes on the evidence, shares, the batch table and the summary
    (``switches``: context_switches' result to come; None: no threads samples)."""
    # the observed miss service exists wherever the columns it is computed from do
    has_observed = {"bio_count", "bio_ns"} <= set(calls.columns) or "pages_added" in calls.columns
    notes.extend(slow_copy_note(acc, acc.n_events))
    notes.extend(evidence_notes(acc, context, calibrate.unsplit_wait_ns(acc, service, has_observed)))
    shares, denom = batch_shares(acc, (seg.end_ns - seg.start_ns).astype(np.float64))
    ctx = None
    if switches is not None:
        ctx = switches.result()
        if ctx[2]["threads_sampled"] == 0:
            if len(threads.in_batches):  # (no thread read at all: mapped, resident rows; nothing to say)
                notes.append("threads samples hold none of the reading threads: no context-switch counts")
            ctx = None
    table = batch_table(acc, seg, events, threads_per_batch, shares, settings.meaningful_share,
                        None if ctx is None else ctx[:2])
    summary = summarize(acc, seg, events, threads, context, service, table, denom, settings, ctx, notes)
    summary["device_baseline"] = service.baseline.as_json() if service.baseline is not None else None
    summary["lost_records"] = lost
    code = code_faults(calls)
    summary["read_events"] = read_event_counts(calls, code)
    # page faults on the process's own code and libraries: not table reads, counted apart
    summary["code_faults"] = int(code.sum()) if code is not None else 0
    summary["batches_without_read_events"] = unread
    return BatchTailResult(table, summary)
