"""Every --window seconds: the batch analysis (engramprof.analysis, as batch-tail runs it) on
the window's sampled read records, folded into cumulative counters for /metrics.

The probes record each window's first ``budget`` read events of each program: syscall reads and
page faults alike (probes/export.bpf.c), io_uring requests (uring.bpf.c), libaio iocbs
(libaio.bpf.c); when a window has more, the analysis covers its start up to the last sampled
read of the first path whose budget ran out (``coverage``), and
inferred batches cut by that end are left out as at a recording's edge.  Markers (JSON lines
with start_ns / end_ns, CLOCK_MONOTONIC) are read incrementally from where the last window
stopped; a marked batch belongs to the window its end falls in.
"""
from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from engramprof.analysis import analyse
from engramprof.analysis.verdicts import CAUSES, VERDICTS, col
from engramprof.bpf import libaio as libaio_probe
from engramprof.bpf import uring as uring_probe
from engramprof.errors import UserError
from engramprof.host.interpreter import runs_cpython
from engramprof.record.decode import syscall_names

#: batch time histogram buckets, seconds (decode batches are ~0.1-100 ms)
BATCH_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_RECORD_COLUMNS = ("ts_ns", "dur_ns", "pid", "tid", "offset", "size", "ret", "flags", "pages_added", "bio_count",
                   "bio_ns", "reclaim_ns", "offcpu_ns", "runq_ns")


def _request_frame(recs: np.ndarray, kind: str, syscall: str, direct_bit: int, evidence: tuple[str, ...]) -> pd.DataFrame:
    """The per-event DataFrame of sampled requests of one path: the columns of
    :func:`records_frame`, those the probe does not measure per request unknown (NaN), and the
    request's O_DIRECT flag."""
    df = pd.DataFrame({c: recs[c].astype(np.int64) for c in _RECORD_COLUMNS[:8] + evidence if c in recs.dtype.names})
    for c in _RECORD_COLUMNS:
        if c not in df.columns:
            df[c] = np.nan
    df["syscall"] = syscall
    df["kind"] = kind
    df["direct"] = (recs[_FLAGS[kind]].astype(np.int64) & direct_bit) != 0
    return df


#: the record field holding a request path's flags
_FLAGS = {"io_uring": "uflags", "libaio": "aflags"}


def uring_records_frame(recs: np.ndarray) -> pd.DataFrame:
    """Sampled io_uring requests (``struct uring_record`` rows): off-CPU, run-queue and reclaim
    time unknown (not per request: many share one wait), the issuing thread's insertions and
    bios known; with the request's path (inline / async / punted)."""
    df = _request_frame(recs, "io_uring", "io_uring", uring_probe.header_defines("URING_")["DIRECT"],
                        ("pages_added", "bio_count", "bio_ns"))
    paths = np.asarray(uring_probe.PATHS, dtype=object)
    df["uring_path"] = paths[np.minimum(recs["path"].astype(np.int64), len(paths) - 1)]
    return df[list(_RECORD_COLUMNS) + ["syscall", "kind", "uring_path", "direct"]]


def libaio_records_frame(recs: np.ndarray, bio: bool = True) -> pd.DataFrame:
    """Sampled libaio read iocbs (``struct aio_record`` rows, engramprof.bpf.libaio): submit ->
    reap; their bios when the probe had the block tracepoints (``bio``), no page-cache insertion,
    off-CPU, run-queue or reclaim time per iocb."""
    df = _request_frame(recs, "libaio", libaio_probe.SYSCALL, libaio_probe.header_defines("AIO_")["DIRECT"],
                        ("bio_count", "bio_ns") if bio else ())
    return df[list(_RECORD_COLUMNS) + ["syscall", "kind", "direct"]]


def window_frame(recs: np.ndarray, requests: dict[str, np.ndarray] | None = None,
                 libaio_bio: bool = True) -> pd.DataFrame:
    """A window's sampled read events of every path, in time order (``requests``: the request
    paths' records by kind)."""
    df = records_frame(recs)
    frames = []
    for kind, r in (requests or {}).items():
        if r is None or not len(r):
            continue
        frames.append(uring_records_frame(r) if kind == "io_uring" else libaio_records_frame(r, libaio_bio))
    if not frames:
        return df
    both = pd.concat([df.astype({"syscall": object, "kind": object})] + frames, ignore_index=True)
    both["kind"] = both["kind"].astype("category")
    both["syscall"] = both["syscall"].astype("category")
    return both.sort_values("ts_ns", kind="stable").reset_index(drop=True)


