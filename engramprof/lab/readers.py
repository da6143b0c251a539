"""Production-shaped table-row readers, one API (``make_reader(name).read_batch(jobs)``).

- ``pool``: the shape from the field report. Rows are de-duplicated per job, each job's rows
  are cut into tasks of ``max(1, min(16, ceil(total_rows / threads)))`` rows, every task is a
  future on one process-wide 32-thread ThreadPoolExecutor, and the batch waits for all.
- ``nowait``: every row is first read synchronously with ``preadv(..., RWF_NOWAIT)``; rows that
  fail (EAGAIN, or a short/zero return) get one more NOWAIT pass; what is still missing goes
  to the pool.  If the kernel/filesystem rejects the flag (EINVAL, ENOSYS, EOPNOTSUPP) the
  whole batch goes to the pool and the reader remembers not to try again.
- ``serial``: blocking reads in the calling thread.
- ``mmap``: no read syscall at all.  The table is mapped once (``numpy.memmap``, read-only,
  ``madvise(MADV_RANDOM)`` on the mapping, so a cold page is one page read, no readahead) and
  each job is one fancy-index gather (``np.take`` of the job's row ids) on the calling thread:
  a cold row is a page fault.  Every requested row is gathered (numpy does not de-duplicate;
  a repeated row touches an already mapped page).
- ``mmap-pool``: the same gather split across the 32-thread pool with the pool's chunk rule
  (``max(1, min(16, ceil(total_rows / threads)))`` rows a task, tasks never span jobs).

The other read paths of issue 22 (each job's rows de-duplicated, as the pool does):

- ``uring``: io_uring on the calling thread, one persistent ring (:mod:`.uring`, the
  ``liburing`` package): one ``IORING_OP_READV`` per row (into a buffer of the ring's, copied
  into the job's array at its completion: :mod:`.uring`), all of
  a step's rows submitted at once and every completion waited for (``io_uring_submit_and_wait``).
- ``direct``: O_DIRECT ``preadv`` from the pool (the pool's tasks and chunk rule): each row's
  aligned extent read into a page-aligned arena, the row copied out (:mod:`.direct_io`).
- ``read``: one thread; per row ("chunk", zarr-style) ``open``, ``lseek``, ``read()`` until
  the row is in, ``close`` (plus ``posix_fadvise(RANDOM)`` after the open unless --no-random).
- ``aio``: Linux native AIO on the calling thread (:mod:`.aio`, raw syscalls): one
  ``IOCB_CMD_PREAD`` per row's aligned extent on an O_DIRECT fd, ``io_submit`` of the whole
  step and ``io_getevents`` until every one is in (as DiskANN's libaio reader).

``direct`` and ``aio`` bypass the page cache; the table must be on a filesystem with O_DIRECT
and a device (not tmpfs, ramfs): else one line (:class:`ReaderUnavailable`, exit 2).

Every blocking row read is a full-read loop: a partial read continues, a zero return raises
:class:`ShortReadError` rather than leaving stale bytes.  ``ReadStats.calls`` counts every
``preadv`` call made (CPython's ``os.preadv`` is always the ``preadv2`` syscall on Linux), so
it can be compared with a kernel-side count (the other paths count their read requests:
``read()`` calls, io_uring SQEs, AIO iocbs, O_DIRECT ``preadv`` calls).  ``preadv`` is
injectable for forced-path tests (pool, nowait, serial).
"""
from __future__ import annotations

import errno
import math
import mmap
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable

import numpy as np

from engramprof.lab import aio, direct_io, uring
from engramprof.lab.rowio import ReaderUnavailable, ShortReadError  # noqa: F401  (their public home)

