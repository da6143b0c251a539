"""Reading a bundle: :func:`load_bundle` / :func:`load`, with the format-version check."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from engramprof.errors import UserError
from engramprof.trace.schema import CONTRACT_COLUMNS, DICT_COLUMNS, EVENT_SCHEMA, FORMAT, FORMAT_VERSION, kind_categorical


def empty_calls() -> pd.DataFrame:
    return EVENT_SCHEMA.empty_table().to_pandas()


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


def load_bundle(path: str | os.PathLike) -> Trace:
    """Read a bundle (or a bare Parquet/CSV per-call file) with clear errors.

    Bundles of an older format version are read (format 1 has no ``kind``: every row is a
    ``syscall``); a newer one is refused with both versions named."""
    p = Path(path)
    if not p.exists():
        raise UserError(f"{p}: no such trace")
    notes: list[str] = []
    if p.is_file():
        calls, meta = _read_single_table(p), {}
    else:
        meta = _read_meta(p)
        if not meta.get("complete", False):
            notes.append("trace was not closed cleanly (recorder killed?): analysing the parts that were flushed")
        calls = _read_dir(p / "calls")
        if calls is None:
            calls = empty_calls()
    missing = [c for c in CONTRACT_COLUMNS if c not in calls.columns]
    if missing:
        raise UserError(f"{p}: per-call table lacks required columns: {', '.join(missing)}")
    for c in DICT_COLUMNS:
        if c != "kind" and c in calls.columns and isinstance(calls[c].dtype, pd.CategoricalDtype):
            calls[c] = calls[c].astype(object)
    if "kind" not in calls.columns:  # format 1, or a table from another tool
        calls["kind"] = kind_categorical("syscall", len(calls))
    elif not isinstance(calls["kind"].dtype, pd.CategoricalDtype):
        calls["kind"] = calls["kind"].astype("category")
    if not calls["ts_ns"].is_monotonic_increasing:
        calls = calls.sort_values("ts_ns", kind="stable")
    calls = calls.reset_index(drop=True)
    return Trace(path=p, meta=meta, calls=calls, notes=notes)


def load(path: str | os.PathLike) -> pd.DataFrame:
    """The per-call table of a trace (DESIGN.md contract columns plus evidence columns)."""
    return load_bundle(path).calls
