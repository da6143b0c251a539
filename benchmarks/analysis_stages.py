#!/usr/bin/env python3
"""Where batch-tail's load + analysis spends CPU and holds memory, stage by stage.

    .venv/bin/python benchmarks/analysis_stages.py TRACE [--trim STAGE,...]

Loads TRACE the way the command line does and analyses it, with the pipeline's stages wrapped:
per stage (nested stages indented) its wall and CPU time, the process's RSS when it began, the
highest RSS while it ran (sampled every millisecond by a thread) and the RSS when it ended, and
glibc's heap as ``mallinfo2`` reports it (in use and free: free heap is resident memory that
malloc keeps).  The stage whose peak is highest is the one to work on.  ``--trim`` calls
``malloc_trim(0)`` after the named stages (what the free heap costs).  One run, no ratio: use
analysis_speed.py --against for before/after figures.
"""
from __future__ import annotations

import argparse
import ctypes
import functools
import importlib
import os
import resource
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

#: (module, function) of each stage wrapped, in pipeline order
STAGES = [
    ("engramprof.trace", "load_bundle"),
    ("engramprof.analysis", "prepare_read_events"), ("engramprof.analysis", "load_context"),
    ("engramprof.analysis", "segment_batches"), ("engramprof.analysis", "find_reading_threads"),
    ("engramprof.analysis.thread_kinds", "thread_kinds"), ("engramprof.analysis", "_path_codes"),
    ("engramprof.analysis", "attribute_batches"), ("engramprof.analysis.baseline", "device_baseline"),
    ("engramprof.analysis.calibrate", "split_miss_time"), ("engramprof.analysis", "context_switches"),
    ("engramprof.analysis", "batch_table"), ("engramprof.analysis", "summarize"),
    ("engramprof.analysis", "_report"), ("engramprof.analysis", "_analyse_process"),
    ("engramprof.analysis.paths", "path_figures"),
]
PAGE = os.sysconf("SC_PAGE_SIZE")


class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                               "fsmblks", "uordblks", "fordblks", "keepcost")]


def _libc():
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = _MallInfo2
        return libc
    except (OSError, AttributeError):
        return None


LIBC = _libc()


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE / 2**20


def heap() -> str:
    if LIBC is None:
        return ""
    m = LIBC.mallinfo2()
    return f"heap used {m.uordblks / 2**20:4.0f} free {m.fordblks / 2**20:4.0f}"


class Recorder:
    def __init__(self, trim: set[str]):
        self.open: dict[str, float] = {}  # stage -> highest RSS seen while it runs
        self.depth = 0
        self.rows: list[tuple] = []
        self.trim = trim
        threading.Thread(target=self._sample, daemon=True).start()

    def _sample(self) -> None:
        while True:
            r = rss_mib()
            for k, v in list(self.open.items()):
                if r > v:
                    self.open[k] = r
            time.sleep(0.001)

    def wrap(self, module: str, name: str) -> None:
        mod = importlib.import_module(module)
        f = getattr(mod, name)
        rec = self

        @functools.wraps(f)
        def stage(*a, **k):
            key = f"{name}#{len(rec.rows)}"
            r0, c0, t0 = rss_mib(), time.process_time(), time.perf_counter()
            rec.open[key] = r0
            rec.depth += 1
            try:
                return f(*a, **k)
            finally:
                rec.depth -= 1
                if name in rec.trim and LIBC is not None:
                    LIBC.malloc_trim(0)
                peak = rec.open.pop(key)
                rec.rows.append((rec.depth, name, time.perf_counter() - t0, time.process_time() - c0, r0, peak,
                                 rss_mib(), heap()))
        setattr(mod, name, stage)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace", type=Path)
    ap.add_argument("--trim", default="", help="malloc_trim(0) after these stages (comma-separated names)")
    args = ap.parse_args()
    from engramprof.host.pages import prefer_small_pages

    prefer_small_pages()  # what the command line does
    rec = Recorder({s for s in args.trim.split(",") if s})
    for module, name in STAGES:
        rec.wrap(module, name)
    import engramprof.trace as trace
    from engramprof.analysis import analyse
    from engramprof.report import batch_tail as report

    t0, c0 = time.perf_counter(), time.process_time()
    tr = trace.load_bundle(args.trace, columns=trace.EVENT_READ_COLUMNS, compact=True, later=trace.LATER_COLUMNS)
    res = analyse(tr)
    report.to_json(res.summary)
    print(f"{len(tr.calls):,} calls: {time.perf_counter() - t0:.2f} s wall, {time.process_time() - c0:.2f} s CPU, "
          f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.3f} GiB; "
          f"load average {os.getloadavg()[0]:.1f}")
    print(f"{'stage (MiB)':34} {'wall':>5} {'cpu':>5} {'rss':>5} {'peak':>5} {'after':>5}")
    for depth, name, wall, cpu, r0, peak, r1, h in rec.rows:  # a stage after the stages it holds
        print(f"{'  ' * depth}{name:{34 - 2 * depth}} {wall:5.2f} {cpu:5.2f} {r0:5.0f} {peak:5.0f} {r1:5.0f}  {h}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
