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
the selector.  Target: --cgroup and --file add within 10% of what --pid adds.  It also
prints the tracer's BPF program time per call (run_time_ns
of the programs the tracer process holds, from /proc/PID/fdinfo: blind to scheduling noise),
the same net of the background (the system-wide hooks' cost for other processes, measured over
an idle second after each loop), and the worker's own CPU time per call for every arm.

With --selectors it also prints, per program (probe:tracepoint: the tracepoint from
BPF_TASK_FD_QUERY on the tracer's fds, the probe from the ring buffer among the maps its
programs share), the program's run time per traced call, its runs per traced call, its run time
per run, and its background (ns a second over the idle second), every arm side by side, and
where each selector's extra cost over --pid's sits.  Run-time statistics are held on with
benchmarks/bpfstats.py (a counted bpf(BPF_ENABLE_STATS) fd: other jobs' benchmarks are not
switched off, nor switch this one off).

`--checks` instead measures the target checks alone (one --pid's compare, --cgroup's ancestor
id and its id hash, a tgid hash), each as its own program on raw_syscalls:sys_enter, all attached
at once, in both attach orders: ns per run side by side.

`--arms=--pid` (with --selectors) runs only the selectors named (comma-separated).

`--baseline TREE` adds an `engramprof@base` arm run with another checkout's engramprof and probes
(with --selectors: the same three arms, names ending in @base), interleaved with this tree's: a
before/after in one run.

Needs root.  Usage: benchmarks/syscalls_overhead.py [--rounds 5] [--calls 400000] [--rss-seconds 120] [--lab]
                    benchmarks/syscalls_overhead.py --selectors [--rounds 5] [--calls 400000] [--baseline TREE]
                    benchmarks/syscalls_overhead.py --checks [--rounds 5] [--calls 300000]
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bpfstats import prog_stats_of_pid, stats_enabled  # noqa: E402

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


def prog_run_ns(pid: int) -> int | None:
    """Run time of every BPF program process ``pid`` holds (bpfstats: its fds' fdinfo), or None."""
    st = prog_stats_of_pid(pid)
    return sum(ns for ns, _cnt in st.values()) if st else None


# `python -c RUN_TREE TREE ARGS...`: `python -m engramprof ARGS...` with TREE's engramprof and TREE/probes
RUN_TREE = """
import importlib.util, os, runpy, sys
tree = sys.argv.pop(1)
sys.path.insert(0, tree)
init = os.path.join(tree, "probes", "__init__.py")
spec = importlib.util.spec_from_file_location("engramprof.probes", init,
                                              submodule_search_locations=[os.path.dirname(init)])
mod = importlib.util.module_from_spec(spec)
sys.modules["engramprof.probes"] = mod
spec.loader.exec_module(mod)
sys.argv[0] = "engramprof"
runpy.run_module("engramprof", run_name="__main__", alter_sys=True)
"""