SYSCALL_READERS = ("pool", "nowait", "serial")  # rows read with preadv2
MMAP_READERS = ("mmap", "mmap-pool")  # rows gathered through a mapping (page faults)
PATH_READERS = ("uring", "direct", "read", "aio")  # io_uring, O_DIRECT preadv, read(), libaio
DIRECT_READERS = ("direct", "aio")  # O_DIRECT: the page cache is bypassed
READERS = SYSCALL_READERS + MMAP_READERS + PATH_READERS
MADV_POPULATE_READ = getattr(mmap, "MADV_POPULATE_READ", 22)  # Linux 5.14+
RWF_NOWAIT = getattr(os, "RWF_NOWAIT", 0)
UNSUPPORTED_ERRNOS = frozenset(
    e for e in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, getattr(errno, "ENOTSUP", None)) if e
)
MAX_TASK_ROWS = 16

Preadv = Callable[..., int]


@dataclass
class Job:
    fd: int
    offsets: np.ndarray  # int64 file offsets of the rows
    row_bytes: int
    out: np.ndarray  # uint8, C-contiguous, shape (len(offsets), row_bytes)

    def __post_init__(self):
        self.offsets = np.asarray(self.offsets, dtype=np.int64)
        if self.out.dtype != np.uint8 or self.out.shape != (len(self.offsets), self.row_bytes) \
                or not self.out.flags.c_contiguous or not self.out.flags.writeable:
            raise ValueError(
                f"Job.out must be a writable C-contiguous uint8 array of shape "
                f"({len(self.offsets)}, {self.row_bytes}), got {self.out.dtype} {self.out.shape}"
            )


@dataclass
class ReadStats:
    calls: int = 0  # preadv calls made (each one a preadv2 syscall)
    eagain: int = 0  # NOWAIT calls that raised EAGAIN
    fallback_rows: int = 0  # rows read by the blocking pool in a nowait reader
    nowait_unsupported: bool = False

    def add(self, other: "ReadStats") -> None:
        self.calls += other.calls
        self.eagain += other.eagain
        self.fallback_rows += other.fallback_rows
        self.nowait_unsupported |= other.nowait_unsupported


def open_table(path: str | os.PathLike, random: bool = True) -> int:
    """A read-only fd for row reads, with POSIX_FADV_RANDOM (no readahead markers, which
    would make RWF_NOWAIT reads of cached pages return EAGAIN); ``random=False`` (``lab run
    --no-random``) leaves the kernel's readahead on."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    if random:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
    return fd


def page_runs(offsets: np.ndarray, row_bytes: int) -> list[tuple[int, int]]:
    """The pages of these rows as runs of consecutive pages: (first page, pages) each."""
    offs = np.asarray(offsets, dtype=np.int64)
    if not len(offs):
        return []
    ps = mmap.PAGESIZE
    first, last = offs // ps, (offs + row_bytes - 1) // ps
    pages = np.unique(np.concatenate([np.arange(a, b + 1) for a, b in zip(first.tolist(), last.tolist())]))
    return [(int(r[0]), len(r)) for r in np.split(pages, np.flatnonzero(np.diff(pages) != 1) + 1)]


def unique_rows(job: Job) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(unique offsets, index in job.out of the first request of each, inverse or None)."""
    uniq, first, inv = np.unique(job.offsets, return_index=True, return_inverse=True)
    return uniq, first, (inv if len(uniq) < len(job.offsets) else None)


def _fill_duplicates(job: Job, first: np.ndarray, inv: np.ndarray | None) -> None:
    if inv is not None:
        job.out[:] = job.out[first[inv]]


def _read_rows(preadv: Preadv, fd: int, flat: memoryview, rb: int, idx: list[int],
               offs: list[int]) -> int:
    """Blocking full-read loop over rows; returns the number of preadv calls made."""
    calls = 0
    for i, off in zip(idx, offs):
        view = flat[i * rb:(i + 1) * rb]
        done = 0
        while done < rb:
            calls += 1
            n = preadv(fd, [view[done:]], off + done)
            if n <= 0:
                raise ShortReadError(
                    errno.EIO, f"short read at offset {off}: {done} of {rb} bytes (fd {fd})"
                )
            done += n
    return calls


# one process-wide executor per thread count, shared by the readers that hold it
_pools: dict[int, list] = {}  # threads -> [executor, users]
_pools_lock = threading.Lock()


