"""Reading a bundle: :func:`load_bundle` / :func:`load`, with the format-version check."""
from __future__ import annotations

import dataclasses
import json
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from engramprof.errors import UserError
from engramprof.trace.schema import (
    CONTRACT_COLUMNS,
    DICT_COLUMNS,
    EVENT_SCHEMA,
    FAULT_DEFAULTS,
    URING_DEFAULTS,
    FILE_DEFAULTS,
    FORMAT,
    FORMAT_VERSION,
    SMALL_INT_COLUMNS,
    kind_categorical,
)


def empty_calls() -> pd.DataFrame:
    return EVENT_SCHEMA.empty_table().to_pandas()


@dataclass
class LaterColumn:
    """A per-call column left on disk by the load (``load_bundle(later=...)``): its values are
    read at the rows asked for, a part at a time, in the type the load would have given it.
    ``order``: per row of the loaded table, its row in the parts (None: the same)."""

    name: str
    parts: list[Path]
    starts: np.ndarray  # the parts' first rows, and the total
    dtype: np.dtype
    has_values: bool  # some row holds a value (not null in every row)
    order: np.ndarray | None = None

    def values_at(self, rows: np.ndarray) -> np.ndarray:
        """The column's values at table rows ``rows`` (each part holding some read once, the
        parts side by side on READ_THREADS threads, as at load)."""
        stored = np.asarray(rows, dtype=np.int64)
        if self.order is not None:
            stored = self.order[stored]
        out = np.empty(len(stored), dtype=self.dtype)
        part = np.searchsorted(self.starts, stored, side="right") - 1

        def read(i: int) -> None:
            sel = np.flatnonzero(part == i)
            tab = _read_part(self.parts[i], [self.name], use_threads=False)
            if self.name not in tab.column_names:  # an older part without it: missing, as at load
                out[sel] = np.nan
            else:
                out[sel] = tab.column(self.name).to_numpy()[stored[sel] - self.starts[i]]

        _each_part(read, np.unique(part).tolist())
        return out

    def subset(self, rows: np.ndarray) -> "LaterColumn":
        """The column of a table made of rows ``rows`` of this one (one process's events)."""
        rows = np.asarray(rows, dtype=np.int64)
        return dataclasses.replace(self, order=rows if self.order is None else self.order[rows])


@dataclass
class Trace:
    path: Path
    meta: dict
    calls: pd.DataFrame
    notes: list[str] = field(default_factory=list)
    #: per-call columns the load left on disk (``load_bundle(later=...)``), by name
    later: dict[str, LaterColumn] = field(default_factory=dict)

    def samples(self, name: str) -> pd.DataFrame | None:
        """Sample series ``name`` (incomplete parts skipped, each with a note), or None."""
        return _read_dir(self.path / "samples" / name, notes=self._note)

    def table(self, name: str) -> pd.DataFrame | None:
        """tables/NAME.parquet, or None (absent, or unreadable: then with a note)."""
        p = self.path / "tables" / f"{name}.parquet"
        if not p.is_file():
            return None
        try:
            return pq.read_table(p).to_pandas()
        except (pa.ArrowException, OSError) as exc:
            self._note(f"skipped {_rel(p)}: not a complete Parquet file ({_short(exc)})")
            return None

    def _note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)

    @property
    def sample_names(self) -> list[str]:
        d = self.path / "samples"
        return sorted(p.name for p in d.iterdir() if p.is_dir()) if d.is_dir() else []


#: parts decoded at a time, one per thread (Parquet decoding releases the GIL).  A part per
#: thread: measured here, decoding each part's columns on Arrow's own thread pool took 1.5x the
#: CPU time of decoding whole parts side by side (benchmarks/RESULTS.md, "Analysis speed")
READ_THREADS = max(1, min(2, os.cpu_count() or 1))
#: columns of a part decoded at once: Arrow's buffers for a few columns, not the part's all (a
#: 960k-row part's 11 columns held ~85 MB each on two threads, at the load's peak; read a
#: column at a time, a part took the same CPU here: benchmarks/RESULTS.md)
COLUMNS_AT_ONCE = 4


