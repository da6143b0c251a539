#!/usr/bin/env python3
"""What does the sched probe (probes/sched.bpf.c, off-CPU spans) add to a context switch of a
process that is NOT traced?

The probe hooks sched_switch and sched_waking, which fire for every task on the machine, so
its cost lands on everyone.  Two processes ping-pong one byte over a pair of pipes, both
pinned to one CPU (every round trip is exactly two direct switches A -> B -> A, each with one
wake-up), and neither is the probe's target (the target is this idle benchmark process).
Arms, interleaved round by round in one run so the shared machine's noise hits them alike:

  untraced   no program on the sched tracepoints
  empty      empty BPF programs on sched_switch + sched_waking (the floor: the tracepoint's
             own cost with a program attached, perf's argument copy included)
  sched      the sched probe as `engramprof syscalls` loads it (target: another process)

Prints ns per round trip and per context switch (median and best over rounds; switches
counted from /proc/PID/status of both processes, voluntary + involuntary) and the ns each arm
adds per switch.  Wall-clock figures on a shared 2-core VM are noisy, so it also prints the
programs' own run time per invocation (benchmarks/bpfstats.py: held on by a bpf(BPF_ENABLE_STATS)
fd for the run; run_time_ns / run_cnt from the programs' fdinfo), which the machine's scheduling
noise does not touch.  Needs root.  Usage: benchmarks/offcpu_overhead.py [--rounds 7] [--trips 100000]
"""
from __future__ import annotations

import argparse
import contextlib
import os
import signal
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bpfstats import prog_stats_of_bcc, stats_enabled  # noqa: E402

EMPTY = """
TRACEPOINT_PROBE(sched, sched_switch) { return 0; }
TRACEPOINT_PROBE(sched, sched_waking) { return 0; }
"""



def ctx_switches(pid: int) -> int:
    n = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                n += int(line.split()[1])
    return n


class PingPong:
    """Two forked processes pinned to one CPU, bouncing a byte `trips` times on request."""

    def __init__(self, cpu: int):
        self.ab_r, self.ab_w = os.pipe()
        self.ba_r, self.ba_w = os.pipe()
        self.ctl_r, self.ctl_w = os.pipe()   # parent -> A: trips to run
        self.res_r, self.res_w = os.pipe()   # A -> parent: ns taken
        self.b = os.fork()
        if self.b == 0:
            os.sched_setaffinity(0, {cpu})
            while True:
                if not os.read(self.ab_r, 1):
                    os._exit(0)
                os.write(self.ba_w, b"x")
        self.a = os.fork()
        if self.a == 0:
            os.sched_setaffinity(0, {cpu})
            while True:
                msg = os.read(self.ctl_r, 32)
                if not msg:
                    os._exit(0)
                n = int(msg)
                t = time.perf_counter_ns()
                for _ in range(n):
                    os.write(self.ab_w, b"x")
                    os.read(self.ba_r, 1)
                os.write(self.res_w, str(time.perf_counter_ns() - t).encode())

    def run(self, trips: int) -> tuple[float, float]:
        """(ns per round trip, context switches per round trip of A and B together)."""
        before = ctx_switches(self.a) + ctx_switches(self.b)
        os.write(self.ctl_w, str(trips).encode())
        ns = int(os.read(self.res_r, 64))
        after = ctx_switches(self.a) + ctx_switches(self.b)
        return ns / trips, (after - before) / trips

    def close(self) -> None:
        for pid in (self.a, self.b):  # each child holds the other's pipe ends: no EOF, kill them
            os.kill(pid, signal.SIGKILL)
        os.waitpid(self.a, 0)
        os.waitpid(self.b, 0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--trips", type=int, default=100_000)
    ap.add_argument("--cpu", type=int, default=os.cpu_count() - 1)
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("needs root", file=sys.stderr)
        return 1
    from engramprof.bpf import sched
    from engramprof.bpf.syscalls import import_bcc

    BPF = import_bcc()
    # the probe's target: an idle process that is neither the pair nor this one
    idle = subprocess.Popen(["sleep", "100000"])
    stats = contextlib.ExitStack()  # BPF run-time statistics held on for the run (benchmarks/bpfstats.py)
    stats_on = stats.enter_context(stats_enabled())
    run_ns = {"empty": {}, "sched": {}}  # arm -> program -> [time, count]
    pp = PingPong(args.cpu)
    pp.run(args.trips // 10)  # warm up
    arms = ("untraced", "empty", "sched")
    per_trip = {a: [] for a in arms}
    switches = {a: [] for a in arms}
    spans = 0
    try:
        for r in range(args.rounds):
            for arm in (arms if r % 2 == 0 else arms[::-1]):
                prog = None
                if arm == "empty":
                    prog = BPF(text=EMPTY)
                elif arm == "sched":
                    prog = sched.LoadedSchedProbe(sched.plan(sched.SchedConfig(tgid=idle.pid)))
                try:
                    ns, sw = pp.run(args.trips)
                finally:
                    if prog is not None:
                        for name, (rt, rc) in prog_stats_of_bcc(prog if arm == "empty" else prog.bpf).items():
                            acc = run_ns[arm].setdefault(name.decode() if isinstance(name, bytes) else name, [0, 0])
                            acc[0] += rt
                            acc[1] += rc
                    if arm == "sched":
                        spans += prog.totals()["spans"]
                        prog.close()
                    elif prog is not None:
                        prog.cleanup()
                per_trip[arm].append(ns)
                print(f"  round {r} {arm}: {ns:.0f} ns/trip, {sw:.2f} switches/trip", file=sys.stderr, flush=True)
                switches[arm].append(sw)
    finally:
        pp.close()
        idle.kill()
        idle.wait()
        stats.close()
    med = {a: statistics.median(per_trip[a]) for a in arms}
    best = {a: min(per_trip[a]) for a in arms}
    sw = statistics.median([s for a in arms for s in switches[a]])
    print(f"ping-pong over pipes, 2 processes pinned to CPU {args.cpu}, {args.trips:,} round trips x "
          f"{args.rounds} rounds; {sw:.2f} context switches per round trip")
    print(f"{'arm':<10} {'ns/trip':>9} {'ns/switch':>10} {'added/switch':>13} {'slowdown':>9}   "
          f"{'best ns/trip':>12} {'added/switch':>13}")
    for a in arms:
        added = (med[a] - med["untraced"]) / sw
        badded = (best[a] - best["untraced"]) / sw
        print(f"{a:<10} {med[a]:>9.0f} {med[a] / sw:>10.0f} {added:>12.0f}  {med[a] / med['untraced']:>8.3f}x   "
              f"{best[a]:>12.0f} {badded:>12.0f}")
    print(f"sched over the empty floor (median): {(med['sched'] - med['empty']) / sw:.0f} ns per switch; "
          f"spans recorded (target idle, pair untraced): {spans} (must be 0)")
    if stats_on:
        for a in ("empty", "sched"):
            parts = ", ".join(f"{n} {t / max(c, 1):.0f} ns x {c:,}" for n, (t, c) in sorted(run_ns[a].items()))
            per_switch = sum(t for t, _ in run_ns[a].values()) / max(
                max((c for n, (_, c) in run_ns[a].items() if "switch" in n), default=1), 1)
            print(f"bpf_stats {a}: {parts}; program time per context switch {per_switch:.0f} ns "
                  f"(all its programs, over sched_switch runs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
