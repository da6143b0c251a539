"""MappingPathEnricher (engramprof/record/faults.py): device + inode -> path from /proc/PID/maps,
and how often it reads the maps.  No BPF: drains are built from records shaped like the fault
decoder's (FaultColumns), the maps reader is counted by wrapping the real one."""
from __future__ import annotations

import mmap
import os

import numpy as np
import pytest

from engramprof.record.sources import faults as rf
from engramprof.record.decode import ReadBatch
from engramprof.record.strings import Interner

PAGE = rf.PAGE


def _drain(dev: int, ino: int, n: int = 64) -> ReadBatch:
    """n faults of one file identity, without a faulting address (no exact-page pass)."""
    cols = {"dev": np.full(n, dev, dtype=np.uint64), "ino": np.full(n, ino, dtype=np.uint64),
            "address": np.zeros(n, dtype=np.uint64), "fault_flags": np.zeros(n, dtype=np.int64),
            "index": np.arange(n, dtype=np.int64), "offset": np.arange(n, dtype=np.int64) * PAGE,
            "pid": np.full(n, os.getpid(), dtype=np.int32)}
    return ReadBatch("fault", rf.FaultColumns(cols))


def _identity(path) -> tuple[int, int]:
    st = os.stat(path)
    return rf.dev_t(os.major(st.st_dev), os.minor(st.st_dev)), st.st_ino


@pytest.fixture
def maps_reads(monkeypatch):
    """The enricher's reads of /proc/PID/maps, counted (the real reader does the reading)."""
    calls = []
    real = rf.read_maps

    def counted(pid):
        calls.append(pid)
        return real(pid)

    monkeypatch.setattr(rf, "read_maps", counted)
    return calls


@pytest.fixture
def clock(monkeypatch):
    """The enricher's monotonic clock, moved by the test."""
    now = [10**12]
    monkeypatch.setattr(rf.time, "monotonic_ns", lambda: now[0])
    return now


def test_an_unnameable_identity_does_not_reread_the_maps_every_drain(maps_reads, clock):
    en = rf.MappingPathEnricher(os.getpid(), Interner(""))
    assert len(maps_reads) == 1  # at start
    ghost = (1, 2**40 + 12345)  # no mapping of this process has it
    for _ in range(200):
        b = _drain(*ghost)
        en.enrich(b)
        assert (b.cols["path"] == en.paths.code("")).all() and not b.cols["path_stale"].any()
        clock[0] += 50_000_000  # drains 50 ms apart: 10 s in all
    # looked up once when first seen, then once per unnamed_ttl_ns (2 s): 1 + 1 + 10 / 2
    assert len(maps_reads) <= 1 + 1 + 10 * 10**9 // en.unnamed_ttl_ns, len(maps_reads)
    assert en.rereads == len(maps_reads) - 1


def test_a_file_mapped_later_is_named_at_its_first_drain_despite_the_negative_cache(tmp_path, maps_reads, clock):
    """The negative cache holds what the maps did not name; a new identity still reads them at
    once, and a changed set of mappings forgets what was looked up."""
    en = rf.MappingPathEnricher(os.getpid(), Interner(""))
    ghost = (1, 2**40 + 54321)
    en.enrich(_drain(*ghost))
    en.enrich(_drain(*ghost))
    assert len(maps_reads) == 2
    p = tmp_path / "late.bin"
    p.write_bytes(b"x" * PAGE * 4)
    with open(p, "rb") as fh:
        m = mmap.mmap(fh.fileno(), 0, prot=mmap.PROT_READ)
    try:
        b = _drain(*_identity(p))
        en.enrich(b)
        assert len(maps_reads) == 3
        assert (b.cols["path"] == en.paths.code(str(p))).all()
        assert ghost not in en._unnamed  # the maps changed: what was looked up is looked up again
        en.enrich(_drain(*ghost))
        assert len(maps_reads) == 4
        for _ in range(20):
            en.enrich(_drain(*ghost))
            en.enrich(_drain(*_identity(p)))
        assert len(maps_reads) == 4
    finally:
        m.close()
