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

With ``--arms on,off,record`` a third arm runs one long-lived ``py-spy record --nonblocking
--idle --threads --rate HZ --format chrometrace`` for the window instead of repeated dumps (a
sampler that parses the target's binaries once; it reports neither the GIL holder nor the run
state per sample, and writes its samples only when it exits), so the two samplers' costs are
measured side by side in one run.  An arm ``on@HZ`` samples at HZ instead of ``--hz``:
``--arms on@10,off,on@5,off`` measures two rates side by side in one run.

Usage: benchmarks/stacks_overhead.py [--windows 10] [--window 3] [--hz 20] [--threads 32] [--nice N]
                                     [--arms on,off]
"""
from __future__ import annotations

import argparse
import json
import re
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
    ap.add_argument("--arms", default="on,off",
                    help="the arms' cycle: on (dumps at --hz), on@HZ (dumps at HZ), off, record (py-spy record)")
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
    cycle = a.arms.split(",")
    cost = {k: {"cpu": 0.0, "wall": 0.0, "dumps": 0, "dump_ns": 0} for k in cycle if k.startswith("on")}
    rec_cpu = rec_wall = 0.0
    rec_samples = 0
    try:
        for w in range(a.windows):
            arm = cycle[w % len(cycle)]
            t0 = time.monotonic_ns()
            if arm == "record":
                c, n = _record_window(lab.pid, a.hz, a.window, tmp)
                rec_cpu += c
                rec_samples += n
                rec_wall += a.window
            elif arm.startswith("on"):
                s = StackSampler(lambda: [lab.pid], hz=_hz(arm, a.hz))
                s.start()
                time.sleep(a.window)
                s.stop()
                s.rows.clear()
                c = cost[arm]
                c["cpu"] += s.cpu_s
                c["dumps"] += s.dumps
                c["dump_ns"] += s.wall_ns
                c["wall"] += a.window
            else:
                time.sleep(a.window)
            arms.append((t0, time.monotonic_ns(), arm))
    finally:
        lab.send_signal(signal.SIGTERM)
        lab.wait(timeout=60)
    steps = {k: [] for k in dict.fromkeys(cycle)}
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
          f"stack sampling at {a.hz:g} Hz when on (on@HZ: at HZ), py-spy at nice {stacks.DUMP_NICE}")
    secs = {k: sum(t1 - t0 - SETTLE_NS for t0, t1, arm in arms if arm == k) / 1e9 for k in steps}
    print(f"{'arm':<8}{'steps':>8}{'steps/s':>9}{'p50 ms':>10}{'p90 ms':>10}")
    for k in steps:
        print(f"{k:<8}{len(steps[k]):>8}{len(steps[k]) / secs[k]:>9.0f}{med[k]:>10.3f}{p90[k]:>10.3f}")
    for k in steps:
        if k != "off":
            print(f"{k} / off: p50 x{med[k] / med['off']:.3f}, p90 x{p90[k] / p90['off']:.3f}")
    for k, c in cost.items():
        n = max(c["dumps"], 1)
        print(f"{k}: {c['dumps']} dumps, {c['dump_ns'] / n / 1e6:.1f} ms wall a dump, py-spy CPU "
              f"{c['cpu'] / c['wall'] * 100:.1f}% of a core while on ({c['cpu'] / n * 1e3:.1f} ms a dump)")
    if "record" in steps:
        print(f"record: {rec_samples} samples (py-spy's count), py-spy CPU {rec_cpu / rec_wall * 100:.1f}% of a core while on")
    print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


def _hz(arm: str, default: float) -> float:
    """An ``on`` arm's rate: ``on@HZ``, else ``--hz``."""
    return float(arm.split("@", 1)[1]) if "@" in arm else default


def _record_window(pid: int, hz: float, seconds: float, tmp: str) -> tuple[float, int]:
    """One ``py-spy record`` for ``seconds``: (its CPU seconds, the thread samples it wrote)."""
    out = os.path.join(tmp, "record.json")
    before = _children_cpu()
    p = subprocess.Popen([stacks.find_py_spy(), "record", "--pid", str(pid), "--rate", str(int(hz)), "--nonblocking",
                          "--idle", "--threads", "--format", "chrometrace", "--output", out],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    time.sleep(seconds)
    p.send_signal(signal.SIGINT)  # py-spy writes its file when it is interrupted
    err, _ = p.communicate(timeout=60)
    cpu = _children_cpu() - before
    m = re.search(r"Samples: (\d+)", err or "")
    return cpu, int(m.group(1)) if m else 0


def _children_cpu() -> float:
    import resource

    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


if __name__ == "__main__":
    main()
