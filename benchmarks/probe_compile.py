#!/usr/bin/env python3
"""What a recorder's probes cost to compile: every BPF program a `syscalls` recording loads,
compiled as it is (probes/kernel_types.h) and with the kernel headers it replaced
(<linux/fs.h>, <linux/ptrace.h>, <linux/uio.h>, <linux/aio_abi.h>), side by side, interleaved
over rounds.  A recorder compiles its programs one after the other before it traces, so their sum
is most of the time from `engramprof syscalls` to "Tracing" (and a fixed cost of every eBPF test).

    sudo .venv/bin/python benchmarks/probe_compile.py [--rounds 3]

How: one real `engramprof syscalls --pid <a sleeping child> --duration 0.2` runs in this
process with bcc.BPF wrapped to keep each program text it compiles; then each text is compiled
(BPF(text=...), loaded and closed: clang and the verifier; the libaio probe's chain programs
loaded too) in both forms, round after round.  The instructions the verifier walked for each
program (``verified_insns`` of struct bpf_prog_info) are printed beside.

    sudo .venv/bin/python benchmarks/probe_compile.py --start-against TREE [--rounds 5]

Another figure: the time from ``engramprof syscalls --pid <a sleeping child>`` to its "Tracing"
line, this tree's and TREE's (another checkout, e.g. ``git worktree add /tmp/before HEAD~1``),
interleaved round by round, each a fresh process.
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


#: seconds between two recorders' starts: a recorder's programs are freed after it exits, by
#: the kernel's RCU workers, which would otherwise share the CPUs with the next start
SETTLE_S = 3.0

#: struct bpf_prog_info (include/uapi/linux/bpf.h): verified_insns is the u32 at this offset
VERIFIED_INSNS_OFFSET = 216


def verified_insns(bpf) -> int:
    """Instructions the verifier walked, summed over the programs ``bpf`` loaded."""
    import ctypes

    from engramprof.bpf import progstats

    get_info = progstats._libbcc()
    total = 0
    for fn in bpf.funcs.values():
        size = VERIFIED_INSNS_OFFSET + 4
        buf, n = ctypes.create_string_buffer(size), ctypes.c_uint32(size)
        if get_info(fn.fd, buf, ctypes.byref(n)) == 0 and n.value >= size:
            total += int.from_bytes(buf.raw[VERIFIED_INSNS_OFFSET:size], sys.byteorder)
    return total


def compile_s(text: str) -> tuple[float, int]:
    """Seconds to compile and load ``text`` (and the libaio chain's programs when it has them),
    and the instructions the verifier walked."""
    from bcc import BPF

    from engramprof.bpf.base import CFLAGS, quiet_stderr
    from engramprof.bpf.libaio import CHAIN

    t0 = time.perf_counter()
    with quiet_stderr():
        b = BPF(text=text.encode(), cflags=CFLAGS)
        for name in CHAIN:
            if f"int {name}(" in text:
                b.load_func(name, BPF.TRACEPOINT)
    dt = time.perf_counter() - t0
    insns = verified_insns(b)
    b.cleanup()
    return dt, insns


def start_s(tree: Path, pid: int) -> float:
    """Seconds from starting ``engramprof syscalls --pid pid`` (the code of ``tree``) to its
    "Tracing" line; the recorder is then stopped (SIGINT)."""
    import signal

    import tempfile

    env = dict(os.environ, PYTHONPATH=str(tree))
    with tempfile.TemporaryDirectory(prefix="probe-compile-") as out:
        cmd = [sys.executable, "-m", "engramprof", "syscalls", "--pid", str(pid), "--duration", "30",
               "--stack-hz", "0", "--output", f"{out}/trace"]
        t0 = time.perf_counter()
        p = subprocess.Popen(cmd, cwd=tree, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        seen = []
        for line in p.stderr:
            seen.append(line)
            if line.startswith("Tracing"):
                break
        else:
            sys.exit(f"probe_compile: no Tracing line from {tree}: {''.join(seen)[-500:]}")
        dt = time.perf_counter() - t0
        p.send_signal(signal.SIGINT)
        p.communicate(timeout=60)
    return dt


def compare_start(other: Path, rounds: int) -> None:
    here = Path(__file__).resolve().parent.parent
    child = subprocess.Popen(["sleep", "600"])
    times: dict[str, list[float]] = {"before": [], "after": []}
    try:
        for _ in range(rounds):
            for arm, tree in (("before", other), ("after", here)):
                time.sleep(SETTLE_S)  # the last recorder's programs freed (RCU work) before the next starts
                times[arm].append(start_s(tree, child.pid))
    finally:
        child.kill()
    load = os.getloadavg()[0]
    b, a = statistics.median(times["before"]), statistics.median(times["after"])
    print(f"`engramprof syscalls --pid <sleeping child>` to its Tracing line, {rounds} rounds interleaved, "
          f"median s; load average (1 min) {load:.1f} on {os.cpu_count()} CPUs")
    print(f"before ({other}) {b:.2f}   after (this tree) {a:.2f}   after / before {a / b:.2f}")
    print("rounds: before " + " ".join(f"{x:.2f}" for x in times["before"])
          + "; after " + " ".join(f"{x:.2f}" for x in times["after"]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--start-against", type=Path, metavar="TREE",
                    help="time to the Tracing line, this tree against TREE's code, instead")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("probe_compile: run as root (BPF)")
    if args.start_against is not None:
        if not (args.start_against / "engramprof").is_dir():
            sys.exit(f"probe_compile: {args.start_against} holds no engramprof package")
        compare_start(args.start_against, args.rounds)
        return
    progs = captured_texts()
    rows = []
    for name, text in progs:
        with_headers = BLOCK.sub(KERNEL_HEADERS, text)
        if with_headers == text:  # a program without kernel_types.h: one form only
            with_headers = None
        rows.append((name, text, with_headers, [], []))
    insns: dict[str, int] = {}
    for _ in range(args.rounds):
        for name, text, old, now_s, old_s in rows:
            dt, insns[name] = compile_s(text)
            now_s.append(dt)
            if old is not None:
                old_s.append(compile_s(old)[0])
    load = os.getloadavg()[0]
    print(f"{len(rows)} programs of one `syscalls` recording, {args.rounds} rounds interleaved, "
          f"median s; load average (1 min) {load:.1f} on {os.cpu_count()} CPUs")
    print(f"{'program (its ring)':<24}{'kernel headers':>16}{'kernel_types.h':>16}{'ratio':>8}{'verified':>10}")
    tot_old = tot_now = 0.0
    for name, _, old, now_s, old_s in rows:
        now = statistics.median(now_s)
        before = statistics.median(old_s) if old_s else now
        tot_now += now
        tot_old += before
        print(f"{name:<24}{before:16.2f}{now:16.2f}{now / before:8.2f}{insns[name]:10,}")
    print(f"{'all (one recorder)':<24}{tot_old:16.2f}{tot_now:16.2f}{tot_now / tot_old:8.2f}"
          f"{sum(insns.values()):10,}")


if __name__ == "__main__":
    main()
