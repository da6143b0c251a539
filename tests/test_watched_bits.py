"""The watched-file pre-filter of the page-cache and eviction probes (probes/watched.h).

Each probe tests a ``watched_bits`` array slot of (device, inode) before its ``watched_files``
hash lookup.  Without root: the Python hash's range and the power-of-two check.  With root (real
eBPF): the C and the Python watch_bit() agree on thousands of pairs (computed by a test
program); a file watched only from user space has another process's insertions and evictions
recorded (user space set its slot); a file a target made watched in the kernel has another
process's insertions recorded (the probe set its slot); a never-watched file that shares a set
slot (WATCH_BITS 2) is still not recorded (the hash decides); a key put in the hash without
its slot is not recorded (the slot is tested first: fails on the probes before watched.h).
"""
from __future__ import annotations

import ctypes
import os
import random
import subprocess
import sys
import tempfile

import pytest

from engramprof.bpf import watched

PAGE = os.sysconf("SC_PAGE_SIZE")
FILE_PAGES = 256
WORK_DIR = os.environ.get("ENGRAMPROF_SCENARIO_DIR", "/var/tmp")  # a disk file system: /tmp may be tmpfs


def test_watch_bit_is_in_range_and_spreads_sequential_inodes():
    for bits in (1, 2, 1024, watched.WATCH_BITS):
        assert all(0 <= watched.watch_bit(2049, ino, bits) < bits for ino in range(5000))
    assert {watched.watch_bit(2049, ino, 1) for ino in range(100)} == {0}
    # 4,096 consecutive inodes of one device over 65,536 slots: a good hash leaves ~3.9k distinct
    slots = {watched.watch_bit(2049, ino) for ino in range(1_000_000, 1_004_096)}
    assert len(slots) > 3800, len(slots)
    assert watched.watch_bit(2049, 12) != watched.watch_bit(2050, 12) or watched.watch_bit(2049, 13) != \
        watched.watch_bit(2050, 13)


@pytest.mark.parametrize("bad", [0, 3, 1000, 1 << 32])
def test_watch_bits_must_be_a_power_of_two(bad):
    with pytest.raises(ValueError):
        watched.check_bits(bad)


# ------------------------------------------------------------------------ real eBPF --

PAIRS = 1024
HASH_PROGRAM = r"""
#include "watched.h"
BPF_ARRAY(pairs_in, struct file_key, PAIRS);
BPF_ARRAY(bits_out, u32, PAIRS);

TRACEPOINT_PROBE(syscalls, sys_enter_getppid)
{
	if ((bpf_get_current_pid_tgid() >> 32) != TEST_TGID)
		return 0;
	for (u32 i = 0; i < PAIRS; i++) {
		u32 j = i;
		struct file_key *k = pairs_in.lookup(&j);
		u32 *out = bits_out.lookup(&j);
		if (k && out)
			*out = watch_bit(k->dev, k->ino);
	}
	return 0;
}
"""


def _pairs(seed: int) -> list[tuple[int, int]]:
    rnd = random.Random(seed)
    edge = [(0, 0), (0, 1), (1, 0), (0xFFFFFFFF, (1 << 64) - 1), (0xFFFFFFFF, 0), (0, (1 << 64) - 1),
            (8 << 20 | 1, 2), (253 << 20, 1 << 32), (259 << 20 | 3, (1 << 63) + 5)]
    st = os.stat(WORK_DIR)
    edge.append(((os.major(st.st_dev) << 20) | os.minor(st.st_dev), st.st_ino))
    out = edge + [((rnd.randrange(4096) << 20) | rnd.randrange(1 << 20), rnd.choice(
        [rnd.randrange(1 << 20), rnd.randrange(1 << 32), rnd.getrandbits(64)])) for _ in range(PAIRS * 4)]
    return out


@pytest.mark.bpf
@pytest.mark.parametrize("bits", [2, watched.WATCH_BITS])
def test_c_and_python_watch_bit_agree(bits):
    from engramprof.bpf.base import compile_program, import_bcc

    BPF = import_bcc()
    text = f"#define WATCH_BITS {bits}\n#define PAIRS {PAIRS}\n#define TEST_TGID {os.getpid()}\n"
    text += watched.inline(HASH_PROGRAM)
    b = compile_program(BPF, text, "watch_bit test program")
    try:
        pairs, bits_out = b["pairs_in"], b["bits_out"]
        checked = 0
        all_pairs = _pairs(bits)
        for start in range(0, len(all_pairs), PAIRS):
            chunk = all_pairs[start:start + PAIRS]
            for i, (dev, ino) in enumerate(chunk):
                k = pairs.Leaf()
                k.dev, k.ino = dev, ino
                pairs[ctypes.c_int(i)] = k
            os.getppid()  # the test program computes bits_out
            for i, (dev, ino) in enumerate(chunk):
                assert bits_out[ctypes.c_int(i)].value == watched.watch_bit(dev, ino, bits), (dev, ino, bits)
                checked += 1
        assert checked >= 4 * PAIRS
        if bits > 2:
            assert len({bits_out[ctypes.c_int(i)].value for i in range(PAIRS)}) > PAIRS // 2  # not all one slot
    finally:
        b.cleanup()