def _acquire_pool(threads: int) -> ThreadPoolExecutor:
    with _pools_lock:
        entry = _pools.get(threads)
        if entry is None:
            entry = _pools[threads] = [
                ThreadPoolExecutor(max_workers=threads, thread_name_prefix="engram-read"), 0
            ]
        entry[1] += 1
        return entry[0]


def _release_pool(threads: int) -> None:
    with _pools_lock:
        entry = _pools.get(threads)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] > 0:
            return
        del _pools[threads]
    entry[0].shutdown(wait=True)


class Reader:
    name = "?"

    def __init__(self, threads: int = 32, preadv: Preadv | None = None):
        if threads < 1:
            raise ValueError("threads must be >= 1")
        self.threads = threads
        self.preadv: Preadv = preadv or os.preadv

    def read_batch(self, jobs: list[Job]) -> ReadStats:
        raise NotImplementedError

    #: False (``lab run --no-random``): no POSIX_FADV_RANDOM / MADV_RANDOM, readahead on
    random = True

    def hint(self, fd: int, offsets: np.ndarray, row_bytes: int) -> int:
        """Prefetch these rows (``lab run --prefetch willneed``): one
        ``posix_fadvise(POSIX_FADV_WILLNEED)`` per run of consecutive pages; returns the calls."""
        runs = page_runs(offsets, row_bytes)
        for first, n in runs:
            os.posix_fadvise(fd, first * mmap.PAGESIZE, n * mmap.PAGESIZE, os.POSIX_FADV_WILLNEED)
        return len(runs)

    def prepare(self, fd: int, populate: bool = False) -> None:
        """Called once per table fd before the first batch (the mmap readers map it here, so
        the mapping is not made inside a step).  No-op for the syscall readers."""

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class SerialReader(Reader):
    name = "serial"

    def read_batch(self, jobs: list[Job]) -> ReadStats:
        stats = ReadStats()
        for job in jobs:
            uniq, first, inv = unique_rows(job)
            flat = memoryview(job.out).cast("B")
            stats.calls += _read_rows(self.preadv, job.fd, flat, job.row_bytes, first.tolist(),
                                      uniq.tolist())
            _fill_duplicates(job, first, inv)
        return stats


class PoolReader(Reader):
    name = "pool"

    def __init__(self, threads: int = 32, preadv: Preadv | None = None):
        super().__init__(threads, preadv)
        self._pool: ThreadPoolExecutor | None = _acquire_pool(threads)

    def _run(self, work: list[tuple[Job, list[int], list[int]]]) -> int:
        """Read (job, out indices, offsets) through the pool; returns preadv calls made."""
        total = sum(len(idx) for _, idx, _ in work)
        if not total:
            return 0
        if self._pool is None:
            raise ValueError(f"{self.name} reader is closed")
        size = max(1, min(MAX_TASK_ROWS, math.ceil(total / self.threads)))
        futures = []
        for job, idx, offs in work:
            flat = memoryview(job.out).cast("B")
            for k in range(0, len(idx), size):
                futures.append(self._pool.submit(
                    _read_rows, self.preadv, job.fd, flat, job.row_bytes,
                    idx[k:k + size], offs[k:k + size],
                ))
        calls, error = 0, None
        for fut in futures:  # wait for every task, even after a failure: they write into out
            try:
                calls += fut.result()
            except BaseException as exc:  # noqa: BLE001 - re-raised below
                error = error or exc
        if error is not None:
            raise error
        return calls

    def read_batch(self, jobs: list[Job]) -> ReadStats:
        prepared = [(job, *unique_rows(job)) for job in jobs]
        stats = ReadStats()
        stats.calls = self._run([(job, first.tolist(), uniq.tolist()) for job, uniq, first, _ in prepared])
        for job, _, first, inv in prepared:
            _fill_duplicates(job, first, inv)
        return stats

    def close(self) -> None:
        if self._pool is not None:
            self._pool = None
            _release_pool(self.threads)


