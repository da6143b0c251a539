"""Which threads are Python threads and which are native (OpenMP, a library's own pool, io-wq).

``python-scheduling`` (futures, wake-ups, GIL hand-offs) is a cause only a Python thread can
have.  A native pool (faiss's OpenMP team, RocksDB's threads, io_uring's io-wq) waits for its
own work, not for the interpreter: its waits are named "native pool wait" and count with the
batch's work (cpu-copy), never as python-scheduling (docs/model.md, "Thread kinds").

Sources, the first that knows a thread wins:

1. ``tables/thread_kinds`` (tid, kind, source): any sampler that reads the interpreter's own
   thread states may fill it (a py-spy stack sampler lists exactly the threads that have a
   Python thread state);
2. the markers' ``python_tids`` (engramprof.markers writes ``threading.enumerate()``'s kernel
   ids whenever they change): a listed thread is Python; with such a list, every other thread
   of the process is native; without it, the table's Python threads are that list (read at
   each of the sampler's rounds): a thread the table does not hold at all lived between two
   rounds and was never listed -- native (faiss's per-search prefetch threads live ~13 ms);
3. the process: every thread of a process that runs no CPython interpreter is native (the
   recorder found no python3.X executable or libpython3.X.so among its executable mappings, and
   no stack sampler read an interpreter in it: fio, a C++ server, llama.cpp);
4. the thread's name (samples/threads, /proc/PID/task/TID/comm): ``iou-wrk-*`` / ``iou-sqp-*``
   are io_uring's workers (native); the main thread (tid = pid) runs the interpreter (Python);
   a name other than the process's is a library's own named pool (native); a thread named like
   the process is ``unknown`` -- CPython 3.x threads keep the process's name, and so do
   OpenMP's.  An unknown thread is treated as Python (the behaviour before thread kinds).

Failure modes: a native thread that calls into Python through ``PyGILState_Ensure`` is not in
``threading.enumerate()`` unless it asked for ``current_thread()`` (it is taken as native); a
Python thread renamed with prctl is taken as native by the name rule alone; a tid reused
after its thread exited keeps the first kind.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

PYTHON, NATIVE, UNKNOWN = "python", "native", "unknown"
IO_WQ_PREFIXES = ("iou-wrk-", "iou-sqp-", "io_wq")


def _listed(markers_df: pd.DataFrame | None) -> set[int] | None:
    """The union of the markers' python_tids lists (None: no marker carries one)."""
    if markers_df is None or "python_tids" not in markers_df.columns:
        return None
    out: set[int] = set()
    seen = False
    for v in markers_df["python_tids"]:
        if isinstance(v, (list, tuple)):
            seen = True
            out.update(int(t) for t in v if isinstance(t, (int, np.integer)) and not isinstance(t, bool))
    return out if seen else None


def _names(threads: pd.DataFrame | None) -> pd.DataFrame:
    """(pid, tid, name) of every sampled thread, its last name."""
    if threads is None or not len(threads) or not {"tid", "name"} <= set(threads.columns):
        return pd.DataFrame({"pid": pd.Series(dtype="int64"), "tid": pd.Series(dtype="int64"),
                             "name": pd.Series(dtype="object")})
    t = threads if "pid" in threads.columns else threads.assign(pid=-1)
    last = t.drop_duplicates("tid", keep="last")
    return pd.DataFrame({"pid": last["pid"].astype("int64").to_numpy(), "tid": last["tid"].astype("int64").to_numpy(),
                         "name": last["name"].astype(object).to_numpy()})


def not_cpython_pids(meta: dict | None) -> dict[int, str]:
    """{pid: why} of the recorded processes known not to run CPython: the recorder found no
    python3.X executable or libpython3.X.so among their executable mappings (meta ``processes``,
    ``cpython`` false, for the processes selected at the start; meta ``sampler.cpython`` for every
    process the sampler followed: --children's forks, a cgroup's members) and no stack sampler
    read an interpreter in them (meta ``stacks``)."""
    meta = meta or {}
    sampled = {int(p) for p in ((meta.get("stacks") or {}).get("processes") or []) if isinstance(p, int)}
    said: dict[int, tuple] = {}  # pid: (cpython, evidence); the recorder's own word first
    for pid, c in ((meta.get("sampler") or {}).get("cpython") or {}).items():  # every process sampled
        if str(pid).isdigit() and isinstance(c, dict):
            said[int(pid)] = (c.get("cpython"), c.get("evidence"))
    for p in meta.get("processes") or []:  # the processes selected at the start
        if isinstance(p, dict) and isinstance(p.get("pid"), int):
            said[p["pid"]] = (p.get("cpython"), p.get("cpython_evidence"))
    return {pid: f"the process is not CPython ({why or 'no interpreter mapped'})"
            for pid, (cpython, why) in sorted(said.items()) if cpython is False and pid not in sampled}


