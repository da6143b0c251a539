"""The page-cache source of the recorder: probes/pagecache.bpf.c -> two sample series.

- ``samples/pagecache``: page-cache insertion runs of the watched files (``event`` ``insert``:
  ``first_page`` and ``pages``, who inserted them, inside a hint or not) and the kernel's
  readahead windows (``sync_ra``, ``async_ra``, ``ra_order`` -- also the mmap read-around --,
  ``ra_unbounded`` -- the forced readahead of WILLNEED / readahead(2)).
- ``samples/pagecache_hints``: the target's fadvise64 / madvise / readahead(2) calls, one row
  per file range they cover: ``call``, ``advice``, the file pages (``first_page``, ``pages``),
  the return value.  madvise gives an address range; it is cut at the target's mappings
  (``/proc/PID/maps``, read again when an address is not in the last reading) and each file
  mapping's part is turned into file pages; a range over anonymous memory is left out (glibc
  returns freed heap with MADV_DONTNEED: not a page-cache hint).

Paths: kernel dev_t + inode -> path from the traced processes' open files and file mappings
(read at start, again about every two seconds and whenever an unknown file appears).
:class:`PagecacheSource` loads the probe, watches the files the targets have open or mapped,
and feeds the tables to the recorder's sink (engramprof/record/recorder.py).
"""
from __future__ import annotations

import os
import re
import stat
import time

import numpy as np
import pyarrow as pa

from engramprof import trace
from engramprof.bpf import pagecache as probe_mod
from engramprof.host.files import kernel_dev
from engramprof.record.decode import LostRecords, ProbeTotals, drain_into
from engramprof.record.sources.base import YES, Availability, Recording, Source, sync_probe_targets

PAGE = os.sysconf("SC_PAGE_SIZE")
SAMPLE = "pagecache"
HINT_SAMPLE = "pagecache_hints"
LOST_SAMPLE = "pagecache_lost"
REFRESH_S = 2.0
EVENT_NAMES = {"INSERT": "insert", "RA_SYNC": "sync_ra", "RA_ASYNC": "async_ra", "RA_ORDER": "ra_order",
               "RA_UNBOUNDED": "ra_unbounded"}
CALL_NAMES = {"FADVISE": "fadvise", "MADVISE": "madvise", "READAHEAD": "readahead"}
FADVISE_ADVICE = {0: "NORMAL", 1: "RANDOM", 2: "SEQUENTIAL", 3: "WILLNEED", 4: "DONTNEED", 5: "NOREUSE"}
MADVISE_ADVICE = {0: "NORMAL", 1: "RANDOM", 2: "SEQUENTIAL", 3: "WILLNEED", 4: "DONTNEED", 20: "COLD",
                  21: "PAGEOUT", 22: "POPULATE_READ"}
_MAPS = re.compile(r"^([0-9a-f]+)-([0-9a-f]+)\s+(\S+)\s+([0-9a-f]+)\s+([0-9a-f]+):([0-9a-f]+)\s+(\d+)\s*(.*)$")


