"""The eviction source of the recorder: probes/evictions.bpf.c -> ``evictions`` sample rows.

Followed as data:

1. :class:`WatchedFiles` -- which files the probe records: at start every regular file the
   target has open and every file it has mapped (device + inode into the kernel's
   ``watched_files`` hash), then every file it is seen reading (a syscall batch's paths, a
   fault batch's device + inode); ``tables/eviction_files.parquet`` says since when.
2. :class:`EvictionDecoder` -- ``struct eviction_record`` -> ``evictions`` rows (columnar):
   the context code becomes its name, the comm bytes a string, the file a path;
3. :class:`Evictors` -- one ``tables/evictors.parquet`` row per removing process, read when it
   is first seen: command line, memory cgroup with its limit and usage, the file its
   fadvise / write named.  A write context is ``drop-caches`` unless the fd, still open, names
   another file (then ``unknown``).

:class:`EvictionsSource` wires them to the loaded probe for engramprof/record/recorder.py.  Lost
records (ring full) are ``evictions_lost`` rows (start_ns, end_ns, lost), as for the calls.
"""
from __future__ import annotations

import os
import time

import numpy as np
import pyarrow as pa

from engramprof import trace
from engramprof.bpf import evictions as eviction_probe
from engramprof.bpf import structs as layout
from engramprof.host.files import kernel_dev, open_regular_files
from engramprof.record.decode import LostRecords, ProbeTotals, drain_into
from engramprof.record.sources.base import NOT_ASKED, YES, Availability, Recording, Source, sync_probe_targets
from engramprof.record.sources.faults import read_maps
from engramprof.record.strings import Interner
from engramprof.sampling.procfs import find_cgroup

SAMPLE = "evictions"
LOST_SAMPLE = "evictions_lost"
DROP_CACHES = "/proc/sys/vm/drop_caches"
#: EVICT_* codes of probes/engramprof.h -> the context names of the JSON (``evicted_by``)
CONTEXT_NAMES = {"UNKNOWN": "unknown", "KSWAPD": "kswapd", "DIRECT": "direct-reclaim", "MEMCG": "memcg-reclaim",
                 "FADVISE": "fadvise", "WRITE": "drop-caches", "TRUNCATE": "truncate", "MADVISE": "madvise",
                 "PROACTIVE": "proactive-reclaim"}
RECLAIM_CONTEXTS = ("kswapd", "direct-reclaim", "memcg-reclaim", "proactive-reclaim")
DROP_CONTEXTS = ("fadvise", "drop-caches", "truncate", "madvise")


def context_codes() -> dict[int, str]:
    """EVICT_<NAME> value -> context name (the header is the one definition)."""
    defs = layout.header_defines("EVICT_")
    return {v: CONTEXT_NAMES[k] for k, v in defs.items() if k in CONTEXT_NAMES}


def target_files(pid: int) -> list[tuple[int, int, str]]:
    """(kernel dev_t, inode, path) of the regular files pid has open or mapped now."""
    out = open_regular_files(pid)
    for _s, _e, _off, dev, ino, path in read_maps(pid):
        out.setdefault((dev, ino), path.removesuffix(" (deleted)"))
    return [(dev, ino, path) for (dev, ino), path in out.items()]


def read_cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().rstrip(b"\0").replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _read_int(path: str) -> int:
    try:
        with open(path) as f:
            v = f.read().strip()
    except OSError:
        return -1
    if v == "max":
        return -1
    try:
        n = int(v)
    except ValueError:
        return -1
    return -1 if n >= (1 << 62) else n  # v1 "no limit" is PAGE_COUNTER_MAX pages


def memory_cgroup(pid: int) -> tuple[str, int, int]:
    """(relative path, limit bytes, usage bytes) of pid's memory cgroup; ("", -1, -1) unknown."""
    info, _notes = find_cgroup(pid)
    if info.v1_memory:
        return (info.v1_rel or "/", _read_int(f"{info.v1_memory}/memory.limit_in_bytes"),
                _read_int(f"{info.v1_memory}/memory.usage_in_bytes"))
    if info.v2:
        return (info.v2_rel or "/", _read_int(f"{info.v2}/memory.max"), _read_int(f"{info.v2}/memory.current"))
    return "", -1, -1