class NowaitReader(PoolReader):
    name = "nowait"

    def __init__(self, threads: int = 32, preadv: Preadv | None = None):
        super().__init__(threads, preadv)
        self.nowait_supported = bool(RWF_NOWAIT)  # this Python / platform has the flag
        # filesystems (st_dev) that rejected RWF_NOWAIT: support is per filesystem, so a
        # refusal on one (tmpfs, say) must not turn NOWAIT off for tables on another
        self.unsupported_devs: set[int] = set()

    def _nowait_pass(self, job: Job, flat: memoryview, idx: list[int], offs: list[int],
                     stats: ReadStats) -> tuple[list[int], list[int]] | None:
        """One RWF_NOWAIT try per row; returns the misses, or None if NOWAIT is unsupported."""
        preadv, fd, rb = self.preadv, job.fd, job.row_bytes
        miss_idx, miss_offs = [], []
        for i, off in zip(idx, offs):
            stats.calls += 1
            try:
                n = preadv(fd, [flat[i * rb:(i + 1) * rb]], off, RWF_NOWAIT)
            except BlockingIOError:
                stats.eagain += 1
                n = -1
            except OSError as exc:
                if exc.errno in UNSUPPORTED_ERRNOS:
                    return None
                raise
            if n != rb:  # EAGAIN, or a short / zero read: the row is not (all) cached
                miss_idx.append(i)
                miss_offs.append(off)
        return miss_idx, miss_offs

    def read_batch(self, jobs: list[Job]) -> ReadStats:
        devs = {os.fstat(job.fd).st_dev for job in jobs}
        if not self.nowait_supported or devs & self.unsupported_devs:
            stats = super().read_batch(jobs)
            stats.fallback_rows = sum(len(np.unique(j.offsets)) for j in jobs)
            stats.nowait_unsupported = True
            return stats
        stats = ReadStats()
        prepared = [(job, *unique_rows(job)) for job in jobs]
        residual = []
        for job, uniq, first, _ in prepared:
            flat = memoryview(job.out).cast("B")
            pending = (first.tolist(), uniq.tolist())
            for _ in range(2):  # first try, then one retry of the misses
                if not pending[0]:
                    break
                pending = self._nowait_pass(job, flat, pending[0], pending[1], stats)
                if pending is None:  # flag rejected: the whole batch goes to the pool
                    self.unsupported_devs.add(os.fstat(job.fd).st_dev)
                    fallback = super().read_batch(jobs)
                    fallback.calls += stats.calls
                    fallback.eagain = stats.eagain
                    fallback.fallback_rows = sum(len(u) for _, u, _, _ in prepared)
                    fallback.nowait_unsupported = True
                    return fallback
            if pending[0]:
                residual.append((job, pending[0], pending[1]))
        stats.fallback_rows = sum(len(idx) for _, idx, _ in residual)
        stats.calls += self._run(residual)
        for job, _, first, inv in prepared:
            _fill_duplicates(job, first, inv)
        return stats


