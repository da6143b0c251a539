"""Readers on third-party libraries that serve tables (issue 23): faiss (an IVF-Flat index read
back with IO_FLAG_MMAP, searched by its OpenMP threads), LMDB (random ``get``s of a mapped
B-tree) and rocksdict (RocksDB's random ``get``s, buffered ``pread64`` of its SST files, no
block cache), each marking its steps with engramprof.markers.

    python -m tests.mapped_libs faiss|lmdb|rocksdict DIR MARKERS --seconds S [--mib N]
        [--evict] [--join PROCS] [--build-only]

Builds the index / database of about N MiB in DIR once (kept for the next run), prints
``ready PID`` on stderr, waits for SIGUSR1 (so the tracer is attached first), then runs steps
for S seconds.  ``--evict``: before each step the files are dropped from the page cache
(MADV_DONTNEED on the mapping, POSIX_FADV_DONTNEED, never a read), so every step reads its pages
from the device; without it the whole table is read once first (warm).  ``--join PROCS``: the
reader writes its pid to a cgroup's ``cgroup.procs`` before it touches the table, so every page
it reads is charged to that group.  Readahead is left as the library leaves it.

On exit prints one JSON line: steps, the process's own ``majflt`` growth over the steps
(/proc/self/stat), and per step its monotonic [start, end) with the growth of ``majflt`` and
of ``syscr`` (/proc/self/io: read syscalls) inside it -- the kernel's counts to hold a trace's
against.
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
MIB = 64  # default table size
LMDB_VALUE = 4000  # one overflow page each (a 4096-byte value takes two)
ROCKS_VALUE = 4000  # one value a 4 KiB data block
GETS = 64  # per step (LMDB, rocksdict)
MAJFLT = 9  # /proc/PID/stat field 12, after the ")" of the name
#: read syscalls of the counters' own between two snapshots: the first one's two preads (of
#: /proc/self/io, then /proc/self/stat); the second one's io value excludes its own read
SNAPSHOT_READS = 2


class Counters:
    """The kernel's counts of this process: majflt and syscr, one pread64 each."""

    def __init__(self):
        self.stat = os.open("/proc/self/stat", os.O_RDONLY)
        self.io = os.open("/proc/self/io", os.O_RDONLY)

    def read(self) -> tuple[int, int]:
        io = os.pread(self.io, 4096, 0).decode()  # syscr as before this read
        stat = os.pread(self.stat, 4096, 0)
        syscr = int(next(l for l in io.splitlines() if l.startswith("syscr:")).split()[1])
        return int(stat.rsplit(b")", 1)[1].split()[MAJFLT]), syscr