class WatchedFiles:
    """The files whose evictions are recorded, kept in the probe's hash and in a table."""

    def __init__(self, probe, paths: Interner):
        self.probe = probe
        self.paths = paths
        self.rows: list[tuple[str, int, int, int]] = []
        self.path_of: dict[tuple[int, int], str] = {}
        self.seen_paths: set[tuple[int, int]] = set()  # (pid, path code) already looked at
        self.changed = False
        self.full = False

    def add(self, dev: int, ino: int, path: str) -> None:
        key = (int(dev), int(ino))
        if key in self.path_of:
            return
        if not self.probe.watch(*key):
            self.full = True
            return
        self.path_of[key] = path
        self.rows.append((path, key[0], key[1], time.monotonic_ns()))
        self.changed = True

    def add_process(self, pid: int) -> None:
        for dev, ino, path in target_files(pid):
            self.add(dev, ino, path)

    def add_calls(self, recs: np.ndarray, path_codes: np.ndarray) -> None:
        """Files a syscall batch read that are not watched yet (by the fd, else the path)."""
        pairs = np.unique(np.stack([recs["pid"].astype(np.int64), path_codes.astype(np.int64),
                                    recs["fd"].astype(np.int64)], axis=1), axis=0)
        for pid, code, fd in pairs.tolist():
            if (pid, code) in self.seen_paths or code == 0:
                continue
            self.seen_paths.add((pid, code))
            path = self.paths.values[code]
            try:
                st = os.stat(f"/proc/{pid}/fd/{fd}")
            except OSError:
                try:
                    st = os.stat(path)
                except OSError:
                    continue
            self.add(kernel_dev(st.st_dev), st.st_ino, path)

    def add_mappings(self, files: dict) -> None:
        """The (dev, ino) -> (path, stale) of a fault recorder's mapping enrichers."""
        for (dev, ino), (path, _stale) in list(files.items()):
            self.add(dev, ino, path)

    def table(self) -> pa.Table:
        cols = list(zip(*self.rows)) if self.rows else [()] * 4
        sch = trace.table_schema("eviction_files")
        return pa.table([pa.array(list(c), type=f.type) for c, f in zip(cols, sch)], schema=sch)


class Evictors:
    """One row per process seen removing a watched page: who it is, read once."""

    def __init__(self):
        self.rows: dict[int, tuple] = {}
        self.changed = False

    def see(self, pid: int, comm: str, context: str, fd_path: str) -> None:
        if pid in self.rows:
            return
        cmdline = read_cmdline(pid) if pid else ""
        cg, limit, usage = memory_cgroup(pid) if pid and context != "kswapd" else ("", -1, -1)
        self.rows[pid] = (pid, comm, cmdline, cg, limit, usage, fd_path, time.monotonic_ns())
        self.changed = True

    def table(self) -> pa.Table:
        rows = list(self.rows.values())
        cols = list(zip(*rows)) if rows else [()] * 8
        sch = trace.table_schema("evictors")
        return pa.table([pa.array(list(c), type=f.type) for c, f in zip(cols, sch)], schema=sch)


