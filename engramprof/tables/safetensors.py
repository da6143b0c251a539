"""File + offset -> tensor + row, from safetensors headers (or a layout file for raw tables).

A safetensors file is: 8 bytes (little-endian u64) header length N, N bytes of JSON
``{"name": {"dtype", "shape", "data_offsets": [begin, end]}, ..., "__metadata__": {...}}``
(padded with spaces), then the data; ``data_offsets`` are relative to the end of the header.

:func:`load` parses and validates a header (``UserError`` on anything that is not a
well-formed safetensors file) and caches the result per path, keyed by (st_dev, st_ino,
st_mtime_ns, st_size) so a rewritten file is re-read.  :func:`map_offsets` and
:func:`annotate` map file offsets to (tensor, row) with ``np.searchsorted``: no Python loop
per offset.  Headers are read with a plain read of the header bytes only, never the data.
"""
from __future__ import annotations

import json
import math
import os
import stat
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from engramprof.errors import UserError
from engramprof.tables import raw as raw_layout

MAX_HEADER = 100_000_000  # the limit the safetensors library enforces
# bits per element of every safetensors dtype
DTYPE_BITS = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8,
    "I16": 16, "U16": 16, "F16": 16, "BF16": 16,
    "I32": 32, "U32": 32, "F32": 32, "I64": 64, "U64": 64, "F64": 64, "C64": 64,
    "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6,
}


@dataclass(frozen=True)
class Tensor:
    name: str
    dtype: str
    shape: tuple[int, ...]
    start: int  # absolute file offset of the first byte
    end: int  # absolute file offset one past the last byte
    row_bytes: int  # bytes per index of the first dimension (0 when not a whole byte count)
    first_row: int = 0  # the row id of the tensor's first row (a raw file holding a row range)

    @property
    def rows(self) -> int:
        return self.shape[0] if self.shape else 1

    def row_offset(self, row: int | np.ndarray) -> int | np.ndarray:
        return self.start + row * self.row_bytes


@dataclass(frozen=True)
class Layout:
    path: str
    header_len: int
    data_start: int
    size: int
    tensors: tuple[Tensor, ...]  # sorted by start
    metadata: dict[str, str]

    def __post_init__(self):
        live = [t for t in self.tensors if t.end > t.start]
        object.__setattr__(self, "_names", np.array([t.name for t in live], dtype=object))
        object.__setattr__(self, "_starts", np.array([t.start for t in live], dtype=np.int64))
        object.__setattr__(self, "_ends", np.array([t.end for t in live], dtype=np.int64))
        object.__setattr__(self, "_row_bytes", np.array([t.row_bytes for t in live], dtype=np.int64))
        object.__setattr__(self, "_first_row", np.array([t.first_row for t in live], dtype=np.int64))
        object.__setattr__(self, "_by_name", {t.name: t for t in self.tensors})

    def tensor(self, name: str) -> Tensor:
        try:
            return self._by_name[name]
        except KeyError:
            raise UserError(f"{self.path}: no tensor named {name!r}") from None

    @property
    def live_names(self) -> np.ndarray:
        """Names of the non-empty tensors, in file order: what :meth:`locate` indexes."""
        return self._names

    def names(self) -> list[str]:
        return [t.name for t in self.tensors]

    def locate(self, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(index into ``self.live_names`` per offset, row per offset); -1 / -1 outside every tensor."""
        offsets = np.asarray(offsets, dtype=np.int64)
        index = np.full(offsets.shape, -1, dtype=np.int32)
        rows = np.full(offsets.shape, -1, dtype=np.int64)
        if not len(self._starts) or not offsets.size:
            return index, rows
        idx = np.searchsorted(self._starts, offsets, side="right") - 1
        safe = np.maximum(idx, 0)
        inside = (idx >= 0) & (offsets < self._ends[safe])
        index[inside] = safe[inside]
        rb = self._row_bytes[safe[inside]]
        rel = offsets[inside] - self._starts[safe[inside]]
        rows[inside] = np.where(rb > 0, rel // np.maximum(rb, 1) + self._first_row[safe[inside]], -1)
        return index, rows

    def map_offsets(self, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(tensor name per offset, row per offset); ``""`` / ``-1`` outside every tensor."""
        index, rows = self.locate(offsets)
        names = np.full(index.shape, "", dtype=object)
        inside = index >= 0
        names[inside] = self._names[index[inside]]
        return names, rows


def _fail(path: str, why: str) -> UserError:
    return UserError(f"{path}: not a valid safetensors file ({why})")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict:
    out = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"duplicate key {k!r}")
        out[k] = v
    return out


