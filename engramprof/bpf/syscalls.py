"""Build, feature-probe and load the preadv probe with BCC.

Tunables are constants written into the program text before it is compiled (libbpf-tools
style), so ``engramprof syscalls --ebpf`` prints exactly what would be loaded.  Each hook's
tracepoint is probed in tracefs first; evidence hooks whose tracepoint is missing are compiled
out and reported, and the syscall hook falls back from raw_syscalls to the per-syscall
tracepoints when the raw variant is not usable.
"""
from __future__ import annotations

import ctypes
import os
import platform
import re
import time
from dataclasses import dataclass, field

import numpy as np

from engramprof.bpf import bios, btf, targets
from engramprof.bpf import structs as layout
from engramprof.bpf.base import LoadedBpf, compile_program, detach_together, import_bcc  # noqa: F401  (import_bcc: also used from here)
from engramprof.bpf.ringbuf import RingBufferReader
from engramprof.bpf.sched import _tid_words
from engramprof.errors import UserError
from engramprof.host import doctor
from engramprof.host import tracepoints as tp

PROBE_FILE = "syscalls.bpf.c"
#: the native stacks' ring (probes/native.h): 2 MiB, about 60 stacks of 32 KiB between drains
NATIVE_RING_PAGES = 512
#: what the fd walk is for, in its error when the kernel's BTF lacks a member it reads
WALK_NEEDED_FOR = "naming the file of each read in the kernel (device, inode, O_DIRECT, read()'s position)"

#: the reclaim hooks: direct and memcg reclaim time inside a call / fault, the eviction contexts
RECLAIM_FEATURES = {
    "HAVE_VMSCAN_DIRECT": ["vmscan:mm_vmscan_direct_reclaim_begin", "vmscan:mm_vmscan_direct_reclaim_end"],
    "HAVE_VMSCAN_MEMCG": ["vmscan:mm_vmscan_memcg_reclaim_begin", "vmscan:mm_vmscan_memcg_reclaim_end"],
}
#: the evidence hooks every read probe has (preadv, faults, export): bios, reclaim, off-CPU time
EVIDENCE_FEATURES = {
    "HAVE_BIO": ["block:block_bio_queue", "block:block_bio_backmerge", "block:block_rq_complete",
                 "block:block_bio_complete"],
    **RECLAIM_FEATURES,
    "HAVE_SCHED": ["sched:sched_switch", "sched:sched_wakeup"],
}
# feature macro -> tracepoints it needs
FEATURES = {
    "HAVE_PREADV": ["syscalls:sys_enter_preadv", "syscalls:sys_exit_preadv"],
    "HAVE_PREAD64": ["syscalls:sys_enter_pread64", "syscalls:sys_exit_pread64"],
    "HAVE_READ": ["syscalls:sys_enter_read", "syscalls:sys_exit_read"],
    "HAVE_READV": ["syscalls:sys_enter_readv", "syscalls:sys_exit_readv"],
    "HAVE_FILEMAP": ["filemap:mm_filemap_add_to_page_cache"],
    **EVIDENCE_FEATURES,
    "HAVE_KSWAPD": ["vmscan:mm_vmscan_kswapd_wake", "vmscan:mm_vmscan_kswapd_sleep"],
}
# evidence columns that stay 0 when a feature is compiled out
FEATURE_COLUMNS = {
    "HAVE_FILEMAP": ["pages_added"],
    "HAVE_BIO": ["bio_count", "bio_ns"],
    "HAVE_VMSCAN_DIRECT": ["reclaim_ns"],
    "HAVE_VMSCAN_MEMCG": ["reclaim_ns"],
    "HAVE_SCHED": ["offcpu_ns", "runq_ns"],
}


@dataclass
class SyscallsConfig:
    tgid: int
    tid: int = 0
    min_ns: int = 0
    ring_pages: int = 8192  # 32 MiB: ~300k records, about a second of a tight cached loop
    syscall_hook: str = "auto"  # auto | raw | tracepoint
    selection: object = None  # engramprof.target.selection.Selection; None: the one process tgid
    bio_slots: int = bios.BIO_SLOTS  # the in-flight bio table (probes/bios.h): a power of two
    bio_stale_ns: int = bios.BIO_STALE_NS
    tid_words: int = field(default_factory=_tid_words)  # the switched-out-in-a-call bitmap covers every tid
    #: a read's user stack for its native frames (probes/native.h): at most one call per CPU every
    #: native_every_ns; 0: compiled out
    native_every_ns: int = 0


