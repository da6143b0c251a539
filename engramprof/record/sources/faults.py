"""The page-fault source of the recorder: probes/faults.bpf.c -> read events of kind ``fault``.

Followed as data (the same pipeline as the syscall records, engramprof/record/__init__.py):

1. :class:`FaultDecoder` -- ``struct fault_record`` -> a :class:`~.decode.ReadBatch` of kind
   ``fault`` whose records (:class:`FaultColumns`: contiguous columns in the trace's types, so
   the table builder copies none of them) carry the call columns (``offset`` = page index x page size,
   ``size`` = one page, ``ret`` null, ``flags`` 0, ``fd`` -1, ``syscall`` = ``fault``) plus the
   fault columns ``major``, ``mapped_pages``, ``address`` (null without page_fault_user);
2. :class:`MappingPathEnricher` -- device + inode -> ``path`` from ``/proc/PID/maps`` (read at
   start and again when an unknown file appears; one they did not name is not looked up again
   until the maps change or a while has passed), ``path_stale`` when the mapping's file was
   deleted or the path now names another file;
3. the shared :class:`~.enrich.TensorEnricher` (path + offset -> tensor, row) and
   :class:`~.columns.EventTableBuilder`.

:class:`FaultsSource` wires them to the loaded probe for engramprof/record/recorder.py.
"""
from __future__ import annotations

import os
import re
import time

import numpy as np
import pyarrow as pa

from engramprof.bpf import faults as fault_probe
from engramprof.bpf import structs as layout
from engramprof.host.files import CODE_PATH, RUNTIME_FILES, dev_t, file_identities, kernel_dev, st_dev_of
from engramprof.record.columns import EventTableBuilder
from engramprof.record.decode import DrainBatching, ProbeTotals, ReadBatch, WindowStart, syscall_names
from engramprof.record.enrich import PerPid, TensorEnricher
from engramprof.record.sources.base import NOT_ASKED, YES, Availability, Recording, Source, sync_probe_targets
from engramprof.record.strings import Interner

PAGE = os.sysconf("SC_PAGE_SIZE")
PAGE_SHIFT = PAGE.bit_length() - 1
_MAPS_LINE = re.compile(r"^([0-9a-f]+)-([0-9a-f]+)\s+\S+\s+([0-9a-f]+)\s+([0-9a-f]+):([0-9a-f]+)\s+(\d+)\s*(.*)$")
DELETED = " (deleted)"


class FaultColumns:
    """The records of one fault drain as contiguous columns, each already in the trace's type
    (the table builder wraps them without a copy): indexed by name like a structured array,
    by a mask or index array for a part of the batch (:class:`~.enrich.PerPid`), and a part
    written back with ``cols[mask] = part``.  One strided read per record field, none per
    record in Python."""

    __slots__ = ("cols",)

    def __init__(self, cols: dict[str, np.ndarray]):
        self.cols = cols

    def __getitem__(self, key):
        if isinstance(key, str):
            return self.cols[key]
        return FaultColumns({k: v[key] for k, v in self.cols.items()})

    def __setitem__(self, key, part: "FaultColumns") -> None:
        for k, v in self.cols.items():
            v[key] = part.cols[k]

    def __len__(self) -> int:
        return len(self.cols["ts_ns"])



def executable_files(pid: int) -> set[tuple[int, int]]:
    """(dev_t, inode) of the files pid maps executable: its program and shared objects' text."""
    out = set()
    try:
        with open(f"/proc/{pid}/maps") as f:
            for line in f:
                a = line.split(None, 5)
                if len(a) >= 5 and "x" in a[1] and a[4] != "0":
                    major, minor = (int(x, 16) for x in a[3].split(":"))
                    out.add((dev_t(major, minor), int(a[4])))
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        pass
    return out


def read_maps(pid: int) -> list[tuple[int, int, int, int, int, str]]:
    """File-backed mappings of pid: (start, end, file offset, dev_t, inode, path) per line."""
    out = []
    try:
        with open(f"/proc/{pid}/maps") as f:
            for line in f:
                m = _MAPS_LINE.match(line.rstrip("\n"))
                if not m or m.group(6) == "0":
                    continue
                out.append((int(m.group(1), 16), int(m.group(2), 16), int(m.group(3), 16),
                            dev_t(int(m.group(4), 16), int(m.group(5), 16)), int(m.group(6)), m.group(7)))
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        pass
    return out


