"""Allocation policy for large arrays: small pages, no direct compaction, free heap handed back.

NumPy asks the kernel for transparent huge pages (``madvise(MADV_HUGEPAGE)``) on every large
array.  Where THP ``defrag`` is ``madvise`` (the default of many distributions, and of the
hosts here), such a fault may compact memory synchronously: measured here, filling a fresh
800 MB array took 2.3 s with NumPy's huge-page advice and 0.41 s without (benchmarks/
RESULTS.md).  The hosts engramprof diagnoses are the memory-starved ones, where compaction is
slowest, and the analysis's arrays are read once: huge pages buy nothing.  The command line
turns the advice off for its own process; nothing here touches the traced process.

glibc's malloc raises its mmap threshold each time a large block is freed, so that the
analysis's per-chunk arrays (2 MB each, on two threads) come from the heaps, and stay there
once freed: after the attribution pass of a 10M-call trace ~125 MB of free heap was still
resident, under every later stage.  :func:`release_free_heap` hands it back between stages.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os


def prefer_small_pages() -> bool:
    """Stop NumPy advising huge pages for this process's arrays; True when it took effect."""
    os.environ.setdefault("NUMPY_MADVISE_HUGEPAGE", "0")  # numpy reads it at import
    try:
        import numpy as np

        setter = getattr(getattr(np, "_core", None), "multiarray", None)
        setter = getattr(setter, "_set_madvise_hugepage", None) or getattr(np.core.multiarray,
                                                                           "_set_madvise_hugepage", None)
        if setter is None:
            return False
        setter(os.environ.get("NUMPY_MADVISE_HUGEPAGE") != "0")
        return True
    except Exception:  # an older or newer numpy without the switch: keep its default
        return False


_LIBC: list = []


def release_free_heap() -> bool:
    """Give free heap memory back to the kernel (glibc's ``malloc_trim(0)``: a few ms); True
    when it ran.  A no-op where the C library has no malloc_trim (musl, macOS)."""
    if not _LIBC:
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            _LIBC.append(getattr(libc, "malloc_trim", None))
        except OSError:
            _LIBC.append(None)
    trim = _LIBC[0]
    if trim is None:
        return False
    trim(0)
    return True
