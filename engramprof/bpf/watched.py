"""The watched-file set of the page-cache and eviction probes from user space (probes/watched.h).

Each probe keeps a ``watched_files`` hash (device + inode) and, in front of it, ``watched_bits``:
``WATCH_BITS`` array slots indexed by :func:`watch_bit`.  A probe tests the slot first and looks
in the hash only when it is set, so every key put into the hash must have its slot set, or that
file's pages are never recorded: :meth:`WatchedFiles.add` does both, the hash first.  Slots are
never cleared (nothing removes a watched file; a collision only costs the hash lookup).

:func:`watch_bit` is the C function of probes/watched.h written in Python: murmur3's 64-bit
finalizer of ``(dev << 32) ^ ino``, masked to ``WATCH_BITS - 1``.  The two must agree
(tests/test_watched_bits.py computes many pairs in a BPF test program and compares).
"""
from __future__ import annotations

import ctypes

from engramprof.bpf import structs as layout

HEADER = "watched.h"
#: slots of ``watched_bits`` (a power of two; 8 bytes each in the kernel: 512 KiB)
WATCH_BITS = 1 << 16
_M64 = (1 << 64) - 1


def watch_bit(dev: int, ino: int, bits: int = WATCH_BITS) -> int:
    """The ``watched_bits`` slot of (kernel dev_t, inode): probes/watched.h's watch_bit()."""
    x = (((int(dev) & 0xFFFFFFFF) << 32) ^ int(ino)) & _M64
    x ^= x >> 33
    x = (x * 0xFF51AFD7ED558CCD) & _M64
    x ^= x >> 33
    x = (x * 0xC4CEB9FE1A85EC53) & _M64
    x ^= x >> 33
    return x & (bits - 1)


def check_bits(bits: int) -> int:
    if bits < 1 or bits & (bits - 1) or bits > 1 << 31:
        raise ValueError(f"WATCH_BITS must be a power of two up to 2^31, not {bits}")
    return bits


def inline(src: str) -> str:
    """The probe's source with probes/watched.h pasted in place of its #include."""
    marker = f'#include "{HEADER}"'
    return src.replace(marker, (layout.probe_dir() / HEADER).read_text()) if marker in src else src


class WatchedFiles:
    """A loaded probe's ``watched_files`` hash and ``watched_bits`` slots, filled together."""

    def __init__(self, bpf, bits: int = WATCH_BITS):
        self.files = bpf["watched_files"]
        self.slots = bpf["watched_bits"]
        self.bits = check_bits(bits)

    def add(self, dev: int, ino: int) -> None:
        """Watch (dev, ino): the hash key, then its slot.  Raises when the hash is full."""
        k = self.files.Key()
        k.dev, k.ino = int(dev), int(ino)
        self.files[k] = ctypes.c_uint8(1)
        self.slots[ctypes.c_uint32(watch_bit(dev, ino, self.bits))] = ctypes.c_uint8(1)
