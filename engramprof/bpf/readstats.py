"""User space of probes/readstats.h: the per-file read aggregates and the window sample budget
that `engramprof export` keeps in each of its programs (probes/export.bpf.c, and uring.bpf.c /
libaio.bpf.c compiled with EXPORT_MODE).  Every program has maps of the same names; these
functions read any of them."""
from __future__ import annotations

import ctypes

import numpy as np

from engramprof.trace.schema import READ_KINDS  # READ_KIND_* of probes/export.h, by code

STATS_MAP = "read_stats_by_file"
BUDGET_MAP = "sample_budget"


def kind_name(code: int) -> str:
    return READ_KINDS[code] if code < len(READ_KINDS) else str(code)


def read_stats(bpf) -> dict[tuple[int, int, str], dict]:
    """{(dev, ino, kind): {field of struct read_stats: total, 'latency_log2': counts}} summed over
    CPUs."""
    out = {}
    fields = None
    for k, per_cpu in bpf[STATS_MAP].items():
        if fields is None:
            fields = [f for f, _ in per_cpu[0]._fields_ if f != "latency_log2"]
        row = {f: sum(getattr(v, f) for v in per_cpu) for f in fields}
        hist = np.zeros(len(per_cpu[0].latency_log2), dtype=np.int64)
        for v in per_cpu:
            hist += np.ctypeslib.as_array(v.latency_log2).astype(np.int64)
        row["latency_log2"] = hist
        out[(int(k.dev), int(k.ino), kind_name(k.kind))] = row
    return out


def file_keys(bpf) -> list[tuple[int, int]]:
    """(dev, ino) of every key of the map (keys only: no per-CPU values read)."""
    return [(int(k.dev), int(k.ino)) for k in bpf[STATS_MAP].keys()]


def set_sample_budget(bpf, n: int) -> None:
    """Records for the program's next ``n`` reads (the window's sample)."""
    bpf[BUDGET_MAP][ctypes.c_int(0)] = ctypes.c_int64(n)