@dataclass
class SyscallsPlan:
    config: SyscallsConfig
    features: dict[str, bool]
    raw_syscalls: bool
    missing: list[str] = field(default_factory=list)

    @property
    def missing_columns(self) -> list[str]:
        cols: list[str] = []
        for feat, ok in self.features.items():
            if not ok:
                cols += [c for c in FEATURE_COLUMNS.get(feat, []) if c not in cols]
        if "reclaim_ns" in cols and (self.features.get("HAVE_VMSCAN_DIRECT") or self.features.get("HAVE_VMSCAN_MEMCG")):
            cols.remove("reclaim_ns")
        return cols


def _raw_syscalls_usable(root) -> bool:
    return platform.machine() == "x86_64" and root is not None and (root / "events" / "raw_syscalls" / "sys_enter").is_dir()


def tracefs_unusable() -> str:
    """Why there is no usable tracefs, with the fix (not mounted / not readable: not root)."""
    check, _ = doctor.check_tracefs()
    return f"tracefs {check.detail}: {check.fix}"


def assumed_plan(config: SyscallsConfig, why: str) -> SyscallsPlan:
    """A plan with every feature on, for printing the program (``--ebpf``) where tracefs
    cannot be read (an unprivileged user): loading probes each tracepoint first."""
    raw = config.syscall_hook == "raw" or (config.syscall_hook == "auto" and platform.machine() == "x86_64")
    p = SyscallsPlan(config=config, features={f: True for f in FEATURES}, raw_syscalls=raw)
    p.assumed = why
    return p


def plan(config: SyscallsConfig, tracefs_root=None) -> SyscallsPlan:
    root = tracefs_root if tracefs_root is not None else tp.tracefs_root()
    if root is None:  # not "the kernel lacks tracepoints": say why tracefs cannot be read
        raise UserError(tracefs_unusable(), code=1)
    feats, missing = {}, []
    for feat, names in FEATURES.items():
        ok = root is not None and all(tp.available(n, root) for n in names)
        feats[feat] = ok
        if not ok:
            missing += [n for n in names if root is None or not tp.available(n, root)]
    if config.syscall_hook == "raw":
        raw = True
    elif config.syscall_hook == "tracepoint":
        raw = False
    else:
        raw = _raw_syscalls_usable(root)
    if not raw:
        need = list(tp.REQUIRED)
        absent = [n for n in need if root is None or not tp.available(n, root)]
        if absent:
            raise UserError(f"kernel lacks required tracepoint(s) {', '.join(absent)}: run `engramprof doctor`", code=1)
    return SyscallsPlan(config=config, features=feats, raw_syscalls=raw, missing=missing)


def program_text(p: SyscallsPlan) -> str:
    """The complete C program (header inlined, constants defined) that load() compiles."""
    src = (layout.probe_dir() / PROBE_FILE).read_text()
    src = layout.inline_headers(src)  # engramprof.h, bios.h, targets.h, inflight.h, tidbits.h
    c = p.config
    defines = {
        **targets.defines(c.selection, c.tgid, c.tid),
        **bios.defines(c.bio_slots, c.bio_stale_ns),
        "MIN_NS": c.min_ns,
        "RING_PAGES": c.ring_pages,
        "USE_RAW_SYSCALLS": int(p.raw_syscalls),
        "TID_WORDS": c.tid_words,
        "NATIVE_STACKS": int(c.native_every_ns > 0),
        "NATIVE_EVERY_NS": max(int(c.native_every_ns), 1),
        "NATIVE_RING_PAGES": NATIVE_RING_PAGES,
        # the fd -> file -> inode walk of every call (probes/targets.h; the record's dev, ino,
        # O_DIRECT and read()'s file position)
        **btf.fd_walk_offsets(WALK_NEEDED_FOR),
        "O_DIRECT_BIT": os.O_DIRECT,
        **{k: int(v) for k, v in p.features.items()},
    }
    head = "/* generated by engramprof: constants filled in before load */\n"
    if getattr(p, "assumed", None):
        head += f"/* {p.assumed}: every feature assumed present (loading probes each tracepoint first) */\n"
    head += "".join(f"#define {k} {v}\n" for k, v in defines.items())
    return head + src