class ProcessFiles:
    """One process's open regular files and mappings: fd -> (dev, ino, path), address -> file."""

    def __init__(self, pid: int):
        self.pid = pid
        self.maps = np.zeros((0, 5), dtype=np.uint64)  # start, end, file offset, dev, ino (sorted by start)
        self.map_paths: list[str] = []
        self.files: dict[tuple[int, int], str] = {}  # (kernel dev, ino) -> path
        self.read_at = 0.0
        self.refresh()

    def refresh(self) -> None:
        self.read_at = time.monotonic()
        rows, paths = [], []
        try:
            with open(f"/proc/{self.pid}/maps") as f:
                for line in f:
                    m = _MAPS.match(line.rstrip("\n"))
                    if not m:
                        continue
                    dev = (int(m.group(5), 16) << 20) | int(m.group(6), 16)
                    ino, path = int(m.group(7)), m.group(8).removesuffix(" (deleted)")
                    rows.append((int(m.group(1), 16), int(m.group(2), 16), int(m.group(4), 16), dev, ino))
                    paths.append(path if ino else "")
                    if ino and "x" not in m.group(3):  # data mappings, not the process's code
                        self.files.setdefault((dev, ino), path)
        except OSError:
            pass
        if rows:
            r = np.array(rows, dtype=np.uint64)
            order = np.argsort(r[:, 0], kind="stable")
            self.maps, self.map_paths = r[order], [paths[i] for i in order.tolist()]
        for fd in self._fds():
            hit = self.fd_file(fd)
            if hit is not None:
                self.files.setdefault(hit[:2], hit[2])

    def _fds(self) -> list[int]:
        try:
            return [int(n) for n in os.listdir(f"/proc/{self.pid}/fd")]
        except OSError:
            return []

    def fd_file(self, fd: int) -> tuple[int, int, str] | None:
        """(kernel dev, ino, path) of a regular file open as ``fd`` now, else None."""
        try:
            st = os.stat(f"/proc/{self.pid}/fd/{fd}")
            path = os.readlink(f"/proc/{self.pid}/fd/{fd}")
        except OSError:
            return None
        if not stat.S_ISREG(st.st_mode):
            return None
        return kernel_dev(st.st_dev), st.st_ino, path.removesuffix(" (deleted)")

    def segments(self, start: int, length: int) -> list[tuple[int, int, str, int, int]]:
        """The file-backed parts of [start, start + length): (dev, ino, path, first page, pages)."""
        out = []
        end = start + max(length, 1)
        if not len(self.maps):
            return out
        i = max(int(np.searchsorted(self.maps[:, 0], np.uint64(start), side="right")) - 1, 0)
        while i < len(self.maps):
            s, e, off, dev, ino = (int(v) for v in self.maps[i])
            if s >= end:
                break
            lo, hi = max(s, start), min(e, end)
            if hi > lo and ino:
                first = (lo - s + off) // PAGE
                last = (hi - 1 - s + off) // PAGE
                out.append((dev, ino, self.map_paths[i], first, last - first + 1))
            i += 1
        return out

    def covers(self, start: int) -> bool:
        if not len(self.maps):
            return False
        i = int(np.searchsorted(self.maps[:, 0], np.uint64(start), side="right")) - 1
        return i >= 0 and start < int(self.maps[i, 1])