def records_frame(recs: np.ndarray) -> pd.DataFrame:
    """The per-event DataFrame the analysis reads, from sampled ``struct call_record`` rows:
    syscall reads, and page faults (syscall code ``fault``: one page at ``offset``, major when
    the fault inserted pages into the page cache)."""
    df = pd.DataFrame({c: recs[c].astype(np.int64) for c in _RECORD_COLUMNS})
    names = syscall_names()
    df["syscall"] = pd.Categorical.from_codes(recs["syscall"].astype(np.int16), categories=names)
    fault = recs["syscall"] == names.index("fault")
    df["kind"] = pd.Categorical.from_codes(fault.astype(np.int8), categories=["syscall", "fault"])
    df["major"] = fault & (recs["pages_added"] > 0)
    return df


class MarkerTail:
    """New lines of a markers file since the last read (the file may appear later, or be
    replaced: a shorter file or a new inode is read from its start)."""

    def __init__(self, path: str | None):
        self.path = path
        self.pos = 0
        self.ino = None
        self.bad_lines = 0
        self._partial = b""

    def new_batches(self) -> list[tuple[int, int]]:
        if self.path is None:
            return []
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except OSError:
            return []
        try:
            st = os.fstat(fd)
            if st.st_ino != self.ino or st.st_size < self.pos:
                self.ino, self.pos, self._partial = st.st_ino, 0, b""
            os.lseek(fd, self.pos, os.SEEK_SET)
            data = b""
            while True:  # at most what is there now
                chunk = os.read(fd, 1 << 20)
                if not chunk:
                    break
                data += chunk
            self.pos += len(data)
        finally:
            os.close(fd)
        data = self._partial + data
        lines = data.split(b"\n")
        self._partial = lines.pop()  # an unfinished last line waits for the next window
        out = []
        for line in lines:
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
                s, e = obj["start_ns"], obj["end_ns"]
                if not (isinstance(s, int) and isinstance(e, int) and e >= s):
                    raise ValueError
                out.append((s, e))
            except (ValueError, KeyError, TypeError):
                self.bad_lines += 1
        return out


@dataclass
class WindowTotals:
    """What /metrics shows of the windows: cumulative since start, plus the last window's."""

    cause_seconds: dict[str, float] = field(default_factory=lambda: {c: 0.0 for c in CAUSES})
    batch_buckets: np.ndarray = field(default_factory=lambda: np.zeros(len(BATCH_BUCKETS), dtype=np.int64))
    batch_count: int = 0
    batch_sum: float = 0.0
    analyses: dict[str, int] = field(default_factory=lambda: {"ok": 0, "no-batches": 0, "error": 0})
    verdict: str | None = None
    coverage: float | None = None
    last_batches: int = 0
    marker_bad_lines: int = 0


