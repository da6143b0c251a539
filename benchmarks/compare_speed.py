#!/usr/bin/env python3
"""compare --ranks speed: 4 synthetic rank bundles of 5M calls each, wall time and peak RSS.

    .venv/bin/python benchmarks/compare_speed.py                  # 4 ranks x 5M calls
    .venv/bin/python benchmarks/compare_speed.py --ranks 8 --calls 1e7
    .venv/bin/python benchmarks/compare_speed.py --arms --calls 1e7 --rounds 3

``--arms``: how compare should read one rank's events, decided by measurement.  One bundle,
then, round by round in one run (arms interleaved, each in a fresh child process): ``bundle``
(engramprof's reader, ``load_bundle(columns=EVENT_READ_COLUMNS, compact=True)``),
``bundle-split`` (the same reader without ``tensor`` and ``row``, which only name a batch's
slowest call: compare's columns; each part read with ``pyarrow.parquet.read_table``, which
in pyarrow >= 15 is a one-file ``pyarrow.dataset``; a ``fragments`` arm, one dataset over the
bundle's parts each scanned as its fragment, was measured not cheaper and removed with the
reader's switch for it: benchmarks/RESULTS.md "Compare speed", commit 19b3e45),
``dataset`` (``pyarrow.dataset`` to_table of the same columns, then to_pandas), ``duckdb``
(``read_parquet`` of the same columns to Arrow, then to pandas), each followed by batch-tail's
analysis (``engramprof.analysis.analyse``, the cause split); and ``duckdb-sums``: DuckDB
making only the per-batch sums (calls, pages, I/O and off-CPU ms per marked batch, an ASOF
join on the markers) without any cause split.  Printed per arm: median read seconds (wall and
the child's CPU), analysis seconds, peak RSS (the child's getrusage), their ratios to
``bundle``, and whether the per-batch table (wall and cause ms) is identical to ``bundle``'s.

``--against OLD``: the fleet's ``compare --ranks DIR --json`` with another tree's engramprof
(OLD/engramprof, e.g. ``git archive COMMIT engramprof | tar -x -C OLD``) and with this one, round
by round in fresh processes (order alternating): wall time, the child's CPU time and its own
peak RSS (``os.wait4``), and whether the two JSON documents are identical.  ``--growth``: the
ranks read one after another in this process as compare reads them (``compare.load.load_ranks``),
printing after each rank its RSS then and its peak so far: whether memory grows with the
number of ranks.  Target (issue 25): 8 ranks of 10M calls in at most 30 s and 1.2 GiB.

Bundles are built like benchmarks/analysis_speed.py's (decode batches of 96 reads from a
32-thread pool, ~1 ms each, a 2-20 ms forward pass between; 85% cached, 10% with cold reads,
5% with a few throttled reads), every rank on the same step timeline with markers carrying a
shared step id (each bundle's own markers.jsonl); rank 1 has 3x the cold batches (the
straggler).  They are laid out as a fleet directory, DIR/host=hK/rank=R/trace (four ranks a
host).  Then `engramprof compare --ranks DIR` runs in a child process of its own (the command
line as a user runs it, --json), and its wall time and peak RSS (getrusage of the child) are
printed.
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
    path.parent.mkdir(parents=True, exist_ok=True)
    w = TraceWriter(path, meta={"pid": 4242, "synthetic": "benchmarks/compare_speed.py", "rank": rank})
    start, step0 = T0, 0
    cold_p = 0.30 if rank == straggler else 0.10
    marks = path.parent / f".{path.name}.markers.jsonl"
    with open(marks, "x") as mk:
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
    marks.rename(path / "markers.jsonl")  # the bundle carries its markers
    return {"calls": nb_total * PER_BATCH, "batches": nb_total}


def bundle_path(d: Path, rank: int) -> Path:
    """Rank ``rank``'s bundle in the fleet layout (four ranks a host)."""
    return d / f"host=h{rank // 4}" / f"rank={rank}" / "trace"


ARMS = ("bundle", "bundle-split", "dataset", "duckdb", "duckdb-sums")
TEXT = ("path", "tensor", "kind")