class SyscallsProbe(LoadedBpf):
    """A compiled, attached probe: ring reader, totals and histograms."""

    totals_map = "call_totals"
    max_fields = ("max_ns",)

    def __init__(self, p: SyscallsPlan):
        BPF = import_bcc()
        self.plan = p
        self.text = program_text(p)
        self.record_dtype = layout.struct_dtype("call_record")
        self.totals_dtype = layout.struct_dtype("call_totals")
        self.bpf = compile_program(BPF, self.text, "BPF probe")
        self.targets = targets.TargetMaps(self.bpf, p.config.selection)  # before arming: maps filled
        # BCC attaches the programs one after another while it loads them: a call that entered
        # before the last one was attached may lack evidence; the collector drops calls that
        # entered before this instant (and counts them)
        self.armed_ns = time.monotonic_ns()
        layout.check_against_compiled(self.record_dtype, self.bpf["call_record_layout"].Leaf)
        layout.check_against_compiled(self.totals_dtype, self.bpf["call_totals_layout"].Leaf)
        self.vm_event_dtype = layout.struct_dtype("vm_event")
        layout.check_against_compiled(self.vm_event_dtype, self.bpf["vm_event_layout"].Leaf)
        page = os.sysconf("SC_PAGE_SIZE")
        self.ring = RingBufferReader(self.bpf["call_records"].map_fd, p.config.ring_pages * page, self.record_dtype)
        self.vm_ring = RingBufferReader(self.bpf["vm_events"].map_fd, 16 * page, self.vm_event_dtype)
        self.native_ring = None
        if p.config.native_every_ns > 0:
            self.native_dtype = native_stack_dtype()
            if ctypes.sizeof(self.bpf["native_stack_layout"].Leaf) != self.native_dtype.itemsize:
                raise RuntimeError("native_stack layout mismatch (probes/native.h)")
            self.native_ring = RingBufferReader(self.bpf["native_stacks"].map_fd, NATIVE_RING_PAGES * page,
                                                self.native_dtype)
        self.lat_slots = layout.header_define("LAT_SLOTS")
        self.fd_slots = layout.header_define("FD_SLOTS")

    def histograms(self, fds) -> dict[int, np.ndarray]:
        """log2(ns) latency counts per fd slot, summed over CPUs (fd >= FD_SLOTS-1 share one)."""
        table = self.bpf["latency_log2_by_fd"]
        out = {}
        slots = sorted({min(int(fd), self.fd_slots - 1) for fd in fds if fd >= 0})
        for fdslot in slots:
            counts = np.zeros(self.lat_slots, dtype=np.int64)
            for s in range(self.lat_slots):
                counts[s] = sum(table[ctypes.c_int(fdslot * self.lat_slots + s)])
            if counts.any():
                out[fdslot] = counts
        return out

    def bio_histogram(self) -> np.ndarray:
        """log2(ns) counts of queue -> complete of the bios the target queued inside calls."""
        table = self.bpf["bio_latency_log2"]
        return np.array([table[ctypes.c_int(i)].value for i in range(self.lat_slots)], dtype=np.int64)

    def detach(self) -> int | None:
        """Stop the programs; the maps (ring, totals, histograms) stay readable until close().

        Returns the CLOCK_MONOTONIC ns at which the syscall hooks were gone: the end of the
        recording (no call entered after it is recorded)."""
        b = self.bpf
        if b is None:
            return None
        # syscall hooks first: no call can complete after its evidence hooks are gone
        tps = list(getattr(b, "tracepoint_fds", {}))
        raws = list(getattr(b, "raw_tracepoint_fds", {}))
        name = lambda n: n.decode() if isinstance(n, bytes) else n  # noqa: E731
        sys_tps = [n for n in tps if name(n).startswith("syscalls:")]
        detach_together(b, raws, sys_tps)
        ended = time.monotonic_ns()
        detach_together(b, (), [n for n in tps if n not in sys_tps])
        return ended

    def rings(self) -> list:
        return [self.ring, self.vm_ring] + ([self.native_ring] if self.native_ring is not None else [])

    def native_totals(self) -> dict[str, int]:
        """Native stacks taken and lost to a full ring (summed over CPUs)."""
        if self.native_ring is None:
            return {}
        t = self.bpf["native_stack_totals"]
        return {"taken": int(sum(t[ctypes.c_int(0)])), "ring_full": int(sum(t[ctypes.c_int(1)]))}


def native_every_ns(stack_hz: float) -> int:
    """The stack copies' per-CPU interval at ``--stack-hz`` (0: compiled out): x86_64 registers,
    and pyelftools to unwind them."""
    import importlib.util

    if not stack_hz or platform.machine() != "x86_64" or importlib.util.find_spec("elftools") is None:
        return 0
    return int(1e9 / stack_hz)


def native_stack_dtype() -> np.dtype:
    """``struct native_stack`` (probes/native.h): its fixed part and the stack copy's bytes."""
    text = (layout.probe_dir() / "native.h").read_text()
    n = 1
    for name in ("NATIVE_CHUNK", "NATIVE_CHUNKS"):
        n *= int(re.search(r"#define\s+%s\s+(\d+)" % name, text).group(1))
    return np.dtype([("ts_ns", "<u8"), ("ip", "<u8"), ("sp", "<u8"), ("bp", "<u8"), ("pid", "<u4"), ("tid", "<u4"),
                     ("len", "<u4"), ("pad", "<u4"), ("data", "u1", (n,))])
