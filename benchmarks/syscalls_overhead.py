#!/usr/bin/env python3
"""What does `engramprof syscalls --output` add to each traced preadv2 call?

A worker process runs a cached RWF_NOWAIT preadv2 loop (the cheapest call a reader makes, so
the worst case for per-call overhead).  Arms, interleaved round by round in one run so the
shared machine's noise hits them alike:

  untraced     the loop alone
  engramprof   under `engramprof syscalls --pid W --output TRACE` (every call recorded)
  bpftrace     under a bpftrace one-liner that keeps only a latency histogram keyed by tid
               start times (the reference the target is stated against)

Prints ns per call (median over rounds), the ns each tracer adds, the ratio of the two, and
the lost-event count of every engramprof run.  Target: engramprof adds <= 70% of what the
bpftrace one-liner adds, with 0 lost events.  `--rss-seconds S` also runs engramprof for S
seconds on a continuous loop and prints the collector's RSS every few seconds (flat = good).
`--lab` adds the lab pool reader's batch time traced vs untraced.

`--selectors` instead compares the target selectors (issue 13), interleaved the same way (the
order of the traced arms rotates from round to round): the loop untraced and under
`engramprof syscalls` selecting the worker by `--pid W`, by `--cgroup CG` (a cgroup2 group
made for it, the worker moved in; removed at the end) and by `--file TABLE` (every process's
reads of the table: the fd followed to its inode in the kernel).  All three arms run with
`--no-offcpu --sample-hz 0` (--file alone records no off-CPU spans), so they differ only in
the selector.  Target: --cgroup and --file add within 10% of what --pid adds.  With
kernel.bpf_stats_enabled it also prints the tracer's BPF program time per call (run_time_ns
of the programs the tracer process holds, from /proc/PID/fdinfo: blind to scheduling noise),
the same net of the background (the system-wide hooks' cost for other processes, measured over
an idle second after each loop), and the worker's own CPU time per call for every arm.

`--baseline TREE` (with --selectors) adds the same three arms run with the engramprof of another
checkout (arm names ending in @base), interleaved with this tree's: a before/after in one run.

Needs root.  Usage: benchmarks/syscalls_overhead.py [--rounds 5] [--calls 400000] [--rss-seconds 120] [--lab]
                    benchmarks/syscalls_overhead.py --selectors [--rounds 5] [--calls 400000] [--baseline TREE]
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

PY = sys.executable
WORKER = r"""
import os, sys, time
fd = os.open(sys.argv[1], os.O_RDONLY)
os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
buf = bytearray(4096)
n = os.fstat(fd).st_size // 4096
for line in sys.stdin:
    cmd = line.split()
    if cmd[0] == "run":
        N = int(cmd[1]); t = time.perf_counter_ns(); c = time.thread_time_ns()
        for i in range(N):
            try:
                os.preadv(fd, [buf], (i % n) * 4096, os.RWF_NOWAIT)
            except BlockingIOError:  # evicted meanwhile (another job's memory pressure): cache it again
                os.preadv(fd, [buf], (i % n) * 4096)
        print((time.perf_counter_ns() - t) / N, (time.thread_time_ns() - c) / N, flush=True)
    elif cmd[0] == "spin":
        end = time.monotonic() + float(cmd[1]); k = 0
        while time.monotonic() < end:
            for i in range(10000):
                os.preadv(fd, [buf], (i % n) * 4096, os.RWF_NOWAIT)
            k += 10000
        print(k, flush=True)
