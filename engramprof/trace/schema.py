"""Every table and column of a trace bundle, and the format version.

This is the one list: the recorder writes these columns (engramprof/record), the samplers
write the sample series (engramprof/sampling/sampler.py), and the analysis reads what
:data:`SAMPLE_READ_COLUMNS` and :data:`CONTRACT_COLUMNS` name.  A column added, removed or
re-typed here is a format change: bump :data:`FORMAT_VERSION` and teach :func:`load_bundle`
(engramprof/trace/reader.py) to read the older layout.

Format versions:

1. calls/ without ``kind``.
2. calls/ gains ``kind`` (``syscall``; a later probe adds ``fault``).  Version-1 bundles are
   read with ``kind`` = ``syscall``.
3. calls/ gains the page-fault columns ``major``, ``mapped_pages`` and ``address``
   (:data:`FAULT_FIELDS`; read events of kind ``fault`` come from probes/faults.bpf.c).
   Older bundles are read with ``major`` = false, ``mapped_pages`` = 0, ``address`` null.
4. calls/ gains the io_uring columns ``uring_path``, ``io_tid`` and ``direct`` (:data:`URING_FIELDS`;
   read events of kind ``io_uring`` come from probes/uring.bpf.c).  Other kinds, and older
   bundles, have them null.
5. calls/ gains the file identity ``dev`` and ``ino`` (:data:`FILE_FIELDS`): the device and
   inode of the file each read event read, taken in the kernel at the read, so a path is a name
   for an identity and never a guess from an fd number.  ``READ_KINDS`` gains ``libaio``; the
   ``syscall`` column gains ``read`` and ``readv``; ``direct`` (format 4) is filled for every
   kind that can bypass the page cache (syscall, io_uring, libaio) and null for faults.
   Older bundles have ``dev`` / ``ino`` null.  samples/ gains ``disks``: each block device's
   read counters from /proc/diskstats (the device's own service, the baseline of storage time,
   engramprof/analysis/baseline.py); older bundles have none.  tables/ may hold ``thread_kinds``
   (tid, kind python | native, source): written by a sampler that reads the interpreter's own
   thread states (a py-spy stack sampler); the analysis prefers it to the markers' python_tids
   and to thread names (engramprof/analysis/thread_kinds.py).
   samples/ gains ``stacks`` (engramprof/sampling/stacks.py): the target's Python threads
   sampled with py-spy, one row per thread and round: ``ts_ns`` / ``window_ns`` (the stacks
   were read inside [ts_ns - window_ns, ts_ns]), ``round``, ``pid``, ``tid`` (OS thread id, the
   calls' tid), ``thread_name``, ``gil`` (it held the GIL), ``active`` (runnable in /proc),
   ``frames`` (innermost first, one a line: function TAB filename TAB line) and ``depth``.
   Older bundles, and targets that are not CPython, have none.
6. calls/ gains ``on_code`` (:data:`FAULT_FIELDS`): a page fault on the process's own code
   (a file it maps executable, or a runtime file such as the loader's cache), as the recorder
   saw its mappings; false for every other row.  Such faults are not table reads.  Older
   bundles have it false and the analysis also names code by its path (CODE_PATH), as before.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa

FORMAT = "engramprof-trace"
FORMAT_VERSION = 6

# ---------------------------------------------------------------------- read events (calls/)

# The per-call columns.  The first nine are the DESIGN.md contract.  Columns whose name is a
# field of the probe's ``struct call_record`` (probes/engramprof.h) are copied from it, cast to
# the type given here; the others are added by the recorder's enrichers (ENRICHED_COLUMNS).
CALL_SCHEMA = pa.schema(
    [
        ("ts_ns", pa.int64()),  # call entry, CLOCK_MONOTONIC ns
        ("dur_ns", pa.int64()),  # entry -> exit
        ("pid", pa.int32()),
        ("tid", pa.int32()),
        ("path", pa.string()),  # fd -> path at the time of the call ("" when unknown)
        ("offset", pa.int64()),  # file offset (-1: current position, preadv2 only; read/readv: f_pos at entry)
        ("size", pa.int64()),  # bytes requested (sum of iov_len)
        ("ret", pa.int64()),  # bytes read, or -errno
        ("flags", pa.int64()),  # RWF_* bits (0 for preadv / pread64)
        # evidence gathered in the kernel while the call was in flight on its thread
        ("syscall", pa.string()),  # preadv2 | preadv | pread64 | read | readv (fault, io_uring, libaio: other kinds)
        ("fd", pa.int32()),
        ("pages_added", pa.int32()),  # page-cache insertions on this thread during the call
        ("bio_count", pa.int32()),  # bios queued by this thread during the call
        ("bio_ns", pa.int64()),  # sum over those bios of queue -> complete
        ("reclaim_ns", pa.int64()),  # direct + memcg reclaim time inside the call
        ("offcpu_ns", pa.int64()),  # switched-out time inside the call (includes runq)
        ("runq_ns", pa.int64()),  # of which: runnable but waiting for a CPU
        ("path_stale", pa.bool_()),  # fd had been closed/reused when the path was resolved
        ("tensor", pa.string()),  # safetensors tensor the offset falls in ("" if none)
        ("row", pa.int64()),  # row of that tensor (-1 if none)
    ]
)
# What kind of read event a row is.  CALL_SCHEMA is what a producer of read *calls* supplies;
# the writer adds ``kind`` (``syscall``) when a producer leaves it out, so EVENT_SCHEMA is what
# is on disk.  ``kind`` may also be given as a code: an index into READ_KINDS.
READ_KINDS = ("syscall", "fault", "io_uring", "libaio")
KIND_FIELD = pa.field("kind", pa.string())  # READ_KINDS
# Columns only a page fault fills (format 3).  A syscall row has major = false,
# mapped_pages = 0, address = null; a producer that leaves them out gets those values.
FAULT_FIELDS = [
    pa.field("major", pa.bool_()),  # a major fault by the kernel's rule (docs/model.md: page missing, mmap-lock retry)
    pa.field("mapped_pages", pa.int32()),  # pages of its fault-around window (mm_filemap_map_pages)
    pa.field("address", pa.int64()),  # faulting user address; null where the kernel cannot tell
    pa.field("on_code", pa.bool_()),  # (format 6) on the process's own code or runtime files: not a table read
]
FAULT_DEFAULTS = {"major": False, "mapped_pages": 0, "address": None, "on_code": False}
# Columns only an io_uring read request fills (format 4); null for every other kind.
URING_FIELDS = [
    pa.field("uring_path", pa.string()),  # inline | async | punted: how the request was served
    pa.field("io_tid", pa.int32()),  # the thread that issued the read (an io-wq worker when punted; 0: not seen)
    pa.field("direct", pa.bool_()),  # the file was open with O_DIRECT: the page cache was bypassed
]
URING_DEFAULTS = {"uring_path": None, "io_tid": None, "direct": None}
# The file a read event read, from the kernel at the read (format 5); null where not known.
FILE_FIELDS = [
    pa.field("dev", pa.int64()),  # the file's device, as a userspace dev_t (major << 8 | minor, st_dev)
    pa.field("ino", pa.int64()),  # its inode number
]
FILE_DEFAULTS = {"dev": None, "ino": None}
# every column a producer may leave out, and the value a read event of another kind has there
OPTIONAL_FIELDS = FAULT_FIELDS + URING_FIELDS + FILE_FIELDS
OPTIONAL_DEFAULTS = {**FAULT_DEFAULTS, **URING_DEFAULTS, **FILE_DEFAULTS}
EVENT_SCHEMA = pa.schema(list(CALL_SCHEMA) + [KIND_FIELD] + OPTIONAL_FIELDS)

# On disk the string columns are dictionary-encoded (few distinct values, many rows);
# load() hands path/syscall/tensor back as plain strings and ``kind`` as a categorical.
DICT_COLUMNS = ("path", "syscall", "tensor", "kind", "uring_path")
WRITE_SCHEMA = pa.schema([
    pa.field(f.name, pa.dictionary(pa.int32(), pa.string())) if f.name in DICT_COLUMNS else f for f in EVENT_SCHEMA
])
CONTRACT_COLUMNS = ["ts_ns", "dur_ns", "pid", "tid", "path", "offset", "size", "ret", "flags"]
EVIDENCE_COLUMNS = ["pages_added", "bio_count", "bio_ns", "reclaim_ns", "offcpu_ns", "runq_ns"]
#: integer columns a compact load stores in the narrowest type their statistics allow (int8,
#: int16 or int32; other int64 columns: int32 at most): every reader of these in the analysis
#: converts them to float64 or compares them, never multiplies or sums them in their own type
SMALL_INT_COLUMNS = tuple(EVIDENCE_COLUMNS)
# columns not in the probe's record: the recorder's enrichers (and the decoder, for kind) add them
ENRICHED_COLUMNS = ("path", "path_stale", "tensor", "row")
# record fields decoded into another column's values rather than copied (syscall code -> name)
CODED_COLUMNS = ("syscall",)


def check_record_columns(record: np.dtype) -> None:
    """Raise RuntimeError unless the probe's record struct and CALL_SCHEMA describe the same
    columns: every struct field (but ``__pad*``) is a column (of CALL_SCHEMA, or an optional one
    the decoder fills: the file identity, ``direct``), and every column is a struct field or an
    enriched column.  Run when a probe is loaded, so neither list can drift."""
    fields = [f for f in record.names if not f.startswith("__")]
    optional = {f.name for f in OPTIONAL_FIELDS}
    extra = [f for f in fields if f not in CALL_SCHEMA.names and f not in optional]
    lacking = [c for c in CALL_SCHEMA.names if c not in fields and c not in ENRICHED_COLUMNS]
    enriched_in_record = [c for c in ENRICHED_COLUMNS if c in fields]
    if extra or lacking or enriched_in_record:
        raise RuntimeError(
            "call_record (probes/engramprof.h) and CALL_SCHEMA (engramprof/trace/schema.py) disagree: "
            f"fields without a column {extra}, columns without a field {lacking}, "
            f"enriched columns also in the record {enriched_in_record}")


def fault_default_column(name: str, n: int) -> pa.Array:
    """``n`` rows of an :data:`OPTIONAL_FIELDS` column for events of another kind."""
    typ = EVENT_SCHEMA.field(name).type
    value = OPTIONAL_DEFAULTS[name]
    return pa.nulls(n, type=typ) if value is None else pa.array(np.full(n, value), type=typ)


def with_fault_columns(table: pa.Table) -> pa.Table:
    """``table`` with every :data:`OPTIONAL_FIELDS` column it lacks, at the value of another
    kind."""
    for f in OPTIONAL_FIELDS:
        if f.name not in table.column_names:
            table = table.append_column(f, fault_default_column(f.name, table.num_rows))
    return table


def kind_column(kind: str, n: int) -> pa.DictionaryArray:
    """``n`` read events of one kind, dictionary-coded."""
    return pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, dtype=np.int32)), pa.array([kind], type=pa.string()))


def kind_categorical(kind: str, n: int) -> pd.Categorical:
    """A loaded ``kind`` column for a bundle that has none (format 1): one category, int8 codes."""
    return pd.Categorical.from_codes(np.zeros(n, dtype=np.int8), categories=[kind])


# ----------------------------------------------------------------------- samples/<name>/

SAMPLE_NAMES = ("psi", "vmstat", "kswapd", "cgroup", "process", "threads", "disks")
PSI_RESOURCES = ("cpu", "memory", "io")

# /proc/vmstat counters recorded as per-interval deltas (pages, except pgpgin: KiB).
VMSTAT_COUNTERS = (
    "workingset_refault_file",
    "workingset_activate_file",
    "workingset_restore_file",
    "pgscan_kswapd",
    "pgsteal_kswapd",
    "pgscan_direct",
    "pgsteal_direct",
    "pgscan_khugepaged",
    "pgsteal_khugepaged",
    "pgscan_proactive",
    "pgsteal_proactive",
    "pgscan_anon",
    "pgscan_file",
    "pgsteal_anon",
    "pgsteal_file",
    "allocstall_dma",
    "allocstall_dma32",
    "allocstall_normal",
    "allocstall_movable",
    "allocstall_device",
    "pgmajfault",
    "pgpgin",
)
# Derived columns: allocstall = sum(allocstall_*); pgscan_memcg / pgsteal_memcg = reclaim done
# because a memory cgroup hit its limit (see engramprof/sampling/rows.py).
VMSTAT_DERIVED = ("allocstall", "pgscan_memcg", "pgsteal_memcg")

CGROUP_GAUGES = ("usage_bytes", "limit_bytes")
CGROUP_COUNTERS = (
    "refault_file",
    "activate_file",
    "restore_file",
    "pgscan",
    "pgsteal",
    "pgmajfault",
    "pgpgin",
    "pgpgout",
    "failcnt",
    "events_high",
    "events_max",
    "events_oom",
    "mem_some_us",
    "mem_full_us",
    "io_some_us",
    "io_full_us",
)

# Every row carries ts_ns (CLOCK_MONOTONIC, the start of its sampling round); counters are
# deltas over the interval ending at ts_ns (first row of a series: zero), *_total / cumulative
# columns as read.
SAMPLE_SCHEMAS: dict[str, list[tuple[str, pa.DataType]]] = {
    "psi": [
        ("ts_ns", pa.int64()),
        ("resource", pa.string()),
        ("some_us", pa.int64()),
        ("full_us", pa.int64()),
        ("some_total_us", pa.int64()),
        ("full_total_us", pa.int64()),
        ("some_avg10", pa.float64()),
        ("full_avg10", pa.float64()),
    ],
    "vmstat": [("ts_ns", pa.int64())] + [(c, pa.int64()) for c in VMSTAT_COUNTERS + VMSTAT_DERIVED],
    "kswapd": [
        ("ts_ns", pa.int64()),
        ("pid", pa.int32()),
        ("name", pa.string()),
        ("state", pa.string()),
        ("cpu_s", pa.float64()),
        ("cpu_total_s", pa.float64()),
    ],
    "cgroup": [("ts_ns", pa.int64())]
    + [(c, pa.int64()) for c in CGROUP_GAUGES]
    + [(c, pa.int64()) for c in CGROUP_COUNTERS],
    "process": [
        ("ts_ns", pa.int64()),
        ("pid", pa.int32()),
        ("state", pa.string()),
        ("utime_s", pa.float64()),
        ("stime_s", pa.float64()),
        ("cpu_s", pa.float64()),
        ("num_threads", pa.int32()),
        ("rss_bytes", pa.int64()),
        ("minflt", pa.int64()),
        ("majflt", pa.int64()),
        ("rchar", pa.int64()),
        ("read_bytes", pa.int64()),
        ("syscr", pa.int64()),
    ],
    "threads": [
        ("ts_ns", pa.int64()),
        ("pid", pa.int32()),
        ("tid", pa.int32()),
        ("name", pa.string()),
        ("ctx_voluntary", pa.int64()),
        ("ctx_involuntary", pa.int64()),
        ("ctx_voluntary_delta", pa.int64()),
        ("ctx_involuntary_delta", pa.int64()),
        ("utime_s", pa.float64()),
        ("stime_s", pa.float64()),
        ("cpu_s", pa.float64()),
        ("run_ns", pa.int64()),
        ("runq_ns", pa.int64()),
        ("timeslices", pa.int64()),
    ],
    # each block device's reads as the device counts them (/proc/diskstats, the counters of
    # /sys/block/<dev>/stat and of every partition), deltas over the interval; a device appears
    # in its first round (baseline, zeros) and then only in rounds where it completed a read, a
    # write or a flush.  dev: userspace dev_t (os.makedev, as st_dev); read_ticks_ms: the sum
    # over the completed reads of their time issue -> complete (ms, the kernel's own);
    # in_flight: a gauge; writes, write_sectors, flushes: what else the device served meanwhile
    # (reads queue behind writeback and cache flushes; traces before them: no such columns)
    "disks": [
        ("ts_ns", pa.int64()),
        ("dev", pa.int64()),
        ("name", pa.string()),
        ("reads", pa.int64()),
        ("reads_merged", pa.int64()),
        ("read_sectors", pa.int64()),
        ("read_ticks_ms", pa.int64()),
        ("in_flight", pa.int64()),
        ("writes", pa.int64()),
        ("write_sectors", pa.int64()),
        ("flushes", pa.int64()),
    ],
    # the target's Python stacks and GIL holder (engramprof/sampling/stacks.py; format 5)
    "stacks": [
        ("ts_ns", pa.int64()),  # CLOCK_MONOTONIC when the round's dump of this process ended
        ("window_ns", pa.int64()),  # the stacks were read inside [ts_ns - window_ns, ts_ns]
        ("round", pa.int64()),  # rounds count from 1; every thread of one dump shares it
        ("pid", pa.int32()),
        ("tid", pa.int32()),  # the OS thread id (the read events' tid)
        ("thread_name", pa.string()),
        ("gil", pa.bool_()),  # this thread held the GIL (at most one per process and round)
        ("active", pa.bool_()),  # runnable (state R) per /proc, read just before its stack
        ("frames", pa.string()),  # innermost first, one a line: function \t filename \t line
        ("depth", pa.int32()),
    ],
    # a read's native frames: its user stack copied at the call (probes/native.h), unwound with
    # the binaries' CFI and symbolized (engramprof/sampling/native.py); one call per CPU every
    # 1 / --stack-hz at most.  (pid, tid, ts_ns) is the read event's own: an exact join
    "native_stacks": [
        ("ts_ns", pa.int64()),  # the read's entry (its event's ts_ns)
        ("pid", pa.int32()),
        ("tid", pa.int32()),
        ("frames", pa.string()),  # innermost first, one a line: function \t module \t 0
        ("depth", pa.int32()),
    ],
    # kswapd wake / sleep, from the probe's vm_events ring (system-wide, rare)
    "kswapd_events": [
        ("ts_ns", pa.int64()),
        ("nid", pa.int32()),
        ("event", pa.string()),  # wake | sleep
    ],
    # holes in the record stream: between two drains of the ring buffer (start_ns, end_ns:
    # the drains' CLOCK_MONOTONIC times) the kernel counted ``lost`` records it could not
    # deliver (ring full); the analysis treats [start_ns, end_ns] as blind
    "lost_records": [
        ("start_ns", pa.int64()),
        ("end_ns", pa.int64()),
        ("lost", pa.int64()),
    ],
    # every off-CPU span of the target's threads, in or out of a read (probes/sched.bpf.c):
    # switched out at start_ns, back on a CPU at end_ns; preempted (still runnable: waited
    # for a CPU) or a voluntary sleep; who woke it (sched_wakeup's waker, -1: not seen)
    "offcpu": [
        ("tid", pa.int32()),
        ("start_ns", pa.int64()),
        ("end_ns", pa.int64()),
        ("preempted", pa.bool_()),
        ("waker_tid", pa.int32()),
        ("waker_pid", pa.int32()),
    ],
    # the page cache of the watched files (probes/pagecache.bpf.c, engramprof/record/sources/pagecache.py):
    # event insert = a run of pages [first_page, first_page + pages) inserted by one thread
    # (ts_ns first insertion, dur_ns to the last); sync_ra / async_ra / ra_order / ra_unbounded =
    # a readahead window the kernel chose (pages = its size, async_pages its async part);
    # target: in a traced thread; in_hint: inside its fadvise / madvise / readahead(2);
    # open_at_end: a run still open when the recording ended; holes: samples/pagecache_lost
    "pagecache": [
        ("ts_ns", pa.int64()),
        ("dur_ns", pa.int64()),
        ("pid", pa.int32()),
        ("tid", pa.int32()),
        ("event", pa.string()),
        ("dev", pa.int64()),  # kernel dev_t (major << 20 | minor)
        ("ino", pa.int64()),
        ("path", pa.string()),  # "" when no traced process has the file open or mapped
        ("first_page", pa.int64()),
        ("pages", pa.int64()),
        ("async_pages", pa.int64()),
        ("ra_pages", pa.int64()),
        ("target", pa.bool_()),
        ("in_hint", pa.bool_()),
        ("open_at_end", pa.bool_()),
    ],
    # the target's page-cache hints, one row per file range: call fadvise | madvise | readahead;
    # advice WILLNEED, DONTNEED, RANDOM, SEQUENTIAL, POPULATE_READ, PAGEOUT, ...; address: the
    # madvise start (null otherwise); offset / length: as called (length 0: to the end); the
    # file pages covered [first_page, first_page + pages); ret: the call's return value
    "pagecache_hints": [
        ("ts_ns", pa.int64()),
        ("dur_ns", pa.int64()),
        ("pid", pa.int32()),
        ("tid", pa.int32()),
        ("call", pa.string()),
        ("advice", pa.string()),
        ("fd", pa.int32()),
        ("address", pa.int64()),
        ("offset", pa.int64()),
        ("length", pa.int64()),
        ("path", pa.string()),
        ("dev", pa.int64()),
        ("ino", pa.int64()),
        ("first_page", pa.int64()),
        ("pages", pa.int64()),
        ("ret", pa.int64()),
    ],
    # every removal of a watched file's page from the page cache (probes/evictions.bpf.c,
    # system-wide, filtered in the kernel to the files the target reads): the folio's first
    # page and its size, and who removed it in which context (engramprof/record/sources/evictions.py:
    # kswapd | direct-reclaim | memcg-reclaim | fadvise | drop-caches | truncate | unknown);
    # holes in this stream are samples/evictions_lost (lost_records' columns)
    "evictions": [
        ("ts_ns", pa.int64()),
        ("path", pa.string()),
        ("dev", pa.int64()),  # kernel dev_t (major << 20 | minor)
        ("ino", pa.int64()),
        ("index", pa.int64()),  # first page of the folio
        ("pages", pa.int32()),  # 1 << folio order
        ("context", pa.string()),
        ("pid", pa.int32()),  # tgid of the removing task
        ("tid", pa.int32()),
        ("comm", pa.string()),
        ("by_target", pa.bool_()),  # the removing task is one of the traced processes
        ("cgroup_id", pa.int64()),  # its cgroup2 id
        ("ctx_ns", pa.int64()),  # when its reclaim / syscall began; 0: no context
    ],
}

#: the read events' columns the batch analysis reads (engramprof.analysis): a bundle is read
#: with only these, compact (load_bundle(columns=EVENT_READ_COLUMNS, compact=True))
EVENT_READ_COLUMNS = ["ts_ns", "dur_ns", "pid", "tid", "kind", "path", "offset", "ret", "flags",
                      "pages_added", "bio_count", "bio_ns", "reclaim_ns", "offcpu_ns", "runq_ns", "tensor", "row",
                      "uring_path", "direct", "syscall", "dev", "on_code"]
#: of EVENT_READ_COLUMNS, those only a batch's slowest event is named by (the batch table's
#: slowest_row): left on disk by the analysis's load until those few rows are asked for
#: (load_bundle(later=LATER_COLUMNS): 4 bytes an event less held through the analysis)
LATER_COLUMNS = ("row",)
# The sample columns the analysis reads (engramprof.analysis.context); each is in SAMPLE_SCHEMAS.
SAMPLE_READ_COLUMNS = {
    "threads": ["ts_ns", "tid", "ctx_voluntary", "ctx_involuntary"],
    "vmstat": ["ts_ns", "workingset_refault_file"],
    "psi": ["ts_ns", "resource", "some_us"],
    "cgroup": ["ts_ns", "refault_file"],
    "lost_records": ["start_ns", "end_ns", "lost"],
    "offcpu": ["tid", "start_ns", "end_ns", "preempted", "waker_tid"],
    "disks": ["ts_ns", "dev", "name", "reads", "read_sectors", "read_ticks_ms"],
}


def sample_schema(name: str) -> pa.Schema:
    """The Arrow schema of sample series ``name`` (every flushed part has exactly this)."""
    return pa.schema(SAMPLE_SCHEMAS[name])


def kswapd_events_table(ts_ns: np.ndarray, nid: np.ndarray, is_wake: np.ndarray) -> pa.Table:
    """The ``kswapd_events`` sample rows of some decoded vm_event records."""
    return pa.table({
        "ts_ns": pa.array(np.asarray(ts_ns).astype(np.int64)),
        "nid": pa.array(np.asarray(nid).astype(np.int32)),
        "event": pa.array(np.where(is_wake, "wake", "sleep").tolist(), type=pa.string()),
    }, schema=sample_schema("kswapd_events"))


def lost_records_table(start_ns, end_ns, lost) -> pa.Table:
    """``lost_records`` sample rows: the kernel dropped ``lost`` records between the drains at
    ``start_ns`` and ``end_ns``."""
    return pa.table({"start_ns": pa.array(np.asarray(start_ns, dtype=np.int64)),
                     "end_ns": pa.array(np.asarray(end_ns, dtype=np.int64)),
                     "lost": pa.array(np.asarray(lost, dtype=np.int64))}, schema=sample_schema("lost_records"))


# ------------------------------------------------------------------------ tables/<name>

TABLE_SCHEMAS: dict[str, list[tuple[str, pa.DataType]]] = {
    # the kernel's per-fd log2(ns) latency histogram (exact even when records were lost)
    "latency_log2_by_fd": [("fd_slot", pa.int64()), ("path", pa.string()), ("log2_slot", pa.int64()),
                           ("ns_lower", pa.int64()), ("count", pa.int64())],
    # the kernel's log2(ns) histogram of the target's bios, queue -> complete
    "bio_latency_log2": [("log2_slot", pa.int64()), ("ns_lower", pa.int64()), ("count", pa.int64())],
    # every traced file's identity when first seen (engramprof/target/identity.py); replay and
    # residency --rows refuse a file that differs now
    "files": [
        ("path", pa.string()),
        ("dev", pa.int64()),
        ("ino", pa.int64()),
        ("size", pa.int64()),
        ("mtime_ns", pa.int64()),
        ("header_bytes", pa.int64()),  # 8 + N of a safetensors file, else 0
        ("header_sha256", pa.string()),  # of those bytes; "" when not safetensors or not read
        ("head_bytes", pa.int64()),  # min(size, 1 MiB)
        ("head_sha256", pa.string()),  # of those bytes; "" when not read
        ("method", pa.string()),  # how they were read: O_DIRECT | resident pages | not read: why
        ("first_seen_ns", pa.int64()),  # CLOCK_MONOTONIC
    ],
    # who removed the traced files' pages (samples/evictions' pids), read when first seen
    "evictors": [
        ("pid", pa.int32()),
        ("comm", pa.string()),
        ("cmdline", pa.string()),  # "" when the process had exited before it was read
        ("cgroup", pa.string()),  # its memory cgroup (v1 memory controller, else cgroup2), relative
        ("cgroup_limit_bytes", pa.int64()),  # that group's limit (-1: none / unknown)
        ("cgroup_usage_bytes", pa.int64()),  # its usage when first seen (-1: unknown)
        ("fd_path", pa.string()),  # the file its fadvise / write / truncate named ("" if none)
        ("first_seen_ns", pa.int64()),
    ],
    # which threads are Python threads (they have an interpreter thread state) and which are
    # native (OpenMP, a library's pool, io-wq), as a sampler that reads the interpreter saw them:
    # kind python | native; source: how it knew (e.g. "py-spy: a Python thread state")
    "thread_kinds": [("pid", pa.int32()), ("tid", pa.int32()), ("kind", pa.string()), ("source", pa.string())],
    # the files the eviction probe watched, and since when (CLOCK_MONOTONIC)
    "eviction_files": [("path", pa.string()), ("dev", pa.int64()), ("ino", pa.int64()), ("watched_ns", pa.int64())],
}


def table_schema(name: str) -> pa.Schema:
    return pa.schema(TABLE_SCHEMAS[name])


def fd_latency_table(hists: dict[int, np.ndarray], path_of) -> pa.Table:
    """``latency_log2_by_fd`` from {fd slot: log2 counts}; ``path_of(fd_slot)`` names the file."""
    rows = []
    for fdslot, counts in hists.items():
        path = path_of(fdslot)
        for slot in np.nonzero(counts)[0].tolist():
            rows.append((int(fdslot), path, slot, 1 << slot, int(counts[slot])))
    cols = list(zip(*rows)) if rows else [()] * 5
    sch = table_schema("latency_log2_by_fd")
    return pa.table([pa.array(list(c), type=f.type) for c, f in zip(cols, sch)], schema=sch)


def bio_latency_table(counts: np.ndarray) -> pa.Table:
    """``bio_latency_log2`` from the kernel's log2 counts (empty slots left out)."""
    slots = np.nonzero(counts)[0]
    return pa.table({"log2_slot": slots.astype(np.int64), "ns_lower": np.left_shift(1, slots).astype(np.int64),
                     "count": np.asarray(counts)[slots].astype(np.int64)}, schema=table_schema("bio_latency_log2"))
