#!/usr/bin/env python3
"""What does the page-fault probe add to each traced fault of a memory-mapped reader?

Two worker processes each map their own copy of a table (numpy.memmap, read-only,
MADV_RANDOM) and gather one byte from each of K pages 16 pages apart (one fault each, fault-
around cannot serve the next one):

  cold     the pages evicted first (MADV_DONTNEED on the mapping + POSIX_FADV_DONTNEED): every
           gather is a major fault with a device read;
  cached   the pages cached but unmapped (MADV_DONTNEED on the mapping only): every gather is a
           minor fault (filemap map_pages), repeated R times: the probe's cost without the I/O.

Arms, interleaved round by round in one run so the shared machine's noise hits them alike:

  untraced     nothing attached
  engramprof   `engramprof syscalls --pid T --output TRACE` (every probe: preadv, off-CPU, faults)
  bpftrace     a bpftrace one-liner keeping a histogram of the same faults of T:
               page_fault_user -> mm_filemap_fault time per fault, in a hist()
  floor        bpftrace programs that only test `pid == T` on every tracepoint engramprof
               attaches (the empty-program floor for any other process)

The target T is worker 1; worker 2 is the untraced, fault-heavy other process, timed in every
arm.  Prints ns per fault (median over rounds), the ns each tracer adds to T's faults and
their ratio (target: engramprof <= 0.7x bpftrace), and the ns added to the other process's
faults under engramprof and under the floor (target: within the floor).

Needs root.  Usage: benchmarks/faults_overhead.py [--rounds 3] [--pages 1500] [--cached-repeat 20]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from syscalls_overhead import prog_run_ns, start_tracer, stop_tracer  # noqa: E402

PY = sys.executable
WORKER = r"""
import mmap, os, resource, sys, time
import numpy as np
path = sys.argv[1]
fd = os.open(path, os.O_RDONLY)
size = os.fstat(fd).st_size
mm = np.memmap(path, dtype=np.uint8, mode="r", shape=(size,))
raw = mm._mmap
raw.madvise(mmap.MADV_RANDOM)
PS = mmap.PAGESIZE
rng = np.random.default_rng(int(sys.argv[2]))
windows = size // (16 * PS)
for line in sys.stdin:
    cmd = line.split()
    mode, k, rep = cmd[0], int(cmd[1]), int(cmd[2])
    idx = rng.choice(windows, min(k, windows), replace=False) * 16 * PS
    total = 0
    faults = 0
    for r in range(rep):
        raw.madvise(mmap.MADV_DONTNEED)  # unmap: the next touch faults
        if mode == "cold":
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        else:
            int(mm[idx].sum()); raw.madvise(mmap.MADV_DONTNEED)  # cached, not mapped
        ru0 = resource.getrusage(resource.RUSAGE_SELF)
        t = time.perf_counter_ns()
        s = int(mm[idx].sum())
        total += time.perf_counter_ns() - t
        ru1 = resource.getrusage(resource.RUSAGE_SELF)
        faults += (ru1.ru_majflt - ru0.ru_majflt) + (ru1.ru_minflt - ru0.ru_minflt)
    print(f"{total} {faults}", flush=True)
