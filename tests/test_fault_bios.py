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

import contextlib
import os
import subprocess
import sys
import tempfile

import pytest

from engramprof.bpf import bios
from engramprof.bpf import structs as layout
from tests.kernel_skips import busy_cpus, completions_skipped

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


@contextlib.contextmanager
def zram_filesystem(size: int = 64 << 20):
    """The mount point of an ext4 filesystem on a zram device of the caller's own (a bio-based
    device no other process does I/O on), its files and the device removed afterwards."""
    if not os.path.exists(f"{ZRAM_CONTROL}/hot_add"):
        pytest.skip("no zram-control/hot_add on this kernel: no bio-based device to make")
    z = Zram(size)
    try:
        yield z.mp
    finally:
        for name in os.listdir(z.mp):
            p = os.path.join(z.mp, name)
            if os.path.isfile(p):
                os.unlink(p)
        z.close()


@pytest.fixture(params=["request-based", "bio-based"])
def table_dir(request, tmp_path):
    if request.param == "request-based":
        yield tmp_path  # tmp_path is on the root disk here (virtio: a request-based device)
        return
    with zram_filesystem() as mp:
        yield mp


def _slots_left(probe) -> tuple[int, int]:
    """(the probe's count of taken bio-table slots, slots whose tag says taken): probes/bios.h."""
    # one batched read of the array (a million slots in 0.5 s; one lookup a slot: 8 s)
    return probe.bpf["bio_slots_taken"][0].value, sum(1 for _, v in probe.bpf["bio_slots"].items_lookup_batch() if v.tag)


def _cold_run(table_dir, script: str, load_probe, pages: int = PAGES, prepare=None):
    """Write a table, start ``script`` on it (it evicts the table and says ready), load the probe
    with ``load_probe(pid)`` (then ``prepare(probe)``), let the script read once and exit; returns (records, the script's
    answer line, the probe's count of taken bio slots, slots left taken, its totals, the runs of
    its programs the kernel skipped)."""
    table = os.path.join(table_dir, "table.bin")
    with open(table, "xb") as f:
        f.write(os.urandom(pages * 16 * PAGE))
        os.fsync(f.fileno())
    w = subprocess.Popen([sys.executable, "-c", script, table], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True)
    probe = None
    try:
        assert w.stdout.readline().strip() == "ready"
        probe = load_probe(w.pid)
        if not probe.plan.features.get("HAVE_BIO"):
            pytest.skip("this kernel lacks the block tracepoints: no bio evidence to check")
        if prepare is not None:
            prepare(probe)
        w.stdin.write("go\n")
        w.stdin.flush()
        answer = w.stdout.readline().strip()
        w.stdin.write("end\n")  # its next syscall closes the last fault
        w.stdin.flush()
        w.wait(timeout=30)
        recs = probe.ring.drain()
        inflight, left = _slots_left(probe)
        totals = probe.totals()
        skipped = probe.skipped_runs()
    finally:
        if w.poll() is None:
            w.kill()
            w.wait()
        if probe is not None:
            probe.close()
    return recs, answer, inflight, left, totals, skipped


def test_cold_faults_get_their_bio_time_and_the_in_flight_count_returns_to_zero(table_dir):
    from engramprof.bpf import faults as fp

    recs, answer, inflight, left, totals, skipped = _cold_run(
        table_dir, GATHER, lambda pid: fp.LoadedFaultProbe(fp.plan(fp.FaultProbeConfig(tgid=pid))))
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
    # every bio queued by a fault completed and left the table (single-page reads 64 KiB apart:
    # nothing merged; one bio in flight at a time: none untracked)
    assert inflight == left <= completions_skipped(skipped), (inflight, left, skipped)
    assert totals["bios_untracked"] == 0 or completions_skipped(skipped), (totals["bios_untracked"], skipped)


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
    """The syscall probe (probes/syscalls.bpf.c) on the same two device kinds: cold preadv calls
    carry their bio's queue -> complete time, and its in-flight count and bio map end empty."""
    from engramprof.bpf import syscalls as syscalls_probe

    recs, answer, inflight, left, totals, skipped = _cold_run(
        table_dir, PREADER, lambda pid: syscalls_probe.SyscallsProbe(syscalls_probe.plan(syscalls_probe.SyscallsConfig(tgid=pid))))
    assert int(answer) == PAGES * PAGE
    assert len(recs) >= PAGES, len(recs)
    with_bio = recs[recs["bio_count"] > 0]
    assert len(with_bio) >= 0.9 * PAGES, (len(recs), len(with_bio))
    timed = with_bio[with_bio["bio_ns"] > 0]
    assert len(timed) >= 0.9 * len(with_bio), (len(with_bio), len(timed))
    assert (timed["bio_ns"] <= timed["dur_ns"]).mean() >= 0.9
    assert inflight == left <= completions_skipped(skipped), (inflight, left, skipped)
    assert totals["bios_untracked"] == 0 or completions_skipped(skipped), (totals["bios_untracked"], skipped)


