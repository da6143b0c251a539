"""Inputs for the tests that run commands without root: a small lab table and a synthetic trace
of its planned reads with markers, and a runner for `python -m engramprof`.

The trace is written by the trace writer, as a recording would be: batches of the lab's planned
reads, 3 us apart inside a batch, 20 ms between batches, one marker per batch.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parent.parent
PY = str(REPO / ".venv" / "bin" / "python") if (REPO / ".venv" / "bin" / "python").exists() else sys.executable


def engramprof(*args, timeout: float = 120, check: bool = True, columns: int | None = None) -> str:
    """stdout of `engramprof ARGS` (stdin closed); with check, a non-zero exit fails the test
    with the command and its stderr.  columns sets COLUMNS (output piped, not a terminal)."""
    env = dict(os.environ, COLUMNS=str(columns)) if columns else None
    p = subprocess.run([PY, "-m", "engramprof", *map(str, args)], capture_output=True, text=True, cwd=REPO,
                       timeout=timeout, env=env, stdin=subprocess.DEVNULL)
    if check:
        assert p.returncode == 0, f"engramprof {' '.join(map(str, args))}: exit {p.returncode}: {p.stderr[-2000:]}"
    return p.stdout


def fs_type(path: Path) -> str:
    """The filesystem type of path (`stat -f`): tmpfs and ramfs have no droppable page cache."""
    return subprocess.run(["stat", "-f", "-c", "%T", str(path)], capture_output=True, text=True).stdout.strip()


def planned_trace(d: Path, table_path: Path, steps: int, slow_call: bool = False) -> dict:
    """Make a 4096-row lab table at table_path and, in d, a trace of `steps` planned batches of
    16 tokens (trace/) with their markers (markers.jsonl).  slow_call: the middle call takes
    237 us (its offset is returned as slow_offset)."""
    from engramprof.lab import table, workload
    from engramprof.trace import CALL_SCHEMA, TraceWriter

    table.make_table(table_path, rows=4096, seed=5)
    batches = workload.planned_reads(table_path, steps=steps, tokens=16)
    recs, marks, ts = [], [], 1_000_000_000
    for b in batches:
        start = ts
        for off, size in b:
            recs.append((ts, off, size))
            ts += 3_000
        marks.append({"start_ns": start - 50_000, "end_ns": ts + 50_000, "tid": 7})
        ts += 20_000_000
    a = np.array(recs, dtype=np.int64)
    n = len(a)
    df = pd.DataFrame({c: np.zeros(n, dtype=CALL_SCHEMA.field(c).type.to_pandas_dtype()) for c in CALL_SCHEMA.names})
    df["ts_ns"], df["dur_ns"], df["pid"], df["tid"] = a[:, 0], 2_000, 7, 7 + np.arange(n) % 4
    if slow_call:
        df.loc[n // 2, "dur_ns"] = 237_000
    df["path"], df["offset"], df["size"], df["ret"] = str(table_path), a[:, 1], a[:, 2], a[:, 2]
    df["syscall"], df["tensor"], df["row"] = "preadv2", "", -1
    w = TraceWriter(d / "trace")
    w.append_calls(df)
    w.close()
    m = d / "markers.jsonl"
    m.write_text("".join(json.dumps(x) + "\n" for x in marks))
    return {"table": table_path, "trace": d / "trace", "markers": m, "dir": d, "slow_offset": int(a[n // 2, 1])}
