"""The libaio probe's edges, on the kernel's own answers (real eBPF, one probe load, this process
as the target): io_submit taking fewer iocbs than asked, iocbs of other types, an iocb on a pipe,
a context with no file read, reaping by another thread, and io_destroy with reads in flight.
"""
from __future__ import annotations

import ctypes
import errno
import mmap
import os
import threading
import time

import pytest

from engramprof.lab import aio

IOCB_CMD_FSYNC = 2
BLOCK = 4096


def _submit(ctx: aio.AioContext, cbs: list) -> int:
    """io_submit of these iocbs as they are; returns its result (-errno on failure)."""
    ptrs = (ctypes.POINTER(aio.Iocb) * len(cbs))(*[ctypes.pointer(c) for c in cbs])
    got = aio._syscall(ctypes.c_long(ctx._submit), ctx.ctx, ctypes.c_long(len(cbs)), ptrs)
    return got if got >= 0 else -ctypes.get_errno()


def _iocb(fd: int, addr: int, off: int, op: int = aio.IOCB_CMD_PREAD, n: int = BLOCK, data: int = 0) -> aio.Iocb:
    c = aio.Iocb()
    c.aio_data, c.aio_lio_opcode, c.aio_fildes, c.aio_buf, c.aio_nbytes, c.aio_offset = data, op, fd, addr, n, off
    return c


def _reap(ctx: aio.AioContext, n: int) -> list[tuple[int, int]]:
    return ctx._reap(n)  # io_getevents until n events


def _reap_one_call(ctx: aio.AioContext, n: int) -> int:
    """One io_getevents waiting for all n events; returns how many it returned."""
    return aio._syscall(ctypes.c_long(ctx._getevents), ctx.ctx, ctypes.c_long(n), ctypes.c_long(n), ctx._evs, None)