def parse_header(path: str, raw: bytes, size: int) -> Layout:
    """Validate a header (``raw`` = the bytes after the 8-byte length) of a file of ``size``."""
    n = len(raw)
    data_start = 8 + n
    try:
        head = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicates)
    except (UnicodeDecodeError, ValueError) as exc:
        raise _fail(path, f"header is not JSON: {exc}") from None
    if not isinstance(head, dict):
        raise _fail(path, "header is not a JSON object")
    metadata = head.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
    ):
        raise _fail(path, "__metadata__ must map strings to strings")
    tensors = []
    for name, info in head.items():
        if not isinstance(info, dict):
            raise _fail(path, f"entry {name!r} is not an object")
        dtype, shape, offs = info.get("dtype"), info.get("shape"), info.get("data_offsets")
        if dtype not in DTYPE_BITS:
            raise _fail(path, f"tensor {name!r}: unknown dtype {dtype!r}")
        if not isinstance(shape, list) or not all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
        ):
            raise _fail(path, f"tensor {name!r}: bad shape {shape!r}")
        if not (
            isinstance(offs, list) and len(offs) == 2
            and all(isinstance(o, int) and not isinstance(o, bool) for o in offs)
            and 0 <= offs[0] <= offs[1]
        ):
            raise _fail(path, f"tensor {name!r}: bad data_offsets {offs!r}")
        bits = math.prod(shape) * DTYPE_BITS[dtype]
        if (bits + 7) // 8 != offs[1] - offs[0]:
            raise _fail(path, f"tensor {name!r}: {offs[1] - offs[0]} bytes for shape {shape} {dtype}")
        if data_start + offs[1] > size:
            raise _fail(path, f"tensor {name!r} ends past the end of the file")
        row_bits = math.prod(shape[1:]) * DTYPE_BITS[dtype]
        tensors.append(
            Tensor(name, dtype, tuple(shape), data_start + offs[0], data_start + offs[1],
                   row_bits // 8 if row_bits % 8 == 0 else 0)
        )
    tensors.sort(key=lambda t: (t.start, t.end))
    for a, b in zip(tensors, tensors[1:]):
        if b.start < a.end:
            raise _fail(path, f"tensors {a.name!r} and {b.name!r} overlap")
    return Layout(path, n, data_start, size, tuple(tensors), metadata)


def _raw_layout(path: str, st: os.stat_result) -> Layout | None:
    """A raw table file's layout from the registered layout file (engramprof.tables.raw), or None."""
    hit = raw_layout.rule_for(path, st.st_size)
    if hit is None:
        return None
    name, first_byte, row_bytes, first_row, rows = hit
    end = min(st.st_size, first_byte + rows * row_bytes)
    t = Tensor(name, "raw", (rows,), first_byte, max(first_byte, end), row_bytes, first_row)
    return Layout(path, 0, first_byte, st.st_size, (t,), {"layout": "raw"})


def forget_cached() -> None:
    """Drop every cached layout (registering a layout file makes them stale by itself)."""
    with _cache_lock:
        _cache.clear()


def _read_layout(path: str, st: os.stat_result) -> Layout:
    if not stat.S_ISREG(st.st_mode):
        raise _fail(path, "not a regular file")
    raw = _raw_layout(path, st)
    if raw is not None:
        return raw
    if st.st_size < 8:
        raise _fail(path, "shorter than 8 bytes")
    # O_NONBLOCK: never hang on a FIFO swapped in after the stat
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        st2 = os.fstat(fd)
        if (st2.st_dev, st2.st_ino) != (st.st_dev, st.st_ino) or not stat.S_ISREG(st2.st_mode):
            raise _fail(path, "file changed while opening")
        n = int.from_bytes(os.pread(fd, 8, 0), "little") if st.st_size >= 8 else 0
        if n < 2 or n > MAX_HEADER or 8 + n > st.st_size:
            raise _fail(path, f"header length {n} does not fit a {st.st_size}-byte file")
        raw = b""
        while len(raw) < n:
            chunk = os.pread(fd, n - len(raw), 8 + len(raw))
            if not chunk:
                raise _fail(path, "file shrank while reading the header")
            raw += chunk
    finally:
        os.close(fd)
    return parse_header(path, raw, st.st_size)


_cache: dict[str, tuple[tuple, Layout | UserError]] = {}
_cache_lock = threading.Lock()


def load(path: str | os.PathLike) -> Layout:
    """The validated layout of a safetensors file, or of a raw table file that a registered
    layout file describes (engramprof.tables.raw); cached until the file changes."""
    path = os.fspath(path)
    try:
        st = os.stat(path)
    except OSError as exc:
        raise UserError(f"{path}: {exc.strerror}") from None
    key = (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size, raw_layout.generation())
    with _cache_lock:
        hit = _cache.get(path)
    if hit is not None and hit[0] == key:
        result = hit[1]
    else:
        try:
            result = _read_layout(path, st)
        except UserError as exc:
            result = exc
        except OSError as exc:
            raise UserError(f"{path}: {exc.strerror}") from None
        with _cache_lock:
            _cache[path] = (key, result)
    if isinstance(result, UserError):
        raise UserError(str(result), result.code)
    return result


def map_offsets(path: str | os.PathLike, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(tensor names, rows) for file offsets of ``path``; ``""``/``-1`` outside any tensor."""
    return load(path).map_offsets(offsets)


def annotate(df):
    """Fill the ``tensor`` and ``row`` columns of a calls DataFrame (in place; returned).

    Rows whose ``path`` is a safetensors file get the tensor their ``offset`` falls in and
    the row within it; other rows keep what they had (``""`` / ``-1`` when the columns are
    new).  One header parse per distinct path (cached), one searchsorted per path.
    """
    if "tensor" not in df.columns:
        df["tensor"] = ""
    if "row" not in df.columns:
        df["row"] = np.int64(-1)
    if df.empty:
        df["row"] = df["row"].astype(np.int64)
        return df
    tensor = df["tensor"].to_numpy(dtype=object, copy=True)
    row = df["row"].to_numpy(dtype=np.int64, copy=True)
    offsets = df["offset"].to_numpy(dtype=np.int64)
    for path, pos in df.groupby("path", sort=False).indices.items():
        if not isinstance(path, str) or not path:
            continue
        try:
            lay = load(path)
        except UserError:
            continue
        tensor[pos], row[pos] = lay.map_offsets(offsets[pos])
    df["tensor"] = tensor
    df["row"] = row
    return df
