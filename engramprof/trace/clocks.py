"""The three clocks a bundle records at its start and end, read together.

Every timestamp in a bundle is CLOCK_MONOTONIC, which is per boot and per host.  To line up
bundles recorded on different hosts (one per tensor-parallel rank), ``meta.json`` holds::

    "clocks": {
      "start": {"monotonic_ns", "realtime_ns", "boottime_ns", "read_ns"},
      "end":   {...the same, at close},
      "boot_id": "...",                   # /proc/sys/kernel/random/boot_id: same boot, same monotonic clock
      "ntp": {"synchronized", "esterror_us", "maxerror_us"}   # adjtimex(2), at start
    }

``read_ns`` is how long the three reads took together (monotonic read twice, around the other
two): the skew of one reading.  ``ntp`` is what the kernel's time discipline (chrony / ntpd /
systemd-timesyncd through adjtimex) estimates for CLOCK_REALTIME's error; null where adjtimex
cannot be read.  ``engramprof compare`` aligns bundles by these (docs/commands/compare.md).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import time

_STA_UNSYNC = 0x0040
_TIME_ERROR = 5


class _Timex(ctypes.Structure):
    # struct timex (x86_64 / aarch64 glibc): the fields used here come first
    _fields_ = [("modes", ctypes.c_uint), ("offset", ctypes.c_long), ("freq", ctypes.c_long),
                ("maxerror", ctypes.c_long), ("esterror", ctypes.c_long), ("status", ctypes.c_int),
                ("constant", ctypes.c_long), ("precision", ctypes.c_long), ("tolerance", ctypes.c_long),
                ("time_sec", ctypes.c_long), ("time_usec", ctypes.c_long), ("tick", ctypes.c_long),
                ("ppsfreq", ctypes.c_long), ("jitter", ctypes.c_long), ("shift", ctypes.c_int),
                ("stabil", ctypes.c_long), ("jitcnt", ctypes.c_long), ("calcnt", ctypes.c_long),
                ("errcnt", ctypes.c_long), ("stbcnt", ctypes.c_long), ("tai", ctypes.c_int),
                ("_pad", ctypes.c_int * 11)]


def read_now() -> dict:
    """CLOCK_MONOTONIC, CLOCK_REALTIME and CLOCK_BOOTTIME read together (ns), and the span
    of the reading."""
    m0 = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    rt = time.clock_gettime_ns(time.CLOCK_REALTIME)
    bt = time.clock_gettime_ns(time.CLOCK_BOOTTIME)
    m1 = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    return {"monotonic_ns": (m0 + m1) // 2, "realtime_ns": rt, "boottime_ns": bt, "read_ns": m1 - m0}


def ntp_state() -> dict | None:
    """adjtimex(2) with no change requested: the kernel's estimated and maximum error of
    CLOCK_REALTIME (µs) and whether it is synchronised; None where it cannot be read."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        tx = _Timex()
        state = libc.adjtimex(ctypes.byref(tx))
    except (OSError, AttributeError):
        return None
    if state < 0:
        return None
    return {"synchronized": not (tx.status & _STA_UNSYNC) and state != _TIME_ERROR,
            "esterror_us": int(tx.esterror), "maxerror_us": int(tx.maxerror)}


def boot_id() -> str | None:
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return f.read().strip() or None
    except OSError:
        return None


def start_record() -> dict:
    """The ``clocks`` object of a new bundle (``end`` is added at close)."""
    return {"start": read_now(), "boot_id": boot_id(), "ntp": ntp_state()}
