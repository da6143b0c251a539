"""Writing a bundle incrementally (see engramprof/trace/__init__.py for the layout).

Every file appears atomically: it is written under a temporary name that starts with a dot
(``.part-000012.parquet.<pid>.tmp``; readers, pandas and pyarrow datasets ignore dot files),
fsync'd, then renamed into place, so a recorder killed at any moment leaves only complete
parts (and at most one leftover temporary, which :func:`~engramprof.trace.load_bundle` ignores
with a note).

A write that fails because the disk is full, over quota or broken (ENOSPC, EDQUOT, EIO, or any
other OSError) removes its temporary, marks the writer :attr:`~TraceWriter.failed` and raises
:class:`WriteFailed`; every later part is refused the same way (the recorder stops).  A small
reserve file made with the bundle is released then, so that the closing ``meta.json`` (with
the in-kernel totals and the end reason) still fits on the full disk.
"""
from __future__ import annotations

import errno
import json
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from engramprof.errors import UserError
from engramprof.trace import clocks as _clocks
from engramprof.trace.schema import (
    CALL_SCHEMA,
    DICT_COLUMNS,
    EVENT_SCHEMA,
    OPTIONAL_FIELDS,
    FORMAT,
    FORMAT_VERSION,
    READ_KINDS,
    WRITE_SCHEMA,
    kind_column,
    with_fault_columns,
)

#: how every part is written: integer columns delta-encoded (entry times, offsets, row ids and
#: durations are runs of close values: packed to their differences' bits), then lz4.  Against
#: zstd on plain values, a part of 960k events is as small and decodes in a third of the CPU and
#: writes in under half (benchmarks/RESULTS.md "Trace parts: delta encoding and lz4")
PARQUET_COMPRESSION = "lz4"
INTEGER_ENCODING = "DELTA_BINARY_PACKED"
RESERVE_BYTES = 256 << 10  # room kept for the closing meta.json on a disk that fills up
RESERVE_NAME = ".reserve"
# why a recording ended (meta.json's and the JSON summaries' end_reason): the one vocabulary
# of `syscalls`, `diagnose` and `sample`; a failed write adds WRITE_END_REASONS
END_DURATION = "duration"  # --duration reached
END_SIGNAL = "signal"  # Ctrl-C (SIGINT) or SIGTERM
END_TARGET_EXIT = "target-exit"  # every traced process exited
END_REASONS = (END_DURATION, END_SIGNAL, END_TARGET_EXIT)
# end_reason of a recording stopped by a failed write, by errno name
WRITE_END_REASONS = {"ENOSPC": "disk-full", "EDQUOT": "disk-quota", "EIO": "disk-io-error"}


class WriteFailed(OSError):
    """A part could not be written (disk full, ...): the bundle takes no more parts."""


def end_reason_for(exc: OSError) -> str:
    """``disk-full`` for ENOSPC, ``disk-quota`` (EDQUOT), ``disk-io-error`` (EIO), else
    ``write-error-ENAME``."""
    name = errno.errorcode.get(exc.errno or 0, "EUNKNOWN")
    return WRITE_END_REASONS.get(name, f"write-error-{name}")


def _open_excl(path: Path, mode: str = "wb"):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    return os.fdopen(fd, mode)


def column_encodings(schema: pa.Schema, dictionary: list[str]) -> dict[str, str]:
    """INTEGER_ENCODING for every integer column not dictionary-encoded (the others: Arrow's
    default, plain values)."""
    return {f.name: INTEGER_ENCODING for f in schema
            if pa.types.is_integer(f.type) and f.name not in dictionary}


def _tmp_name(path: Path) -> Path:
    """The temporary a file is written under before its rename: a dot file in the same
    directory (ignored by every reader), unique to this process and moment."""
    return path.with_name(f".{path.name}.{os.getpid()}.{time.monotonic_ns()}.tmp")