def start_tracer(cmd: list[str], ready: str, stream: str = "stderr", tree: str | None = None) -> subprocess.Popen:
    """Start a tracer and return once it printed `ready` (engramprof: stderr; bpftrace: stdout);
    tree: run the engramprof of that checkout instead of this one (cmd: [PY, "-m", "engramprof", ...])."""
    if stream == "stderr":
        if tree:  # its probes too: the editable install maps engramprof.probes to this tree's probes/
            cmd = [cmd[0], "-c", RUN_TREE, tree, *cmd[3:]]
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=tree)
    else:
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    said = []
    for line in getattr(p, stream):
        if ready in line:
            return p
        said = (said + [line.rstrip()])[-5:]
    raise RuntimeError(f"tracer did not start: {cmd}: " + " | ".join(said))


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
    ap.add_argument("--baseline", metavar="TREE", help="also run engramprof (with --selectors: each selector) with the engramprof "
                    "of another checkout (e.g. `git archive OLD | tar -x -C TREE`), interleaved with this one's")
    ap.add_argument("--arms", metavar="SEL,...", help="with --selectors: only these selectors (e.g. `--arms=--pid` "
                    "with --baseline: this tree's probe beside another's, per program)")
    ap.add_argument("--checks", action="store_true", help="the target checks alone, side by side (only that)")
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
        if a.checks:
            check_costs(w, loop, a)
            w.stdin.close()
            w.wait()
            return 0
        if a.selectors:
            selector_overhead(tmp, w, loop, last_cpu, data, a)
            w.stdin.close()
            w.wait()
            return 0
        tracers = {"engramprof": None, **({"engramprof@base": os.path.abspath(a.baseline)} if a.baseline else {})}
        res: dict[str, list[float]] = {"untraced": [], **{k: [] for k in tracers}, "bpftrace": []}
        # BPF program time per call (bpf_stats): immune to the machine's scheduling noise,
        # but leaves out the tracepoint dispatch around the programs
        prog_ns: dict[str, list[float]] = {**{k: [] for k in tracers}, "bpftrace": []}
        held = contextlib.ExitStack()
        stats = held.enter_context(stats_enabled())

        def timed_loop(arm: str, pid: int) -> float:
            before = prog_run_ns(pid) if stats else None
            v = loop(a.calls)
            after = prog_run_ns(pid) if stats else None
            if before is not None and after is not None:
                prog_ns[arm].append((after - before) / a.calls)
            return v

        lost, recorded = [], []
        for r in range(a.rounds):
            res["untraced"].append(loop(a.calls))
            for k, tree in tracers.items():
                out = os.path.join(tmp, f"trace{r}")
                p = start_tracer([PY, "-m", "engramprof", "syscalls", "--pid", str(w.pid), "--output", out,
                                  "--hook", a.hook], "Tracing", tree=tree)
                res[k].append(timed_loop(k, p.pid))
                stop_tracer(p)
                meta = json.load(open(os.path.join(out, "meta.json")))
                lost.append(meta.get("lost_records"))
                recorded.append(meta.get("calls_written"))
                shutil.rmtree(out)
            if have_bpftrace:
                p = start_tracer(["bpftrace", "-e", BPFTRACE.format(pid=w.pid)], "Attaching", stream="stdout")
                time.sleep(0.5)
                res["bpftrace"].append(timed_loop("bpftrace", p.pid))
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
        print(f"engramprof{' (and @base, alternating)' if a.baseline else ''} lost records per run: {lost}; "
              f"records written per run: {recorded}")
        held.close()
        if prog_ns["engramprof"] and prog_ns["bpftrace"]:
            pe, pb = statistics.median(prog_ns["engramprof"]), statistics.median(prog_ns["bpftrace"])
            print(f"BPF program time per traced call (bpf_stats, the tracer process's programs, its sched/block hooks too): "
                  f"engramprof {pe:.0f} ns, bpftrace {pb:.0f} ns, ratio {pe / pb:.2f}")
            if prog_ns.get("engramprof@base"):
                po = statistics.median(prog_ns["engramprof@base"])
                print(f"  engramprof@base {po:.0f} ns, ratio {po / pb:.2f}; rounds: " + "; ".join(
                    f"{k} {', '.join(f'{x:.0f}' for x in v)}" for k, v in prog_ns.items()))

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

# ---- which program is which: the tracepoint each of a process's programs is attached to, and
# the probe it belongs to (BPF_TASK_FD_QUERY on its perf-event / raw-tracepoint fds; the probe
# from the ring buffer among the maps its programs share).  No bpftool needed.
BPF_PROG_GET_FD_BY_ID, BPF_MAP_GET_FD_BY_ID, BPF_OBJ_GET_INFO_BY_FD, BPF_TASK_FD_QUERY = 13, 14, 15, 20
BPF_MAP_TYPE_RINGBUF = 27
#: ring buffer name (as the kernel keeps it: 15 characters) -> the probe file it is in
PROBE_OF_RING = {"call_records": "preadv", "vm_events": "preadv", "fault_records": "faults",
                 "eviction_record": "evictions", "pagecache_recor": "pagecache", "offcpu_records": "sched"}


def _bpf(cmd: int, attr) -> int:
    import ctypes
    import platform

    from bpfstats import SYS_BPF

    libc = ctypes.CDLL(None, use_errno=True)
    return libc.syscall(SYS_BPF.get(platform.machine(), -1), cmd, ctypes.byref(attr), ctypes.sizeof(attr))


