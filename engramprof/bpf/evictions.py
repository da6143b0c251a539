"""Build, feature-probe and load the eviction probe (probes/evictions.bpf.c) with BCC.

The same scheme as :mod:`engramprof.bpf.syscalls`: constants written into the program text
before it is compiled, each context hook's tracepoint probed in tracefs first and compiled out
when missing (its evictions then show as ``unknown``), the record layout parsed from
probes/engramprof.h checked against what clang compiled.  The probe is system-wide; its
``watched_files`` hash (device + inode) decides which pages are recorded, behind the
``watched_bits`` slots of probes/watched.h, and :meth:`LoadedEvictionProbe.watch` fills both
(engramprof/bpf/watched.py).

Without ``filemap:mm_filemap_delete_from_page_cache`` there is nothing to load:
:func:`required_available` says so and the recorder keeps the proportional refault estimate.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

from engramprof.bpf import structs as layout
from engramprof.bpf import targets, watched
from engramprof.bpf.base import LoadedBpf, compile_program, import_bcc
from engramprof.bpf.syscalls import RECLAIM_FEATURES
from engramprof.bpf.ringbuf import RingBufferReader
from engramprof.errors import UserError
from engramprof.host import tracepoints as tp

PROBE_FILE = "evictions.bpf.c"
REQUIRED = ("filemap:mm_filemap_delete_from_page_cache",)
FEATURES = {
    **RECLAIM_FEATURES,
    "HAVE_FADVISE": ["syscalls:sys_enter_fadvise64", "syscalls:sys_exit_fadvise64"],
    "HAVE_WRITE": ["syscalls:sys_enter_write", "syscalls:sys_exit_write"],
    "HAVE_TRUNCATE": ["syscalls:sys_enter_truncate", "syscalls:sys_exit_truncate"],
    "HAVE_FTRUNCATE": ["syscalls:sys_enter_ftruncate", "syscalls:sys_exit_ftruncate"],
    "HAVE_FALLOCATE": ["syscalls:sys_enter_fallocate", "syscalls:sys_exit_fallocate"],
    "HAVE_UNLINK": ["syscalls:sys_enter_unlink", "syscalls:sys_exit_unlink"],  # not on arm64
    "HAVE_UNLINKAT": ["syscalls:sys_enter_unlinkat", "syscalls:sys_exit_unlinkat"],
    "HAVE_MADVISE": ["syscalls:sys_enter_madvise", "syscalls:sys_exit_madvise"],
    "HAVE_PROCESS_MADVISE": ["syscalls:sys_enter_process_madvise", "syscalls:sys_exit_process_madvise"],
}
MADV_PAGEOUT, MADV_REMOVE = 21, 9  # the generic uapi values (x86_64, arm64)
#: the contexts a missing feature leaves as ``unknown``
FEATURE_CONTEXTS = {"HAVE_VMSCAN_DIRECT": "direct-reclaim", "HAVE_VMSCAN_MEMCG": "memcg-reclaim",
                    "HAVE_FADVISE": "fadvise", "HAVE_WRITE": "drop-caches", "HAVE_TRUNCATE": "truncate",
                    "HAVE_FTRUNCATE": "truncate", "HAVE_FALLOCATE": "truncate", "HAVE_UNLINKAT": "truncate",
                    "HAVE_MADVISE": "madvise", "HAVE_PROCESS_MADVISE": "madvise"}


def required_available(tracefs_root=None) -> bool:
    """True when this kernel shows page-cache removals at all."""
    root = tracefs_root if tracefs_root is not None else tp.tracefs_root()
    return root is not None and all(tp.available(n, root) for n in REQUIRED)


@dataclass
class EvictionProbeConfig:
    tgid: int = 0
    tid: int = 0
    ring_pages: int = 8192  # 32 MiB: ~380k evictions between two drains (or while the other probes load)
    max_files: int = 4096
    max_tasks: int = 16384
    selection: object = None  # engramprof.target.selection.Selection (the EVICT_BY_TARGET flag)
    watch_bits: int = watched.WATCH_BITS  # probes/watched.h's slots in front of watched_files


@dataclass
class EvictionProbePlan:
    config: EvictionProbeConfig
    features: dict[str, bool]
    missing: list[str] = field(default_factory=list)

    @property
    def blind_contexts(self) -> list[str]:
        """Contexts this kernel cannot show (their evictions are recorded as ``unknown``)."""
        out: list[str] = []
        for feat, ok in self.features.items():
            ctx = FEATURE_CONTEXTS.get(feat)
            if not ok and ctx and ctx not in out:
                out.append(ctx)
        return out


def plan(config: EvictionProbeConfig, tracefs_root=None) -> EvictionProbePlan:
    root = tracefs_root if tracefs_root is not None else tp.tracefs_root()
    absent = [n for n in REQUIRED if root is None or not tp.available(n, root)]
    if absent:
        raise UserError(f"kernel lacks tracepoint(s) {', '.join(absent)}: evictions cannot be traced", code=1)
    feats, missing = {}, []
    for feat, names in FEATURES.items():
        gone = [n for n in names if not tp.available(n, root)]
        feats[feat] = not gone
        if feat != "HAVE_UNLINK":  # an architecture without unlink(2) has only unlinkat
            missing += gone
    return EvictionProbePlan(config=config, features=feats, missing=missing)


def program_text(p: EvictionProbePlan) -> str:
    src = (layout.probe_dir() / PROBE_FILE).read_text()
    src = layout.inline_headers(src)  # evictions.h, common.h, watched.h, targets.h
    c = p.config
    defines = {**targets.defines(c.selection, c.tgid, c.tid), "RING_PAGES": c.ring_pages,
               "MAX_FILES": c.max_files, "MAX_TASKS": c.max_tasks, "WATCH_BITS": watched.check_bits(c.watch_bits),
               "FADV_DONTNEED": getattr(os, "POSIX_FADV_DONTNEED", 4),
               "MADV_PAGEOUT_": MADV_PAGEOUT, "MADV_REMOVE_": MADV_REMOVE,
               **{k: int(v) for k, v in p.features.items()}}
    head = "/* generated by engramprof: constants filled in before load */\n"
    head += "".join(f"#define {k} {v}\n" for k, v in defines.items())
    return head + src


class LoadedEvictionProbe(LoadedBpf):
    """The compiled, attached eviction probe: its ring reader, watched files and totals."""

    totals_map = "eviction_totals"

    def __init__(self, p: EvictionProbePlan):
        BPF = import_bcc()
        self.plan = p
        self.text = program_text(p)
        self.record_dtype = layout.struct_dtype("eviction_record")
        self.totals_dtype = layout.struct_dtype("eviction_totals")
        self.bpf = compile_program(BPF, self.text, "eviction probe")
        self.targets = targets.TargetMaps(self.bpf, p.config.selection)
        self.armed_ns = time.monotonic_ns()
        layout.check_against_compiled(self.record_dtype, self.bpf["eviction_record_layout"].Leaf)
        layout.check_against_compiled(self.totals_dtype, self.bpf["eviction_totals_layout"].Leaf)
        page = os.sysconf("SC_PAGE_SIZE")
        self.ring = RingBufferReader(self.bpf["eviction_records"].map_fd, p.config.ring_pages * page,
                                     self.record_dtype)
        self._files = watched.WatchedFiles(self.bpf, p.config.watch_bits)
        self.watched: set[tuple[int, int]] = set()
        self.watch_full = False

    def watch(self, dev: int, ino: int) -> bool:
        """Record the evictions of file (kernel dev_t, inode) from now on; False: the map is full."""
        key = (int(dev), int(ino))
        if key in self.watched:
            return True
        try:
            self._files.add(*key)  # the hash key, then its watched_bits slot
        except Exception:  # E2BIG / ENOMEM: more files than MAX_FILES
            self.watch_full = True
            return False
        self.watched.add(key)
        return True