def _unlink_quietly(path: Path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _atomic_json(path: Path, obj: dict) -> None:
    tmp = _tmp_name(path)
    try:
        with _open_excl(tmp, "w") as f:
            json.dump(obj, f, indent=2, default=str)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        _unlink_quietly(tmp)
        raise


def _events_from_pandas(df: pd.DataFrame) -> pa.Table:
    """A DataFrame of read calls as an EVENT_SCHEMA table; ``kind`` absent -> ``syscall``,
    ``kind`` given as codes -> their READ_KINDS names."""
    table = pa.Table.from_pandas(df, schema=CALL_SCHEMA, preserve_index=False)
    for f in OPTIONAL_FIELDS:  # formats 3-5: the fault, io_uring and file columns, when the frame has them
        if f.name in df.columns:
            table = table.append_column(f, pa.Array.from_pandas(df[f.name], type=f.type))
    if "kind" not in df.columns:
        return table.append_column("kind", kind_column("syscall", table.num_rows))
    kind = df["kind"]
    if pd.api.types.infer_dtype(kind, skipna=False) == "integer":
        kind = pd.Series(np.asarray(READ_KINDS, dtype=object)[kind.to_numpy(dtype=np.int64)])
    return table.append_column("kind", pa.array(kind.astype(str).to_numpy(), type=pa.string()))


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
            "clocks": _clocks.start_record(),  # monotonic/realtime/boottime together: engramprof compare
            "complete": False,
            "calls_written": 0,
        }
        if meta:
            self.meta.update(meta)
        self._parts: dict[str, int] = {}
        self._lock = threading.RLock()  # parts are written from the recorder's and the sampler's threads
        self.closed = False
        #: None, or (end reason, message) once a write failed: no more parts are written
        self.failed: tuple[str, str] | None = None
        self._reserve: Path | None = None
        _atomic_json(self.path / "meta.json", self.meta)
        self._make_reserve()

    def _make_reserve(self) -> None:
        """Set aside RESERVE_BYTES (released when a write fails, for the closing meta.json)."""
        p = self.path / RESERVE_NAME
        try:
            fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError:
            return
        try:
            try:
                os.posix_fallocate(fd, 0, RESERVE_BYTES)
            except OSError:  # no fallocate here (or no room already): real zeros
                os.write(fd, bytes(RESERVE_BYTES))
            self._reserve = p
        except OSError:
            _unlink_quietly(p)
        finally:
            os.close(fd)

    def _release_reserve(self) -> None:
        if self._reserve is not None:
            _unlink_quietly(self._reserve)
            self._reserve = None

    def _next_part(self, key: str, directory: Path) -> Path:
        with self._lock:
            n = self._parts.get(key, 0)
            self._parts[key] = n + 1
        directory.mkdir(exist_ok=True)
        return directory / f"part-{n:06d}.parquet"

    def append_calls(self, table: pa.Table | pd.DataFrame) -> None:
        """One part of read events: CALL_SCHEMA columns, plus ``kind`` (``syscall`` if absent)."""
        if isinstance(table, pd.DataFrame):
            table = _events_from_pandas(table)
        elif "kind" not in table.column_names:
            table = table.append_column("kind", kind_column("syscall", table.num_rows))
        table = with_fault_columns(table).select(EVENT_SCHEMA.names).cast(WRITE_SCHEMA)
        if table.num_rows == 0:
            return
        self._write(table, self._next_part("calls", self.path / "calls"))
        with self._lock:
            self.meta["calls_written"] += table.num_rows

    def append_samples(self, name: str, df: pd.DataFrame | pa.Table) -> None:
        table = df if isinstance(df, pa.Table) else pa.Table.from_pandas(df, preserve_index=False)
        if table.num_rows == 0:
            return
        self._write(table, self._next_part(f"samples/{name}", self.path / "samples" / name))
        with self._lock:
            counts = self.meta.setdefault("samples_written", {})
            counts[name] = counts.get(name, 0) + table.num_rows

    def write_table(self, name: str, df: pd.DataFrame | pa.Table) -> None:
        """tables/NAME.parquet, replaced atomically (a later call supersedes an earlier one)."""
        table = df if isinstance(df, pa.Table) else pa.Table.from_pandas(df, preserve_index=False)
        self._write(table, self.path / "tables" / f"{name}.parquet")

    def _write(self, table: pa.Table, path: Path) -> None:
        """``table`` as ``path``: temporary, fsync, rename.  Raises :class:`WriteFailed`."""
        if self.failed is not None:
            raise WriteFailed(errno.ENOSPC, f"not written after an earlier failure ({self.failed[1]})", str(path))
        tmp = _tmp_name(path)
        # dictionary pages only for the text columns: an int64 column of a million distinct
        # values (entry times, offsets) tried as a dictionary reads back 2x slower
        dictionary = [c for c in DICT_COLUMNS if c in table.column_names]
        try:
            with _open_excl(tmp) as f:
                pq.write_table(table, f, compression=PARQUET_COMPRESSION, use_dictionary=dictionary,
                               column_encoding=column_encodings(table.schema, dictionary))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except (OSError, pa.ArrowException) as exc:
            _unlink_quietly(tmp)
            oserr = exc if isinstance(exc, OSError) else _arrow_oserror(exc)
            if oserr is None:
                raise
            self._fail(oserr, path)
            raise WriteFailed(oserr.errno, f"{path.relative_to(self.path)}: {oserr.strerror or oserr}") from exc

    def _fail(self, exc: OSError, path: Path) -> None:
        with self._lock:
            if self.failed is None:
                name = errno.errorcode.get(exc.errno or 0, "EUNKNOWN")
                rel = path.relative_to(self.path) if path.is_relative_to(self.path) else path
                self.failed = (end_reason_for(exc), f"{name} writing {rel}: {exc.strerror or exc}")
                self.meta["write_error"] = self.failed[1]
        self._release_reserve()

    def update_meta(self, **kw: Any) -> None:
        self.meta.update(kw)

    def flush_meta(self) -> None:
        """Rewrite meta.json now (atomically); a failure marks the writer failed."""
        if self.failed is not None:
            return
        with self._lock:
            snapshot = json.loads(json.dumps(self.meta, default=str))
        try:
            _atomic_json(self.path / "meta.json", snapshot)
        except OSError as exc:
            self._fail(exc, self.path / "meta.json")

    def close(self, **kw: Any) -> None:
        """The closing meta.json (``complete: true``); after a failed write the reserve has
        been released to make room for it."""
        if self.closed:
            return
        with self._lock:
            self.meta.update(kw)
            self.meta["complete"] = True
            self.meta["closed_monotonic_ns"] = time.monotonic_ns()
            if isinstance(self.meta.get("clocks"), dict):
                self.meta["clocks"]["end"] = _clocks.read_now()
            if self.failed is not None:
                self.meta.setdefault("write_error", self.failed[1])
        try:
            _atomic_json(self.path / "meta.json", self.meta)
        finally:
            self._release_reserve()
            self.closed = True


def _arrow_oserror(exc: Exception) -> OSError | None:
    """The OSError behind an Arrow I/O error ("[Errno 28] No space left on device"), if any."""
    msg = str(exc)
    for code, name in errno.errorcode.items():
        if f"[Errno {code}]" in msg or name in msg.split():
            return OSError(code, os.strerror(code))
    return None
