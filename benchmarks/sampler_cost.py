"""CPU cost of the Sampler at 10 Hz: on-CPU time of the sampling thread over a wall window.

    .venv/bin/python benchmarks/sampler_cost.py [--seconds 10] [--hz 10] [--threads 32]

Three runs: system only (no --pid); a target with a THREADS-thread pool (PSI, vmstat, kswapd,
cgroup, process and per-thread files every round); the same while flushing to a TRACE bundle
every second.  The sampling thread's CPU time comes from /proc/self/task/TID/schedstat
(ns on CPU, user + system); it is reported as % of one core over the wall window.
Target: < 2 % of one core at 10 Hz.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engramprof.sampling.sampler import Sampler
from engramprof.trace import TraceWriter  # noqa: E402

TARGET = """
import sys, threading, time
from concurrent.futures import ThreadPoolExecutor
n = int(sys.argv[1])
pool = ThreadPoolExecutor(n)
list(pool.map(lambda i: time.sleep(0.01), range(n)))   # start all n workers
while True:                                             # a light, steady trickle of batches
    list(pool.map(lambda i: None, range(n)))
    time.sleep(0.05)
"""


def thread_cpu_ns(tid: int) -> int:
    with open(f"/proc/self/task/{tid}/schedstat") as f:
        return int(f.read().split()[0])


def run(label: str, seconds: float, hz: float, pid: int | None, trace_dir: Path | None) -> dict:
    s = Sampler(pid=pid, hz=hz)
    w = TraceWriter(trace_dir) if trace_dir else None
    s.start(w)
    time.sleep(0.05)
    tid = s.native_id
    c0, t0, r0 = thread_cpu_ns(tid), time.monotonic_ns(), s.rounds
    time.sleep(seconds)
    c1, t1, r1 = thread_cpu_ns(tid), time.monotonic_ns(), s.rounds
    s.stop()
    if w:
        w.close()
    cpu_ms = (c1 - c0) / 1e6
    wall_s = (t1 - t0) / 1e9
    rounds = r1 - r0
    res = {
        "label": label,
        "wall_s": wall_s,
        "rounds": rounds,
        "achieved_hz": rounds / wall_s,
        "cpu_ms": cpu_ms,
        "pct_core": 100 * cpu_ms / 1e3 / wall_s,
        "us_per_round": 1e3 * cpu_ms / max(rounds, 1),
        "threads_rows": len(s.frames()["threads"]),
        "behind": s.behind,
    }
    print(
        f"{label:<34} {res['pct_core']:6.2f}% of a core  {res['cpu_ms']:8.1f} ms CPU / {wall_s:5.1f} s wall  "
        f"{rounds} rounds ({res['achieved_hz']:.1f} Hz)  {res['us_per_round']:7.0f} us/round",
        flush=True,
    )
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--hz", type=float, default=10.0)
    ap.add_argument("--threads", type=int, default=32)
    a = ap.parse_args()
    print(f"sampler cost at {a.hz:g} Hz, {a.seconds:g} s per run (kernel {os.uname().release}, {os.cpu_count()} CPUs)")
    target = subprocess.Popen([sys.executable, "-c", textwrap.dedent(TARGET), str(a.threads)])
    results = []
    try:
        time.sleep(0.5)
        results.append(run("system only (no --pid)", a.seconds, a.hz, None, None))
        results.append(run(f"--pid with {a.threads}-thread pool", a.seconds, a.hz, target.pid, None))
        with tempfile.TemporaryDirectory() as d:
            results.append(run(f"--pid {a.threads} threads + TRACE flush", a.seconds, a.hz, target.pid, Path(d) / "t"))
    finally:
        target.kill()
        target.wait()
    worst = max(r["pct_core"] for r in results)
    print(f"worst: {worst:.2f}% of one core (target < 2%): {'OK' if worst < 2 else 'OVER BUDGET'}")


if __name__ == "__main__":
    main()
