"""Traced files' identity (issue 11, item 7): recorded without disturbing the page cache,
checked by replay and residency --rows."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from engramprof import trace
from engramprof.host import residency
from engramprof.target import identity
from tests.tracing import PY, Proc, engramprof


def _make_table(path: Path, *args: str) -> Path:
    subprocess.run(engramprof("lab", "make-table", path, "--rows", "4096", "--force", *args), check=True, capture_output=True)
    return path


def _bundle(tmp: Path, table: Path, with_files: bool = True) -> Path:
    """A small bundle of reads of ``table`` (rows of its first tensor), as the recorder writes it."""
    from engramprof.tables import safetensors as layout

    lay = layout.load(str(table))
    t = lay.tensors[0]
    n = 64
    offs = t.start + np.arange(n, dtype=np.int64) * t.row_bytes
    df = pd.DataFrame({"ts_ns": 10**9 + np.arange(n) * 10**5, "dur_ns": 2000, "pid": 1, "tid": 1, "path": str(table),
                       "offset": offs, "size": t.row_bytes, "ret": t.row_bytes, "flags": 0, "syscall": "preadv2",
                       "fd": 3, "pages_added": 0, "bio_count": 0, "bio_ns": 0, "reclaim_ns": 0, "offcpu_ns": 0,
                       "runq_ns": 0, "path_stale": False, "tensor": t.name, "row": np.arange(n)})
    out = tmp / f"t{time.monotonic_ns()}"
    w = trace.TraceWriter(out, meta={"pid": 1})
    w.append_calls(df)
    if with_files:
        w.write_table("files", identity.files_table([identity.identify(str(table))]))
    w.close()
    return out


def _run(*args) -> subprocess.CompletedProcess:
    return subprocess.run(engramprof(*args), capture_output=True, text=True)


def test_identity_has_stat_and_hashes_read_with_o_direct(tmp_path):
    table = _make_table(tmp_path / "t.safetensors")
    i = identity.identify(str(table))
    st = os.stat(table)
    assert (i.dev, i.ino, i.size, i.mtime_ns) == (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    n = int.from_bytes(table.read_bytes()[:8], "little")
    import hashlib

    data = table.read_bytes()
    assert i.header_bytes == 8 + n and i.header_sha256 == hashlib.sha256(data[:8 + n]).hexdigest()
    assert i.head_bytes == min(len(data), 1 << 20) and i.head_sha256 == hashlib.sha256(data[:1 << 20]).hexdigest()
    assert i.method in ("O_DIRECT", "resident pages")


def test_identity_does_not_bring_pages_into_the_cache(tmp_path):
    table = _make_table(tmp_path / "t.safetensors")
    fd = os.open(table, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        pages = (os.fstat(fd).st_size + residency.PAGE_SIZE - 1) // residency.PAGE_SIZE
        before = int(residency.mincore_bitmap(fd, 0, pages).sum())
        i = identity.identify(str(table))
        after = int(residency.mincore_bitmap(fd, 0, pages).sum())
    finally:
        os.close(fd)
    assert i.head_sha256 or i.method.startswith("not read")
    assert after == before, (before, after, i.method)


def _change(table: Path, change: str) -> None:
    if change == "relayout":  # another row size: header (and size) differ
        _make_table(table, "--seed", "1", "--dim", "512")
    elif change == "same-size-rebuild":
        _make_table(table, "--seed", "2")
    elif change == "rewritten-byte":  # one byte in the first MiB, same size, mtime kept
        st = os.stat(table)
        with open(table, "r+b") as f:
            f.seek(70_000)
            b = f.read(1)
            f.seek(70_000)
            f.write(bytes([b[0] ^ 0xFF]))
        os.utime(table, ns=(st.st_atime_ns, st.st_mtime_ns))
    elif change == "touched":  # same content, new mtime: not a refusal, a note
        os.utime(table, ns=(time.time_ns(), time.time_ns()))


@pytest.mark.parametrize("change,want", [("relayout", "header hash differs"), ("same-size-rebuild", "first MiB differs"),
                                         ("rewritten-byte", "first MiB differs")])
def test_a_changed_table_is_named_with_what_differs(tmp_path, change, want):
    from engramprof.errors import UserError

    table = _make_table(tmp_path / "t.safetensors", "--seed", "1")
    t = trace.load_bundle(_bundle(tmp_path, table))
    _change(table, change)
    with pytest.raises(UserError) as e:
        identity.verify(t, [str(table)])
    msg = str(e.value)
    assert e.value.code == 2 and msg.startswith("t.safetensors changed since the trace: ") and want in msg, msg
    assert ("size " in msg and " -> " in msg) == (change == "relayout"), msg
    notes = identity.verify(t, [str(table)], allow_changed=True)
    assert any(want in n and "--allow-changed" in n for n in notes), notes


@pytest.mark.parametrize("change", ["unchanged", "touched", "old-bundle"])
def test_an_unchanged_table_passes_with_the_right_note(tmp_path, change):
    table = _make_table(tmp_path / "t.safetensors", "--seed", "1")
    t = trace.load_bundle(_bundle(tmp_path, table, with_files=change != "old-bundle"))
    _change(table, change)
    notes = identity.verify(t, [str(table)])
    if change == "old-bundle":
        assert any("file identity cannot be checked" in n for n in notes), notes
    elif change == "touched":
        assert any("modified since (mtime), same size and hashes" in n for n in notes), notes
    else:
        assert notes == []


def test_replay_and_residency_rows_refuse_a_relaid_table_in_one_line(tmp_path):
    table = _make_table(tmp_path / "t.safetensors", "--seed", "1")
    tr = _bundle(tmp_path, table)
    _change(table, "relayout")
    replay = ("replay", tr, "--batches", "1", "--rounds", "1", "--strategies", "serial", "--json")
    resid = ("residency", "--rows", tr, "--json")
    for args in (replay, resid):
        r = _run(*args)
        assert r.returncode == 2 and "Traceback" not in r.stderr, (args, r.stderr)
        msg = r.stderr.strip()
        assert len(msg.splitlines()) == 1, msg
        assert msg.startswith("engramprof: t.safetensors changed since the trace: size ") and "header hash differs" in msg
    r = _run(*resid, "--allow-changed")
    assert r.returncode == 0, r.stderr
    assert any("changed since the trace" in n for n in json.loads(r.stdout)["rows"]["notes"])


TARGET = r"""
import os, signal, sys, time
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1, signal.SIGUSR2})
fd = os.open(sys.argv[1], os.O_RDONLY)
os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
off = int(sys.argv[2])
print("ready", flush=True)
signal.sigwait({signal.SIGUSR1})
buf = bytearray(4096)
for _ in range(50):
    os.preadv(fd, [buf], off)
    time.sleep(0.02)