# ---- the bio table itself (probes/bios.h): a slot held by another bio, a stale slot ----------

BIG_READ = r"""
import os, sys
path = sys.argv[1]
fd = os.open(path, os.O_RDONLY)
size = os.fstat(fd).st_size
os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
print("ready", flush=True)
sys.stdin.readline()
print(os.preadv(fd, [bytearray(size)], 0), flush=True)
sys.stdin.readline()
"""

SEQUENTIAL_GATHER = r"""
import mmap, os, sys
import numpy as np
path = sys.argv[1]
fd = os.open(path, os.O_RDONLY)
size = os.fstat(fd).st_size
mm = np.memmap(path, dtype=np.uint8, mode="r", shape=(size,))
mm._mmap.madvise(mmap.MADV_SEQUENTIAL)
os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
print("ready", flush=True)
sys.stdin.readline()
print(int(mm[::mmap.PAGESIZE].sum()), flush=True)
sys.stdin.readline()
"""


def _syscall_probe(**kw):
    from engramprof.bpf import syscalls as syscalls_probe
    return lambda pid: syscalls_probe.SyscallsProbe(syscalls_probe.plan(syscalls_probe.SyscallsConfig(tgid=pid, **kw)))


def _fault_probe(**kw):
    from engramprof.bpf import faults as fp
    return lambda pid: fp.LoadedFaultProbe(fp.plan(fp.FaultProbeConfig(tgid=pid, **kw)))


@pytest.mark.parametrize("path", ["syscall", "fault"])
def test_bios_whose_slot_another_bio_holds_are_counted_untracked_and_the_tracked_ones_complete(tmp_path, path):
    """One slot: a 16 MiB cold read on the root disk (request-based, plugged: a readahead window's
    bios are all queued before the first completes) queues several bios at once; all but the one
    holding the slot are untracked and counted, and the tracked one completes and frees it.  (On
    zram each bio completes inside its own submission: never two in flight.)  Whether a window's
    bios are in flight together is the device's doing (about 1 run in 10 of the fault path had
    its first window in one bio here): up to 3 runs, the table's invariants checked on each."""
    script, load = (BIG_READ, _syscall_probe(bio_slots=1)) if path == "syscall" else \
        (SEQUENTIAL_GATHER, _fault_probe(bio_slots=1))
    untracked = []
    for attempt in range(3):
        run_dir = tmp_path / str(attempt)
        run_dir.mkdir()
        recs, answer, taken, left, totals, skipped = _cold_run(run_dir, script, load, pages=256)
        assert answer.isdigit()
        with_bio = recs[recs["bio_count"] > 0]
        queued = int(with_bio["bio_count"].sum())
        assert totals["bios_untracked"] < queued, (queued, totals)  # the slot's own bio was tracked
        assert (with_bio["bio_ns"] > 0).any()
        assert taken == left <= completions_skipped(skipped), (taken, left, skipped)
        untracked.append(totals["bios_untracked"])
        if untracked[-1]:
            break
    assert untracked[-1] >= 1, untracked


# GATHER reading its pages twice, evicted in between (unmapped, then dropped from the page cache)
REREAD_GATHER = GATHER.replace("""print(int(mm[np.arange(0, size, 16 * mmap.PAGESIZE)].sum()), flush=True)
""", """rows = np.arange(0, size, 16 * mmap.PAGESIZE)
first = int(mm[rows].sum())
mm._mmap.madvise(mmap.MADV_DONTNEED)
os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
print(first if int(mm[rows].sum()) == first else -1, flush=True)
""")
assert REREAD_GATHER != GATHER


