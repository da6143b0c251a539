#!/usr/bin/env python3
"""What does the io_uring probe (probes/uring.bpf.c) add to each io_uring read, next to a bpftrace
one-liner that histograms the same requests from submit to complete?

The workload is fio (Debian's package): ``--ioengine=io_uring``, random 4 KiB reads of a 64 MiB
file kept in the page cache (read once first, ``--invalidate=0``), iodepth 1, ``--thread`` (one
process), a fixed number of requests.  Cached reads complete inline in a few us, so a tracer's
cost per request shows.  Arms, interleaved round by round in one run (the order shuffled each
round) so the shared machine's noise hits them alike:

  untraced   no program attached
  empty      empty BPF programs on every tracepoint the probe attaches (the floor): the three
             io_uring ones (submit_req, queue_async_work, complete), the page-cache insertion
             and the block ones (with --before-tree: the before probe also had file_get and
             sys_exit_io_uring_enter, so its floor is not this one)
  engramprof the io_uring probe (engramprof/bpf/uring.py) for fio's pid, its ring drained every
             50 ms by this process (as a recorder would)
  other      the same probe for another process (this one): fio is not a target, so this is the
             cost to an untraced process (to compare with the empty floor)
  bpftrace   a one-liner: submit_req of fio's read opcodes stores nsecs by request pointer,
             complete takes the difference into a hist() and deletes the entry
  before     (with --before-tree DIR) the engramprof arm with that checkout's probes/ (its
             uring.bpf.c and headers, built by this tree's Python): before/after side by side

fio is forked first and waits on a pipe: each tracer is attached to its pid before it execs fio.
Per arm: fio's CPU time (user + system of all its threads, from wait4's rusage) per request and
fio's own mean latency (``lat_ns.mean``) per request, medians over rounds; what each tracer adds
over untraced, and the ratios engramprof / bpftrace.  Needs root, fio and bpftrace.

Program time (the less noisy measure on a shared machine): each round then runs the four traced
arms again with the kernel's BPF run-time statistics on (benchmarks/bpfstats.py; not in the arms
above: the statistics add two clock reads to every program run).  Per request: the run time of
the programs on fio's request path (the io_uring tracepoints and sys_exit_io_uring_enter), per
program for the engramprof arm (which hook costs what).  The page-cache and block hooks fire for
every process of the machine (others' I/O): their run time is printed apart, per second.

Usage: benchmarks/uring_overhead.py [--rounds 5] [--ios 200000] [--before-tree DIR] [--program-time-only]
(--program-time-only: the program-time arms alone, not the timed ones)
"""
from __future__ import annotations

import argparse
import pathlib
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import bpfstats  # noqa: E402  (benchmarks/bpfstats.py)

ARMS = ("untraced", "empty", "engramprof", "other", "bpftrace")
STATS_ARMS = ("empty", "engramprof", "other", "bpftrace")  # again, with BPF run-time statistics on
#: programs on fio's request path (BCC's names for TRACEPOINT_PROBE functions); the rest (page
#: cache, block) fire for every process of the machine
REQUEST_PATH_PROGS = ("tracepoint__io_uring__", "tracepoint__syscalls__sys_exit_io_uring_enter")

EMPTY = """
TRACEPOINT_PROBE(io_uring, io_uring_submit_req) { return 0; }
TRACEPOINT_PROBE(io_uring, io_uring_complete) { return 0; }
TRACEPOINT_PROBE(io_uring, io_uring_queue_async_work) { return 0; }
TRACEPOINT_PROBE(filemap, mm_filemap_add_to_page_cache) { return 0; }
TRACEPOINT_PROBE(block, block_bio_queue) { return 0; }
TRACEPOINT_PROBE(block, block_bio_backmerge) { return 0; }
TRACEPOINT_PROBE(block, block_rq_complete) { return 0; }
TRACEPOINT_PROBE(block, block_bio_complete) { return 0; }
"""


def bpftrace_prog(pid: int, ops: list[int]) -> str:
    op = " || ".join(f"args->opcode == {o}" for o in ops)
    return (f"tracepoint:io_uring:io_uring_submit_req /pid == {pid} && ({op})/ {{ @s[args->req] = nsecs; }} "
            "tracepoint:io_uring:io_uring_complete /@s[args->req]/ "
            "{ @h = hist(nsecs - @s[args->req]); delete(@s[args->req]); }")


def fork_fio(argv: list[str]) -> tuple[int, int]:
    """A child that waits for a byte on a pipe, then execs fio.  Returns (pid, write end)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(w)
            os.read(r, 1)
            os.execvp(argv[0], argv)
        finally:
            os._exit(127)
    os.close(r)
    return pid, w


def prog_time(progs: dict, request_path: bool) -> tuple[int, int]:
    """(run_time_ns, run_cnt) summed over the programs on (or off) fio's request path."""
    keep = [v for k, v in progs.items() if k.startswith(REQUEST_PATH_PROGS) == request_path]
    return sum(v[0] for v in keep), sum(v[1] for v in keep)


