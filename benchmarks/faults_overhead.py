#!/usr/bin/env python3
"""What does the page-fault probe add to each traced fault of a memory-mapped reader?

Two worker processes each map their own copy of a table (numpy.memmap, read-only,
MADV_RANDOM) and gather one byte from each of K pages 16 pages apart (one fault each, fault-
around cannot serve the next one):

  cold     the pages evicted first (MADV_DONTNEED on the mapping + POSIX_FADV_DONTNEED): every
           gather is a major fault with a device read;
  cached   the pages cached but unmapped (MADV_DONTNEED on the mapping only): every gather is a
           minor fault (filemap map_pages), repeated R times: the probe's cost without the I/O.

Arms, interleaved round by round in one run so the shared machine's noise hits them alike:

  untraced     nothing attached
  engramprof   `engramprof syscalls --pid T --output TRACE` (every probe, the collector's decode,
               enrichment and Parquet)
  probes       the preadv, off-CPU and fault probes loaded in this process and drained into the
               void every 50 ms: the kernel side of the engramprof arm without its user space
  fault-probe  the fault probe alone, drained into the void: without the other probes
  bpftrace     a bpftrace one-liner keeping a histogram of the same faults of T:
               page_fault_user -> (mm_filemap_fault | mm_filemap_map_pages) time, in a hist()
               (a cached fault fires only map_pages)
  floor        bpftrace programs that only test `pid == T` on every tracepoint engramprof
               attaches (the empty-program floor for any other process)
  before       (with --before-tree DIR) the engramprof arm run from another checkout: a
               before/after of the recorder measured side by side in the same run

The target T is worker 1; worker 2 is the untraced, fault-heavy other process, timed in every
arm.  The arms' order is reversed every other round (drift in the machine's load hits the
first and last arms alike), and each arm takes --measurements cached gathers per round (the
target's and the other process's alternating).  Per fault, median over rounds and measurements: the gather's wall time and the faulting process's CPU
time (user + system: what the programs cost in its own context, without the time it waited
for a CPU the collector or anyone else held), what each arm adds, and the ratios to bpftrace
(target: engramprof <= 0.7x); the ns added to the other process's faults (target: within the
floor).  With kernel.bpf_stats_enabled=1 (set for the run): the run time of every BPF program
each tracer holds during the target's gather (from /proc/PID/fdinfo: no bpftool), per program
for the in-process arms; and the engramprof collector's own CPU per fault (every thread's
sum_exec_runtime from /proc/PID/task/*/schedstat: ns, not clock ticks), less its idle rate
(measured over the 0.5 s before the first gather of each arm).

Needs root and bpftrace.  Usage: benchmarks/faults_overhead.py [--rounds 3] [--pages 1500]
[--cached-repeat 20] [--measurements 3] [--arms untraced,engramprof,probes,fault-probe,bpftrace,floor]
[--before-tree DIR]; benchmarks/faults_overhead.py --pipeline 4096: the recorder's user-space
cost per record alone (no root, no probe).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from syscalls_overhead import start_tracer, stop_tracer  # noqa: E402

PY = sys.executable
WORKER = r"""
import mmap, os, resource, sys, time
import numpy as np
path = sys.argv[1]
fd = os.open(path, os.O_RDONLY)
size = os.fstat(fd).st_size
mm = np.memmap(path, dtype=np.uint8, mode="r", shape=(size,))
raw = mm._mmap
raw.madvise(mmap.MADV_RANDOM)
PS = mmap.PAGESIZE
rng = np.random.default_rng(int(sys.argv[2]))
windows = size // (16 * PS)
for line in sys.stdin:
    cmd = line.split()
    mode, k, rep = cmd[0], int(cmd[1]), int(cmd[2])
    idx = rng.choice(windows, min(k, windows), replace=False) * 16 * PS
    total = 0
    cpu = 0
    faults = 0
    ru_all = resource.getrusage(resource.RUSAGE_SELF)
    for r in range(rep):
        raw.madvise(mmap.MADV_DONTNEED)  # unmap: the next touch faults
        if mode == "cold":
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        else:
            int(mm[idx].sum()); raw.madvise(mmap.MADV_DONTNEED)  # cached, not mapped
        ru0 = resource.getrusage(resource.RUSAGE_SELF)
        c = time.process_time_ns()
        t = time.perf_counter_ns()
        s = int(mm[idx].sum())
        total += time.perf_counter_ns() - t
        cpu += time.process_time_ns() - c
        ru1 = resource.getrusage(resource.RUSAGE_SELF)
        faults += (ru1.ru_majflt - ru0.ru_majflt) + (ru1.ru_minflt - ru0.ru_minflt)
    ru_end = resource.getrusage(resource.RUSAGE_SELF)
    every = (ru_end.ru_majflt - ru_all.ru_majflt) + (ru_end.ru_minflt - ru_all.ru_minflt)
    print(f"{total} {cpu} {faults} {every}", flush=True)