def _read_part(p: Path, columns: list[str] | None, use_threads: bool = True) -> pa.Table:
    try:
        if columns is None:
            return pq.read_table(p, use_threads=use_threads)
        have = set(pq.read_schema(p).names)
        return pq.read_table(p, columns=[c for c in columns if c in have], use_threads=use_threads)
    except (pa.ArrowException, OSError) as exc:
        raise UserError(f"{p}: corrupt trace part ({exc})") from None


def _rel(p: Path) -> str:
    """``calls/part-000012.parquet``: a part named from its bundle."""
    return f"{p.parent.name}/{p.name}" if p.parent.parent.name != "samples" else f"samples/{p.parent.name}/{p.name}"


def _short(exc: BaseException) -> str:
    return str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__


def complete_parts(d: Path, notes=None, required: list[str] | None = None) -> list[pq.ParquetFile]:
    """The parts of one table directory whose Parquet footer reads (a part cut short, by a
    kill before the writer renamed parts atomically or by a copy, is skipped); leftover
    temporaries of an interrupted write (``.part-*.tmp``) are ignored.  Each skip is
    reported through ``notes(text)``.  ``required``: a part whose columns do not include
    these (a foreign Parquet file copied into the directory) is skipped too, with a note."""
    if not d.is_dir():
        return []
    say = notes or (lambda _t: None)
    leftovers = sorted(q.name for q in d.glob(".*.tmp"))
    if leftovers:
        say(f"ignored {len(leftovers)} unfinished temporary file(s) in {_rel(d / leftovers[0]).rsplit('/', 1)[0]}/ "
            f"({leftovers[0]}{', ...' if len(leftovers) > 1 else ''}): a write interrupted by the recorder's end")
    heads = []
    for p in sorted(d.glob("part-*.parquet")):
        try:
            h = pq.ParquetFile(p)
        except (pa.ArrowException, OSError) as exc:
            say(f"skipped {_rel(p)}: not a complete Parquet file ({_short(exc)})")
            continue
        missing = [c for c in (required or ()) if c not in h.schema_arrow.names]
        if missing:
            say(f"skipped {_rel(p)}: not a part of this trace (no {', '.join(missing[:3])}"
                f"{', ...' if len(missing) > 3 else ''} column)")
            continue
        h.path = p
        heads.append(h)
    return heads


def _read_dir(d: Path, columns: list[str] | None = None, narrow: bool = False, notes=None,
              required: list[str] | None = None, later: dict | None = None) -> pd.DataFrame | None:
    """The parts of one table directory as one DataFrame (only ``columns``, when given);
    incomplete parts are skipped with a note (see :func:`complete_parts`).  ``later`` (with
    ``columns``): names of columns to leave on disk, mapped by this call to their
    :class:`LaterColumn` where one can be (see :func:`_read_parts_into_arrays`)."""
    heads = complete_parts(d, notes, required)
    if not heads:
        return None
    parts = [h.path for h in heads]
    if columns is not None:
        return _read_parts_into_arrays(parts, columns, narrow, heads, later)
    table = pa.concat_tables([_read_part(p, columns) for p in parts], promote_options="default")
    # one dictionary per string column instead of one per part: pandas then builds a single
    # categorical (fast); load() turns it into plain strings unless asked to keep categories.
    # Copied into pandas' own blocks (not views of Arrow's buffers), so that Arrow's pool can
    # hand its decode memory back now: the threads samples of a 10M-call bundle kept ~50 MB
    df = table.unify_dictionaries().to_pandas(self_destruct=True)
    del table
    pa.default_memory_pool().release_unused()
    return df