def _obj_info(fd: int, size: int, prep=None) -> bytes | None:
    import ctypes

    info = (ctypes.c_uint8 * size)()
    if prep:
        prep(info)
    attr = (ctypes.c_uint8 * 16)()
    ctypes.c_uint32.from_buffer(attr, 0).value = fd
    ctypes.c_uint32.from_buffer(attr, 4).value = size
    ctypes.c_uint64.from_buffer(attr, 8).value = ctypes.addressof(info)
    return bytes(info) if _bpf(BPF_OBJ_GET_INFO_BY_FD, attr) == 0 else None


def _prog_map_ids(prog_id: int) -> list[int]:
    import ctypes

    fd = _bpf(BPF_PROG_GET_FD_BY_ID, (ctypes.c_uint32 * 4)(prog_id, 0, 0, 0))
    if fd < 0:
        return []
    ids = (ctypes.c_uint32 * 64)()

    def prep(info):  # struct bpf_prog_info: nr_map_ids at 52, map_ids at 56
        ctypes.c_uint32.from_buffer(info, 52).value = 64
        ctypes.c_uint64.from_buffer(info, 56).value = ctypes.addressof(ids)
    try:
        info = _obj_info(fd, 256, prep)
    finally:
        os.close(fd)
    if info is None:
        return []
    return list(ids[:min(int.from_bytes(info[52:56], "little"), 64)])


def _map_type_name(map_id: int) -> tuple[int, str] | None:
    import ctypes

    fd = _bpf(BPF_MAP_GET_FD_BY_ID, (ctypes.c_uint32 * 4)(map_id, 0, 0, 0))
    if fd < 0:
        return None
    try:
        info = _obj_info(fd, 128)  # struct bpf_map_info: type at 0, name[16] at 24
    finally:
        os.close(fd)
    return None if info is None else (int.from_bytes(info[0:4], "little"), info[24:40].split(b"\0")[0].decode())


def prog_names_of_pid(pid: int) -> dict[int, str]:
    """prog_id -> "probe:tracepoint" for every program process ``pid`` has attached."""
    import ctypes

    attached: dict[int, str] = {}
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return {}
    for fd in fds:
        buf = ctypes.create_string_buffer(256)
        attr = (ctypes.c_uint8 * 48)()  # union bpf_attr.task_fd_query
        ctypes.memmove(ctypes.addressof(attr), (ctypes.c_uint32 * 4)(pid, int(fd), 0, 256), 16)
        ctypes.c_uint64.from_buffer(attr, 16).value = ctypes.addressof(buf)
        if _bpf(BPF_TASK_FD_QUERY, attr) == 0:
            attached[ctypes.c_uint32.from_buffer(attr, 24).value] = buf.value.decode()
    # programs sharing a map are one probe; the probe is named by its ring buffer
    maps = {p: _prog_map_ids(p) for p in attached}
    parent: dict[tuple, tuple] = {}

    def root(x: tuple) -> tuple:
        while parent.setdefault(x, x) != x:
            x = parent[x]
        return x
    for p, ids in maps.items():
        for m in ids:
            parent[root(("map", m))] = root(("prog", p))
    info = {m: _map_type_name(m) for ids in maps.values() for m in ids}
    probe: dict[tuple, str] = {}
    for p, ids in maps.items():
        for m in ids:
            if info[m] and info[m][0] == BPF_MAP_TYPE_RINGBUF:
                probe.setdefault(root(("prog", p)), PROBE_OF_RING.get(info[m][1], info[m][1]))
    return {p: f"{probe.get(root(('prog', p)), '?')}:{tp}" for p, tp in attached.items()}


def _leave_cgroup(root: str, cg: str, pid: int) -> None:
    """Move the worker back to ``root`` and remove the benchmark's cgroup ``cg``."""
    try:
        with open(os.path.join(root, "cgroup.procs"), "w") as f:
            f.write(str(pid))
    except OSError:
        pass
    os.rmdir(cg)