@pytest.mark.parametrize("hooks, sector_once", [("tracepoint", True), ("tracepoint", False), ("raw", True)])
def test_completions_under_another_bpf_program_skipped_counted_or_seen(tmp_path, hooks, sector_once):
    """While another BPF program keeps the CPUs busy (tests/kernel_skips.py), a completion that
    lands inside it is skipped by a tracepoint hook (the kernel's bpf_prog_active guard), not by a
    raw tracepoint's (its own guard).  With tracepoint hooks: the skips are counted
    (engramprof/bpf/progstats.py), every bio-table slot left held is one of them, and the reader's
    second read of the same pages (evicted in between) has no untracked bio with BIO_SECTOR_ONCE
    (the re-read's bio takes over the slot its sector's first bio left) and untracked ones without
    it.  With raw hooks (the default where the kernel's BTF allows): no completion is skipped, no
    slot is left, no bio is untracked."""
    if hooks == "raw" and bios.completion_offsets() is None:
        pytest.skip("no kernel BTF with the block completion fields: the raw hooks are not built here")
    # 64 pages a pass, 2^20 slots: a re-read's bio lands on another sector's held slot (a skipped
    # completion's, untracked either way) about once in a thousand runs; 16384 slots, 200 pages: 3 in 4
    probe = _fault_probe(bio_sector_once=sector_once, bio_slots=1 << 20, bio_raw_completion=hooks == "raw")
    with contextlib.ExitStack() as hog:  # the CPUs busy once the probe is loaded, until the reader is done
        recs, answer, inflight, left, totals, skipped = _cold_run(
            tmp_path, REREAD_GATHER, probe, pages=64, prepare=lambda probe: hog.enter_context(busy_cpus()))
    assert answer.isdigit(), answer  # both passes read the same bytes
    n = completions_skipped(skipped)
    timed = recs[recs["bio_count"] > 0]
    if hooks == "raw":
        assert (n, inflight, left, totals["bios_untracked"]) == (0, 0, 0, 0), (skipped, inflight, left, totals)
        assert (timed["bio_ns"] > 0).all(), timed[["bio_count", "bio_ns"]]
        return
    assert n > 0, skipped  # the premise: the hog made the kernel skip completions
    assert inflight == left <= n, (inflight, left, skipped)
    if sector_once:
        assert totals["bios_untracked"] == 0, (totals["bios_untracked"], skipped)
    else:
        assert 0 < totals["bios_untracked"] <= n, (totals["bios_untracked"], skipped, left, len(timed))


def _fill_slot_zero(queued_ns_ago: int):
    """prepare(): slot 0 held by a bio of no device, queued ``queued_ns_ago`` before now (the tag
    layout of probes/bios.h: hash bits << 32 | queue tick | 1)."""
    import time

    def fill(probe):
        slots = probe.bpf["bio_slots"]
        v = slots.Leaf()
        tick = (((time.monotonic_ns() - queued_ns_ago) >> 20) | 1) & 0xFFFFFFFF
        v.tag, v.sector, v.ts, v.owner_ts, v.dev, v.tid = 0xDEAD << 32 | tick, 1, 1, 1, 0, 0
        slots[slots.Key(0)] = v
        taken = probe.bpf["bio_slots_taken"]
        taken[taken.Key(0)] = taken.Leaf(1)
    return fill


def test_a_slot_held_past_the_stale_bound_is_taken_over_by_a_new_bio(tmp_path):
    """One slot, held by a bio queued 60 s ago whose completion was never seen (BIO_STALE_NS is
    10 s): the first cold call's bio takes it over, and every call's bio is then timed as usual."""
    recs, answer, taken, left, totals, skipped = _cold_run(tmp_path, PREADER, _syscall_probe(bio_slots=1),
                                                  prepare=_fill_slot_zero(60_000_000_000))
    assert int(answer) == PAGES * PAGE
    with_bio = recs[recs["bio_count"] > 0]
    assert len(with_bio) >= 0.9 * PAGES, (len(recs), len(with_bio))
    assert (with_bio["bio_ns"] > 0).mean() >= 0.9
    assert taken == left <= completions_skipped(skipped), (taken, left, skipped)
    assert totals["bios_untracked"] == 0 or completions_skipped(skipped), (totals["bios_untracked"], skipped)


def test_a_slot_held_by_a_live_bio_is_not_taken_over(tmp_path):
    """The same slot held by a bio queued just now: every bio of the cold calls is untracked
    (counted, no bio time) and the holder keeps its slot."""
    recs, answer, taken, left, totals, skipped = _cold_run(tmp_path, PREADER, _syscall_probe(bio_slots=1),
                                                  prepare=_fill_slot_zero(0))
    assert int(answer) == PAGES * PAGE
    with_bio = recs[recs["bio_count"] > 0]
    assert len(with_bio) >= 0.9 * PAGES, (len(recs), len(with_bio))
    assert totals["bios_untracked"] == int(with_bio["bio_count"].sum())
    assert (with_bio["bio_ns"] == 0).all()
    assert (taken, left) == (1, 1)
