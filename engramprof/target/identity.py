"""Which file a trace read: identity recorded when a file is first seen, checked on replay.

For each traced file the recorder stores (``tables/files.parquet``, :data:`FILES_SCHEMA`):
device, inode, size, mtime_ns (one ``fstat``), the SHA-256 of its safetensors header (the 8
length bytes and the JSON that follows: names, dtypes, shapes, offsets) and the SHA-256 of
its first MiB (or the whole file when smaller).

Reading must not disturb what is measured: a buffered read would bring the header pages (and
a readahead window after them) into the page cache of a table whose residency is the point of
the trace.  So the bytes are read with ``O_DIRECT`` from the file the target has open
(``/proc/PID/fd/N``, reopened): straight from the device into our buffer, the page cache
neither filled nor evicted.  Where O_DIRECT is refused (tmpfs on older kernels, some network
file systems), the bytes are read the ordinary way only if mincore(2) shows every page of
the range already resident (then nothing is brought in; POSIX_FADV_RANDOM on our descriptor
keeps readahead off); otherwise that hash is left empty and ``method`` says why.  The same
header bytes feed the tensor enricher, so the recorder never reads the traced file otherwise.

:func:`verify` compares a bundle's identities with the files now: ``replay`` and
``residency --rows`` refuse a changed file (exit 2, one line saying what differs) unless
``--allow-changed``, and note that a bundle without the table (recorded before it existed)
cannot be checked.
"""
from __future__ import annotations

import errno
import hashlib
import mmap
import os
import stat as stat_mod
import time
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from engramprof.errors import UserError
from engramprof.host import residency
from engramprof.trace.schema import table_schema

HEAD_BYTES = 1 << 20
MAX_HEADER = 100 << 20  # layout.MAX_HEADER: a longer "header" is not safetensors
PAGE = os.sysconf("SC_PAGE_SIZE")

FILES_SCHEMA = table_schema("files")  # the columns: engramprof/trace/schema.py TABLE_SCHEMAS


@dataclass
class FileFingerprint:
    """A traced file as the bundle records it (its ``files`` row): where it was, its device and
    inode (user-space st_dev), size, mtime and a hash of its header and first bytes, so that a
    later analysis can tell whether the file it reads is still the file that was traced."""

    path: str
    dev: int
    ino: int
    size: int
    mtime_ns: int
    header_bytes: int = 0
    header_sha256: str = ""
    head_bytes: int = 0
    head_sha256: str = ""
    method: str = ""
    first_seen_ns: int = 0
    header: bytes | None = None  # the header JSON bytes (after the length), for the tensor enricher

    def row(self) -> tuple:
        return tuple(getattr(self, f.name) for f in FILES_SCHEMA)


