"""The recorded trace: the one place that knows the on-disk format.

A TRACE is a directory (a "bundle"):

    TRACE/
      meta.json                 host, kernel, pid, command line, start/end, probe version,
                                lost-event counts, notes; rewritten atomically at the end
      calls/part-NNNNNN.parquet per-call records, one complete Parquet file per flushed batch
      samples/NAME/part-NNNNNN.parquet   time series from the samplers (psi, vmstat, threads...)
      tables/NAME.parquet       one-off tables (in-kernel latency histograms, fd map, ...)

Streaming as many small complete files (rather than one Parquet file with a footer written at
the end) is what makes an interrupted trace still loadable: everything flushed before the
interruption is a valid file.  ``pandas.read_parquet("TRACE/calls")`` reads the per-call table
directly; :func:`load` does the same with type checks.

Files are created inside a directory this process made itself (``mkdir`` fails on an existing
path, so a planted symlink is never followed) with ``O_EXCL | O_NOFOLLOW``.
"""
from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from engramprof.errors import UserError

FORMAT = "engramprof-trace"
FORMAT_VERSION = 1

# The per-call table.  The first nine columns are the DESIGN.md contract.
CALL_SCHEMA = pa.schema(
    [
        ("ts_ns", pa.int64()),  # call entry, CLOCK_MONOTONIC ns
        ("dur_ns", pa.int64()),  # entry -> exit
        ("pid", pa.int32()),
        ("tid", pa.int32()),
        ("path", pa.string()),  # fd -> path at the time of the call ("" when unknown)
        ("offset", pa.int64()),  # file offset (-1: current position, preadv2 only)
        ("size", pa.int64()),  # bytes requested (sum of iov_len)
        ("ret", pa.int64()),  # bytes read, or -errno
        ("flags", pa.int64()),  # RWF_* bits (0 for preadv / pread64)
        # evidence gathered in the kernel while the call was in flight on its thread
        ("syscall", pa.string()),  # preadv2 | preadv | pread64
        ("fd", pa.int32()),
        ("pages_added", pa.int32()),  # page-cache insertions on this thread during the call
        ("bio_count", pa.int32()),  # bios queued by this thread during the call
        ("bio_ns", pa.int64()),  # sum over those bios of queue -> complete
        ("reclaim_ns", pa.int64()),  # direct + memcg reclaim time inside the call
        ("offcpu_ns", pa.int64()),  # switched-out time inside the call (includes runq)
        ("runq_ns", pa.int64()),  # of which: runnable but waiting for a CPU
        ("path_stale", pa.bool_()),  # fd had been closed/reused when the path was resolved
        ("tensor", pa.string()),  # safetensors tensor the offset falls in ("" if none)
        ("row", pa.int64()),  # row of that tensor (-1 if none)
    ]
)
# On disk the string columns are dictionary-encoded (few distinct values, many rows);
# load() hands them back as plain strings.
DICT_COLUMNS = ("path", "syscall", "tensor")
WRITE_SCHEMA = pa.schema([
    pa.field(f.name, pa.dictionary(pa.int32(), pa.string())) if f.name in DICT_COLUMNS else f for f in CALL_SCHEMA
])
CONTRACT_COLUMNS = ["ts_ns", "dur_ns", "pid", "tid", "path", "offset", "size", "ret", "flags"]
EVIDENCE_COLUMNS = ["pages_added", "bio_count", "bio_ns", "reclaim_ns", "offcpu_ns", "runq_ns"]


def _open_excl(path: Path, mode: str = "wb"):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    return os.fdopen(fd, mode)


def _atomic_json(path: Path, obj: dict) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{time.monotonic_ns()}")
    with _open_excl(tmp, "w") as f:
        json.dump(obj, f, indent=2, default=str)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def empty_calls() -> pd.DataFrame:
    return CALL_SCHEMA.empty_table().to_pandas()


