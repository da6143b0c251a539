"""Page-cache residency of files, tensors and trace rows, without reading a data page.

Two kernel interfaces answer "which pages of this file are in the page cache" without
faulting anything in:

- ``cachestat(2)`` (Linux 6.5+, syscall 451, no libc/Python wrapper: called with ctypes)
  returns counts for a byte range: cached, dirty, under writeback, evicted and recently
  evicted pages.
- ``mincore(2)`` over a read-only shared mapping of the file returns one bit per page.  The
  mapping is made with ``mmap(PROT_READ, MAP_SHARED)`` in bounded windows (1 GiB) and its
  memory is never touched, so no page is faulted in; the kernel answers from the page cache.

Per file / tensor counts use cachestat (falling back to mincore where the syscall is missing,
``ENOSYS``); per-row classification (:func:`classify_rows`) uses mincore's per-page bitmap over
only the windows that contain rows, with cachestat per row as the fallback where a file cannot
be mapped.  Either way the result is page-granular and only true at the instant it was
observed: residency can change right after (another reader, reclaim, readahead).

Both interfaces only reveal residency of files the caller owns or could open for writing
(Linux hides other files' page cache: cachestat fails with EPERM, mincore reports every page
resident).  Such files are refused with a clear error rather than reported wrongly.
"""
from __future__ import annotations

import ctypes
import errno
import mmap
import os
import stat
from dataclasses import asdict, dataclass, field

import numpy as np

from engramprof.errors import UserError
from engramprof.host.cachestat import SYS_CACHESTAT, CacheStat, cachestat
from engramprof.host import files as host_files
from engramprof.tables import safetensors as layout

PAGE_SIZE = mmap.PAGESIZE
WINDOW_BYTES = 1 << 30  # mincore mapping window: bounded address space per mmap
METHODS = ("auto", "cachestat", "mincore")

# row classes returned by row_classes()
COLD, PARTLY, RESIDENT = 0, 1, 2
CLASS_NAMES = {COLD: "cold", PARTLY: "partly", RESIDENT: "resident"}

RACE_NOTE = (
    "residency is a snapshot: pages can be cached or evicted right after they are observed"
)


_libc = ctypes.CDLL(None, use_errno=True)
_mmap = _libc.mmap
_mmap.restype = ctypes.c_void_p
_mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                  ctypes.c_long]
_munmap = _libc.munmap
_munmap.restype = ctypes.c_int
_munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_mincore = _libc.mincore
_mincore.restype = ctypes.c_int
_mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
_MAP_FAILED = ctypes.c_void_p(-1).value


_CACHESTAT_OK: bool | None = None


def cachestat_available(fd: int | None = None) -> bool:
    """Whether this kernel has cachestat(2); probed once, on ``fd`` (or stdin's number, which
    fails with EBADF rather than ENOSYS when the syscall exists)."""
    global _CACHESTAT_OK
    if _CACHESTAT_OK is None:
        try:
            cachestat(fd if fd is not None else -1, 0, 1)
            _CACHESTAT_OK = True
        except OSError as exc:
            _CACHESTAT_OK = exc.errno != errno.ENOSYS
    return _CACHESTAT_OK


def mincore_bitmap(fd: int, first_page: int, npages: int) -> np.ndarray:
    """Per-page residency (bool array of ``npages``) of pages ``[first_page, first_page+npages)``.

    Maps the file read-only and shared in windows of at most :data:`WINDOW_BYTES`, asks
    mincore(2), unmaps.  The mapping's memory is never touched, so nothing is faulted in.
    Raises OSError when the file cannot be mapped (e.g. ENODEV on filesystems without mmap).
    """
    out = np.zeros(npages, dtype=bool)
    win_pages = WINDOW_BYTES // PAGE_SIZE
    vec = np.empty(min(npages, win_pages), dtype=np.uint8)
    done = 0
    while done < npages:
        n = min(win_pages, npages - done)
        length = n * PAGE_SIZE
        addr = _mmap(None, length, mmap.PROT_READ, mmap.MAP_SHARED, fd,
                     (first_page + done) * PAGE_SIZE)
        if addr is None or addr == _MAP_FAILED:
            e = ctypes.get_errno()
            raise OSError(e, f"mmap: {os.strerror(e)}")
        try:
            if _mincore(addr, length, vec.ctypes.data) != 0:
                e = ctypes.get_errno()
                raise OSError(e, f"mincore: {os.strerror(e)}")
        finally:
            _munmap(addr, length)
        out[done:done + n] = (vec[:n] & 1).astype(bool)
        done += n
    return out


