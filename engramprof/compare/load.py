"""One bundle -> its per-batch table, with what compare needs beside batch-tail's split.

Each bundle is read with only the columns of the cause split (``load_bundle(columns=SPLIT_COLUMNS,
compact=True)``), cut into batches and split into causes by :func:`engramprof.analysis.analyse`
(batch-tail's own pipeline); its per-batch table is cut to :data:`KEPT_COLUMNS` and its events
are released before the next bundle is read: peak memory is one bundle's analysis plus a few
columns per batch of the others, whatever the number of ranks.  (Reading through
pyarrow.dataset or DuckDB instead was measured slower and larger: benchmarks/compare_speed.py
--arms, docs/commands/compare.md.)  Added per batch: ``step`` (the
markers' step id, when they carry one), ``read_path`` (the kind of its read events: syscall,
fault, mixed, none) and ``resident_frac`` (the share of its reads that inserted no page: rows
resident when the batch began; NaN without the ``pages_added`` column).
"""
from __future__ import annotations

import gc
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from engramprof.analysis import analyse
from engramprof.analysis import batches as _batches
from engramprof.analysis.events import code_faults
from engramprof.analysis.processes import _process_facts, markers_of, process_ids
from engramprof.compare.ranks import MS_COLS
from engramprof.errors import UserError
from engramprof.trace import EVENT_READ_COLUMNS, load_bundle
from engramprof.trace.reader import _read_meta

#: a bundle may carry its batch markers as this file
BUNDLE_MARKERS = "markers.jsonl"
#: the event columns compare reads: the analysis's (trace.EVENT_READ_COLUMNS) without ``tensor``
#: and ``row``, which only name each batch's slowest call (the cause split does not read them)
SPLIT_COLUMNS = [c for c in EVENT_READ_COLUMNS if c not in ("tensor", "row")]
#: the per-batch columns compare keeps of batch-tail's table (each bundle's is reduced to these
#: before the next is read: the rest -- the slowest call's path, tensor, ... -- are not compared)
KEPT_COLUMNS = ["start_ns", "end_ns", "wall_ms", "calls", "calls_with_misses", "rows", "read_path", "resident_frac",
                "step", "pid", *MS_COLS]
_RANK_RE = re.compile(r"(?:^|[/_\-.=])rank[=_\-]?(\d+)(?:$|[/_\-.])")


@dataclass
class BundleBatches:
    trace: str
    meta: dict
    batches: pd.DataFrame
    summary: dict
    markers: str | None
    has_steps: bool
    notes: list[str] = field(default_factory=list)
    pid: int | None = None       # the process of these batches (a bundle of several is split by pid)
    rank: int | None = None      # its rank, when the bundle's process list or its markers say it

    @property
    def format_version(self) -> int:
        return int(self.meta.get("format_version", 1) or 1)

    @property
    def window_s(self) -> float:
        a, b = self.meta.get("start_ns"), self.meta.get("end_ns")
        if isinstance(a, int) and isinstance(b, int) and b > a:
            return (b - a) / 1e9
        if len(self.batches):
            return float(self.batches["end_ns"].max() - self.batches["start_ns"].min()) / 1e9
        return 0.0

    @property
    def lost_records(self) -> int:
        lost = self.summary.get("lost_records") or {}
        return int(lost.get("records") or 0)


def rank_label(path: str | Path, index: int) -> int:
    """``rank=K`` (or rank-K, rank_K, rankK) in the path gives K; else the position given."""
    m = None
    for m in _RANK_RE.finditer(str(path)):
        pass
    return int(m.group(1)) if m else index


def bundle_markers(trace: Path) -> Path | None:
    """The markers a bundle carries: TRACE/markers.jsonl."""
    p = Path(trace) / BUNDLE_MARKERS
    return p if Path(trace).is_dir() and p.is_file() else None


def read_meta(trace: str | Path) -> dict:
    """meta.json of a bundle with load_bundle's checks (no events read)."""
    p = Path(trace)
    if not p.exists():
        raise UserError(f"{p}: no such trace")
    if not p.is_dir():
        return {}
    return _read_meta(p)


#: a batch's read path is ``mixed`` when each kind holds at least this share of its events (a
#: syscall reader's stray fault on its own buffer does not make a memory-mapped batch)
MIXED_FROM = 0.1


