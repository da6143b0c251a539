"""cachestat(2) through ctypes: the one wrapper (residency's; doctor probes it too).

Linux 6.5+ has the syscall (451 on every architecture: the unified syscall table); neither
libc nor Python wraps it.  Stdlib only, so ``engramprof doctor`` can use it on a machine
whose numpy is broken.
"""
from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass

SYS_CACHESTAT = 451


class _CachestatRange(ctypes.Structure):
    _fields_ = [("off", ctypes.c_uint64), ("len", ctypes.c_uint64)]


class _Cachestat(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint64) for n in
                ("nr_cache", "nr_dirty", "nr_writeback", "nr_evicted", "nr_recently_evicted")]


_syscall = ctypes.CDLL(None, use_errno=True).syscall
_syscall.restype = ctypes.c_long


@dataclass
class CacheStat:
    """What cachestat(2) reports for a range, in pages."""

    nr_cache: int
    nr_dirty: int
    nr_writeback: int
    nr_evicted: int
    nr_recently_evicted: int


def cachestat(fd: int, off: int = 0, length: int = 0) -> CacheStat:
    """cachestat(2) of ``[off, off+length)`` of ``fd`` (``length=0``: to the end of the file).

    Raises OSError (ENOSYS on kernels without it, EPERM for files the caller may not inspect).
    """
    rng, cs = _CachestatRange(off, length), _Cachestat()
    r = _syscall(ctypes.c_long(SYS_CACHESTAT), ctypes.c_uint(fd), ctypes.byref(rng),
                 ctypes.byref(cs), ctypes.c_uint(0))
    if r != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    return CacheStat(*(getattr(cs, n) for n, _ in _Cachestat._fields_))