signal.sigwait({signal.SIGUSR2})
"""


@pytest.mark.bpf
def test_recording_identifies_the_table_without_changing_its_residency(tmp_path):
    """An evicted table; the target reads one page near its end; after recording, that page
    is the only one cached (before this design the recorder's own header read cached the
    first pages), and tables/files.parquet holds the table's identity and header hash."""
    table = _make_table(tmp_path / "t.safetensors")
    size = os.path.getsize(table)
    off = (size // 4096 - 2) * 4096
    fd = os.open(table, os.O_RDONLY)
    os.fsync(fd)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    pages = (size + 4095) // 4096
    script = tmp_path / "target.py"
    script.write_text(TARGET)
    target = subprocess.Popen([PY, str(script), str(table), str(off)], stdout=subprocess.PIPE, text=True)
    try:
        assert target.stdout.readline().strip() == "ready"
        assert int(residency.mincore_bitmap(fd, 0, pages).sum()) == 0
        out = tmp_path / "tr"
        tracer = Proc(engramprof("syscalls", "--pid", target.pid, "--output", out, "--duration", "3", "--sample-hz", "0"))
        tracer.wait_line("Tracing")
        os.kill(target.pid, signal.SIGUSR1)
        rc, _, err = tracer.finish(timeout=60)
        assert rc == 0, err
        bits = residency.mincore_bitmap(fd, 0, pages)
    finally:
        target.kill()
        target.wait()
        os.close(fd)
    assert np.flatnonzero(bits).tolist() == [off // 4096], np.flatnonzero(bits)[:20]
    t = trace.load_bundle(out)
    calls = t.calls[t.calls["path"] == os.path.realpath(table)]
    assert len(calls) == 50 and (calls["offset"] == off).all()
    assert (calls["tensor"] != "").all()  # the tensor enricher got the header from the identity stage
    files = t.table("files")
    assert files is not None
    rec = files[files["path"] == os.path.realpath(table)].iloc[0]
    now = identity.identify(os.path.realpath(table))
    assert (rec["dev"], rec["ino"], rec["size"], rec["mtime_ns"]) == (now.dev, now.ino, now.size, now.mtime_ns)
    assert rec["header_sha256"] == now.header_sha256 and rec["head_sha256"] == now.head_sha256
    assert rec["method"] == "O_DIRECT"


def test_open_regular_files_names_the_open_file_not_what_its_path_names_now(tmp_path):
    """/proc/PID/fd gives the identity of the file that is open: a file renamed over its path
    later must not take its place, and pipes are not files."""
    from engramprof.host.files import kernel_dev, open_regular_files
    first, second = tmp_path / "table.bin", tmp_path / "other.bin"
    first.write_bytes(b"a" * 4096)
    second.write_bytes(b"b" * 4096)
    fd = os.open(first, os.O_RDONLY)
    r, w = os.pipe()
    try:
        st_first = os.fstat(fd)
        os.rename(second, first)  # the path now names another inode
        files = open_regular_files(os.getpid())
        key = (kernel_dev(st_first.st_dev), st_first.st_ino)
        assert files.get(key) == str(first)  # the kernel says "(deleted)": dropped
        assert (kernel_dev(st_first.st_dev), os.stat(first).st_ino) not in files
        assert not any(p.startswith("pipe:") for p in files.values())
    finally:
        for f in (fd, r, w):
            os.close(f)
    assert open_regular_files(2 ** 22 + 12345) == {}
