"""Writing a bundle incrementally (see engramprof/trace/__init__.py for the layout)."""
from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from engramprof.errors import UserError
from engramprof.trace.schema import (DICT_COLUMNS, CALL_SCHEMA, EVENT_SCHEMA, FORMAT, FORMAT_VERSION, READ_KINDS, WRITE_SCHEMA,
                                     kind_column)


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


def _events_from_pandas(df: pd.DataFrame) -> pa.Table:
    """A DataFrame of read calls as an EVENT_SCHEMA table; ``kind`` absent -> ``syscall``,
    ``kind`` given as codes -> their READ_KINDS names."""
    table = pa.Table.from_pandas(df, schema=CALL_SCHEMA, preserve_index=False)
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
        """One part of read events: CALL_SCHEMA columns, plus ``kind`` (``syscall`` if absent)."""
        if isinstance(table, pd.DataFrame):
            table = _events_from_pandas(table)
        elif "kind" not in table.column_names:
            table = table.append_column("kind", kind_column("syscall", table.num_rows))
        table = table.select(EVENT_SCHEMA.names).cast(WRITE_SCHEMA)
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
            # dictionary pages only for the text columns: an int64 column of a million distinct
            # values (entry times, offsets) tried as a dictionary reads back 2x slower
            pq.write_table(table, f, compression="zstd",
                           use_dictionary=[c for c in DICT_COLUMNS if c in table.column_names])

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
