#!/usr/bin/env python3
"""What does the watched-file pre-filter (probes/watched.h) save the page-cache and eviction
probes on pages of files nobody watches?

Both probes hook a tracepoint that fires for every page of the machine: the page-cache probe
filemap:mm_filemap_add_to_page_cache, the eviction probe mm_filemap_delete_from_page_cache.
Before the pre-filter each looked up every page's (device, inode) in its watched_files hash;
now it tests one watched_bits array slot first.  A worker process pinned to one CPU reads a
sparse 64 MiB file (holes: zero pages enter the page cache, no device I/O; --written: a file of
data, read from the device each pass) and drops it with posix_fadvise(POSIX_FADV_DONTNEED), over
and over: insertions and removals of a file that is
not watched (the probes watch one other file, from user space).  Arms, loaded in turn and
interleaved round by round in one run:

  empty      empty programs on the two tracepoints (the floor)
  pc-old     the page-cache probe before the pre-filter (the program text of a checkout, --before)
  pc-new     the page-cache probe of this checkout
  ev-old     the eviction probe before the pre-filter
  ev-new     the eviction probe of this checkout

Prints each arm's program run time per run (BPF_ENABLE_STATS held by benchmarks/bpfstats.py,
never switched off) for the insertion and removal hooks, with run counts, and the worker's CPU
time per page (noisier: the read itself is ~6 us).  Needs root.
Usage: git worktree add /tmp/pc_before <commit before the pre-filter>;
       benchmarks/watched_filter.py --before /tmp/pc_before [--rounds 5] [--passes 10] [--written]
"""
from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bpfstats import prog_stats_of_bcc, stats_enabled  # noqa: E402

WORKER = r"""
import os, sys, time
path, passes = sys.argv[1], int(sys.argv[2])
fd = os.open(path, os.O_RDONLY)
size = os.fstat(fd).st_size
buf = bytearray(1 << 20)
os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)  # no readahead: exactly the pages read
for line in sys.stdin:
    t0 = time.process_time_ns()
    for _ in range(passes):
        off = 0
        while off < size:
            off += os.preadv(fd, [buf], off)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    print(time.process_time_ns() - t0, flush=True)
"""

HOOKS = ("add_to_page_cache", "delete_from_page_cache")
EMPTY = "".join(f"TRACEPOINT_PROBE(filemap, mm_filemap_{h}) {{ return 0; }}\n" for h in HOOKS)


@contextlib.contextmanager
def probes_from(checkout: str | None):
    """Program texts built from ``checkout``'s probes/ (None: this one's)."""
    from engramprof.bpf import structs as layout

    saved = layout.probe_dir
    if checkout is not None:
        layout.probe_dir = lambda: Path(checkout) / "probes"
    try:
        yield
    finally:
        layout.probe_dir = saved


