"""Build, feature-probe and load the page-fault probe (probes/faults.bpf.c) with BCC.

The same scheme as :mod:`engramprof.bpf.syscalls` (constants filled in before load, tracepoints
probed in tracefs first, evidence hooks compiled out when missing), for a second, independent
BPF object: it can be loaded beside the preadv probe or alone.
"""
from __future__ import annotations

import ctypes
import os
import time
from dataclasses import dataclass, field

import numpy as np

from engramprof.bpf import bios, targets
from engramprof.bpf import structs as layout
from engramprof.bpf.base import LoadedBpf, compile_program, import_bcc
from engramprof.bpf.syscalls import EVIDENCE_FEATURES
from engramprof.bpf.ringbuf import RingBufferReader
from engramprof.bpf.sched import _tid_words, attach_all, deferred_bpf
from engramprof.errors import UserError
from engramprof.host import tracepoints as tp

PROBE_FILE = "faults.bpf.c"

#: without it there is no file-backed fault to see (Linux 6.x generic filemap tracepoint)
REQUIRED = ("filemap:mm_filemap_fault", "raw_syscalls:sys_enter")
FEATURES = {
    "HAVE_MAP_PAGES": ["filemap:mm_filemap_map_pages"],
    "HAVE_PFU": ["exceptions:page_fault_user"],  # x86 only: entry time + address
    "HAVE_RSEQ": ["rseq:rseq_update"],
    "HAVE_FILEMAP_ADD": ["filemap:mm_filemap_add_to_page_cache"],
    # the kernel's major-fault rule (docs/model.md "Page faults: one fault, major or minor")
    "HAVE_MMAP_LOCK": ["mmap_lock:mmap_lock_acquire_returned", "mmap_lock:mmap_lock_released"],
    "HAVE_RA": ["readahead:page_cache_async_ra", "readahead:page_cache_sync_ra",
                "readahead:page_cache_ra_order", "readahead:page_cache_ra_unbounded"],
    "HAVE_PROC_EXIT": ["sched:sched_process_exit"],
    # a syscall's faults on the target's mappings (x86, with HAVE_PFU): the kernel counts them too
    "HAVE_PFK": ["exceptions:page_fault_kernel"],
    **EVIDENCE_FEATURES,
}
FEATURE_COLUMNS = {
    "HAVE_FILEMAP_ADD": ["pages_added"],
    "HAVE_BIO": ["bio_count", "bio_ns"],
    "HAVE_SCHED": ["offcpu_ns", "runq_ns"],
    "HAVE_MAP_PAGES": ["mapped_pages"],
}


def required_available(tracefs_root=None) -> bool:
    """True when this kernel can trace file-backed faults at all (doctor, syscalls)."""
    root = tracefs_root if tracefs_root is not None else tp.tracefs_root()
    return root is not None and all(tp.available(n, root) for n in REQUIRED)


@dataclass
class FaultProbeConfig:
    tgid: int
    tid: int = 0
    ring_pages: int = 4096  # 16 MiB: ~150k faults
    tid_words: int = field(default_factory=_tid_words)  # the switched-out bitmap covers every tid
    use_pfu: bool = True  # False forces the generic path (no exceptions:page_fault_user)
    selection: object = None  # engramprof.target.selection.Selection; None: the one process tgid
    bio_slots: int = bios.BIO_SLOTS  # the in-flight bio table (probes/bios.h): a power of two
    bio_stale_ns: int = bios.BIO_STALE_NS
    #: a fault's bios are page-cache reads: a slot held by its sector's earlier bio is taken over (bios.h)
    bio_sector_once: bool = True
    #: raw tracepoints for the completion hooks where the kernel's BTF allows (probes/bios.h)
    bio_raw_completion: bool = True