def load_before(tree: str, config):
    """The io_uring probe built from another checkout's probes/ (program text and headers) with
    this tree's Python: the 'before' arm."""
    from engramprof.bpf import structs, uring

    def text(p) -> str:
        own = structs.probe_dir
        structs.probe_dir = lambda: pathlib.Path(tree) / "probes"
        try:
            src = uring.program_text(p)
        finally:
            structs.probe_dir = own
        # what this tree's plan no longer defines: the hash's size (before the slot table) and
        # file_get (before it was dropped: without the define the before probe would lose it)
        return "#define MAX_INFLIGHT 65536\n#define HAVE_FILE_GET 1\n" + src

    class Before(uring.UringProbe):
        program_text = staticmethod(text)

    return Before.load(config)


def run_arm(arm: str, path: str, ios: int, out: str, stats: bool = False, before_tree: str | None = None) -> dict:
    from bcc import BPF

    from engramprof.bpf import uring

    argv = ["fio", "--name=b", f"--filename={path}", "--ioengine=io_uring", "--rw=randread", "--bs=4k",
            "--size=64M", "--invalidate=0", "--norandommap", f"--number_ios={ios}", "--iodepth=1", "--thread",
            "--output-format=json", f"--output={out}"]
    pid, w = fork_fio(argv)
    probe = empty = bt = None
    try:
        if arm in ("engramprof", "other"):
            probe = uring.UringProbe.load(uring.UringProbeConfig(tgid=pid if arm == "engramprof" else os.getpid()))
            probe.arm()
        elif arm == "before":
            probe = load_before(before_tree, uring.UringProbeConfig(tgid=pid))
            probe.arm()
        elif arm == "empty":
            empty = BPF(text=EMPTY)
        elif arm == "bpftrace":
            ops = sorted(uring.btf_status()["opcodes"].values())
            bt = subprocess.Popen(["bpftrace", "-e", bpftrace_prog(pid, ops)], stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True)
            for line in bt.stdout:
                if line.startswith("Attaching"):
                    break
            time.sleep(0.3)  # "Attaching N probes..." is printed before the last one is attached
        t0 = time.monotonic()
        os.write(w, b"x")
        records = 0
        while True:
            done, status, ru = os.wait4(pid, os.WNOHANG)
            if probe is not None:
                records += len(probe.drain())
            if done:
                break
            time.sleep(0.05)
        if probe is not None:
            records += len(probe.drain())
        assert os.waitstatus_to_exitcode(status) == 0, f"fio failed in arm {arm}"
        with open(out) as f:
            read = json.load(f)["jobs"][0]["read"]
        n = read["total_ios"]
        res = {"cpu_ns": (ru.ru_utime + ru.ru_stime) * 1e9 / n, "lat_ns": read["lat_ns"]["mean"], "ios": n}
        if probe is not None and arm in ("engramprof", "before"):
            t = probe.totals()
            res.update(records=records, lost=t["lost_records"])
        if stats:
            if bt is not None:
                progs = {"tracepoint__io_uring__" + str(k): v for k, v in bpfstats.prog_stats_of_pid(bt.pid).items()}
            else:
                progs = {(k.decode() if isinstance(k, bytes) else k): v
                         for k, v in bpfstats.prog_stats_of_bcc(probe.bpf if probe is not None else empty).items()}
            ns, cnt = prog_time(progs, True)
            res.update(prog_ns=ns / n, prog_runs=cnt / n, progs={k: v[0] / n for k, v in progs.items()},
                       machine_prog_ns_s=prog_time(progs, False)[0] / max(1e-9, time.monotonic() - t0))
        return res
    finally:
        os.close(w)
        if probe is not None:
            probe.close()
        if empty is not None:
            empty.cleanup()
        if bt is not None:  # its maps are printed at exit: read them (a full pipe would hold it)
            bt.terminate()
            try:
                bt.communicate(timeout=15)
            except subprocess.TimeoutExpired:  # seen once at load 12: alive in epoll_wait after SIGTERM
                bt.kill()
                bt.communicate()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--ios", type=int, default=200000)
    ap.add_argument("--before-tree", help="a checkout whose probes/ the 'before' arm builds")
    ap.add_argument("--program-time-only", action="store_true", help="only the arms with BPF statistics on")
    a = ap.parse_args()
    arms = ARMS + (("before",) if a.before_tree else ())
    stats_arms = STATS_ARMS + (("before",) if a.before_tree else ())
    load0 = os.getloadavg()
    with tempfile.TemporaryDirectory(dir="/var/tmp") as d:
        path = os.path.join(d, "cached.bin")
        with open(path, "wb") as f:
            f.write(os.urandom(64 << 20))
        with open(path, "rb") as f:  # into the page cache
            while f.read(1 << 20):
                pass
        out = os.path.join(d, "fio.json")
        got: dict[str, list[dict]] = {arm: [] for arm in arms}
        pst: dict[str, list[dict]] = {arm: [] for arm in stats_arms}
        for rnd in range(a.rounds):
            order = [] if a.program_time_only else list(arms)
            random.shuffle(order)
            for arm in order:
                got[arm].append(run_arm(arm, path, a.ios, out, before_tree=a.before_tree))
            if order:
                print(f"round {rnd + 1}/{a.rounds}: " + "  ".join(
                    f"{arm} {got[arm][-1]['cpu_ns']:.0f} cpu-ns {got[arm][-1]['lat_ns']:.0f} lat-ns" for arm in arms),
                    flush=True)
            order = list(stats_arms)
            random.shuffle(order)
            with bpfstats.stats_enabled() as on:
                if not on:
                    sys.exit("uring_overhead: cannot turn BPF run-time statistics on")
                for arm in order:
                    pst[arm].append(run_arm(arm, path, a.ios, out, stats=True, before_tree=a.before_tree))
            print(f"round {rnd + 1}/{a.rounds} program time: " + "  ".join(
                f"{arm} {pst[arm][-1]['prog_ns']:.0f} ns/req ({pst[arm][-1]['prog_runs']:.1f} runs)"
                for arm in stats_arms), flush=True)
    load1 = os.getloadavg()
    print(f"\nload average (1, 5, 15 min): start {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}, "
          f"end {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f}")
    if not a.program_time_only:
        report_timed(a, arms, got)
    report_program_time(stats_arms, pst)
    for arm in ("engramprof", "before"):
        if arm in got and got[arm]:
            lost = sum(r.get("lost", 0) for r in got[arm])
            recs = [r["records"] == r["ios"] for r in got[arm]]
            print(f"{arm}: records = fio's requests in {sum(recs)}/{len(recs)} rounds; lost records {lost}")