class TraceWriter:
    """Writes a bundle incrementally. Safe to call :meth:`close` from a signal path."""

    def __init__(self, path: str | os.PathLike, meta: dict | None = None):
        self.path = Path(path)
        try:
            os.mkdir(self.path, 0o755)
        except FileExistsError:
            raise UserError(f"{self.path} already exists; choose a new --output path") from None
        except OSError as exc:
            raise UserError(f"cannot create trace directory {self.path}: {exc.strerror}") from None
        for sub in ("calls", "samples", "tables"):
            os.mkdir(self.path / sub, 0o755)
        self.meta: dict[str, Any] = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "host": socket.gethostname(),
            "kernel": os.uname().release,
            "created_monotonic_ns": time.monotonic_ns(),
            "created_unix": time.time(),
            "complete": False,
            "calls_written": 0,
        }
        if meta:
            self.meta.update(meta)
        self._parts: dict[str, int] = {}
        self.closed = False
        _atomic_json(self.path / "meta.json", self.meta)

    def _next_part(self, key: str, directory: Path) -> Path:
        n = self._parts.get(key, 0)
        self._parts[key] = n + 1
        directory.mkdir(exist_ok=True)
        return directory / f"part-{n:06d}.parquet"

    def append_calls(self, table: pa.Table | pd.DataFrame) -> None:
        if isinstance(table, pd.DataFrame):
            table = pa.Table.from_pandas(table, schema=CALL_SCHEMA, preserve_index=False)
        table = table.select(CALL_SCHEMA.names).cast(WRITE_SCHEMA)
        if table.num_rows == 0:
            return
        self._write(table, self._next_part("calls", self.path / "calls"))
        self.meta["calls_written"] += table.num_rows

    def append_samples(self, name: str, df: pd.DataFrame | pa.Table) -> None:
        table = df if isinstance(df, pa.Table) else pa.Table.from_pandas(df, preserve_index=False)
        if table.num_rows == 0:
            return
        self._write(table, self._next_part(f"samples/{name}", self.path / "samples" / name))

    def write_table(self, name: str, df: pd.DataFrame | pa.Table) -> None:
        table = df if isinstance(df, pa.Table) else pa.Table.from_pandas(df, preserve_index=False)
        target = self.path / "tables" / f"{name}.parquet"
        tmp = target.with_name(f".{name}.{time.monotonic_ns()}.tmp")
        self._write(table, tmp)
        os.replace(tmp, target)

    @staticmethod
    def _write(table: pa.Table, path: Path) -> None:
        with _open_excl(path) as f:
            pq.write_table(table, f, compression="zstd")

    def update_meta(self, **kw: Any) -> None:
        self.meta.update(kw)

    def flush_meta(self) -> None:
        _atomic_json(self.path / "meta.json", self.meta)

    def close(self, **kw: Any) -> None:
        if self.closed:
            return
        self.meta.update(kw)
        self.meta["complete"] = True
        self.meta["closed_monotonic_ns"] = time.monotonic_ns()
        _atomic_json(self.path / "meta.json", self.meta)
        self.closed = True


@dataclass
class Trace:
    path: Path
    meta: dict
    calls: pd.DataFrame
    notes: list[str] = field(default_factory=list)

    def samples(self, name: str) -> pd.DataFrame | None:
        return _read_dir(self.path / "samples" / name)

    def table(self, name: str) -> pd.DataFrame | None:
        p = self.path / "tables" / f"{name}.parquet"
        if not p.is_file():
            return None
        try:
            return pq.read_table(p).to_pandas()
        except (pa.ArrowException, OSError) as exc:
            raise UserError(f"{p}: not a readable Parquet table ({exc})") from None

    @property
    def sample_names(self) -> list[str]:
        d = self.path / "samples"
        return sorted(p.name for p in d.iterdir() if p.is_dir()) if d.is_dir() else []

    @property
    def missing_evidence(self) -> list[str]:
        return [c for c in EVIDENCE_COLUMNS if c not in self.calls.columns]


def _read_dir(d: Path) -> pd.DataFrame | None:
    if not d.is_dir():
        return None
    parts = sorted(d.glob("part-*.parquet"))
    if not parts:
        return None
    tables = []
    for p in parts:
        try:
            tables.append(pq.read_table(p))
        except (pa.ArrowException, OSError) as exc:
            raise UserError(f"{p}: corrupt trace part ({exc})") from None
    table = pa.concat_tables(tables, promote_options="default")
    # one dictionary per string column instead of one per part: pandas then builds a single
    # categorical (fast), and load() turns it into plain strings by a take over the categories
    return table.unify_dictionaries().to_pandas()


def load_bundle(path: str | os.PathLike) -> Trace:
    """Read a bundle (or a bare Parquet/CSV per-call file) with clear errors."""
    p = Path(path)
    if not p.exists():
        raise UserError(f"{p}: no such trace")
    notes: list[str] = []
    if p.is_file():
        # A single per-call table (exported, or made by another tool).
        try:
            calls = pq.read_table(p).to_pandas() if p.suffix != ".csv" else pd.read_csv(p)
        except Exception as exc:  # pyarrow/pandas raise many types for garbage input
            raise UserError(f"{p}: not a trace (neither a bundle directory nor a Parquet table: {type(exc).__name__})") from None
        meta: dict = {}
    else:
        meta_path = p / "meta.json"
        if not meta_path.is_file():
            raise UserError(f"{p}: not an engramprof trace (no meta.json)")
        try:
            meta = json.loads(meta_path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise UserError(f"{meta_path}: corrupt metadata ({exc})") from None
        if not isinstance(meta, dict) or meta.get("format") != FORMAT:
            raise UserError(f"{meta_path}: not an engramprof trace")
        if not meta.get("complete", False):
            notes.append("trace was not closed cleanly (recorder killed?): analysing the parts that were flushed")
        calls = _read_dir(p / "calls")
        if calls is None:
            calls = empty_calls()
    missing = [c for c in CONTRACT_COLUMNS if c not in calls.columns]
    if missing:
        raise UserError(f"{p}: per-call table lacks required columns: {', '.join(missing)}")
    for c in DICT_COLUMNS:
        if c in calls.columns and isinstance(calls[c].dtype, pd.CategoricalDtype):
            calls[c] = calls[c].astype(object)
    if not calls["ts_ns"].is_monotonic_increasing:
        calls = calls.sort_values("ts_ns", kind="stable")
    calls = calls.reset_index(drop=True)
    return Trace(path=p, meta=meta, calls=calls, notes=notes)


def load(path: str | os.PathLike) -> pd.DataFrame:
    """The per-call table of a trace (DESIGN.md contract columns plus evidence columns)."""
    return load_bundle(path).calls
