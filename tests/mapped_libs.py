"""Readers on third-party libraries that serve from a mapping (issue 23): faiss (an IVF-Flat
index read back with IO_FLAG_MMAP, searched by its OpenMP threads) and LMDB (random ``get``s
of a mapped B-tree), each marking its steps with engramprof.markers.

    python -m tests.mapped_libs faiss|lmdb DIR MARKERS --seconds S [--evict] [--build-only]

Builds the index / database in DIR once (kept for the next run), prints ``ready PID`` on
stderr, waits for SIGUSR1 (so the tracer is attached first), then runs steps for S seconds.
``--evict``: before each step the file is dropped from the page cache (POSIX_FADV_DONTNEED,
never a read), so every step faults its pages in from the device.  Readahead is left as the
library leaves it.  On exit prints one JSON line: steps, and the process's own ``majflt``
growth over the steps (/proc/self/stat).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

import numpy as np

from engramprof import markers

DIM = 64
QUERIES = 16  # per step: the search itself stays small beside its faults
FAISS_VECTORS = 250_000  # 250k x 64 floats: ~64 MiB of inverted lists
LMDB_VALUES = 16_000  # 16k x 4 KiB values (each on its own overflow page): ~64 MiB
LMDB_VALUE = 4000  # one overflow page each (a 4096-byte value takes two)


def majflt() -> int:
    with open("/proc/self/stat", "rb") as f:
        return int(f.read().rsplit(b")", 1)[1].split()[9])


def _unmap_pages(path: str) -> None:
    """MADV_DONTNEED on this process's mappings of ``path``: the page-table entries go (the
    page cache keeps the pages), so that fadvise can drop them (a mapped page is never dropped)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    real = os.path.realpath(path)
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(None, 5)
            if len(parts) == 6 and parts[5].strip() == real:
                lo, hi = (int(x, 16) for x in parts[0].split("-"))
                libc.madvise(lo, hi - lo, 4)  # MADV_DONTNEED


def evict(path: str) -> None:
    _unmap_pages(path)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def faiss_reader(d: str):
    import faiss

    path = os.path.join(d, "ivf.index")
    if not os.path.exists(path):
        rng = np.random.default_rng(1)
        x = rng.random((FAISS_VECTORS, DIM), dtype=np.float32)
        q = faiss.IndexFlatL2(DIM)
        index = faiss.IndexIVFFlat(q, DIM, 256)
        index.train(x[:20_000])
        index.add(x)
        faiss.write_index(index, path + ".tmp")
        os.rename(path + ".tmp", path)
    index = faiss.read_index(path, faiss.IO_FLAG_MMAP)
    index.nprobe = 16
    rng = np.random.default_rng(2)

    def step():
        index.search(rng.random((QUERIES, DIM), dtype=np.float32), 10)

    return path, step


def lmdb_reader(d: str):
    import lmdb

    path = os.path.join(d, "data.mdb")
    if not os.path.exists(path):
        env = lmdb.open(d, map_size=1 << 30, subdir=True)
        val = np.random.default_rng(1).bytes(LMDB_VALUE)
        with env.begin(write=True) as txn:
            for i in range(LMDB_VALUES):
                txn.put(i.to_bytes(8, "big"), val)
        env.close()
    env = lmdb.open(d, readonly=True, lock=False, subdir=True)
    rng = np.random.default_rng(2)

    def step():
        with env.begin(buffers=True) as txn:
            for k in rng.integers(0, LMDB_VALUES, 64).tolist():
                bytes(txn.get(int(k).to_bytes(8, "big")))

    return path, step


READERS = {"faiss": faiss_reader, "lmdb": lmdb_reader}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("lib", choices=sorted(READERS))
    ap.add_argument("dir")
    ap.add_argument("markers")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--evict", action="store_true")
    ap.add_argument("--gap-ms", type=float, default=5.0)
    ap.add_argument("--build-only", action="store_true")
    a = ap.parse_args(argv)
    os.makedirs(a.dir, exist_ok=True)
    path, step = READERS[a.lib](a.dir)
    if a.build_only:
        return 0
    if not a.evict:
        step()  # warm: the pages the steps touch are in the cache and mapped
        for _ in range(20):
            step()
    go = [False]
    signal.signal(signal.SIGUSR1, lambda *_: go.__setitem__(0, True))
    w = markers.MarkerWriter(a.markers)
    print(f"ready {os.getpid()}", file=sys.stderr, flush=True)
    while not go[0]:
        time.sleep(0.01)
    m0, steps, end = majflt(), 0, time.monotonic() + a.seconds
    while time.monotonic() < end:
        if a.evict:
            evict(path)
        with w.batch(step=steps):
            step()
        steps += 1
        time.sleep(a.gap_ms / 1e3)
    w.close()
    print(json.dumps({"steps": steps, "majflt": majflt() - m0}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