def load(arm: str, before: str, watched_key: tuple[int, int]):
    """The arm's BCC object, watching ``watched_key`` (another file) the way its loader does."""
    import ctypes

    from engramprof.bpf import evictions as ev
    from engramprof.bpf import pagecache as pc
    from engramprof.bpf import watched
    from engramprof.bpf.base import compile_program, import_bcc

    BPF = import_bcc()
    if arm == "empty":
        return compile_program(BPF, EMPTY, "empty programs")
    old = arm.endswith("-old")
    with probes_from(before if old else None):
        if arm.startswith("pc"):
            text = pc.program_text(pc.plan(pc.PagecacheProbeConfig(tgid=os.getpid())))
        else:
            text = ev.program_text(ev.plan(ev.EvictionProbeConfig()))
    b = compile_program(BPF, text, arm)
    if old:
        files = b["watched_files"]
        k = files.Key()
        k.dev, k.ino = watched_key
        files[k] = ctypes.c_uint8(1)
    else:
        watched.WatchedFiles(b).add(*watched_key)
    return b


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", required=True, help="a checkout (git worktree) from before the pre-filter")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--passes", type=int, default=10, help="64 MiB read-and-drop passes per round and arm")
    ap.add_argument("--cpu", type=int, default=os.cpu_count() - 1)
    ap.add_argument("--dir", default=os.environ.get("ENGRAMPROF_SCENARIO_DIR", "/var/tmp"))
    ap.add_argument("--written", action="store_true",
                    help="a written file (each pass reads it from the device) instead of a sparse one")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("needs root", file=sys.stderr)
        return 1
    if not (Path(args.before) / "probes" / "pagecache.bpf.c").exists():
        print(f"{args.before}: no probes/pagecache.bpf.c", file=sys.stderr)
        return 1
    from engramprof.record.sources.pagecache import kernel_dev

    work = tempfile.mkdtemp(prefix="engramprof-wfbench-", dir=args.dir)
    churn, other = os.path.join(work, "churn.bin"), os.path.join(work, "watched.bin")
    with open(churn, "wb") as f:
        if args.written:
            for _ in range(64):
                f.write(os.urandom(1 << 20))
            f.flush()
            os.fsync(f.fileno())
        else:
            f.truncate(64 << 20)
    with open(other, "wb") as f:
        f.write(b"\0" * 4096)
    st = os.stat(other)
    watched_key = (kernel_dev(st.st_dev), st.st_ino)
    pages_per_pass = (64 << 20) // os.sysconf("SC_PAGE_SIZE")
    worker = subprocess.Popen(["taskset", "-c", str(args.cpu), sys.executable, "-c", WORKER, churn, str(args.passes)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def one_round() -> float:
        worker.stdin.write("go\n")
        worker.stdin.flush()
        return int(worker.stdout.readline()) / (args.passes * pages_per_pass)

    arms = ("empty", "pc-old", "pc-new", "ev-old", "ev-new")
    per_page = {a: [] for a in arms}
    runs = {a: {} for a in arms}  # hook -> [run_time_ns, run_cnt]
    stats = contextlib.ExitStack()
    stats_on = stats.enter_context(stats_enabled())
    with open("/proc/loadavg") as f:
        load_before = " ".join(f.read().split()[:3])
    try:
        one_round()  # warm up
        for r in range(args.rounds):
            for arm in (arms if r % 2 == 0 else arms[::-1]):
                b = load(arm, args.before, watched_key)
                try:
                    ns = one_round()
                    for name, (rt, rc) in prog_stats_of_bcc(b).items():
                        name = name.decode() if isinstance(name, bytes) else name
                        hook = next((h for h in HOOKS if h in name), None)
                        if hook:
                            acc = runs[arm].setdefault(hook, [0, 0])
                            acc[0] += rt
                            acc[1] += rc
                finally:
                    b.cleanup()
                per_page[arm].append(ns)
                print(f"  round {r} {arm}: {ns:.0f} ns CPU per page", file=sys.stderr, flush=True)
    finally:
        worker.stdin.close()
        worker.wait()
        stats.close()
        for p in (churn, other):
            os.unlink(p)
        os.rmdir(work)
    with open("/proc/loadavg") as f:
        load_after = " ".join(f.read().split()[:3])
    print(f"read-and-drop of a {'written' if args.written else 'sparse'} 64 MiB file (not watched), worker pinned to CPU {args.cpu}: {args.passes} "
          f"passes x {pages_per_pass:,} pages per round x {args.rounds} rounds; load average {load_before} -> "
          f"{load_after}; old probes from {args.before}")
    if not stats_on:
        print("BPF run-time statistics unavailable: no program figures")
    print(f"{'arm':<8} {'hook':<24} {'ns/run':>7} {'runs':>12}   {'worker CPU ns/page (median, min-max)':>36}")
    for a in arms:
        for hook in HOOKS:
            if a != "empty" and not (a.startswith("pc") == (hook == HOOKS[0])):
                continue
            rt, rc = runs[a].get(hook, [0, 0])
            v = per_page[a]
            print(f"{a:<8} {hook:<24} {rt / max(rc, 1):>7.1f} {rc:>12,}   "
                  f"{statistics.median(v):>10.0f} ({min(v):.0f}-{max(v):.0f})")
    for kind, hook in (("pc", HOOKS[0]), ("ev", HOOKS[1])):
        old, new, floor = (runs[f"{kind}-old"].get(hook, [0, 1]), runs[f"{kind}-new"].get(hook, [0, 1]),
                           runs["empty"].get(hook, [0, 1]))
        o, n, e = (x[0] / max(x[1], 1) for x in (old, new, floor))
        print(f"{hook}: old {o:.1f} ns a run, new {n:.1f}, empty {e:.1f}: saved {o - n:.1f} ns a run; "
              f"above the empty floor {o - e:.1f} -> {n - e:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
