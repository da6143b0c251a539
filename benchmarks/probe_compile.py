#!/usr/bin/env python3
"""What a recorder's probes cost to compile: every BPF program a `syscalls` recording loads,
compiled as it is (probes/kernel_types.h) and with the kernel headers it replaced
(<linux/fs.h>, <linux/ptrace.h>, <linux/uio.h>, <linux/aio_abi.h>), side by side, interleaved
over rounds.  A recorder compiles its programs one after the other before it traces, so their sum
is most of the time from `engramprof syscalls` to "Tracing" (and a fixed cost of every eBPF test).

    sudo .venv/bin/python benchmarks/probe_compile.py [--rounds 3]

How: one real `engramprof syscalls --pid <a sleeping child> --duration 0.2` runs in this
process with bcc.BPF wrapped to keep each program text it compiles; then each text is compiled
(BPF(text=...), loaded and closed: clang and the verifier) in both forms, round after round.
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

KERNEL_HEADERS = "#include <linux/fs.h>\n#include <linux/ptrace.h>\n#include <linux/uio.h>\n#include <linux/aio_abi.h>\n"
BLOCK = re.compile(r"#ifndef EP_KERNEL_TYPES_H.*?#endif /\* EP_KERNEL_TYPES_H \*/\n", re.S)


def captured_texts() -> list[tuple[str, str]]:
    """(ring name, program text) of every program one recording compiles."""
    import bcc

    from engramprof.bpf.base import CFLAGS  # noqa: F401  (the flags the texts are compiled with)

    texts: list[str] = []
    orig = bcc.BPF.__init__

    def keep(self, *a, **k):
        texts.append(k.get("text", b"").decode())
        return orig(self, *a, **k)

    child = subprocess.Popen(["sleep", "60"])
    bcc.BPF.__init__ = keep
    try:
        from engramprof.cli import app
        try:
            app(["syscalls", "--pid", str(child.pid), "--duration", "0.2", "--stack-hz", "0"], standalone_mode=False)
        except SystemExit:
            pass
    finally:
        bcc.BPF.__init__ = orig
        child.kill()
    out = []
    for t in texts:
        rings = [r for r in re.findall(r"BPF_RINGBUF_OUTPUT\((\w+)", t) if r.endswith("_records")]
        out.append((rings[0] if rings else "(names: no ring)", t))
    return out


def compile_s(text: str) -> float:
    from bcc import BPF

    from engramprof.bpf.base import CFLAGS, quiet_stderr

    t0 = time.perf_counter()
    with quiet_stderr():
        b = BPF(text=text.encode(), cflags=CFLAGS)
    dt = time.perf_counter() - t0
    b.cleanup()
    return dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("probe_compile: run as root (BPF)")
    progs = captured_texts()
    rows = []
    for name, text in progs:
        with_headers = BLOCK.sub(KERNEL_HEADERS, text)
        if with_headers == text:  # a program without kernel_types.h: one form only
            with_headers = None
        rows.append((name, text, with_headers, [], []))
    for _ in range(args.rounds):
        for name, text, old, now_s, old_s in rows:
            now_s.append(compile_s(text))
            if old is not None:
                old_s.append(compile_s(old))
    load = os.getloadavg()[0]
    print(f"{len(rows)} programs of one `syscalls` recording, {args.rounds} rounds interleaved, "
          f"median s; load average (1 min) {load:.1f} on {os.cpu_count()} CPUs")
    print(f"{'program (its ring)':<24}{'kernel headers':>16}{'kernel_types.h':>16}{'ratio':>8}")
    tot_old = tot_now = 0.0
    for name, _, old, now_s, old_s in rows:
        now = statistics.median(now_s)
        before = statistics.median(old_s) if old_s else now
        tot_now += now
        tot_old += before
        print(f"{name:<24}{before:16.2f}{now:16.2f}{now / before:8.2f}")
    print(f"{'all (one recorder)':<24}{tot_old:16.2f}{tot_now:16.2f}{tot_now / tot_old:8.2f}")


if __name__ == "__main__":
    main()
