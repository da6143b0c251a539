"""Build, load and read probes/export.bpf.c: the per-file read aggregates and the sample ring.

The C program is the single definition of its maps; this module only sums their per-CPU
values.  Tracepoints are feature-probed in tracefs like the recorder's probe
(engramprof.bpf.syscalls), the target filter is probes/targets.h (engramprof.bpf.targets) and the
in-flight bio table probes/bios.h (engramprof.bpf.bios).
"""
from __future__ import annotations

import contextlib
import ctypes
import gc
import os
import platform
from dataclasses import dataclass, field

import numpy as np

from engramprof.bpf import bios, readstats, targets
from engramprof.bpf import libaio as libaio_probe
from engramprof.bpf import uring as uring_probe
from engramprof.bpf import btf as kbtf
from engramprof.bpf import structs as layout
from engramprof.bpf.base import LoadedBpf, compile_program, import_bcc
from engramprof.bpf.syscalls import EVIDENCE_FEATURES, tracefs_unusable
from engramprof.bpf.ringbuf import RingBufferReader
from engramprof.bpf.sched import _tid_words
from engramprof.errors import UserError
from engramprof.host import tracepoints as tp
from engramprof.host import libaio as libaio_needs
from engramprof.host import uring as uring_needs

PROBE_FILE = "export.bpf.c"
#: the request paths, each its own program compiled in export mode: kind -> (the totals field
#: counting its reads, its lost-records field)
REQUEST_PATHS = {"io_uring": ("completed", "lost_records"), "libaio": ("reaped", "lost_records")}

FEATURES = {
    "HAVE_PREADV": ["syscalls:sys_enter_preadv", "syscalls:sys_exit_preadv"],
    "HAVE_PREAD64": ["syscalls:sys_enter_pread64", "syscalls:sys_exit_pread64"],
    "HAVE_READ": ["syscalls:sys_enter_read", "syscalls:sys_exit_read"],
    "HAVE_READV": ["syscalls:sys_enter_readv", "syscalls:sys_exit_readv"],
    "HAVE_FILEMAP": ["filemap:mm_filemap_add_to_page_cache"],
    "HAVE_GET_PAGES": ["filemap:mm_filemap_get_pages"],
    "HAVE_FAULT": ["filemap:mm_filemap_fault"],
    "HAVE_MAP_PAGES": ["filemap:mm_filemap_map_pages"],
    "HAVE_PFU": ["exceptions:page_fault_user"],
    **EVIDENCE_FEATURES,
}

@dataclass
class ExportProbeConfig:
    selection: object  # engramprof.target.selection.Selection
    ring_pages: int = 4096  # 16 MiB: ~170k sample records between two drains (one a second)
    max_files: int = 1024
    syscall_hook: str = "auto"
    bio_slots: int = bios.BIO_SLOTS  # the in-flight bio table (probes/bios.h): a power of two
    bio_stale_ns: int = bios.BIO_STALE_NS
    tid_words: int = field(default_factory=_tid_words)  # call_out_bits covers every tid
    uring: bool = True  # io_uring read requests too (probes/uring.bpf.c in export mode), where the kernel can
    libaio: bool = True  # libaio read iocbs too (probes/libaio.bpf.c in export mode), where the kernel can


@dataclass
class ExportPlan:
    config: ExportProbeConfig
    features: dict[str, bool]
    raw_syscalls: bool
    missing: list[str] = field(default_factory=list)
    uring_missing: list[str] = field(default_factory=list)  # why io_uring requests are not exported (empty: they are)
    libaio_missing: list[str] = field(default_factory=list)  # why libaio iocbs are not exported (empty: they are)


def plan(config: ExportProbeConfig, tracefs_root=None) -> ExportPlan:
    root = tracefs_root if tracefs_root is not None else tp.tracefs_root()
    if root is None:
        raise UserError(tracefs_unusable(), code=1)
    feats, missing = {}, []
    for feat, names in FEATURES.items():
        absent = [n for n in names if not tp.available(n, root)]
        feats[feat] = not absent
        missing += absent
    raw = config.syscall_hook == "raw" or (config.syscall_hook == "auto" and platform.machine() == "x86_64"
                                            and (root / "events/raw_syscalls/sys_enter").is_dir())
    if not raw:
        absent = [n for n in tp.REQUIRED if not tp.available(n, root)]
        if absent:
            raise UserError(f"kernel lacks required tracepoint(s) {', '.join(absent)}: run `engramprof doctor`", code=1)
    uring_missing = ["not asked"] if not config.uring else (
        uring_needs.missing_tracepoints(root) + uring_needs.btf_status()["missing"])
    libaio_missing = ["not asked"] if not config.libaio else (
        libaio_needs.missing_tracepoints(root) + libaio_needs.btf_status()["missing"])
    return ExportPlan(config=config, features=feats, raw_syscalls=raw, missing=missing, uring_missing=uring_missing,
                      libaio_missing=libaio_missing)


