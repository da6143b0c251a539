"""io_uring for the lab's ``uring`` reader, through the ``liburing`` PyPI package (a binding of
C liburing; x86-64 Linux wheels): one persistent ring per reader, like sglang's safetensors
reader.  Each step prepares one ``IORING_OP_READV`` SQE per row (one iovec: a buffer of the
ring's, one per SQE slot and row size, made once; the row is copied into the job's output
array when its CQE is reaped: the binding's ``Iovec`` never releases the buffer it is given,
so an iovec on the job's array would keep every step's array alive), submits them all with one
``io_uring_submit_and_wait`` (a single ``io_uring_enter`` that waits for every completion)
and reaps the CQEs.  A step with more rows than the ring has entries is submitted in rounds
of :data:`ENTRIES`.  Reads are buffered (no O_DIRECT): a cached row completes inline, a cold
one goes async (ext4's async buffered reads, or an io-wq worker).

Only a safe subset of the binding is used: ``cqe[0]`` after each ``io_uring_wait_cqe`` (its
``cqe[i]`` is raw pointer arithmetic that does not wrap around the ring), and a failed CQE's
``res`` (the binding raises OSError for a negative one) is caught and the CQE still marked seen.
"""
from __future__ import annotations

import errno
import os

from engramprof.lab.rowio import ReaderUnavailable, ShortReadError

ENTRIES = 1024
IO_URING_DISABLED = "/proc/sys/kernel/io_uring_disabled"


def _lib():
    try:
        import liburing
    except ImportError:
        raise ReaderUnavailable("the uring reader needs the liburing package (pip install liburing; "
                                "wheels for x86-64 Linux)", code=1) from None
    return liburing


def _disabled_setting() -> str | None:
    try:
        with open(IO_URING_DISABLED) as f:
            return f.read().strip()
    except OSError:
        return None


def setup_error(err: int) -> ReaderUnavailable:
    """The one line for an ``io_uring_setup`` that failed with ``err``."""
    setting = _disabled_setting()
    if err == errno.EPERM and setting in ("1", "2"):
        why = ("io_uring is disabled on this host" if setting == "2" else
               "io_uring is limited to the group in kernel.io_uring_group and to CAP_SYS_ADMIN")
        return ReaderUnavailable(f"the uring reader cannot set up an io_uring: kernel.io_uring_disabled = {setting} "
                                 f"({why}); use another --reader", code=1)
    if err == errno.EPERM:  # io_uring allowed by the kernel: a seccomp filter refused the call
        return ReaderUnavailable("the uring reader cannot set up an io_uring: io_uring_setup: Operation not permitted "
                                 f"(kernel.io_uring_disabled = {setting or '?'}, so a seccomp filter refuses io_uring "
                                 "here: container runtimes' default profiles do); use another --reader", code=1)
    if err == errno.ENOSYS:
        return ReaderUnavailable("the uring reader cannot set up an io_uring: this kernel has no io_uring "
                                 "(io_uring_setup: ENOSYS); use another --reader", code=1)
    return ReaderUnavailable(f"the uring reader cannot set up an io_uring: io_uring_setup: {os.strerror(err)}"
                             + (f" (kernel.io_uring_disabled = {setting})" if setting not in (None, "0") else ""),
                             code=1)


class Ring:
    """One io_uring instance of :data:`ENTRIES` SQ entries."""

    def __init__(self, entries: int = ENTRIES):
        self.lib = lib = _lib()
        self.entries = entries
        self.ring, self.cqe = lib.Ring(), lib.Cqe()
        #: read size -> [(buffer, its Iovec)], one per SQE slot: made once and reused
        self._iovs: dict[int, list[tuple[bytearray, object]]] = {}
        try:
            lib.io_uring_queue_init(entries, self.ring)
        except OSError as exc:
            raise setup_error(exc.errno) from None
        self.open = True

    @property
    def fd(self) -> int:
        return self.ring.ring_fd

    def read_all(self, reqs: list[tuple[int, memoryview, int]]) -> int:
        """Read every (fd, buffer, file offset) request into its buffer, whole: one submit of
        all of them (per round of :attr:`entries`) and a wait for every completion; a partial
        read is submitted again for the rest.  Returns the SQEs submitted."""
        if not self.open:
            raise ValueError("the uring reader is closed")
        sqes, pending = 0, list(reqs)
        while pending:
            again: list[tuple[int, memoryview, int]] = []
            for k in range(0, len(pending), self.entries):
                again += self._round(pending[k:k + self.entries])
                sqes += min(self.entries, len(pending) - k)
            pending = again
        return sqes

    def _round(self, reqs: list[tuple[int, memoryview, int]]) -> list[tuple[int, memoryview, int]]:
        lib, ring = self.lib, self.ring
        slots = []
        for k, (fd, buf, off) in enumerate(reqs):
            sqe = lib.io_uring_get_sqe(ring)
            slot, iov = self._iov(k, len(buf))
            slots.append(slot)
            lib.io_uring_prep_readv(sqe, fd, iov, off)
            lib.io_uring_sqe_set_data64(sqe, k)
        lib.io_uring_submit_and_wait(ring, len(reqs))
        again, error = [], None
        for _ in range(len(reqs)):  # every CQE is reaped, even after a failure: they write into out
            k, res = self._next_cqe()
            fd, buf, off = reqs[k]
            if res < 0:
                error = error or OSError(-res, f"io_uring read at offset {off}: {os.strerror(-res)}")
            elif res == 0:
                error = error or ShortReadError(errno.EIO, f"short io_uring read at offset {off}: "
                                                f"0 of {len(buf)} bytes (fd {fd})")
            else:
                buf[:res] = slots[k][:res]
                if res < len(buf):
                    again.append((fd, buf[res:], off + res))
        if error is not None:
            raise error
        return again

    def _iov(self, k: int, size: int) -> tuple[bytearray, object]:
        """SQE slot ``k``'s buffer of ``size`` bytes and its Iovec.  The binding's Iovec never
        releases the buffer it is given (a memoryview of the job's array pinned that array:
        the reader grew by every step's output, and the reclaim scenario's memory cgroup
        OOM-killed it), so each is made once and the row is copied out of it."""
        pool = self._iovs.setdefault(size, [])
        while len(pool) <= k:
            b = bytearray(size)
            pool.append((b, self.lib.Iovec([b])))
        return pool[k]

    def _next_cqe(self) -> tuple[int, int]:
        lib = self.lib
        while True:
            try:
                lib.io_uring_wait_cqe(self.ring, self.cqe)
                break
            except InterruptedError:
                continue
        c = self.cqe[0]
        k = c.user_data
        try:
            res = c.res
        except OSError as exc:  # the binding raises for a negative res
            res = -(exc.errno or errno.EIO)
        lib.io_uring_cqe_seen(self.ring, c)
        return k, res

    def close(self) -> None:
        if self.open:
            self.open = False
            self.lib.io_uring_queue_exit(self.ring)