class PagecacheDecoder:
    """``struct pagecache_record`` rows -> ``pagecache`` and ``pagecache_hints`` sample tables."""

    def __init__(self, files_of):
        self.files_of = files_of  # pid -> ProcessFiles
        self.kinds = probe_mod.defines("PC_")
        self.bits = probe_mod.defines("PCF_")
        self.calls = {v: CALL_NAMES[k] for k, v in probe_mod.defines("HINT_").items() if k in CALL_NAMES}
        self.event_names = {self.kinds[k]: v for k, v in EVENT_NAMES.items()}
        self.paths: dict[tuple[int, int], str] = {}
        self.events = 0
        self.hints = 0

    def path_of(self, pid: int, dev: int, ino: int) -> str:
        key = (dev, ino)
        if key not in self.paths:
            pf = self.files_of(pid)
            if key not in pf.files and time.monotonic() - pf.read_at > 0.2:
                pf.refresh()
            path = pf.files.get(key)
            if path is None:  # another traced process may have it
                path = next((p.files[key] for p in self.files_of(None) if key in p.files), None)
            if path is None:
                return ""
            self.paths[key] = path
        return self.paths[key]

    def events_table(self, recs: np.ndarray) -> pa.Table | None:
        recs = recs[recs["kind"] != self.kinds["HINT"]]
        if not len(recs):
            return None
        self.events += len(recs)
        fl = recs["flags"].astype(np.int64)
        names = np.array([self.event_names.get(int(k), "unknown") for k in range(max(self.event_names) + 1)],
                         dtype=object)
        is_ra = recs["kind"] != self.kinds["INSERT"]
        paths = [self.path_of(int(p), int(d), int(i)) for p, d, i in zip(recs["pid"], recs["dev"], recs["ino"])]
        extra = recs["extra"].astype(np.uint64)
        return pa.table({
            "ts_ns": pa.array(recs["ts_ns"].astype(np.int64)),
            "dur_ns": pa.array(recs["dur_ns"].astype(np.int64)),
            "pid": pa.array(recs["pid"].astype(np.int32)),
            "tid": pa.array(recs["tid"].astype(np.int32)),
            "event": pa.array(names[np.minimum(recs["kind"], len(names) - 1)].tolist(), type=pa.string()),
            "dev": pa.array(recs["dev"].astype(np.int64)),
            "ino": pa.array(recs["ino"].astype(np.int64)),
            "path": pa.array(paths, type=pa.string()),
            "first_page": pa.array(recs["index"].astype(np.int64)),
            "pages": pa.array(recs["count"].astype(np.int64)),
            "async_pages": pa.array(np.where(is_ra, extra & np.uint64(0xFFFFFFFF), 0).astype(np.int64)),
            "ra_pages": pa.array(np.where(is_ra, extra >> np.uint64(32), 0).astype(np.int64)),
            "target": pa.array((fl & self.bits["TARGET"]) != 0),
            "in_hint": pa.array((fl & self.bits["IN_HINT"]) != 0),
            "open_at_end": pa.array((fl & self.bits["OPEN"]) != 0),
        }, schema=trace.sample_schema(SAMPLE))

    def hints_table(self, recs: np.ndarray) -> pa.Table | None:
        recs = recs[recs["kind"] == self.kinds["HINT"]]
        if not len(recs):
            return None
        rows = []
        for r in recs.tolist():
            ts, dur, _ino, index, count, advice, ret, pid, tid, _dev, fd, _kind, _fl, call, _pad = r
            name = self.calls.get(call, "unknown")
            base = (ts, dur, pid, tid, name)
            if name == "madvise":
                pf = self.files_of(pid)
                if not pf.covers(index) and time.monotonic() - pf.read_at > 0.05:
                    pf.refresh()
                for dev, ino, path, first, pages in pf.segments(index, count):
                    rows.append(base + (MADVISE_ADVICE.get(advice, str(advice)), -1, index, first * PAGE,
                                        count, path, dev, ino, first, pages, ret))
                continue
            hit = self.files_of(pid).fd_file(fd)
            dev, ino, path = hit if hit is not None else (0, 0, "")
            length = count
            if count == 0 and path:  # fadvise len 0: to the end of the file
                try:
                    length = max(os.stat(path).st_size - index, 0)
                except OSError:
                    length = 0
            first = index // PAGE
            pages = (index + length + PAGE - 1) // PAGE - first if length else 0
            adv = FADVISE_ADVICE.get(advice, str(advice)) if name == "fadvise" else "WILLNEED"
            rows.append(base + (adv, fd, None, index, count, path, dev, ino, first, pages, ret))
        if not rows:
            return None
        self.hints += len(rows)
        cols = list(zip(*rows))
        sch = trace.sample_schema(HINT_SAMPLE)
        return pa.table([pa.array(list(c), type=f.type) for c, f in zip(cols, sch)], schema=sch)


