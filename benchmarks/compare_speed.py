#!/usr/bin/env python3
"""compare --ranks speed: 4 synthetic rank bundles of 5M calls each, wall time and peak RSS.

    .venv/bin/python benchmarks/compare_speed.py                  # 4 ranks x 5M calls
    .venv/bin/python benchmarks/compare_speed.py --ranks 8 --calls 1e6

Bundles are built like benchmarks/analysis_speed.py's (decode batches of 96 reads from a
32-thread pool, ~1 ms each, a 2-20 ms forward pass between; 85% cached, 10% with cold reads,
5% with a few throttled reads), every rank on the same step timeline with markers carrying a
shared step id; rank 1 has 3x the cold batches (the straggler).  Then `engramprof compare
--ranks` runs in a child process of its own (the command line as a user runs it, --json), and
its wall time and peak RSS (getrusage of the child) are printed.
"""
from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

REPO = Path(__file__).resolve().parent.parent
T0 = 5_000_000_000_000
PER_BATCH = 96
THREADS = 32


def build(path: Path, n_calls: int, rank: int, straggler: int, chunk: int = 10_000) -> dict:
    from engramprof.trace import CALL_SCHEMA, TraceWriter

    timeline = np.random.default_rng(12345)        # the steps' timeline: the same on every rank
    rng = np.random.default_rng(rank)
    nb_total = max(1, n_calls // PER_BATCH)
    w = TraceWriter(path, meta={"pid": 4242, "synthetic": "benchmarks/compare_speed.py", "rank": rank})
    start, step0 = T0, 0
    cold_p = 0.30 if rank == straggler else 0.10
    with open(path.parent / f"{path.name}.markers.jsonl", "w") as mk:
        for c0 in range(0, nb_total, chunk):
            nb = min(chunk, nb_total - c0)
            gap = np.exp(timeline.uniform(np.log(4e6), np.log(20e6), nb)).astype(np.int64)
            kind = rng.random(nb)
            off = np.sort(rng.integers(0, 950_000, (nb, PER_BATCH)), axis=1)
            dur = rng.integers(2_000, 5_000, (nb, PER_BATCH))
            cold = (kind[:, None] < cold_p) & (rng.random((nb, PER_BATCH)) < 0.3)
            dur = np.where(cold, rng.integers(100_000, 300_000, (nb, PER_BATCH)), dur)
            slow = (kind[:, None] < 0.05) & (rng.random((nb, PER_BATCH)) < 0.05)
            dur = np.where(slow, rng.integers(1_000_000, 2_000_000, (nb, PER_BATCH)), dur)
            pages = np.where(cold | slow, rng.integers(1, 4, (nb, PER_BATCH)), 0)
            bstart = start + np.r_[0, np.cumsum(gap[:-1])]
            start = int(bstart[-1] + gap[-1])
            ends = bstart + (off + dur).max(axis=1) + 20_000
            ts = (bstart[:, None] + 10_000 + off).ravel()
            dur, pages = dur.ravel(), pages.ravel()
            n = len(ts)
            miss = pages > 0
            io = np.where(miss, (dur * 0.9).astype(np.int64), 0)
            offset = rng.integers(0, 1 << 22, n) * 4096
            cols = {
                "ts_ns": ts, "dur_ns": dur, "pid": np.full(n, 4242, np.int32),
                "tid": (rng.integers(0, THREADS, n) + 1000).astype(np.int32),
                "path": pa.array(np.full(n, "/data/engram/table0.safetensors", dtype=object)).dictionary_encode().cast(pa.string()),
                "offset": offset, "size": np.full(n, 4096), "ret": np.full(n, 4096), "flags": np.zeros(n, np.int64),
                "syscall": pa.array(np.full(n, "preadv2", dtype=object)).dictionary_encode().cast(pa.string()),
                "fd": np.full(n, 7, np.int32), "pages_added": pages.astype(np.int32),
                "bio_count": miss.astype(np.int32), "bio_ns": io, "reclaim_ns": np.zeros(n, np.int64),
                "offcpu_ns": io, "runq_ns": np.zeros(n, np.int64), "path_stale": np.zeros(n, bool),
                "tensor": pa.array(np.full(n, "engram.weight", dtype=object)).dictionary_encode().cast(pa.string()),
                "row": offset // 4096,
            }
            w.append_calls(pa.table({k: cols[k] for k in CALL_SCHEMA.names}))
            mk.write("".join(f'{{"start_ns":{s},"end_ns":{e},"tid":-1,"step":{step0 + i}}}\n'
                             for i, (s, e) in enumerate(zip(bstart.tolist(), ends.tolist()))))
            step0 += nb
    w.close()
    return {"calls": nb_total * PER_BATCH, "batches": nb_total}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--calls", type=float, default=5e6, help="calls per rank")
    ap.add_argument("--dir", default=None, help="build here (default: a temporary directory, removed)")
    ap.add_argument("--keep", action="store_true")
    a = ap.parse_args()
    sys.path.insert(0, str(REPO))
    d = Path(a.dir or tempfile.mkdtemp(prefix="engramprof-compare-bench-", dir="/var/tmp"))
    d.mkdir(parents=True, exist_ok=True)
    try:
        traces = []
        t0 = time.perf_counter()
        for r in range(a.ranks):
            p = d / f"rank={r}"
            if not p.exists():
                build(p, int(a.calls), r, straggler=1)
            traces.append(p)
        print(f"built {a.ranks} bundles of {int(a.calls):,} calls in {time.perf_counter() - t0:.1f} s", flush=True)
        argv = [sys.executable, "-m", "engramprof", "compare", "--ranks", *map(str, traces)]
        for p in traces:
            argv += ["--markers", str(p.parent / f"{p.name}.markers.jsonl")]
        argv += ["--json"]
        t0 = time.perf_counter()
        out = subprocess.run(argv, capture_output=True, text=True, cwd=REPO)
        wall = time.perf_counter() - t0
        rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20
        if out.returncode != 0:
            raise SystemExit(f"compare failed ({out.returncode}): {out.stderr}")
        doc = json.loads(out.stdout)
        print(f"compare --ranks, {a.ranks} ranks x {int(a.calls):,} calls: {wall:.1f} s wall, peak RSS {rss:.2f} GiB; "
              f"{doc['steps']:,} steps aligned by {doc['alignment']}; gating rank {doc['gating_rank']} "
              f"({next(r['gated_share'] for r in doc['ranks'] if r['rank'] == doc['gating_rank']):.0%} of steps, "
              f"top cause {next(r['top_cause'] for r in doc['ranks'] if r['rank'] == doc['gating_rank'])})")
    finally:
        if not a.keep and a.dir is None:
            shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
