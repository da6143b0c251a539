"""The in-flight bio table the fault and syscall probes share (probes/bios.h): its text and its
constants.

:func:`inline` puts bios.h into a probe's program text (as :func:`engramprof.bpf.targets.inline`
does targets.h); :func:`defines` gives its -D constants: the slot count (a power of two) and how
long a slot may be held before a new bio takes it over (a completion never seen).
"""
from __future__ import annotations

from engramprof.bpf import structs as layout

#: slots of the direct-mapped table (a power of two): 40 bytes each, 640 KiB a probe
BIO_SLOTS = 16384
#: a slot held longer than this (its completion never seen) is taken over by a new bio
BIO_STALE_NS = 10_000_000_000


def inline(src: str) -> str:
    return src.replace('#include "bios.h"', (layout.probe_dir() / "bios.h").read_text())


def defines(slots: int = BIO_SLOTS, stale_ns: int = BIO_STALE_NS, sector_once: bool = False) -> dict[str, int]:
    """``sector_once``: the probe's bios are page-cache reads, of which no two read one sector at
    once, so a slot held by the same sector's earlier bio (its completion unseen) is taken over."""
    if slots < 1 or slots & (slots - 1):
        raise ValueError(f"bio slots must be a power of two, not {slots}")
    if stale_ns >> 20 < 1:
        raise ValueError(f"bio stale bound {stale_ns} ns is under the table's 2^20 ns tick")
    return {"BIO_SLOTS": slots, "BIO_STALE_NS": stale_ns, "BIO_SECTOR_ONCE": int(sector_once)}
