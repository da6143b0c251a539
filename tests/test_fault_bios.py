"""The fault probe's block-I/O evidence (probes/faults.bpf.c, block_bio_queue / block_rq_complete):
real eBPF.

block_rq_complete fires for every request of the machine, in interrupt context, so the probe
keeps a count of its own bios in flight and returns before any hash lookup when it is zero.
This checks that the shortcut loses nothing: a cold memmap gather's major faults still get
their bios' queue -> complete time, and once they completed the count is back to 0 (so an
untraced process's completions stop at the count)."""
from __future__ import annotations

import mmap
import os
import subprocess
import sys

import pytest

from engramprof.bpf import layout

pytestmark = pytest.mark.bpf
PAGE = os.sysconf("SC_PAGE_SIZE")
PAGES = 200  # faults, 16 pages apart (fault-around cannot serve the next one)

GATHER = r"""
import mmap, os, sys
import numpy as np
path = sys.argv[1]
fd = os.open(path, os.O_RDONLY)
size = os.fstat(fd).st_size
mm = np.memmap(path, dtype=np.uint8, mode="r", shape=(size,))
mm._mmap.madvise(mmap.MADV_RANDOM)
os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
print("ready", flush=True)
sys.stdin.readline()
print(int(mm[np.arange(0, size, 16 * mmap.PAGESIZE)].sum()), flush=True)
sys.stdin.readline()
"""


def test_cold_faults_get_their_bio_time_and_the_in_flight_count_returns_to_zero(tmp_path):
    from engramprof.bpf import faults as fp

    table = tmp_path / "table.bin"  # tmp_path is on the root disk here (a real block device)
    with open(table, "xb") as f:
        f.write(os.urandom(PAGES * 16 * PAGE))
        os.fsync(f.fileno())
    w = subprocess.Popen([sys.executable, "-c", GATHER, str(table)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True)
    probe = None
    try:
        assert w.stdout.readline().strip() == "ready"
        probe = fp.LoadedFaultProbe(fp.plan(fp.FaultProbeConfig(tgid=w.pid)))
        if not probe.plan.features.get("HAVE_BIO"):
            pytest.skip("this kernel lacks block_bio_queue / block_rq_complete: no bio evidence to check")
        w.stdin.write("go\n")
        w.stdin.flush()
        assert w.stdout.readline().strip().isdigit()
        w.stdin.write("end\n")  # its next syscall closes the last fault
        w.stdin.flush()
        w.wait(timeout=30)
        recs = probe.ring.drain()
        inflight = probe.bpf["fault_bios_inflight"][0].value
    finally:
        if w.poll() is None:
            w.kill()
            w.wait()
        if probe is not None:
            probe.close()
    bits = layout.header_defines("FAULT_")
    major = recs[(recs["flags"] & bits["MAJOR"]) != 0]
    with_bio = major[major["bio_count"] > 0]
    # every page was evicted: (nearly) every fault read its page from the device
    assert len(major) >= 0.9 * PAGES, (len(recs), len(major))
    assert len(with_bio) >= 0.9 * len(major), (len(major), len(with_bio))
    # each such fault waited for its bio, and the wait is inside the fault
    timed = with_bio[with_bio["bio_ns"] > 0]
    assert len(timed) >= 0.9 * len(with_bio), (len(with_bio), len(timed))
    assert (timed["bio_ns"] <= timed["dur_ns"]).mean() >= 0.9
    # every bio queued by a fault completed (single-page reads 64 KiB apart: nothing merged)
    assert inflight == 0, inflight
