#!/usr/bin/env python3
"""What the exporter probe's every-task and every-I/O hooks cost the machine's other tasks: BPF
ns a run of probes/export.bpf.c's sched_switch, sched_wakeup and block_rq_complete, this tree's
against another checkout's.

sched_switch and sched_wakeup fire for every task of the machine, block_rq_complete for every
request of every disk.  The probe (`engramprof export`'s, always on) is loaded for an idle
`sleep` (no traced read, nothing counted) while two untraced processes ping-pong a byte through
two pipes (two sleeps and two wake-ups a round trip) and a third reads 4 KiB O_DIRECT blocks of
a file on the root disk at random (one request a read: a completion, a switch and a wake-up).
Arms, interleaved round by round (order reversed every other round) in one run, as in
benchmarks/syscall_sched_overhead.py:

  new     this tree's probes/export.bpf.c
  before  (with --before-tree DIR) that checkout's probes/export.bpf.c, built by this tree's
          exporter loader (same constants; those it does not use are harmless)
  empty   empty BCC programs on the same tracepoints (the floor)

Per arm and program: run time / run count over the window (benchmarks/bpfstats.py), each round
and the median, and the ratios to 'before' and to the floor.  Needs root.

Usage: benchmarks/export_probe_overhead.py --before-tree DIR [--rounds 5] [--seconds 2]
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bpfstats import prog_stats_of_bcc, stats_enabled  # noqa: E402
from syscall_sched_overhead import PING_PONG  # noqa: E402

PROGRAMS = (("sched", "sched_switch"), ("sched", "sched_wakeup"), ("block", "block_rq_complete"),
            ("block", "block_bio_complete"))

DIRECT_READER = r"""
import mmap, os, random, sys
fd = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECT)
blocks = os.fstat(fd).st_size // 4096
buf = mmap.mmap(-1, 4096)  # page-aligned, as O_DIRECT wants
while True:
    os.preadv(fd, [buf], random.randrange(blocks) * 4096)
"""


class ExportProbe:
    """The exporter probe for ``pid``, from ``source`` (an export.bpf.c; None: this tree's)."""

    def __init__(self, pid: int, source: str | None):
        from engramprof.export import probe as ep
        from engramprof.record.selection import Selection

        probe_file = ep.PROBE_FILE
        if source:  # an absolute path: probe_dir() / it is it
            ep.PROBE_FILE = source
        try:
            self.probe = ep.ExportProbe(ep.plan(ep.ExportProbeConfig(selection=Selection.parse(pids=[pid]))))
        finally:
            ep.PROBE_FILE = probe_file
        self.bpf = self.probe.bpf

    def close(self):
        self.probe.close()


class EmptyPrograms:
    def __init__(self):
        from engramprof.bpf.base import compile_program, import_bcc

        text = "".join(f"TRACEPOINT_PROBE({c}, {p}) {{ return 0; }}\n" for c, p in PROGRAMS)
        self.bpf = compile_program(import_bcc(), text, "empty programs")

    def close(self):
        self.bpf.cleanup()


def hook_stats(bpf) -> dict[str, tuple[int, int]]:
    """program -> (run_time_ns, run_cnt) of a loaded BCC object, for the PROGRAMS it has."""
    out = {}
    for name, v in prog_stats_of_bcc(bpf).items():
        name = name.decode() if isinstance(name, bytes) else name
        for _c, p in PROGRAMS:
            if name.endswith("__" + p):
                out[p] = v
    return out


def measure(loaded, seconds: float) -> dict[str, tuple[int, int]]:
    time.sleep(0.2)  # settle after the attach
    s0 = hook_stats(loaded.bpf)
    time.sleep(seconds)
    s1 = hook_stats(loaded.bpf)
    return {p: (s1[p][0] - s0[p][0], s1[p][1] - s0[p][1]) for p in s0 if p in s1}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before-tree", help="a checkout whose probes/export.bpf.c the 'before' arm loads")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=2.0, help="measurement window per arm and round")
    ap.add_argument("--arms", default="new,before,empty")
    ap.add_argument("--dir", default="/var/tmp", help="where the O_DIRECT reader's file goes (a disk)")
    a = ap.parse_args()
    arms = a.arms.split(",")
    if "before" in arms and not a.before_tree:
        print("the 'before' arm needs --before-tree DIR", file=sys.stderr)
        return 2
    before_src = os.path.abspath(os.path.join(a.before_tree, "probes", "export.bpf.c")) if a.before_tree else None
    tmp = tempfile.NamedTemporaryFile(dir=a.dir, prefix="engramprof-export-overhead-", delete=False)
    with tmp:
        tmp.write(os.urandom(64 << 20))
        os.fsync(tmp.fileno())
    procs = [subprocess.Popen(["sleep", "100000"]),
             subprocess.Popen([sys.executable, "-c", PING_PONG], stdout=subprocess.DEVNULL),
             subprocess.Popen([sys.executable, "-c", DIRECT_READER, tmp.name])]
    idle = procs[0]
    results: dict[tuple[str, str], list[float]] = {}
    runs: dict[tuple[str, str], list[int]] = {}
    try:
        with stats_enabled() as on:
            if not on:
                print("cannot enable BPF run-time statistics", file=sys.stderr)
                return 1
            for rnd in range(a.rounds):
                for arm in (arms if rnd % 2 == 0 else arms[::-1]):
                    loaded = EmptyPrograms() if arm == "empty" else \
                        ExportProbe(idle.pid, before_src if arm == "before" else None)
                    try:
                        got = measure(loaded, a.seconds)
                    finally:
                        loaded.close()
                    for p, (ns, cnt) in got.items():
                        results.setdefault((arm, p), []).append(ns / max(cnt, 1))
                        runs.setdefault((arm, p), []).append(cnt)
    finally:
        for p in procs:
            p.kill()
            p.wait()
        os.unlink(tmp.name)
    with open("/proc/loadavg") as f:
        load = " ".join(f.read().split()[:3])
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}, load {load}, {a.rounds} rounds x "
          f"{a.seconds:g} s, untraced pipe ping-pong + O_DIRECT 4 KiB reader on {a.dir}; probe target an "
          f"idle sleep")
    for _c, p in PROGRAMS:
        if not any((arm, p) in results for arm in arms):
            continue
        print(f"\n{p}: ns a run (each round) | median | runs a second (median)")
        med = {}
        for arm in arms:
            vals = results.get((arm, p), [])
            if not vals:
                print(f"  {arm:7s} (no such program)")
                continue
            med[arm] = statistics.median(vals)
            rate = statistics.median(runs[(arm, p)]) / a.seconds
            print(f"  {arm:7s} {' '.join(f'{v:6.0f}' for v in vals)} | {med[arm]:6.0f} | {rate:9.0f}")
        if "new" in med and "before" in med:
            print(f"  new / before: {med['new'] / med['before']:.2f}x", end="")
            if "empty" in med:
                print(f"; above the empty program: new {med['new'] - med['empty']:.0f} ns, "
                      f"before {med['before'] - med['empty']:.0f} ns", end="")
            print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