def _narrow_types(heads: list, columns: list[str]) -> dict[str, np.dtype]:
    """The integer columns whose every value, by the parts' Parquet statistics, fits a narrower
    integer, and that type: int64 ones int32, and :data:`SMALL_INT_COLUMNS` (int64 or int32)
    the narrowest of int8, int16 and int32 (a miss's pages and bios are counted in ones)."""
    out: dict[str, np.dtype] = {}
    for c in columns:
        lo = hi = None
        wide = (pa.int64(), pa.int32()) if c in SMALL_INT_COLUMNS else (pa.int64(),)
        for h in heads:
            names = h.schema_arrow
            if c not in names.names or names.field(c).type not in wide:
                lo = None
                break
            md = h.metadata
            j = md.schema.names.index(c) if c in md.schema.names else None
            for g in range(md.num_row_groups):
                st = md.row_group(g).column(j).statistics if j is not None else None
                if st is None or not st.has_min_max:
                    lo = None
                    break
                lo, hi = (st.min, st.max) if lo is None else (min(lo, st.min), max(hi, st.max))
            else:
                continue
            break
        if lo is None:
            continue
        for t in ((np.int8, np.int16, np.int32) if c in SMALL_INT_COLUMNS else (np.int32,)):
            if np.iinfo(t).min <= lo and hi <= np.iinfo(t).max:
                out[c] = np.dtype(t)
                break
    return out


def _column_plan(heads: list, present: list[str], narrow: dict[str, np.dtype]) -> dict | None:
    """Each column's array type, decided from the parts' footers before any part is decoded:
    None for text; float64 where a part lacks the column, holds floats or (by its statistics)
    nulls; else the parts' integer / bool type (``narrow``'s type where it names one).  None when the
    footers cannot tell (no null counts, parts of different types): read part after part."""
    plan: dict = {}
    for c in present:
        types = [h.schema_arrow.field(c).type if c in h.schema_arrow.names else None for h in heads]
        if any(t is not None and _is_text(t) for t in types):
            plan[c] = None
            continue
        known = {t for t in types if t is not None}
        if any(pa.types.is_floating(t) for t in known) or None in types:
            plan[c] = np.dtype(np.float64)
            continue
        if len(known) != 1 or not (pa.types.is_integer(next(iter(known))) or pa.types.is_boolean(next(iter(known)))):
            return None
        nulls = _null_count(heads, c)
        if nulls is None:
            return None
        plan[c] = (np.dtype(np.float64) if nulls else narrow[c] if c in narrow
                   else np.dtype(next(iter(known)).to_pandas_dtype()))
    return plan


def _footer_values(heads: list, c: str):
    """Per row group of every part, column ``c``'s (min, max, nulls, rows) from the footers;
    None when a row group has no statistics (or no such column)."""
    out = []
    for h in heads:
        md = h.metadata
        if c not in md.schema.names:
            return None
        j = md.schema.names.index(c)
        for g in range(md.num_row_groups):
            rg = md.row_group(g)
            st = rg.column(j).statistics
            if st is None or not st.has_null_count:
                return None
            lo, hi = (st.min, st.max) if st.has_min_max else (None, None)
            out.append((lo, hi, st.null_count, rg.num_rows))
    return out


def _constant_columns(heads: list, plan: dict) -> dict:
    """The columns that hold one value in every row of every part, by the parts' statistics,
    filled from the footers instead of decoded: an integer or bool column with min = max
    everywhere and no null (a trace of one process has one pid; most calls have no flags; a
    trace without faults has no fault on the process's code), a text column
    with one value and no null (one kind, one syscall), and a column null in every row (an
    older probe's, another kind's: io_uring's columns in a syscall trace).  The value, or
    None for all-null."""
    const: dict = {}
    for c, t in plan.items():
        stats = _footer_values(heads, c)
        if not stats:
            continue
        if all(nulls == rows for _, _, nulls, rows in stats):
            if t is None or t.kind == "f":
                const[c] = None
            continue
        if t is not None and t.kind not in "iub":
            continue
        values = {(lo, hi) for lo, hi, nulls, _ in stats if not nulls}
        if len(values) != 1 or any(nulls for _, _, nulls, _ in stats):
            continue
        lo, hi = next(iter(values))
        if lo is None or lo != hi or isinstance(lo, bool) != (t is not None and t.kind == "b"):
            continue
        if t is None:
            const[c] = lo.decode() if isinstance(lo, bytes) else str(lo)
        else:
            const[c] = bool(lo) if t.kind == "b" else int(lo)
    return const