def majflt() -> int:
    with open("/proc/self/stat", "rb") as f:
        return int(f.read().rsplit(b")", 1)[1].split()[MAJFLT])


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
        os.fdatasync(fd)  # a dirty page (a table just written) is never dropped
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def faiss_reader(d: str, mib: int):
    """(table files, step, read the whole table once)"""
    import faiss

    path = os.path.join(d, "ivf.index")
    if not os.path.exists(path):
        rng = np.random.default_rng(1)
        x = rng.random(((mib << 20) // (DIM * 4), DIM), dtype=np.float32)
        q = faiss.IndexFlatL2(DIM)
        index = faiss.IndexIVFFlat(q, DIM, 256)
        index.train(x[:20_000])
        index.add(x)
        faiss.write_index(index, path + ".tmp")
        os.rename(path + ".tmp", path)
    index = faiss.read_index(path, faiss.IO_FLAG_MMAP)
    rng = np.random.default_rng(2)

    def step():
        index.nprobe = 16
        index.search(rng.random((QUERIES, DIM), dtype=np.float32), 10)

    def whole():
        index.nprobe = index.nlist  # every inverted list
        index.search(rng.random((1, DIM), dtype=np.float32), 10)

    return [path], step, whole


def lmdb_reader(d: str, mib: int):
    import lmdb

    n = (mib << 20) // 4096
    path = os.path.join(d, "data.mdb")
    if not os.path.exists(path):
        env = lmdb.open(d, map_size=4 * (mib << 20) + (64 << 20), subdir=True)
        val = np.random.default_rng(1).bytes(LMDB_VALUE)
        for lo in range(0, n, 16_000):  # a transaction per 64 MiB
            with env.begin(write=True) as txn:
                for i in range(lo, min(n, lo + 16_000)):
                    txn.put(i.to_bytes(8, "big"), val)
        env.close()
    env = lmdb.open(d, readonly=True, lock=False, subdir=True)
    n = env.stat()["entries"]
    rng = np.random.default_rng(2)

    def step():
        with env.begin(buffers=True) as txn:
            for k in rng.integers(0, n, GETS).tolist():
                bytes(txn.get(int(k).to_bytes(8, "big")))

    def whole():
        with env.begin(buffers=True) as txn:
            for _k, v in txn.cursor():
                bytes(v)

    return [path], step, whole


def rocksdict_reader(d: str, mib: int):
    import rocksdict as r

    n = (mib << 20) // 4096
    if not os.path.exists(os.path.join(d, "CURRENT")):
        opt = r.Options(raw_mode=True)
        opt.create_if_missing(True)
        db = r.Rdict(d, opt)
        val = np.random.default_rng(1).bytes(ROCKS_VALUE)
        for i in range(n):
            db[i.to_bytes(8, "big")] = val
        db.flush()
        db.compact_range(None, None)
        db.close()
    opt = r.Options(raw_mode=True)
    bo = r.BlockBasedOptions()
    bo.disable_cache()  # every get reads its block from the page cache or the device
    opt.set_block_based_table_factory(bo)
    db = r.Rdict(d, opt, access_type=r.AccessType.read_only())
    rng = np.random.default_rng(2)
    files = [os.path.join(d, f) for f in sorted(os.listdir(d)) if f.endswith(".sst")]

    def step():
        for k in rng.integers(0, n, GETS).tolist():
            assert db[int(k).to_bytes(8, "big")] is not None

    def whole():
        for f in files:  # as RocksDB reads them: buffered, into the page cache
            with open(f, "rb") as fh:
                while fh.read(1 << 20):
                    pass

    return files, step, whole


def counts_against_the_kernel(bundle: str, report: dict) -> dict:
    """Over the steps recorded whole (inside the bundle's window), the trace's major faults and
    read syscalls of the reader against the kernel's growth of its ``majflt`` and ``syscr``
    over the same steps (``report``: the reader's JSON line)."""
    from engramprof import trace

    b = trace.load_bundle(bundle)
    c = b.calls
    start, end = b.meta["start_ns"], b.meta["end_ns"]
    steps = np.array([s for s in report["per_step"] if s[0] >= start and s[1] <= end], dtype=np.int64).reshape(-1, 4)
    ts = c["ts_ns"].to_numpy(np.int64)
    i = np.searchsorted(steps[:, 0], ts, side="right") - 1  # the step each event began in
    inside = (i >= 0) & (ts < steps[np.maximum(i, 0), 1]) if len(steps) else np.zeros(len(ts), bool)
    kind = c["kind"].astype(str).to_numpy()
    major = c["major"].fillna(False).astype(bool).to_numpy() if "major" in c.columns else np.zeros(len(c), bool)
    return {"steps": len(steps), "major_faults": int((inside & (kind == "fault") & major).sum()),
            "kernel_majflt": int(steps[:, 2].sum()), "read_syscalls": int((inside & (kind == "syscall")).sum()),
            "kernel_syscr": int(steps[:, 3].sum())}


READERS = {"faiss": faiss_reader, "lmdb": lmdb_reader, "rocksdict": rocksdict_reader}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("lib", choices=sorted(READERS))
    ap.add_argument("dir")
    ap.add_argument("markers")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--mib", type=int, default=MIB)
    ap.add_argument("--evict", action="store_true")
    ap.add_argument("--join", help="a cgroup's procs file: join it before touching the table")
    ap.add_argument("--gap-ms", type=float, default=5.0)
    ap.add_argument("--build-only", action="store_true")
    a = ap.parse_args(argv)
    if a.join:
        with open(a.join, "w") as f:
            f.write(str(os.getpid()))
    os.makedirs(a.dir, exist_ok=True)
    files, step, whole = READERS[a.lib](a.dir, a.mib)
    if a.build_only:
        return 0
    if not a.evict:
        whole()  # warm: the whole table has been read once
        for _ in range(20):
            step()
    go = [False]
    signal.signal(signal.SIGUSR1, lambda *_: go.__setitem__(0, True))
    w = markers.MarkerWriter(a.markers)
    print(f"ready {os.getpid()}", file=sys.stderr, flush=True)
    while not go[0]:
        time.sleep(0.01)
    c = Counters()
    m0, steps, end = majflt(), 0, time.monotonic() + a.seconds
    per_step = []
    while time.monotonic() < end:
        if a.evict:
            for f in files:
                evict(f)
        before = c.read()
        t0 = time.monotonic_ns()
        with w.batch(step=steps):
            step()
        t1 = time.monotonic_ns()
        after = c.read()
        per_step.append([t0, t1, after[0] - before[0], after[1] - before[1] - SNAPSHOT_READS])
        steps += 1
        time.sleep(a.gap_ms / 1e3)
    w.close()
    print(json.dumps({"steps": steps, "majflt": majflt() - m0, "per_step": per_step}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
