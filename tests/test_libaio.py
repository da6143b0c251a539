"""Linux AIO (libaio) reads as read events (probes/libaio.bpf.c, engramprof/bpf/libaio.py): real
eBPF, checked against fio's libaio engine (Debian's package; run by tests/fioref.py), a client
nobody here wrote, and against the kernel's own answers (io_submit's return, the pipe's type).

Latency: the probe times an iocb from the entry of its io_submit to the exit of the io_getevents
that returned its io_event (the reap): there is no aio tracepoint, and the completion reaches the
process only then.  fio's ``clat`` (io_submit returned -> reaped) starts after the submit
syscall, which for a buffered read does the whole read; fio's ``lat`` (slat + clat) starts before
io_submit and ends after the reap, so each probe interval lies inside fio's: the tests assert the
probe's p50 and p99 within 15% below fio's lat percentiles and never above them by more than
fio's histogram bin error (docs/model.md, "libaio: timing").  The device's part of each read is
its bios (queued by the submitter inside io_submit, timed queue -> complete): inside the interval.
"""
from __future__ import annotations

import ctypes
import mmap
import os

import numpy as np
import pytest

from tests import fioref
from tests.fioref import FILE_MB

pytestmark = pytest.mark.bpf


@pytest.fixture(scope="module")
def data_file():
    return fioref.data_file()


def run_fio(data_file: str, *opts: str):
    from engramprof.bpf import libaio

    stats, recs, totals, pid, _ = fioref.run_fio(
        lambda pid: libaio.LibaioProbe.load(libaio.LibaioProbeConfig(tgid=pid)), data_file, "libaio", *opts)
    return stats, libaio.to_frame(recs), totals, pid


def _check_counts_and_files(stats, ev, totals, pid, data_file):
    assert totals["lost_records"] == 0 and totals["no_state"] == 0, totals
    n = len(ev)
    assert abs(n - stats["total_ios"]) <= 0.005 * stats["total_ios"], (n, stats["total_ios"])
    assert totals["reaped"] == n and totals["submit_failed"] == 0 and totals["other_iocbs"] == 0, totals
    assert (ev.pid == pid).all() and (ev.syscall == "io_submit").all() and (ev.kind == "libaio").all()
    dev, ino = fioref.identity(data_file)
    assert ((ev.dev == dev) & (ev.ino == ino)).all()
    assert (ev["size"] == 4096).all() and (ev["ret"] == 4096).all() and (ev.opcode == "pread").all()
    assert (ev["offset"] % 4096 == 0).all() and (ev["offset"] < FILE_MB << 20).all()
    assert (ev.reap_tid == ev.tid).all() and not ev.other_thread.any()


@pytest.mark.parametrize("direct", [1, 0])
def test_reads_match_fio(data_file, direct):
    stats, ev, totals, pid = run_fio(data_file, f"--direct={direct}")
    _check_counts_and_files(stats, ev, totals, pid, data_file)
    fioref.check_latency(stats, ev.dur_ns)
    assert (ev.direct == bool(direct)).all()
    assert not ev.ring_reap.any()
    # the device's part: bios the submitter queued inside io_submit, queue -> complete, inside the interval
    # (a bio whose slot of the in-flight bio table another held is counted, not timed: probes/bios.h)
    assert (ev.bio_ns <= ev.dur_ns).all() and totals["bios_untracked"] <= 0.01 * len(ev), totals
    # a bio merged into a request that begins with another (the disk is shared) is counted, not timed
    counted = ev[ev.bio_count > 0]
    assert not (ev.bio_ns[ev.bio_count == 0] > 0).any() and (counted.bio_ns > 0).mean() >= 0.99
    if direct:  # one 4 KiB O_DIRECT read, one bio
        assert (ev.bio_count == 1).all(), ev.bio_count.value_counts()
    else:  # fio drops the file's cache first (invalidate=1): cold buffered reads queue readahead bios
        assert len(counted) > 0.5 * len(ev), ev.bio_count.value_counts()
    # fio closes its context with io_destroy when the job ends: nothing was in flight then
    assert totals["destroyed"] >= 1 and totals["destroyed_inflight"] == 0 and totals["inflight"] == 0, totals


def test_userspace_reap_is_seen_from_the_ring(data_file):
    """fio's userspace_reap (with iodepth_batch_complete_min=0) consumes io_events from the context's
    ring in user space, with no io_getevents: the probe finds them in the ring's slots at fio's next
    AIO syscall (its next io_submit, or io_destroy at the end).  The interval then ends after fio's
    reap: at least fio's lat less fio's own time before io_submit (the lower bound asserted)."""
    stats, ev, totals, pid = run_fio(data_file, "--direct=1", "--userspace_reap=1", "--iodepth_batch_complete_min=0")
    _check_counts_and_files(stats, ev, totals, pid, data_file)
    assert ev.ring_reap.mean() > 0.99, ev.ring_reap.value_counts()
    assert totals["ring_reaped"] == ev.ring_reap.sum() and totals["replaced"] == 0, totals
    p50 = float(np.percentile(ev.dur_ns, 50))
    assert p50 >= 0.85 * float(stats["lat_ns"]["percentile"]["50.000000"])