class _Mapping:
    """One read-only ``numpy.memmap`` of a table file, ``MADV_RANDOM`` on the whole mapping."""

    def __init__(self, fd: int, populate: bool = False, random: bool = True):
        st = os.fstat(fd)
        self.ident = (st.st_dev, st.st_ino)
        self.size = st.st_size
        with open(fd, "rb", closefd=False) as f:
            self.mm = np.memmap(f, dtype=np.uint8, mode="r", shape=(st.st_size,))
        raw = self.mm._mmap  # the mmap.mmap numpy made: madvise acts on the whole mapping
        if random:  # else (--no-random) the kernel's mmap read-around stays on
            raw.madvise(mmap.MADV_RANDOM)
        if populate:  # map every (cached) page now: later gathers make no fault at all
            try:
                raw.madvise(MADV_POPULATE_READ)
            except OSError:  # older kernel: touch one byte a page (the pages are cached)
                int(self.mm[::mmap.PAGESIZE].sum())

    def rows(self, job: Job) -> tuple[np.ndarray, np.ndarray]:
        """(2-D [rows, row_bytes] view of the job's tensor region, row ids of job.offsets)."""
        rb, offs = job.row_bytes, job.offsets
        if not len(offs):
            return self.mm[:0].reshape(0, rb), offs
        if int(offs.min()) < 0 or int(offs.max()) + rb > self.size:
            raise ShortReadError(errno.EIO, f"rows outside the mapping (fd {job.fd})")
        phase = int(offs[0]) % rb
        if ((offs - phase) % rb).any():
            # reads at arbitrary byte offsets (replay of a trace's reads): a view with one row
            # starting at every byte, so the gather is still one fancy index
            view = np.lib.stride_tricks.as_strided(self.mm, shape=(self.size - rb + 1, rb), strides=(1, 1),
                                                   writeable=False)
            return view, offs
        nrows = (self.size - phase) // rb
        return self.mm[phase:phase + nrows * rb].reshape(nrows, rb), (offs - phase) // rb

    def unmap(self, offsets: np.ndarray, row_bytes: int) -> int:
        """Zap this mapping's page-table entries for the pages of these rows
        (``madvise(MADV_DONTNEED)``: the pages stay in the page cache; the next access faults
        them in again).  A page mapped by a process is skipped by ``POSIX_FADV_DONTNEED``, so a
        row's pages must be unmapped before they can be evicted.  Returns the pages advised."""
        offs = np.asarray(offsets, dtype=np.int64)
        if not len(offs) or self.mm is None:
            return 0
        ps = mmap.PAGESIZE
        first, last = offs // ps, (offs + row_bytes - 1) // ps
        pages = np.unique(np.concatenate([np.arange(a, b + 1) for a, b in zip(first.tolist(), last.tolist())]))
        raw = self.mm._mmap
        for run in np.split(pages, np.flatnonzero(np.diff(pages) != 1) + 1):
            start = int(run[0]) * ps
            raw.madvise(mmap.MADV_DONTNEED, start, min(len(run) * ps, self.size - start))
        return len(pages)

    def close(self) -> None:
        raw = getattr(self.mm, "_mmap", None)
        self.mm = None
        if raw is not None:
            try:
                raw.close()
            except BufferError:  # a view is still alive somewhere: let GC unmap it
                pass


def _gather(view: np.ndarray, rows: np.ndarray, out: np.ndarray) -> int:
    """The fancy-index gather: out[:] = view[rows] without a temporary (bounds checked)."""
    np.take(view, rows, axis=0, out=out, mode="clip")
    return 0


class MmapReader(Reader):
    """Rows gathered through a mapping on the calling thread (see the module doc)."""

    name = "mmap"

    def __init__(self, threads: int = 32, preadv: Preadv | None = None):
        super().__init__(threads, preadv)
        self._maps: dict[int, _Mapping] = {}  # fd -> mapping

    def prepare(self, fd: int, populate: bool = False) -> None:
        self._mapping(fd, populate)

    def _mapping(self, fd: int, populate: bool = False) -> _Mapping:
        m = self._maps.get(fd)
        st = os.fstat(fd)
        if m is None or m.ident != (st.st_dev, st.st_ino) or m.size != st.st_size:
            if m is not None:
                m.close()
            m = self._maps[fd] = _Mapping(fd, populate, random=self.random)
        return m

    def hint(self, fd: int, offsets: np.ndarray, row_bytes: int) -> int:
        """Prefetch these rows through the mapping: one ``madvise(MADV_WILLNEED)`` per run of
        consecutive pages; returns the calls."""
        m = self._mapping(fd)
        runs = page_runs(offsets, row_bytes)
        for first, n in runs:
            start = first * mmap.PAGESIZE
            m.mm._mmap.madvise(mmap.MADV_WILLNEED, start, min(n * mmap.PAGESIZE, m.size - start))
        return len(runs)

    def unmap(self, fd: int, offsets: np.ndarray, row_bytes: int) -> int:
        """Unmap the pages of these rows from this reader's mapping of ``fd`` (see
        :meth:`_Mapping.unmap`); 0 when the fd is not mapped."""
        m = self._maps.get(fd)
        return m.unmap(offsets, row_bytes) if m is not None else 0

    def _work(self, jobs: list[Job]) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        work = []
        for job in jobs:
            view, rows = self._mapping(job.fd).rows(job)
            work.append((view, rows, job.out))
        return work

    def read_batch(self, jobs: list[Job]) -> ReadStats:
        for view, rows, out in self._work(jobs):
            _gather(view, rows, out)
        return ReadStats()

    def close(self) -> None:
        for m in self._maps.values():
            m.close()
        self._maps.clear()