def _take_from_ring(ctx: aio.AioContext, n: int, timeout: float = 10.0) -> int:
    """Wait for n events in the context's ring (struct aio_ring: id, nr, head, tail, ...) and take
    them as a user-space reaper does: head moved to tail, no syscall.  Returns how many."""
    ring = (ctypes.c_uint * 4).from_address(ctx.ctx.value)
    deadline = time.monotonic() + timeout
    while (ring[3] - ring[2]) % ring[1] < n and time.monotonic() < deadline:
        time.sleep(0.001)
    got = (ring[3] - ring[2]) % ring[1]
    ring[2] = ring[3]
    return got


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    """Everything below done once under one probe; returns (records frame, totals, facts)."""
    from engramprof.bpf import libaio

    path = tmp_path_factory.mktemp("aio-edges") / "data.bin"
    path.write_bytes(os.urandom(64 * BLOCK))
    buf = mmap.mmap(-1, 64 * BLOCK)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    probe = libaio.LibaioProbe.load(libaio.LibaioProbeConfig(tgid=os.getpid()), arm=True)
    facts = {}
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    r, w = os.pipe()
    os.write(w, b"x" * 100)
    try:
        # 1. io_submit of [read, read with aio_reserved2 set (EINVAL), read]: it takes 1
        ctx = aio.AioContext(64)
        bad = _iocb(fd, addr + BLOCK, BLOCK)
        bad.aio_reserved2 = 1
        cbs = [_iocb(fd, addr, 0, data=1), bad, _iocb(fd, addr + 2 * BLOCK, 2 * BLOCK)]
        facts["partial"] = _submit(ctx, cbs)
        facts["partial_reaped"] = _reap(ctx, max(facts["partial"], 0))
        # 2. an fsync iocb (another type) and a read of a pipe
        facts["fsync"] = _submit(ctx, [_iocb(fd, 0, 0, op=IOCB_CMD_FSYNC, n=0)])
        if facts["fsync"] == 1:
            _reap(ctx, 1)
        facts["pipe"] = _submit(ctx, [_iocb(r, addr, 0, n=100)])
        if facts["pipe"] == 1:
            facts["pipe_res"] = _reap(ctx, 1)
        # 3. 8 reads submitted by this thread, reaped by another
        cbs8 = [_iocb(fd, addr + k * BLOCK, k * BLOCK, data=100 + k) for k in range(8)]
        facts["threaded"] = _submit(ctx, cbs8)
        out = []
        t = threading.Thread(target=lambda: out.extend(_reap(ctx, 8)))
        t.start()
        t.join(10)
        facts["reaper_tid"] = t.native_id
        ctx.close()
        # 4. a second context: 16 reads submitted, then io_destroy before any reap
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        ctx2 = aio.AioContext(64)
        facts["destroyed_submit"] = _submit(ctx2, [_iocb(fd, addr + k * BLOCK, k * BLOCK) for k in range(16)])
        ctx2.close()
        # 5. a third context with no read at all: only fsync
        ctx3 = aio.AioContext(8)
        facts["fsync3"] = _submit(ctx3, [_iocb(fd, 0, 0, op=IOCB_CMD_FSYNC, n=0)])
        if facts["fsync3"] == 1:
            _reap(ctx3, 1)
        ctx3.close()
        # 6. 40 reads in one io_submit, reaped by one io_getevents (the probe's loops run in chunks
        # of 16: both cross two chunk boundaries), then 136 in one (the probe reads the first 128)
        ctx4 = aio.AioContext(256)
        live = []  # the iocbs of reads in flight stay allocated: the kernel names each by its address
        live.append([_iocb(fd, addr + (k % 64) * BLOCK, (k % 64) * BLOCK, data=200 + k) for k in range(40)])
        facts["many"] = _submit(ctx4, live[-1])
        facts["many_reaped"] = _reap_one_call(ctx4, 40)
        live.append([_iocb(fd, addr + (k % 64) * BLOCK, (k % 64) * BLOCK, data=300 + k) for k in range(136)])
        facts["over"] = _submit(ctx4, live[-1])
        facts["over_reaped"] = _reap(ctx4, 68) + _reap(ctx4, 68)  # reaps of at most 128 events: all read
        # 8. 136 reads reaped by one io_getevents: the probe reads the first 128 events it returned
        live.append([_iocb(fd, addr + (k % 64) * BLOCK, (k % 64) * BLOCK, data=600 + k) for k in range(136)])
        facts["wide"] = _submit(ctx4, live[-1][:128]) + _submit(ctx4, live[-1][128:])
        facts["wide_reaped"] = _reap_one_call(ctx4, 136)
        ctx4.close()
        # 7. 40 reads whose events this process takes from the context's ring itself (a user-space
        # reap, as fio's userspace_reap): the probe finds them at the next AIO syscall, io_destroy
        ctx5 = aio.AioContext(128)
        live.append([_iocb(fd, addr + k * BLOCK, k * BLOCK, data=500 + k) for k in range(40)])
        facts["ring"] = _submit(ctx5, live[-1])
        facts["ring_taken"] = _take_from_ring(ctx5, 40)
        ctx5.close()
        recs = probe.drain()
        totals = probe.summary_totals()
    finally:
        os.close(fd)
        os.close(r)
        os.close(w)
        probe.close()
    return libaio.to_frame(recs), totals, facts


@pytest.mark.bpf
def test_io_submit_taking_fewer_iocbs(traced):
    ev, t, f = traced
    assert f["partial"] == 1  # the kernel's answer: the second iocb failed, the third was not looked at
    assert t["submit_failed"] == 2, t
    assert ((ev.aio_data == 1) & (ev.offset == 0)).sum() == 1


@pytest.mark.bpf
def test_other_types_and_pipes_are_counted_not_events(traced):
    ev, t, f = traced
    assert f["fsync"] == 1 and t["other_iocbs"] == 2, t  # one in the first context, one in the third
    assert f["pipe"] == 1 and f["pipe_res"][0][1] == 100  # the kernel read the pipe
    assert t["not_regular"] == 1, t
    assert (ev["size"] != 100).all()  # the pipe's read is not an event


