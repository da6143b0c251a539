#!/usr/bin/env python3
"""batch-tail analysis speed: build a synthetic N-call trace bundle (TraceWriter), load it with
load_bundle, run attribution.analyse, and print wall time and peak RSS.

    .venv/bin/python benchmarks/analysis_speed.py              # 1 and 10 million calls
    .venv/bin/python benchmarks/analysis_speed.py --calls 1e6  # quicker

Each bundle is built, then loaded and analysed, in a child process of its own, so that the peak
RSS printed is that of loading and analysing only; 1M and 10M calls by default (how cost grows
with the trace).  Target on the 2-core development machine: 10M calls loaded and analysed in at
most 5 s wall, peak RSS at most 1.5 GiB.
The shape: decode batches of 96 reads from a 32-thread pool, ~1 ms each, separated by a 2-20 ms
forward pass; 85% cached batches, 10% with cold reads (pages inserted, bio waits), 5% with a
few throttled 5-20 ms reads; threads/vmstat/psi samples at 10 Hz.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

T0 = 5_000_000_000_000
PER_BATCH = 96
THREADS = 32
FILES = ["/data/engram/table0.safetensors", "/data/engram/table1.safetensors"]


def _dict_strings(codes: np.ndarray, values: list[str]) -> pa.Array:
    return pa.DictionaryArray.from_arrays(pa.array(codes.astype(np.int32)), pa.array(values)).cast(pa.string())


def build(path: Path, n_calls: int, seed: int = 0, chunk_batches: int = 10_000) -> dict:
    from engramprof.trace import CALL_SCHEMA, TraceWriter

    rng = np.random.default_rng(seed)
    nb_total = max(1, n_calls // PER_BATCH)
    w = TraceWriter(path, meta={"pid": 4242, "synthetic": "benchmarks/analysis_speed.py"})
    start = T0
    written = 0
    for c0 in range(0, nb_total, chunk_batches):
        nb = min(chunk_batches, nb_total - c0)
        kind = rng.random(nb)  # < 0.05 storage, < 0.15 cold, else cached
        off = np.sort(rng.integers(0, 950_000, (nb, PER_BATCH)), axis=1)
        dur = rng.integers(2_000, 5_000, (nb, PER_BATCH))
        pages = np.zeros((nb, PER_BATCH), dtype=np.int64)
        cold = (kind[:, None] < 0.15) & (rng.random((nb, PER_BATCH)) < 0.3)
        dur = np.where(cold, rng.integers(100_000, 300_000, (nb, PER_BATCH)), dur)
        pages = np.where(cold, rng.integers(1, 4, (nb, PER_BATCH)), pages)
        slow = (kind[:, None] < 0.05) & (rng.random((nb, PER_BATCH)) < 0.05)
        dur = np.where(slow, rng.integers(5_000_000, 20_000_000, (nb, PER_BATCH)), dur)
        pages = np.where(slow, 1, pages)
        span = (off + dur).max(axis=1)
        gap = np.exp(rng.uniform(np.log(2e6), np.log(20e6), nb)).astype(np.int64)
        bstart = start + np.r_[0, np.cumsum(span + gap)[:-1]]
        start = int(bstart[-1] + span[-1] + gap[-1])
        ts = (bstart[:, None] + off).ravel()
        dur = dur.ravel()
        pages = pages.ravel()
        n = len(ts)
        miss = pages > 0
        io = np.where(miss, (dur * 0.9).astype(np.int64), 0)
        offset = rng.integers(0, 1 << 22, n) * 4096
        tid = rng.integers(0, THREADS, n) + 1000
        cols = {
            "ts_ns": ts, "dur_ns": dur, "pid": np.full(n, 4242, np.int32), "tid": tid.astype(np.int32),
            "path": _dict_strings(rng.integers(0, len(FILES), n), FILES), "offset": offset,
            "size": np.full(n, 4096), "ret": np.full(n, 4096), "flags": np.zeros(n, np.int64),
            "syscall": _dict_strings(np.zeros(n, np.int64), ["preadv2"]), "fd": np.full(n, 7, np.int32),
            "pages_added": pages.astype(np.int32), "bio_count": miss.astype(np.int32), "bio_ns": io,
            "reclaim_ns": np.zeros(n, np.int64), "offcpu_ns": io + np.where(miss, 2_000, 0),
            "runq_ns": np.where(rng.random(n) < 0.02, 20_000, 0).clip(0, dur),
            "path_stale": np.zeros(n, bool), "tensor": _dict_strings(np.zeros(n, np.int64), ["engram.weight"]),
            "row": offset // 4096,
        }
        w.append_calls(pa.table({k: cols[k] for k in CALL_SCHEMA.names}))
        written += n
    # 10 Hz samples
    xs = np.arange(T0 - 10**8, start + 2 * 10**8, 10**8)
    k = len(xs)
    tids = np.arange(THREADS) + 1000
    w.append_samples("threads", pa.table({
        "ts_ns": np.tile(xs, THREADS), "tid": np.repeat(tids, k),
        "name": pa.array(["ThreadPoolExecutor"] * (k * THREADS)),
        "ctx_voluntary": np.tile(np.arange(k) * 900, THREADS), "ctx_involuntary": np.tile(np.arange(k) * 9, THREADS),
        "utime_s": np.tile(np.arange(k) * 0.01, THREADS), "stime_s": np.tile(np.arange(k) * 0.02, THREADS),
    }))
    w.append_samples("vmstat", pa.table({"ts_ns": xs, "workingset_refault_file": rng.integers(0, 50, k)}))
    w.append_samples("psi", pa.table({
        "ts_ns": np.tile(xs, 3), "resource": pa.array(["cpu"] * k + ["memory"] * k + ["io"] * k),
        "some_us": np.tile(np.arange(k) * 1000, 3), "full_us": np.tile(np.arange(k) * 100, 3),
    }))
    w.close()
    return {"calls": written, "batches": nb_total}


def measure(trace: Path, numpy_hugepages: bool = False) -> dict:
    """Load (the analysis's columns, compact) and analyse one bundle in this process."""
    from engramprof.report import batch_tail as report
    from engramprof.analysis.attribution import analyse
    from engramprof.host.pages import prefer_small_pages

    if not numpy_hugepages:
        prefer_small_pages()  # what the command line does
    from engramprof.trace import EVENT_READ_COLUMNS, load_bundle

    t0, c0 = time.perf_counter(), time.process_time()
    tr = load_bundle(trace, columns=EVENT_READ_COLUMNS, compact=True)
    t1, c1 = time.perf_counter(), time.process_time()
    rss_load = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    res = analyse(tr)
    report.to_json(res.summary)
    t2, c2 = time.perf_counter(), time.process_time()
    s = res.summary
    return {"calls": len(tr.calls), "batches": s["batches"], "verdict": s["verdict"], "gap_ms": s["gap_ms"],
            "load_s": t1 - t0, "load_cpu_s": c1 - c0, "analyse_s": t2 - t1, "analyse_cpu_s": c2 - c1,
            "rss_load_gib": rss_load, "rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=float, action="append", default=None,
                    help="trace size (repeatable; default: 1e6 and 1e7)")
    ap.add_argument("--dir", type=Path, default=None, help="where to build the bundles (default: a temp dir, removed)")
    ap.add_argument("--numpy-hugepages", action="store_true",
                    help="keep NumPy's huge-page advice (the command line turns it off: engramprof/host/pages.py)")
    ap.add_argument("--build-only", type=Path, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--measure", type=Path, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    sizes = [int(c) for c in (args.calls or [1e6, 1e7])]
    if args.build_only:
        t = time.perf_counter()
        info = build(args.build_only, sizes[0])
        info["build_s"] = time.perf_counter() - t
        print(json.dumps(info))
        return 0
    if args.measure:
        print(json.dumps(measure(args.measure, args.numpy_hugepages)))
        return 0

    tmp = None
    base = args.dir
    if base is None:
        tmp = tempfile.mkdtemp(prefix="engramprof-bench-")
        base = Path(tmp)
    results = []
    try:
        for n in sizes:
            trace = base / f"bench-{n}"
            if not trace.exists():
                out = subprocess.run([sys.executable, __file__, "--calls", str(n), "--build-only", str(trace)],
                                     check=True, capture_output=True, text=True)
                built = json.loads(out.stdout.strip().splitlines()[-1])
                print(f"built {built['calls']:,} calls in {built['batches']:,} batches in {built['build_s']:.1f} s")
            # a fresh process per size: its peak RSS is that of loading and analysing only
            cmd = [sys.executable, __file__, "--measure", str(trace)] + (["--numpy-hugepages"] if args.numpy_hugepages else [])
            out = subprocess.run(cmd, check=True, capture_output=True, text=True)
            r = json.loads(out.stdout.strip().splitlines()[-1])
            results.append(r)
            print(f"{r['calls']:>11,} calls  {r['batches']:,} batches  gap {r['gap_ms']:.3f} ms  verdict {r['verdict']}")
            print(f"  load          {r['load_s']:6.2f} s wall {r['load_cpu_s']:6.2f} s CPU  "
                  f"(peak RSS after load {r['rss_load_gib']:.2f} GiB)")
            print(f"  analyse       {r['analyse_s']:6.2f} s wall {r['analyse_cpu_s']:6.2f} s CPU")
        if len(results) > 1:
            a, b = results[0], results[-1]
            k = b["calls"] / a["calls"]
            print(f"growth x{k:.0f} calls: load x{b['load_s'] / a['load_s']:.1f}, analyse x{b['analyse_s'] / a['analyse_s']:.1f}, "
                  f"peak RSS x{b['rss_gib'] / a['rss_gib']:.1f}")
        r = results[-1]
        la = os.getloadavg()[0]
        total = r["load_s"] + r["analyse_s"]
        print(f"load+analyse {total:.1f} s wall {r['load_cpu_s'] + r['analyse_cpu_s']:.1f} s CPU for {r['calls']:,} calls  "
              f"peak RSS {r['rss_gib']:.2f} GiB  (cpus: {os.cpu_count()}, load average {la:.1f}: other work on the "
              "machine inflates wall time)")
        ok = total <= 5 and r["rss_gib"] <= 1.5
        print("target at 10M calls (<= 5 s, <= 1.5 GiB):", "met" if ok else "NOT met")
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