class MmapPoolReader(MmapReader):
    """The mmap gather cut into the pool's tasks, every task a future on the shared pool."""

    name = "mmap-pool"

    def __init__(self, threads: int = 32, preadv: Preadv | None = None):
        super().__init__(threads, preadv)
        self._pool: ThreadPoolExecutor | None = _acquire_pool(threads)

    def read_batch(self, jobs: list[Job]) -> ReadStats:
        if self._pool is None:
            raise ValueError(f"{self.name} reader is closed")
        work = self._work(jobs)
        total = sum(len(rows) for _, rows, _ in work)
        if not total:
            return ReadStats()
        size = max(1, min(MAX_TASK_ROWS, math.ceil(total / self.threads)))
        futures = [self._pool.submit(_gather, view, rows[k:k + size], out[k:k + size])
                   for view, rows, out in work for k in range(0, len(rows), size)]
        error = None
        for fut in futures:  # wait for every task, even after a failure: they write into out
            try:
                fut.result()
            except BaseException as exc:  # noqa: BLE001 - re-raised below
                error = error or exc
        if error is not None:
            raise error
        return ReadStats()

    def close(self) -> None:
        super().close()
        if self._pool is not None:
            self._pool = None
            _release_pool(self.threads)


def _wait_all(futures) -> int:
    """Sum of the futures' results, after every one has finished (they write into the jobs'
    arrays); the first failure is raised then."""
    total, error = 0, None
    for fut in futures:
        try:
            total += fut.result()
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            error = error or exc
    if error is not None:
        raise error
    return total