def kind_by_name(tid: int, pid: int, name: str, process_name: str | None) -> str:
    if any(str(name).startswith(p) for p in IO_WQ_PREFIXES):
        return NATIVE
    if pid > 0 and tid == pid:
        return PYTHON
    if process_name is None:
        return UNKNOWN
    return UNKNOWN if name == process_name else NATIVE


def thread_kinds(tids, markers_df: pd.DataFrame | None = None, threads: pd.DataFrame | None = None,
                 table: pd.DataFrame | None = None, not_cpython: dict[int, str] | None = None,
                 pid: int | None = None) -> pd.DataFrame:
    """One row per thread of ``tids`` (and of the samples): tid, name, kind (python | native |
    unknown) and source (how it is known).  ``not_cpython``: {pid: why} of processes that run no
    interpreter (:func:`not_cpython_pids`): every thread of theirs is native; ``pid``: the
    process of a tid the samples do not name."""
    names = _names(threads)
    all_tids = sorted({int(t) for t in tids if pd.notna(t)} | set(names["tid"].tolist()))
    name_of = dict(zip(names["tid"].tolist(), names["name"].tolist()))
    pid_of = dict(zip(names["tid"].tolist(), names["pid"].tolist()))
    proc_name = {int(p): name_of.get(int(p)) for p in set(pid_of.values()) if p > 0}
    given = {}
    if table is not None and len(table) and {"tid", "kind"} <= set(table.columns):
        src = table["source"] if "source" in table.columns else pd.Series("thread_kinds table", index=table.index)
        for t, k, s in zip(table["tid"].tolist(), table["kind"].tolist(), src.tolist()):
            if k in (PYTHON, NATIVE):
                given[int(t)] = (k, str(s))
    listed = _listed(markers_df)
    # the table's Python threads are the interpreter's list read at each of its rounds: with it,
    # a thread it never listed (one that lived between two rounds) is native, as with the markers'
    sampled = {t for t, (k, _s) in given.items() if k == PYTHON}
    rows = []
    for t in all_tids:
        name = name_of.get(t, "")
        if t in given:
            kind, source = given[t]
        elif listed is not None:
            kind = PYTHON if t in listed else NATIVE
            source = ("the interpreter's thread list (markers' python_tids)" if t in listed
                      else "not in the interpreter's thread list (markers' python_tids)")
        elif sampled:
            kind, source = NATIVE, "never in the interpreter's thread list (thread_kinds table's rounds)"
        elif not_cpython and (owner := int(pid_of.get(t, pid if pid is not None else -1))) in not_cpython:
            kind, source = NATIVE, not_cpython[owner]
        else:
            p = int(pid_of.get(t, -1))
            kind = kind_by_name(t, p, name, proc_name.get(p))
            source = f"thread name {name!r}" if name else "no name sampled"
        rows.append((t, name, kind, source))
    return pd.DataFrame(rows, columns=["tid", "name", "kind", "source"])


def native_mask(kinds: pd.DataFrame | None, tids: np.ndarray) -> np.ndarray | None:
    """Per tid of ``tids``: the thread is native (None: no thread is)."""
    if kinds is None or not len(kinds):
        return None
    native = set(kinds.loc[kinds["kind"] == NATIVE, "tid"].tolist())
    if not native:
        return None
    return np.array([pd.notna(t) and int(t) in native for t in tids], dtype=bool)


def summary(kinds: pd.DataFrame | None, reading=None) -> dict | None:
    """The summary's ``thread_kinds``: counts per kind over every sampled thread, and each
    thread that read or submitted (``reading``: their tids; at most 64 listed)."""
    if kinds is None or not len(kinds):
        return None
    shown = kinds if reading is None else kinds[kinds["tid"].isin([int(t) for t in reading if pd.notna(t)])]
    return {"counts": {k: int((kinds["kind"] == k).sum()) for k in (PYTHON, NATIVE, UNKNOWN)},
            "threads": [{"tid": int(r.tid), "name": r.name, "kind": r.kind, "source": r.source}
                        for r in shown.itertuples(index=False)][:64]}