def _null_count(heads: list, c: str) -> int | None:
    """Nulls of column ``c`` over every part, from the row groups' statistics (None: unknown)."""
    total = 0
    for h in heads:
        md = h.metadata
        j = md.schema.names.index(c) if c in md.schema.names else None
        if j is None:
            return None
        for g in range(md.num_row_groups):
            st = md.row_group(g).column(j).statistics
            if st is None or not st.has_null_count:
                return None
            total += st.null_count
    return total


def _part_starts(heads: list) -> np.ndarray:
    """Each part's first row in the table of all of them, and the total (int64)."""
    return np.r_[0, np.cumsum([h.metadata.num_rows for h in heads])].astype(np.int64)


def _each_part(read, indices) -> list:
    """``read(i)`` for each part index, READ_THREADS parts side by side (Parquet decoding
    releases the GIL); the results in index order."""
    indices = list(indices)
    if len(indices) > 1 and READ_THREADS > 1:
        with ThreadPoolExecutor(max_workers=READ_THREADS, thread_name_prefix="engramprof-read") as pool:
            return list(pool.map(read, indices))
    return [read(i) for i in indices]


def _read_parts_side_by_side(parts: list[Path], heads: list, present: list[str], plan: dict) -> pd.DataFrame:
    """Every part decoded on a thread of its own (READ_THREADS at a time, Arrow's own threads
    off) straight into its rows of one preallocated array per numeric column, and of one code
    array per text column (a part's text is kept as its dictionary and small codes until every
    part is read, then mapped onto one dictionary in part order: the categories of one
    ``unify_dictionaries``).  Columns one value fills (:func:`_constant_columns`) are read-only
    views of that value, not decoded, and take no memory.  Peak memory is the result plus
    READ_THREADS parts."""
    rows = [h.metadata.num_rows for h in heads]
    starts = _part_starts(heads)
    n = int(starts[-1])
    const = _constant_columns(heads, plan)
    out = {c: np.empty(n, dtype=t) for c, t in plan.items() if t is not None and c not in const}
    decode = [c for c in present if c not in const]

    def read(i: int) -> dict:
        text: dict = {}
        for g in range(0, len(decode), COLUMNS_AT_ONCE):  # a few columns' decode buffers at a time
            group = decode[g:g + COLUMNS_AT_ONCE]
            tab = _read_part(parts[i], group, use_threads=False)
            lo, m = int(starts[i]), tab.num_rows
            if m != rows[i]:
                raise UserError(f"{parts[i]}: corrupt trace part ({m} rows, its footer says {rows[i]})")
            for c in group:
                col = tab.column(c) if c in tab.column_names else None
                if plan[c] is None:
                    text[c] = [_part_codes(ch) for ch in col.chunks] if col is not None else [(_NO_TEXT, None, m)]
                elif col is None:
                    out[c][lo:lo + m] = np.nan
                else:
                    out[c][lo:lo + m] = col.to_numpy()
            del tab, col
        return text

    texts = _each_part(read, range(len(parts)))
    pa.default_memory_pool().release_unused()  # the last parts' decode buffers
    for c in present:
        if c in const:
            out[c] = _filled(const[c], plan[c], n)
        elif plan[c] is None:
            out[c] = _categorical_of_parts([piece for t in texts for piece in t.pop(c)], n)
    return pd.DataFrame({c: out[c] for c in present}, copy=False)


#: a part without a text column: no dictionary
_NO_TEXT = pa.array([], type=pa.string())


def _part_codes(chunk: pa.Array) -> tuple[pa.Array, np.ndarray | None, int]:
    """A text chunk as (its dictionary, its codes: the smallest signed integers, -1 for a null;
    None when every row is null, and its length)."""
    if not pa.types.is_dictionary(chunk.type):
        chunk = chunk.cast(pa.string()).dictionary_encode()
    values = chunk.dictionary.cast(pa.string())
    if chunk.null_count == len(chunk):
        return values, None, len(chunk)
    idx = chunk.indices.fill_null(-1) if chunk.null_count else chunk.indices
    return values, idx.to_numpy().astype(_code_type(len(values)), copy=False), len(chunk)


def _code_type(k: int) -> np.dtype:
    """The code type of a categorical of ``k`` categories (pandas' own choice)."""
    return np.dtype(np.int8 if k < 127 else np.int16 if k < 32767 else np.int32 if k < 2**31 - 1 else np.int64)