def selector_overhead(tmp: str, w: subprocess.Popen, loop, last_cpu: list, data: str, a) -> None:
    """ns/call the tracer adds selecting the worker by --pid, by --cgroup and by --file.

    Three figures per arm and round: the loop's wall time per call; the worker's own CPU time per
    call (CLOCK_THREAD_CPUTIME_ID: the BPF programs that run on its syscalls, and their dispatch,
    are charged to it; time other jobs take on the shared cores is not); and the tracer's BPF
    program time per call (bpf_stats), also net of the background: the same tracer's program time
    over an idle second right after the loop (the system-wide hooks firing for other processes),
    scaled to the loop's length and subtracted.  Then, per program (probe:tracepoint), its run
    time per traced call, its invocations per traced call and its run time per invocation, each
    arm side by side, and its background rate over the idle second: where a selector's cost goes."""
    root = CGROUP2 if os.path.isfile(os.path.join(CGROUP2, "cgroup.procs")) else "/sys/fs/cgroup"
    cg = os.path.join(root, f"engramprof-bench-{os.getpid()}")
    os.mkdir(cg)
    idle_s = 1.0
    held = contextlib.ExitStack()
    try:
        with open(os.path.join(cg, "cgroup.procs"), "w") as f:
            f.write(str(w.pid))
        sel = {"--pid": ["--pid", str(w.pid)], "--cgroup": ["--cgroup", cg], "--file": ["--file", data]}
        if a.arms:
            sel = {k: v for k, v in sel.items() if k in a.arms.split(",")}
        arms = {k: (None, v) for k, v in sel.items()}
        if a.baseline:
            arms.update({f"{k}@base": (os.path.abspath(a.baseline), v) for k, v in sel.items()})
        res: dict[str, list[float]] = {"untraced": [], **{k: [] for k in arms}}
        cpu: dict[str, list[float]] = {"untraced": [], **{k: [] for k in arms}}
        lost: dict[str, list] = {k: [] for k in arms}
        prog: dict[str, list[float]] = {k: [] for k in arms}
        net: dict[str, list[float]] = {k: [] for k in arms}
        # arm -> "probe:tracepoint" -> per round (ns per traced call, runs per traced call, idle ns per s)
        per: dict[str, dict[str, list[tuple[float, float, float]]]] = {k: {} for k in arms}
        stats = held.enter_context(stats_enabled())  # a counted bpf(BPF_ENABLE_STATS) fd
        names = list(arms)
        for r in range(a.rounds):
            res["untraced"].append(loop(a.calls))
            cpu["untraced"].append(last_cpu[0])
            for k in names[r % len(names):] + names[:r % len(names)]:
                out = os.path.join(tmp, f"sel{r}")
                tree, args = arms[k]
                p = start_tracer([PY, "-m", "engramprof", "syscalls", *args, "--output", out, "--hook", a.hook,
                                  "--no-offcpu", "--sample-hz", "0"], "Tracing", tree=tree)
                pnames = prog_names_of_pid(p.pid) if stats else {}
                before = prog_stats_of_pid(p.pid) if stats else {}
                t0 = time.monotonic()
                res[k].append(loop(a.calls))
                took = time.monotonic() - t0
                cpu[k].append(last_cpu[0])
                after = prog_stats_of_pid(p.pid) if stats else {}
                time.sleep(idle_s)  # the worker idle: what the tracer's programs cost without it
                idle = prog_stats_of_pid(p.pid) if stats else {}
                tb, ta, ti = (sum(ns for ns, _ in d.values()) for d in (before, after, idle))
                if before and ta > tb:
                    prog[k].append((ta - tb) / a.calls)
                    net[k].append((ta - tb - (ti - ta) * took / idle_s) / a.calls)
                    for pid_, label in pnames.items():
                        if pid_ in before and pid_ in after and pid_ in idle:
                            (nb, cb), (na, ca), ni = before[pid_], after[pid_], idle[pid_][0]
                            row = ((na - nb) / a.calls, (ca - cb) / a.calls, (ni - na) / idle_s)
                            per[k].setdefault(label, []).append(row)
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
        held.close()
        _leave_cgroup(root, cg, w.pid)
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
            if "--pid" + sfx not in med:
                continue
            base = med["--pid" + sfx] - med["untraced"]
            for k in [x + sfx for x in ("--cgroup", "--file") if x + sfx in med]:
                add = med[k] - med["untraced"]
                ratio = f"{add / base:.2f}" if base > 0 else "n/a (--pid adds nothing measurable)"
                print(f"  {k} adds {add:.0f} ns/call, --pid{sfx} {base:.0f}: ratio {ratio} (target <= 1.10)")
    print("(lost records, records written) per run: " + "; ".join(f"{k} {v}" for k, v in lost.items()))
    for title, d in (("BPF program time per call (bpf_stats, the tracer's programs, median)", prog),
                     ("BPF program time per call net of the background (idle second after each loop)", net)):
        if not all(d.values()):
            print(f"{title}: not measured (BPF statistics could not be enabled)")
            continue
        pm = {k: statistics.median(v) for k, v in d.items()}
        print(f"{title}: " + ", ".join(f"{k} {v:.0f} ns" for k, v in pm.items()) + "; rounds: " + "; ".join(
            f"{k} {', '.join(f'{x:.0f}' for x in v)}" for k, v in d.items()))
        lo = {k: min(v) for k, v in d.items()}  # others' load only adds: the least round is the quietest
        for sfx in ("", "@base") if a.baseline else ("",):
            for k in [x + sfx for x in ("--cgroup", "--file") if x + sfx in pm and "--pid" + sfx in pm]:
                print(f"  {k} / --pid{sfx}: median {pm[k] / pm['--pid' + sfx]:.2f}, least round "
                      f"{lo[k]:.0f} / {lo['--pid' + sfx]:.0f} ns = {lo[k] / lo['--pid' + sfx]:.2f} (target <= 1.10)")
    if any(per.values()):
        print_per_program(per, names)


