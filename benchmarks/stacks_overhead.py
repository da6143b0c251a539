#!/usr/bin/env python3
"""What does stack sampling (the code view's py-spy rounds, engramprof/sampling/stacks.py) add
to the step time of the lab pool reader, cached?

One lab pool reader runs for the whole benchmark (a warm table, the decode step: 4 tokens,
--gap-ms 2, its markers written per step).  The sampler is switched on and off in alternating
windows of ``--window`` seconds at ``--hz`` rounds a second (on, off, on, off, ...), so the
shared machine's noise hits both arms alike; each step is put in the arm of the window it
started in (steps in the first 0.2 s after a switch are left out).  Prints, side by side, the
steps' median and p90 time per arm and their ratio, and the sampler's own cost: py-spy's CPU
(RUSAGE_CHILDREN) per second sampled and its mean wall time per dump.  No eBPF (the probes'
cost is measured elsewhere); root only for py-spy's priority (nice -10).

Usage: benchmarks/stacks_overhead.py [--windows 10] [--window 3] [--hz 20] [--threads 32] [--nice N]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from engramprof.sampling import stacks  # noqa: E402
from engramprof.sampling.stacks import StackSampler  # noqa: E402

PY = sys.executable
SETTLE_NS = 200_000_000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--windows", type=int, default=10, help="on/off windows in all (even)")
    ap.add_argument("--window", type=float, default=3.0, help="seconds a window")
    ap.add_argument("--hz", type=float, default=20.0, help="stack rounds a second when on")
    ap.add_argument("--threads", type=int, default=32, help="the pool's threads")
    ap.add_argument("--nice", type=int, default=None, help="py-spy's nice value (default: the sampler's)")
    a = ap.parse_args()
    if a.nice is not None:
        stacks.DUMP_NICE = a.nice
    tmp = tempfile.mkdtemp(prefix="engramprof-stacks-bench-")
    table, markers = os.path.join(tmp, "t.safetensors"), os.path.join(tmp, "m.jsonl")
    subprocess.run([PY, "-m", "engramprof", "lab", "make-table", table, "--rows", "16384"], check=True,
                   capture_output=True)
    total = a.windows * a.window + 5
    lab = subprocess.Popen([PY, "-m", "engramprof", "lab", "run", "--table", table, "--reader", "pool", "--warm",
                            "--duration", str(total), "--gap-ms", "2", "--threads", str(a.threads), "--markers", markers,
                            "--start-delay", "60"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    for line in lab.stderr:
        if line.startswith("lab: ready"):
            break
    os.kill(lab.pid, signal.SIGUSR1)
    time.sleep(1.0)
    arms: list[tuple[int, int, str]] = []  # (start ns, end ns, arm)
    cpu = wall_on = 0.0
    dumps = dump_ns = 0
    try:
        for w in range(a.windows):
            arm = "on" if w % 2 == 0 else "off"
            t0 = time.monotonic_ns()
            if arm == "on":
                s = StackSampler(lambda: [lab.pid], hz=a.hz)
                s.start()
                time.sleep(a.window)
                s.stop()
                s.rows.clear()
                cpu += s.cpu_s
                dumps += s.dumps
                dump_ns += s.wall_ns
                wall_on += a.window
            else:
                time.sleep(a.window)
            arms.append((t0, time.monotonic_ns(), arm))
    finally:
        lab.send_signal(signal.SIGTERM)
        lab.wait(timeout=60)
    steps = {"on": [], "off": []}
    try:
        with open(markers) as f:
            for line in f:
                m = json.loads(line)
                for t0, t1, arm in arms:
                    if t0 + SETTLE_NS <= m["start_ns"] < t1:
                        steps[arm].append((m["end_ns"] - m["start_ns"]) / 1e6)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in steps.items()}
    p90 = {k: statistics.quantiles(v, n=10)[-1] for k, v in steps.items()}
    print(f"lab pool reader, cached, {a.threads} threads; {a.windows} windows of {a.window:g} s alternating, "
          f"stack sampling at {a.hz:g} Hz when on, py-spy at nice {stacks.DUMP_NICE}")
    print(f"{'arm':<5}{'steps':>8}{'p50 ms':>10}{'p90 ms':>10}")
    for k in ("off", "on"):
        print(f"{k:<5}{len(steps[k]):>8}{med[k]:>10.3f}{p90[k]:>10.3f}")
    print(f"on / off: p50 x{med['on'] / med['off']:.3f}, p90 x{p90['on'] / p90['off']:.3f}")
    print(f"sampler: {dumps} dumps, {dump_ns / max(dumps, 1) / 1e6:.1f} ms wall a dump, py-spy CPU "
          f"{cpu / wall_on * 100:.1f}% of a core while on ({cpu / max(dumps, 1) * 1e3:.1f} ms a dump)")


if __name__ == "__main__":
    main()