"""

BPFTRACE = ("tracepoint:exceptions:page_fault_user /pid == {pid}/ {{ @s[tid] = nsecs; }} "
            "tracepoint:filemap:mm_filemap_fault /pid == {pid} && @s[tid]/ "
            "{{ @us = hist((nsecs - @s[tid]) / 1000); delete(@s[tid]); }} "
            "tracepoint:filemap:mm_filemap_map_pages /pid == {pid} && @s[tid]/ "
            "{{ @us = hist((nsecs - @s[tid]) / 1000); delete(@s[tid]); }}")
#: every tracepoint an engramprof recording attaches that a faulting process can fire
FLOOR_TPS = ["exceptions:page_fault_user", "filemap:mm_filemap_fault", "filemap:mm_filemap_map_pages",
             "filemap:mm_filemap_add_to_page_cache", "raw_syscalls:sys_enter", "raw_syscalls:sys_exit",
             "sched:sched_switch", "sched:sched_wakeup", "sched:sched_waking", "block:block_bio_queue",
             "block:block_rq_complete", "vmscan:mm_vmscan_direct_reclaim_begin"]
ARMS = ["untraced", "engramprof", "probes", "fault-probe", "bpftrace", "floor", "before"]
RECORDERS = ("engramprof", "before")  # arms that run `engramprof syscalls`


def floor_prog(pid: int) -> str:
    return " ".join(f"tracepoint:{tp} /pid == {pid}/ {{ @c{i} = count(); }}" for i, tp in enumerate(FLOOR_TPS))


def prog_fd_stats(pid: int) -> dict[int, tuple[int, int]]:
    """prog_id -> (run_time_ns, run_cnt) of every BPF program fd process ``pid`` holds
    (kernel.bpf_stats_enabled=1; /proc/PID/fdinfo, no bpftool needed)."""
    out = {}
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return out
    for fd in fds:
        try:
            if "bpf-prog" not in os.readlink(f"/proc/{pid}/fd/{fd}"):
                continue
            kv = dict(line.split(":\t", 1) for line in open(f"/proc/{pid}/fdinfo/{fd}").read().splitlines()
                      if ":\t" in line)
            out[int(kv["prog_id"])] = (int(kv["run_time_ns"]), int(kv["run_cnt"]))
        except (OSError, KeyError, ValueError):
            continue
    return out


def cpu_ns(pid: int) -> int:
    """CPU time of every live thread of process ``pid`` so far (ns): the scheduler's
    sum_exec_runtime (/proc/PID/task/TID/schedstat), not utime + stime in clock ticks (10 ms)."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # a thread that just exited
    return total


def prog_total_ns(pid: int) -> int:
    return sum(v[0] for v in prog_fd_stats(pid).values())


class InProcessProbes:
    """The engramprof probes loaded in this process, drained into the void every 50 ms (the
    recorder's own cadence) with no decode, enrichment or Parquet: the kernel side alone."""

    def __init__(self, pid: int, which: tuple[str, ...]):
        from engramprof.bpf import faults as fp
        from engramprof.bpf import loader, sched

        self.probes = {}
        if "preadv" in which:
            self.probes["preadv"] = loader.LoadedProbe(loader.plan(loader.ProbeConfig(tgid=pid)))
        if "sched" in which:
            self.probes["sched"] = sched.LoadedSchedProbe(sched.plan(sched.SchedConfig(tgid=pid)))
        if "faults" in which:
            self.probes["faults"] = fp.LoadedFaultProbe(fp.plan(fp.FaultProbeConfig(tgid=pid)))
        self.records = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._drain_loop, daemon=True)
        self._t.start()

    def _drain_loop(self):
        while not self._stop.wait(0.05):
            self.drain()

    def drain(self):
        for p in self.probes.values():
            self.records += len(p.ring.drain())
            if hasattr(p, "vm_ring"):
                p.vm_ring.drain()

    def prog_stats(self) -> dict[str, tuple[int, int]]:
        """'probe:function' -> (run_time_ns, run_cnt)."""
        out = {}
        for name, p in self.probes.items():
            for fn, f in p.bpf.funcs.items():
                kv = dict(line.split(":\t", 1) for line in open(f"/proc/self/fdinfo/{f.fd}").read().splitlines()
                          if ":\t" in line)
                short = fn.decode().replace("raw_tracepoint__", "raw:").replace("tracepoint__", "").replace("__", ":")
                out[f"{name} {short}"] = (int(kv["run_time_ns"]), int(kv["run_cnt"]))
        return out

    def close(self):
        self._stop.set()
        self._t.join()
        for p in self.probes.values():
            p.detach() if hasattr(p, "detach") else None
            p.close()