def _read_paths(calls: pd.DataFrame, starts: np.ndarray, ends: np.ndarray, n_events: np.ndarray) -> np.ndarray:
    """Per batch, the kind of its read events: syscall, fault, io_uring, libaio, mixed (no kind
    holds more than 1 - MIXED_FROM of them) or none."""
    out = np.full(len(starts), "none", dtype=object)
    if not len(starts):
        return out
    code = code_faults(calls)  # faults on the process's own code are not table reads
    if code is not None and code.any():
        calls = calls[~code]
    codes, names = _kind_codes(calls)
    present = sorted({names[i] for i in _used(codes)})
    has = n_events > 0
    if len(present) <= 1:
        out[has] = present[0] if present else "none"
        return out
    ts = calls["ts_ns"].to_numpy(np.int64)
    best = np.zeros(len(starts))
    for k in present:  # a few kinds: one sorted search each
        kts = np.sort(ts[np.isin(codes, [i for i, v in enumerate(names) if v == k])])
        nk = np.searchsorted(kts, ends, side="right") - np.searchsorted(kts, starts, side="left")
        f = np.minimum(nk, n_events) / np.maximum(n_events, 1)
        out[has & (f > 1 - MIXED_FROM)] = k
        best = np.maximum(best, f)
    out[has & (best <= 1 - MIXED_FROM)] = "mixed"
    return out


def _kind_codes(calls: pd.DataFrame) -> tuple[np.ndarray, list[str]]:
    """Per event, a small code of its kind, and each code's name (``str`` of the value, as
    ``astype(str)`` names it: a missing kind is "nan"): the categorical's own codes, without
    a string per event."""
    kind = calls["kind"]
    if isinstance(kind.dtype, pd.CategoricalDtype):
        codes = np.asarray(kind.array.codes)
        names = [str(c) for c in kind.cat.categories] + ["nan"]
        return np.where(codes < 0, len(names) - 1, codes) if len(codes) and codes.min() < 0 else codes, names
    codes, uniques = pd.factorize(kind.astype(str).to_numpy())
    return codes, [str(u) for u in uniques]


def _used(codes: np.ndarray) -> np.ndarray:
    """The distinct codes (a column one value fills: that one)."""
    if not len(codes):
        return codes
    return codes[:1] if codes.strides[0] == 0 or codes.min() == codes.max() else np.unique(codes)


def read_markers(path: Path) -> tuple[pd.DataFrame, int]:
    """batch-tail's markers (start_ns, end_ns, tid; its checks and bad-line count) with the keys
    compare reads beside them, where the lines carry them: ``step`` (an integer step id),
    ``pid`` and ``rank`` (whose batch it is, in a bundle of several processes)."""
    raw, bad, _ = _batches.read_marker_records(path)  # one parse of the file for both frames
    df = _batches.markers_of_records(raw)  # the same lines, in the same order, as raw's
    for key in ("step", "pid", "rank"):
        if key in raw.columns and len(raw) == len(df):
            v = pd.to_numeric(raw[key], errors="coerce").reset_index(drop=True)
            if v.notna().any():
                df[key] = v.where(v == v.round())
    return df, bad


def _extras(table: pd.DataFrame, calls: pd.DataFrame, mdf: pd.DataFrame | None) -> tuple[pd.DataFrame, bool]:
    """The per-batch columns compare adds to batch-tail's table: read_path, resident_frac, rows,
    step (and whether any batch has a step id)."""
    table = table[[c for c in table.columns if c in KEPT_COLUMNS]].copy()  # only what is kept
    starts, ends = table["start_ns"].to_numpy(np.int64), table["end_ns"].to_numpy(np.int64)
    table["read_path"] = _read_paths(calls, starts, ends, table["calls"].to_numpy(np.int64))
    if "calls_with_misses" in table.columns:
        n = table["calls"].to_numpy(np.float64)
        with np.errstate(invalid="ignore", divide="ignore"):
            table["resident_frac"] = np.where(n > 0, 1.0 - table["calls_with_misses"] / np.maximum(n, 1), 1.0)
    else:
        table["resident_frac"] = np.nan
    if "rows" not in table.columns:
        table["rows"] = table["calls"]
    table = table.drop(columns=[c for c in ("step",) if c in table.columns])
    has_steps = False
    if mdf is not None and "step" in mdf.columns and mdf["step"].notna().any():
        steps = mdf.loc[mdf["step"].notna(), ["start_ns", "step"]].astype("int64").drop_duplicates("start_ns")
        table = table.merge(steps, on="start_ns", how="left")
        has_steps = bool(table["step"].notna().any())
    if "step" not in table.columns:
        table["step"] = np.nan
    table["read_path"] = table["read_path"].astype("category")
    # a deep copy: a column selection would share (and keep alive) the blocks of batch-tail's
    # whole table, every column of it, for as long as the compare runs
    return table[[c for c in KEPT_COLUMNS if c in table.columns]].copy(deep=True), has_steps