def print_per_program(per: dict, names: list[str]) -> None:
    """Per program, arms side by side (medians over rounds): ns per traced call, runs per traced
    call, ns per run; then the background (ns a second with the worker idle).  Programs that cost
    under 1 ns a call in every arm and fired under 1 time in 100 calls are summed in one line."""
    labels = sorted({lb for d in per.values() for lb in d})

    def med(k: str, lb: str, i: int) -> float | None:
        rows = per[k].get(lb)
        return statistics.median(r[i] for r in rows) if rows else None
    cost = {lb: max((med(k, lb, 0) or 0) for k in names) for lb in labels}
    print("per program (median over rounds): ns per traced call / runs per traced call / ns per run;"
          " idle: ns a second with the worker idle (the background)")
    print(f"  {'probe:tracepoint':36s}" + "".join(f" {k:>26s}" for k in names) + "".join(
        f" {'idle ' + k:>14s}" for k in names))
    small = {k: 0.0 for k in names}
    for lb in sorted(labels, key=lambda x: -cost[x]):
        vals = {k: (med(k, lb, 0), med(k, lb, 1), med(k, lb, 2)) for k in names}
        if cost[lb] < 1 and all((v[1] or 0) < 0.01 for v in vals.values()):
            for k in names:
                small[k] += vals[k][0] or 0
            continue
        cells = []
        for k in names:
            ns, runs, _idle = vals[k]
            cells.append(f" {'-':>26s}" if ns is None else
                         f" {ns:8.1f} / {runs:6.3f} / {(ns / runs if runs else 0):6.1f}")
        idles = "".join(f" {'-':>14s}" if vals[k][2] is None else f" {vals[k][2] / 1000:11.1f} us" for k in names)
        print(f"  {lb:36s}" + "".join(cells) + idles)
    print(f"  {'(the rest, each < 1 ns a call)':36s}" + "".join(f" {small[k]:8.1f}{'':18s}" for k in names))
    if "--pid" in names:
        print("  where each selector's extra cost sits (ns per traced call over --pid's, programs over 5 ns):")
        for k in names:
            if k == "--pid" or "@" in k:
                continue
            diffs = sorted(((med(k, lb, 0) or 0) - (med("--pid", lb, 0) or 0), lb) for lb in labels)
            print(f"   {k}: " + ", ".join(f"{lb} {d:+.0f}" for d, lb in reversed(diffs) if abs(d) >= 5))
    pairs = [k for k in names if "@" not in k and k + "@base" in names]
    if pairs:
        print("  this tree over the baseline (ns per traced call, programs that moved 3 ns or more):")
        for k in pairs:
            diffs = sorted(((med(k, lb, 0) or 0) - (med(k + "@base", lb, 0) or 0), lb) for lb in labels)
            print(f"   {k}: " + (", ".join(f"{lb} {d:+.0f}" for d, lb in diffs if abs(d) >= 3) or "none"))