def _read_arm(arm: str, trace: Path, markers: Path):
    """One rank's events as the analysis takes them (a Trace), or the per-batch sums
    (``duckdb-sums``: a DataFrame)."""
    from engramprof.compare.ranks import MS_COLS  # noqa: F401  (import cost in every arm)
    from engramprof.trace import EVENT_READ_COLUMNS, Trace, load_bundle
    from engramprof.trace.reader import _read_meta, complete_parts

    if arm == "bundle":
        return load_bundle(trace, columns=EVENT_READ_COLUMNS, compact=True)
    if arm == "bundle-split":  # without tensor and row: the cause split's columns
        from engramprof.compare.load import SPLIT_COLUMNS

        return load_bundle(trace, columns=SPLIT_COLUMNS, compact=True)
    files = [str(h.path) for h in complete_parts(trace / "calls")]
    names = set(complete_parts(trace / "calls")[0].schema_arrow.names)
    cols = [c for c in EVENT_READ_COLUMNS if c in names]
    if arm == "dataset":
        import pyarrow.dataset as ds

        fmt = ds.ParquetFileFormat(read_options=ds.ParquetReadOptions(dictionary_columns=[c for c in TEXT if c in cols]))
        t = ds.dataset(files, format=fmt).to_table(columns=cols).unify_dictionaries()
        calls = t.to_pandas(self_destruct=True, split_blocks=True)
        del t
    else:
        import duckdb
        import pandas as pd

        con = duckdb.connect()
        con.execute("SET threads = 2")
        if arm == "duckdb-sums":
            mk = pd.read_json(markers, lines=True)[["start_ns", "end_ns", "step"]]
            con.register("mk", mk)
            df = con.sql(f"""SELECT m.step, any_value(m.end_ns - m.start_ns) / 1e6 AS wall_ms, count(*) AS calls,
                sum(c.pages_added) AS pages, sum(c.bio_ns) / 1e6 AS bio_ms, sum(c.offcpu_ns) / 1e6 AS offcpu_ms
                FROM read_parquet({files!r}) c ASOF JOIN mk m ON c.ts_ns >= m.start_ns
                WHERE c.ts_ns < m.end_ns GROUP BY m.step ORDER BY m.step""").df()
            con.close()
            return df
        sel = ", ".join(f'"{c}"' for c in cols)
        t = con.sql(f"SELECT {sel} FROM read_parquet({files!r})").to_arrow_table()
        con.close()
        calls = t.to_pandas(self_destruct=True, split_blocks=True)
        del t
        for c in TEXT:
            if c in calls.columns:
                calls[c] = calls[c].astype("category")
    if not calls["ts_ns"].is_monotonic_increasing:
        calls = calls.sort_values("ts_ns", kind="stable").reset_index(drop=True)
    return Trace(path=trace, meta=_read_meta(trace), calls=calls)


