"""Presentation shared by every command: JSON shaping and the advice for each verdict.

One JSON shaping (:func:`jsonable`, :func:`to_json`: numpy scalars to Python, NaN/inf to
null, anything else unknown to its string) and one advice table (:data:`ADVICE`: for each
verdict the one-line hint batch-tail prints, the fix diagnose recommends and how to confirm
it), so that two commands never word the same verdict differently.
"""
from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pandas as pd


def jsonable(v: Any) -> Any:
    """``v`` with numpy / pandas values turned into JSON-safe Python ones (NaN -> None)."""
    if isinstance(v, dict):
        return {str(k): jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [jsonable(x) for x in v]
    if isinstance(v, np.ndarray):
        return [jsonable(x) for x in v.tolist()]
    if isinstance(v, np.integer):
        return int(v)
    if isinstance(v, (float, np.floating)):
        f = float(v)
        return f if math.isfinite(f) else None
    if isinstance(v, np.bool_):
        return bool(v)
    if v is None or isinstance(v, (str, int, bool)):
        return v
    try:
        if pd.isna(v):
            return None
    except (TypeError, ValueError):
        pass
    return str(v)


def to_json(obj: Any, indent: int | None = 2) -> str:
    """Strict JSON (no NaN / Infinity) of a summary document."""
    return json.dumps(jsonable(obj), indent=indent, allow_nan=False)


ADVICE = {
    "python-scheduling": {
        "hint": "reads are cheap but the batch waits on futures, wake-ups and GIL hand-offs: "
                "read cached rows synchronously with RWF_NOWAIT and send only EAGAIN rows to the pool",
        "fix": "Serve cached rows without the thread pool: try each row synchronously with "
               "preadv(..., RWF_NOWAIT), retry the EAGAIN rows once, send only the rows still "
               "missing to the existing blocking pool (keep the pool as the fallback where NOWAIT "
               "is unsupported).",
        "confirm": "engramprof replay TRACE --strategies pool,nowait (component A/B on these rows), "
                   "then a second `engramprof diagnose --pid PID` after the change, same load",
    },
    "residency": {
        "hint": "requested rows are not in the page cache and calls wait for the device: check residency of "
                "the hot rows (engramprof residency) and keep them cached",
        "fix": "The rows the batches need are not in the page cache: keep the hot rows resident "
               "(give the page cache room for the table's working set, prefetch the hot tensors, "
               "avoid evicting them with DONTNEED or other large readers), or shrink the hot set.",
        "confirm": "engramprof residency --rows TRACE (hot rows resident?), then a second "
                   "`engramprof diagnose --pid PID`",
    },
    "reclaim": {
        "hint": "memory pressure evicts the rows or the readers stall in reclaim: check the cgroup memory limit, "
                "refaults and memory PSI",
        "fix": "Rows were cached but memory pressure evicted them (refaults) or the readers stall "
               "in reclaim: give the process or its cgroup memory headroom (raise memory limit / "
               "memory.high, move other memory users out), and check for stale shared memory.",
        "confirm": "engramprof sample --pid PID (refaults, PSI memory, cgroup reclaim ~0), then a "
                   "second `engramprof diagnose --pid PID`",
    },
    "storage": {
        "hint": "misses are served slower than normal device service: check io PSI, blkio throttles and the "
                "device queue",
        "fix": "Misses wait far longer than the device's normal service: check the I/O path "
               "(blkio / io.max throttles, queue depth, a saturated or degraded device, noisy "
               "neighbours on the same disk); raise queue depth only if the device has headroom.",
        "confirm": "engramprof diagnose --pid PID again after the change; iostat -x for device "
                   "utilisation and await",
    },
    "healthy": {
        "hint": "no cause explains a meaningful share of batch time",
        "fix": "No cause explains a meaningful share of batch time: the read path is not what "
               "holds this window back. Look upstream (queueing, prefill, collectives) before "
               "changing the reader.",
        "confirm": "repeat `engramprof diagnose` on a window where decode steps are slow",
    },
}


#: where a memory-mapped reader (page faults) needs other advice than a syscall reader
ADVICE_FAULTS = {
    "python-scheduling": {
        "hint": "the rows are mapped and cheap to gather, but the batch waits on the pool's futures and "
                "wake-ups: gather on the calling thread",
        "fix": "Gather the rows on the calling thread: a fancy-index gather from mapped, resident pages is a "
               "memory copy, and splitting it across a thread pool only adds futures, wake-ups and GIL "
               "hand-offs. Keep the pool for batches whose pages are not resident, if at all.",
        "confirm": "engramprof diagnose --pid PID after the change, same load (python-scheduling share down, "
                   "batch p50 down)",
    },
    "residency": {
        "hint": "the mapped rows are not in the page cache: each cold row is a major fault that waits for "
                "the device",
        "fix": "Keep the hot rows resident or fetch them ahead: madvise(MADV_RANDOM) on the mapping (no "
               "readahead of pages the gather never uses), madvise(MADV_WILLNEED) on the next batch's rows "
               "early enough, or room in the page cache for the table's working set.",
        "confirm": "engramprof residency --rows TRACE (hot rows resident?), then a second "
                   "`engramprof diagnose --pid PID`",
    },
}


def advice(verdict: str, read_path: str = "syscalls") -> dict:
    """The advice for a verdict, fitted to the read path seen (``syscalls``, ``faults``, ``both``)."""
    if read_path == "faults" and verdict in ADVICE_FAULTS:
        return ADVICE_FAULTS[verdict]
    return ADVICE[verdict]
