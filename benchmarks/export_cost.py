#!/usr/bin/env python3
"""What does `engramprof export` cost: memory over a long run, CPU at the lab reader's rate,
and what its probe adds to each read.

1. Probe cost (interleaved arms, one run): two worker processes run the same cached
   RWF_NOWAIT preadv2 loop (the cheapest read, the worst case per call); `export --pid A`
   targets one of them.  Round by round (order alternating) each loop runs --calls reads:
   ns per call of the untargeted and the targeted worker, the ns the probe adds, the ratio.
2. Footprint (--seconds, default 600): a warm lab pool reader (`lab run --reader pool`) under
   `export --pid LAB --window 10`, scraped once a second by this script (a strict Prometheus).
   Every 5 s: the exporter's anonymous and file-backed RSS (/proc/PID/status RssAnon, RssFile:
   file-backed is mostly libLLVM / libbcc's mapped text, shared with every process that maps
   it) and its CPU time (/proc/PID/stat utime + stime: the exporter process only; the probe
   runs in the reader's threads and is phase 1's figure).  Prints anon RSS after start-up, its
   min / max / last and slope, and the exporter's CPU as % of one core, with the reader's rate.
3. --recorder: the same start-up RSS of `engramprof syscalls --pid LAB` for comparison.

Targets (issue 16): anon RSS <= 150 MiB after start-up and flat; CPU <= 2% of a core beyond
the probe cost.  Needs root.  Usage:
  benchmarks/export_cost.py [--seconds 600] [--rounds 5] [--calls 300000] [--recorder]
                            [--skip-probe-cost] [--window-sample N]
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

PY = sys.executable
WORKER = r"""
import os, sys, time
fd = os.open(sys.argv[1], os.O_RDONLY)
os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
buf = bytearray(4096)
n = os.fstat(fd).st_size // 4096
for i in range(n):
    os.preadv(fd, [buf], i * 4096)
print("ready", flush=True)
for line in sys.stdin:
    N = int(line); t = time.perf_counter_ns(); missed = 0
    for i in range(N):
        try:
            os.preadv(fd, [buf], (i % n) * 4096, os.RWF_NOWAIT)
        except BlockingIOError:  # evicted by someone else: read it back (counted, reported)
            os.preadv(fd, [buf], (i % n) * 4096); missed += 1
    print((time.perf_counter_ns() - t) / N, missed, flush=True)
