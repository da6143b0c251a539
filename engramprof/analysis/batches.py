"""Decode-batch segmentation: from application markers, or inferred from the read stream.

A *batch* is one decode (or prefill) step's worth of row reads: the application submits them
(to a thread pool, or reads them itself), waits for all of them, then runs the model's forward
pass before the next batch.  Two ways to find batches in a trace:

markers
    JSON lines written by the application, one object per batch with ``start_ns`` and
    ``end_ns`` on CLOCK_MONOTONIC (``time.monotonic_ns()``); extra keys are ignored.  A call
    belongs to the batch whose span contains its entry time.  The batch wall time is the
    marker span, so time before the first read (creating futures, waking the pool) is seen.

inferred
    Sort the calls by entry time and look at the *union gaps*: the time between the end of
    everything in flight so far and the next call's entry.  Inside a batch these gaps are
    short (the pool hands work around); between batches they are the forward pass.  The
    split threshold is chosen from the distribution of log(gap) (see
    :func:`choose_gap_threshold`) or given by the user (``--gap-ms``).  An inferred batch
    starts at its first call and ends when its last call returns, so scheduling before the
    first read and after the last one cannot be seen.

Everything here is vectorised (numpy); nothing loops over calls in Python.
"""
from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from engramprof.errors import UserError
from engramprof.markers import markers_frame, read_marker_lines
from engramprof.units import pct

# ---- thresholds of the gap inference (docs/model.md, "Batches") ----------------------------------
#: a split threshold is never inferred below this: a forward pass shorter than 0.25 ms is not
#: credible, and within-batch pool hand-offs and GIL stalls of tens to hundreds of µs are common.
MIN_SPLIT_GAP_NS = 250_000
#: log10(gap) histogram bin width (decades) and smoothing window (bins each side)
BIN_DECADES = 0.05
SMOOTH_BINS = 2
#: the valley between the within-batch mode and the between-batch mode must be at most this
#: fraction of the smaller of the two modes (smoothed counts); otherwise the gaps show no two
#: populations and the whole trace is one batch.
VALLEY_FRACTION = 0.5
#: the forward-pass mode's lower edge: the lowest of the contiguous bins below its peak that
#: hold at least this fraction of the peak (smoothed counts) ...
EDGE_FRACTION = 0.2
#: ... and the threshold is raised to this fraction of that edge (never above the mode)
EDGE_MARGIN = 0.5
#: natural breaks: a sorted gap at least this many times the next smaller one ...
BREAK_RATIO = 2.0
#: ... with at least MIN_SEPARATORS gaps above it, or else this wide (one or two idle pauses)
BIG_BREAK_RATIO = 10.0
MIN_SEPARATORS = 3
#: the widest breaks considered
MAX_BREAKS = 16
#: regularity (std / mean of the call counts of interior batches) is judged on at least
#: this many batches; candidates at most REGULARITY_FACTOR x the most regular one's figure
#: + REGULARITY_SLACK are equally regular (the finest wins); above IRREGULAR_CV the batches
#: found are not trusted
MIN_JUDGED_BATCHES = 3
REGULARITY_FACTOR = 1.25
REGULARITY_SLACK = 0.02
IRREGULAR_CV = 0.5
#: ... and a finer candidate than another about as regular must cut this many times its batches
FINER_FACTOR = 2
#: an inferred batch longer than this (median) is not a step: the read stream shows no steps
LONG_BATCH_NS = 2_000_000_000

_EPOCH_2000 = 946_684_800
_EPOCH_2100 = 4_102_444_800
#: how far from the trace's creation a wall-clock reading of the markers may be (30 days)
WALL_CLOCK_SLACK_S = 30 * 86400
_UNITS = (("ns", 1), ("µs", 1_000), ("ms", 1_000_000), ("s", 1_000_000_000))


@dataclass
class Batches:
    """The result of segmentation.

    Calls must be given sorted by entry time; batch ``k`` holds the calls at positions
    ``first[k]:stop[k]`` of that order (a batch's calls are always contiguous in it).  Batch
    indices are dense, 0..n-1, in time order.  ``call_batch`` gives the per-call view (-1 for
    calls in no batch, markers mode only).
    """

    first: np.ndarray
    stop: np.ndarray
    start_ns: np.ndarray
    end_ns: np.ndarray
    n_calls: int
    source: str  # "markers" | "inferred"
    gap_ns: float | None = None  # split threshold (inferred mode)
    gap_source: str | None = None  # "inferred" | "user" | "none" (no split)
    notes: list[str] = field(default_factory=list)
    info: dict = field(default_factory=dict)
    #: per batch, the submitting thread named by the marker's ``tid`` (-1: not given)
    submit_tid: np.ndarray | None = None

    @property
    def n(self) -> int:
        return len(self.start_ns)

    @property
    def counts(self) -> np.ndarray:
        return self.stop - self.first

    @property
    def empty(self) -> np.ndarray:
        """Batches holding no read event (markers of a reader whose rows were all mapped and
        resident: a memory-mapped gather that made no page fault)."""
        return self.counts == 0

    def subset(self, keep: np.ndarray) -> "Batches":
        """The batches where ``keep``; the calls of the others belong to no batch."""
        return Batches(first=self.first[keep], stop=self.stop[keep], start_ns=self.start_ns[keep],
                       end_ns=self.end_ns[keep], n_calls=self.n_calls, source=self.source, gap_ns=self.gap_ns,
                       gap_source=self.gap_source, notes=self.notes, info=self.info,
                       submit_tid=None if self.submit_tid is None else self.submit_tid[keep])

    @property
    def call_batch(self) -> np.ndarray:
        cb = np.full(self.n_calls, -1, dtype=np.int64)
        if self.n:
            pos = np.arange(self.n_calls)
            k = np.searchsorted(self.first, pos, side="right") - 1
            ok = (k >= 0) & (pos < self.stop[np.maximum(k, 0)])
            cb[ok] = k[ok]
        return cb


