#!/usr/bin/env python3
"""What the syscall probe's sched hooks cost the machine's other tasks: BPF ns a run of
probes/syscalls.bpf.c's sched_switch and sched_wakeup, this tree's against another checkout's.

sched_switch and sched_wakeup fire for every task of the machine.  The probe is loaded for an
idle `sleep` (no traced call, nothing recorded) while two other processes ping-pong a byte
through two pipes (every round trip: two sleeps, two wake-ups), so what is measured is what an
untraced task's switches and wake-ups pay.  Arms, interleaved round by round (order reversed
every other round) in one run so the shared machine's noise hits them alike:

  new     this tree's probes/syscalls.bpf.c
  before  (with --before-tree DIR) that checkout's probes/syscalls.bpf.c, built by this tree's
          loader (same constants; one it does not use is harmless)
  empty   empty BCC programs on the same two tracepoints (the floor)

Per arm and program: run time / run count over the window (benchmarks/bpfstats.py: statistics
held on by a BPF_ENABLE_STATS fd), each round and the median, and the ratios to 'before' and to
the floor.  Needs root.

Usage: benchmarks/syscall_sched_overhead.py --before-tree DIR [--rounds 5] [--seconds 2]
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bpfstats import prog_stats_of_bcc, stats_enabled  # noqa: E402

PROGRAMS = (("sched", "sched_switch"), ("sched", "sched_wakeup"))  # (category, tracepoint)

PING_PONG = r"""
import os
a_r, a_w = os.pipe()
b_r, b_w = os.pipe()
if os.fork() == 0:
    os.close(a_w); os.close(b_r)  # the parent's end gone (killed): EOF, the partner exits
    while os.read(a_r, 1):
        os.write(b_w, b"p")
    os._exit(0)
os.close(a_r); os.close(b_w)
while True:
    os.write(a_w, b"t")
    os.read(b_r, 1)
"""


class PreadvProbe:
    """The syscall probe for ``pid``, from ``source`` (a syscalls.bpf.c; None: this tree's)."""

    def __init__(self, pid: int, source: str | None):
        from engramprof.bpf import syscalls as loader

        probe_file = loader.PROBE_FILE
        if source:  # an absolute path: probe_dir() / it is it
            loader.PROBE_FILE = source
        try:
            self.probe = loader.SyscallsProbe(loader.plan(loader.SyscallsConfig(tgid=pid)))
        finally:
            loader.PROBE_FILE = probe_file
        self.bpf = self.probe.bpf

    def close(self):
        self.probe.detach()
        self.probe.close()


class EmptyPrograms:
    """Empty BCC programs on ``programs``' tracepoints: the floor."""

    def __init__(self, programs=PROGRAMS):
        from engramprof.bpf.base import compile_program, import_bcc

        text = "".join(f"TRACEPOINT_PROBE({c}, {p}) {{ return 0; }}\n" for c, p in programs)
        self.bpf = compile_program(import_bcc(), text, "empty programs")

    def close(self):
        self.bpf.cleanup()


def hook_stats(bpf, programs=PROGRAMS) -> dict[str, tuple[int, int]]:
    """tracepoint -> (run_time_ns, run_cnt) of a loaded BCC object, for the ``programs`` it has."""
    out = {}
    for name, v in prog_stats_of_bcc(bpf).items():
        name = name.decode() if isinstance(name, bytes) else name
        for _c, p in programs:
            if name.endswith("__" + p):
                out[p] = v
    return out


def measure(loaded, seconds: float, programs=PROGRAMS) -> dict[str, tuple[int, int]]:
    """(run_time_ns, run_cnt) of each program over a window of ``seconds``."""
    time.sleep(0.2)  # settle after the attach
    s0 = hook_stats(loaded.bpf, programs)
    time.sleep(seconds)
    s1 = hook_stats(loaded.bpf, programs)
    return {p: (s1[p][0] - s0[p][0], s1[p][1] - s0[p][1]) for p in s0 if p in s1}


def add_arm_args(ap: argparse.ArgumentParser, probe_file: str) -> None:
    ap.add_argument("--before-tree", help=f"a checkout whose probes/{probe_file} the 'before' arm loads")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=2.0, help="measurement window per arm and round")
    ap.add_argument("--arms", default="new,before,empty")


def run_arms(arms: list[str], rounds: int, seconds: float, load_probe, programs=PROGRAMS):
    """Each arm loaded in turn, round by round (order reversed every other round): ``empty``
    (EmptyPrograms), else ``load_probe(arm)``.  (arm, tracepoint) -> ns a run of each round, and
    -> runs of each round; None when BPF run-time statistics cannot be held on."""
    results: dict[tuple[str, str], list[float]] = {}
    runs: dict[tuple[str, str], list[int]] = {}
    with stats_enabled() as on:
        if not on:
            return None
        for rnd in range(rounds):
            for arm in (arms if rnd % 2 == 0 else arms[::-1]):
                loaded = EmptyPrograms(programs) if arm == "empty" else load_probe(arm)
                try:
                    got = measure(loaded, seconds, programs)
                finally:
                    loaded.close()
                for p, (ns, cnt) in got.items():
                    results.setdefault((arm, p), []).append(ns / max(cnt, 1))
                    runs.setdefault((arm, p), []).append(cnt)
    return results, runs


def print_report(arms: list[str], rounds: int, seconds: float, workload: str, measured,
                 programs=PROGRAMS) -> None:
    results, runs = measured
    with open("/proc/loadavg") as f:
        load = " ".join(f.read().split()[:3])
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}, load {load}, {rounds} rounds x "
          f"{seconds:g} s, {workload}; probe target an idle sleep")
    for _c, p in programs:
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
            rate = statistics.median(runs[(arm, p)]) / seconds
            print(f"  {arm:7s} {' '.join(f'{v:6.0f}' for v in vals)} | {med[arm]:6.0f} | {rate:9.0f}")
        if "new" in med and "before" in med:
            print(f"  new / before: {med['new'] / med['before']:.2f}x", end="")
            if "empty" in med:
                print(f"; above the empty program: new {med['new'] - med['empty']:.0f} ns, "
                      f"before {med['before'] - med['empty']:.0f} ns", end="")
            print()


def before_source(a, probe_file: str) -> str | None:
    return os.path.abspath(os.path.join(a.before_tree, "probes", probe_file)) if a.before_tree else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_arm_args(ap, "syscalls.bpf.c")
    a = ap.parse_args()
    arms = a.arms.split(",")
    if "before" in arms and not a.before_tree:
        print("the 'before' arm needs --before-tree DIR", file=sys.stderr)
        return 2
    before_src = before_source(a, "syscalls.bpf.c")
    procs = [subprocess.Popen(["sleep", "100000"]),
             subprocess.Popen([sys.executable, "-c", PING_PONG], stdout=subprocess.DEVNULL)]
    try:
        measured = run_arms(arms, a.rounds, a.seconds,
                            lambda arm: PreadvProbe(procs[0].pid, before_src if arm == "before" else None))
    finally:
        for p in procs:
            p.kill()
            p.wait()
    if measured is None:
        print("cannot enable BPF run-time statistics", file=sys.stderr)
        return 1
    print_report(arms, a.rounds, a.seconds, "untraced pipe ping-pong", measured)
    return 0


if __name__ == "__main__":
    sys.exit(main())