# --------------------------------------------------------------------------- opening files


@dataclass
class OpenFile:
    path: str
    fd: int
    size: int
    st: os.stat_result
    #: an overlayfs fd whose layer file was not found: cachestat would see no page (mincore does)
    overlay_only: bool = False

    @property
    def pages(self) -> int:
        return -(-self.size // PAGE_SIZE)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> "OpenFile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _may_inspect(path: str, st: os.stat_result) -> bool:
    """The kernel's rule for revealing another file's page cache (owner, capable, or writer)."""
    euid = os.geteuid()
    if euid == 0 or st.st_uid == euid:
        return True
    try:
        return os.access(path, os.W_OK, effective_ids=os.access in os.supports_effective_ids)
    except OSError:
        return False


def open_file(path: str | os.PathLike, *, allow_empty: bool = False) -> OpenFile:
    """Open a regular file read-only for residency queries, with one-line UserErrors."""
    p = os.fspath(path)
    try:
        st = os.stat(p)
    except FileNotFoundError:
        raise UserError(f"{p}: no such file") from None
    except OSError as exc:
        raise UserError(f"{p}: {exc.strerror}") from None
    if stat.S_ISDIR(st.st_mode):
        raise UserError(f"{p}: is a directory, not a file")
    if not stat.S_ISREG(st.st_mode):
        raise UserError(f"{p}: not a regular file")
    try:
        # O_NONBLOCK: never hang if a FIFO is swapped in after the stat
        fd = os.open(p, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except PermissionError:
        raise UserError(f"{p}: permission denied (cannot open it for reading)") from None
    except OSError as exc:
        raise UserError(f"{p}: {exc.strerror}") from None
    st2 = os.fstat(fd)
    if not stat.S_ISREG(st2.st_mode) or (st2.st_dev, st2.st_ino) != (st.st_dev, st.st_ino):
        os.close(fd)
        raise UserError(f"{p}: changed while being opened")
    if st2.st_size == 0 and not allow_empty:
        os.close(fd)
        raise UserError(f"{p}: empty file (no pages to report on)")
    if not _may_inspect(p, st2):
        os.close(fd)
        raise UserError(
            f"{p}: the kernel reveals page-cache residency only of files you own or could open "
            f"for writing; run as the file's owner or root", 1)
    overlay_only = False
    if _on_overlayfs(fd):
        layer = _layer_fd(p, fd, st2.st_size)
        # no layer file found (the overlay fd is all there is), or the layer is itself on an
        # overlay (stacked lower layers): cachestat would count an empty mapping either way
        overlay_only = layer == fd or _on_overlayfs(layer)
        fd = layer
    return OpenFile(p, fd, st2.st_size, st2, overlay_only)


OVERLAYFS_SUPER_MAGIC = 0x794C7630
_fstatfs = _libc.fstatfs
_fstatfs.restype = ctypes.c_int
_fstatfs.argtypes = [ctypes.c_int, ctypes.c_void_p]


def _on_overlayfs(fd: int) -> bool:
    """Whether ``fd`` is a file of an overlay mount (a container's image layers): f_type, the
    first word of struct statfs."""
    buf = ctypes.create_string_buffer(256)
    return _fstatfs(fd, buf) == 0 and ctypes.c_long.from_buffer(buf).value == OVERLAYFS_SUPER_MAGIC


def _layer_fd(path: str, fd: int, size: int) -> int:
    """An fd of the layer file that owns an overlay file's page cache, in place of ``fd``:
    cachestat(2) of the overlay fd counts the overlay inode's own mapping, which never holds a
    page (docs/kernel.md); mincore through a mapping of it does see the layer's pages.  Kept
    as is when the layer file is not found or does not look like the same file."""
    real = host_files.real_file(path)
    if not real:
        return fd
    try:
        rfd = os.open(real, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return fd
    rst = os.fstat(rfd)
    if not stat.S_ISREG(rst.st_mode) or rst.st_size != size:
        os.close(rfd)
        return fd
    os.close(fd)
    return rfd


# --------------------------------------------------------------------------- counts per range


@dataclass
class RangeResidency:
    """Page counts for one byte range (a file, a tensor, a row range).

    ``dirty``, ``writeback``, ``evicted`` and ``recently_evicted`` are None when the method
    was mincore (it only knows resident / not resident).
    """

    pages: int
    resident: int
    dirty: int | None
    writeback: int | None
    evicted: int | None
    recently_evicted: int | None
    method: str

    @property
    def fraction(self) -> float:
        return self.resident / self.pages if self.pages else 0.0

    def to_dict(self) -> dict:
        return asdict(self)


def _resolve_method(method: str, fd: int | None = None, overlay_only: bool = False) -> str:
    if method not in METHODS:
        raise UserError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")
    if method == "auto":
        return "cachestat" if cachestat_available(fd) and not overlay_only else "mincore"
    return method


def _page_span(off: int, length: int) -> tuple[int, int]:
    """(first page, page count) covering bytes ``[off, off+length)``; length > 0."""
    first = off // PAGE_SIZE
    last = (off + length - 1) // PAGE_SIZE
    return first, last - first + 1


def range_residency(f: OpenFile, off: int, length: int, method: str = "auto") -> RangeResidency:
    """Page counts of bytes ``[off, off+length)`` of an open file (page-granular: a page
    partly inside the range counts as a page of the range)."""
    asked = method
    method = _resolve_method(method, f.fd, f.overlay_only)
    if length <= 0:
        return RangeResidency(0, 0, 0, 0, 0, 0, method)
    first, n = _page_span(off, length)
    if method == "cachestat":
        try:
            cs = cachestat(f.fd, first * PAGE_SIZE, n * PAGE_SIZE)
        except OSError as exc:
            if asked == "auto" and exc.errno in (errno.ENOSYS, errno.EOPNOTSUPP):
                return range_residency(f, off, length, "mincore")
            if exc.errno == errno.EPERM:
                raise UserError(f"{f.path}: cachestat refused (EPERM): the kernel reveals page-cache "
                                "residency only of files you own or could open for writing", 1) from None
            raise UserError(f"{f.path}: cachestat failed: {exc.strerror}", 1) from None
        return RangeResidency(n, cs.nr_cache, cs.nr_dirty, cs.nr_writeback, cs.nr_evicted,
                              cs.nr_recently_evicted, "cachestat")
    try:
        bits = mincore_bitmap(f.fd, first, n)
    except OSError as exc:
        raise UserError(f"{f.path}: cannot map it for mincore ({exc.strerror})", 1) from None
    return RangeResidency(n, int(bits.sum()), None, None, None, None, "mincore")


# --------------------------------------------------------------------------- files and tensors


@dataclass
class TensorResidency:
    name: str
    start: int
    end: int
    rows: int
    residency: RangeResidency
    ranges: list[dict] = field(default_factory=list)  # [{row_start, row_end, ...counts}]

    def to_dict(self) -> dict:
        d = {"name": self.name, "start": self.start, "end": self.end, "rows": self.rows}
        d.update(self.residency.to_dict())
        if self.ranges:
            d["ranges"] = self.ranges
        return d


@dataclass
class FileResidency:
    path: str
    size: int
    residency: RangeResidency
    tensors: list[TensorResidency] | None = None
    tensor_note: str | None = None

    def to_dict(self) -> dict:
        d = {"path": self.path, "size": self.size}
        d.update(self.residency.to_dict())
        if self.tensors is not None:
            d["tensors"] = [t.to_dict() for t in self.tensors]
        if self.tensor_note:
            d["tensor_note"] = self.tensor_note
        return d


def _tensor_residency(f: OpenFile, method: str, ranges: int) -> list[TensorResidency]:
    lay = layout.load(f.path)
    out = []
    for t in lay.tensors:
        res = range_residency(f, t.start, t.end - t.start, method)
        tr = TensorResidency(t.name, t.start, t.end, t.rows, res)
        if ranges and ranges > 0 and t.rows > 0 and t.row_bytes > 0:
            bounds = np.linspace(0, t.rows, min(ranges, t.rows) + 1).round().astype(np.int64)
            for a, b in zip(bounds[:-1], bounds[1:]):
                if b <= a:
                    continue
                r = range_residency(f, t.start + int(a) * t.row_bytes, int(b - a) * t.row_bytes, method)
                tr.ranges.append({"row_start": int(a), "row_end": int(b), **r.to_dict()})
        out.append(tr)
    return out


def file_residency(path: str | os.PathLike, method: str = "auto", *, tensors: bool = False,
                   ranges: int = 0) -> FileResidency:
    """Residency of a whole file (and of each safetensors tensor / row range if asked)."""
    with open_file(path) as f:
        method = _resolve_method(method, f.fd, f.overlay_only)
        res = range_residency(f, 0, f.size, method)
        fr = FileResidency(f.path, f.size, res)
        if tensors or ranges:
            try:
                fr.tensors = _tensor_residency(f, method, ranges)
            except UserError as exc:
                fr.tensors, fr.tensor_note = [], f"no tensors: {exc}"
        return fr


# --------------------------------------------------------------------------- rows


def _row_pages(offsets: np.ndarray, sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    first = offsets // PAGE_SIZE
    last = (offsets + np.maximum(sizes, 1) - 1) // PAGE_SIZE
    return first, last - first + 1


def _pages_of_rows(first: np.ndarray, npages: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every page of every row, flattened, plus the start index of each row in that array."""
    starts = np.zeros(len(npages), dtype=np.int64)
    if len(npages) > 1:
        np.cumsum(npages[:-1], out=starts[1:])
    total = int(npages.sum())
    # page = first[row] + (position within the row)
    row_of = np.repeat(np.arange(len(npages)), npages)
    pages = first[row_of] + (np.arange(total, dtype=np.int64) - starts[row_of])
    return pages, starts


CLUSTER_GAP_PAGES = 64  # asking about this many unneeded pages costs about one extra syscall


def _mincore_sparse(fd: int, uniq: np.ndarray) -> np.ndarray:
    """Residency bit of each page of the sorted unique page numbers ``uniq``.

    Per 1 GiB window holding any of them: one read-only shared mapping of the span from the
    window's lowest to highest wanted page, then one mincore(2) per cluster of wanted pages
    (clusters split at gaps over :data:`CLUSTER_GAP_PAGES`), so sparse rows over a large
    file cost per row, not per page of the file.  The mapping is never touched."""
    ubits = np.zeros(len(uniq), dtype=bool)
    win_pages = WINDOW_BYTES // PAGE_SIZE
    win = uniq // win_pages
    for seg in np.split(np.arange(len(uniq)), np.flatnonzero(np.diff(win)) + 1):
        pg = uniq[seg]
        lo, hi = int(pg[0]), int(pg[-1])
        length = (hi - lo + 1) * PAGE_SIZE
        addr = _mmap(None, length, mmap.PROT_READ, mmap.MAP_SHARED, fd, lo * PAGE_SIZE)
        if addr is None or addr == _MAP_FAILED:
            e = ctypes.get_errno()
            raise OSError(e, f"mmap: {os.strerror(e)}")
        try:
            cuts = np.flatnonzero(np.diff(pg) > CLUSTER_GAP_PAGES) + 1
            starts = np.r_[0, cuts]
            ends = np.r_[cuts, len(pg)]
            vec = np.empty(int((pg[ends - 1] - pg[starts]).max()) + 1, dtype=np.uint8)
            vptr = vec.ctypes.data
            for a, b in zip(starts.tolist(), ends.tolist()):
                c_lo, c_hi = int(pg[a]), int(pg[b - 1])
                n = c_hi - c_lo + 1
                if _mincore(addr + (c_lo - lo) * PAGE_SIZE, n * PAGE_SIZE, vptr) != 0:
                    e = ctypes.get_errno()
                    raise OSError(e, f"mincore: {os.strerror(e)}")
                ubits[seg[a:b]] = (vec[pg[a:b] - c_lo] & 1).astype(bool)
        finally:
            _munmap(addr, length)
    return ubits


def _bits_mincore(fd: int, pages: np.ndarray) -> np.ndarray:
    """Residency bit of each page in ``pages`` via mincore near the wanted pages only."""
    if not len(pages):
        return np.zeros(0, dtype=bool)
    uniq, inv = np.unique(pages, return_inverse=True)
    return _mincore_sparse(fd, uniq)[inv]


def _bits_cachestat(fd: int, pages: np.ndarray) -> np.ndarray:
    """Residency bit per page with one cachestat call per distinct page (the fallback where a
    file cannot be mapped)."""
    bits = np.zeros(len(pages), dtype=bool)
    if not len(pages):
        return bits
    uniq, inv = np.unique(pages, return_inverse=True)
    ubits = np.zeros(len(uniq), dtype=bool)
    for i, p in enumerate(uniq.tolist()):
        ubits[i] = cachestat(fd, p * PAGE_SIZE, PAGE_SIZE).nr_cache > 0
    return ubits[inv]


def classify_rows(path: str | os.PathLike | int, offsets, sizes, method: str = "auto") -> np.ndarray:
    """Resident fraction (0..1, page-granular) of each row ``[offset, offset+size)`` of a file.

    ``path`` may be an open fd.  ``auto`` uses mincore over the windows that contain rows
    (one bit per page), and cachestat per page where the file cannot be mapped.  Never reads
    or faults in a data page.  Pages past the end of the file count as not resident.  Use
    :func:`row_classes` to turn fractions into cold / partly / resident.
    """
    if method not in METHODS:
        raise UserError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")
    offsets = np.asarray(offsets, dtype=np.int64).reshape(-1)
    sizes = np.asarray(sizes, dtype=np.int64).reshape(-1)
    if offsets.shape != sizes.shape:
        raise ValueError("offsets and sizes must have the same length")
    if len(offsets) == 0:
        return np.zeros(0, dtype=np.float64)
    if (offsets < 0).any():
        raise ValueError("negative offset")
    if isinstance(path, int):
        return _classify_fd(path, offsets, sizes, method)
    with open_file(path, allow_empty=True) as f:
        return _classify_fd(f.fd, offsets, sizes, method)


def _classify_fd(fd: int, offsets: np.ndarray, sizes: np.ndarray, method: str) -> np.ndarray:
    first, npages = _row_pages(offsets, sizes)
    pages, starts = _pages_of_rows(first, npages)
    if method == "cachestat":
        bits = _bits_cachestat(fd, pages)
    else:
        try:
            bits = _bits_mincore(fd, pages)
        except OSError:
            if method == "mincore":
                raise
            bits = _bits_cachestat(fd, pages)
    resident = np.add.reduceat(bits.astype(np.int64), starts)
    return resident / npages


def row_classes(fractions: np.ndarray) -> np.ndarray:
    """COLD (0) / PARTLY (1) / RESIDENT (2) per row from resident fractions."""
    f = np.asarray(fractions)
    return np.where(f >= 1.0, RESIDENT, np.where(f <= 0.0, COLD, PARTLY)).astype(np.int8)


# --------------------------------------------------------------------------- trace rows


@dataclass
class RowsSummary:
    files: list[dict]
    notes: list[str]

    def to_dict(self) -> dict:
        return {"files": self.files, "notes": self.notes}


def _summ(fr: np.ndarray, sizes: np.ndarray) -> dict:
    cls = row_classes(fr)
    n = len(fr)
    return {
        "rows": int(n),
        "resident": int((cls == RESIDENT).sum()),
        "partly": int((cls == PARTLY).sum()),
        "cold": int((cls == COLD).sum()),
        "resident_frac": float((cls == RESIDENT).sum() / n) if n else 0.0,
        "bytes": int(sizes.sum()),
    }
