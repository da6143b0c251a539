"""The recorder's pipeline without a probe: decoder -> enrichers -> table, on synthetic records."""
from __future__ import annotations

import errno
import os
import time

import numpy as np
import pyarrow as pa

from engramprof import trace
from engramprof.bpf import structs as layout
from engramprof.host.files import kernel_dev
from engramprof.record.columns import EventTableBuilder
from engramprof.record.decode import CallDecoder, VmEventDecoder, syscall_names
from engramprof.record.enrich import TensorEnricher
from engramprof.record.live import LiveAccount, LiveState
from engramprof.record.sources.filepaths import FilePathEnricher
from engramprof.record.strings import Interner


def _records(n: int, fd: int, t0: int) -> np.ndarray:
    recs = np.zeros(n, dtype=layout.struct_dtype("call_record"))
    st = os.fstat(fd)
    recs["dev"], recs["ino"] = kernel_dev(st.st_dev), st.st_ino  # the file, as the probe takes it
    recs["direct"] = np.arange(n) % 2
    recs["ts_ns"] = t0 + np.arange(n) * 1000
    recs["dur_ns"] = 1000 + np.arange(n)
    recs["fd"] = fd
    recs["offset"] = np.arange(n) * 4096
    recs["size"] = 4096
    recs["ret"] = 4096
    recs["ret"][0] = -errno.EAGAIN
    recs["flags"][0] = os.RWF_NOWAIT
    recs["syscall"] = np.arange(n) % 3
    recs["pages_added"] = np.arange(n) % 2
    return recs


def test_syscall_names_come_from_the_header():
    assert syscall_names() == ["preadv2", "preadv", "pread64", "fault", "read", "readv"]  # fault: the page-fault events


def test_calls_flow_through_to_an_event_table(tmp_path):
    data = tmp_path / "data.bin"
    data.write_bytes(b"x" * 8192)
    fd = os.open(data, os.O_RDONLY)
    try:
        t0 = time.monotonic_ns()
        paths, tensors = Interner(""), Interner("")
        dec = CallDecoder(layout.struct_dtype("call_record"), armed_ns=t0 + 1500)
        enrichers = [FilePathEnricher(os.getpid(), paths), TensorEnricher(paths, tensors)]
        builder = EventTableBuilder(dec.syscall_dictionary, paths, tensors, missing=["runq_ns"])
        state = LiveState()
        account = LiveAccount(state, paths, tensors)
        batch = dec.decode(_records(6, fd, t0))
        assert dec.partial_at_start == 2 and len(batch) == 4  # entered before the probe was armed
        for e in enrichers:
            e.enrich(batch)
        account.add(batch)
        table = builder.build(batch)
    finally:
        os.close(fd)
    assert table.schema.names == trace.EVENT_SCHEMA.names
    assert table.cast(trace.WRITE_SCHEMA).num_rows == 4
    d = table.to_pydict()
    assert d["path"] == [str(data)] * 4 and d["kind"] == ["syscall"] * 4
    assert d["syscall"] == ["pread64", "preadv2", "preadv", "pread64"]
    assert d["tensor"] == [""] * 4 and d["row"] == [-1] * 4 and d["runq_ns"] == [None] * 4
    assert d["offset"] == [8192, 12288, 16384, 20480]
    st = data.stat()  # the kernel's identity, written in st_dev form; O_DIRECT as the record says
    assert d["dev"] == [st.st_dev] * 4 and d["ino"] == [st.st_ino] * 4 and d["direct"] == [False, True] * 2
    assert state.recorded == 4 and state.files[str(data)].calls == 4 and state.calls_with_misses == 2
    assert state.slowest["dur_ns"].max() == 1005


def test_vm_events_decode_to_kswapd_rows():
    ev = np.zeros(3, dtype=layout.struct_dtype("vm_event"))
    ev["ts_ns"] = [1, 2, 3]
    ev["kind"] = [layout.header_define("VM_KSWAPD_WAKE"), layout.header_define("VM_KSWAPD_SLEEP"),
                  layout.header_define("VM_KSWAPD_WAKE")]
    dec = VmEventDecoder()
    t = dec.decode(ev)
    assert t.schema == trace.sample_schema("kswapd_events")
    assert t["event"].to_pylist() == ["wake", "sleep", "wake"] and dec.events == 3
    assert dec.decode(ev[:0]) is None


def test_interner_dictionary_grows():
    i = Interner("")
    assert i.code("a") == 1 and i.code("a") == 1
    d1 = i.dictionary()
    assert d1 is i.dictionary()  # cached
    i.code("b")
    assert i.dictionary().to_pylist() == ["", "a", "b"] and isinstance(d1, pa.Array)


def test_a_file_never_seen_open_is_left_unnamed_and_counted(tmp_path):
    """A read of a file the process no longer has open (opened, read, closed between two scans):
    the kernel's identity stays, the path is "" (never another file's that held the fd), and the
    source counts it."""
    from engramprof.record.sources.syscalls import unnamed_count

    gone, kept = tmp_path / "gone.bin", tmp_path / "kept.bin"
    gone.write_bytes(b"x" * 8192)
    kept.write_bytes(b"y" * 8192)
    fd = os.open(gone, os.O_RDONLY)
    recs = _records(4, fd, time.monotonic_ns())
    os.close(fd)
    fd2 = os.open(kept, os.O_RDONLY)  # the same fd number, another file: open at the scan
    try:
        assert fd2 == fd
        recs2 = _records(2, fd2, time.monotonic_ns())
        paths = Interner("")
        dec = CallDecoder(layout.struct_dtype("call_record"), armed_ns=0)
        batch = dec.decode(np.concatenate([recs, recs2]))
        FilePathEnricher(os.getpid(), paths).enrich(batch)
    finally:
        os.close(fd2)
    names = [paths.values[c] for c in batch.cols["path"]]
    assert names == [""] * 4 + [str(kept)] * 2
    assert unnamed_count(batch, paths.code("")) == 4