def _fd_path(pid: int, fd: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/fd/{fd}")
    except OSError:
        return None


class EvictionDecoder:
    """``struct eviction_record`` -> ``evictions`` rows; new removers go to :class:`Evictors`."""

    def __init__(self, watched: WatchedFiles, evictors: Evictors):
        self.schema = trace.sample_schema(SAMPLE)
        self.watched = watched
        self.evictors = evictors
        self.names = context_codes()
        self.write_code = layout.header_define("EVICT_WRITE")
        self.by_target_bit = layout.header_define("EVICT_BY_TARGET")
        self.rows = 0
        self.pages = 0
        self.contexts = Interner("unknown")
        self.comms = Interner("")
        self.files = Interner("")
        self._write_ctx: dict[tuple[int, int], str] = {}  # (pid, fd) of a write -> its context

    def _comm(self, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        raw = np.stack([lo.astype("<u8"), hi.astype("<u8")], axis=1).view("S16").reshape(-1)
        uniq, inv = np.unique(raw, return_inverse=True)
        codes = np.array([self.comms.code(u.rstrip(b"\0").decode(errors="replace")) for u in uniq], dtype=np.int32)
        return codes[inv.reshape(-1)]

    def _context(self, recs: np.ndarray) -> np.ndarray:
        ctx = recs["context"].astype(np.int64)
        uniq, inv = np.unique(ctx, return_inverse=True)
        codes = np.array([self.contexts.code(self.names.get(int(c), "unknown")) for c in uniq], dtype=np.int32)
        out = codes[inv.reshape(-1)]
        w = np.flatnonzero(ctx == self.write_code)
        if len(w):  # a digit write to another file than drop_caches is not a drop
            keys = np.unique(np.stack([recs["pid"][w].astype(np.int64), recs["fd"][w].astype(np.int64)], axis=1), axis=0)
            for pid, fd in keys.tolist():
                name = self._write_ctx.get((pid, fd))
                if name is None:
                    p = _fd_path(pid, fd)
                    name = self._write_ctx[(pid, fd)] = "drop-caches" if p in (None, DROP_CACHES) else "unknown"
                if name != "drop-caches":
                    sel = w[(recs["pid"][w] == pid) & (recs["fd"][w] == fd)]
                    out[sel] = self.contexts.code(name)
        return out

    def _files(self, recs: np.ndarray) -> np.ndarray:
        keys = np.stack([recs["dev"].astype(np.int64), recs["ino"].astype(np.int64)], axis=1)
        uniq, inv = np.unique(keys, axis=0, return_inverse=True)
        codes = np.array([self.files.code(self.watched.path_of.get((int(d), int(i)), "")) for d, i in uniq.tolist()],
                         dtype=np.int32)
        return codes[inv.reshape(-1)]

    def _new_evictors(self, recs: np.ndarray, ctx_codes: np.ndarray, comm_codes: np.ndarray) -> None:
        pids, first = np.unique(recs["pid"], return_index=True)
        for pid, i in zip(pids.tolist(), first.tolist()):
            if pid in self.evictors.rows:
                continue
            fd = int(recs["fd"][i])
            self.evictors.see(int(pid), self.comms.values[comm_codes[i]], self.contexts.values[ctx_codes[i]],
                              (_fd_path(int(pid), fd) or "") if fd >= 0 else "")

    def decode(self, recs: np.ndarray) -> pa.Table | None:
        if len(recs) == 0:
            return None
        ctx = self._context(recs)
        comm = self._comm(recs["comm_lo"], recs["comm_hi"])
        self._new_evictors(recs, ctx, comm)
        files = self._files(recs)
        self.rows += len(recs)
        self.pages += int(recs["pages"].sum())
        dict_of = lambda codes, intern: pa.DictionaryArray.from_arrays(pa.array(codes, type=pa.int32()),  # noqa: E731
                                                                       intern.dictionary())
        return pa.Table.from_arrays([
            pa.array(recs["ts_ns"].astype(np.int64)),
            dict_of(files, self.files).cast(pa.string()),
            pa.array(recs["dev"].astype(np.int64)),
            pa.array(recs["ino"].astype(np.int64)),
            pa.array(recs["index"].astype(np.int64)),
            pa.array(recs["pages"].astype(np.int32)),
            dict_of(ctx, self.contexts).cast(pa.string()),
            pa.array(recs["pid"].astype(np.int32)),
            pa.array(recs["tid"].astype(np.int32)),
            dict_of(comm, self.comms).cast(pa.string()),
            pa.array((recs["flags"] & self.by_target_bit) != 0),
            pa.array(recs["cgroup_id"].astype(np.int64)),
            pa.array(recs["ctx_ns"].astype(np.int64)),
        ], schema=self.schema)


class EvictionsSource(ProbeTotals, Source):
    """Loads the eviction probe (attached at once), watches the target's files, feeds the sink."""

    name = "evictions"
    title = "evictions"
    # evictions before the window explain misses inside it: loaded first, kept, and drained
    # while the read probes compile
    drain_while_loading = True

    def __init__(self, rec: Recording):
        super().__init__(rec)
        self.plan = None
        self.probe: eviction_probe.LoadedEvictionProbe | None = None
        self.watched: WatchedFiles | None = None
        self.evictors = Evictors()
        self.decoder: EvictionDecoder | None = None
        self.lost = LostRecords(LOST_SAMPLE)
        self._totals: dict[str, int] = {}

    def available(self) -> Availability:
        if not self.rec.options.evictions:
            return NOT_ASKED
        if not eviction_probe.required_available():
            return Availability(False, "the kernel lacks filemap:mm_filemap_delete_from_page_cache")
        return YES

    def load(self) -> None:
        """Compile and attach the probe; watch the files the targets have open or mapped now
        (before their first recorded read)."""
        rec = self.rec
        self.plan = eviction_probe.plan(eviction_probe.EvictionProbeConfig(tgid=rec.pid, selection=rec.selection))
        self.probe = eviction_probe.LoadedEvictionProbe(self.plan)
        self.watched = WatchedFiles(self.probe, rec.paths)
        for pid in list(rec.selection.pids):
            self.watched.add_process(pid)
        self.decoder = EvictionDecoder(self.watched, self.evictors)
        self.lost.checked_ns = self.probe.armed_ns
        rec.watch_files(self)
        if self.plan.missing:
            rec.notes.append(f"eviction contexts not seen (recorded as unknown): {', '.join(self.plan.missing)}")
        rec.put_meta(evictions=self.summary())

    def arm(self) -> None:
        """Attached at load."""

    def begin_window(self, start_ns: int) -> None:
        """Kept from before the window: a page evicted before it explains a miss inside it."""

    def files_read(self, recs: np.ndarray, path_codes: np.ndarray) -> None:
        """A file read for the first time: watch its evictions."""
        self.watched.add_calls(recs, path_codes)
        self._put_watched()

    def files_mapped(self, per_pid) -> None:
        """A newly mapped file: watch its evictions."""
        for enricher in list(getattr(per_pid, "by_pid", {}).values()):
            self.watched.add_mappings(enricher.files)
        self._put_watched()

    def _put_watched(self) -> None:
        if self.watched.changed:
            self.rec.sink.put_table("eviction_files", self.watched.table())
            self.watched.changed = False

    def drain(self, sink) -> None:
        if self.probe is None or self.probe.bpf is None:
            return
        # window=None: the evictions from before the recording's window are kept -- a page
        # evicted before the window starts explains a miss inside it
        drain_into(sink, self.probe, self.probe.ring.drain(), ((SAMPLE, self.decoder.decode),), self.lost,
                   window=None)
        if self.watched.changed:
            sink.put_table("eviction_files", self.watched.table())
            self.watched.changed = False
        if self.evictors.changed:
            sink.put_table("evictors", self.evictors.table())
            self.evictors.changed = False

    def detach(self) -> None:
        if self.probe is not None:
            self.probe.detach()

    def sync_targets(self) -> None:
        sync_probe_targets(self.probe)

    def snapshot(self, sink) -> dict:
        return {"evictions": self.summary()}

    def summary(self) -> dict:
        """What meta.json and the summary say about the evictions (``evictions``)."""
        t = self.totals()
        by_ctx = {"kswapd": t.get("ctx_kswapd", 0), "direct-reclaim": t.get("ctx_direct", 0),
                  "memcg-reclaim": t.get("ctx_memcg", 0), "fadvise": t.get("ctx_fadvise", 0),
                  "drop-caches": t.get("ctx_write", 0), "truncate": t.get("ctx_truncate", 0),
                  "madvise": t.get("ctx_madvise", 0), "proactive-reclaim": t.get("ctx_proactive", 0),
                  "unknown": t.get("ctx_unknown", 0)}
        return {"probe": eviction_probe.PROBE_FILE, "evictions": t.get("evictions", 0), "pages": t.get("pages", 0),
                "recorded": self.decoder.rows if self.decoder else 0, "lost_records": t.get("lost_records", 0),
                "lost_record_intervals": self.lost.intervals, "pages_by_context": by_ctx,
                "untracked_contexts": t.get("no_state", 0),
                "files_watched": len(self.watched.path_of) if self.watched else 0,
                "watch_full": self.watched.full if self.watched else False,
                "blind_contexts": self.plan.blind_contexts if self.plan else [],
                "missing_tracepoints": self.plan.missing if self.plan else []}

    def close(self) -> None:
        self.rec.unwatch_files(self)
        if self.probe is not None and self.probe.bpf is not None:
            self.totals()
            self.probe.close()