class FaultDecoder:
    """``struct fault_record`` -> :class:`ReadBatch` of kind ``fault``."""

    kind = "fault"

    def __init__(self, record: np.dtype, armed_ns: int | None, has_address: bool):
        self.record = record
        #: the recording window's start: faults that began before it are dropped and counted
        self.window = WindowStart(armed_ns)
        self.has_address = has_address
        self.bits = layout.header_defines("FAULT_")
        self.code = syscall_names().index("fault")

    def decode(self, recs: np.ndarray) -> ReadBatch | None:
        if len(recs) == 0:
            return None
        recs = self.window.keep(recs)
        if len(recs) == 0:
            return None
        n = len(recs)
        i64, i32 = np.int64, np.int32
        index = recs["index"].astype(i64)
        fl = recs["flags"].astype(i64)
        cols = {name: recs[name].astype(dt) for name, dt in (
            ("ts_ns", i64), ("dur_ns", i64), ("pid", i32), ("tid", i32), ("pages_added", i32), ("bio_count", i32),
            ("bio_ns", i64), ("reclaim_ns", i64), ("offcpu_ns", i64), ("runq_ns", i64),
            # kept for the enrichers
            ("dev", np.uint64), ("ino", np.uint64), ("address", np.uint64))}
        # the call columns a fault has by construction (ret: null, the builder's `missing`)
        cols.update(index=index, offset=index * PAGE, size=np.full(n, PAGE, dtype=i64), flags=np.zeros(n, dtype=i64),
                    fd=np.full(n, -1, dtype=i32), syscall=np.full(n, self.code, dtype=i32), fault_flags=fl)
        has_addr = (fl & self.bits["ADDRESS"]) != 0
        if not self.has_address or not has_addr.any():
            addr = pa.nulls(n, type=pa.int64())
        else:
            addr = pa.array(cols["address"].view(i64), mask=None if has_addr.all() else ~has_addr, type=pa.int64())
        known = recs["ino"] != 0  # the file's identity, from the kernel at the fault (0: not seen)
        out = {"major": (fl & self.bits["MAJOR"]) != 0,
               "mapped_pages": recs["mapped_pages"].astype(i32),
               "address": addr,
               "dev": pa.array(st_dev_of(recs["dev"].astype(i64)), mask=~known, type=pa.int64()),
               "ino": pa.array(recs["ino"].astype(i64), mask=~known, type=pa.int64())}
        return ReadBatch(self.kind, FaultColumns(cols), out)

    @property
    def partial_at_start(self) -> int:
        return self.window.partial_at_start