"""
BPFTRACE = ("tracepoint:syscalls:sys_enter_preadv2 /pid == {pid}/ {{ @s[tid] = nsecs; }} "
            "tracepoint:syscalls:sys_exit_preadv2 /@s[tid]/ {{ @h = hist(nsecs - @s[tid]); delete(@s[tid]); }}")


def prog_run_ns() -> int | None:
    """Total run time of every loaded BPF program (kernel.bpf_stats_enabled), or None."""
    if not shutil.which("bpftool"):
        return None
    r = subprocess.run(["bpftool", "-j", "prog", "show"], capture_output=True, text=True)
    try:
        return sum(p.get("run_time_ns", 0) for p in json.loads(r.stdout))
    except ValueError:
        return None


def start_tracer(cmd: list[str], ready: str, stream: str = "stderr", tree: str | None = None) -> subprocess.Popen:
    """Start a tracer and return once it printed `ready` (engramprof: stderr; bpftrace: stdout);
    tree: run the engramprof of that checkout instead of this one."""
    if stream == "stderr":
        env = dict(os.environ, PYTHONPATH=tree) if tree else None
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=tree, env=env)
    else:
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    for line in getattr(p, stream):
        if ready in line:
            return p
    raise RuntimeError(f"tracer did not start: {cmd}")


def stop_tracer(p: subprocess.Popen) -> None:
    p.send_signal(signal.SIGINT)
    try:
        p.wait(timeout=60)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
    for s in (p.stdout, p.stderr):
        if s:
            s.read()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=400_000)
    ap.add_argument("--rss-seconds", type=float, default=0)
    ap.add_argument("--hook", default="auto", help="engramprof --hook (auto|raw|tracepoint)")
    ap.add_argument("--lab", action="store_true", help="also measure the lab pool reader traced vs untraced")
    ap.add_argument("--selectors", action="store_true", help="compare --pid, --cgroup and --file (only that)")
    ap.add_argument("--baseline", metavar="TREE", help="with --selectors: also run each selector with the engramprof "
                    "of another checkout (e.g. `git archive OLD | tar -x -C TREE`), interleaved with this one's")
    a = ap.parse_args()
    if os.geteuid() != 0:
        print("needs root", file=sys.stderr)
        return 1
    # SIGTERM (a timeout) still runs the finally blocks: the cgroup and temp dir go
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    have_bpftrace = shutil.which("bpftrace") is not None
    tmp = tempfile.mkdtemp(prefix="engramprof-bench-")
    try:
        data = os.path.join(tmp, "table.bin")
        with open(data, "wb") as f:
            f.write(os.urandom(4 << 20))
        with open(data, "rb") as f:
            f.read()
        w = subprocess.Popen([PY, "-c", WORKER, data], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

        last_cpu: list[float] = []

        def loop(n: int) -> float:
            """ns/call of wall time; the worker's own CPU time per call goes to last_cpu."""
            w.stdin.write(f"run {n}\n")
            w.stdin.flush()
            wall, cpu = map(float, w.stdout.readline().split())
            last_cpu[:] = [cpu]
            return wall

        loop(50_000)  # warm up
        if a.selectors:
            selector_overhead(tmp, w, loop, last_cpu, data, a)
            w.stdin.close()
            w.wait()
            return 0
        res: dict[str, list[float]] = {"untraced": [], "engramprof": [], "bpftrace": []}
        # BPF program time per call (bpf_stats): immune to the machine's scheduling noise,
        # but leaves out the tracepoint dispatch around the programs
        prog_ns: dict[str, list[float]] = {"engramprof": [], "bpftrace": []}
        stats = subprocess.run(["sysctl", "-qw", "kernel.bpf_stats_enabled=1"]).returncode == 0

        def timed_loop(arm: str) -> float:
            before = prog_run_ns() if stats else None
            v = loop(a.calls)
            after = prog_run_ns() if stats else None
            if before is not None and after is not None:
                prog_ns[arm].append((after - before) / a.calls)
            return v

        lost, recorded = [], []
        for r in range(a.rounds):
            res["untraced"].append(loop(a.calls))
            out = os.path.join(tmp, f"trace{r}")
            p = start_tracer([PY, "-m", "engramprof", "syscalls", "--pid", str(w.pid), "--output", out,
                              "--hook", a.hook], "Tracing")
            res["engramprof"].append(timed_loop("engramprof"))
            stop_tracer(p)
            meta = json.load(open(os.path.join(out, "meta.json")))
            lost.append(meta.get("lost_records"))
            recorded.append(meta.get("calls_written"))
            shutil.rmtree(out)
            if have_bpftrace:
                p = start_tracer(["bpftrace", "-e", BPFTRACE.format(pid=w.pid)], "Attaching", stream="stdout")
                time.sleep(0.5)
                res["bpftrace"].append(timed_loop("bpftrace"))
                stop_tracer(p)
        med = {k: statistics.median(v) for k, v in res.items() if v}
        print(f"cached RWF_NOWAIT preadv2 loop, {a.calls:,} calls x {a.rounds} rounds (interleaved), median ns/call:")
        for k, v in med.items():
            add = f"  (+{v - med['untraced']:.0f} ns)" if k != "untraced" else ""
            print(f"  {k:11s} {v:8.0f}{add}   rounds: {', '.join(f'{x:.0f}' for x in res[k])}")
        if "bpftrace" in med:
            ea = med["engramprof"] - med["untraced"]
            ba = med["bpftrace"] - med["untraced"]
            print(f"engramprof adds {ea:.0f} ns/call, bpftrace one-liner adds {ba:.0f} ns/call: "
                  f"ratio {ea / ba:.2f} (target <= 0.70)")
        print(f"engramprof lost records per run: {lost}; records written per run: {recorded}")
        if stats:
            subprocess.run(["sysctl", "-qw", "kernel.bpf_stats_enabled=0"])
        if prog_ns["engramprof"] and prog_ns["bpftrace"]:
            pe, pb = statistics.median(prog_ns["engramprof"]), statistics.median(prog_ns["bpftrace"])
            print(f"BPF program time per traced call (bpf_stats, all programs incl. sched/block hooks): "
                  f"engramprof {pe:.0f} ns, bpftrace {pb:.0f} ns, ratio {pe / pb:.2f}")

        if a.rss_seconds:
            import psutil

            out = os.path.join(tmp, "trace-rss")
            p = start_tracer([PY, "-m", "engramprof", "syscalls", "--pid", str(w.pid), "--output", out,
                              "--hook", a.hook], "Tracing")
            w.stdin.write(f"spin {a.rss_seconds}\n")
            w.stdin.flush()
            proc = psutil.Process(p.pid)
            t0 = time.monotonic()
            samples = []
            while time.monotonic() - t0 < a.rss_seconds:
                time.sleep(min(10, a.rss_seconds / 12))
                samples.append((time.monotonic() - t0, proc.memory_info().rss / 2**20))
            calls = int(w.stdout.readline())
            stop_tracer(p)
            meta = json.load(open(os.path.join(out, "meta.json")))
            print(f"RSS of the collector over {a.rss_seconds:.0f} s ({calls:,} calls, {calls / a.rss_seconds:,.0f}/s, "
                  f"lost {meta.get('lost_records')}, written {meta.get('calls_written'):,}):")
            print("  " + "  ".join(f"{t:.0f}s:{m:.0f}MiB" for t, m in samples))
            first = samples[len(samples) // 4][1]
            print(f"  growth after the first quarter: {samples[-1][1] - first:+.1f} MiB")
        w.stdin.close()
        w.wait()

        if a.lab:
            lab_overhead(tmp, a.hook)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


CGROUP2 = "/sys/fs/cgroup/unified"


def tracer_prog_ns(pid: int) -> int | None:
    """run_time_ns summed over the BPF programs a tracer process holds (its fds' fdinfo; needs
    kernel.bpf_stats_enabled=1): in-kernel program time, blind to scheduling noise."""
    total, seen = 0, False
    try:
        fds = os.listdir(f"/proc/{pid}/fdinfo")
    except OSError:
        return None
    for fd in fds:
        try:
            with open(f"/proc/{pid}/fdinfo/{fd}") as f:
                info = dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:
            continue
        if "prog_type" in info and "run_time_ns" in info:
            total += int(info["run_time_ns"])
            seen = True
    return total if seen else None


def selector_overhead(tmp: str, w: subprocess.Popen, loop, last_cpu: list, data: str, a) -> None:
    """ns/call the tracer adds selecting the worker by --pid, by --cgroup and by --file.

    Three figures per arm and round: the loop's wall time per call; the worker's own CPU time per
    call (CLOCK_THREAD_CPUTIME_ID: the BPF programs that run on its syscalls, and their dispatch,
    are charged to it; time other jobs take on the shared cores is not); and the tracer's BPF
    program time per call (bpf_stats), also net of the background: the same tracer's program time
    over an idle second right after the loop (the system-wide hooks firing for other processes),
    scaled to the loop's length and subtracted."""
    root = CGROUP2 if os.path.isfile(os.path.join(CGROUP2, "cgroup.procs")) else "/sys/fs/cgroup"
    cg = os.path.join(root, f"engramprof-bench-{os.getpid()}")
    os.mkdir(cg)
    idle_s = 1.0
    try:
        with open(os.path.join(cg, "cgroup.procs"), "w") as f:
            f.write(str(w.pid))
        sel = {"--pid": ["--pid", str(w.pid)], "--cgroup": ["--cgroup", cg], "--file": ["--file", data]}
        arms = {k: (None, v) for k, v in sel.items()}
        if a.baseline:
            arms.update({f"{k}@base": (os.path.abspath(a.baseline), v) for k, v in sel.items()})
        res: dict[str, list[float]] = {"untraced": [], **{k: [] for k in arms}}
        cpu: dict[str, list[float]] = {"untraced": [], **{k: [] for k in arms}}
        lost: dict[str, list] = {k: [] for k in arms}
        prog: dict[str, list[float]] = {k: [] for k in arms}
        net: dict[str, list[float]] = {k: [] for k in arms}
        stats = subprocess.run(["sysctl", "-qw", "kernel.bpf_stats_enabled=1"]).returncode == 0
        names = list(arms)
        for r in range(a.rounds):
            res["untraced"].append(loop(a.calls))
            cpu["untraced"].append(last_cpu[0])
            for k in names[r % len(names):] + names[:r % len(names)]:
                out = os.path.join(tmp, f"sel{r}")
                tree, args = arms[k]
                p = start_tracer([PY, "-m", "engramprof", "syscalls", *args, "--output", out, "--hook", a.hook,
                                  "--no-offcpu", "--sample-hz", "0"], "Tracing", tree=tree)
                if stats:  # another job may have turned it off meanwhile
                    subprocess.run(["sysctl", "-qw", "kernel.bpf_stats_enabled=1"])
                before = tracer_prog_ns(p.pid) if stats else None
                t0 = time.monotonic()
                res[k].append(loop(a.calls))
                took = time.monotonic() - t0
                cpu[k].append(last_cpu[0])
                after = tracer_prog_ns(p.pid) if stats else None
                time.sleep(idle_s)  # the worker idle: what the tracer's programs cost without it
                idle = tracer_prog_ns(p.pid) if stats else None
                if before is not None and after is not None and after > before:  # 0: stats were off
                    prog[k].append((after - before) / a.calls)
                    if idle is not None and idle >= after:
                        net[k].append((after - before - (idle - after) * took / idle_s) / a.calls)
                stop_tracer(p)
                meta = json.load(open(os.path.join(out, "meta.json")))
                lost[k].append((meta.get("lost_records"), meta.get("calls_written")))
                shutil.rmtree(out)
            print(f"round {r + 1}: wall " + ", ".join(f"{k} {v[-1]:.0f}" for k, v in res.items())
                  + " | cpu " + ", ".join(f"{k} {v[-1]:.0f}" for k, v in cpu.items())
                  + (" | prog " + ", ".join(f"{k} {v[-1]:.0f}" for k, v in prog.items() if v)
                     + " | prog net " + ", ".join(f"{k} {v[-1]:.0f}" for k, v in net.items() if v) if stats else ""),
                  flush=True)
    finally:
        subprocess.run(["sysctl", "-qw", "kernel.bpf_stats_enabled=0"])
        try:
            with open(os.path.join(root, "cgroup.procs"), "w") as f:
                f.write(str(w.pid))
        except OSError:
            pass
        os.rmdir(cg)
    with open("/proc/loadavg") as f:
        load = " ".join(f.read().split()[:3])
    print(f"cached RWF_NOWAIT preadv2 loop, {a.calls:,} calls x {a.rounds} rounds (interleaved, traced arms "
          f"rotating), median ns/call; load average at the end {load}:")
    for title, d in (("wall time", res), ("the worker's CPU time", cpu)):
        med = {k: statistics.median(v) for k, v in d.items()}
        print(f" {title}:")
        for k, v in med.items():
            add = f"  (+{v - med['untraced']:.0f} ns)" if k != "untraced" else ""
            print(f"  {k:9s} {v:8.0f}{add}   rounds: {', '.join(f'{x:.0f}' for x in d[k])}")
        for sfx in ("", "@base") if a.baseline else ("",):
            base = med["--pid" + sfx] - med["untraced"]
            for k in ("--cgroup" + sfx, "--file" + sfx):
                add = med[k] - med["untraced"]
                ratio = f"{add / base:.2f}" if base > 0 else "n/a (--pid adds nothing measurable)"
                print(f"  {k} adds {add:.0f} ns/call, --pid{sfx} {base:.0f}: ratio {ratio} (target <= 1.10)")
    print("(lost records, records written) per run: " + "; ".join(f"{k} {v}" for k, v in lost.items()))
    for title, d in (("BPF program time per call (bpf_stats, the tracer's programs, median)", prog),
                     ("BPF program time per call net of the background (idle second after each loop)", net)):
        if not all(d.values()):
            print(f"{title}: not measured (kernel.bpf_stats_enabled off, or turned off by another job, "
                  "in some arm's every round)")
            continue
        pm = {k: statistics.median(v) for k, v in d.items()}
        print(f"{title}: " + ", ".join(f"{k} {v:.0f} ns" for k, v in pm.items()) + "; rounds: " + "; ".join(
            f"{k} {', '.join(f'{x:.0f}' for x in v)}" for k, v in d.items()))
        lo = {k: min(v) for k, v in d.items()}  # others' load only adds: the least round is the quietest
        for sfx in ("", "@base") if a.baseline else ("",):
            for k in ("--cgroup" + sfx, "--file" + sfx):
                print(f"  {k} / --pid{sfx}: median {pm[k] / pm['--pid' + sfx]:.2f}, least round "
                      f"{lo[k]:.0f} / {lo['--pid' + sfx]:.0f} ns = {lo[k] / lo['--pid' + sfx]:.2f} (target <= 1.10)")


def lab_overhead(tmp: str, hook: str) -> None:
    """Batch time of the lab's pool reader (decode shape, cached table), untraced vs traced."""
    table = os.path.join(tmp, "lab.safetensors")
    subprocess.run([PY, "-m", "engramprof", "lab", "make-table", table, "--rows", "65536"], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = [PY, "-m", "engramprof", "lab", "run", "--table", table, "--reader", "pool", "--steps", "300",
            "--tokens", "4", "--warm", "--json"]
    res = {"untraced": [], "traced": []}
    for r in range(3):
        res["untraced"].append(json.loads(subprocess.run(base, capture_output=True, text=True, check=True).stdout)["batch_ms"]["p50"])
        lab = subprocess.Popen(base + ["--start-delay", "4"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        out = os.path.join(tmp, f"labtrace{r}")
        p = start_tracer([PY, "-m", "engramprof", "syscalls", "--pid", str(lab.pid), "--output", out, "--hook", hook], "Tracing")
        so, _ = lab.communicate()
        stop_tracer(p)
        res["traced"].append(json.loads(so)["batch_ms"]["p50"])
    u, t = statistics.median(res["untraced"]), statistics.median(res["traced"])
    print(f"lab pool reader, decode batches on a cached table: batch p50 untraced {u:.3f} ms, traced {t:.3f} ms "
          f"({t / u:.2f}x); rounds untraced {res['untraced']}, traced {res['traced']}")


if __name__ == "__main__":
    sys.exit(main())
