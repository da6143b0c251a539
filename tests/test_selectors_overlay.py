"""`--file` on overlayfs, where a container's files live (issue 13; real eBPF, root).

On an overlay the inode a process's fd points to is the overlay's, while the page cache (and so
filemap:mm_filemap_fault, and a mapping's faults) belongs to the real file of the upper or lower
layer.  Each test mounts an overlay in its own private temp dir, traces ``syscalls --file
MERGED/table`` while a preadv2 reader and a numpy.memmap (MADV_RANDOM) reader open the merged
path, the table evicted first (fsync + POSIX_FADV_DONTNEED on the real file: never drop_caches,
which would disturb the other tests), and checks each reader is seen whole (its preadv2 count,
its major faults page for page) and its reads of another file of the same overlay not at all.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from engramprof.host import residency
from engramprof import trace as tracefmt
from engramprof.host.files import file_identities, kernel_dev, real_file
from engramprof.target.selection import Selection
from tests.tracing import PY, Proc, engramprof

PAGE = os.sysconf("SC_PAGE_SIZE")
TABLE_MIB, PREADS, TOUCHES = 8, 300, 24

# the reader: pread or mmap of TABLE and OTHER (merged paths), after SIGUSR1; prints what it did
READER = r"""
import json, mmap, os, resource, signal, sys
import numpy as np
mode, table, other, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
PAGE = mmap.PAGESIZE
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
print("ovl: ready", file=sys.stderr, flush=True)
signal.sigwait({signal.SIGUSR1})
out = {"pid": os.getpid(), "mode": mode}
if mode == "pread":
    fa, fb = os.open(table, os.O_RDONLY), os.open(other, os.O_RDONLY)
    os.posix_fadvise(fa, 0, 0, os.POSIX_FADV_RANDOM)
    pages, buf = os.fstat(fa).st_size // PAGE, bytearray(PAGE)
    for i in range(n):  # never a page the mmap reader touches (every 64th)
        os.preadv(fa, [buf], ((i * 7919 % (pages // 64)) * 64 + 1 + i % 63) * PAGE)
        if i % 2 == 0:
            os.preadv(fb, [buf], (i * 31 % 64) * PAGE)
    out["preads"] = n
else:  # one byte of every 64th page: no fault-around window (16 pages) holds two of them
    ta, tb = np.memmap(table, dtype=np.uint8, mode="r"), np.memmap(other, dtype=np.uint8, mode="r")
    for m in (ta, tb):
        m._mmap.madvise(mmap.MADV_RANDOM)
    touched = [i * 64 for i in range(n)]
    s, r0 = 0, resource.getrusage(resource.RUSAGE_SELF).ru_majflt
    for p in touched:
        s += int(ta[p * PAGE])
    out["majflt"] = resource.getrusage(resource.RUSAGE_SELF).ru_majflt - r0
    for p in range(1, tb.size // PAGE, 64):  # the other file: pages 1, 65, ... (told apart by index)
        s += int(tb[p * PAGE])
    out["pages"] = touched
print(json.dumps(out), flush=True)
signal.sigwait({signal.SIGUSR1})  # alive until the trace is closed
"""


class Overlay:
    """lower/, upper/, work/, merged/ in a private temp dir (pytest's tmp_path is mode 0700);
    umount() is safe to call twice."""

    def __init__(self, root: Path, upper_tmpfs: bool = False):
        self.root = root
        self.lower, self.upper_fs, self.merged = root / "lower", root / "upperfs", root / "merged"
        self.mounted: list[Path] = []
        root.mkdir(mode=0o700)
        for d in (self.lower, self.upper_fs, self.merged):
            d.mkdir()
        if upper_tmpfs:  # the upper layer on another filesystem: overlay's st_dev is then a pseudo device
            self._mount(["mount", "-t", "tmpfs", "-o", "size=64m,mode=0700", "engramprof-ovl", str(self.upper_fs)],
                        self.upper_fs)
        self.upper, self.work = self.upper_fs / "upper", self.upper_fs / "work"
        self.upper.mkdir()
        self.work.mkdir()
        for name, size in (("table", TABLE_MIB << 20), ("other", 1 << 20)):
            with open(self.lower / name, "wb") as f:
                f.write(os.urandom(size))
        opts = f"lowerdir={self.lower},upperdir={self.upper},workdir={self.work}"
        self._mount(["mount", "-t", "overlay", "engramprof-ovl", "-o", opts, str(self.merged)], self.merged)

    def _mount(self, argv: list[str], at: Path) -> None:
        r = subprocess.run(argv, capture_output=True, text=True)
        if r.returncode != 0:
            self.umount()
            pytest.skip(f"cannot mount here ({' '.join(argv[:3])}): {r.stderr.strip()}")
        self.mounted.append(at)

    def umount(self) -> None:
        while self.mounted:
            subprocess.run(["umount", "-l", str(self.mounted.pop())], capture_output=True)

    def real(self, name: str) -> Path:
        """The file that owns the page cache of merged/name: the upper copy once copied up."""
        up = self.upper / name
        return up if up.exists() else self.lower / name


@pytest.fixture(params=["lower", "copied-up", "upper-on-tmpfs"])
def overlay(request, tmp_path):
    ovl = Overlay(tmp_path / "ovl", upper_tmpfs=request.param == "upper-on-tmpfs")
    try:
        if request.param == "copied-up":  # opened for write once: the whole file is copied up
            os.close(os.open(ovl.merged / "table", os.O_WRONLY))
            assert (ovl.upper / "table").is_file()
        yield request.param, ovl
    finally:
        ovl.umount()


def evict(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def reader(mode: str, ovl: Overlay, n: int) -> Proc:
    p = Proc([PY, "-c", READER, mode, str(ovl.merged / "table"), str(ovl.merged / "other"), str(n)])
    p.wait_line("ovl: ready", timeout=240)
    return p


def _ident(path: Path) -> tuple[int, int]:
    st = os.stat(path)
    return kernel_dev(st.st_dev), st.st_ino


def test_identities_of_a_merged_file_name_the_real_file_and_the_overlay_inode(overlay):
    """Without BPF: what --file MERGED/table resolves to (no page of the file is read)."""
    kind, ovl = overlay
    table = ovl.merged / "table"
    ids = {(i.dev, i.ino): i.source for i in file_identities(str(table))}
    assert _ident(table) in ids  # stat's
    assert _ident(ovl.real("table")) in ids and ids[_ident(ovl.real("table"))].startswith("overlay ")
    if kind == "copied-up":
        assert ids[_ident(ovl.real("table"))] == "overlay upper"
    else:
        assert ids[_ident(ovl.real("table"))] == "overlay lower 1"
    assert _ident(ovl.lower / "other") not in ids and _ident(ovl.merged / "other") not in ids
    sel = Selection.parse(files=[str(table)])
    assert set(ids) == sel.file_keys()
    assert {(m["dev"], m["ino"]) for m in sel.meta()["files"][0]["identities"]} == set(ids)
    assert real_file(str(table)) == str(ovl.real("table")) and real_file(str(ovl.lower / "other")) is None


def test_a_copy_up_after_start_is_a_new_identity(overlay):
    kind, ovl = overlay
    table = ovl.merged / "table"
    sel = Selection.parse(files=[str(table)])
    before = sel.file_keys()
    assert sel.copied_up_keys() == set()
    os.close(os.open(table, os.O_WRONLY))  # a no-op if already copied up
    new = sel.copied_up_keys()
    if kind == "copied-up":
        assert new == set()
    else:
        assert new == {_ident(ovl.upper / "table")} and not new & before
        assert sel.copied_up_keys() == set()  # once
        assert sel.file_keys() == before | new and real_file(str(table)) == str(ovl.upper / "table")


def test_real_file_is_what_cachestat_must_be_asked(overlay, monkeypatch):
    """cachestat(2) of an fd of the merged path counts the overlay inode's own mapping (empty on 6.18);
    the real file's count is the pages a mapping of the merged path finds resident (mincore)."""
    _kind, ovl = overlay
    table = ovl.merged / "table"
    evict(ovl.real("table"))
    fd = os.open(table, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        for i in range(0, 64, 2):  # 32 pages cached, through the merged path
            os.pread(fd, PAGE, i * PAGE)
        resident = int(residency.mincore_bitmap(fd, 0, (TABLE_MIB << 20) // PAGE).sum())
    finally:
        os.close(fd)
    assert 32 <= resident < 64 + 32  # the 32, and at most a readahead window around them
    rfd = os.open(real_file(str(table)), os.O_RDONLY)
    try:
        assert residency.cachestat(rfd).nr_cache == resident
    finally:
        os.close(rfd)
    # `engramprof residency MERGED/table` asks the layer file: both methods agree with mincore
    for method in ("cachestat", "mincore"):
        got = residency.file_residency(table, method=method).residency
        assert (got.resident, got.method) == (resident, method), got
    # the layer file not found: the overlay fd is kept and auto answers with mincore, not 0
    import engramprof.host.files as host_files
    monkeypatch.setattr(host_files, "real_file", lambda path: None)
    got = residency.file_residency(table).residency
    assert (got.resident, got.method) == (resident, "mincore"), got


@pytest.mark.bpf
@pytest.mark.slow
def test_file_on_overlay_sees_pread_and_mmap_readers_of_the_merged_path(tmp_path, overlay):
    kind, ovl = overlay
    table = ovl.merged / "table"
    readers = [reader("pread", ovl, PREADS), reader("mmap", ovl, TOUCHES)]
    tracer = None
    try:
        out = tmp_path / "trace"
        tracer = Proc(engramprof("syscalls", "--file", table, "--output", out, "--json", "--sample-hz", "0",
                                 "--no-offcpu", "--duration", "120"))
        tracer.wait_line("Tracing", timeout=240)
        for name in ("table", "other"):
            evict(ovl.real(name))
        for r in readers:
            os.kill(r.pid, signal.SIGUSR1)
        did = {d["mode"]: d for d in (json.loads(r.p.stdout.readline()) for r in readers)}
        tracer.p.send_signal(signal.SIGINT)  # --file selects whoever comes: it runs until told
        rc, summary, err = tracer.finish()
        assert rc == 0, err
        for r in readers:
            os.kill(r.pid, signal.SIGUSR1)
            assert r.finish()[0] == 0
    finally:
        for p in readers + ([tracer] if tracer else []):
            if p.p.poll() is None:
                p.p.kill()
                p.p.wait()
    ev = tracefmt.load(out)
    sc = ev[ev["kind"] == "syscall"]
    # The recorder's own reads of the table's start are reads of the table too, and --file alone
    # matches any process: when they fall inside the window they are recorded under the tracer's
    # pid (record/identity.py's O_DIRECT first MiB; once fault paths are named, layout.load's
    # 8-byte header length too).  Nothing else of the tracer may be.
    own = sc[sc["pid"] == tracer.pid]
    assert len(own) <= 2 and (own["offset"] == 0).all() and own["size"].isin([8, 1 << 20]).all(), own
    sc = sc[sc["pid"] != tracer.pid]
    # (a) every preadv2 of the table by the pread reader, none of the other file
    assert {int(k): int(v) for k, v in sc["pid"].value_counts().items()} == {did["pread"]["pid"]: PREADS}
    assert set(sc["path"]) == {str(table)}, set(sc["path"])
    # (b) the mmap reader's faults: the pages it touched, each once (major as its own count
    # says), none of the other file (its pages are 1, 65, ...)
    f = ev[ev["kind"] == "fault"]
    assert set(f["pid"]) == {did["mmap"]["pid"]}, f["pid"].value_counts()
    assert sorted((f["offset"] // PAGE).tolist()) == did["mmap"]["pages"], (kind, f["offset"].tolist())
    assert int(f["major"].sum()) == did["mmap"]["majflt"] > 0
    # named by the merged path the reader mapped (the fault carries the layer file's inode)
    assert set(f["path"]) == {str(table)}, set(f["path"])
    # what the trace says it matched: the real file among the identities, and a note
    meta = json.loads((out / "meta.json").read_text())
    matched = {(m["dev"], m["ino"]) for m in meta["files"][0]["identities"]}
    assert _ident(ovl.real("table")) in matched, meta["files"]
    notes = json.loads(summary)["notes"]
    assert any("1 on overlayfs, matched by its real file too" in n for n in notes), notes


@pytest.mark.bpf
def test_a_copy_up_during_the_trace_is_matched_from_then_on(tmp_path):
    """MERGED/table read from the lower layer at the start, copied up while `syscalls --file
    MERGED/table` runs: its pages now belong to the upper copy, a new inode, which the recorder
    adds to every probe's target_files within about a second (Selection.copied_up_keys,
    TargetMaps.sync).  An mmap reader of the merged path after the copy-up: its faults (they carry
    the upper inode) are recorded page for page."""
    import time

    ovl = Overlay(tmp_path / "ovl")
    table = ovl.merged / "table"
    r = tracer = None
    try:
        r = reader("mmap", ovl, TOUCHES)
        out = tmp_path / "trace"
        tracer = Proc(engramprof("syscalls", "--file", table, "--output", out, "--json", "--sample-hz", "0",
                                 "--no-offcpu", "--duration", "120"))
        tracer.wait_line("Tracing", timeout=240)
        assert not (ovl.upper / "table").exists()
        os.close(os.open(table, os.O_WRONLY))  # the copy-up
        assert (ovl.upper / "table").is_file()
        evict(ovl.upper / "table")
        time.sleep(2.5)  # the recorder's refresh (about once a second)
        os.kill(r.pid, signal.SIGUSR1)
        did = json.loads(r.p.stdout.readline())
        time.sleep(1.5)  # drained
        tracer.p.send_signal(signal.SIGINT)
        rc, _, err = tracer.finish()
        assert rc == 0, err
        os.kill(r.pid, signal.SIGUSR1)
        assert r.finish()[0] == 0
    finally:
        for p in (r, tracer):
            if p is not None and p.p.poll() is None:
                p.p.kill()
                p.p.wait()
        ovl.umount()
    ev = tracefmt.load(out)
    f = ev[ev["kind"] == "fault"]
    assert set(f["pid"]) == {did["pid"]}, f["pid"].value_counts()
    assert sorted((f["offset"] // PAGE).tolist()) == did["pages"], f["offset"].tolist()
    assert int(f["major"].sum()) == did["majflt"] > 0
    meta = json.loads((out / "meta.json").read_text())
    assert _ident(ovl.lower / "table") in {(m["dev"], m["ino"]) for m in meta["files"][0]["identities"]}