def _analysed(trace: Path, markers: str | Path | None, slow_ms: float):
    """(trace, batch-tail's table and summary, the markers with compare's keys, their path)."""
    mpath = Path(markers) if markers is not None else bundle_markers(trace)
    tr = load_bundle(trace, columns=SPLIT_COLUMNS, compact=True)
    mdf, bad = read_markers(mpath) if mpath is not None else (None, 0)
    if mdf is not None:
        mdf = _pid_from_tid(mdf, tr)
    try:
        table, summary = analyse(tr, mdf, slow_ms=slow_ms, markers_bad_lines=bad, top=1)
    except UserError as exc:
        raise UserError(f"{trace}: {exc}") from None
    return tr, table, summary, mdf, mpath


#: the note of markers whose pid was found from their thread
MARKERS_BY_TID = "markers name no process"


def _pid_from_tid(mdf: pd.DataFrame, tr) -> pd.DataFrame:
    """In a bundle of several processes, markers naming neither ``pid`` nor ``rank`` would apply to
    every process; each line's ``tid`` (the submitting thread, which engramprof.markers writes)
    says whose batch it is: its pid is that thread's, from the events and the threads samples.
    Lines whose thread was never seen are left out, with a note."""
    if {"pid", "rank"} & set(mdf.columns) or "tid" not in mdf.columns or len(process_ids(tr.calls)) < 2:
        return mdf
    pairs = [tr.calls[["tid", "pid"]]]
    threads = tr.samples("threads")
    if threads is not None and {"tid", "pid"} <= set(threads.columns):
        pairs.append(threads[["tid", "pid"]])
    known = pd.concat(pairs, ignore_index=True).apply(pd.to_numeric, errors="coerce").dropna().drop_duplicates()
    known = known[~known["tid"].duplicated(keep=False)]  # a tid seen under two pids says nothing
    pid = mdf["tid"].map(pd.Series(known["pid"].to_numpy(), index=known["tid"].to_numpy()))
    if not pid.notna().any():
        tr.notes.append(f"{MARKERS_BY_TID} and none of their threads (tid) was seen: every marker applies to every "
                        "process")
        return mdf
    out = mdf.assign(pid=pid)
    missing = int(pid.isna().sum())
    tr.notes.append(f"{MARKERS_BY_TID}: each line's pid is its thread's (tid)" +
                    (f"; {missing:,} line(s) whose thread was never seen are left out" if missing else ""))
    return out


_SUMMARY_KEYS = ("batches", "batch_source", "lost_records", "read_events", "share", "verdict")


def _release(tr) -> None:
    """Free a bundle's events before the next bundle is read."""
    import pyarrow as pa

    del tr
    gc.collect()
    pa.default_memory_pool().release_unused()


def load(trace: str | Path, markers: str | Path | None = None, *, slow_ms: float = 4.0) -> BundleBatches:
    """Analyse one bundle (batch-tail's split) and keep only its per-batch table."""
    trace = Path(trace)
    tr, table, summary, mdf, mpath = _analysed(trace, markers, slow_ms)
    table, has_steps = _extras(table, tr.calls, mdf)
    meta, notes = dict(tr.meta), list(tr.notes) + list(summary.get("notes", []))
    _release(tr)
    return BundleBatches(trace=str(trace), meta=meta, batches=table, summary={k: summary.get(k) for k in _SUMMARY_KEYS},
                         markers=str(mpath) if mpath is not None else None, has_steps=has_steps, notes=notes,
                         pid=_single_pid(summary, meta))