@pytest.mark.bpf
def test_reaped_by_another_thread(traced):
    ev, t, f = traced
    assert f["threaded"] == 8
    th = ev[(ev.aio_data >= 100) & (ev.aio_data < 108)]
    assert len(th) == 8 and th.other_thread.all() and (th.reap_tid == f["reaper_tid"]).all()
    assert (th.tid == threading.get_native_id()).all() and (th.ret == BLOCK).all()
    assert t["other_thread"] == 8, t
    # 8 O_DIRECT reads in one io_submit: each one's bio found by iomap_dio_rw_begin naming it; the
    # kernel merges adjacent ones into one request (the submit's plug): merged bios are counted, and
    # only the request's first is timed (block_rq_complete names its first sector)
    assert (th.bio_count == 1).all() and (th.bio_ns > 0).any() and (th.bio_ns <= th.dur_ns).all()


@pytest.mark.bpf
def test_io_destroy_with_reads_in_flight(traced):
    ev, t, f = traced
    assert f["destroyed_submit"] == 16
    # (and the 8 reads of case 8 whose events the probe did not read: in flight at io_destroy)
    assert t["destroyed"] == 5 and t["destroyed_inflight"] == 16 + 8 and t["inflight"] == 0, repr(t)
    # every read iocb is accounted for: an event, failed at submit, or in flight at io_destroy
    assert t["submitted"] == len(ev) + t["submit_failed"] + t["destroyed_inflight"], (t, len(ev))
    # the pipe's and the two fsyncs' events, and the 8 iocbs beyond the 128 the probe reads of one
    # io_submit: reaped, never tracked
    assert t["unknown_events"] == 3 + 8, t
    assert t["lost_records"] == 0 and t["replaced"] == 0


@pytest.mark.bpf
def test_many_iocbs_of_one_call_and_one_reap_every_one_seen(traced):
    """The probe reads an io_submit's iocbs and a reap's events in chunks (probes/libaio.bpf.c
    aio_chain): 40 of each, every one an event, once."""
    ev, t, f = traced
    assert f["many"] == 40 and f["many_reaped"] == 40
    many = ev[(ev.aio_data >= 200) & (ev.aio_data < 240)]
    assert sorted(many.aio_data) == list(range(200, 240)) and (many.ret == BLOCK).all()
    assert not many.ring_reap.any() and (many.offset == (many.aio_data - 200) % 64 * BLOCK).all()


@pytest.mark.bpf
def test_an_io_submit_beyond_its_first_128_iocbs_is_counted_as_truncated(traced):
    ev, t, f = traced
    assert f["over"] == 136 and len(f["over_reaped"]) == 136  # the kernel took and completed all
    over = ev[(ev.aio_data >= 300) & (ev.aio_data < 436)]
    assert sorted(over.aio_data) == list(range(300, 428)), len(over)  # the first 128
    assert t["truncated"] == 8, t


@pytest.mark.bpf
def test_a_reap_beyond_its_first_128_events_is_counted(traced):
    ev, t, f = traced
    assert f["wide"] == 136 and f["wide_reaped"] == 136
    wide = ev[(ev.aio_data >= 600) & (ev.aio_data < 736)]
    assert len(wide) == 128 and wide.aio_data.is_unique, len(wide)  # 128 of the 136, each once
    assert t["events_truncated"] == 8, t


@pytest.mark.bpf
def test_events_taken_from_the_ring_by_the_process_are_found_at_its_next_call(traced):
    ev, t, f = traced
    assert f["ring"] == 40 and f["ring_taken"] == 40
    ring = ev[(ev.aio_data >= 500) & (ev.aio_data < 540)]
    assert sorted(ring.aio_data) == list(range(500, 540)) and ring.ring_reap.all() and (ring.ret == BLOCK).all()
    assert t["ring_reaped"] == 40, t


