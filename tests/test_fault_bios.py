"""The fault probe's block-I/O evidence (probes/faults.bpf.c: block_bio_queue, block_rq_complete,
block_bio_complete): real eBPF.

Completions fire for every I/O of the machine, in interrupt (or the device's) context, so the
probe keeps a count of its own bios in flight and returns before any hash lookup when it is
zero.  A request-based device (the root disk here) completes a fault's bio as a request; a
bio-based one (zram, device-mapper, md) makes no request and completes the bio itself.  On both,
a cold memmap gather's major faults must get their bios' queue -> complete time, and once they
completed the count must be back to 0 (so other processes' completions stop at the count, and
the bio map does not fill up: a full LRU map made every insertion pay an eviction)."""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile

import pytest

from engramprof.bpf import layout

pytestmark = pytest.mark.bpf
PAGE = os.sysconf("SC_PAGE_SIZE")
PAGES = 200  # faults, 16 pages apart (fault-around cannot serve the next one)
ZRAM_CONTROL = "/sys/class/zram-control"

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


class Zram:
    """An ext4 filesystem on a zram device of its own (hot_add), removed by close()."""

    def __init__(self, size: int):
        self.n = None
        self.mp = tempfile.mkdtemp(prefix="engramprof-test-zram-", dir="/dev/shm")
        self.mounted = False
        try:
            with open(f"{ZRAM_CONTROL}/hot_add") as f:
                self.n = int(f.read())
            with open(f"/sys/block/zram{self.n}/disksize", "w") as f:
                f.write(str(size))
            subprocess.run(["mkfs.ext4", "-q", "-F", f"/dev/zram{self.n}"], check=True, capture_output=True)
            subprocess.run(["mount", "-t", "ext4", f"/dev/zram{self.n}", self.mp], check=True, capture_output=True)
            self.mounted = True
        except BaseException:
            self.close()
            raise

    def close(self):
        if self.mounted:
            subprocess.run(["umount", self.mp], check=False)
            self.mounted = False
        if self.n is not None:
            with open(f"/sys/block/zram{self.n}/reset", "w") as f:
                f.write("1")
            with open(f"{ZRAM_CONTROL}/hot_remove", "w") as f:
                f.write(str(self.n))
            self.n = None
        if not self.mounted:
            os.rmdir(self.mp)


@pytest.fixture(params=["request-based", "bio-based"])
def table_dir(request, tmp_path):
    if request.param == "request-based":
        yield tmp_path  # tmp_path is on the root disk here (virtio: a request-based device)
        return
    if not os.path.exists(f"{ZRAM_CONTROL}/hot_add"):
        pytest.skip("no zram-control/hot_add on this kernel: no bio-based device to make")
    z = Zram(64 << 20)
    try:
        yield z.mp
    finally:
        for name in os.listdir(z.mp):
            p = os.path.join(z.mp, name)
            if os.path.isfile(p):
                os.unlink(p)
        z.close()


def _cold_run(table_dir, script: str, load_probe, inflight_map: str, bio_map: str):
    """Write a table, start ``script`` on it (it evicts the table and says ready), load the probe
    with ``load_probe(pid)``, let the script read once and exit; returns (records, the script's
    answer line, the probe's in-flight count, entries left in its bio map)."""
    table = os.path.join(table_dir, "table.bin")
    with open(table, "xb") as f:
        f.write(os.urandom(PAGES * 16 * PAGE))
        os.fsync(f.fileno())
    w = subprocess.Popen([sys.executable, "-c", script, table], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True)
    probe = None
    try:
        assert w.stdout.readline().strip() == "ready"
        probe = load_probe(w.pid)
        if not probe.plan.features.get("HAVE_BIO"):
            pytest.skip("this kernel lacks the block tracepoints: no bio evidence to check")
        w.stdin.write("go\n")
        w.stdin.flush()
        answer = w.stdout.readline().strip()
        w.stdin.write("end\n")  # its next syscall closes the last fault
        w.stdin.flush()
        w.wait(timeout=30)
        recs = probe.ring.drain()
        inflight = probe.bpf[inflight_map][0].value
        left = len(probe.bpf[bio_map].items())
    finally:
        if w.poll() is None:
            w.kill()
            w.wait()
        if probe is not None:
            probe.close()
    return recs, answer, inflight, left


def test_cold_faults_get_their_bio_time_and_the_in_flight_count_returns_to_zero(table_dir):
    from engramprof.bpf import faults as fp

    recs, answer, inflight, left = _cold_run(
        table_dir, GATHER, lambda pid: fp.LoadedFaultProbe(fp.plan(fp.FaultProbeConfig(tgid=pid))),
        "fault_bios_inflight", "fault_bio_by_sector")
    assert answer.isdigit()
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
    # every bio queued by a fault completed and left the map (single-page reads 64 KiB apart:
    # nothing merged)
    assert (inflight, left) == (0, 0)


PREADER = r"""
import os, sys
path = sys.argv[1]
fd = os.open(path, os.O_RDONLY)
size = os.fstat(fd).st_size
os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)  # no readahead: one page, one bio a call
os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
print("ready", flush=True)
sys.stdin.readline()
n = 0
for off in range(0, size, 16 * os.sysconf("SC_PAGE_SIZE")):
    n += os.preadv(fd, [bytearray(os.sysconf("SC_PAGE_SIZE"))], off)
print(n, flush=True)
sys.stdin.readline()
"""


def test_cold_syscall_reads_get_their_bio_time_and_the_in_flight_count_returns_to_zero(table_dir):
    """The syscall probe (probes/preadv.bpf.c) on the same two device kinds: cold preadv calls
    carry their bio's queue -> complete time, and its in-flight count and bio map end empty."""
    from engramprof.bpf import loader

    recs, answer, inflight, left = _cold_run(
        table_dir, PREADER, lambda pid: loader.LoadedProbe(loader.plan(loader.ProbeConfig(tgid=pid))),
        "bios_inflight", "bio_start_by_sector")
    assert int(answer) == PAGES * PAGE
    assert len(recs) >= PAGES, len(recs)
    with_bio = recs[recs["bio_count"] > 0]
    assert len(with_bio) >= 0.9 * PAGES, (len(recs), len(with_bio))
    timed = with_bio[with_bio["bio_ns"] > 0]
    assert len(timed) >= 0.9 * len(with_bio), (len(with_bio), len(timed))
    assert (timed["bio_ns"] <= timed["dur_ns"]).mean() >= 0.9
    assert (inflight, left) == (0, 0)
