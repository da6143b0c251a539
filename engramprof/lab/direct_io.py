"""O_DIRECT for the lab's ``direct`` and ``aio`` readers: the O_DIRECT fd of a table, its
alignment, the aligned extents of a batch's rows and the page-aligned arena they are read into.

An O_DIRECT read must start at a multiple of the file's offset alignment, span a multiple of
it, and land in memory aligned to the memory alignment.  The alignment comes from
``statx(STATX_DIOALIGN)`` (Linux 6.1+: ``stx_dio_offset_align`` / ``stx_dio_mem_align``, the
filesystem's own answer for this file), else from the block device's
``queue/logical_block_size`` in sysfs, else the page size (always safe).  Each row is read
as the aligned extent that covers it, ``[floor(off / a) * a, ceil((off + size) / a) * a)``,
into its own slot of one ``mmap``-allocated (page-aligned) arena; the row is then copied out
of the slot.

The O_DIRECT fd is a second open of the table (through ``/proc/self/fd/N``, so it is the same
file even after a rename), like a server that keeps one O_DIRECT fd per file.  A filesystem
that refuses O_DIRECT (``EINVAL`` at open: ramfs, some FUSE and network mounts) is refused
with one line.  tmpfs is refused too: Linux 6.6+ accepts O_DIRECT there, but a tmpfs file
*is* page cache, so nothing would be bypassed and no device would be waited for.
"""
from __future__ import annotations

import ctypes
import errno
import mmap
import os

import numpy as np

from engramprof.lab.rowio import ReaderUnavailable, ShortReadError

TMPFS_MAGIC = 0x01021994
RAMFS_MAGIC = 0x858458F6
_NO_DEVICE_FS = {TMPFS_MAGIC: "tmpfs", RAMFS_MAGIC: "ramfs"}
AT_EMPTY_PATH = 0x1000
STATX_DIOALIGN = 0x2000
_STATX_SIZE = 256
_STATX_MASK, _STATX_DIO_MEM, _STATX_DIO_OFF = 0, 152, 156  # byte offsets in struct statx

_libc = ctypes.CDLL(None, use_errno=True)


def fs_magic(fd: int) -> int | None:
    """``fstatfs(fd).f_type`` (the filesystem's magic number), None if the call fails."""
    buf = ctypes.create_string_buffer(256)  # struct statfs is 120 bytes on 64-bit Linux
    if _libc.fstatfs(fd, buf) != 0:
        return None
    return int.from_bytes(buf.raw[:8], "little", signed=False) & 0xFFFFFFFF


def dio_alignment(fd: int) -> int:
    """The alignment (bytes, a power of two) of O_DIRECT offsets, lengths and buffers on fd."""
    buf = ctypes.create_string_buffer(_STATX_SIZE)
    statx = getattr(_libc, "statx", None)
    if statx is not None and statx(fd, b"", AT_EMPTY_PATH, STATX_DIOALIGN, buf) == 0:
        raw = buf.raw
        mask = int.from_bytes(raw[_STATX_MASK:_STATX_MASK + 4], "little")
        mem = int.from_bytes(raw[_STATX_DIO_MEM:_STATX_DIO_MEM + 4], "little")
        off = int.from_bytes(raw[_STATX_DIO_OFF:_STATX_DIO_OFF + 4], "little")
        if mask & STATX_DIOALIGN and mem and off:
            return max(mem, off)
    st = os.fstat(fd)
    try:
        with open(f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}/queue/logical_block_size") as f:
            return max(512, int(f.read()))
    except (OSError, ValueError):
        return mmap.PAGESIZE


def open_direct(fd: int, reader: str) -> tuple[int, int]:
    """(an O_DIRECT read-only fd of the file ``fd`` is open on, its alignment); a filesystem
    without O_DIRECT (or with no device behind it) is :class:`ReaderUnavailable`."""
    where = _name(fd)
    magic = fs_magic(fd)
    if magic in _NO_DEVICE_FS:
        raise ReaderUnavailable(
            f"the {reader} reader reads with O_DIRECT, and {where} is on {_NO_DEVICE_FS[magic]}, which has no "
            f"device to read from (its files are page cache): put the table on a disk filesystem (ext4, xfs)")
    try:
        dfd = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_DIRECT | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.EINVAL:
            raise ReaderUnavailable(
                f"the {reader} reader reads with O_DIRECT, and the filesystem of {where} refuses O_DIRECT "
                f"(open: EINVAL): put the table on a filesystem that supports it (ext4, xfs)") from None
        raise
    return dfd, dio_alignment(dfd)


def _name(fd: int) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return f"fd {fd}"


class DirectFiles:
    """One O_DIRECT fd per table fd, re-opened if the fd now names another file."""

    def __init__(self, reader: str):
        self.reader = reader
        self._fds: dict[int, tuple[tuple[int, int], int, int]] = {}  # fd -> (dev, ino), dfd, align

    def get(self, fd: int) -> tuple[int, int]:
        st = os.fstat(fd)
        ident = (st.st_dev, st.st_ino)
        have = self._fds.get(fd)
        if have is not None and have[0] == ident:
            return have[1], have[2]
        if have is not None:
            os.close(have[1])
        dfd, align = open_direct(fd, self.reader)
        self._fds[fd] = (ident, dfd, align)
        return dfd, align

    def close(self) -> None:
        for _, dfd, _ in self._fds.values():
            os.close(dfd)
        self._fds.clear()


class Arena:
    """A page-aligned buffer (anonymous mmap) that grows to the largest batch it has held."""

    def __init__(self):
        self._mm: mmap.mmap | None = None
        self.view: memoryview | None = None

    def ensure(self, size: int) -> memoryview:
        if self._mm is None or len(self._mm) < size:
            self.close()
            self._mm = mmap.mmap(-1, max(size, mmap.PAGESIZE))
            self.view = memoryview(self._mm)
        return self.view

    def address(self) -> int:
        return ctypes.addressof(ctypes.c_char.from_buffer(self._mm))

    def close(self) -> None:
        if self.view is not None:
            self.view.release()
            self.view = None
        if self._mm is not None:
            self._mm.close()
            self._mm = None


class Extents:
    """The aligned extents of rows: ``start`` (file offset), ``need`` (bytes that must be read:
    up to the row's end), ``length`` (the aligned read size), ``slot`` (arena offset), and
    ``skip`` (the row's offset inside its slot)."""

    def __init__(self, offsets: np.ndarray, row_bytes: int, align: int, base: int = 0):
        offs = np.asarray(offsets, dtype=np.int64)
        self.start = offs - offs % align
        end = offs + row_bytes
        self.length = (end + align - 1) // align * align - self.start
        self.need = end - self.start
        self.skip = offs - self.start
        self.slot = base + np.concatenate([[0], np.cumsum(self.length)[:-1]]).astype(np.int64) \
            if len(offs) else np.zeros(0, np.int64)
        self.total = int(self.length.sum())


def read_extent(dfd: int, arena: memoryview, slot: int, start: int, need: int, length: int,
                align: int) -> int:
    """Blocking O_DIRECT preadv of one extent until ``need`` bytes are in; returns the calls.
    A partial read continues from its last aligned byte; a read that brings nothing new is end
    of file."""
    calls = done = 0
    while done < need:
        at = done - done % align
        calls += 1
        n = os.preadv(dfd, [arena[slot + at:slot + length]], start + at)
        if n <= 0 or at + n <= done:
            raise ShortReadError(errno.EIO, f"short O_DIRECT read at offset {start}: {done} of {need} bytes")
        done = at + n
    return calls