def program_text(p: ExportPlan) -> str:
    src = (layout.probe_dir() / PROBE_FILE).read_text()
    src = layout.inline_headers(src)  # engramprof.h, bios.h, targets.h, inflight.h, tidbits.h
    c = p.config
    sel = c.selection
    defines = {
        **targets.defines(sel, sel.first_pid, sel.tid),
        **bios.defines(c.bio_slots, c.bio_stale_ns),
        "RING_PAGES": c.ring_pages,
        "MAX_READ_FILES": c.max_files,
        "USE_RAW_SYSCALLS": int(p.raw_syscalls),
        "TID_WORDS": c.tid_words,
        # the fd -> file walk of every call (probes/targets.h: its device and inode, read()'s position)
        **kbtf.fd_walk_offsets("naming the file of each read in the kernel"),
        "O_DIRECT_BIT": os.O_DIRECT,
        **{k: int(v) for k, v in p.features.items()},
    }
    head = "/* generated by engramprof export: constants filled in before load */\n"
    return head + "".join(f"#define {k} {v}\n" for k, v in defines.items()) + src


def release_freed_memory() -> None:
    """Give freed heap back to the kernel (glibc keeps it otherwise): after BCC's compile, and
    after each window's analysis."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


class ExportProbe(LoadedBpf):
    """The loaded export probe: per-(file, kind) aggregates, totals, the sample ring; and the
    request paths' programs (io_uring, libaio), each with its own aggregates, budget and ring."""

    totals_map = "export_totals"
    lost_field = "sample_lost"

    def __init__(self, p: ExportPlan):
        BPF = import_bcc()
        self.plan = p
        text = program_text(p)
        self.bpf = compile_program(BPF, text, "export probe")
        del text
        release_freed_memory()
        self.targets = targets.TargetMaps(self.bpf, p.config.selection)
        self.record_dtype = layout.struct_dtype("call_record")
        layout.check_against_compiled(self.record_dtype, self.bpf["call_record_layout"].Leaf)
        self.lat_slots = layout.header_define("LAT_SLOTS")
        self.ring = RingBufferReader(self.bpf["sample_records"].map_fd,
                                     p.config.ring_pages * os.sysconf("SC_PAGE_SIZE"), self.record_dtype)
        self._totals = self.bpf["export_totals"]
        self._bio = self.bpf["bio_latency_log2"]
        #: kind -> the loaded program of that request path (absent: the kernel cannot, or not asked)
        self.requests: dict[str, LoadedBpf] = {}
        try:
            self._load_requests(p)
        except BaseException:
            self.close()
            raise
        # every program is attached now: count from here (see export_armed in the probe)
        self.bpf["export_armed"][ctypes.c_int(0)] = ctypes.c_uint32(1)

    def _load_requests(self, p: ExportPlan) -> None:
        """The io_uring and libaio probes in export mode (per-file stats in the kernel, a sample of
        records), armed, where the kernel can trace them (``p.uring_missing`` / ``p.libaio_missing``
        say why not)."""
        c = p.config
        sel = c.selection
        if not p.uring_missing:
            self.requests["io_uring"] = uring_probe.UringProbe.load(uring_probe.UringProbeConfig(
                tgid=sel.first_pid or 0, tid=sel.tid, selection=sel, export_mode=True, max_files=c.max_files))
        if not p.libaio_missing:
            self.requests["libaio"] = libaio_probe.LibaioProbe.load(libaio_probe.LibaioProbeConfig(
                tgid=sel.first_pid or 0, tid=sel.tid, selection=sel, export_mode=True, max_files=c.max_files))
        for r in self.requests.values():
            release_freed_memory()
            r.arm()

    def read_paths(self) -> tuple[str, ...]:
        """The read paths whose events reach the window sample: syscall reads, page faults where
        they are spans (x86's exceptions:page_fault_user with the raw syscall hook), io_uring
        requests and libaio iocbs where the kernel has what their probes need."""
        f = self.plan.features
        spans = f.get("HAVE_PFU") and f.get("HAVE_FAULT") and self.plan.raw_syscalls
        return ("syscall",) + (("fault",) if spans else ()) + tuple(self.requests)

    def sync_targets(self) -> None:
        self.targets.sync()
        for r in self.requests.values():
            r.targets.sync()

    def totals(self) -> dict[str, int]:
        """The export probe's totals, with the request paths' folded in: ``reads_io_uring`` /
        ``reads_libaio`` (their completed reads), and their unsampled / lost / overflowed /
        untracked counts added to the export probe's fields of the same meaning."""
        t = super().totals()
        for kind, (done_field, lost_field) in REQUEST_PATHS.items():
            r = self.requests.get(kind)
            if r is None:
                continue
            u = r.totals()
            done = u.get(done_field, 0)
            t[f"reads_{kind}"] = done
            for mine, theirs in (("unsampled", "unsampled"), ("sample_lost", lost_field),
                                 ("files_overflow", "files_overflow"), ("bios_untracked", "bios_untracked")):
                t[mine] += u.get(theirs, 0)
            t["sampled"] += max(0, done - u.get("unsampled", 0) - u.get(lost_field, 0))
        return t

    def skipped_runs(self) -> dict[str, int] | None:
        """{hook: runs the kernel skipped} of the export probe's programs and its request paths'
        (engramprof/bpf/progstats.py); None: not counted."""
        parts = [super().skipped_runs()] + [r.skipped_runs() for r in self.requests.values()]
        if all(p is None for p in parts):
            return None
        out: dict[str, int] = {}
        for part in parts:
            for hook, n in (part or {}).items():
                out[hook] = out.get(hook, 0) + n
        return out

    # ---- reading the maps ------------------------------------------------------------------
    def read_stats(self) -> dict[tuple[int, int, str], dict]:
        """{(dev, ino, kind): {field: total, 'latency_log2': counts}} summed over CPUs, every path."""
        out = readstats.read_stats(self.bpf)
        for r in self.requests.values():
            out.update(readstats.read_stats(r.bpf))
        return out

    def file_keys(self) -> list[tuple[int, int]]:
        """(dev, ino) of every key in the maps (keys only: no per-CPU values read)."""
        keys = readstats.file_keys(self.bpf)
        for r in self.requests.values():
            keys += readstats.file_keys(r.bpf)
        return keys

    def totals_fields(self) -> list[str]:
        """export_totals is defined in export.bpf.c alone: its fields as BCC compiled them."""
        return [f for f, _ in self._totals[0][0]._fields_]

    def bio_seconds(self) -> float:
        return self.bpf["bio_latency_sum_ns"][ctypes.c_int(0)].value * 1e-9

    def bio_histogram(self) -> np.ndarray:
        return np.array([self._bio[ctypes.c_int(i)].value for i in range(self.lat_slots)], dtype=np.int64)

    # ---- the window sample -----------------------------------------------------------------
    def set_sample_budget(self, n: int) -> None:
        """The window's sample: the next ``n`` reads of each program (syscall reads and faults
        share one budget; io_uring requests and libaio iocbs have their own)."""
        readstats.set_sample_budget(self.bpf, n)
        for r in self.requests.values():
            readstats.set_sample_budget(r.bpf, n)

    def unsampled(self) -> dict[str, int]:
        """Reads only aggregated because the window's budget was spent, by budget: ``records``
        (syscall reads and faults), then one per request path (``io_uring``, ``libaio``)."""
        out = {"records": int(super().totals()["unsampled"])}
        for kind, r in self.requests.items():
            out[kind] = int(r.totals()["unsampled"])
        return out

    def drain_requests(self) -> dict[str, np.ndarray]:
        """The request paths' records sampled since the last drain, by kind."""
        return {kind: r.drain() for kind, r in self.requests.items()}

    def close(self) -> None:
        for r in self.requests.values():
            r.close()
        self.requests = {}
        super().close()

    def drain(self) -> np.ndarray:
        return self.ring.drain()