def child(arm: str, trace: Path, markers: Path) -> None:
    """One arm in this (fresh) process: JSON line with read_s, analyse_s, rss_gib, digest."""
    import hashlib

    from engramprof.analysis import batches
    from engramprof.analysis import analyse
    from engramprof.compare.ranks import MS_COLS

    t0, c0 = time.perf_counter(), time.process_time()
    got = _read_arm(arm, trace, markers)
    t1, c1 = time.perf_counter(), time.process_time()
    digest, n = None, len(got) if arm == "duckdb-sums" else None
    if arm != "duckdb-sums":
        mdf, bad = batches.read_markers(markers)
        table, _ = analyse(got, mdf, slow_ms=4.0, markers_bad_lines=bad, top=1)
        n = len(table)
        digest = hashlib.sha1(np.round(table[["wall_ms", *MS_COLS]].to_numpy(np.float64), 9).tobytes()).hexdigest()[:12]
    t2 = time.perf_counter()
    print(json.dumps({"arm": arm, "read_s": t1 - t0, "read_cpu_s": c1 - c0, "analyse_s": t2 - t1, "batches": n,
                      "digest": digest,
                      "rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}))


def arms(d: Path, calls: int, rounds: int, only: list[str] | None = None) -> None:
    import os

    p = bundle_path(d, 0)
    if not p.exists():
        build(p, calls, 0, straggler=1)
    m = p / "markers.jsonl"
    use = tuple(a for a in ARMS if not only or a in only or a == "bundle")
    res: dict[str, list[dict]] = {a: [] for a in use}
    load = [os.getloadavg()]
    for r in range(rounds):
        for arm in (use if r % 2 == 0 else use[::-1]):
            out = subprocess.run([sys.executable, __file__, "--child", arm, str(p), str(m)], capture_output=True,
                                 text=True, cwd=REPO)
            if out.returncode != 0:
                raise SystemExit(f"arm {arm} failed: {out.stderr[-2000:]}")
            res[arm].append(json.loads(out.stdout.strip().splitlines()[-1]))
        load.append(os.getloadavg())
    med = {a: {k: float(np.median([x[k] for x in v])) for k in ("read_s", "read_cpu_s", "analyse_s", "rss_gib")}
           for a, v in res.items()}
    ref = med["bundle"]
    print(f"one bundle of {calls:,} calls ({res['bundle'][0]['batches']:,} batches), {rounds} round(s), arms "
          f"interleaved; load average (1 min) from {min(x[0] for x in load):.1f} to {max(x[0] for x in load):.1f}")
    print(f"{'arm':<12} {'read s':>7} {'read cpu':>8} {'analyse s':>9} {'total s':>8} {'peak GiB':>8}   vs bundle: read"
          "  read cpu  total  peak   table")
    for a in use:
        x = med[a]
        tot, rtot = x["read_s"] + x["analyse_s"], ref["read_s"] + ref["analyse_s"]
        same = ("no split (sums only)" if a == "duckdb-sums" else
                "identical" if {r["digest"] for r in res[a]} == {res["bundle"][0]["digest"]} else "DIFFERENT")
        print(f"{a:<12} {x['read_s']:7.2f} {x['read_cpu_s']:8.2f} {x['analyse_s']:9.1f} {tot:8.1f} {x['rss_gib']:8.2f}   "
              f"{x['read_s'] / ref['read_s']:14.2f} {x['read_cpu_s'] / max(ref['read_cpu_s'], 1e-9):9.2f} "
              f"{tot / rtot:6.2f} {x['rss_gib'] / ref['rss_gib']:5.2f}   {same}")
    print("rounds (read s / read CPU s / peak GiB): " + "; ".join(
        f"{a} " + ", ".join(f"{r['read_s']:.2f}/{r['read_cpu_s']:.2f}/{r['rss_gib']:.2f}" for r in res[a]) for a in use))


def against(old: Path, d: Path, rounds: int) -> None:
    """This tree's compare --ranks and ``old``'s, side by side (see the module's help)."""
    import os

    arms = {"before": old.resolve(), "after": None}
    res: dict = {a: [] for a in arms}
    loads = [os.getloadavg()]
    for r in range(rounds):
        for a in (list(arms) if r % 2 == 0 else list(arms)[::-1]):
            res[a].append(_timed_compare(arms[a], d))
        loads.append(os.getloadavg())
    same = {x["out"] for v in res.values() for x in v}
    print(f"compare --ranks {d} ({len(list(d.glob('host=*/rank=*/trace')))} ranks), {rounds} round(s), before ({old}) "
          f"and after interleaved; load average (1 min) {min(x[0] for x in loads):.1f} to {max(x[0] for x in loads):.1f}")
    for a, v in res.items():
        print(f"{a:7} wall " + ", ".join(f"{x['wall_s']:.1f}" for x in v) + " s; CPU " +
              ", ".join(f"{x['cpu_s']:.1f}" for x in v) + " s; peak RSS " + ", ".join(f"{x['rss_gib']:.2f}" for x in v)
              + " GiB")
    med = {a: {k: float(np.median([x[k] for x in v])) for k in ("wall_s", "cpu_s", "rss_gib")} for a, v in res.items()}
    b, a = med["before"], med["after"]
    print(f"after / before (medians): wall {a['wall_s'] / b['wall_s']:.2f}, CPU {a['cpu_s'] / b['cpu_s']:.2f}, "
          f"peak RSS {a['rss_gib'] / b['rss_gib']:.2f}; JSON documents {'identical' if len(same) == 1 else 'DIFFERENT'}")
    ok = a["wall_s"] <= 30 and a["rss_gib"] <= 1.2
    print("target (<= 30 s, <= 1.2 GiB):", ("met" if ok else "NOT met") +
          ("" if max(x[0] for x in loads) <= 2 else " -- load average > 2: wall time says little, read CPU"))


def _timed_compare(tree: Path | None, d: Path) -> dict:
    import os

    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = str(tree)
    t0 = time.perf_counter()
    p = subprocess.Popen([sys.executable, "-m", "engramprof", "compare", "--ranks", str(d), "--json"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=str(tree or REPO))
    import threading

    got: dict = {}
    reader = threading.Thread(target=lambda: got.update(out=p.stdout.read(), err=p.stderr.read()))
    reader.start()
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    reader.join()
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode:
        raise SystemExit(f"compare failed ({p.returncode}): {got['err'].decode()[-2000:]}")
    return {"wall_s": wall, "cpu_s": ru.ru_utime + ru.ru_stime, "rss_gib": ru.ru_maxrss / 2**20,
            "out": got["out"].decode()}


def growth(d: Path) -> None:
    """The ranks read one after another in this process, RSS after each (see the module's help)."""
    from engramprof.compare import load
    from engramprof.host.pages import prefer_small_pages

    prefer_small_pages()  # what the command line does
    kept = []
    for p in sorted(d.glob("host=*/rank=*/trace"), key=lambda q: int(q.parent.name.split("=")[1])):
        c0 = time.process_time()
        kept += load.load_ranks(p, None, slow_ms=4.0)
        now = int(open("/proc/self/statm").read().split()[1]) * resource.getpagesize() / 2**30
        print(f"{p.parent.name}: {time.process_time() - c0:.1f} s CPU; RSS now {now:.2f} GiB, peak so far "
              f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB", flush=True)


def main() -> None:
    sys.path.insert(0, str(REPO))
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], Path(sys.argv[3]), Path(sys.argv[4]))
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--calls", type=float, default=5e6, help="calls per rank")
    ap.add_argument("--dir", default=None, help="build here (default: a temporary directory, removed)")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--arms", action="store_true", help="measure the ways to read one rank's events (see above)")
    ap.add_argument("--rounds", type=int, default=3, help="--arms: rounds")
    ap.add_argument("--only", action="append", choices=ARMS, help="--arms: these arms (and bundle) only")
    ap.add_argument("--against", type=Path, default=None, help="side by side with this tree's engramprof (see above)")
    ap.add_argument("--growth", action="store_true", help="RSS after each rank, read one after another (see above)")
    a = ap.parse_args()
    if a.against or a.growth:
        if not a.dir:
            raise SystemExit("--against / --growth need --dir: an already built fleet directory")
        if a.growth:
            growth(Path(a.dir))
        if a.against:
            against(a.against, Path(a.dir), a.rounds)
        return
    d = Path(a.dir or tempfile.mkdtemp(prefix="engramprof-compare-bench-", dir="/var/tmp"))
    d.mkdir(parents=True, exist_ok=True)
    try:
        if a.arms:
            arms(d, int(a.calls), a.rounds, a.only)
            return
        traces, built = [], 0
        t0 = time.perf_counter()
        for r in range(a.ranks):
            p = bundle_path(d, r)
            if not p.exists():
                build(p, int(a.calls), r, straggler=1)
                built += 1
            traces.append(p)
        stray = sorted(set(d.glob("host=*/rank=*/trace")) - set(traces))
        if stray:
            raise SystemExit(f"{d} holds other ranks' bundles ({stray[0]}, ...): give --ranks to match, or another --dir")
        print(f"{a.ranks} bundles of {int(a.calls):,} calls: built {built} in {time.perf_counter() - t0:.1f} s"
              + (f", {a.ranks - built} already in {d}" if built < a.ranks else ""), flush=True)
        argv = [sys.executable, "-m", "engramprof", "compare", "--ranks", str(d), "--json"]  # the fleet directory
        import os

        load0 = os.getloadavg()
        t0 = time.perf_counter()
        out = subprocess.run(argv, capture_output=True, text=True, cwd=REPO)
        wall = time.perf_counter() - t0
        load1 = os.getloadavg()
        rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20
        if out.returncode != 0:
            raise SystemExit(f"compare failed ({out.returncode}): {out.stderr}")
        doc = json.loads(out.stdout)
        print(f"compare --ranks DIR (a fleet directory), {a.ranks} ranks x {int(a.calls):,} calls: {wall:.1f} s wall, peak RSS {rss:.2f} GiB; "
              f"{doc['steps']:,} steps aligned by {doc['alignment']}; gating rank {doc['gating_rank']} "
              f"({next(r['gated_share'] for r in doc['ranks'] if r['rank'] == doc['gating_rank']):.0%} of steps, "
              f"top cause {next(r['top_cause'] for r in doc['ranks'] if r['rank'] == doc['gating_rank'])}); "
              f"load average (1, 5, 15 min) before {load0[0]:.1f} {load0[1]:.1f} {load0[2]:.1f}, "
              f"after {load1[0]:.1f} {load1[1]:.1f} {load1[2]:.1f}")
    finally:
        if not a.keep and a.dir is None:
            shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
