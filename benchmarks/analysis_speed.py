#!/usr/bin/env python3
"""batch-tail analysis speed: build a synthetic N-call trace bundle (TraceWriter), load it with
load_bundle, run attribution.analyse, and print wall time and peak RSS.

    .venv/bin/python benchmarks/analysis_speed.py              # 1 and 10 million calls
    .venv/bin/python benchmarks/analysis_speed.py --calls 1e6  # quicker

    .venv/bin/python benchmarks/analysis_speed.py --calls 1e7 --dir D --against OLD --rounds 4

Each bundle is built, then loaded and analysed, in a child process of its own, so that the peak
RSS printed is that of loading and analysing only; 1M and 10M calls by default (how cost grows
with the trace).  Target on the 2-core development machine (issue 25): 10M calls loaded and
analysed in at most 2.5 s wall, peak RSS at most 0.8 GiB (moonshot: 2 s, 0.5 GiB).

``--against OLD``: side by side with another tree's engramprof (OLD/engramprof, e.g. ``git
archive COMMIT engramprof | tar -x -C OLD``): round by round, each tree's load + analyse in a
fresh process, the two interleaved (order alternating), medians and ratios printed.
``--against-dir OLD_DIR``: the old tree reads the bundle its own writer built there (before a
change of the trace writer), this tree the one in ``--dir``.
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
    from engramprof import trace as tracefmt
    from engramprof.trace import EVENT_READ_COLUMNS, load_bundle

    # what the command line leaves on disk (an older tree, --against, has no such argument)
    later = {"later": tracefmt.LATER_COLUMNS} if hasattr(tracefmt, "LATER_COLUMNS") else {}

    t0, c0 = time.perf_counter(), time.process_time()
    tr = load_bundle(trace, columns=EVENT_READ_COLUMNS, compact=True, **later)
    t1, c1 = time.perf_counter(), time.process_time()
    rss_load = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    res = analyse(tr)
    report.to_json(res.summary)
    t2, c2 = time.perf_counter(), time.process_time()
    s = res.summary
    return {"calls": len(tr.calls), "batches": s["batches"], "verdict": s["verdict"], "gap_ms": s["gap_ms"],
            "load_s": t1 - t0, "load_cpu_s": c1 - c0, "analyse_s": t2 - t1, "analyse_cpu_s": c2 - c1,
            "rss_load_gib": rss_load, "rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}


def _measure_in(tree: Path | None, trace: Path) -> dict:
    """--measure in a fresh process, with ``tree``'s engramprof first on its path (None: this one)."""
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = str(tree)
    out = subprocess.run([sys.executable, __file__, "--measure", str(trace)], check=True, capture_output=True,
                         text=True, env=env, cwd=str(tree) if tree is not None else None)
    return json.loads(out.stdout.strip().splitlines()[-1])


def against(old: Path, base: Path | None, n: int, rounds: int, old_base: Path | None = None) -> int:
    """Old tree and this one, side by side (see the module's help); ``old_base``: the old tree
    reads its bundle from there (one its own writer built), this tree from ``base``."""
    if base is None or not (base / f"bench-{n}").exists():
        raise SystemExit("--against needs --dir holding an already built bench-N bundle (run without --against first)")
    if old_base is not None and not (old_base / f"bench-{n}").exists():
        raise SystemExit(f"--against-dir: no bench-{n} bundle in {old_base}")
    traces = {"before": (old_base or base) / f"bench-{n}", "after": base / f"bench-{n}"}
    arms = {"before": old.resolve(), "after": None}
    res: dict = {a: [] for a in arms}
    loads = [os.getloadavg()]
    for r in range(rounds):
        for a in (list(arms) if r % 2 == 0 else list(arms)[::-1]):
            res[a].append(_measure_in(arms[a], traces[a]))
        loads.append(os.getloadavg())
    keys = ("load_s", "analyse_s", "load_cpu_s", "analyse_cpu_s", "rss_load_gib", "rss_gib")
    med = {a: {k: float(np.median([x[k] for x in v])) for k in keys} for a, v in res.items()}
    for a in med:
        med[a]["total_s"] = float(np.median([x["load_s"] + x["analyse_s"] for x in res[a]]))
        med[a]["cpu_s"] = float(np.median([x["load_cpu_s"] + x["analyse_cpu_s"] for x in res[a]]))
    print(f"{n:,} calls, {rounds} rounds, before ({old}) and after (this tree) interleaved; load average (1 min) "
          f"{min(x[0] for x in loads):.1f} to {max(x[0] for x in loads):.1f} on {os.cpu_count()} CPUs")
    print(f"{'':8} {'load s':>7} {'cpu':>6} {'analyse s':>9} {'cpu':>6} {'total s':>8} {'cpu':>6} "
          f"{'RSS load':>8} {'peak GiB':>8}")
    for a, m in med.items():
        print(f"{a:8} {m['load_s']:7.2f} {m['load_cpu_s']:6.2f} {m['analyse_s']:9.2f} {m['analyse_cpu_s']:6.2f} "
              f"{m['total_s']:8.2f} {m['cpu_s']:6.2f} {m['rss_load_gib']:8.2f} {m['rss_gib']:8.2f}")
    b, a = med["before"], med["after"]
    print(f"after / before: wall {a['total_s'] / b['total_s']:.2f}, CPU {a['cpu_s'] / b['cpu_s']:.2f} "
          f"(load {a['load_cpu_s'] / b['load_cpu_s']:.2f}, analyse {a['analyse_cpu_s'] / b['analyse_cpu_s']:.2f}), "
          f"peak RSS {a['rss_gib'] / b['rss_gib']:.2f}")
    print("rounds (wall s / CPU s / peak GiB): " + "; ".join(
        f"{k} " + ", ".join(f"{x['load_s'] + x['analyse_s']:.2f}/{x['load_cpu_s'] + x['analyse_cpu_s']:.2f}/"
                            f"{x['rss_gib']:.2f}" for x in v) for k, v in res.items()))
    ok = a["total_s"] <= 2.5 and a["rss_gib"] <= 0.8
    quiet = max(x[0] for x in loads) <= 2
    print("target (<= 2.5 s, <= 0.8 GiB):", ("met" if ok else "NOT met") +
          ("" if quiet else " -- load average > 2: wall time says little, read the CPU columns"))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=float, action="append", default=None,
                    help="trace size (repeatable; default: 1e6 and 1e7)")
    ap.add_argument("--dir", type=Path, default=None, help="where to build the bundles (default: a temp dir, removed)")
    ap.add_argument("--numpy-hugepages", action="store_true",
                    help="keep NumPy's huge-page advice (the command line turns it off: engramprof/host/pages.py)")
    ap.add_argument("--against", type=Path, default=None, help="side by side with this tree's engramprof (see above)")
    ap.add_argument("--against-dir", type=Path, default=None,
                    help="--against: the old tree reads its bench-N bundle from this directory (one its own "
                         "writer built: a change of the trace's files measured with the analysis)")
    ap.add_argument("--rounds", type=int, default=3, help="--against: rounds")
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

    if args.against:
        return against(args.against, args.dir, sizes[-1], args.rounds, args.against_dir)
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
        ok = total <= 2.5 and r["rss_gib"] <= 0.8
        print("target at 10M calls (<= 2.5 s, <= 0.8 GiB):", "met" if ok else "NOT met")
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