def report_timed(a, arms, got) -> None:
    med = {arm: {k: statistics.median(r[k] for r in got[arm]) for k in ("cpu_ns", "lat_ns")} for arm in arms}
    print(f"\nfio io_uring, cached random 4 KiB reads, iodepth 1, {a.ios} requests an arm, {a.rounds} rounds "
          "(medians):")
    print(f"{'arm':<12}{'cpu ns/req':>12}{'added':>9}{'lat ns/req':>12}{'added':>9}")
    for arm in arms:
        c, l = med[arm]["cpu_ns"], med[arm]["lat_ns"]
        dc, dl = c - med["untraced"]["cpu_ns"], l - med["untraced"]["lat_ns"]
        print(f"{arm:<12}{c:>12.0f}{dc:>9.0f}{l:>12.0f}{dl:>9.0f}")
    for key, what in (("cpu_ns", "cpu"), ("lat_ns", "latency")):
        e = med["engramprof"][key] - med["untraced"][key]
        b = med["bpftrace"][key] - med["untraced"][key]
        f = med["empty"][key] - med["untraced"][key]
        ratio = f"{e / b:.2f}x" if b > 0 else "n/a"
        print(f"added {what}: engramprof {e:.0f} ns, bpftrace {b:.0f} ns, empty floor {f:.0f} ns; "
              f"engramprof / bpftrace = {ratio}")
    for key, what in (("cpu_ns", "cpu"), ("lat_ns", "latency")):
        o = med["other"][key] - med["untraced"][key]
        f = med["empty"][key] - med["untraced"][key]
        print(f"untraced process, added {what}: probe for another pid {o:.0f} ns, empty floor {f:.0f} ns")


def report_program_time(stats_arms, pst) -> None:
    pmed = {arm: statistics.median(r["prog_ns"] for r in pst[arm]) for arm in stats_arms}
    print("\nprogram time on fio's request path (BPF run_time_ns per request, medians):")
    for arm in stats_arms:
        runs = statistics.median(r["prog_runs"] for r in pst[arm])
        mach = statistics.median(r["machine_prog_ns_s"] for r in pst[arm])
        print(f"  {arm:<12}{pmed[arm]:>8.0f} ns/req  {runs:>5.2f} runs/req   page-cache and block hooks "
              f"(every process): {mach / 1e3:.0f} us/s")
    b = pmed["bpftrace"]
    print(f"engramprof / bpftrace (program time) = {pmed['engramprof'] / b:.2f}x" if b > 0 else "bpftrace: no time")
    if "before" in pmed and b > 0:
        print(f"before / bpftrace (program time) = {pmed['before'] / b:.2f}x; "
              f"engramprof / before = {pmed['engramprof'] / pmed['before']:.2f}x")
    print(f"untraced process (program time): probe for another pid {pmed['other']:.0f} ns/req, "
          f"empty floor {pmed['empty']:.0f} ns/req")
    for arm in ("engramprof", "before"):
        if arm not in pst:
            continue
        names = sorted({k for r in pst[arm] for k in r["progs"] if any(x["progs"].get(k) for x in pst[arm])})
        print(f"{arm} per program (ns per fio request, median): " + ", ".join(
            f"{k.replace('tracepoint__', '')} {statistics.median(r['progs'].get(k, 0) for r in pst[arm]):.0f}"
            for k in names))


if __name__ == "__main__":
    main()