"""


def engramprof(*args) -> list[str]:
    return [PY, "-m", "engramprof", *map(str, args)]


def syscall_reads(scrape: str) -> float:
    """engramprof_probe_reads_total{kind="syscall"} of a /metrics text (parsed by prometheus_client)."""
    from prometheus_client.parser import text_string_to_metric_families

    for fam in text_string_to_metric_families(scrape):
        if fam.name == "engramprof_probe_reads":
            return sum(smp.value for smp in fam.samples if smp.labels.get("kind") == "syscall")
    return float("nan")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_exporter(args: list[str], port: int, log: str) -> subprocess.Popen:
    err = open(log, "w+")
    p = subprocess.Popen(engramprof("export", *args, "--listen", f"127.0.0.1:{port}"), stderr=err,
                         stdout=subprocess.DEVNULL)
    t0 = time.monotonic()
    while time.monotonic() - t0 < 180:
        err.seek(0)
        if "Exporting" in err.read():
            return p
        if p.poll() is not None:
            err.seek(0)
            raise SystemExit(f"export ended: {err.read()[-2000:]}")
        time.sleep(0.2)
    raise SystemExit("export did not start in 180 s")


def stop(p: subprocess.Popen, sig=signal.SIGTERM) -> None:
    if p.poll() is None:
        p.send_signal(sig)
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def status_kib(pid: int) -> dict[str, int]:
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("RssAnon", "RssFile", "RssShmem", "VmRSS"):
                out[k] = int(v.split()[0])
    return out


def cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        data = f.read()
    fields = data[data.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def loadavg() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def probe_cost(tmp: str, rounds: int, calls: int) -> dict:
    data = os.path.join(tmp, "cached.bin")
    with open(data, "wb") as f:
        f.write(os.urandom(64 << 20))
    workers = [subprocess.Popen([PY, "-c", WORKER, data], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
               for _ in range(2)]
    for w in workers:
        assert w.stdout.readline().strip() == "ready"
    untargeted, targeted = workers
    port = free_port()
    exp = start_exporter(["--pid", targeted.pid, "--window", "10"], port, os.path.join(tmp, "probe-cost.log"))
    res = {"untargeted": [], "targeted": []}
    missed = 0
    try:
        for r in range(rounds):
            order = [("untargeted", untargeted), ("targeted", targeted)]
            for name, w in (order if r % 2 == 0 else order[::-1]):
                w.stdin.write(f"{calls}\n")
                w.stdin.flush()
                ns, miss = w.stdout.readline().split()
                res[name].append(float(ns))
                missed += int(miss)
        scrape = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    finally:
        stop(exp)
        for w in workers:
            w.stdin.close()
            w.wait(10)
    counted = syscall_reads(scrape)
    u, t = statistics.median(res["untargeted"]), statistics.median(res["targeted"])
    return {"untargeted_ns": u, "targeted_ns": t, "added_ns": t - u, "ratio": t / u, "rounds": res,
            "counted": counted, "expected": rounds * calls, "missed": missed}


def footprint(tmp: str, seconds: float, recorder: bool, window_sample: int | None = None) -> dict:
    table = os.path.join(tmp, "table.safetensors")
    subprocess.run(engramprof("lab", "make-table", table, "--rows", "65536"), check=True, capture_output=True)
    lab = subprocess.Popen(engramprof("lab", "run", "--table", table, "--warm", "--reader", "pool", "--duration",
                                      seconds + 240, "--json"), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                           text=True)
    out: dict = {}
    try:
        time.sleep(3)
        if recorder:
            rec = subprocess.Popen(engramprof("syscalls", "--pid", lab.pid, "--output", os.path.join(tmp, "rec")),
                                   stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
            while "Tracing" not in (rec.stderr.readline() or "Tracing"):
                pass
            time.sleep(5)
            out["recorder_kib"] = status_kib(rec.pid)
            stop(rec, signal.SIGINT)
        port = free_port()
        t_start = time.monotonic()
        extra = ["--window-sample", window_sample] if window_sample else []
        exp = start_exporter(["--pid", lab.pid, "--window", "10", *extra], port, os.path.join(tmp, "footprint.log"))
        out["startup_s"] = time.monotonic() - t_start
        scrapes = {"n": 0, "bad": 0}
        done = threading.Event()

        def scraper():
            while not done.wait(1.0):
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
                    scrapes["n"] += 1
                except OSError:
                    scrapes["bad"] += 1

        th = threading.Thread(target=scraper, daemon=True)
        th.start()
        time.sleep(5)
        samples = []
        t0, c0 = time.monotonic(), cpu_s(exp.pid)
        end = t0 + seconds
        while time.monotonic() < end and exp.poll() is None:
            kib = status_kib(exp.pid)
            samples.append((time.monotonic() - t0, kib["RssAnon"], kib["RssFile"]))
            time.sleep(5)
        t1, c1 = time.monotonic(), cpu_s(exp.pid)
        final = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        done.set()
        stop(exp)
        reads = syscall_reads(final)
        out |= {"samples": samples, "cpu_s": c1 - c0, "wall_s": t1 - t0, "scrapes": scrapes, "reads": reads}
    finally:
        stop(lab, signal.SIGKILL)
    return out


def _slope_per_10min(samples, col: int) -> float:
    pts = [(s[0], s[col]) for s in samples if s[0] >= samples[-1][0] / 2]
    if len(pts) < 3:
        return float("nan")
    mt = statistics.fmean(p[0] for p in pts)
    mv = statistics.fmean(p[1] for p in pts)
    num = sum((p[0] - mt) * (p[1] - mv) for p in pts)
    den = sum((p[0] - mt) ** 2 for p in pts) or 1.0
    return num / den * 600 / 1024  # KiB/s -> MiB per 10 min


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=600.0)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=300_000)
    ap.add_argument("--recorder", action="store_true", help="also the recorder's (syscalls) start-up RSS")
    ap.add_argument("--skip-probe-cost", action="store_true")
    ap.add_argument("--window-sample", type=int, default=None, help="the exporter's --window-sample (default: its own)")
    a = ap.parse_args()
    if os.geteuid() != 0:
        print("needs root (loads eBPF programs)", file=sys.stderr)
        return 1
    print(f"load average at start: {loadavg()}")
    with tempfile.TemporaryDirectory(prefix="engramprof-export-cost-") as tmp:
        if not a.skip_probe_cost:
            pc = probe_cost(tmp, a.rounds, a.calls)
            print(f"probe cost (cached RWF_NOWAIT preadv2 loop, {a.rounds} rounds x {a.calls} calls, interleaved): "
                  f"untargeted {pc['untargeted_ns']:.0f} ns/call, targeted {pc['targeted_ns']:.0f} ns/call, "
                  f"adds {pc['added_ns']:.0f} ns ({pc['ratio']:.2f}x); counted {pc['counted']:.0f} of "
                  f"{pc['expected']} calls; {pc['missed']} reads found evicted and read back")
            print("  rounds (ns/call):", json.dumps({k: [round(x) for x in v] for k, v in pc["rounds"].items()}))
        fp = footprint(tmp, a.seconds, a.recorder, a.window_sample)
        s = fp["samples"]
        anon = [x[1] / 1024 for x in s]
        filed = [x[2] / 1024 for x in s]
        print(f"exporter start-up (load + attach): {fp['startup_s']:.1f} s")
        print(f"anon RSS (MiB): after start-up {anon[0]:.1f}, min {min(anon):.1f}, max {max(anon):.1f}, "
              f"last {anon[-1]:.1f}, slope over the second half {_slope_per_10min(s, 1):+.2f} MiB/10 min "
              f"({len(s)} samples over {s[-1][0]:.0f} s)")
        print(f"file-backed RSS (MiB): after start-up {filed[0]:.1f}, max {max(filed):.1f}, last {filed[-1]:.1f}")
        rate = fp["reads"] / max(1.0, fp["wall_s"] + 5)
        print(f"exporter CPU: {fp['cpu_s']:.2f} s over {fp['wall_s']:.0f} s = {100 * fp['cpu_s'] / fp['wall_s']:.2f}% "
              f"of a core at ~{rate:,.0f} reads/s (lab pool reader, warm), window 10 s, "
              f"window sample {a.window_sample or 'default'}, "
              f"{fp['scrapes']['n']} scrapes at 1 s ({fp['scrapes']['bad']} failed)")
        if "recorder_kib" in fp:
            r = fp["recorder_kib"]
            print(f"recorder (engramprof syscalls) 5 s after start: anon {r['RssAnon'] / 1024:.1f} MiB, "
                  f"file-backed {r['RssFile'] / 1024:.1f} MiB")
    print(f"load average at end: {loadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