class _DirectRows:
    """The O_DIRECT side of the ``direct`` and ``aio`` readers: one O_DIRECT fd per table fd,
    each row's aligned extent (:class:`direct_io.Extents`) in one arena for the step."""

    def _init_direct(self) -> None:
        self._direct = direct_io.DirectFiles(self.name)
        self._arena = direct_io.Arena()

    def prepare(self, fd: int, populate: bool = False) -> None:
        self._direct.get(fd)  # a filesystem without O_DIRECT is refused before the first step

    def _plan(self, jobs: list[Job]) -> tuple[list[tuple], memoryview]:
        """Per job (job, O_DIRECT fd, alignment, first index of each unique row, inverse,
        extents); and the arena, big enough for every extent of the step."""
        plans, base = [], 0
        for job in jobs:
            uniq, first, inv = unique_rows(job)
            dfd, align = self._direct.get(job.fd)
            ext = direct_io.Extents(uniq, job.row_bytes, align, base)
            base += -(-ext.total // mmap.PAGESIZE) * mmap.PAGESIZE  # the next job's slots page-aligned
            plans.append((job, dfd, align, first, inv, ext))
        return plans, self._arena.ensure(base)

    @staticmethod
    def _copy_out(arena: memoryview, job: Job, first: np.ndarray, ext, lo: int, hi: int) -> None:
        if hi <= lo:
            return
        rb, buf = job.row_bytes, np.frombuffer(arena, dtype=np.uint8)
        rows = np.lib.stride_tricks.as_strided(buf, shape=(len(buf) - rb + 1, rb), strides=(1, 1), writeable=False)
        job.out[first[lo:hi]] = rows[ext.slot[lo:hi] + ext.skip[lo:hi]]  # a row starts at every byte

    def _close_direct(self) -> None:
        self._direct.close()
        self._arena.close()


def _direct_task(arena: memoryview, dfd: int, align: int, job: Job, first: np.ndarray, ext, lo: int,
                 hi: int) -> int:
    """One pool task of the direct reader: extents [lo, hi) read, their rows copied out."""
    calls = 0
    for r in range(lo, hi):
        calls += direct_io.read_extent(dfd, arena, int(ext.slot[r]), int(ext.start[r]), int(ext.need[r]),
                                       int(ext.length[r]), align)
    _DirectRows._copy_out(arena, job, first, ext, lo, hi)
    return calls


class DirectReader(_DirectRows, PoolReader):
    """O_DIRECT ``preadv`` of each row's aligned extent from the pool (see the module doc)."""

    name = "direct"

    def __init__(self, threads: int = 32, preadv: Preadv | None = None):
        super().__init__(threads, preadv)
        self._init_direct()

    def read_batch(self, jobs: list[Job]) -> ReadStats:
        if self._pool is None:
            raise ValueError(f"{self.name} reader is closed")
        plans, arena = self._plan(jobs)
        total = sum(len(p[3]) for p in plans)
        stats = ReadStats()
        if not total:
            return stats
        size = max(1, min(MAX_TASK_ROWS, math.ceil(total / self.threads)))
        stats.calls = _wait_all([
            self._pool.submit(_direct_task, arena, dfd, align, job, first, ext, lo, min(lo + size, len(first)))
            for job, dfd, align, first, _, ext in plans for lo in range(0, len(first), size)])
        for job, _, _, first, inv, _ in plans:
            _fill_duplicates(job, first, inv)
        return stats

    def close(self) -> None:
        super().close()
        self._close_direct()


class AioReader(_DirectRows, Reader):
    """Linux AIO PREADs of each row's aligned extent on an O_DIRECT fd, the whole step
    submitted and reaped on the calling thread (see the module doc)."""

    name = "aio"

    def __init__(self, threads: int = 32, preadv: Preadv | None = None):
        super().__init__(threads, preadv)
        self._ctx = aio.AioContext()
        self._init_direct()

    def read_batch(self, jobs: list[Job]) -> ReadStats:
        plans, arena = self._plan(jobs)
        addr = self._arena.address()
        # (plan index, row, bytes done): a short completion is submitted again for the rest
        pending = [(p, r, 0) for p, plan in enumerate(plans) for r in range(len(plan[3]))]
        stats = ReadStats()
        while pending:
            again = []
            for k in range(0, len(pending), self._ctx.events):
                part = pending[k:k + self._ctx.events]
                reqs = []
                for p, r, done in part:
                    _, dfd, align, _, _, ext = plans[p]
                    at = done - done % align
                    reqs.append((dfd, addr + int(ext.slot[r]) + at, int(ext.length[r]) - at, int(ext.start[r]) + at))
                stats.calls += len(reqs)
                again += self._reaped(plans, part, reqs, self._ctx.read_round(reqs))
            pending = again
        for job, _, _, first, inv, ext in plans:
            self._copy_out(arena, job, first, ext, 0, len(first))
            _fill_duplicates(job, first, inv)
        return stats

    @staticmethod
    def _reaped(plans, part, reqs, results) -> list[tuple[int, int, int]]:
        again, error = [], None
        for k, res in results:
            p, r, done = part[k]
            ext, off = plans[p][5], reqs[k][3]
            if res < 0:
                error = error or OSError(-res, f"AIO read at offset {off}: {os.strerror(-res)}")
            elif off - int(ext.start[r]) + res <= done:  # nothing new: end of file
                error = error or ShortReadError(errno.EIO, f"short AIO read at offset {off}: {res} bytes")
            elif off - int(ext.start[r]) + res < int(ext.need[r]):
                again.append((p, r, off - int(ext.start[r]) + res))
        if error is not None:
            raise error
        return again

    def close(self) -> None:
        self._ctx.close()
        self._close_direct()


class UringReader(Reader):
    """io_uring READV of every row of the step in one submit, on one persistent ring."""

    name = "uring"

    def __init__(self, threads: int = 32, preadv: Preadv | None = None):
        super().__init__(threads, preadv)
        self._ring = uring.Ring()

    def read_batch(self, jobs: list[Job]) -> ReadStats:
        prepared, reqs = [], []
        for job in jobs:
            uniq, first, inv = unique_rows(job)
            flat, rb = memoryview(job.out).cast("B"), job.row_bytes
            reqs += [(job.fd, flat[i * rb:(i + 1) * rb], off) for i, off in zip(first.tolist(), uniq.tolist())]
            prepared.append((job, first, inv))
        stats = ReadStats(calls=self._ring.read_all(reqs))
        for job, first, inv in prepared:
            _fill_duplicates(job, first, inv)
        return stats

    def close(self) -> None:
        self._ring.close()


def _open_read_close(path: str, view: memoryview, off: int, random: bool) -> int:
    """One chunk, zarr-style: open, (fadvise RANDOM), lseek, read() until whole, close;
    returns the read() calls."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        if random:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        os.lseek(fd, off, os.SEEK_SET)
        calls = done = 0
        while done < len(view):
            chunk = os.read(fd, len(view) - done)
            calls += 1
            if not chunk:
                raise ShortReadError(errno.EIO, f"short read at offset {off}: {done} of {len(view)} bytes ({path})")
            view[done:done + len(chunk)] = chunk
            done += len(chunk)
        return calls
    finally:
        os.close(fd)


class ReadReader(Reader):
    """open / lseek / read() / close per row on the calling thread (see the module doc)."""

    name = "read"

    def __init__(self, threads: int = 32, preadv: Preadv | None = None):
        super().__init__(threads, preadv)
        self._paths: dict[int, tuple[tuple[int, int], str]] = {}  # fd -> ((dev, ino), path)

    def prepare(self, fd: int, populate: bool = False) -> None:
        self._path(fd)

    def _path(self, fd: int) -> str:
        """The path that opens the file ``fd`` is open on (checked by identity)."""
        st = os.fstat(fd)
        ident = (st.st_dev, st.st_ino)
        have = self._paths.get(fd)
        if have is not None and have[0] == ident:
            return have[1]
        path = os.readlink(f"/proc/self/fd/{fd}")
        try:
            again = os.stat(path)
        except OSError:
            again = None
        if again is None or (again.st_dev, again.st_ino) != ident:
            raise ReaderUnavailable(f"the read reader opens the table by name for every chunk, and {path} "
                                    f"no longer names the open table (renamed or deleted)")
        self._paths[fd] = (ident, path)
        return path

    def read_batch(self, jobs: list[Job]) -> ReadStats:
        stats = ReadStats()
        for job in jobs:
            uniq, first, inv = unique_rows(job)
            path, rb = self._path(job.fd), job.row_bytes
            flat = memoryview(job.out).cast("B")
            for i, off in zip(first.tolist(), uniq.tolist()):
                stats.calls += _open_read_close(path, flat[i * rb:(i + 1) * rb], off, self.random)
            _fill_duplicates(job, first, inv)
        return stats


def make_reader(name: str, threads: int = 32, *, preadv: Preadv | None = None) -> Reader:
    """A reader by name (one of :data:`READERS`).  A reader that cannot run on this host
    (io_uring disabled, the liburing package missing) raises :class:`ReaderUnavailable`."""
    cls = {"pool": PoolReader, "nowait": NowaitReader, "serial": SerialReader,
           "mmap": MmapReader, "mmap-pool": MmapPoolReader, "uring": UringReader,
           "direct": DirectReader, "read": ReadReader, "aio": AioReader}.get(name)
    if cls is None:
        raise ValueError(f"unknown reader {name!r}; choose one of {', '.join(READERS)}")
    return cls(threads, preadv)


def check_reader(name: str, path: str | os.PathLike) -> None:
    """Raise :class:`ReaderUnavailable` (one line) if reader ``name`` cannot read the table at
    ``path`` here: sets the reader up (an io_uring, an AIO context) and opens the table as it
    would (O_DIRECT), reads nothing."""
    fd = open_table(path)
    try:
        with make_reader(name, threads=1) as rdr:
            if name not in MMAP_READERS:  # a mapping of the table is not a check
                rdr.prepare(fd)
    finally:
        os.close(fd)

