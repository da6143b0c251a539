"""The in-flight bio table the fault and syscall probes share (probes/bios.h): its text and its
constants.

:func:`inline` puts bios.h into a probe's program text (as :func:`engramprof.bpf.targets.inline`
does targets.h); :func:`defines` gives its -D constants: the slot count (a power of two) and how
long a slot may be held before a new bio takes it over (a completion never seen).
"""
from __future__ import annotations

from functools import lru_cache

from engramprof.bpf import structs as layout
from engramprof.host import btf as kbtf

#: slots of the direct-mapped table (a power of two): 40 bytes each, 640 KiB a probe
BIO_SLOTS = 16384
#: a slot held longer than this (its completion never seen) is taken over by a new bio
BIO_STALE_NS = 10_000_000_000


def inline(src: str) -> str:
    return src.replace('#include "bios.h"', (layout.probe_dir() / "bios.h").read_text())


#: what the raw completion hooks read (probes/bios.h): macro -> (struct, member path, bytes), the
#: fields the block_rq_complete / block_bio_complete tracepoints take their dev and sector from
COMPLETION_FIELDS = {
    "OFF_RQ_SECTOR": ("request", "__sector", 8),
    "OFF_RQ_Q": ("request", "q", 8),
    "OFF_Q_DISK": ("request_queue", "disk", 8),
    "OFF_DISK_MAJOR": ("gendisk", "major", 4),
    "OFF_DISK_MINOR": ("gendisk", "first_minor", 4),
    "OFF_BIO_BDEV": ("bio", "bi_bdev", 8),
    "OFF_BIO_SECTOR": ("bio", "bi_iter.bi_sector", 8),
    "OFF_BDEV_DEV": ("block_device", "bd_dev", 4),
}


@lru_cache(maxsize=2)
def completion_offsets(path: str = kbtf.VMLINUX) -> dict[str, int] | None:
    """The byte offsets of :data:`COMPLETION_FIELDS` in the running kernel (its BTF); None when
    the kernel has no BTF or a field is missing or of another size (the classic hooks then)."""
    try:
        btf = kbtf.load(path)
    except (OSError, ValueError):
        return None
    out = {}
    for macro, (sname, member, size) in COMPLETION_FIELDS.items():
        got = btf.member_path(sname, member)
        if got is None or got[1] != size:
            return None
        out[macro] = got[0]
    return out


def defines(slots: int = BIO_SLOTS, stale_ns: int = BIO_STALE_NS, sector_once: bool = False,
            raw_completion: bool = True) -> dict[str, int]:
    """``sector_once``: the probe's bios are page-cache reads, of which no two read one sector at
    once, so a slot held by the same sector's earlier bio (its completion unseen) is taken over.
    ``raw_completion``: the completion hooks are raw tracepoints where the kernel's BTF gives the
    fields they read (BIO_RAW_COMPLETION: a raw tracepoint's program is skipped only when it is
    itself running on that CPU, not whenever another BPF program is: engramprof/bpf/progstats.py)."""
    if slots < 1 or slots & (slots - 1):
        raise ValueError(f"bio slots must be a power of two, not {slots}")
    if stale_ns >> 20 < 1:
        raise ValueError(f"bio stale bound {stale_ns} ns is under the table's 2^20 ns tick")
    offs = completion_offsets() if raw_completion else None
    return {"BIO_SLOTS": slots, "BIO_STALE_NS": stale_ns, "BIO_SECTOR_ONCE": int(sector_once),
            "BIO_RAW_COMPLETION": int(offs is not None), **(offs or {})}