class PagecacheSource(ProbeTotals, Source):
    """Loads the page-cache probe (attached at once) and feeds its records to the sink."""

    name = "pagecache"
    title = "page-cache insertions"

    def __init__(self, rec: Recording):
        super().__init__(rec)
        self.selection = rec.selection
        self.config = probe_mod.PagecacheProbeConfig(tgid=rec.pid, tid=rec.tid, selection=rec.selection)
        self.plan = None
        self.probe: probe_mod.LoadedPagecacheProbe | None = None
        self.procs: dict[int, ProcessFiles] = {}
        self.decoder = PagecacheDecoder(self._files_of)
        self.lost = LostRecords(LOST_SAMPLE)
        self.last_refresh = 0.0
        self.final = False  # detached: the next drain takes the runs still open in the kernel too
        self._totals: dict[str, int] = {}

    def _files_of(self, pid):
        if pid is None:
            return list(self.procs.values())
        pf = self.procs.get(pid)
        if pf is None:
            pf = self.procs[pid] = ProcessFiles(pid)
        return pf

    def _pids(self) -> list[int]:
        s = self.selection
        try:
            return sorted(s.tgids_now()) if s.match_tgids == 2 else list(s.pids)
        except Exception:  # a selection that cannot list its processes now: the ones given
            return list(getattr(s, "pids", []) or [])

    def available(self) -> Availability:
        if not probe_mod.required_available():
            return Availability(False, "the kernel lacks filemap:mm_filemap_add_to_page_cache")
        return YES

    def load(self) -> None:
        """Compile and attach the probe (before the call probe: its compile must not fill the
        call ring); the targets' files into the watched set."""
        self.plan = probe_mod.plan(self.config)
        self.probe = probe_mod.LoadedPagecacheProbe(self.plan)
        self.lost.checked_ns = self.probe.armed_ns
        self.watch_target_files()
        if self.plan.missing:
            self.rec.notes.append(f"page-cache evidence not collected: {', '.join(self.plan.missing)}")
        self.rec.put_meta(pagecache_probe=probe_mod.PROBE_FILE)

    def arm(self) -> None:
        """Attached at load."""

    def begin_window(self, start_ns: int) -> None:
        """Kept from before the window (see :meth:`drain`)."""

    def watch_target_files(self) -> None:
        """The targets' open and mapped files into the kernel's watched set."""
        self.last_refresh = time.monotonic()
        for pid in self._pids():
            pf = self._files_of(pid)
            pf.refresh()
            for dev, ino in list(pf.files):
                self.probe.watch(dev, ino)

    def drain(self, sink) -> None:
        if self.probe is None:
            return
        recs = self.probe.ring.drain()
        final, self.final = self.final, False
        if final:  # and the insertion runs still open in the kernel, once
            recs = np.concatenate([recs, self.probe.open_runs()]) if len(recs) else self.probe.open_runs()
        # window=None: page-cache records from before the recording's window are kept.  A hint
        # issued before it (say while the other probes compiled) is what prefetch.py judges the
        # in-window reads of its pages against, and an insertion run from before it is harmless
        # to readahead.py, which counts only the runs owned by a recorded (in-window) read
        drain_into(sink, self.probe, recs, ((SAMPLE, self.decoder.events_table),
                                            (HINT_SAMPLE, self.decoder.hints_table)), self.lost, window=None)
        if not final and self.probe.bpf is not None and time.monotonic() - self.last_refresh >= REFRESH_S:
            self.watch_target_files()

    def detach(self) -> None:
        if self.probe is not None:
            self.probe.detach()
            self.final = True

    def sync_targets(self) -> None:
        sync_probe_targets(self.probe)

    def summary(self) -> dict:
        t = self.totals()
        return {"probe": probe_mod.PROBE_FILE, "missing_tracepoints": self.plan.missing if self.plan else [],
                "inserted_pages": t.get("inserted_pages", 0), "target_pages": t.get("target_pages", 0),
                "runs": t.get("runs", 0), "readahead_events": t.get("readahead", 0), "hints": t.get("hints", 0),
                "lost_records": t.get("lost_records", 0), "lost_record_intervals": self.lost.intervals,
                "watched_files": self._watched_now(),
                "watched_full": t.get("watched_full", 0)}

    def _watched_now(self) -> int:
        """Files in the kernel's watched set (user space's and the ones the kernel added)."""
        if self.probe is None or self.probe.bpf is None:
            return self._watched
        try:
            self._watched = sum(1 for _ in self.probe.bpf["watched_files"].keys())  # BCC's keys(): an iterator
        except Exception:  # context: keep the last count
            pass
        return self._watched

    _watched = 0

    def close(self) -> None:
        if self.probe is not None:
            self._watched_now()
            self.totals()
            self.probe.close()
            self.probe = None
