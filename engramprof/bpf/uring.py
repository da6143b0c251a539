"""Build, feature-probe and load the io_uring probe (probes/uring.bpf.c) with BCC, and decode its
records into read events.

The scheme of :mod:`engramprof.bpf.faults`: constants written into the program text before it is
compiled (here also the running kernel's struct member offsets and ``enum io_uring_op`` values,
from its BTF: BCC compiles against 6.1 headers on this 6.18 kernel, and io_uring's structs are
private to io_uring/), tracepoints looked up in tracefs first (the optional ones compiled out
when missing, and named in the plan), the record struct defined once in probes/uring.h, parsed
by :mod:`engramprof.bpf.structs` and checked against what clang compiled, a ring buffer drained
in bulk into numpy, and lost records counted in the kernel.

:class:`UringProbe` is the small object a recorder source wraps: ``load`` (compile, fill the
target maps), ``arm`` (attach), ``drain`` (records since the last drain), ``totals``, ``close``.
:func:`decode` turns records into a table with the columns of syscall read events
(engramprof/trace/schema.py's CALL_SCHEMA) plus the io_uring ones (:data:`URING_FIELDS`).
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np
import pandas as pd
import pyarrow as pa

from engramprof.bpf import structs as layout
from engramprof.bpf import bios, readstats, targets
from engramprof.bpf.request import RequestProbe
from engramprof.errors import UserError
from engramprof.host import btf as kbtf
from engramprof.host import tracepoints as tp
from engramprof.host.uring import (BTF_FIELDS, FEATURE_EFFECT, FEATURES, OPCODES, REQUIRED,  # noqa: F401
                                   REQUIRED_FIELDS, btf_status, missing_tracepoints)
from engramprof.trace.schema import CALL_SCHEMA

PROBE_FILE = "uring.bpf.c"
HEADER = "uring.h"
KIND = "io_uring"  # the read events' kind (the trace schema's READ_KINDS gains it with the recorder source)

MAX_IOV = 8
INFLIGHT_PROBES = 4  # slots of the in-flight table a request may take, from its home (probes/uring.bpf.c)
ISSUE_SLOTS_MAX = 65536  # 16 bytes each: 1 MiB
MAX_REQ_SPAN = 256  # bytes of the request read in one go at submit (the BPF stack is 512)

PATHS = ("inline", "async", "punted")  # URING_PATH_* by code


# ------------------------------------------------------------------------------ plan and program

@dataclass
class UringProbeConfig:
    tgid: int
    tid: int = 0
    ring_pages: int = 1024  # 4 MiB: ~35k requests between drains
    max_inflight: int = 65536  # in-flight table slots (a power of two; ~112 bytes each), all target rings together
    selection: object = None  # engramprof.target.selection.Selection; None: the one process tgid
    export_mode: bool = False  # `engramprof export`: per-file stats in the kernel, records only as a window's sample
    max_files: int = 1024  # export_mode: entries of read_stats_by_file (probes/readstats.h)


@dataclass
class UringProbePlan:
    config: UringProbeConfig
    features: dict[str, bool]
    offsets: dict[str, int]
    opcodes: dict[str, int]
    missing: list[str] = field(default_factory=list)  # optional tracepoints absent (named)


def plan(config: UringProbeConfig, tracefs_root=None, btf_path: str = kbtf.VMLINUX) -> UringProbePlan:
    root = tracefs_root if tracefs_root is not None else tp.tracefs_root()
    absent = missing_tracepoints(root)
    if absent:
        raise UserError(f"kernel lacks {', '.join(absent)}: io_uring reads cannot be traced "
                        "(run `engramprof doctor`)", code=1)
    st = btf_status(btf_path)
    if st["missing"]:
        raise UserError(f"io_uring reads cannot be traced on this kernel: its BTF lacks {', '.join(st['missing'])} "
                        "(run `engramprof doctor`)", code=1)
    feats, missing = {}, []
    for feat, names in FEATURES.items():
        lacking = [n for n in names if not tp.available(n, root)]
        feats[feat] = not lacking
        missing += lacking
    return UringProbePlan(config=config, features=feats, offsets=st["offsets"], opcodes=st["opcodes"],
                          missing=missing)


def _req_span(offsets: dict[str, int]) -> int:
    """Bytes from the request's start that cover what the probe reads at submit."""
    sizes = {m: s for m, _st, _p, s in BTF_FIELDS}
    span = max(offsets[m] + sizes[m] for m in ("U_OFF_RW_POS", "U_OFF_RW_ADDR", "U_OFF_RW_LEN", "U_OFF_RW_FLAGS",
                                               "U_OFF_REQ_FD"))
    span = (span + 7) & ~7
    if span > MAX_REQ_SPAN:
        raise UserError(f"io_uring: the request's fields span {span} bytes on this kernel (the probe reads at most "
                        f"{MAX_REQ_SPAN})", code=1)
    return span


