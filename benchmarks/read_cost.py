#!/usr/bin/env python3
"""What the syscall probe's read()/readv() tracing costs per call (issue 22).

read() is the call of every pipe, socket and terminal, so the probe filters by target first
(one compare, or a hash lookup with several pids), then walks the fd to its inode and skips what
is not a regular file (counted in nonregular_skipped).  One probe (probes/syscalls.bpf.c, every
feature the kernel has) is loaded for worker A; worker B is another process.  Arms, interleaved
round by round:

  A read /dev/zero   the target reading a character device: the id test, is_target, the fd walk,
                     the skip (no record)
  A read file        the target reading a cached regular file with lseek + read: the walk, a record
  A pread64 file     the target's pread64 of the same file: the walk, a record (the old path + walk)
  B read /dev/zero   an untraced process: the id test and is_target only

Printed per arm: the BPF programs' own run time per loop iteration (run_time_ns of every program
of the probe, bpf(BPF_ENABLE_STATS): blind to scheduling noise), and the worker's CPU time per
iteration.  An iteration is lseek + the read (the lseek passes the raw hooks too: the id test).

Needs root.  Usage: benchmarks/read_cost.py [--rounds 5] [--calls 200000]
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bpfstats import prog_stats_of_bcc, stats_enabled  # noqa: E402

WORKER = r"""
import os, sys, time
z = os.open("/dev/zero", os.O_RDONLY)
f = os.open(sys.argv[1], os.O_RDONLY)
os.pread(f, 4096, 0)
print("ready", flush=True)
for line in sys.stdin:
    kind, n = line.split()
    n = int(n)
    fd = z if kind == "zero" else f
    c0 = time.clock_gettime_ns(time.CLOCK_THREAD_CPUTIME_ID)
    if kind == "pread":
        for _ in range(n):
            os.pread(fd, 64, 0)
    else:
        for _ in range(n):
            os.lseek(fd, 0, 0)
            os.read(fd, 64)
    print((time.clock_gettime_ns(time.CLOCK_THREAD_CPUTIME_ID) - c0) / n, flush=True)
"""
ARMS = (("A read /dev/zero", "a", "zero"), ("A read file", "a", "file"), ("A pread64 file", "a", "pread"),
        ("B read /dev/zero", "b", "zero"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=200_000)
    a = ap.parse_args()
    if os.geteuid() != 0:
        print("read_cost: needs root", file=sys.stderr)
        return 1
    from engramprof.bpf import syscalls as sp

    with tempfile.NamedTemporaryFile(dir="/var/tmp", prefix="engramprof-readcost-") as data:
        data.write(os.urandom(1 << 20))
        data.flush()
        workers = {k: subprocess.Popen([sys.executable, "-c", WORKER, data.name], stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE, text=True) for k in ("a", "b")}
        probe = None
        try:
            for w in workers.values():
                assert w.stdout.readline().strip() == "ready"
            probe = sp.SyscallsProbe(sp.plan(sp.SyscallsConfig(tgid=workers["a"].pid)))
            bpf_ns = {name: [] for name, _w, _k in ARMS}
            cpu_ns = {name: [] for name, _w, _k in ARMS}
            with stats_enabled():
                for _ in range(a.rounds):
                    for name, w, kind in ARMS:
                        before = sum(ns for ns, _c in prog_stats_of_bcc(probe.bpf).values())
                        workers[w].stdin.write(f"{kind} {a.calls}\n")
                        workers[w].stdin.flush()
                        cpu_ns[name].append(float(workers[w].stdout.readline()))
                        after = sum(ns for ns, _c in prog_stats_of_bcc(probe.bpf).values())
                        bpf_ns[name].append((after - before) / a.calls)
                        probe.ring.drain()
            totals = probe.totals()
        finally:
            if probe is not None:
                probe.close()
            for w in workers.values():
                w.kill()
                w.wait()
    print(f"{'arm':18s} {'BPF ns/iter':>12s} {'worker CPU ns/iter':>19s}   (median of {a.rounds} rounds, "
          f"{a.calls:,} iterations each)")
    for name, _w, _k in ARMS:
        print(f"{name:18s} {statistics.median(bpf_ns[name]):12.0f} {statistics.median(cpu_ns[name]):19.0f}")
    print(f"probe totals: calls {totals['calls']:,}, nonregular_skipped {totals['nonregular_skipped']:,}, "
          f"lost {totals['lost_records']:,}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