def _single_pid(summary: dict, meta: dict) -> int | None:
    procs = summary.get("processes") or []
    if len(procs) == 1:
        return int(procs[0]["pid"])
    return meta.get("pid") if isinstance(meta.get("pid"), int) else None


def _pid_rank(meta: dict, mdf: pd.DataFrame | None, pid: int) -> int | None:
    """A process's rank: from the bundle's process list, else from its markers (lines with both
    ``pid`` and ``rank``)."""
    rank = _process_facts(meta, pid)[2]
    if isinstance(rank, int):
        return rank
    if mdf is not None and {"pid", "rank"} <= set(mdf.columns):
        r = mdf.loc[mdf["pid"] == pid, "rank"].dropna().unique()
        if len(r) == 1:
            return int(r[0])
    return None


def load_ranks(trace: str | Path, markers: str | Path | None = None, *, slow_ms: float = 4.0) -> list[BundleBatches]:
    """``compare --ranks``: one BundleBatches per process of a bundle.  A bundle of one process is
    one rank (:func:`load`); a bundle of several (``--pid A --pid B``, ``--children``) is
    analysed as batch-tail analyses it -- each process on its own, with its own markers (lines
    whose ``pid`` or ``rank`` is its own; lines naming neither apply to every process) -- and
    split by pid into ranks."""
    trace = Path(trace)
    tr, table, summary, mdf, mpath = _analysed(trace, markers, slow_ms)
    procs = summary.get("processes") or []
    meta, notes = dict(tr.meta), list(tr.notes)
    if "pid" not in table.columns or len(procs) < 2:
        table, has_steps = _extras(table, tr.calls, mdf)
        out = [BundleBatches(trace=str(trace), meta=meta, batches=table,
                             summary={k: summary.get(k) for k in _SUMMARY_KEYS},
                             markers=str(mpath) if mpath is not None else None, has_steps=has_steps,
                             notes=notes + list(summary.get("notes", [])), pid=_single_pid(summary, meta))]
        _release(tr)
        return out
    pid_col = pd.to_numeric(tr.calls["pid"], errors="coerce").to_numpy(np.float64)
    out = []
    for row in procs:
        pid = int(row["pid"])
        rank = _pid_rank(meta, mdf, pid)
        mine = table[table["pid"] == pid].drop(columns=["pid"]).reset_index(drop=True)
        calls = tr.calls.loc[pid_col == pid, ["ts_ns", "kind"]]
        t, has_steps = _extras(mine, calls, markers_of(mdf, pid, rank))
        s = {k: row.get(k) for k in ("batches", "share", "verdict")}
        s.update(batch_source=summary.get("batch_source"), lost_records=summary.get("lost_records"),
                 read_events=None)
        out.append(BundleBatches(trace=str(trace), meta=meta, batches=t, summary=s,
                                 markers=str(mpath) if mpath is not None else None, has_steps=has_steps,
                                 notes=notes, pid=pid, rank=rank))
    left_out = [n for n in summary.get("notes", []) if n.startswith("left out: pid ")]
    if out:
        out[0].notes = notes + left_out
    _release(tr)
    return out


def check_same_format(metas: list[tuple[str, dict]]) -> None:
    """Bundles of different trace format versions are not compared (one line, exit 2)."""
    versions = {}
    for trace, meta in metas:
        versions.setdefault(int(meta.get("format_version", 1) or 1), trace)
    if len(versions) > 1:
        parts = ", ".join(f"{t} is format {v}" for v, t in sorted(versions.items()))
        raise UserError(f"bundles of different trace format versions ({parts}): record them with the same "
                        "engramprof to compare them")


def pair_markers(traces: list[Path], markers: list[Path] | None) -> list[Path | None]:
    """``--markers`` given once per TRACE, in order; or not at all (bundles may carry theirs)."""
    if not markers:
        return [None] * len(traces)
    if len(markers) != len(traces):
        raise UserError(f"--markers is given {len(markers)} time(s) for {len(traces)} trace(s): give one per TRACE, "
                        "in the same order, or none")
    return list(markers)
