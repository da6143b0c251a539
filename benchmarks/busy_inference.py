#!/usr/bin/env python3
"""How well does batch inference (no markers) find a pool reader's decode steps on a busy host?

Records the lab's pool reader (``--reader pool --tokens 4 --warm --markers``: 60 decode
steps, forward passes of ``--pass-ms``, 20 ms by default) ``--runs`` times with ``--hogs`` busy-looping processes
beside it (each run one `engramprof syscalls --pid` recording, as the tests record), and judges
the inferred batches against the lab's own markers under three rules, on the same recording:

  plain      the read stream's union gaps as they are, and batch-tail's choice of threshold
  idle       each gap less the time a thread of the reader was preempted inside it (the
             trace's off-CPU spans): what batch-tail does
  lowest     idle gaps, and of the candidate thresholds about as regular the lowest
             (FINER_FACTOR 0: batch-tail before 2026-12-07)

Prints per run and rule: the share of marked batches whose read span the inferred batch
covers at IoU >= 0.8 (the last one left out: the recording ends with it), the threshold
chosen, and the separation: the largest gap left inside a marked batch against the smallest
between two.  Needs root.  Usage: benchmarks/busy_inference.py [--runs 8] [--hogs 3] [--pass-ms 20]
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engramprof.analysis import batches  # noqa: E402
from tests.tracing import engramprof, marked_reads, traced_lab  # noqa: E402

RULES = ("plain", "idle", "lowest")


def judge(trace: Path, markers: Path) -> dict[str, dict]:
    r = marked_reads(trace, markers)
    between = np.zeros(max(len(r.ts) - 1, 0), bool)
    between[r.marked.first[1:] - 1] = True  # gap i is the one before call i + 1
    out = {}
    finer = batches.FINER_FACTOR
    for rule in RULES:
        rs = None if rule == "plain" else batches.RunnableSpans.of(r.offcpu)
        batches.FINER_FACTOR = 0 if rule == "lowest" else finer
        try:
            inferred = batches.infer(r.ts, r.end, None, rs)
        finally:
            batches.FINER_FACTOR = finer
        iou = np.asarray(batches.match_quality(r.ts, r.end, r.marked, inferred)["read_span_iou"])[:-1]
        gaps, _ = batches.idle_gaps(r.ts, batches.union_gaps(r.ts, r.end).astype(np.float64), rs)
        out[rule] = dict(matched=float((iou >= 0.8).mean()), threshold_ms=(inferred.gap_ns or 0) / 1e6,
                         inside_max_ms=gaps[~between].max() / 1e6, between_min_ms=gaps[between].min() / 1e6)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=8)
    ap.add_argument("--hogs", type=int, default=3, help="busy-looping processes beside the reader")
    ap.add_argument("--pass-ms", type=float, default=20.0, help="the forward pass between steps (lab --gap-ms)")
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="busy-inference-"))
    table = tmp / "engram.safetensors"
    subprocess.run(engramprof("lab", "make-table", table, "--rows", "65536"), check=True, capture_output=True)
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(a.hogs)]
    print(f"{'run':>3} {'rule':<9} {'matched':>7} {'thr ms':>6} {'inside<=':>8} {'between>=':>9}")
    try:
        for i in range(a.runs):
            d = tmp / f"r{i}"
            d.mkdir()
            run = traced_lab(d, table, "--reader", "pool", "--steps", "60", "--tokens", "4", "--gap-ms", f"{a.pass_ms:g}",
                             "--warm", "--markers", str(d / "m.jsonl"))
            for rule, r in judge(run.trace, d / "m.jsonl").items():
                print(f"{i:>3} {rule:<9} {r['matched']:>7.3f} {r['threshold_ms']:>6.1f} "
                      f"{r['inside_max_ms']:>8.1f} {r['between_min_ms']:>9.1f}", flush=True)
    finally:
        for p in hogs:
            p.kill()
    print(f"recordings: {tmp}")


if __name__ == "__main__":
    main()