def _complete_span(offsets: dict[str, int]) -> int:
    """Bytes from the request's start that cover req->file, ki_pos and ki_waitq (read at complete)."""
    span = max(offsets[m] + 8 for m in ("U_OFF_REQ_FILE", "U_OFF_RW_POS", "U_OFF_RW_WAITQ"))
    if span > MAX_REQ_SPAN:
        raise UserError(f"io_uring: the request's fields span {span} bytes on this kernel (the probe reads at most "
                        f"{MAX_REQ_SPAN})", code=1)
    return (span + 7) & ~7


def inflight_defines(slots: int) -> dict[str, int]:
    """The in-flight table's constants: its slot count (a power of two) and its log2."""
    if slots < INFLIGHT_PROBES or slots & (slots - 1):
        raise ValueError(f"io_uring in-flight slots must be a power of two >= {INFLIGHT_PROBES}, not {slots}")
    return {"INFLIGHT_SLOTS": slots, "INFLIGHT_SLOT_BITS": slots.bit_length() - 1, "URING_PROBES": INFLIGHT_PROBES}


def issue_slots() -> int:
    """Slots of the issuing-thread table (probes/uring.bpf.c `uring_issuing`, by tid): a power of
    two covering pid_max (a tid its own slot), at most ISSUE_SLOTS_MAX."""
    try:
        with open("/proc/sys/kernel/pid_max") as f:
            pid_max = int(f.read())
    except (OSError, ValueError):
        pid_max = ISSUE_SLOTS_MAX
    return min(1 << max(pid_max - 1, 1).bit_length(), ISSUE_SLOTS_MAX)


def program_text(p: UringProbePlan) -> str:
    src = layout.inline_headers((layout.probe_dir() / PROBE_FILE).read_text())  # uring.h, targets.h
    c = p.config
    defines = {**targets.defines(c.selection, c.tgid, c.tid), "RING_PAGES": c.ring_pages,
               **inflight_defines(c.max_inflight), "ISSUE_SLOTS": issue_slots(), "URING_MAX_IOV": MAX_IOV, "REQ_SPAN": _req_span(p.offsets),
               "CSPAN": _complete_span(p.offsets),
               "O_DIRECT_BIT": os.O_DIRECT, **bios.defines(), "EXPORT_MODE": int(c.export_mode),
               "MAX_READ_FILES": c.max_files, **{m: -1 for m in OPCODES}, **p.opcodes,
               **p.offsets,
               **{k: int(v) for k, v in p.features.items()}}
    head = "/* generated by engramprof: constants filled in before load */\n"
    head += "".join(f"#define {k} {v}\n" for k, v in defines.items())
    return head + src


@lru_cache(maxsize=None)
def header_text() -> str:
    return (layout.probe_dir() / HEADER).read_text()


@lru_cache(maxsize=None)
def struct_dtype(name: str) -> np.dtype:
    """A struct of probes/uring.h as a numpy dtype (the one parser, engramprof/bpf/structs.py)."""
    return layout.parse_struct(header_text(), name, HEADER)


@lru_cache(maxsize=None)
def header_defines(prefix: str) -> dict[str, int]:
    """``#define PREFIXNAME <int>`` of probes/uring.h, prefix removed (URING_PATH_, URING_)."""
    return {m.group(1): int(m.group(2))
            for m in re.finditer(r"#define\s+%s(\w+)\s+(\d+)\b" % re.escape(prefix), header_text())}


# ------------------------------------------------------------------------------ the loaded probe

class UringProbe(RequestProbe):
    """The compiled io_uring probe: ``UringProbe.load(config)``, then :meth:`arm`, :meth:`drain`
    (as often as the ring needs), :meth:`totals`, :meth:`close`."""

    what = "io_uring probe"
    totals_map = "uring_totals"
    max_fields = ("max_ns",)
    record_struct, totals_struct, ring_map = "uring_record", "uring_totals", "uring_records"
    make_plan = staticmethod(lambda config, tracefs_root=None: plan(config, tracefs_root))
    program_text = staticmethod(lambda p: program_text(p))
    struct_dtype = staticmethod(lambda name: struct_dtype(name))

    # ---- export mode: the per-file aggregates and the sample budget (engramprof.bpf.readstats) ----
    def read_stats(self) -> dict[tuple[int, int, str], dict]:
        """export_mode: {(dev, ino, "io_uring"): {field: total, 'latency_log2': counts}}."""
        return readstats.read_stats(self.bpf)

    def file_keys(self) -> list[tuple[int, int]]:
        return readstats.file_keys(self.bpf)

    def set_sample_budget(self, n: int) -> None:
        """export_mode: records for the next ``n`` completed requests (the window's sample)."""
        readstats.set_sample_budget(self.bpf, n)

    def inflight(self) -> int:
        """Requests submitted and not yet completed, now (the taken slots of the in-flight table)."""
        return sum(1 for v in self.bpf["uring_inflight"].values() if v.req)


# ------------------------------------------------------------------------------ decoding