# ---------------------------------------------------------------------------- markers --

def read_markers(path: str | os.PathLike) -> tuple[pd.DataFrame, int]:
    """Read a markers file: ``(DataFrame[start_ns, end_ns, tid], number of bad lines)``.

    Blank lines are ignored; lines that are not a JSON object with integer
    0 <= ``start_ns`` <= ``end_ns`` are skipped and counted (the rules of
    :func:`engramprof.markers.read_markers_df`, the writer's own reader).  ``tid`` (the
    submitting thread, written by engramprof.markers) is kept, -1 when absent; ``pid`` and
    ``rank`` (which process the batch belongs to) are kept when present (NaN where a line lacks
    them); ``python_tids`` (the interpreter's threads, when they changed) is kept as written;
    other keys are ignored.
    """
    df, bad, _complete = read_markers_and_ending(path)
    return df, bad


def read_markers_and_ending(path: str | os.PathLike) -> tuple[pd.DataFrame, int, bool]:
    """:func:`read_markers` and whether the file, as read, ends in a newline (or a blank line):
    False when its last line is unfinished (a writer may be inside it).  One read of the file."""
    raw, bad, complete = read_marker_records(path)
    return _marker_frame(raw), int(bad), complete


def read_marker_records(path: str | os.PathLike) -> tuple[pd.DataFrame, int, bool]:
    """The markers file's valid lines as one frame with every key they carry
    (:func:`engramprof.markers.read_markers_df`'s), the bad-line count and whether the file ends
    in a newline: one read and parse of the file, whatever is taken from it."""
    p = Path(path)
    try:
        recs, bad, complete = read_marker_lines(p)
    except FileNotFoundError:
        raise UserError(f"{p}: no such markers file") from None
    except IsADirectoryError:
        raise UserError(f"{p}: is a directory, not a markers file (JSON lines)") from None
    except OSError as exc:
        raise UserError(f"{p}: cannot read markers file: {exc.strerror}") from None
    return markers_frame(recs), int(bad), complete


def markers_of_records(raw: pd.DataFrame) -> pd.DataFrame:
    """:func:`read_markers`' frame of :func:`read_marker_records`' one."""
    return _marker_frame(raw)