def _categorical_of_parts(pieces: list, n: int) -> pd.Categorical:
    """The parts' text as one pandas categorical: one dictionary, every part's values appended
    in part order where not seen before (what Arrow's ``unify_dictionaries`` makes)."""
    index: dict = {}
    remaps = []
    for values, _, _ in pieces:
        remaps.append(np.array([index.setdefault(v, len(index)) for v in values.to_pylist()] + [-1], dtype=np.int64))
    dtype = _categorical_dtype(list(index))
    codes = np.empty(n, dtype=_code_type(len(index)))
    lo = 0
    for (_, local, m), remap in zip(pieces, remaps):
        if local is None:
            codes[lo:lo + m] = -1
        else:
            codes[lo:lo + m] = remap[local]  # -1 (null) takes the remap's trailing -1
        lo += m
    return pd.Categorical.from_codes(codes, dtype=dtype, validate=False)


def _categorical_dtype(values: list[str]) -> pd.CategoricalDtype:
    """The categorical type Arrow's conversion gives a dictionary of ``values``."""
    empty = pa.DictionaryArray.from_arrays(pa.array([], type=pa.int32()), pa.array(values, type=pa.string()))
    return empty.to_pandas().dtype


def _filled(value, dtype: np.dtype | None, n: int):
    """``n`` rows of one value, read-only and without memory (a zero-stride view): ``value``
    in ``dtype``; text (``dtype`` None) as a categorical of that one value; None: missing."""
    if dtype is None:
        if value is None:
            return pd.Categorical.from_codes(np.broadcast_to(np.int8(-1), (n,)), dtype=_categorical_dtype([]),
                                             validate=False)
        return pd.Categorical.from_codes(np.broadcast_to(np.int8(0), (n,)), dtype=_categorical_dtype([value]),
                                         validate=False)
    return np.broadcast_to(np.array(np.nan if value is None else value, dtype=dtype), (n,))


def _categorical(chunks: list) -> pd.api.extensions.ExtensionArray:
    """Text chunks (dictionary or plain) as one pandas categorical with one dictionary."""
    as_dict = pa.dictionary(pa.int32(), pa.string())
    arr = pa.chunked_array([(ch if pa.types.is_dictionary(ch.type) else ch.cast(pa.string()).dictionary_encode())
                            .cast(as_dict) for ch in chunks], type=as_dict)
    return arr.unify_dictionaries().to_pandas().array


def _read_parts_into_arrays(parts: list[Path], columns: list[str], narrow: bool = False,
                            heads: list | None = None, later: dict | None = None) -> pd.DataFrame:
    """Read the parts into one preallocated array per numeric column, text columns as one
    categorical each: side by side when the parts' footers tell each column's type
    (:func:`_read_parts_side_by_side`), else part after part (a part's decode buffers are
    freed, and reused, before the next part is read).  Peak memory is the result plus a part
    or two, not twice the result.  ``narrow``: int64 columns whose statistics fit a narrower
    type are stored in it (:func:`_narrow_types`).  ``later``: names (keys) of numeric columns
    to leave on disk; each that the footers type and that holds more than one value is left
    out of the frame and mapped to its :class:`LaterColumn` (the others are read as usual)."""
    if heads is None:
        heads = []
        for p in parts:
            try:
                heads.append(pq.ParquetFile(p))
            except (pa.ArrowException, OSError) as exc:
                raise UserError(f"{p}: corrupt trace part ({exc})") from None
    present = [c for c in columns if any(c in h.schema_arrow.names for h in heads)]
    narrowed = _narrow_types(heads, [c for c in present if c != "ts_ns"]) if narrow else {}
    plan = _column_plan(heads, present, narrowed)
    if plan is not None:
        for c in _later_columns(heads, plan, later or {}):
            later[c] = LaterColumn(c, list(parts), _part_starts(heads), plan[c], _has_values(heads, c))
            present.remove(c)
            del plan[c]
        return _read_parts_side_by_side(parts, heads, present, plan)
    n = sum(h.metadata.num_rows for h in heads)
    out: dict[str, np.ndarray] = {}
    text: dict[str, list] = {}
    lo = 0
    for p, h in zip(parts, heads):
        tab = _read_part(p, present)
        m = tab.num_rows
        for c in present:
            col = tab.column(c) if c in tab.column_names else None
            if col is not None and _is_text(col.type) or col is None and c in text:
                text.setdefault(c, [pa.nulls(lo, pa.string())] if lo else [])
                text[c].extend(col.chunks if col is not None else [pa.nulls(m, pa.string())])
                continue
            if col is None:  # an older part without this column: NaN, like load()
                out[c] = _as_float(out.get(c), n, nan_before=lo if c not in out else 0)
                out[c][lo:lo + m] = np.nan
                continue
            values = col.to_numpy()
            if c not in out:
                if lo or col.null_count:
                    out[c] = _as_float(None, n, nan_before=lo)
                else:
                    out[c] = np.empty(n, dtype=narrowed.get(c, values.dtype))
            elif col.null_count or (values.dtype.kind == "f" and out[c].dtype.kind != "f"):
                out[c] = _as_float(out[c], n)
            out[c][lo:lo + m] = values
        lo += m
        del tab
    pa.default_memory_pool().release_unused()  # the last part's decode buffers
    for c, chunks in text.items():
        out[c] = _categorical(chunks)
    return pd.DataFrame({c: out[c] for c in present}, copy=False)