@dataclass
class FaultProbePlan:
    config: FaultProbeConfig
    features: dict[str, bool]
    missing: list[str] = field(default_factory=list)

    @property
    def missing_columns(self) -> list[str]:
        cols: list[str] = []
        for feat, ok in self.features.items():
            if not ok:
                cols += [c for c in FEATURE_COLUMNS.get(feat, []) if c not in cols]
        if not (self.features.get("HAVE_VMSCAN_DIRECT") or self.features.get("HAVE_VMSCAN_MEMCG")):
            cols.append("reclaim_ns")
        return cols

    @property
    def has_address(self) -> bool:
        return self.features.get("HAVE_PFU", False)


def plan(config: FaultProbeConfig, tracefs_root=None) -> FaultProbePlan:
    root = tracefs_root if tracefs_root is not None else tp.tracefs_root()
    absent = [n for n in REQUIRED if root is None or not tp.available(n, root)]
    if absent:
        raise UserError(f"kernel lacks tracepoint(s) {', '.join(absent)}: page faults cannot be traced "
                        "(run `engramprof doctor`)", code=1)
    feats, missing = {}, []
    for feat, names in FEATURES.items():
        ok = all(tp.available(n, root) for n in names)
        if not ok:
            missing += [n for n in names if not tp.available(n, root)]
        feats[feat] = ok
    if not config.use_pfu:
        feats["HAVE_PFU"] = False  # forced off: not "missing"
        feats["HAVE_PFK"] = False
    return FaultProbePlan(config=config, features=feats, missing=missing)


def program_text(p: FaultProbePlan) -> str:
    src = (layout.probe_dir() / PROBE_FILE).read_text()
    src = layout.inline_headers(src)  # engramprof.h, bios.h, targets.h, tidbits.h
    c = p.config
    defines = {**targets.defines(c.selection, c.tgid, c.tid),
               **bios.defines(c.bio_slots, c.bio_stale_ns, c.bio_sector_once, c.bio_raw_completion),
               "RING_PAGES": c.ring_pages,
               "TID_WORDS": c.tid_words, **{k: int(v) for k, v in p.features.items()}}
    head = "/* generated by engramprof: constants filled in before load */\n"
    head += "".join(f"#define {k} {v}\n" for k, v in defines.items())
    return head + src


class LoadedFaultProbe(LoadedBpf):
    """The compiled, attached fault probe: its ring reader and totals."""

    totals_map = "fault_totals"
    max_fields = ("max_ns",)

    def __init__(self, p: FaultProbePlan, arm: bool = True):
        BPF = import_bcc()
        self.plan = p
        self.text = program_text(p)
        self.record_dtype = layout.struct_dtype("fault_record")
        self.totals_dtype = layout.struct_dtype("fault_totals")
        self.bpf = compile_program(deferred_bpf(BPF), self.text, "page-fault probe")
        self.targets = targets.TargetMaps(self.bpf, p.config.selection)  # before arming: maps filled
        self.armed_ns: int | None = None
        layout.check_against_compiled(self.record_dtype, self.bpf["fault_record_layout"].Leaf)
        layout.check_against_compiled(self.totals_dtype, self.bpf["fault_totals_layout"].Leaf)
        page = os.sysconf("SC_PAGE_SIZE")
        self.ring = RingBufferReader(self.bpf["fault_records"].map_fd, p.config.ring_pages * page, self.record_dtype)
        if arm:
            self.arm()

    def bio_histogram(self) -> np.ndarray | None:
        """log2(ns) counts of queue -> complete of the bios the target's faults queued (None:
        compiled without the block tracepoints)."""
        if not self.plan.features.get("HAVE_BIO"):
            return None
        table = self.bpf["bio_latency_log2"]
        slots = layout.header_define("LAT_SLOTS")
        return np.array([table[ctypes.c_int(i)].value for i in range(slots)], dtype=np.int64)

    def arm(self) -> int:
        """Attach the programs (compiled already: ``arm=False``); returns when they were attached."""
        if self.armed_ns is None:
            try:
                attach_all(self.bpf)
            except Exception as exc:
                raise UserError(f"cannot attach the page-fault probe ({exc}); run `engramprof doctor`", code=1) from None
            self.armed_ns = time.monotonic_ns()
        return self.armed_ns