def _sparse_file(path: str) -> tuple[int, int]:
    """A sparse file of FILE_PAGES pages (a read inserts zero pages, no device I/O): (dev, ino)."""
    with open(path, "wb") as f:
        f.truncate(FILE_PAGES * PAGE)
    st = os.stat(path)
    return (os.major(st.st_dev) << 20) | os.minor(st.st_dev), st.st_ino


def _cold_read(path: str) -> None:
    """Drop the file's pages, then read it whole (this process: not a target)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        while os.read(fd, 1 << 20):
            pass
    finally:
        os.close(fd)


def _cached_pages(path: str) -> int:
    """The file's pages in the page cache now (cachestat: no page is read)."""
    from engramprof.host.cachestat import cachestat

    fd = os.open(path, os.O_RDONLY)
    try:
        return cachestat(fd).nr_cache
    finally:
        os.close(fd)


def _drop(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


@pytest.fixture
def target():
    """A process that is the probes' target and reads a file when told (one path a line)."""
    p = subprocess.Popen([sys.executable, "-c", "import sys\nfor line in sys.stdin:\n"
                          "    with open(line.strip(), 'rb') as f:\n        while f.read(1 << 20): pass\n"
                          "    print('done', flush=True)\n"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    yield p
    p.kill()
    p.wait()


@pytest.fixture
def files():
    work = tempfile.mkdtemp(prefix="engramprof-watched-", dir=WORK_DIR)
    yield work
    for n in os.listdir(work):
        os.unlink(os.path.join(work, n))
    os.rmdir(work)


def _insertions(probe):
    """The page-cache probe's insertion records so far (ring + open runs), drained once."""
    import numpy as np

    from engramprof.bpf.pagecache import defines

    recs = probe.ring.drain()
    recs = np.concatenate([recs, probe.open_runs()]) if len(recs) else probe.open_runs()
    return recs[recs["kind"] == defines("PC_")["INSERT"]]


def _pages_by_me(recs, key: tuple[int, int], field: str) -> int:
    """Pages of file ``key`` in records written in this process's context (not a target)."""
    mine = recs[(recs["dev"] == key[0]) & (recs["ino"] == key[1]) & (recs["pid"] == os.getpid())]
    return int(mine[field].sum())


def _pagecache_probe(tgid: int, bits: int = watched.WATCH_BITS):
    from engramprof.bpf import pagecache as pc

    return pc.LoadedPagecacheProbe(pc.plan(pc.PagecacheProbeConfig(tgid=tgid, watch_bits=bits)))


def _eviction_probe(bits: int = watched.WATCH_BITS):
    from engramprof.bpf import evictions as ev

    return ev.LoadedEvictionProbe(ev.plan(ev.EvictionProbeConfig(watch_bits=bits)))


def _slot_of(probe_bpf, dev: int, ino: int, bits: int) -> int:
    return probe_bpf["watched_bits"][ctypes.c_uint32(watched.watch_bit(dev, ino, bits))].value


def _key_only(probe_bpf, dev: int, ino: int) -> None:
    """Put (dev, ino) in watched_files without its slot (what a loader that forgot the bit does)."""
    files = probe_bpf["watched_files"]
    k = files.Key()
    k.dev, k.ino = dev, ino
    files[k] = ctypes.c_uint8(1)


@pytest.mark.bpf
def test_page_cache_a_file_watched_from_user_space_records_another_process_and_an_unslotted_key_does_not(
        files, target):
    a, b = os.path.join(files, "a.bin"), os.path.join(files, "b.bin")
    key_a, key_b = _sparse_file(a), _sparse_file(b)
    if watched.watch_bit(*key_a) == watched.watch_bit(*key_b):  # 1 in 65,536: another inode for b
        key_b = _sparse_file(os.path.join(files, "b2.bin"))
        b = os.path.join(files, "b2.bin")
    probe = _pagecache_probe(target.pid)
    try:
        assert probe.watch(*key_a)
        assert _slot_of(probe.bpf, *key_a, watched.WATCH_BITS) == 1
        _key_only(probe.bpf, *key_b)
        assert _slot_of(probe.bpf, *key_b, watched.WATCH_BITS) == 0
        _cold_read(a)
        _cold_read(b)
        recs = _insertions(probe)
        assert _pages_by_me(recs, key_a, "count") == FILE_PAGES
        # b is in the hash but its slot is clear: the slot is tested first, nothing recorded
        assert _pages_by_me(recs, key_b, "count") == 0
        assert probe.totals()["target_pages"] == 0
    finally:
        probe.close()


@pytest.mark.bpf
def test_page_cache_a_file_a_target_made_watched_records_another_process(files, target):
    a = os.path.join(files, "a.bin")
    key = _sparse_file(a)
    _drop(a)
    probe = _pagecache_probe(target.pid)
    try:
        assert _slot_of(probe.bpf, *key, watched.WATCH_BITS) == 0
        target.stdin.write(a + "\n")
        target.stdin.flush()
        assert target.stdout.readline().strip() == "done"
        assert probe.totals()["target_pages"] == FILE_PAGES  # the target's insertions made a watched
        assert _slot_of(probe.bpf, *key, watched.WATCH_BITS) == 1  # ... and set its slot in the kernel
        _cold_read(a)
        recs = _insertions(probe)
        assert _pages_by_me(recs, key, "count") == FILE_PAGES
    finally:
        probe.close()


def _colliding(files: str, bits: int) -> tuple[tuple[str, tuple[int, int]], ...]:
    """(watched, never watched on the same slot, never watched on another slot) files."""
    a = os.path.join(files, "a.bin")
    key_a = _sparse_file(a)
    same = other = None
    for i in range(64):
        p = os.path.join(files, f"c{i}.bin")
        key = _sparse_file(p)
        if watched.watch_bit(*key, bits) == watched.watch_bit(*key_a, bits):
            same = same or (p, key)
        else:
            other = other or (p, key)
        if same and other:
            return (a, key_a), same, other
    pytest.fail("64 inodes over 2 slots and none on (or none off) the watched file's slot")


@pytest.mark.bpf
def test_page_cache_a_never_watched_file_on_a_set_slot_is_not_recorded(files, target):
    bits = 2
    (a, key_a), (same, key_same), (other, key_other) = _colliding(files, bits)
    probe = _pagecache_probe(target.pid, bits)
    try:
        assert probe.watch(*key_a)
        assert _slot_of(probe.bpf, *key_same, bits) == 1 and _slot_of(probe.bpf, *key_other, bits) == 0
        for p in (same, other, a):
            _cold_read(p)
        recs = _insertions(probe)
        assert _pages_by_me(recs, key_same, "count") == 0  # the slot says maybe, the hash says no
        assert _pages_by_me(recs, key_other, "count") == 0
        assert _pages_by_me(recs, key_a, "count") == FILE_PAGES
    finally:
        probe.close()


@pytest.mark.bpf
def test_evictions_of_a_file_watched_from_user_space_are_recorded_and_an_unslotted_key_is_not(files):
    a, b = os.path.join(files, "a.bin"), os.path.join(files, "b.bin")
    key_a, key_b = _sparse_file(a), _sparse_file(b)
    if watched.watch_bit(*key_a) == watched.watch_bit(*key_b):
        b = os.path.join(files, "b2.bin")
        key_b = _sparse_file(b)
    _cold_read(a)
    _cold_read(b)
    probe = _eviction_probe()
    try:
        assert probe.watch(*key_a)
        _key_only(probe.bpf, *key_b)
        before = _cached_pages(a)
        _drop(a)
        dropped = before - _cached_pages(a)  # the kernel's count (reclaim may have taken a few)
        _drop(b)
        recs = probe.ring.drain()
        assert dropped > FILE_PAGES // 2, (before, dropped)
        assert _pages_by_me(recs, key_a, "pages") == dropped
        assert _pages_by_me(recs, key_b, "pages") == 0  # in the hash, slot clear: not recorded
    finally:
        probe.close()


@pytest.mark.bpf
def test_evictions_of_a_never_watched_file_on_a_set_slot_are_not_recorded(files):
    bits = 2
    (a, key_a), (same, key_same), (other, key_other) = _colliding(files, bits)
    for p in (a, same, other):
        _cold_read(p)
    probe = _eviction_probe(bits)
    try:
        assert probe.watch(*key_a)
        assert _slot_of(probe.bpf, *key_same, bits) == 1
        for p in (same, other):
            _drop(p)
        before = _cached_pages(a)
        _drop(a)
        dropped = before - _cached_pages(a)  # the kernel's own count (a loaded machine may have
        recs = probe.ring.drain()             # reclaimed a few pages before the drop)
        assert _pages_by_me(recs, key_same, "pages") == 0
        assert _pages_by_me(recs, key_other, "pages") == 0
        assert dropped > FILE_PAGES // 2, (before, dropped)
        assert _pages_by_me(recs, key_a, "pages") == dropped
    finally:
        probe.close()


@pytest.mark.bpf
def test_the_recorder_counts_the_files_in_the_kernels_watched_set(target):
    """summary()["watched_files"] counts watched_files' keys (BCC's keys() is an iterator: len()
    of it raised, and the count stayed 0)."""
    from engramprof.record.sources import Recording
    from engramprof.record.sources.pagecache import PagecacheSource

    rec = PagecacheSource(Recording.of(target.pid))
    try:
        rec.load()
        from_user_space = len(rec.probe.watched)  # the target's open and mapped files (python, its libraries)
        assert from_user_space > 0
        assert rec.summary()["watched_files"] >= from_user_space
    finally:
        rec.close()
