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
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from syscall_sched_overhead import PING_PONG, add_arm_args, before_source, print_report, run_arms  # noqa: E402

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
        from engramprof.target.selection import Selection

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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_arm_args(ap, "export.bpf.c")
    ap.add_argument("--dir", default="/var/tmp", help="where the O_DIRECT reader's file goes (a disk)")
    a = ap.parse_args()
    arms = a.arms.split(",")
    if "before" in arms and not a.before_tree:
        print("the 'before' arm needs --before-tree DIR", file=sys.stderr)
        return 2
    before_src = before_source(a, "export.bpf.c")
    tmp = tempfile.NamedTemporaryFile(dir=a.dir, prefix="engramprof-export-overhead-", delete=False)
    with tmp:
        tmp.write(os.urandom(64 << 20))
        os.fsync(tmp.fileno())
    procs = [subprocess.Popen(["sleep", "100000"]),
             subprocess.Popen([sys.executable, "-c", PING_PONG], stdout=subprocess.DEVNULL),
             subprocess.Popen([sys.executable, "-c", DIRECT_READER, tmp.name])]
    try:
        measured = run_arms(arms, a.rounds, a.seconds,
                            lambda arm: ExportProbe(procs[0].pid, before_src if arm == "before" else None), PROGRAMS)
    finally:
        for p in procs:
            p.kill()
            p.wait()
        os.unlink(tmp.name)
    if measured is None:
        print("cannot enable BPF run-time statistics", file=sys.stderr)
        return 1
    print_report(arms, a.rounds, a.seconds, f"untraced pipe ping-pong + O_DIRECT 4 KiB reader on {a.dir}",
                 measured, PROGRAMS)
    return 0


if __name__ == "__main__":
    sys.exit(main())
