"""Make the kernel skip probes' programs, for real: a "hog" BPF program that runs for ~50 us on
every getppid() of processes of ours that call nothing else, one pinned to each CPU (wherever
the device's interrupts land).  A tracepoint program
does not run while another BPF program runs on its CPU (engramprof/bpf/progstats.py): a block
completion interrupt that lands inside the hog's run is not seen by any probe's completion hook,
and the kernel counts the skip (measured here: about a third of the completions of a cold read
skipped).  Only the hog process pays the hog's time."""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys

HOG_PROGRAM = r"""
TRACEPOINT_PROBE(syscalls, sys_enter_getppid)
{
	char comm[16] = {};
	bpf_get_current_comm(&comm, sizeof(comm));
	if (*(u64 *)comm != HOG_COMM)
		return 0;
	u64 x = 0;
	for (int i = 0; i < HOG_LOOPS; i++)
		x += bpf_ktime_get_ns() & 1;
	return x == 12345;
}
"""
#: the hog processes' name (comm), 8 bytes: the program compares it as one u64
HOG_NAME = b"eprofhog"
#: a process per CPU, pinned to it, calling getppid() and nothing else; ended with the parent
HOG_PROCESS = r"""
import os, signal, sys
for cpu in sorted(os.sched_getaffinity(0)):
    if os.fork() == 0:
        os.sched_setaffinity(0, {cpu})
        os.nice(19)  # the hog yields the CPU to the test's reader at once
        with open("/proc/self/comm", "wb") as f:
            f.write(sys.argv[1].encode())
        while os.getppid() != 1:
            pass
        os._exit(0)
sys.stdin.read()  # until the test closes it or kills this parent: the children then see ppid 1
"""


@contextlib.contextmanager
def busy_cpus(loops: int = 500):
    """While inside, every CPU spends most of its time in the hog's BPF program."""
    from bcc import BPF

    hog = subprocess.Popen([sys.executable, "-c", HOG_PROCESS, HOG_NAME.decode()], stdin=subprocess.PIPE)
    b = None
    try:
        comm = int.from_bytes(HOG_NAME, sys.byteorder)
        b = BPF(text=HOG_PROGRAM, cflags=[f"-DHOG_COMM={comm}ULL", f"-DHOG_LOOPS={int(loops)}"])
        yield b
    finally:
        if b is not None:
            b.cleanup()
        hog.kill()
        hog.wait()


def completions_skipped(skipped: dict | None) -> int:
    """Runs of the probe's completion hooks the kernel skipped (engramprof/bpf/progstats.py: another
    BPF program was running on that CPU), for any I/O of the machine: each may have been one of the
    probe's bios, whose slot then stays held (probes/bios.h).  An upper bound on the slots left."""
    s = skipped or {}
    return sum(s.get(f"{kind}:{hook}", 0) for kind in ("block", "raw") for hook in ("block_rq_complete", "block_bio_complete"))
