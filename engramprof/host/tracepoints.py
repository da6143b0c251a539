"""Every kernel tracepoint engramprof uses, and what each one is for.

REQUIRED: without these ``engramprof syscalls`` cannot run.  EVIDENCE: each adds one kind of
per-call evidence; when one is missing the probe is built without it and the trace says which
evidence columns are absent.  Tracepoints only: kprobes/fentry are not assumed (KERNEL.md).
"""
from __future__ import annotations

import os
from pathlib import Path

TRACEFS_CANDIDATES = ("/sys/kernel/tracing", "/sys/kernel/debug/tracing")

REQUIRED = {
    "syscalls:sys_enter_preadv2": "call entry: fd, offset, iovecs, RWF flags",
    "syscalls:sys_exit_preadv2": "call exit: bytes read or -errno, latency",
}
SYSCALL_VARIANTS = {
    "syscalls:sys_enter_preadv": "preadv entry",
    "syscalls:sys_exit_preadv": "preadv exit",
    "syscalls:sys_enter_pread64": "pread64 entry",
    "syscalls:sys_exit_pread64": "pread64 exit",
    "syscalls:sys_enter_read": "read() entry (a regular file's read: the file position is the offset)",
    "syscalls:sys_exit_read": "read() exit",
    "syscalls:sys_enter_readv": "readv() entry",
    "syscalls:sys_exit_readv": "readv() exit",
}
EVIDENCE = {
    "filemap:mm_filemap_add_to_page_cache": "page-cache insertions (misses) inside a call",
    "block:block_bio_queue": "bios queued by the reading thread",
    "block:block_bio_backmerge": "bio merged into an earlier request (not matched)",
    "block:block_rq_complete": "request completion: bio queue -> complete time",
    "vmscan:mm_vmscan_direct_reclaim_begin": "direct reclaim inside a call",
    "vmscan:mm_vmscan_direct_reclaim_end": "direct reclaim inside a call",
    "vmscan:mm_vmscan_memcg_reclaim_begin": "memcg reclaim inside a call",
    "vmscan:mm_vmscan_memcg_reclaim_end": "memcg reclaim inside a call",
    "vmscan:mm_vmscan_kswapd_wake": "kswapd wake spans",
    "vmscan:mm_vmscan_kswapd_sleep": "kswapd sleep spans",
    "sched:sched_switch": "off-CPU time inside a call",
    "sched:sched_wakeup": "run-queue wait inside a call",
}
ALL = {**REQUIRED, **SYSCALL_VARIANTS, **EVIDENCE}


def candidates() -> tuple[str, ...]:
    """Where tracefs is looked for: TRACEFS_CANDIDATES, or the colon-separated list in
    ``ENGRAMPROF_TRACEFS`` (tests point it at a directory that does not exist)."""
    env = os.environ.get("ENGRAMPROF_TRACEFS")
    return tuple(c for c in env.split(":") if c) if env else TRACEFS_CANDIDATES


_default_candidates = candidates


def tracefs_root(candidates=None) -> Path | None:
    for c in (_default_candidates() if candidates is None else candidates):
        if os.path.isdir(os.path.join(c, "events")):
            return Path(c)
    return None


def available(name: str, root: Path | None = None) -> bool:
    root = root or tracefs_root()
    if root is None:
        return False
    cat, ev = name.split(":", 1)
    return (root / "events" / cat / ev / "format").is_file()