def _is_text(t: pa.DataType) -> bool:
    return pa.types.is_dictionary(t) or pa.types.is_string(t) or pa.types.is_large_string(t)


def _later_columns(heads: list, plan: dict, later: dict) -> list[str]:
    """Of the columns asked to be left on disk, those that can be: numeric by the footers and
    not one value in every row (such a column costs no memory loaded: a view of the value)."""
    asked = {c: plan[c] for c in later if c in plan and plan[c] is not None}
    const = _constant_columns(heads, asked)
    return [c for c in asked if c not in const]


def _has_values(heads: list, c: str) -> bool:
    """Column ``c`` holds a value in some row, by the footers (True when they cannot tell)."""
    nulls = _null_count(heads, c)
    return nulls is None or nulls < sum(h.metadata.num_rows for h in heads)


def _as_float(a: np.ndarray | None, n: int, nan_before: int = 0) -> np.ndarray:
    """``a`` as float64 (NaN for missing values); a new array NaN in its first ``nan_before``."""
    if a is None:
        a = np.empty(n, dtype=np.float64)
        a[:nan_before] = np.nan
        return a
    return a if a.dtype == np.float64 else a.astype(np.float64)


def _read_meta(p: Path) -> dict:
    meta_path = p / "meta.json"
    if not meta_path.is_file():
        raise UserError(f"{p}: not an engramprof trace (no meta.json)")
    try:
        meta = json.loads(meta_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"{meta_path}: corrupt metadata ({exc})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise UserError(f"{meta_path}: not an engramprof trace")
    version = meta.get("format_version", 1)
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise UserError(f"{meta_path}: unknown trace format version {version!r} (this engramprof reads 1 to {FORMAT_VERSION})")
    if version > FORMAT_VERSION:
        raise UserError(f"{p}: trace format version {version} is newer than this engramprof reads "
                        f"(format version {FORMAT_VERSION}): upgrade engramprof to analyse it")
    return meta


def _read_single_table(p: Path) -> pd.DataFrame:
    """A single per-call table (exported, or made by another tool)."""
    try:
        return pq.read_table(p).to_pandas() if p.suffix != ".csv" else pd.read_csv(p)
    except Exception as exc:  # pyarrow/pandas raise many types for garbage input
        raise UserError(f"{p}: not a trace (neither a bundle directory nor a Parquet table: {type(exc).__name__})") from None


def load_bundle(path: str | os.PathLike, columns: list[str] | None = None, compact: bool = False,
                later: tuple[str, ...] = ()) -> Trace:
    """Read a bundle (or a bare Parquet/CSV per-call file) with clear errors.

    Bundles of an older format version are read (format 1 has no ``kind``: every row is a
    ``syscall``); a newer one is refused with both versions named.  ``columns``: read only
    these event columns (those of the contract among them must exist; others absent from an
    older bundle are skipped), e.g.
    :data:`EVENT_READ_COLUMNS` for the analysis.  ``compact`` (with ``columns``): keep the text
    columns (path, tensor, syscall) as pandas categoricals instead of plain strings, and read
    an integer column as int32 when the bundle's Parquet statistics show every value fits:
    far less memory and time for large traces, and what the analysis wants.  ``later`` (of
    ``columns``, a bundle directory's): numeric columns left on disk until values at a few rows
    are asked for (``Trace.later[name].values_at(rows)``: :data:`LATER_COLUMNS`, which only
    name a batch's slowest event); one a footer cannot type, or one value fills, is loaded."""
    p = Path(path)
    if not p.exists():
        raise UserError(f"{p}: no such trace")
    notes: list[str] = []
    deferred: dict = {}
    if p.is_file():
        calls, meta = _read_single_table(p), {}
    else:
        meta = _read_meta(p)
        if not meta.get("complete", False):
            notes.append("trace was not closed cleanly (recorder killed?): analysing the parts that were flushed")
        if meta.get("write_error"):
            notes.append(f"recording stopped early ({meta.get('end_reason', 'write error')}: {meta['write_error']}): "
                         "analysing the parts written before")
        want = None if columns is None else list(dict.fromkeys(columns))
        defaulted = {*CONTRACT_COLUMNS, *FAULT_DEFAULTS, *URING_DEFAULTS, *FILE_DEFAULTS}  # filled in when absent
        deferred = dict.fromkeys(c for c in later if want is not None and c in want and c not in defaulted)
        calls = _read_dir(p / "calls", want, narrow=compact, notes=notes.append, required=CONTRACT_COLUMNS,
                          later=deferred)
        deferred = {c: col for c, col in deferred.items() if col is not None}
        if calls is None:
            calls = empty_calls() if want is None else empty_calls()[[c for c in want if c in EVENT_SCHEMA.names]]
    required = CONTRACT_COLUMNS if columns is None else [c for c in CONTRACT_COLUMNS if c in columns]
    missing = [c for c in required if c not in calls.columns]
    if missing:
        raise UserError(f"{p}: per-call table lacks required columns: {', '.join(missing)}")
    for c in DICT_COLUMNS:
        if c != "kind" and not compact and c in calls.columns and isinstance(calls[c].dtype, pd.CategoricalDtype):
            calls[c] = calls[c].astype(object)
    if "kind" not in calls.columns:  # format 1, or a table from another tool
        calls["kind"] = kind_categorical("syscall", len(calls))
    elif not isinstance(calls["kind"].dtype, pd.CategoricalDtype):
        calls["kind"] = calls["kind"].astype("category")
    for c, value in FAULT_DEFAULTS.items():  # format < 3 (or another tool's table): not faults
        if c not in calls.columns and (columns is None or c in columns):
            calls[c] = np.nan if value is None else np.full(len(calls), value, dtype=type(value))
    for c in URING_DEFAULTS:  # format < 4 (or another tool's table): no io_uring requests
        if c not in calls.columns and (columns is None or c in columns):
            calls[c] = None if c == "uring_path" else np.nan
    for c in FILE_DEFAULTS:  # format < 5 (or another tool's table): identity not recorded
        if c not in calls.columns and (columns is None or c in columns):
            calls[c] = np.nan
    if not calls["ts_ns"].is_monotonic_increasing:
        calls = calls.sort_values("ts_ns", kind="stable")
        order = calls.index.to_numpy(dtype=np.int64)  # the sorted rows' rows in the parts
        deferred = {c: col.subset(order) for c, col in deferred.items()}
        calls = calls.reset_index(drop=True)
    elif not isinstance(calls.index, pd.RangeIndex) or calls.index.start != 0 or calls.index.step != 1:
        calls = calls.reset_index(drop=True)
    return Trace(path=p, meta=meta, calls=calls, notes=notes, later=deferred)


def load(path: str | os.PathLike) -> pd.DataFrame:
    """The per-call table of a trace (the contract columns of docs/commands/syscalls.md plus evidence columns)."""
    return load_bundle(path).calls