def _distinct_files(dev: np.ndarray, ino: np.ndarray) -> tuple[list[tuple[int, int]], np.ndarray]:
    """The distinct (device, inode) pairs of a batch and each record's index into them.  A
    drain holds a handful of files: one pass when they are all one file (the common case),
    else 1-D uniques (``np.unique(axis=0)`` sorts the rows as opaque bytes: milliseconds a drain)."""
    n = len(ino)
    if n == 0:
        return [], np.zeros(0, dtype=np.intp)
    if (ino == ino[0]).all() and (dev == dev[0]).all():
        return [(int(dev[0]), int(ino[0]))], np.zeros(n, dtype=np.intp)
    ui, ii = np.unique(ino, return_inverse=True)
    ud, id_ = np.unique(dev, return_inverse=True)
    combo, inv = np.unique(ii.reshape(-1).astype(np.int64) * len(ud) + id_.reshape(-1), return_inverse=True)
    pairs = [(int(ud[c % len(ud)]), int(ui[c // len(ud)])) for c in combo.tolist()]
    return pairs, inv.reshape(-1)


class MappingPathEnricher:
    """Adds ``path`` and ``path_stale`` from the target's file mappings (device + inode)."""

    #: how long an identity the maps did not name goes without another read of them
    UNNAMED_TTL_NS = 2_000_000_000

    def __init__(self, pid: int, paths: Interner):
        self.pid = pid
        self.paths = paths
        self.files: dict[tuple[int, int], tuple[str, bool]] = {}  # (dev, ino) -> (path, stale)
        self.ranges = np.zeros((0, 5), dtype=np.uint64)  # start, end, file offset, dev, ino (sorted)
        #: (dev, ino) -> (starts, ends, file offsets) of that file's mappings, sorted by start
        self._ranges_of: dict[tuple[int, int], tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        self.bits = layout.header_defines("FAULT_")
        #: (dev, ino) of the process's own code: files it maps executable anywhere (a program's or
        #: shared object's data segments are the same inode as its text), and by path (CODE_PATH:
        #: the runtime's files, the loader's cache, libc's locale archive).  No file is read.
        self.code: set[tuple[int, int]] = set()
        self.code_faults = 0  # faults on them: not table reads, counted apart
        self.code_major = 0
        self.rereads = 0
        self._named: set[str] = set()
        #: identities the maps were read for and did not name -> when (monotonic ns): a fault-heavy
        #: trace of a file the maps never name (its mapping gone by the drain, a file of another
        #: mount namespace) must not re-read /proc/PID/maps every drain.  Forgotten when the maps'
        #: identities change (a refresh for a new identity) or after ``unnamed_ttl_ns``.
        self._unnamed: dict[tuple[int, int], int] = {}
        self.unnamed_ttl_ns = self.UNNAMED_TTL_NS
        self._identities: frozenset[tuple[int, int]] = frozenset()
        self._not_code: set[tuple[int, int]] = set()
        self._name_runtime_files()
        self.refresh()

    def _name_runtime_files(self) -> None:
        """The loader's cache and libc's locale archive by identity, before any fault: a dlopen
        maps the cache and unmaps it before the maps are read, so its faults would get no name
        (and count as a table read)."""
        for path in RUNTIME_FILES:
            try:
                st = os.stat(path)
            except OSError:
                continue
            key = (kernel_dev(st.st_dev), st.st_ino)
            self.files.setdefault(key, (path, False))
            self.code.add(key)

    def refresh(self) -> None:
        maps = read_maps(self.pid)
        identities = frozenset((m[3], m[4]) for m in maps)
        if identities != self._identities:  # the maps really changed: look again for everything
            self._unnamed.clear()
            self._identities = identities
        if maps:
            r = np.array([m[:5] for m in maps], dtype=np.uint64)
            self.ranges = r[np.argsort(r[:, 0], kind="stable")]
            self._ranges_of = {}
            for key in {(int(d), int(i)) for d, i in self.ranges[:, 3:5].tolist()}:
                rows = self.ranges[(self.ranges[:, 3] == key[0]) & (self.ranges[:, 4] == key[1])]
                self._ranges_of[key] = tuple(np.ascontiguousarray(rows[:, j]) for j in range(3))
        for _s, _e, _off, dev, ino, path in maps:
            stale = path.endswith(DELETED)
            if stale:
                path = path[: -len(DELETED)]
            else:
                try:  # the path now names another file (replaced by a rename): stale too
                    st = os.stat(path)
                    stale = (st.st_ino != ino)
                except OSError:
                    stale = True
            self.files[(dev, ino)] = (path, stale)
        self._classify_code(maps)
        self._name_real_files()

    def _classify_code(self, maps) -> None:
        """Which mapped files are the process's own code (see ``code``)."""
        execs = executable_files(self.pid)
        self.code |= execs
        for _s, _e, _off, dev, ino, path in maps:
            key = (dev, ino)
            if key in self.code or key in self._not_code:
                continue
            if path.startswith("/") and CODE_PATH.search(path.removesuffix(DELETED)):
                self.code.add(key)
            else:
                self._not_code.add(key)

    def _name_real_files(self) -> None:
        """overlayfs: a fault carries the layer file's inode (it owns the pages) while
        /proc/PID/maps names the overlay's; each mapped path's real file gets its name too
        (file_identities, once per path: an open, no page read)."""
        for (_dev, _ino), (path, stale) in list(self.files.items()):
            if not path or path in self._named:
                continue
            self._named.add(path)
            try:
                ids = file_identities(path)
            except OSError:
                continue
            for i in ids:
                if i.real_path:
                    self.files.setdefault((i.dev, i.ino), (path, stale))

    def enrich(self, batch: ReadBatch) -> None:
        recs = batch.recs
        pairs, inv = _distinct_files(recs["dev"], recs["ino"])
        unknown = [p for p in pairs if p not in self.files]
        if unknown:
            self._look_up(unknown)
        codes = np.zeros(len(pairs), dtype=np.int32)
        stale = np.zeros(len(pairs), dtype=bool)
        for i, p in enumerate(pairs):
            path, st = self.files.get(p, ("", False))
            codes[i] = self.paths.code(path)
            stale[i] = st
        batch.cols["path"] = codes[inv]
        batch.cols["path_stale"] = stale[inv]
        is_code = np.array([p in self.code for p in pairs], dtype=bool)
        on_code = is_code[inv]
        batch.cols["on_code"] = on_code
        if is_code.any():
            self.code_faults += int(on_code.sum())
            self.code_major += int((on_code & ((recs["fault_flags"] & self.bits["MAJOR"]) != 0)).sum())
        self._exact_pages(batch, pairs, inv)

    def _look_up(self, unknown: list[tuple[int, int]]) -> None:
        """Re-read the maps for identities they did not name, unless every one of them was
        looked up less than ``unnamed_ttl_ns`` ago; what the new maps still do not name is
        remembered as looked up."""
        now = time.monotonic_ns()
        lately = [t for t in map(self._unnamed.get, unknown) if t is not None and now - t < self.unnamed_ttl_ns]
        if len(lately) == len(unknown):
            return
        self.rereads += 1
        self.refresh()
        now = time.monotonic_ns()
        for p in unknown:
            if p not in self.files:
                self._unnamed[p] = now

    def _exact_pages(self, batch: ReadBatch, pairs: list[tuple[int, int]], inv: np.ndarray) -> None:
        """A fault served by fault-around alone gives only its window; with the faulting address
        (page_fault_user) the page is found in the mapping that holds it.  ``pairs``, ``inv``:
        the batch's distinct (device, inode) and each record's index into them.  Per file of the
        batch (a handful): a file mapped once (the common case) is a subtraction and a shift a
        record; several mappings of it, a search among them."""
        recs = batch.recs
        fl = recs["fault_flags"]
        need = ((fl & self.bits["ADDRESS"]) != 0) & ((fl & self.bits["INDEX_EXACT"]) == 0)
        if not self._ranges_of or not need.any():
            return
        addr = recs["address"]
        page = np.full(len(addr), -1, dtype=np.int64)
        for k, key in enumerate(pairs):
            ranges = self._ranges_of.get(key)
            if ranges is None:
                continue
            starts, ends, offs = ranges
            part = None if len(pairs) == 1 else np.nonzero(inv == k)[0]
            a = addr if part is None else addr[part]
            if len(starts) == 1:
                j = 0
                ok = (a >= starts[0]) & (a < ends[0])
            else:
                j = np.maximum(np.searchsorted(starts, a, side="right") - 1, 0)
                ok = (a >= starts[j]) & (a < ends[j])
            pg = ((a - starts[j] + offs[j]) >> np.uint64(PAGE_SHIFT)).astype(np.int64)
            pg[~ok] = -1
            if part is None:
                page = pg
            else:
                page[part] = pg
        need &= page >= 0
        if need.all():
            recs["index"][:] = page
            recs["offset"][:] = page * PAGE
            return
        idx = np.nonzero(need)[0]
        recs["index"][idx] = page[idx]
        recs["offset"][idx] = page[idx] * PAGE


class FaultsSource(Source):
    """The fault probe, its decoder, enrichers and table builder: read events of kind ``fault``."""

    name = "faults"
    title = "page faults"

    def __init__(self, rec: Recording):
        super().__init__(rec)
        self.plan = None
        self.probe: fault_probe.LoadedFaultProbe | None = None
        self.decoder: FaultDecoder | None = None
        self.mappings: PerPid | None = None
        self.recorded = 0
        self.major = 0
        self.batching = DrainBatching()
        self._totals: dict[str, int] = {}

    def available(self) -> Availability:
        if not self.rec.options.faults:
            return NOT_ASKED
        if not fault_probe.required_available():
            return Availability(False, "the kernel lacks filemap:mm_filemap_fault")
        return YES

    def load(self) -> None:
        """Compile the probe, attached by :meth:`arm`."""
        rec, s = self.rec, self.rec.selection
        use_pfu = rec.options.fault_address
        if use_pfu and s.files and not s.selects_processes:
            # --file alone: page_fault_user would open per-thread state for every faulting thread
            # of the machine; the generic path opens it only at a fault on a selected file
            use_pfu = False
            rec.notes.append("page faults timed from their first filemap event (--file alone: "
                             "exceptions:page_fault_user not hooked)")
        self.plan = fault_probe.plan(fault_probe.FaultProbeConfig(tgid=rec.pid, tid=rec.tid, use_pfu=use_pfu,
                                                                  selection=s))
        self.probe = fault_probe.LoadedFaultProbe(self.plan, arm=False)
        rec.bio_histograms.append(self.probe.bio_histogram)  # the faults' bios: tables/bio_latency_log2
        self.decoder = FaultDecoder(self.probe.record_dtype, self.probe.armed_ns, self.plan.has_address)
        # one process's mappings per traced process (several with --pid repeated, --children, ...)
        paths, tensors = rec.paths, rec.tensors
        self.mappings = PerPid(lambda p: MappingPathEnricher(p, paths))
        self.mappings.of(rec.pid) if rec.pid else None
        self.enrichers = [self.mappings, TensorEnricher(paths, tensors)]
        missing = ["ret"] + [c for c in self.plan.missing_columns if c != "mapped_pages"]
        self.tables = EventTableBuilder(pa.array(syscall_names(), type=pa.string()), paths, tensors, missing=missing)
        if self.plan.missing:
            rec.notes.append(f"fault evidence not collected: {', '.join(self.plan.missing)}")
        rec.put_meta(fault_probe=fault_probe.PROBE_FILE, fault_address=self.plan.has_address,
                     fault_missing_evidence=self.plan.missing_columns)

    def arm(self) -> None:
        self.decoder.window.begin(self.probe.arm())

    def begin_window(self, start_ns: int) -> None:
        """Faults that began before the recording's window (``start_ns``) are not kept."""
        self.decoder.window.begin(start_ns)

    @property
    def partial_at_start(self) -> int:
        return self.decoder.partial_at_start if self.decoder is not None else 0

    def drain(self, sink) -> None:
        """The faults written since the last drain, as one table of read events; nothing when
        there are too few to be worth it yet (:class:`~engramprof.record.decode.DrainBatching`:
        a drain's fixed cost is paid per few thousand faults, not per 50 ms tick)."""
        table = self.drain_table()
        if table is not None:
            sink.add_events(table)
            self.rec.files_mapped(self.mappings)  # a newly mapped file: watched for evictions

    def drain_table(self) -> pa.Table | None:
        if self.probe is None or not self.batching.due(self.probe.ring):
            return None
        batch = self.decoder.decode(self.probe.ring.drain())
        if batch is None:
            return None
        for e in self.enrichers:
            e.enrich(batch)
        self.recorded += len(batch)
        self.major += int(batch.cols["major"].sum())
        return self.tables.build(batch)

    def detach(self) -> None:
        if self.probe is not None:
            self.probe.detach()
        self.batching.final = True  # everything left is drained at once

    def sync_targets(self) -> None:
        sync_probe_targets(self.probe)

    def seen_tgids(self) -> set[int]:
        # the kernel's map of targets: the same as the syscall probe's (one selection)
        return set(self.mappings.by_pid) if self.mappings is not None else set()

    def totals(self) -> dict[str, int]:
        return ProbeTotals.totals(self)

    def summary(self, totals: dict | None = None) -> dict:
        t = totals if totals is not None else self.totals()
        has_address = self.plan.has_address if self.plan is not None else False
        return {"faults": t.get("faults", 0), "major": t.get("major", 0),
                "minor": t.get("faults", 0) - t.get("major", 0), "retried": t.get("retried", 0),
                # the kernel's major rule, its two causes (docs/model.md): page missing, mmap-lock retry
                "missing": t.get("missing", 0), "lock_retried": t.get("lock_retried", 0),
                # minor faults' own events: served by fault-around alone, started async readahead
                "fault_around": t.get("fault_around", 0), "async_ra": t.get("async_ra", 0),
                "no_state": t.get("no_state", 0),
                # faults a syscall took on the target's mappings (exceptions:page_fault_kernel)
                "kernel_mode_faults": t.get("kernel_mode_faults", 0),
                # of the recorded faults, those on the process's own code and libraries: not table reads
                "code_faults": sum(e.code_faults for e in self._mapping_enrichers()),
                "code_major": sum(e.code_major for e in self._mapping_enrichers()),
                "lost_records": t.get("lost_records", 0), "recorded": self.recorded,
                "bios_untracked": t.get("bios_untracked", 0),  # in bio_count, not in bio_ns (probes/bios.h)
                "partial_at_start": self.partial_at_start,
                "sum_ms": round(t.get("sum_ns", 0) / 1e6, 3),
                "other_faults": t.get("other_faults") if has_address else None,
                "address": has_address, "missing_tracepoints": self.plan.missing if self.plan is not None else []}

    def _mapping_enrichers(self) -> list:
        return list(self.mappings.by_pid.values()) if self.mappings is not None else []

    def close(self) -> None:
        if self.probe is not None and self.probe.bpf is not None:
            self.totals()
            self.probe.close()
