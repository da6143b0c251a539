"""Stage 1: the read events, in entry-time order, and the chunks they are analysed in.

A read event is one syscall read (``kind`` = ``syscall``) or, later, one page fault: entry
time ``ts_ns``, duration ``dur_ns``, thread, file, offset, size and the evidence columns
(engramprof.trace.EVIDENCE_COLUMNS).  The stages after this one never ask which kind an
event is; they see the columns.  Nothing here copies the table: columns are read a chunk at a
time through the entry-time order.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator

import numpy as np
import pandas as pd

from engramprof.errors import UserError
from engramprof.host import files as host_files
from engramprof.trace import CONTRACT_COLUMNS, EVIDENCE_COLUMNS

#: read events that are requests submitted to the kernel and completed later (their interval is
#: submit -> complete, their evidence columns are null): io_uring SQEs and libaio iocbs
REQUEST_KINDS = ("io_uring", "libaio")
#: events handled at a time (whole batches per chunk): bounds memory, keeps arrays cache-sized
CHUNK_CALLS = 1 << 18
REQUIRED_COLUMNS = ("ts_ns", "dur_ns", "tid")
#: the contract columns the analysis reads (``size`` is not one: it is not read for it)
USED_CONTRACT_COLUMNS = ("ts_ns", "dur_ns", "pid", "tid", "path", "offset", "ret", "flags")


def _is_plain_int(dtype) -> bool:
    """A NumPy integer or bool dtype (no missing values; not a pandas nullable one)."""
    return isinstance(dtype, np.dtype) and dtype.kind in "iub"


class EventColumns:
    """Per-event columns in entry-time order, read a slice at a time (no DataFrame copy).

    ``order`` maps positions in that order to DataFrame rows (None when the DataFrame is
    already sorted and every row is usable)."""

    def __init__(self, calls: pd.DataFrame, order: np.ndarray | None):
        self.calls = calls
        self.order = order
        self._has: dict[str, bool] = {}
        self._codes: dict[str, tuple[np.ndarray, pd.Index]] = {}
        self._arrays: dict[str, np.ndarray] = {}
        #: columns the load left on disk (trace.LaterColumn by name): read at a few rows
        self.later: dict = {}

    def has(self, name: str) -> bool:
        """The column exists and holds at least one value (a recorder writes an evidence
        column all-null when the kernel could not measure it)."""
        if name not in self._has:
            if name not in self.calls.columns:
                self._has[name] = name in self.later and self.later[name].has_values and len(self.calls) > 0
            elif name in ("path", "tensor"):
                codes, uniques = self.codes(name)
                self._has[name] = bool(len(uniques)) and bool((codes >= 0).any())
            elif _is_plain_int(self.calls[name].dtype):  # no missing value possible
                self._has[name] = len(self.calls) > 0
            else:
                self._has[name] = bool(self.calls[name].notna().any())
        return self._has[name]

    def codes(self, name: str) -> tuple[np.ndarray, pd.Index]:
        """Small-integer codes of a text column, in table row order, and their values (a
        categorical's own codes; else one factorisation).  -1: missing."""
        if name not in self._codes:
            s = self.calls[name]
            if isinstance(s.dtype, pd.CategoricalDtype):  # its own codes (int8/16/32; read-only)
                codes, uniques = np.asarray(s.array.codes), pd.Index(s.cat.categories)  # .cat.codes copies
            else:
                c, u = pd.factorize(s, use_na_sentinel=True)
                codes, uniques = c.astype(np.int32), pd.Index(u)
            self._codes[name] = (codes, uniques)
        return self._codes[name]

    def text_is_categorical(self, name: str) -> bool:
        return name in ("path", "tensor") or not pd.api.types.is_numeric_dtype(self.calls[name].dtype)

    def series(self, name: str, lo: int, hi: int) -> pd.Series:
        s = self.calls[name]
        return s.iloc[lo:hi] if self.order is None else s.take(self.order[lo:hi])

    def array(self, name: str) -> np.ndarray:
        """The whole column as one NumPy array in table row order: the DataFrame's own memory
        for a plain integer, bool or float column (no copy); else float64 with NaN where a
        value is missing or not a number, converted once."""
        if name not in self._arrays:
            s = self.calls[name]
            if _is_plain_int(s.dtype) or s.dtype == np.float64 or s.dtype == np.float32:
                a = s.to_numpy()
            else:
                if not pd.api.types.is_numeric_dtype(s.dtype):
                    s = pd.to_numeric(s, errors="coerce")
                a = s.to_numpy(dtype=np.float64, na_value=np.nan)
            self._arrays[name] = a
        return self._arrays[name]

    def raw(self, name: str, lo: int, hi: int) -> np.ndarray:
        """Values of positions lo:hi as stored (see :meth:`array`; a view when in order)."""
        a = self.array(name)
        return a[lo:hi] if self.order is None else a[self.order[lo:hi]]

    def num(self, name: str, lo: int, hi: int) -> np.ndarray | None:
        """float64 values of positions lo:hi (NaN where missing); None: no such column.
        May be a view of the table's memory: do not write to it."""
        if name not in self.calls.columns:
            return None
        return self.raw(name, lo, hi).astype(np.float64, copy=False)

    def ints(self, name: str, lo: int, hi: int) -> np.ndarray:
        """int64 values of positions lo:hi of an integer column without nulls (tid, pid)."""
        s = self.series(name, lo, hi)
        return s.to_numpy().astype(np.int64, copy=False)

    def rows(self, pos: np.ndarray) -> np.ndarray:
        """Table rows of entry-order positions."""
        return pos if self.order is None else self.order[pos]

    def in_order(self, values: np.ndarray) -> np.ndarray:
        """A per-row array (table order) re-read in entry-time order."""
        return values if self.order is None else values[self.order]


def misses_known(cols: EventColumns) -> bool:
    """Whether the trace can tell a read that missed: pages inserted, bios queued, the O_DIRECT
    flag, or the path an io_uring request took."""
    return any(cols.has(c) for c in ("pages_added", "bio_count", "direct", "uring_path"))


@dataclass
class ReadEvents:
    """The usable events in entry-time order: ``ts`` (int64 ns), ``dur`` (signed integer ns:
    int32 from a compact load) and their columns."""

    ts: np.ndarray
    dur: np.ndarray
    cols: EventColumns
    n_total: int  # rows in the table, usable or not
    notes: list[str] = field(default_factory=list)
    _end: np.ndarray | None = field(default=None, repr=False)

    _end_max: int | None = field(default=None, repr=False)
    #: the durations' p50 / p99 in ms (calibrate.ms_pair), where it was computed beside the
    #: pipeline (a Future); None: the summary computes it
    call_ms: object = field(default=None, repr=False)

    @property
    def end(self) -> np.ndarray:
        """Exit times (ts + dur), computed once (again after :meth:`drop_end`)."""
        if self._end is None:
            self._end = self.ts + self.dur
        return self._end

    @property
    def end_max(self) -> int:
        """The latest exit time (events must exist), kept after :meth:`drop_end`."""
        if self._end_max is None:
            self._end_max = int(self.end.max())
        return self._end_max

    def drop_end(self) -> None:
        """Free the exit times (8 bytes an event) once the batches are cut: the attribution
        computes its own per chunk; :attr:`end_max` stays known."""
        if self._end is not None and len(self._end):
            _ = self.end_max
        self._end = None

    @property
    def missing_evidence(self) -> list[str]:
        """Evidence columns with no value.  A trace of requests alone (io_uring SQEs, libaio
        iocbs: their probes do not measure these columns, the path they took stands for them)
        misses none: nothing was lost, nothing could be measured."""
        if self.requests_only:
            return []
        return [c for c in EVIDENCE_COLUMNS if not self.cols.has(c)]

    @property
    def requests_only(self) -> bool:
        """Every read event is a request (kind io_uring or libaio)."""
        calls = self.cols.calls
        if "kind" not in calls.columns or not len(calls):
            return False
        kind = calls["kind"]
        if isinstance(kind.dtype, pd.CategoricalDtype):  # the kinds its codes use (a constant: one)
            codes = np.asarray(kind.array.codes)  # the categorical's own (a .cat.codes Series is a copy)
            used = codes[:1] if codes.strides[0] == 0 or codes.min() == codes.max() else np.unique(codes)
            if (used < 0).any():
                return False
            kinds = {str(kind.cat.categories[i]) for i in used}
            return bool(kinds) and kinds <= set(REQUEST_KINDS)
        kinds = {str(k) for k in pd.unique(kind.dropna())} if len(calls) else set()
        return bool(kinds) and kinds <= set(REQUEST_KINDS) and bool(kind.notna().all())


def _exact_int(calls: pd.DataFrame, name: str, as_stored: bool = False) -> tuple[np.ndarray, np.ndarray | None]:
    """int64 values of an integer-valued column, and where they are missing (None: nowhere).
    ``as_stored``: a NumPy signed-integer column is returned as it is (no copy)."""
    c = calls[name]
    if as_stored and isinstance(c.dtype, np.dtype) and c.dtype.kind == "i":
        return c.to_numpy(), None
    if pd.api.types.is_integer_dtype(c.dtype) and getattr(c.dtype, "na_value", None) is not pd.NA:
        return c.to_numpy(dtype=np.int64), None
    f = pd.to_numeric(c, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
    bad = ~np.isfinite(f)
    return np.where(bad, 0, f).astype(np.int64), bad


#: the process's own code and the runtime's files, by path (engramprof/host/files.py)
CODE_PATH = host_files.CODE_PATH


def code_faults(calls: pd.DataFrame) -> np.ndarray | None:
    """Per row, a page fault on the process's own code: an executable or a shared library, by
    the recorder's flag (``on_code``: it maps the file executable; format 6) or by its path
    (CODE_PATH: older bundles) (None: no fault events)."""
    if "kind" not in calls.columns or "path" not in calls.columns or not len(calls):
        return None
    kind = calls["kind"]
    if isinstance(kind.dtype, pd.CategoricalDtype) and "fault" not in kind.cat.categories:
        return None
    is_fault = (kind == "fault").to_numpy(dtype=bool, na_value=False)
    if not is_fault.any():
        return None
    path = calls["path"]
    if isinstance(path.dtype, pd.CategoricalDtype):
        cats = np.array([bool(CODE_PATH.search(str(c))) for c in path.cat.categories] + [False])
        code_path = cats[path.cat.codes.to_numpy()]  # -1 (missing) -> the trailing False
    else:
        uniq, inverse = np.unique(path.astype(str).to_numpy(), return_inverse=True)
        code_path = np.array([bool(CODE_PATH.search(u)) for u in uniq], dtype=bool)[inverse]
    if "on_code" in calls.columns:
        code_path = code_path | calls["on_code"].to_numpy(dtype=bool, na_value=False)
    return is_fault & code_path


def prepare_read_events(calls: pd.DataFrame, notes: list[str], allow_none: bool = False) -> ReadEvents:
    """Check the table, leave out events without a usable entry time / duration (noted),
    and order the rest by entry time (a view when the table is already clean and sorted).
    Raises :class:`UserError` when nothing can be analysed (``allow_none``: an empty table is
    fine: marked batches of a memory-mapped reader may hold no read event)."""
    lacking = [c for c in REQUIRED_COLUMNS if c not in calls.columns]
    if lacking:
        raise UserError(f"per-call table lacks required columns: {', '.join(lacking)}")
    absent = [c for c in CONTRACT_COLUMNS if c in USED_CONTRACT_COLUMNS and c not in calls.columns]
    if absent:
        notes.append(f"per-call table lacks {', '.join(absent)}: related figures are not shown")
    n_total = len(calls)
    if n_total == 0 and allow_none:
        empty = np.empty(0, dtype=np.int64)
        return ReadEvents(ts=empty, dur=empty, cols=EventColumns(calls, None), n_total=0, notes=notes)
    if n_total == 0:
        raise UserError("the trace has no calls: nothing to analyse (was the target reading while traced?)")
    ts, ts_bad = _exact_int(calls, "ts_ns")
    dur, dur_bad = _exact_int(calls, "dur_ns", as_stored=True)  # int32 in a compact load
    good = dur >= 0
    for bad in (ts_bad, dur_bad):
        if bad is not None:
            good &= ~bad
    order = None
    if not good.all():
        notes.append(f"{int((~good).sum())} call(s) with a missing or negative ts_ns/dur_ns were left out")
    code = code_faults(calls)
    if code is not None and code.any():
        notes.append(f"{int(code.sum()):,} page fault(s) on the process's own code (executables and shared "
                     "libraries) are not table reads and were left out")
        good &= ~code
    if not good.all():
        order = np.flatnonzero(good)
        if len(order) == 0 and allow_none:
            empty = np.empty(0, dtype=np.int64)
            return ReadEvents(ts=empty, dur=empty, cols=EventColumns(calls, order), n_total=n_total, notes=notes)
        if len(order) == 0:
            raise UserError("no read event left to analyse (no usable ts_ns/dur_ns, or only page faults on "
                            "the process's own code)")
        ts, dur = ts[order], dur[order]
    if len(ts) > 1 and not bool(np.all(ts[1:] >= ts[:-1])):
        o = np.argsort(ts, kind="stable")
        order = o if order is None else order[o]
        ts, dur = ts[o], dur[o]
    return ReadEvents(ts=ts, dur=dur, cols=EventColumns(calls, order), n_total=n_total, notes=notes)


@dataclass
class Chunk:
    """Whole batches ``first_batch:stop_batch`` whose events sit at positions ``lo:hi``.

    ``batch`` gives each kept event's batch, relative to ``first_batch``; ``keep`` (markers
    mode) marks the positions in ``lo:hi`` that belong to a batch (None: all of them)."""

    first_batch: int
    stop_batch: int
    lo: int
    hi: int
    batch: np.ndarray
    keep: np.ndarray | None
    _firsts: np.ndarray | None = field(default=None, repr=False)

    @property
    def n_batches(self) -> int:
        return self.stop_batch - self.first_batch

    @property
    def batches(self) -> slice:
        return slice(self.first_batch, self.stop_batch)

    def pick(self, a: np.ndarray) -> np.ndarray:
        """The kept events of a positions-lo:hi array."""
        return a if self.keep is None else a[self.keep]

    def positions(self) -> np.ndarray:
        """Entry-order positions of the kept events."""
        pos = np.arange(self.lo, self.hi)
        return pos if self.keep is None else pos[self.keep]

    @property
    def firsts(self) -> np.ndarray:
        """Index (into the kept events) of each batch's first event.  Every batch holds at
        least one event and ``batch`` never decreases (events in entry order, batches in time
        order), so batch sums are contiguous segment sums."""
        if self._firsts is None:
            b = self.batch
            self._firsts = np.flatnonzero(np.r_[True, b[1:] != b[:-1]])
        return self._firsts

    def per_batch(self, weights: np.ndarray | None = None) -> np.ndarray:
        """Per batch of the chunk, the count (or the sum of ``weights``) of its events, float64
        (np.add.reduceat over the contiguous segments: the sum in the same order as a
        bincount, ~9x faster)."""
        if weights is None:
            return np.diff(np.r_[self.firsts, len(self.batch)]).astype(np.float64)
        w = np.asarray(weights)
        if w.dtype == np.bool_:
            return self.flagged_per_batch(w).astype(np.float64)
        return np.add.reduceat(w.astype(np.float64, copy=False), self.firsts)

    def flagged_per_batch(self, flags: np.ndarray) -> np.ndarray:
        """Per batch of the chunk, how many of its events have ``flags`` set (int64): the
        flagged positions counted between the batches' first events (flags are sparse)."""
        hits = np.flatnonzero(flags)
        return np.diff(np.searchsorted(hits, np.r_[self.firsts, len(self.batch)]))

    def any_per_batch(self, flags: np.ndarray) -> np.ndarray:
        """Per batch of the chunk, whether any of its events has ``flags`` set."""
        return self.flagged_per_batch(flags) > 0


def chunk_plan(seg, chunk_calls: int | None = None) -> Iterator[Chunk]:
    """Chunks of whole batches, about ``chunk_calls`` events each (CHUNK_CALLS)."""
    size = CHUNK_CALLS if chunk_calls is None else chunk_calls
    nb = seg.n
    if nb == 0:
        return
    csum = np.cumsum(seg.counts)
    contiguous = bool(np.all(seg.first[1:] == seg.stop[:-1]))
    bl = 0
    while bl < nb:
        done = int(csum[bl - 1]) if bl else 0
        bh = min(nb, max(int(np.searchsorted(csum, done + size, side="right")), bl + 1))
        lo, hi = int(seg.first[bl]), int(seg.stop[bh - 1])
        if contiguous:
            yield Chunk(bl, bh, lo, hi, np.repeat(np.arange(bh - bl), seg.counts[bl:bh]), None)
        else:  # markers mode: events outside every marker sit between batches
            pos = np.arange(lo, hi)
            k = np.searchsorted(seg.first[bl:bh], pos, side="right") - 1
            keep = pos < seg.stop[bl:bh][k]
            yield Chunk(bl, bh, lo, hi, k[keep], keep)
        bl = bh