#: targets.h's ways of telling a target (and the empty floor), as a C expression
CHECKS = {
    "empty": "0",
    "one --pid (compare)": "(bpf_get_current_pid_tgid() >> 32) == TGID",
    "--cgroup (ancestor id)": "bpf_get_current_ancestor_cgroup_id(CG_LEVEL) == CG_ID",
    "--cgroup (id hash)": "({u64 c = bpf_get_current_cgroup_id(); target_cgroups.lookup(&c) != 0;})",
    "--pid set (tgid hash)": "({u32 t = bpf_get_current_pid_tgid() >> 32; target_tgids.lookup(&t) != 0;})",
}
CHECK_PROGRAM = r"""
BPF_HASH(target_cgroups, u64, u8, 4096);
BPF_HASH(target_tgids, u32, u8, 16384);
BPF_PERCPU_ARRAY(passed, u64, 1);
RAW_TRACEPOINT_PROBE(sys_enter)
{
	int zero = 0;
	u64 *n = passed.lookup(&zero);
	if (n)
		*n += (CHECK);
	return 0;
}
"""


def check_costs(w: subprocess.Popen, loop, a) -> None:
    """What each target check costs a hook, alone: one program per check on raw_syscalls:sys_enter
    (every syscall of every task; the worker's preadv2 calls are most of them and pass every
    check), all attached at once so they share every round; ns per run from bpf_stats.  Programs
    on one tracepoint run in attach order and the first pays more (cold caches): a second pass
    attaches them in the reverse order, and the figure is the mean of the two passes' medians."""
    import ctypes

    from bcc import BPF

    from bpfstats import prog_stats_of_bcc
    from engramprof.bpf import targets

    root = CGROUP2 if os.path.isfile(os.path.join(CGROUP2, "cgroup.procs")) else "/sys/fs/cgroup"
    cg = os.path.join(root, f"engramprof-bench-{os.getpid()}")
    os.mkdir(cg)
    per: dict[str, list[float]] = {k: [] for k in CHECKS}
    try:
        with open(os.path.join(cg, "cgroup.procs"), "w") as f:
            f.write(str(w.pid))
        level, cg_id = targets.cgroup_level(cg), os.stat(cg).st_ino
        if level is None:
            print("--checks: cgroup levels not known here (a cgroup namespace)")
            return
        with stats_enabled():
            for order in (list(CHECKS), list(reversed(CHECKS))):
                objs = {}
                for name in order:
                    text = CHECK_PROGRAM.replace("(CHECK)", f"({CHECKS[name]})")
                    b = BPF(text=text.encode(), cflags=[f"-DTGID={w.pid}", f"-DCG_ID={cg_id}", f"-DCG_LEVEL={level}"])
                    b["target_cgroups"][ctypes.c_uint64(cg_id)] = ctypes.c_uint8(1)
                    b["target_tgids"][ctypes.c_uint32(w.pid)] = ctypes.c_uint8(1)
                    objs[name] = b
                rounds: dict[str, list[float]] = {k: [] for k in CHECKS}
                for _ in range(a.rounds):
                    before = {k: next(iter(prog_stats_of_bcc(b).values())) for k, b in objs.items()}
                    loop(a.calls)
                    for k, b in objs.items():
                        (n0, c0), (n1, c1) = before[k], next(iter(prog_stats_of_bcc(b).values()))
                        rounds[k].append((n1 - n0) / max(c1 - c0, 1))
                for k in CHECKS:
                    per[k].append(statistics.median(rounds[k]))
                    print(f"  {'forward' if order[0] == 'empty' else 'reverse'} {k:24s} ns per run, rounds: "
                          + ", ".join(f"{x:.1f}" for x in rounds[k]), flush=True)
                for b in objs.values():
                    b.cleanup()
    finally:
        _leave_cgroup(root, cg, w.pid)
    with open("/proc/loadavg") as f:
        load = " ".join(f.read().split()[:3])
    mean = {k: statistics.mean(v) for k, v in per.items()}
    print(f"target checks on raw_syscalls:sys_enter, {a.calls:,} worker calls x {a.rounds} rounds x 2 attach orders; "
          f"load average at the end {load}; ns per run (mean of the two orders' medians), and over the empty program:")
    for k, v in mean.items():
        extra = "" if k == "empty" else f"  (+{v - mean['empty']:.1f}; over one --pid's {v - mean['one --pid (compare)']:+.1f})"
        print(f"  {k:24s} {v:6.1f}{extra}")


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