class WindowAnalyser:
    def __init__(self, markers: str | None, slow_ms: float | None = None, read_paths: tuple[str, ...] = ("syscall",)):
        self.markers = MarkerTail(markers)
        self.read_paths = list(read_paths)  # what the probe traces: a marked batch without faults is a read
        self.libaio_bio = True  # the libaio probe times its iocbs' bios (the block tracepoints)
        self.pending_markers: list[tuple[int, int]] = []
        self.totals = WindowTotals()
        self.slow_ms = slow_ms
        self.last_error: str | None = None
        self.lock = contextlib.nullcontext()  # the exporter's lock: a scrape never sees half a window
        self.cpython_of: dict[int, tuple] = {}  # pid: runs_cpython(pid), read at its first window

    def _processes(self, frame: pd.DataFrame) -> list[dict]:
        """The window's processes, each with whether it runs CPython (read once a pid: its
        executable mappings, host/interpreter.runs_cpython): every thread of one that does not is
        native, so its waits are never python-scheduling (analysis/thread_kinds)."""
        out = []
        if "pid" not in frame.columns or not len(frame):
            return out
        for pid in np.unique(frame["pid"].to_numpy(np.int64)).tolist():
            if pid not in self.cpython_of:
                self.cpython_of[pid] = runs_cpython(pid)
            cpython, why = self.cpython_of[pid]
            out.append({"pid": pid, "cpython": cpython, "cpython_evidence": why})
        return out

    def _markers_for(self, start_ns: int, end_ns: int) -> pd.DataFrame | None:
        """Marked batches inside [start_ns, end_ns]; later ones wait for the next window, and
        ones that began before it (or were written after their window was analysed) are dropped."""
        if self.markers.path is None:
            return None
        self.pending_markers += self.markers.new_batches()
        self.totals.marker_bad_lines = self.markers.bad_lines
        mine = [m for m in self.pending_markers if m[1] <= end_ns and m[0] >= start_ns]
        self.pending_markers = [m for m in self.pending_markers if m[1] > end_ns]
        return pd.DataFrame(mine, columns=["start_ns", "end_ns"])

    def run(self, recs: np.ndarray, start_ns: int, end_ns: int, budget_spent: bool,
            requests: dict[str, np.ndarray] | None = None, requests_spent: dict[str, bool] | None = None) -> None:
        """Analyse one window's records (syscall reads and faults: ``recs``, their budget
        ``budget_spent``; the request paths' records by kind, ``requests``, and whether each
        one's budget was spent, ``requests_spent``); fold the result into the totals (never raises)."""
        t = self.totals
        requests = {k: r for k, r in (requests or {}).items() if r is not None}
        spent = requests_spent or {}
        covered_end = end_ns
        for r, was_spent in [(recs, budget_spent)] + [(r, spent.get(k, False)) for k, r in requests.items()]:
            if was_spent and len(r):  # a path's budget ran out: the window is covered to its last read
                covered_end = min(covered_end, int((r["ts_ns"] + r["dur_ns"]).max()))
        markers = self._markers_for(start_ns, covered_end)
        t.coverage = max(0.0, min(1.0, (covered_end - start_ns) / max(1, end_ns - start_ns)))
        # no read event and no marked batch: nothing to analyse.  Marked batches without a read
        # (a mapped reader whose pages are all mapped: it never faults) are analysed: healthy.
        n_events = len(recs) + sum(len(r) for r in requests.values())
        if (n_events == 0 and markers is None) or (markers is not None and markers.empty):
            t.analyses["no-batches"] += 1
            t.verdict, t.last_batches = None, 0
            return
        meta = {"start_ns": int(start_ns), "end_ns": int(covered_end), "read_paths": self.read_paths}
        kw = {} if self.slow_ms is None else {"slow_ms": self.slow_ms}
        try:
            frame = window_frame(recs, requests, self.libaio_bio)
            meta["processes"] = self._processes(frame)
            table, summary = analyse(frame, markers, meta=meta, **kw)
        except UserError as exc:
            t.analyses["no-batches"] += 1
            t.verdict, t.last_batches = None, 0
            self.last_error = str(exc)
            return
        except Exception as exc:  # a window the analysis cannot handle must not end the exporter
            t.analyses["error"] += 1
            t.verdict, t.last_batches = None, 0
            self.last_error = f"{type(exc).__name__}: {exc}"
            return
        with self.lock:
            self._fold(table, summary)

    def _fold(self, table: pd.DataFrame, summary: dict) -> None:
        t = self.totals
        t.analyses["ok"] += 1
        t.verdict = summary.get("verdict")
        t.last_batches = int(len(table))
        for c in CAUSES:
            name = f"ms_{col(c)}"
            if name in table.columns:
                t.cause_seconds[c] += float(np.nansum(table[name].to_numpy(dtype=np.float64))) / 1e3
        wall = table["wall_ms"].to_numpy(dtype=np.float64) / 1e3 if "wall_ms" in table.columns else np.empty(0)
        t.batch_count += int(len(wall))
        t.batch_sum += float(wall.sum())
        t.batch_buckets += np.array([(wall <= b).sum() for b in BATCH_BUCKETS], dtype=np.int64)


__all__ = ["BATCH_BUCKETS", "VERDICTS", "WindowAnalyser", "WindowTotals", "libaio_records_frame", "records_frame",
           "uring_records_frame", "window_frame"]