"""

BPFTRACE = ("tracepoint:exceptions:page_fault_user /pid == {pid}/ {{ @s[tid] = nsecs; }} "
            "tracepoint:filemap:mm_filemap_fault /pid == {pid} && @s[tid]/ "
            "{{ @us = hist((nsecs - @s[tid]) / 1000); delete(@s[tid]); }}")
#: every tracepoint an engramprof recording attaches that a faulting process can fire
FLOOR_TPS = ["exceptions:page_fault_user", "filemap:mm_filemap_fault", "filemap:mm_filemap_map_pages",
             "filemap:mm_filemap_add_to_page_cache", "raw_syscalls:sys_enter", "raw_syscalls:sys_exit",
             "sched:sched_switch", "sched:sched_wakeup", "sched:sched_waking", "block:block_bio_queue",
             "block:block_rq_complete", "vmscan:mm_vmscan_direct_reclaim_begin"]


def floor_prog(pid: int) -> str:
    return " ".join(f"tracepoint:{tp} /pid == {pid}/ {{ @c{i} = count(); }}" for i, tp in enumerate(FLOOR_TPS))


class Worker:
    def __init__(self, path: str, seed: int):
        self.p = subprocess.Popen([PY, "-c", WORKER, path, str(seed)], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)
        self.pid = self.p.pid

    def run(self, mode: str, k: int, rep: int) -> float:
        """ns per fault of one gather batch."""
        self.p.stdin.write(f"{mode} {k} {rep}\n")
        self.p.stdin.flush()
        ns, faults = map(int, self.p.stdout.readline().split())
        return ns / max(faults, 1)

    def close(self):
        self.p.stdin.close()
        self.p.wait()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--pages", type=int, default=1500, help="faults per gather (pages 16 apart)")
    ap.add_argument("--cached-repeat", type=int, default=20, help="cached gathers per measurement")
    ap.add_argument("--dir", default="/var/tmp", help="where the tables go (a disk, not tmpfs: cold faults)")
    a = ap.parse_args()
    if os.geteuid() != 0:
        print("needs root", file=sys.stderr)
        return 1
    if not shutil.which("bpftrace"):
        print("needs bpftrace (scripts/setup.sh installs it)", file=sys.stderr)
        return 1
    tmp = tempfile.mkdtemp(prefix="engramprof-faults-bench-", dir=a.dir)
    size = a.pages * 16 * 4096 + (1 << 20)
    paths = []
    for i in range(2):
        p = os.path.join(tmp, f"table{i}.bin")
        with open(p, "wb") as f:
            f.write(os.urandom(size))
            os.fsync(f.fileno())
        paths.append(p)
    t, o = Worker(paths[0], 1), Worker(paths[1], 2)
    modes = [("cold", 1), ("cached", a.cached_repeat)]
    arms = ["untraced", "engramprof", "bpftrace", "floor"]
    res = {(arm, who, m): [] for arm in arms for who in ("target", "other") for m, _ in modes}
    prog = {arm: [] for arm in ("engramprof", "bpftrace")}
    stats = subprocess.run(["sysctl", "-qw", "kernel.bpf_stats_enabled=1"]).returncode == 0
    lost = []
    try:
        for w in (t, o):  # warm up: numpy import, first mapping
            for m, r in modes:
                w.run(m, a.pages, 1)
        for rnd in range(a.rounds):
            for arm in arms:
                p, out = None, None
                if arm == "engramprof":
                    out = os.path.join(tmp, f"trace{rnd}")
                    p = start_tracer([PY, "-m", "engramprof", "syscalls", "--pid", str(t.pid), "--output", out,
                                      "--sample-hz", "0"], "Tracing")
                elif arm == "bpftrace":
                    p = start_tracer(["bpftrace", "-e", BPFTRACE.format(pid=t.pid)], "Attaching", stream="stdout")
                elif arm == "floor":
                    p = start_tracer(["bpftrace", "-e", floor_prog(t.pid)], "Attaching", stream="stdout")
                if p is not None:
                    time.sleep(0.5)
                for m, r in modes:
                    before = prog_run_ns() if stats and arm in prog and m == "cached" else None
                    res[(arm, "target", m)].append(t.run(m, a.pages, r))
                    if before is not None:
                        after = prog_run_ns()
                        if after is not None:
                            prog[arm].append((after - before) / (a.pages * r))
                    res[(arm, "other", m)].append(o.run(m, a.pages, r))
                if p is not None:
                    stop_tracer(p)
                if out:
                    meta = json.load(open(os.path.join(out, "meta.json")))
                    f = meta.get("faults") or {}
                    lost.append((f.get("faults"), f.get("major"), f.get("lost_records")))
                    shutil.rmtree(out, ignore_errors=True)
            print(f"round {rnd + 1}/{a.rounds} done", file=sys.stderr, flush=True)
    finally:
        t.close()
        o.close()
        if stats:
            subprocess.run(["sysctl", "-qw", "kernel.bpf_stats_enabled=0"])
        shutil.rmtree(tmp, ignore_errors=True)

    med = {k: statistics.median(v) for k, v in res.items()}
    print(f"memmap gathers of {a.pages:,} pages 16 apart (one fault each), {a.rounds} rounds interleaved; "
          f"cached: {a.cached_repeat} gathers per measurement. Median ns per fault:")
    for m, _ in modes:
        for who in ("target", "other"):
            base = med[("untraced", who, m)]
            cells = [f"untraced {base:,.0f}"] + [
                f"{arm} {med[(arm, who, m)]:,.0f} ({med[(arm, who, m)] - base:+,.0f})" for arm in arms[1:]]
            print(f"  {m:6s} {who:6s}  " + "   ".join(cells))
    for m, _ in modes:
        ea = med[("engramprof", "target", m)] - med[("untraced", "target", m)]
        ba = med[("bpftrace", "target", m)] - med[("untraced", "target", m)]
        eo = med[("engramprof", "other", m)] - med[("untraced", "other", m)]
        fo = med[("floor", "other", m)] - med[("untraced", "other", m)]
        ratio = f"{ea / ba:.2f}" if ba > 0 else "n/a (bpftrace added nothing measurable)"
        print(f"{m}: target fault: engramprof adds {ea:+,.0f} ns, bpftrace one-liner {ba:+,.0f} ns: ratio {ratio} "
              "(target <= 0.70)")
        print(f"{m}: other process's fault: engramprof adds {eo:+,.0f} ns, the empty-program floor {fo:+,.0f} ns "
              f"(target: within the floor)")
    if prog["engramprof"] and prog["bpftrace"]:
        pe, pb = statistics.median(prog["engramprof"]), statistics.median(prog["bpftrace"])
        print(f"BPF program time per cached traced fault (bpf_stats, every program incl. sched/syscall hooks): "
              f"engramprof {pe:,.0f} ns, bpftrace {pb:,.0f} ns, ratio {pe / pb:.2f}")
    print(f"engramprof fault totals per run (faults, major, lost records): {lost}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
