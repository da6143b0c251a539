#!/usr/bin/env python3
"""What does the eviction probe (probes/evictions.bpf.c) add on a machine that evicts pages
of unrelated files at a high rate?

The probe hooks filemap:mm_filemap_delete_from_page_cache system-wide (plus the reclaim and
syscall tracepoints that give the removing context), so every page removed from any file's
page cache runs it; only the watched files' pages are recorded.  A worker process pinned to
one CPU reads a sparse 64 MiB file (holes: the page cache fills with zero pages, no disk I/O)
and drops it again with posix_fadvise(POSIX_FADV_DONTNEED), over and over: 16,384 insertions
and 16,384 removals a pass, none of them of a watched file.  Arms, interleaved round by round
in one run so the shared machine's noise hits them alike:

  untraced   no program attached
  empty      empty BPF programs on every tracepoint the probe attaches (the floor: the
             tracepoints' own cost with a program attached)
  evictions  the eviction probe as `engramprof syscalls` loads it, watching one other file

Prints the worker's CPU time (user + system, from its own clock) per page removed, median and
best over rounds, the ns each arm adds, and the probe's cost over the empty floor; with BPF
run-time statistics (held on for the run by benchmarks/bpfstats.py's fd, never switched off),
the programs' own run time per removal.  Needs root.  Usage: benchmarks/evictions_overhead.py [--rounds 7] [--passes 40]
"""
from __future__ import annotations

import argparse
import contextlib
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
path, passes = sys.argv[1], int(sys.argv[2])
fd = os.open(path, os.O_RDONLY)
size = os.fstat(fd).st_size
buf = bytearray(1 << 20)
os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)  # no readahead: exactly the pages read
for line in sys.stdin:
    t0 = time.process_time_ns()
    for _ in range(passes):
        off = 0
        while off < size:
            off += os.preadv(fd, [buf], off)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    print(time.process_time_ns() - t0, flush=True)
"""



def empty_text(plan) -> str:
    """Empty programs on the tracepoints the probe's plan attaches."""
    from engramprof.bpf import evictions as ev

    names = list(ev.REQUIRED) + [n for f, ns in ev.FEATURES.items() if plan.features[f] for n in ns]
    return "".join(f"TRACEPOINT_PROBE({n.split(':')[0]}, {n.split(':')[1]}) {{ return 0; }}\n" for n in names)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--passes", type=int, default=40, help="64 MiB read-and-drop passes per round and arm")
    ap.add_argument("--cpu", type=int, default=os.cpu_count() - 1)
    ap.add_argument("--dir", default=os.environ.get("ENGRAMPROF_SCENARIO_DIR", "/var/tmp"))
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("needs root", file=sys.stderr)
        return 1
    from engramprof.bpf import evictions as ev
    from engramprof.bpf.syscalls import import_bcc
    from engramprof.record.sources.evictions import kernel_dev

    BPF = import_bcc()
    work = tempfile.mkdtemp(prefix="engramprof-evbench-", dir=args.dir)
    churn, watched = os.path.join(work, "churn.bin"), os.path.join(work, "watched.bin")
    with open(churn, "wb") as f:
        f.truncate(64 << 20)  # sparse: reading it fills the page cache with zero pages, no I/O
    with open(watched, "wb") as f:
        f.write(b"\0" * 4096)
    pages_per_pass = (64 << 20) // os.sysconf("SC_PAGE_SIZE")
    worker = subprocess.Popen(["taskset", "-c", str(args.cpu), sys.executable, "-c", WORKER, churn, str(args.passes)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def one_round() -> float:
        worker.stdin.write("go\n")
        worker.stdin.flush()
        return int(worker.stdout.readline()) / (args.passes * pages_per_pass)

    stats = contextlib.ExitStack()  # BPF run-time statistics held on for the run (benchmarks/bpfstats.py)
    stats_on = stats.enter_context(stats_enabled())
    plan = ev.plan(ev.EvictionProbeConfig())
    arms = ("untraced", "empty", "evictions")
    per_page = {a: [] for a in arms}
    run_ns = {"empty": {}, "evictions": {}}
    recorded = 0
    try:
        one_round()  # warm up
        for r in range(args.rounds):
            for arm in (arms if r % 2 == 0 else arms[::-1]):
                prog = None
                if arm == "empty":
                    prog = BPF(text=empty_text(plan).encode())
                elif arm == "evictions":
                    prog = ev.LoadedEvictionProbe(plan)
                    st = os.stat(watched)
                    prog.watch(kernel_dev(st.st_dev), st.st_ino)
                try:
                    ns = one_round()
                finally:
                    if prog is not None:
                        for name, (rt, rc) in prog_stats_of_bcc(prog if arm == "empty" else prog.bpf).items():
                            acc = run_ns[arm].setdefault(name.decode() if isinstance(name, bytes) else name, [0, 0])
                            acc[0] += rt
                            acc[1] += rc
                    if arm == "evictions":
                        recorded += prog.totals()["evictions"]
                        prog.close()
                    elif prog is not None:
                        prog.cleanup()
                per_page[arm].append(ns)
                print(f"  round {r} {arm}: {ns:.0f} ns CPU per page removed", file=sys.stderr, flush=True)
    finally:
        worker.stdin.close()
        worker.wait()
        stats.close()
        for p in (churn, watched):
            os.unlink(p)
        os.rmdir(work)
    med = {a: statistics.median(per_page[a]) for a in arms}
    best = {a: min(per_page[a]) for a in arms}
    spread = {a: (max(per_page[a]) - min(per_page[a])) for a in arms}
    with open("/proc/loadavg") as f:
        load = " ".join(f.read().split()[:3])
    print(f"read-and-drop of a sparse 64 MiB file, worker pinned to CPU {args.cpu}: {args.passes} passes x "
          f"{pages_per_pass:,} pages per round x {args.rounds} rounds; load average {load}")
    print(f"{'arm':<10} {'ns/page':>8} {'added':>7} {'x':>7}   {'best':>6} {'added':>7}   {'spread':>7}")
    for a in arms:
        print(f"{a:<10} {med[a]:>8.0f} {med[a] - med['untraced']:>7.0f} {med[a] / med['untraced']:>6.3f}x   "
              f"{best[a]:>6.0f} {best[a] - best['untraced']:>7.0f}   {spread[a]:>7.0f}")
    print(f"evictions over the empty floor (median): {med['evictions'] - med['empty']:.0f} ns per page removed, "
          f"{med['evictions'] / med['empty']:.3f}x; removals recorded (none watched): {recorded} (must be 0)")
    if stats_on:
        for a in ("empty", "evictions"):
            rows = run_ns[a]
            dels = max((c for n, (_, c) in rows.items() if "delete_from_page_cache" in n), default=0)
            total = sum(t for t, _ in rows.values())
            parts = ", ".join(f"{n.split('__')[-1]} {t / max(c, 1):.0f} ns x {c:,}" for n, (t, c) in sorted(rows.items()) if c)
            print(f"bpf_stats {a}: {parts}; program time per page removed {total / max(dels, 1):.0f} ns")
    return 0


if __name__ == "__main__":
    sys.exit(main())
