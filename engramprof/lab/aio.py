"""Linux native AIO (libaio's syscalls, called with ctypes: no libaio package needed) for the
lab's ``aio`` reader: ``io_setup`` once, then per step ``io_submit`` of one ``IOCB_CMD_PREAD``
iocb per row (on an O_DIRECT fd, as DiskANN does: without O_DIRECT ``io_submit`` reads
synchronously) and ``io_getevents`` until every one has completed; ``io_destroy`` at close.

``struct iocb`` and ``struct io_event`` are the kernel's (include/uapi/linux/aio_abi.h, the
little-endian layout).  A request is at most :data:`CTX_EVENTS` iocbs at a time; a larger step
is submitted in rounds of that many, each one reaped whole before the next.
"""
from __future__ import annotations

import ctypes
import errno
import os
import platform

from engramprof.lab.rowio import ReaderUnavailable

CTX_EVENTS = 1024
IOCB_CMD_PREAD = 0
# (io_setup, io_destroy, io_getevents, io_submit)
_SYSCALLS = {"x86_64": (206, 207, 208, 209), "aarch64": (0, 1, 4, 2)}


class Iocb(ctypes.Structure):
    _fields_ = [("aio_data", ctypes.c_uint64), ("aio_key", ctypes.c_uint32), ("aio_rw_flags", ctypes.c_int32),
                ("aio_lio_opcode", ctypes.c_uint16), ("aio_reqprio", ctypes.c_int16),
                ("aio_fildes", ctypes.c_uint32), ("aio_buf", ctypes.c_uint64), ("aio_nbytes", ctypes.c_uint64),
                ("aio_offset", ctypes.c_int64), ("aio_reserved2", ctypes.c_uint64), ("aio_flags", ctypes.c_uint32),
                ("aio_resfd", ctypes.c_uint32)]


class IoEvent(ctypes.Structure):
    _fields_ = [("data", ctypes.c_uint64), ("obj", ctypes.c_uint64), ("res", ctypes.c_int64),
                ("res2", ctypes.c_int64)]


_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long


def _nrs() -> tuple[int, int, int, int]:
    nrs = _SYSCALLS.get(platform.machine())
    if nrs is None:
        raise ReaderUnavailable(f"the aio reader knows the AIO syscall numbers of {', '.join(_SYSCALLS)} only, "
                                f"not {platform.machine()}", code=1)
    return nrs


class AioContext:
    """One kernel AIO context (``aio_context_t``) of :data:`CTX_EVENTS` events."""

    def __init__(self, events: int = CTX_EVENTS):
        self._setup, self._destroy, self._getevents, self._submit = _nrs()
        self.events = events
        self.ctx = ctypes.c_ulong(0)
        if _syscall(ctypes.c_long(self._setup), ctypes.c_uint(events), ctypes.byref(self.ctx)) != 0:
            err = ctypes.get_errno()
            hint = {errno.EAGAIN: " (fs.aio-max-nr reached: see /proc/sys/fs/aio-nr)",
                    errno.ENOSYS: " (this kernel has no AIO: CONFIG_AIO is off)"}.get(err, "")
            raise ReaderUnavailable(f"the aio reader cannot set up an AIO context: io_setup: "
                                    f"{os.strerror(err)}{hint}", code=1)
        self._iocbs = (Iocb * events)()
        self._ptrs = (ctypes.POINTER(Iocb) * events)(*[ctypes.pointer(c) for c in self._iocbs])
        self._evs = (IoEvent * events)()

    def read_round(self, reqs: list[tuple[int, int, int, int]]) -> list[tuple[int, int]]:
        """Submit one PREAD per (fd, buffer address, length, file offset), at most
        :attr:`events` of them, and wait for all; returns (request index, result) per completion
        (a negative result is -errno)."""
        n = len(reqs)
        if not 0 < n <= self.events:
            raise ValueError(f"an AIO round is 1..{self.events} requests, not {n}")
        for k, (fd, addr, length, off) in enumerate(reqs):
            c = self._iocbs[k]
            ctypes.memset(ctypes.addressof(c), 0, ctypes.sizeof(Iocb))
            c.aio_data, c.aio_lio_opcode, c.aio_fildes = k, IOCB_CMD_PREAD, fd
            c.aio_buf, c.aio_nbytes, c.aio_offset = addr, length, off
        submitted = 0
        while submitted < n:  # io_submit may take fewer than asked
            got = _syscall(ctypes.c_long(self._submit), self.ctx, ctypes.c_long(n - submitted),
                           ctypes.byref(self._ptrs, submitted * ctypes.sizeof(ctypes.c_void_p)))
            if got < 0:
                err = ctypes.get_errno()
                if err == errno.EINTR:
                    continue
                if submitted:  # reap what is in flight before raising: it writes into the arena
                    self._reap(submitted)
                raise OSError(err, f"io_submit: {os.strerror(err)}")
            submitted += got
        return self._reap(n)

    def _reap(self, n: int) -> list[tuple[int, int]]:
        out: list[tuple[int, int]] = []
        while len(out) < n:
            want = n - len(out)
            got = _syscall(ctypes.c_long(self._getevents), self.ctx, ctypes.c_long(want), ctypes.c_long(want),
                           self._evs, None)
            if got < 0:
                err = ctypes.get_errno()
                if err == errno.EINTR:
                    continue
                raise OSError(err, f"io_getevents: {os.strerror(err)}")
            out.extend((int(self._evs[i].data), int(self._evs[i].res)) for i in range(got))
        return out

    def close(self) -> None:
        if self.ctx.value:
            _syscall(ctypes.c_long(self._destroy), self.ctx)
            self.ctx = ctypes.c_ulong(0)
