"""Residency of a trace's rows: each distinct (path, offset, size) read, classified as
resident / partly / cold now, page-granular and without reading (``residency --rows``)."""
from __future__ import annotations

import os
from typing import Iterable

import numpy as np
import pandas as pd

from engramprof.analysis.events import code_faults
from engramprof.errors import UserError
from engramprof.host.residency import (  # noqa: F401
    RACE_NOTE,
    RowsSummary,
    _classify_fd,
    _summ,
    open_file,
)
from engramprof.tables import safetensors as layout


def distinct_rows(calls) -> pd.DataFrame:
    """The distinct (path, offset, size) rows of a per-call table (positional reads only),
    with the tensor column kept when the trace has one."""

    df = calls
    keep = (df["offset"] >= 0) & (df["size"] > 0) & df["path"].astype(str).ne("")
    cols = ["path", "offset", "size"] + (["tensor"] if "tensor" in df.columns else [])
    rows = df.loc[keep, cols].drop_duplicates(["path", "offset", "size"]).reset_index(drop=True)
    if "tensor" not in rows.columns:
        rows["tensor"] = ""
    rows["tensor"] = rows["tensor"].fillna("").astype(str)
    return rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(rows)


def classify_trace_rows(calls, paths: Iterable[str] | None = None,
                        method: str = "auto") -> RowsSummary:
    """Classify each distinct (path, offset, size) of a per-call table as resident / partly /
    cold, and summarise per file and tensor.  Files that no longer exist are skipped with a
    note; ``paths`` restricts to those files."""
    code = code_faults(calls)  # page faults on the process's own code are not table rows
    rows = distinct_rows(calls[~code] if code is not None else calls)
    want = None if paths is None else {os.path.abspath(os.fspath(p)) for p in paths}
    notes = [RACE_NOTE + " (classified page-granular, without reading)"]
    files = []
    for path, grp in rows.groupby("path", sort=True):
        if want is not None and os.path.abspath(path) not in want:
            continue
        try:
            f = open_file(path, allow_empty=True)
        except UserError as exc:
            notes.append(f"skipped {exc}")
            continue
        with f:
            offs = grp["offset"].to_numpy(np.int64)
            sizes = grp["size"].to_numpy(np.int64)
            fr = _classify_fd(f.fd, offs, sizes, "mincore" if method == "auto" else method)
            past = int(((offs + sizes) > f.size).sum())
            if past:
                notes.append(f"{path}: {past} rows end past the end of the file (shrank since the "
                             "trace?); their missing pages count as cold")
            entry = {"path": path, **_summ(fr, sizes)}
            tensor = grp["tensor"].to_numpy(dtype=object)
            if not (tensor != "").any():
                try:
                    tensor, _ = layout.load(path).map_offsets(offs)
                except UserError:
                    pass
            tensor = np.asarray(tensor, dtype=object)
            if (tensor != "").any():
                tl = []
                names, first_idx = np.unique(tensor.astype(str), return_index=True)
                for name in names[np.argsort(offs[first_idx])].tolist():  # file order
                    m = tensor.astype(str) == name
                    tl.append({"tensor": name or "(outside tensors)", **_summ(fr[m], sizes[m])})
                entry["tensors"] = tl
            files.append(entry)
    if want is not None:
        seen = {os.path.abspath(e["path"]) for e in files}
        for p in sorted(want - seen):
            notes.append(f"{p}: no rows of this file in the trace")
    return RowsSummary(files, notes)