@pytest.mark.bpf
def test_a_broken_chain_is_counted_not_silent(tmp_path):
    """The probe's loops run as a chain of tail calls (probes/libaio.bpf.c aio_chain).  With the
    chain's submit slot emptied, an io_submit's iocbs are not read: counted (``chain_broken``),
    their completion an unknown event, and the source's notes say so."""
    from engramprof.bpf import libaio
    from engramprof.record.sources.libaio import LibaioSource

    path = tmp_path / "data.bin"
    path.write_bytes(os.urandom(4 * BLOCK))
    buf = mmap.mmap(-1, 4 * BLOCK)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    probe = libaio.LibaioProbe.load(libaio.LibaioProbeConfig(tgid=os.getpid()), arm=False)
    try:
        del probe.bpf["aio_chain"][ctypes.c_int(libaio.CHAIN.index("aio_submit_chunk"))]
        probe.arm()
        fd = os.open(path, os.O_RDONLY)
        ctx = aio.AioContext(8)
        cbs = [_iocb(fd, addr, 0, data=7)]
        assert _submit(ctx, cbs) == 1 and len(_reap(ctx, 1)) == 1
        ctx.close()
        os.close(fd)
        recs = probe.drain()
        t = probe.summary_totals()
    finally:
        probe.close()
    assert len(recs) == 0 and t["submitted"] == 0 and t["unknown_events"] == 1, t
    assert t["chain_broken"] == 1, t
    s = {k: 0 for k in ("submitted", "other_iocbs", "not_regular", "submit_failed", "destroyed_inflight",
                        "replaced", "truncated")}
    s["chain_broken"] = t["chain_broken"]
    assert any("stopped early" in n for n in LibaioSource.notes(None, s))


def _summary(**kw) -> dict:
    s = {k: 0 for k in ("submitted", "other_iocbs", "not_regular", "submit_failed", "destroyed_inflight", "replaced",
                        "truncated")}
    s.update(kw)
    return s


def test_a_context_with_no_file_read_gets_one_line():
    from engramprof.record.sources.libaio import LibaioSource

    notes = LibaioSource.notes(None, _summary(other_iocbs=5))
    assert notes == ["libaio: 5 iocbs of other types (writes, fsync, poll) and no read iocb: no libaio read events"]
    notes = LibaioSource.notes(None, _summary(submitted=3, not_regular=2, destroyed_inflight=1))
    assert len(notes) == 2 and "not regular files" in notes[0] and "io_destroy" in notes[1]
    assert LibaioSource.notes(None, _summary(submitted=10)) == []


class _Key:
    def __init__(self, tgid: int, ctx: int):
        self.tgid, self.ctx = tgid, ctx


def test_reads_of_an_exited_process_are_swept_and_counted(tmp_path):
    """A process that exits with reads in flight destroys its contexts without io_destroy: drain's
    periodic sweep removes its entries (and ring heads) and counts them; a live process keeps its."""
    from engramprof.bpf.libaio import LibaioProbe

    (tmp_path / "100").mkdir()  # a live tgid under a fake /proc
    live, dead = _Key(100, 1), _Key(200, 1)
    maps = {"aio_inflight": {live: 1, _Key(100, 2): 1, dead: 1, _Key(200, 3): 1},
            "aio_ring_seen": {_Key(100, 1): 0, _Key(200, 1): 0}}
    probe = object.__new__(LibaioProbe)
    probe.bpf, probe.exited_inflight, probe._exits_checked = maps, 0, 0.0
    assert probe.sweep_exited(str(tmp_path)) == 2
    assert probe.exited_inflight == 2
    assert {k.tgid for k in maps["aio_inflight"]} == {100} and {k.tgid for k in maps["aio_ring_seen"]} == {100}