class Worker:
    def __init__(self, path: str, seed: int):
        self.p = subprocess.Popen([PY, "-c", WORKER, path, str(seed)], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)
        self.pid = self.p.pid
        self.last_faults = 0

    def run(self, mode: str, k: int, rep: int) -> tuple[float, float]:
        """(wall ns, CPU ns) per fault of one gather batch."""
        self.p.stdin.write(f"{mode} {k} {rep}\n")
        self.p.stdin.flush()
        ns, cpu, faults, every = map(int, self.p.stdout.readline().split())
        self.last_faults = every  # every fault of the command (the untimed set-up's too)
        return ns / max(faults, 1), cpu / max(faults, 1)

    def close(self):
        self.p.stdin.close()
        self.p.wait()


def _med(v):
    return statistics.median(v) if v else float("nan")


def pipeline_cost(n: int, path: str) -> int:
    """The recorder's user-space work per fault record, stage by stage, on synthetic drains of
    ``n`` records of one mapped file (no probe, no root): the ring's copy of the payloads, the
    decoder, the mapping + tensor enrichers, the Arrow table, and the Parquet part of about a
    second of drains (the writer thread's work; the trace writer's own options).  CPU time,
    the best of 5 repetitions."""
    import io
    import mmap

    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from engramprof.bpf import layout
    from engramprof.bpf.ringbuf import HDR
    from engramprof.record import faults as rf
    from engramprof.record.columns import EventTableBuilder
    from engramprof.record.decode import syscall_names
    from engramprof.record.enrich import PerPid, TensorEnricher
    from engramprof.record.strings import Interner
    from engramprof.trace.schema import DICT_COLUMNS, EVENT_SCHEMA, WRITE_SCHEMA, with_fault_columns

    fd = os.open(path, os.O_RDONLY)
    mm = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
    st = os.fstat(fd)
    base = next(int(line.split("-")[0], 16) for line in open("/proc/self/maps") if path in line)
    dt = layout.struct_dtype("fault_record")
    bits = layout.header_defines("FAULT_")
    idx = np.random.default_rng(1).integers(0, os.fstat(fd).st_size // 4096, n)
    slot = (HDR + dt.itemsize + 7) & ~7
    ring = np.zeros(n * slot, np.uint8)  # the ring's slots: an 8-byte header, then the record
    recs = ring.reshape(n, slot)[:, HDR:HDR + dt.itemsize].view(dt).reshape(-1)
    recs["ts_ns"] = time.monotonic_ns() + np.arange(n) * 5000
    recs["dur_ns"], recs["pid"], recs["tid"], recs["mapped_pages"] = 1500, os.getpid(), os.getpid(), 1
    recs["dev"], recs["ino"] = (os.major(st.st_dev) << 20) | os.minor(st.st_dev), st.st_ino
    recs["index"] = recs["map_first"] = idx
    recs["address"] = base + idx * 4096
    recs["flags"] = bits["ADDRESS"]  # cached faults: fault-around only, the exact page from the address
    paths, tensors = Interner(""), Interner("")
    dec = rf.FaultDecoder(dt, 0, True)
    maps = PerPid(lambda pid: rf.MappingPathEnricher(pid, paths))
    tens = TensorEnricher(paths, tensors)
    build = EventTableBuilder(pa.array(syscall_names(), type=pa.string()), paths, tensors, missing=["ret"])

    def best(fn, reps=20):
        fn()
        out = []
        for _ in range(5):
            t0 = time.process_time_ns()
            for _ in range(reps):
                fn()
            out.append((time.process_time_ns() - t0) / reps / n)
        return min(out)

    def enriched():
        b = dec.decode(recs)
        maps.enrich(b)
        tens.enrich(b)
        return b

    b = enriched()
    table = build.build(b)
    part = pa.concat_tables([table] * max(1, 60_000 // n))  # ~a second of drains, as the sink hands over
    part = with_fault_columns(part).select(EVENT_SCHEMA.names).cast(WRITE_SCHEMA)
    slots = np.dtype({"names": ["len", "pgoff", "rec"], "formats": ["<u4", "<u4", dt], "offsets": [0, 4, HDR],
                      "itemsize": slot})
    rows = {"ring copy (bytes)": best(lambda: ring.reshape(n, slot)[:, HDR:HDR + dt.itemsize].copy()),
            "ring copy (structured field)": best(lambda: ring.view(slots)["rec"].copy()),
            "decode": best(lambda: dec.decode(recs)),
            "decode + enrich": best(enriched),
            "table": best(lambda: build.build(b))}
    for comp, stats in (("zstd", True), ("zstd", False), ("lz4", True), ("lz4", False)):
        def write(comp=comp, stats=stats):
            pq.write_table(part, io.BytesIO(), compression=comp, write_statistics=stats,
                           use_dictionary=[c for c in DICT_COLUMNS if c in part.column_names])
        rows[f"parquet {comp}{'' if stats else ', no statistics'}"] = best(write, reps=2) * n / part.num_rows
    mm.close()
    os.close(fd)
    print(f"fault recorder, user space, CPU ns per record ({n:,}-record drains; load {os.getloadavg()[0]:.2f}):")
    for k, v in rows.items():
        print(f"  {k:32s} {v:6.0f}")
    print("  (the trace writer uses zstd with statistics: engramprof/trace/writer.py)")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--pages", type=int, default=1500, help="faults per gather (pages 16 apart)")
    ap.add_argument("--cached-repeat", type=int, default=20, help="cached gathers per measurement")
    ap.add_argument("--dir", default="/var/tmp", help="where the tables go (a disk, not tmpfs: cold faults)")
    ap.add_argument("--measurements", type=int, default=3, help="cached measurements per arm and round")
    ap.add_argument("--arms", default=",".join(ARMS[:-1]), help=f"comma-separated subset of {','.join(ARMS)}")
    ap.add_argument("--before-tree", help="a checkout whose engramprof the 'before' arm runs (before/after)")
    ap.add_argument("--pipeline", type=int, metavar="N",
                    help="only the recorder's user-space cost per record, stage by stage, on N-record drains")
    a = ap.parse_args()
    if a.pipeline:
        with tempfile.NamedTemporaryFile(dir=a.dir, prefix="engramprof-faults-pipeline-") as f:
            f.write(os.urandom(64 << 20))
            f.flush()
            return pipeline_cost(a.pipeline, f.name)
    if os.geteuid() != 0:
        print("needs root", file=sys.stderr)
        return 1
    if not shutil.which("bpftrace"):
        print("needs bpftrace (scripts/setup.sh installs it)", file=sys.stderr)
        return 1
    arms = [x for x in ARMS if x in a.arms.split(",")]
    if a.before_tree and "before" not in arms:
        arms.append("before")
    if "before" in arms and not a.before_tree:
        print("the 'before' arm needs --before-tree DIR", file=sys.stderr)
        return 2
    if "untraced" not in arms:
        arms.insert(0, "untraced")
    tmp = tempfile.mkdtemp(prefix="engramprof-faults-bench-", dir=a.dir)
    size = a.pages * 16 * 4096 + (1 << 20)
    paths = []
    for i in range(2):
        p = os.path.join(tmp, f"table{i}.bin")
        with open(p, "wb") as f:
            f.write(os.urandom(size))
            os.fsync(f.fileno())
        paths.append(p)
    t, o = Worker(paths[0], 1), Worker(paths[1], 2)
    modes = [("cold", 1), ("cached", a.cached_repeat)]
    res = {(arm, who, m): [] for arm in arms for who in ("target", "other") for m, _ in modes}
    cpu = {(arm, who, m): [] for arm in arms for who in ("target", "other") for m, _ in modes}
    prog = {(arm, m): [] for arm in arms for m, _ in modes}  # BPF program ns per target fault (all programs)
    per_prog = {(arm, m): {} for arm in ("probes", "fault-probe") for m, _ in modes}
    collector = {(arm, m): [] for arm in RECORDERS for m, _ in modes}  # its own CPU per target fault, less idle
    idle_rate = {arm: [] for arm in RECORDERS}  # the collector's CPU ns per s with nothing to record
    stats = subprocess.run(["sysctl", "-qw", "kernel.bpf_stats_enabled=1"]).returncode == 0
    lost = []
    load0 = os.getloadavg()
    try:
        for w in (t, o):  # warm up: numpy import, first mapping
            for m, r in modes:
                w.run(m, a.pages, 1)
        for rnd in range(a.rounds):
            for arm in (arms if rnd % 2 == 0 else arms[::-1]):
                p, out, inproc = None, None, None
                if arm in RECORDERS:
                    out = os.path.join(tmp, f"trace{rnd}-{arm}")
                    tree = a.before_tree if arm == "before" else None
                    p = start_tracer([PY, "-m", "engramprof", "syscalls", "--pid", str(t.pid), "--output", out,
                                      "--sample-hz", "0"], "Tracing", tree=tree)
                elif arm == "probes":
                    inproc = InProcessProbes(t.pid, ("preadv", "sched", "faults"))
                elif arm == "fault-probe":
                    inproc = InProcessProbes(t.pid, ("faults",))
                elif arm == "bpftrace":
                    p = start_tracer(["bpftrace", "-e", BPFTRACE.format(pid=t.pid)], "Attaching", stream="stdout")
                elif arm == "floor":
                    p = start_tracer(["bpftrace", "-e", floor_prog(t.pid)], "Attaching", stream="stdout")
                if p is not None or inproc is not None:
                    c0, w0 = (cpu_ns(p.pid), time.monotonic_ns()) if arm in RECORDERS else (0, 0)
                    time.sleep(0.5)
                    if arm in RECORDERS:
                        idle_rate[arm].append((cpu_ns(p.pid) - c0) / (time.monotonic_ns() - w0) * 1e9)
                for m, r, k in [(m, r, k) for m, r in modes for k in range(a.measurements if m == "cached" else 1)]:
                    holder = p.pid if p is not None else os.getpid()
                    before = prog_total_ns(holder) if stats and arm != "untraced" else None
                    pp0 = inproc.prog_stats() if stats and inproc is not None else None
                    c0, w0 = (cpu_ns(p.pid), time.monotonic_ns()) if arm in RECORDERS else (None, 0)
                    wall_ns, cpu_ns_ = t.run(m, a.pages, r)
                    if c0 is not None:
                        time.sleep(0.3)  # the drains (every 0.25 s at most) of the gather's records
                        idle = idle_rate[arm][-1] * (time.monotonic_ns() - w0) / 1e9
                        collector[(arm, m)].append((cpu_ns(p.pid) - c0 - idle) / max(t.last_faults, 1))
                    res[(arm, "target", m)].append(wall_ns)
                    cpu[(arm, "target", m)].append(cpu_ns_)
                    nf = max(t.last_faults, 1)  # BPF time is over the whole command: per fault of it
                    if before is not None:
                        prog[(arm, m)].append((prog_total_ns(holder) - before) / nf)
                    if pp0 is not None:
                        pp1 = inproc.prog_stats()
                        for k, (ns, cnt) in pp1.items():
                            d = per_prog[(arm, m)].setdefault(k, [[], []])
                            d[0].append((ns - pp0[k][0]) / nf)
                            d[1].append((cnt - pp0[k][1]) / nf)
                    wall_ns, cpu_ns_ = o.run(m, a.pages, r)
                    res[(arm, "other", m)].append(wall_ns)
                    cpu[(arm, "other", m)].append(cpu_ns_)
                if inproc is not None:
                    inproc.close()
                if p is not None:
                    stop_tracer(p)
                if out:
                    meta = json.load(open(os.path.join(out, "meta.json")))
                    f = meta.get("faults") or {}
                    lost.append((arm, f.get("faults"), f.get("major"), f.get("lost_records")))
                    shutil.rmtree(out, ignore_errors=True)
            print(f"round {rnd + 1}/{a.rounds} done", file=sys.stderr, flush=True)
    finally:
        t.close()
        o.close()
        if stats:
            subprocess.run(["sysctl", "-qw", "kernel.bpf_stats_enabled=0"])
        shutil.rmtree(tmp, ignore_errors=True)
    load1 = os.getloadavg()

    med = {k: _med(v) for k, v in res.items()}
    mcpu = {k: _med(v) for k, v in cpu.items()}
    print(f"memmap gathers of {a.pages:,} pages 16 apart (one fault each), {a.rounds} rounds interleaved; "
          f"cached: {a.cached_repeat} gathers per measurement, {a.measurements} measurements per arm and round; "
          f"load average {load0[0]:.2f} at start, "
          f"{load1[0]:.2f} at end (1 min).")
    print("Median ns per fault, wall [CPU time of the faulting process] (added over untraced):")
    for m, _ in modes:
        for who in ("target", "other"):
            base, cbase = med[("untraced", who, m)], mcpu[("untraced", who, m)]
            cells = [f"untraced {base:,.0f} [{cbase:,.0f}]"] + [
                f"{arm} {med[(arm, who, m)]:,.0f} ({med[(arm, who, m)] - base:+,.0f}) "
                f"[{mcpu[(arm, who, m)]:,.0f} ({mcpu[(arm, who, m)] - cbase:+,.0f})]" for arm in arms[1:]]
            print(f"  {m:6s} {who:6s}  " + "   ".join(cells))
    for m, _ in modes:
        base, cbase = med[("untraced", "target", m)], mcpu[("untraced", "target", m)]
        if "bpftrace" in arms:
            ba, bc = med[("bpftrace", "target", m)] - base, mcpu[("bpftrace", "target", m)] - cbase
            for arm in ("engramprof", "before", "probes", "fault-probe"):
                if arm not in arms:
                    continue
                ea, ec = med[(arm, "target", m)] - base, mcpu[(arm, "target", m)] - cbase
                r = f"{ea / ba:.2f}" if ba > 0 else "n/a (bpftrace added nothing measurable)"
                rc = f"{ec / bc:.2f}" if bc > 0 else "n/a"
                print(f"{m}: target fault: {arm} adds {ea:+,.0f} ns wall [{ec:+,.0f} CPU], bpftrace one-liner "
                      f"{ba:+,.0f} [{bc:+,.0f}]: ratio {r} wall, {rc} CPU (target <= 0.70)")
        if "floor" in arms:
            fo = med[("floor", "other", m)] - med[("untraced", "other", m)]
            for arm in ("engramprof", "before", "probes", "fault-probe"):
                if arm in arms:
                    eo = med[(arm, "other", m)] - med[("untraced", "other", m)]
                    print(f"{m}: other process's fault: {arm} adds {eo:+,.0f} ns, the empty-program floor "
                          f"{fo:+,.0f} ns (target: within the floor)")
    if stats:
        print("BPF program time per target fault (bpf_stats: run_time_ns of every program the tracer holds, "
              "during the target's gather; includes every other process's events those programs saw):")
        for m, _ in modes:
            print(f"  {m:6s} " + "   ".join(f"{arm} {_med(prog[(arm, m)]):,.0f} ns" for arm in arms[1:]
                                            if prog[(arm, m)]))
        for (arm, m), d in per_prog.items():
            if not d:
                continue
            rows = sorted(d.items(), key=lambda kv: -_med(kv[1][0]))
            print(f"  {arm} {m}: per program, ns per target fault (runs per target fault):")
            for k, (ns, cnt) in rows:
                if _med(cnt) > 0.001:
                    print(f"      {k:55s} {_med(ns):8,.0f} ns  ({_med(cnt):.2f} runs, "
                          f"{_med(ns) / max(_med(cnt), 1e-9):,.0f} ns a run)")
    for arm in RECORDERS:
        if idle_rate[arm]:
            print(f"{arm} collector CPU (every thread: drain, decode, enrich, Parquet; schedstat ns) per target fault, "
                  f"over the gather + 0.3 s, less its idle rate ({_med(idle_rate[arm]) / 1e6:.1f} ms/s): "
                  + ", ".join(f"{m} {_med(collector[(arm, m)]):,.0f} ns" for m, _ in modes if collector[(arm, m)]))
    if "bpftrace" in arms:  # the spread behind the medians: what each round's arm added (its own round's untraced)
        for m, _ in modes:
            n = len(res[("untraced", "target", m)])
            rows = []
            for arm in [x for x in arms if x != "untraced"]:
                added = [res[(arm, "target", m)][i] - res[("untraced", "target", m)][i] for i in range(n)]
                rows.append(f"{arm} " + "/".join(f"{v / 1000:+.1f}" for v in added))
            print(f"  {m} target, us added per fault, each measurement: " + "   ".join(rows))
    print(f"engramprof fault totals per run (arm, faults, major, lost records): {lost}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