def _marker_frame(raw: pd.DataFrame) -> pd.DataFrame:
    """The markers' columns as the analysis takes them (see :func:`read_markers`)."""
    df = raw[["start_ns", "end_ns"]].astype("int64").reset_index(drop=True)
    if "tid" in raw.columns:
        tid = pd.to_numeric(raw["tid"], errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
        df["tid"] = np.where(np.isfinite(tid) & (tid > 0), tid, -1).astype(np.int64)
    else:
        df["tid"] = np.int64(-1)
    for key in ("pid", "rank"):  # whose batch it is (several processes: analysis/processes.py)
        if key in raw.columns:
            df[key] = pd.to_numeric(raw[key], errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
    if "python_tids" in raw.columns:  # the interpreter's threads (analysis/thread_kinds.py)
        df["python_tids"] = raw["python_tids"].reset_index(drop=True)
    return df


def recording_window(meta: dict | None) -> tuple[int, int] | None:
    """The recording's [start_ns, end_ns] from the trace metadata, when the recorder wrote it."""
    meta = meta or {}
    a, b = meta.get("start_ns"), meta.get("end_ns")
    if isinstance(a, int) and isinstance(b, int) and not isinstance(a, bool) and b > a:
        return a, b
    return None


def drop_truncated(seg: "Batches", meta: dict | None) -> "Batches":
    """Inferred batches: leave out the first / last batch when less than one split gap
    separates it from the start / end of the recording (it may have been cut by it)."""
    win = recording_window(meta)
    if win is None or seg.n == 0 or seg.gap_ns is None:
        return seg
    keep = np.ones(seg.n, dtype=bool)
    keep[0] &= seg.start_ns[0] - win[0] > seg.gap_ns
    keep[-1] &= win[1] - seg.end_ns[-1] > seg.gap_ns
    if keep.all() or not keep.any():
        return seg
    seg.notes.append(f"{int((~keep).sum())} inferred batch(es) at the start/end of the recording may have been cut "
                     "by it and were left out")
    return seg.subset(keep)


def _overlaps(s: np.ndarray, e: np.ndarray, t0: float, t1: float) -> np.ndarray:
    return (e >= t0) & (s <= t1)


def explain_marker_clock(markers: pd.DataFrame, t0: int, t1: int, meta: dict | None = None) -> str:
    """Why markers that do not overlap the trace [t0, t1] cannot be on its clock (one line)."""
    s = markers["start_ns"].to_numpy(dtype=np.float64)
    e = markers["end_ns"].to_numpy(dtype=np.float64)
    med = float(np.median(s))
    # an exact overlap after rescaling is stronger evidence than a plausible-looking date
    for unit, scale in _UNITS[1:]:
        if _overlaps(s * scale, e * scale, t0, t1).any():
            return f"marker times look like CLOCK_MONOTONIC in {unit}, not ns: multiply them by {scale:,}"
    try:  # the trace's own wall-clock time: a wall-clock guess must land near it
        created = float((meta or {})["created_unix"])
    except (KeyError, TypeError, ValueError):
        created = None
    for unit, scale in _UNITS:
        secs = med * scale / 1e9
        # CLOCK_MONOTONIC ns of a machine up 16 to 68 minutes read as epoch ms falls in 2000-2100
        # too: with the trace's date known, a date years from it is not the markers' clock
        near = created is None or abs(secs - created) <= WALL_CLOCK_SLACK_S
        if _EPOCH_2000 <= secs <= _EPOCH_2100 and near:
            date = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(secs))
            msg = (
                f"marker times look like wall-clock {unit} since the Unix epoch ({date} UTC), "
                "not CLOCK_MONOTONIC ns: write them with time.monotonic_ns()"
            )
            meta = meta or {}
            try:
                offset = float(meta["created_unix"]) * 1e9 - float(meta["created_monotonic_ns"])
                if _overlaps(s * scale - offset, e * scale - offset, t0, t1).any():
                    msg += " (shifted by this trace's wall-to-monotonic offset they would fall inside it)"
            except (KeyError, TypeError, ValueError):
                pass
            return msg
    if 0 < s.min() and e.max() < t0:
        return (f"markers span {s.min() / 1e9:.3f}..{e.max() / 1e9:.3f} s of CLOCK_MONOTONIC, all before the "
                f"trace's {t0 / 1e9:.3f}..{t1 / 1e9:.3f} s: the batches ended {(t0 - e.max()) / 1e9:.1f} s before "
                "the recording began (the reader had finished?)")
    return (
        f"markers span {s.min() / 1e9:.3f}..{e.max() / 1e9:.3f} s but the trace spans "
        f"{t0 / 1e9:.3f}..{t1 / 1e9:.3f} s of CLOCK_MONOTONIC: no overlap (markers from another run, "
        "another machine, or another clock?)"
    )


def check_markers_before_recording(path: str | os.PathLike) -> None:
    """Refuse a markers file before any probe attaches: missing, a directory, unreadable, or
    holding lines already and not one usable marker among its complete lines (garbage, or a
    file of another format).  An empty file, or good lines, pass: the server appends markers
    while the recording runs, and an unfinished last line may be one being written."""
    df, bad, complete = read_markers_and_ending(path)
    if len(df) or not bad:
        return
    complete_bad = bad - (0 if complete else 1)
    if complete_bad > 0:
        raise UserError(f"{os.fspath(path)}: no usable marker in its {bad} line(s) (each must be a JSON object "
                        "with numeric start_ns < end_ns, CLOCK_MONOTONIC): checked before recording")


def from_markers(ts: np.ndarray, end: np.ndarray, markers: pd.DataFrame, meta: dict | None = None,
                 bad_lines: int = 0, keep_empty: bool = False) -> Batches:
    """Assign calls (sorted by entry ``ts``) to marker spans.

    Markers outside the trace are dropped (noted); when none overlaps the trace the markers
    cannot be on the trace's clock and a :class:`UserError` explains why.  Overlapping markers
    are trimmed to their successor's start.  Markers containing no call are dropped (noted).
    """
    notes: list[str] = []
    info: dict = {"markers_read": int(len(markers)), "bad_lines": int(bad_lines)}
    if bad_lines:
        notes.append(f"markers: skipped {bad_lines} bad line(s) (not a JSON object with numeric start_ns < end_ns)")
    if len(markers) == 0:
        raise UserError("markers file has no usable markers" + (f" ({bad_lines} bad lines)" if bad_lines else ""))
    missing = [c for c in ("start_ns", "end_ns") if c not in markers.columns]
    if missing:
        raise UserError(f"markers lack {', '.join(missing)}")
    raw = markers[["start_ns", "end_ns"]].apply(pd.to_numeric, errors="coerce")
    usable = (raw.notna().all(axis=1) & (raw["start_ns"] >= 0) & (raw["end_ns"] >= raw["start_ns"])).to_numpy()
    if not usable.all():
        info["bad_lines"] = int(bad_lines) + int((~usable).sum())
        notes.append(f"markers: {int((~usable).sum())} without usable start_ns/end_ns were skipped")
        markers = markers[usable]
        raw = raw[usable]
        if len(markers) == 0:
            raise UserError("markers file has no usable markers")
    m = raw.astype("int64")
    if "tid" in markers.columns:
        t = pd.to_numeric(markers["tid"], errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
        m["tid"] = np.where(np.isfinite(t) & (t > 0), t, -1).astype(np.int64)
    else:
        m["tid"] = np.int64(-1)
    m = m.sort_values(["start_ns", "end_ns"], kind="stable")
    s = m["start_ns"].to_numpy()
    e = m["end_ns"].to_numpy()
    mt = m["tid"].to_numpy()
    win = recording_window(meta)
    if len(ts):
        t0, t1 = int(ts.min()), int(end.max())
        if keep_empty and win is not None:  # batches without a read event count: the recording's span
            t0, t1 = min(t0, win[0]), max(t1, win[1])
    elif keep_empty and win is not None:
        t0, t1 = win
    else:
        raise UserError("the trace has no read events and no recording window: markers cannot be placed")
    inside = _overlaps(s, e, t0, t1)
    if not inside.any():
        raise UserError("markers do not overlap the trace: " + explain_marker_clock(m, t0, t1, meta))
    if (~inside).any():
        notes.append(f"markers: {int((~inside).sum())} of {len(s)} fall outside the trace's time span and were ignored")
    s, e, mt = s[inside], e[inside], mt[inside]
    if win is not None:
        straddle = (s < win[0]) | (e > win[1])
        if straddle.any():
            notes.append(f"markers: {int(straddle.sum())} straddle the start or end of the recording "
                         "(their batches were only partly traced) and were left out")
            s, e, mt = s[~straddle], e[~straddle], mt[~straddle]
            if len(s) == 0:
                raise UserError("every marker straddles the start or end of the recording: no complete batch")
    # overlapping markers: trim each to its successor's start
    nxt = np.r_[s[1:], np.iinfo(np.int64).max]
    over = e > nxt
    if over.any():
        notes.append(f"markers: {int(over.sum())} overlap their successor; trimmed to the successor's start")
        e = np.minimum(e, nxt)
    first = np.searchsorted(ts, s, side="left")
    stop = np.searchsorted(ts, e, side="left")
    counts = stop - first
    used = counts > 0 if not keep_empty else np.ones(len(counts), dtype=bool)
    info["markers_in_trace"] = int(len(s))
    info["calls_outside_markers"] = int(len(ts) - counts.sum())
    if keep_empty:
        info["batches_without_read_events"] = int((counts == 0).sum())
    if not used.any():
        raise UserError(
            f"no traced call falls inside any of the {len(s)} markers that overlap the trace "
            "(are the markers from the traced process?)"
        )
    if (~used).any():
        notes.append(f"markers: {int((~used).sum())} batch marker(s) contain no traced call and were left out")
    if info["calls_outside_markers"]:
        notes.append(f"{info['calls_outside_markers']} call(s) fall outside every marker and are not in any batch")
    mt = mt[used]
    if (mt < 0).any():
        notes.append(f"markers: {int((mt < 0).sum())} carry no submitting-thread tid: the submitter is inferred "
                     "from the trace where it can be, else the time before the first read and after the last is "
                     "counted as python-scheduling")
    return Batches(first=first[used], stop=stop[used], start_ns=s[used], end_ns=e[used], n_calls=len(ts),
                   source="markers", notes=notes, info=info, submit_tid=mt)


# --------------------------------------------------------------------------- inferred --

def union_gaps(ts: np.ndarray, end: np.ndarray) -> np.ndarray:
    """gap[i-1] = ts[i] - max(end[:i]) for i >= 1 (calls sorted by ts); <= 0 means overlap."""
    if len(ts) < 2:
        return np.empty(0, dtype=np.int64)
    reach = np.maximum.accumulate(end)[:-1]  # the latest exit before each call
    return np.subtract(ts[1:], reach, out=reach)  # in place: one array of n, not two


_MAX_DECADES = 16
_CHUNK = 1 << 20


def choose_gap_threshold(gaps_ns: np.ndarray) -> tuple[float | None, dict]:
    """Pick the batch-split threshold from the union gaps (ns, in call order); ``None`` = no split.

    Three kinds of evidence, each giving candidate thresholds (all at least MIN_SPLIT_GAP_NS):

    * the density valley below the **count** mode: the fullest gap bin above the floor is the
      forward passes when batches are many and short (decode);
    * the density valley below the **idle-time** mode: the bin holding the most gap time,
      which is where the reader waits for the forward pass even when in-batch stalls
      outnumber the forward passes (prefill of tens of thousands of calls a batch);
    * **natural breaks** in the upper tail: sorted gaps above the floor whose ratio to the next
      smaller gap is at least BREAK_RATIO (the largest few).

    Each candidate is judged by the batches it would cut: a threshold inside the in-batch
    stalls cuts batches into fragments of random size, a threshold between the stalls and the
    forward passes cuts batches of regular size.  The **regularity** of a candidate is the
    spread of its batches' call counts (coefficient of variation of the interior batches:
    a batch cut in two at a stall shows, where a median-based spread would hide it).  The
    most regular candidate wins; among candidates about as regular (REGULARITY_FACTOR x its
    figure + REGULARITY_SLACK), the finest structure (batches, not the sessions between idle
    pauses; :func:`_finest_structure`).
    Candidates too few to judge fall back to the valleys (count mode first).  When only
    natural breaks exist and none cuts regular batches, there is no structure: ``None``.
    ``info`` names the method, every candidate and its figures, and ``confident``: False when
    the chosen batches are irregular (IRREGULAR_CV), so the caller can say so.
    Memory is O(bins) plus 1M-element chunks, plus the gaps above the floor.
    """
    gaps_ns = np.asarray(gaps_ns)
    n = len(gaps_ns)
    info: dict = {"gaps": int(n)}
    if n == 0:
        info["method"] = "single call"
        return None, info
    if n == 1:
        g0 = float(max(gaps_ns[0], 1))
        if g0 >= MIN_SPLIT_GAP_NS:
            info.update(method="single gap", above_ns=g0)
            return g0 / 2, info
        info["method"] = "single short gap"
        return None, info
    nbins = int(_MAX_DECADES / BIN_DECADES) + 1
    counts = np.zeros(nbins, dtype=np.int64)
    gap_time = np.zeros(nbins, dtype=np.float64)
    overlapping = 0
    below_floor_max = 1.0
    for i in range(0, n, _CHUNK):
        raw = gaps_ns[i:i + _CHUNK]
        overlapping += int((raw <= 1).sum())
        below_floor_max = max(below_floor_max, float(np.max(raw, where=raw < MIN_SPLIT_GAP_NS, initial=1)))
        g = np.maximum(raw, 1).astype(np.float64)
        # bins from a float32 log (SIMD; a bin is 0.05 decades, float32 resolves 1e-7 of it)
        lg = np.log10(g.astype(np.float32))
        lg *= np.float32(1.0 / BIN_DECADES)
        idx = np.minimum(lg.astype(np.int32), nbins - 1)
        counts += np.bincount(idx, minlength=nbins)
        gap_time += np.bincount(idx, weights=g, minlength=nbins)
    info["overlapping"] = overlapping
    w = 2 * SMOOTH_BINS + 1
    sm = np.convolve(counts, np.ones(w, dtype=np.int64), mode="same")
    floor_bin = int(math.log10(MIN_SPLIT_GAP_NS) / BIN_DECADES)
    if counts[floor_bin:].sum() == 0:
        info["method"] = "no gap reaches the minimum split"
        return None, info
    tall = _TallGaps.of(gaps_ns, below_floor_max)
    cands: list[dict] = []
    thr_c, info_c = _valley(tall, counts, sm, floor_bin + int(np.argmax(sm[floor_bin:])), info.copy())
    if thr_c is not None:
        cands.append({"source": "count-valley", "threshold_ns": thr_c, **_valley_figures(info_c)})
    tm = np.convolve(gap_time, np.ones(w), mode="same")
    thr_t, info_t = _valley(tall, counts, sm, floor_bin + int(np.argmax(tm[floor_bin:])), info.copy())
    if thr_t is not None and (thr_c is None or tall.separators(thr_t) != tall.separators(thr_c)):
        cands.append({"source": "time-valley", "threshold_ns": thr_t, **_valley_figures(info_t)})
    cands += [{"source": "break", "threshold_ns": t} for t in tall.natural_breaks()]
    for c in cands:
        c.update(tall.judge(c["threshold_ns"]))
    chosen = _pick_candidate(cands)
    info["candidates"] = [_round_candidate(c) for c in cands]
    if chosen is None:
        failed = info_c if thr_c is None else info_t
        info["method"] = ("no regular structure in the gaps" if cands else failed.get("method", "no bimodality"))
        return None, info
    info.update(method={"count-valley": "density valley", "time-valley": "density valley below the idle-time mode",
                        "break": "natural break"}[chosen["source"]],
                below_ns=chosen["below_ns"], above_ns=chosen["above_ns"], n_above=chosen["n_above"],
                count_cv=chosen["count_cv"],
                confident=chosen["count_cv"] is None or chosen["count_cv"] <= IRREGULAR_CV)
    for key in ("lower_mode_ns", "upper_mode_ns", "valley_depth"):
        if key in chosen:
            info[key] = chosen[key]
    return float(chosen["threshold_ns"]), info


def _valley_figures(info: dict) -> dict:
    return {k: info[k] for k in ("lower_mode_ns", "upper_mode_ns", "valley_depth") if k in info}


def _round_candidate(c: dict) -> dict:
    return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in c.items()}


def _pick_candidate(cands: list[dict]) -> dict | None:
    """The most regular candidate; the finest of those about as regular (REGULARITY_FACTOR,
    REGULARITY_SLACK)."""
    if not cands:
        return None
    judged = [c for c in cands if c["count_cv"] is not None]
    valleys = [c for c in cands if c["source"] != "break"]
    if not judged:
        return valleys[0] if valleys else None
    best = min(c["count_cv"] for c in judged)
    near = [c for c in judged if c["count_cv"] <= best * REGULARITY_FACTOR + REGULARITY_SLACK]
    pick = _finest_structure(near)
    if pick["source"] == "break" and pick["count_cv"] > IRREGULAR_CV:
        # only the tail's breaks, and they cut batches of random size: a valley if there is
        # one (density evidence), else no structure
        return valleys[0] if valleys else None
    return pick


def _finest_structure(near: list[dict]) -> dict:
    """Of candidates about as regular, the finest structure: from the coarsest, a finer one is
    taken when it cuts at least FINER_FACTOR times the batches.  Batches inside sessions (the
    idle pauses between them) multiply the count; a threshold that also cuts at a few in-batch
    stalls left in the gaps adds a batch per stall, which is not finer structure.  A lower
    threshold with as many separators cuts the same batches (its separators include the
    higher one's): the lowest of those is named, as when the lowest of all was taken."""
    pick = None
    for c in sorted(near, key=lambda c: -c["threshold_ns"]):
        if (pick is None or c["n_above"] == pick["n_above"]
                or c["n_above"] + 1 >= FINER_FACTOR * (pick["n_above"] + 1)):
            pick = c
    return pick


@dataclass
class _TallGaps:
    """The gaps at or above MIN_SPLIT_GAP_NS (the only ones a threshold can split at), with
    their positions in call order: every candidate is judged on these alone."""

    pos: np.ndarray  # index into the gap array (gap i precedes call i + 1)
    val: np.ndarray  # gap, ns (float64)
    n_gaps: int
    below_floor_max: float

    @classmethod
    def of(cls, gaps_ns: np.ndarray, below_floor_max: float) -> "_TallGaps":
        pos = np.flatnonzero(gaps_ns >= MIN_SPLIT_GAP_NS)
        return cls(pos=pos, val=gaps_ns[pos].astype(np.float64), n_gaps=len(gaps_ns),
                   below_floor_max=below_floor_max)

    def separators(self, thr: float) -> int:
        return int((self.val > thr).sum())

    def max_at_or_below(self, thr: float) -> float:
        v = self.val[self.val <= thr]
        return max(self.below_floor_max, float(v.max()) if len(v) else 1.0)

    def natural_breaks(self) -> list[float]:
        """Thresholds at the MAX_BREAKS widest breaks (ratio >= BREAK_RATIO) of the sorted tail;
        a break with fewer than MIN_SEPARATORS gaps above it must be BIG_BREAK_RATIO wide."""
        v = np.unique(np.r_[self.val, self.below_floor_max])
        if len(v) < 2:
            return []
        ratio = v[1:] / np.maximum(v[:-1], 1.0)
        n_above = len(self.val) - np.searchsorted(np.sort(self.val), v[1:], side="left")
        ok = (ratio >= BREAK_RATIO) & ((n_above >= MIN_SEPARATORS) | (ratio >= BIG_BREAK_RATIO))
        idx = np.flatnonzero(ok)
        idx = idx[np.argsort(-ratio[idx], kind="stable")][:MAX_BREAKS]
        return [max(float(math.sqrt(v[i] * v[i + 1])), float(MIN_SPLIT_GAP_NS)) for i in idx]

    def judge(self, thr: float) -> dict:
        """Figures of the batches a threshold cuts: separators, the break around it, and the
        coefficient of variation of the interior batches' call counts (None: too few batches to judge)."""
        sep = self.pos[self.val > thr]
        above = self.val[self.val > thr]
        bounds = np.r_[0, sep + 1, self.n_gaps + 1]
        sizes = np.diff(bounds)
        interior = sizes[1:-1] if len(sizes) >= 5 else sizes
        cv = None
        if len(interior) >= MIN_JUDGED_BATCHES:
            mean = float(interior.mean())
            cv = float(interior.std() / mean) if mean > 0 else None
        below = self.max_at_or_below(thr)
        return {"n_above": int(len(sep)), "below_ns": below,
                "above_ns": float(above.min()) if len(above) else None,
                "count_cv": cv}


def _valley(tall: "_TallGaps", counts: np.ndarray, sm: np.ndarray, up: int, info: dict) -> tuple[float | None, dict]:
    """The density-valley threshold below upper-mode bin ``up`` (see :func:`choose_gap_threshold`).

    The lower mode L is the fullest bin below ``up`` (the 1 ns overlap bin only when no positive
    gap is below it); the valley is the emptiest smoothed bin between L and ``up`` (ties: the
    middle of the longest run of them) and must hold at most VALLEY_FRACTION of the smaller
    mode.  The threshold is the valley's centre, raised to MIN_SPLIT_GAP_NS, and raised again
    to EDGE_MARGIN of the upper mode's lower edge (in-batch stalls scatter past the valley).
    """
    low_region = sm[1:up] if counts[1:up].sum() > 0 else sm[:up]
    if len(low_region) == 0:
        info["method"] = "no lower population"
        return None, info
    lo = (1 if counts[1:up].sum() > 0 else 0) + int(np.argmax(low_region))
    if up - lo < 2:
        info["method"] = "no valley between the modes"
        return None, info
    between = sm[lo + 1:up]
    vmin = int(between.min())
    depth = vmin / max(1, min(int(sm[lo]), int(sm[up])))
    info.update(lower_mode_ns=float(10 ** ((lo + 0.5) * BIN_DECADES)), upper_mode_ns=float(10 ** ((up + 0.5) * BIN_DECADES)),
                valley_depth=float(depth))
    if depth > VALLEY_FRACTION:
        info["method"] = "no bimodality"
        return None, info
    is_min = np.r_[False, between == vmin, False]
    edges = np.flatnonzero(np.diff(is_min.astype(np.int8)))
    starts, stops = edges[0::2], edges[1::2]
    k = int(np.argmax(stops - starts))
    centre_bin = lo + 1 + (starts[k] + stops[k]) / 2.0  # in bins, fractional
    thr = max(10 ** (centre_bin * BIN_DECADES), float(MIN_SPLIT_GAP_NS))
    edge = up
    while edge - 1 > lo and sm[edge - 1] >= EDGE_FRACTION * sm[up]:
        edge -= 1
    thr = max(thr, EDGE_MARGIN * 10 ** (edge * BIN_DECADES))
    if tall.separators(thr) == 0:
        info["method"] = "no gap above the valley"
        return None, info
    info["method"] = "density valley"
    return float(thr), info


@dataclass
class RunnableSpans:
    """Merged intervals (ns, sorted, disjoint) in which at least one of the target's threads was
    runnable but not running: switched out by preemption, waiting for a CPU (the ``offcpu``
    spans with ``preempted``).  Time in them is not idle time of the reader."""

    start: np.ndarray
    end: np.ndarray
    spans: int  # preempted spans merged into these intervals

    @classmethod
    def of(cls, offcpu: pd.DataFrame | None, tids: np.ndarray | None = None) -> "RunnableSpans | None":
        """From a trace's ``offcpu`` table (None when it has none); ``tids``: only these threads."""
        if offcpu is None or not len(offcpu) or "preempted" not in offcpu.columns:
            return None
        pre = offcpu["preempted"].to_numpy().astype(bool)
        if tids is not None and "tid" in offcpu.columns:
            pre &= np.isin(offcpu["tid"].to_numpy(), tids)
        s = offcpu["start_ns"].to_numpy(np.int64)[pre]
        e = offcpu["end_ns"].to_numpy(np.int64)[pre]
        o = np.argsort(s, kind="stable")
        s, e = s[o], e[o]
        if not len(s):
            return cls(start=s, end=e, spans=0)
        reach = np.maximum.accumulate(e)
        first = np.r_[True, s[1:] > reach[:-1]]
        starts = s[first]
        ends = np.maximum.reduceat(e, np.flatnonzero(first))
        return cls(start=starts, end=ends, spans=int(len(s)))

    def covered(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Length (ns) of [a, b) covered by the intervals, element-wise (0 where b <= a)."""
        before = np.r_[0, np.cumsum(self.end - self.start)]

        def upto(x):  # runnable time before x
            k = np.searchsorted(self.start, x, side="right") - 1
            kc = np.clip(k, 0, None)
            part = np.clip(x - self.start[kc], 0, (self.end - self.start)[kc]) if len(self.start) else 0
            return np.where(k >= 0, before[kc] + part, 0)

        return np.clip(upto(b) - upto(a), 0, None)


def idle_gaps(ts: np.ndarray, gaps: np.ndarray, runnable: "RunnableSpans | None") -> tuple[np.ndarray, int]:
    """Union gaps less the time a target thread waited for a CPU inside them (in place); only gaps
    that could split (>= MIN_SPLIT_GAP_NS) are examined.  On a busy host the pool's in-batch
    stalls are mostly preempted workers, while a forward pass is every thread asleep: this keeps
    the first from looking like the second.  Returns the gaps and how many were shortened."""
    if runnable is None or not len(runnable.start) or not len(gaps):
        return gaps, 0
    pos = np.flatnonzero(gaps >= MIN_SPLIT_GAP_NS)
    b = ts[1:][pos]
    busy = runnable.covered(b - gaps[pos], b)
    gaps[pos] -= busy.astype(gaps.dtype)
    return gaps, int(np.count_nonzero(busy))


def infer(ts: np.ndarray, end: np.ndarray, gap_ms: float | None = None,
          runnable: "RunnableSpans | None" = None) -> Batches:
    """Segment calls (sorted by ``ts``; ``end`` = ts + dur) into batches at long union gaps.

    ``runnable``: when the trace has the threads' off-CPU spans, an inferred threshold is chosen
    and applied on idle gaps (:func:`idle_gaps`); ``--gap-ms`` applies to the plain gaps."""
    n = len(ts)
    gaps = union_gaps(ts, end)
    notes = [
        "batches inferred from gaps in the read stream: each starts at its first call, so "
        "scheduling before the first read (futures, pool wake-up) cannot be seen; pass --markers to see it"
    ]
    if gap_ms is not None:
        thr: float | None = float(gap_ms) * 1e6
        src = "user"
        info: dict = {"method": "--gap-ms"}
    else:
        gaps, shortened = idle_gaps(ts, gaps, runnable)
        thr, info = choose_gap_threshold(gaps)
        if runnable is not None:
            info["runnable_spans"] = runnable.spans
            info["gaps_shortened"] = shortened
            if shortened:
                notes.append(f"time the target's threads waited for a CPU inside a read-stream gap is not idle: "
                             f"taken out of {shortened:,} gaps before splitting (preempted off-CPU spans)")
        src = "inferred" if thr is not None else "none"
        if thr is not None and info.get("confident") is False:
            notes.append(
                f"the inferred batches are irregular (their call counts vary by {pct(info['count_cv'])} of the "
                "median): the gaps may not separate batches cleanly on this trace; pass --markers (or --gap-ms)"
            )
        if thr is None and n > 1:
            notes.append(
                "no clear gap between batches in the read stream (gaps are not bimodal): the whole "
                "trace is treated as one batch; pass --gap-ms or --markers"
            )
    new = gaps > thr if thr is not None else np.zeros(len(gaps), dtype=bool)
    del gaps
    if n:
        first = np.flatnonzero(np.r_[True, new])
        stop = np.r_[first[1:], n]
        start = ts[first]
        stop_ns = np.maximum.reduceat(end, first)
    else:
        first = stop = start = stop_ns = np.empty(0, np.int64)
    if n and src != "user" and len(first) and float(np.median(stop_ns - start)) > LONG_BATCH_NS:
        notes.append(
            f"the inferred batches last {np.median(stop_ns - start) / 1e9:.1f} s each (median): no decode or prefill "
            "step is that long, so the gaps in the read stream do not show the steps (a reader with no pause "
            "between them); pass --markers (the application's step boundaries)"
        )
    return Batches(first=first, stop=stop, start_ns=start, end_ns=stop_ns, n_calls=n, source="inferred",
                   gap_ns=thr, gap_source=src, notes=notes, info=info)


def iou(a_start, a_end, b_start, b_end) -> np.ndarray:
    """Intersection over union of intervals (vectorised)."""
    a_start, a_end, b_start, b_end = (np.asarray(x, dtype=np.float64) for x in (a_start, a_end, b_start, b_end))
    inter = np.clip(np.minimum(a_end, b_end) - np.maximum(a_start, b_start), 0, None)
    union = np.maximum(a_end, b_end) - np.minimum(a_start, b_start)
    return np.where(union > 0, inter / np.where(union > 0, union, 1), 0.0)


def match_iou(markers: pd.DataFrame, batches: Batches) -> np.ndarray:
    """For each marker, the best IoU with an inferred batch (the ones overlapping it)."""
    ms = markers["start_ns"].to_numpy(np.int64)
    me = markers["end_ns"].to_numpy(np.int64)
    bs, be = batches.start_ns, batches.end_ns
    # candidates: the batch starting at or before the marker's end, and the one before it/after
    j = np.searchsorted(bs, me, side="right") - 1
    best = np.zeros(len(ms))
    for shift in (-1, 0, 1):
        k = np.clip(j + shift, 0, len(bs) - 1)
        best = np.maximum(best, iou(ms, me, bs[k], be[k]))
    return best


def match_quality(ts: np.ndarray, end: np.ndarray, marked: Batches, inferred: Batches) -> dict:
    """How well inferred batches reproduce marker batches (calls sorted by ``ts``).

    ``span_iou``: per marker, the best IoU of an inferred batch with the marker span.  This is
    bounded by (read span / marker span): time before the first read and after the last is
    invisible to inference.  ``read_span_iou``: the same against the marker's read span (its
    first call's entry to its last call's exit).  ``exact``: per marker, whether its calls
    are exactly the calls of one inferred batch.
    """
    spans = pd.DataFrame({"start_ns": marked.start_ns, "end_ns": marked.end_ns})
    rs = ts[marked.first]
    re_ = np.maximum.reduceat(end, marked.first) if marked.n else np.empty(0, np.int64)
    reads = pd.DataFrame({"start_ns": rs, "end_ns": re_})
    cm, ci = marked.call_batch, inferred.call_batch
    ok = cm >= 0
    pairs = pd.DataFrame({"m": cm[ok], "i": ci[ok]}).drop_duplicates()
    one_i = pairs.groupby("m")["i"].nunique() == 1
    i_of_m = pairs.groupby("m")["i"].first()
    calls_i = np.bincount(ci[ci >= 0], minlength=inferred.n)
    calls_m = marked.counts
    exact = one_i & (calls_i[i_of_m.to_numpy()] == calls_m[i_of_m.index.to_numpy()])
    return {
        "span_iou": match_iou(spans, inferred),
        "read_span_iou": match_iou(reads, inferred),
        "exact": exact.reindex(range(marked.n), fill_value=False).to_numpy(),
        "span_bound": (re_ - rs) / np.maximum(marked.end_ns - marked.start_ns, 1),
    }
