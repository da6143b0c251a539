"""Several processes in one trace: each analysed on its own, then side by side.

A model server is several processes (tensor-parallel ranks, an offload worker); their read
streams interleave in time, so segmenting them as one stream would cut one rank's batch at
another rank's forward pass.  Each process's events (and markers: a marker's ``pid`` or
``rank`` says whose batch it is; markers without one apply to every process) go through the
whole pipeline alone; the per-batch tables are concatenated with a ``pid`` column, and the
summary is the slowest process's (by batch p99, then p50), with a ``processes`` list of every
process's figures beside it.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from engramprof.errors import UserError

PROCESS_KEYS = ("pid", "comm", "cmdline", "batches", "batch_ms", "verdict", "share")


def process_ids(calls: pd.DataFrame) -> np.ndarray:
    """The distinct pids of the events (empty: no pid column)."""
    if "pid" not in calls.columns or not len(calls):
        return np.empty(0, dtype=np.int64)
    col = calls["pid"]
    if isinstance(col.dtype, np.dtype) and col.dtype.kind in "iu":  # no missing value: no copy
        pid = col.to_numpy()
    else:
        pid = pd.to_numeric(col, errors="coerce").dropna().astype(np.int64).to_numpy()
    return (np.unique(pid) if len(pid) and pid.min() != pid.max() else np.unique(pid[:1])).astype(np.int64)


def markers_of(markers: pd.DataFrame | None, pid: int, rank: int | None) -> pd.DataFrame | None:
    """The markers of one process: those whose ``pid`` (or ``rank``) is its own; all of them
    when the markers name no process."""
    if markers is None:
        return None
    for key, want in (("pid", pid), ("rank", rank)):
        if key in markers.columns and want is not None:
            v = pd.to_numeric(markers[key], errors="coerce")
            if v.notna().any():
                return markers[v == want].reset_index(drop=True)
    return markers


def _process_facts(meta: dict, pid: int) -> tuple[str | None, str | None, int | None]:
    """(comm, cmdline, rank) of a pid from the bundle's metadata, where the recorder wrote them."""
    for p in meta.get("processes") or []:
        if isinstance(p, dict) and p.get("pid") == pid:
            return p.get("comm"), p.get("cmdline"), p.get("rank")
    if meta.get("pid") == pid:
        cmd = meta.get("target_cmdline")
        comm = cmd.split()[0].rsplit("/", 1)[-1] if isinstance(cmd, str) and cmd else None
        return comm, cmd, None
    return None, None, None


def process_row(pid: int, summary: dict, meta: dict) -> dict:
    comm, cmdline, _ = _process_facts(meta, pid)
    return {"pid": int(pid), "comm": comm, "cmdline": cmdline, "batches": int(summary["batches"]),
            "batch_ms": dict(summary["batch_ms"]), "verdict": summary["verdict"], "share": dict(summary["share"])}


def slowest(rows: list[dict]) -> int:
    """Index of the process whose batches are slowest (p99, then p50)."""
    def key(r):
        b = r["batch_ms"]
        return (b.get("p99") or 0.0, b.get("p50") or 0.0)
    return max(range(len(rows)), key=lambda i: key(rows[i]))


def analyse_each(analyse_one, calls: pd.DataFrame, pids: np.ndarray, markers: pd.DataFrame | None, **kw):
    """``analyse_one(calls, markers, **kw)`` per process; (table with pid, summary, rows)."""
    meta = kw["meta"]
    tables, summaries, rows, skipped = [], [], [], []
    pid_col = pd.to_numeric(calls["pid"], errors="coerce")
    later = kw.get("later") or {}
    for pid in pids:
        sel = (pid_col == pid).to_numpy()
        mine = calls[sel].reset_index(drop=True)
        if later:  # the columns left on disk, read at this process's rows
            kw["later"] = {c: col.subset(np.flatnonzero(sel)) for c, col in later.items()}
        _, _, rank = _process_facts(meta, int(pid))
        try:
            table, summary = analyse_one(mine, markers_of(markers, int(pid), rank), **kw)
        except UserError as exc:  # one process without batches does not hide the others
            skipped.append(f"pid {int(pid)}: {exc}")
            continue
        tables.append(table.assign(pid=int(pid)))
        summaries.append(summary)
        rows.append(process_row(int(pid), summary, meta))
    if not rows:
        raise UserError("no process of the trace could be analysed: " + "; ".join(skipped))
    k = slowest(rows)
    summary = dict(summaries[k])
    summary["notes"] = list(summary.get("notes", [])) + [
        f"{len(pids)} processes analysed on their own (batches never mix processes); this summary is pid "
        f"{rows[k]['pid']}'s, whose batches are slowest (p99); see processes"] + [f"left out: {s}" for s in skipped]
    summary["processes"] = rows
    summary["slowest_process"] = rows[k]["pid"]
    table = pd.concat(tables, ignore_index=True).sort_values(["start_ns", "pid"], kind="stable")
    return table.reset_index(drop=True), summary
