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
    assert t["destroyed"] == 3 and t["destroyed_inflight"] == 16 and t["inflight"] == 0, t
    # every read iocb is accounted for: an event, failed at submit, or in flight at io_destroy
    assert t["submitted"] == len(ev) + t["submit_failed"] + t["destroyed_inflight"], (t, len(ev))
    assert t["unknown_events"] == 3  # the pipe's and the two fsyncs' events: reaped, never tracked
    assert t["lost_records"] == 0 and t["replaced"] == 0


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