#: the io_uring columns a read event of this kind carries besides CALL_SCHEMA's
URING_FIELDS = [
    pa.field("kind", pa.string()),  # "io_uring"
    pa.field("dev", pa.uint32()),  # the file's identity, taken in the kernel at the read
    pa.field("ino", pa.uint64()),
    pa.field("opcode", pa.string()),  # read | readv | read_fixed | readv_fixed
    pa.field("uring_path", pa.string()),  # inline | async | punted (PATHS)
    pa.field("io_tid", pa.int32()),  # the thread that issued the read (0: an io-wq worker not seen)
    pa.field("complete_tid", pa.int32()),  # where the CQE was posted
    pa.field("punt_ns", pa.int64()),  # submit -> handed to io-wq (null: not punted)
    pa.field("direct", pa.bool_()),  # O_DIRECT: the page cache was bypassed
    pa.field("sqpoll", pa.bool_()),  # submitted by the ring's SQPOLL thread
    pa.field("fixed_file", pa.bool_()),  # fd is a registered file's index
    pa.field("sqe_flags", pa.int32()),  # IOSQE_*
    pa.field("user_data", pa.uint64()),
    pa.field("ring", pa.uint64()),  # the io_ring_ctx pointer: one value per ring
]
#: CALL_SCHEMA columns this probe does not measure (yet): null
_EVIDENCE = ("reclaim_ns", "offcpu_ns", "runq_ns")  # not per request: many share one wait in io_uring_enter
ISSUE_EVIDENCE = ("pages_added", "bio_count", "bio_ns")  # the issuing thread's, with HAVEISSUE_EVIDENCE


@lru_cache(maxsize=None)
def opcode_names(btf_path: str = kbtf.VMLINUX) -> dict[int, str]:
    st = btf_status(btf_path)
    return {v: OPCODES[m][len("IORING_OP_"):].lower() for m, v in st["opcodes"].items()}


def decode(recs: np.ndarray, armed_ns: int | None = None) -> pa.Table:
    """``struct uring_record`` rows -> one read event a row: CALL_SCHEMA's columns (path "" until an
    enricher names the (dev, ino); ``syscall`` "io_uring"; ``fd`` the sqe's fd or registered index;
    the in-flight evidence columns null: not measured by this probe) followed by :data:`URING_FIELDS`.
    Requests submitted before ``armed_ns`` cannot be in ``recs`` (the probe saw their submit)."""
    del armed_ns  # every record's submit was seen by the armed probe
    n = len(recs)
    bits = header_defines("URING_")
    uf = recs["uflags"].astype(np.int64)
    names = opcode_names()
    cols: dict[str, pa.Array] = {}
    for f in CALL_SCHEMA:
        name = f.name
        if name in ("ts_ns", "dur_ns", "pid", "tid", "offset", "size", "ret", "flags", "fd") + ISSUE_EVIDENCE:
            cols[name] = pa.array(recs[name].astype(f.type.to_pandas_dtype()), type=f.type)
        elif name == "path":
            cols[name] = pa.array([""] * n, type=pa.string())
        elif name == "syscall":
            cols[name] = pa.array([KIND] * n, type=pa.string())
        elif name in _EVIDENCE:
            cols[name] = pa.nulls(n, type=f.type)
        elif name == "path_stale":
            cols[name] = pa.array(np.zeros(n, dtype=bool))
        elif name == "tensor":
            cols[name] = pa.array([""] * n, type=pa.string())
        elif name == "row":
            cols[name] = pa.array(np.full(n, -1, dtype=np.int64))
        else:  # a column added to the schema later: null until this decoder learns it
            cols[name] = pa.nulls(n, type=f.type)
    punt = recs["punt_ns"].astype(np.int64)
    extra = {
        "kind": pa.array([KIND] * n, type=pa.string()),
        "dev": pa.array(recs["dev"].astype(np.uint32)),
        "ino": pa.array(recs["ino"].astype(np.uint64)),
        "opcode": pa.array([names.get(int(o), str(int(o))) for o in recs["opcode"]], type=pa.string()),
        "uring_path": pa.array(np.asarray(PATHS, dtype=object)[np.minimum(recs["path"], len(PATHS) - 1)],
                               type=pa.string()),
        "io_tid": pa.array(recs["io_tid"].astype(np.int32)),
        "complete_tid": pa.array(recs["complete_tid"].astype(np.int32)),
        "punt_ns": pa.array(punt, mask=punt == 0, type=pa.int64()),
        "direct": pa.array((uf & bits["DIRECT"]) != 0),
        "sqpoll": pa.array((uf & bits["SQPOLL"]) != 0),
        "fixed_file": pa.array((uf & bits["FIXED_FILE"]) != 0),
        "sqe_flags": pa.array(recs["sqe_flags"].astype(np.int32)),
        "user_data": pa.array(recs["user_data"].astype(np.uint64)),
        "ring": pa.array(recs["ctx"].astype(np.uint64)),
    }
    cols.update(extra)
    schema = pa.schema(list(CALL_SCHEMA) + URING_FIELDS)
    return pa.table([cols[f.name] for f in schema], schema=schema)


def to_frame(recs: np.ndarray) -> pd.DataFrame:
    """:func:`decode` as a pandas DataFrame."""
    return decode(recs).to_pandas()