def _read_direct(path: str, n: int) -> bytes:
    """The first ``n`` bytes by O_DIRECT (page cache untouched); raises OSError."""
    flags = os.O_RDONLY | os.O_CLOEXEC | os.O_DIRECT
    try:
        fd = os.open(path, flags | os.O_NOATIME)
    except PermissionError:  # O_NOATIME needs ownership or CAP_FOWNER
        fd = os.open(path, flags)
    try:
        length = max(PAGE, (n + PAGE - 1) // PAGE * PAGE)
        buf = mmap.mmap(-1, length)  # page-aligned, as O_DIRECT wants
        try:
            got = os.preadv(fd, [buf], 0)
            return bytes(buf[:min(got, n)])
        finally:
            buf.close()
    finally:
        os.close(fd)


def _read_if_resident(path: str, n: int) -> bytes | None:
    """The first ``n`` bytes by a plain read, only when every page of them is already cached."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        npages = max(1, (n + PAGE - 1) // PAGE)
        if not residency.mincore_bitmap(fd, 0, npages).all():
            return None
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        return os.pread(fd, n, 0)
    finally:
        os.close(fd)


def read_start(path: str, n: int) -> tuple[bytes | None, str]:
    """The first ``n`` bytes of ``path`` without disturbing its page cache, and how."""
    try:
        return _read_direct(path, n), "O_DIRECT"
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP):
            return None, f"not read: {exc.strerror}"
    try:
        data = _read_if_resident(path, n)
    except OSError as exc:
        return None, f"not read: {exc.strerror}"
    if data is None:
        return None, "not read: O_DIRECT unsupported and pages not cached (reading would cache them)"
    return data, "resident pages"


def identify(path: str, open_path: str | None = None, seen_ns: int | None = None) -> FileFingerprint | None:
    """The identity of ``path`` (read through ``open_path``, e.g. /proc/PID/fd/N, when given:
    the file the target has open, even if the path was replaced since); None if not a
    regular file."""
    src = open_path or path
    try:
        st = os.stat(src)
    except OSError:
        return None
    if not stat_mod.S_ISREG(st.st_mode):
        return None
    ident = FileFingerprint(path=path, dev=st.st_dev, ino=st.st_ino, size=st.st_size, mtime_ns=st.st_mtime_ns,
                         first_seen_ns=seen_ns if seen_ns is not None else time.monotonic_ns())
    head_n = min(st.st_size, HEAD_BYTES)
    data, ident.method = read_start(src, head_n) if head_n else (b"", "empty")
    if data is None:
        return ident
    ident.head_bytes = len(data)
    ident.head_sha256 = hashlib.sha256(data).hexdigest()
    if len(data) >= 8:
        hn = int.from_bytes(data[:8], "little")
        if 2 <= hn <= MAX_HEADER and 8 + hn <= st.st_size:
            raw = data[8:8 + hn] if 8 + hn <= len(data) else None
            if raw is None:  # a header longer than the first MiB
                more, _ = read_start(src, 8 + hn)
                raw = more[8:8 + hn] if more is not None and len(more) >= 8 + hn else None
            if raw is not None and raw[:1] == b"{":
                ident.header = raw
                ident.header_bytes = 8 + hn
                ident.header_sha256 = hashlib.sha256(data[:8] + raw).hexdigest()
    return ident


def files_table(idents) -> pa.Table:
    rows = [i.row() for i in idents]
    cols = list(zip(*rows)) if rows else [()] * len(FILES_SCHEMA)
    return pa.table([pa.array(list(c), type=f.type) for c, f in zip(cols, FILES_SCHEMA)], schema=FILES_SCHEMA)


class FileIdentities:
    """Recorder stage: identifies every file the target reads, once, when first seen (after
    the fd -> path enricher); :attr:`changed` says the table is to be rewritten."""

    def __init__(self, pid: int, paths, proc_root: str = "/proc"):
        self.pid = pid
        self.paths = paths  # the Interner of path codes
        self.proc_root = proc_root
        self.by_path: dict[str, FileFingerprint | None] = {}
        self.changed = False

    def enrich(self, batch) -> None:
        codes = batch.cols["path"]
        fds = batch.recs["fd"]
        uniq, first = np.unique(codes, return_index=True)
        for code, i in zip(uniq.tolist(), first.tolist()):
            path = self.paths.values[code]
            if not path or path in self.by_path:
                continue
            pid = int(batch.recs["pid"][i]) if "pid" in (batch.recs.dtype.names or ()) else self.pid
            fd_link = f"{self.proc_root}/{pid}/fd/{int(fds[i])}"
            try:
                same = os.readlink(fd_link) == path
            except OSError:
                same = False
            self.by_path[path] = identify(path, fd_link if same else None)
            self.changed = True

    def header_of(self, path: str) -> tuple[bytes, int] | None:
        """(header JSON bytes, file size) when this file was identified as safetensors."""
        i = self.by_path.get(path)
        return (i.header, i.size) if i is not None and i.header is not None else None

    def table(self) -> pa.Table:
        self.changed = False
        return files_table(i for i in self.by_path.values() if i is not None)


# --------------------------------------------------------------------------- verification

def _size(n: int) -> str:
    for unit, f in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= f:
            return f"{n / f:.{1 if n < 100 * f else 0}f} {unit}" if n % int(f) else f"{n // int(f)} {unit}"
    return f"{n} B"


def differences(rec: dict, path: str) -> tuple[list[str], list[str]]:
    """(what differs so that the recorded rows may not be the file's rows now, lesser notes)
    between a recorded identity row and the file at ``path`` now (read the same careful way)."""
    now = identify(path)
    if now is None:
        return ["missing now (or not a regular file)"], []
    hard, soft = [], []
    if now.size != rec["size"]:
        a, b = _size(int(rec["size"])), _size(now.size)
        hard.append(f"size {a} -> {b}" if a != b else f"size {int(rec['size']):,} -> {now.size:,} bytes")
    if rec["header_sha256"] and now.header_sha256 != rec["header_sha256"]:
        hard.append("header hash differs" if now.header_sha256 else "no longer a safetensors header")
    elif not rec["header_sha256"] and now.header_sha256 and rec["head_sha256"]:
        hard.append("now has a safetensors header")
    if rec["head_sha256"] and now.head_sha256 and now.head_sha256 != rec["head_sha256"]:
        hard.append("first MiB differs")
    unhashed = not (rec["head_sha256"] and now.head_sha256)
    moved = (now.dev, now.ino) != (int(rec["dev"]), int(rec["ino"]))
    touched = now.mtime_ns != int(rec["mtime_ns"])
    if moved or touched:
        what = ", ".join(w for w, on in (("another inode", moved), ("modified since (mtime)", touched)) if on)
        (hard if unhashed else soft).append(what if unhashed else f"{what}, same size and hashes")
    return hard, soft


def verify(trace, paths, allow_changed: bool = False) -> list[str]:
    """Check the files ``paths`` (as the trace names them) against the bundle's
    ``tables/files.parquet``.  Returns notes; raises UserError (exit 2) naming what differs
    unless ``allow_changed`` (then the difference is a note)."""
    df = trace.table("files") if hasattr(trace, "table") else None
    if df is None or not len(df):
        return ["file identity cannot be checked: the trace has no tables/files.parquet "
                "(recorded by an older engramprof): the rows may not be the file's rows now"]
    recorded = {r["path"]: r for r in df.to_dict("records")}
    notes = []
    for p in paths:
        rec = recorded.get(p)
        if rec is None:
            notes.append(f"{p}: no recorded identity: cannot check it has not changed")
            continue
        hard, soft = differences(rec, p)
        name = os.path.basename(p)
        if hard:
            msg = f"{name} changed since the trace: {', '.join(hard)}"
            if not allow_changed:
                raise UserError(f"{msg} (--allow-changed to go on anyway)", code=2)
            notes.append(f"{msg}; going on (--allow-changed): results are about the file as it is now")
        elif soft:
            notes.append(f"{name}: {', '.join(soft)}")
        if rec["method"].startswith("not read"):
            notes.append(f"{name}: content not hashed at record time ({rec['method']}): size, inode and mtime checked")
    return notes
