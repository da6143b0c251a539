"""System and process samplers: the "memory evidence" that runs beside the eBPF probes.

A :class:`Sampler` reads, at ``hz`` (10 by default) in a background thread:

* ``/proc/pressure/{cpu,memory,io}``: PSI ``some``/``full`` stall time, from the cumulative
  ``total=`` field (µs), so short stalls are not smoothed away as in ``avg10``;
* ``/proc/vmstat``: refault, reclaim-scan/steal, allocstall, major fault and pgpgin counters;
* every node's ``kswapdN`` kernel thread: its CPU time;
* ``/proc/diskstats``: each block device's completed reads, sectors and time reading (the
  device's own service per request, the storage baseline of engramprof/analysis/baseline.py),
  and the writes, sectors written and cache flushes it served besides (``device_traffic``);
* the target's memory cgroup (v1 memory controller and/or cgroup v2, found from
  ``/proc/PID/cgroup``): refaults, reclaim counters, usage, limit, limit hits, and the v2
  ``memory.pressure`` / ``io.pressure`` of the group (on a v1/v2 hybrid the v2 pressure files
  exist for the group the target has in the unified hierarchy);
* the target process and each of its threads: context switches, user/system CPU, names; with
  ``follow`` (a callable giving the tgids traced now: --pid repeated, --children, --cgroup, the
  readers of --file), every other traced process too, checked about once a second.

Every row carries ``ts_ns`` = ``time.monotonic_ns()`` taken at the start of its sampling round
(CLOCK_MONOTONIC, the clock of the eBPF records).  All rows of one round share that ``ts_ns``.
Counters are stored as *deltas over the interval that ends at ts_ns* (since the previous
successful read of the same counter); the first row of each series is the baseline and holds
zero deltas, so summing a delta column over a window gives the window total.  Thread and
process CPU times and context switches are stored both cumulative and as deltas.

Series (their columns: ``engramprof.trace.SAMPLE_SCHEMAS``) are flushed to a
:class:`engramprof.trace.TraceWriter` with ``append_samples(name, table)`` about once a second,
in batches: ``psi``, ``vmstat``, ``kswapd``, ``cgroup``, ``process``, ``threads``, ``disks``.

:func:`summarize` is the pure function from those recorded frames to the JSON summary that
``engramprof sample --json`` prints; :meth:`Sampler.summary` applies it to the live window and
:func:`summarize_bundle` to a recorded TRACE.

The parts: engramprof/sampling/procfs.py (raw reads and parsers), sources.py (what a round
reads), rows.py (readings -> delta rows), summary.py (frames -> JSON); this module runs them on
a thread and flushes.  The ``/proc`` and ``/sys`` roots are parameters so tests can point them
at a fake tree.  Only /proc and /sys are read (psutil is not needed: raw reads are cheaper at 10 Hz and honour
the injected roots).
"""
from __future__ import annotations

import threading
import time
from typing import Any, Callable, Iterable

import pandas as pd

from engramprof.errors import UserError
from engramprof.sampling.procfs import (  # noqa: F401
    CgroupInfo,
    FdCache,
    find_cgroup,
    parse_psi,
    parse_stat,
)
from engramprof.sampling.rows import RECLAIMERS, RowRecorder
from engramprof.sampling.sources import CgroupReader, Notes, SystemSources, TargetReader
from engramprof.sampling.summary import interpret, summarize, summarize_bundle  # noqa: F401
from engramprof.trace.schema import (  # noqa: F401
    CGROUP_COUNTERS,
    CGROUP_GAUGES,
    PSI_RESOURCES,
    SAMPLE_NAMES,
    VMSTAT_COUNTERS,
    VMSTAT_DERIVED,
)
from engramprof.trace.schema import sample_schema as schema

FLUSH_MIN_ROWS = 64
#: at most this many processes besides the first get process / thread rows (a large cgroup)
MAX_FOLLOWED = 64
# at a periodic flush, a series whose oldest buffered row is older than this goes out however
# few rows it has: with flush_s = 1 s every series is written about once a second, like the
# calls, so a killed recorder loses at most about a second of any series
FLUSH_MAX_S = 0.5


class Sampler:
    """Background sampler of PSI, vmstat, kswapd, the target's cgroup, process and threads.

    ``Sampler(pid=None, hz=10)``; ``start(writer)``; ... ``stop()``; ``summary()``.
    Raises :class:`UserError` (exit 2) if ``pid`` does not exist when constructed.
    """

    def __init__(
        self,
        pid: int | None = None,
        hz: float = 10.0,
        *,
        proc_root: str = "/proc",
        sys_root: str = "/sys",
        flush_s: float = 1.0,
        clock: Callable[[], int] = time.monotonic_ns,
        follow: Callable[[], Iterable[int]] | None = None,
        follow_s: float = 1.0,
    ):
        if not (0 < hz <= 1000):
            raise UserError(f"--sample-hz must be in (0, 1000], got {hz}")
        self.pid = pid
        self.hz = float(hz)
        self.proc_root = str(proc_root)
        self.sys_root = str(sys_root)
        self.flush_s = flush_s
        self.clock = clock
        self._notes = Notes()
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self.target_exited = threading.Event()
        self._thread: threading.Thread | None = None
        self._writer = None
        self.behind = 0
        self.stop_ns: int | None = None
        self._flush_errors = 0
        self._fdc = FdCache()
        # the target first: a UserError before anything else is set up
        self.target = TargetReader(pid, self.proc_root, self.hz, self._fdc, self._notes) if pid is not None else None
        self.system = SystemSources(self.proc_root, self._fdc, self._notes)
        self.cgroup = CgroupInfo()
        if pid is not None:
            info, notes = find_cgroup(pid, self.proc_root, self.sys_root)
            self.cgroup = info
            for n in notes:
                self._notes.add(n, n)
        self.cgroups = CgroupReader(self.cgroup, self._fdc, self._notes, self._rel)
        self.rows = RowRecorder(pid, self._notes, self._rel, self.target_exited, recent=max(3, int(self.hz * 2) + 2))
        # the other traced processes: `follow()` gives the tgids traced now (asked every
        # follow_s); each gets its process and thread rows (the pid column tells them apart)
        self.follow, self.follow_s = follow, follow_s
        self.followed: dict[int, TargetReader] = {}
        #: every process sampled (the target, each followed one): runs_cpython's answer, kept after it exits
        self.cpython_of: dict[int, tuple] = {self.target.pid: self.target.cpython} if self.target is not None else {}
        self._followed_done: set[int] = set()  # exited, or gone before its first read
        self._followed_at: int | None = None
        self.followed_names: dict[int, str] = {}

    # ----------------------------------------------------------------- state, by name

    notes = property(lambda self: self._notes.items)
    target_name = property(lambda self: self.target.name if self.target else None)
    psi_resources = property(lambda self: self.system.psi_resources)
    kswapd = property(lambda self: self.system.kswapd)
    rounds = property(lambda self: self.rows.rounds)
    start_ns = property(lambda self: self.rows.start_ns)
    target_exit_ns = property(lambda self: self.rows.target_exit_ns)

    def _rel(self, ts: int | None = None) -> str:
        if self.rows.start_ns is None:
            return ""
        return f" at +{((ts or self.clock()) - self.rows.start_ns) / 1e9:.2f} s"

    # ----------------------------------------------------------------- sampling

    def snapshot(self) -> dict:
        """One fresh reading of every source, cumulative values, not recorded.

        ``{"ts_ns", "psi": {res: {"some": (total_us, avg10), "full": ...}}, "vmstat": {counter: n},
        "kswapd": [(pid, name, state, cpu_total_s)], "cgroup": {col: cumulative or gauge},
        "process": {...} | None, "threads": [(tid, name, vcsw, ivcsw, utime_s, stime_s, run_ns, runq_ns, timeslices)] | None}``
        """
        ts = self.clock()
        snap: dict[str, Any] = {"ts_ns": ts}
        snap["psi"] = self.system.read_psi()
        snap["vmstat"] = self.system.read_vmstat()
        snap["kswapd"] = self.system.read_kswapd()
        snap["disks"] = self.system.read_disks()
        snap["cgroup"] = self.cgroups.read(ts)
        if self.target is not None and not self.target_exited.is_set():
            snap["process"], snap["threads"] = self.target.read()
            self.cpython_of[self.target.pid] = self.target.cpython
        else:
            snap["process"], snap["threads"] = None, None
        if self.follow is not None:
            self._refresh_followed(ts)
            snap["others"] = others = {}
            for p, reader in list(self.followed.items()):
                others[p] = reader.read()
                self.cpython_of[p] = reader.cpython  # re-read after an exec (TargetReader.read)
                if others[p][0] is None:  # exited: its last round says so, then it is dropped
                    del self.followed[p]
                    self._followed_done.add(p)
        return snap

    def _refresh_followed(self, ts: int) -> None:
        if self._followed_at is not None and ts - self._followed_at < self.follow_s * 1e9:
            return
        self._followed_at = ts
        try:
            want = set(self.follow())
        except Exception as exc:  # context: keep sampling what is known
            self._notes.add("follow", f"could not list the traced processes ({type(exc).__name__}: {exc})")
            return
        for p in sorted(want - set(self.followed) - self._followed_done - {self.pid}):
            if len(self.followed) >= MAX_FOLLOWED:
                self._notes.add("follow-max", f"per-thread samples of the first {MAX_FOLLOWED} traced processes "
                                              "only (more were traced)")
                break
            try:
                self.followed[p] = TargetReader(p, self.proc_root, self.hz, self._fdc, self._notes)
                self.followed_names[p] = self.followed[p].name
                self.cpython_of[p] = self.followed[p].cpython
            except UserError:  # gone already
                self._followed_done.add(p)

    def sample_now(self) -> None:
        """Take one sampling round and record it (the background thread calls this)."""
        snap = self.snapshot()
        with self._lock:
            self.rows.record(snap)

    def flush(self, force: bool = True) -> None:
        """Move buffered rows into Arrow tables and hand them to the writer (if any).

        ``force=False`` (the periodic flush) skips series with fewer than ``FLUSH_MIN_ROWS``
        rows buffered unless their oldest row is ``FLUSH_MAX_S`` old (so with ``flush_s`` = 1 s,
        ``kill -9`` loses at most about a second of any series).
        """
        now = self.clock()
        with self._lock:
            tables = {
                n: s.take()
                for n, s in self.rows.series.items()
                if force or len(s.rows) >= FLUSH_MIN_ROWS or (s.rows and now - s.rows[0][0] >= FLUSH_MAX_S * 1e9)
            }
        w = self._writer
        if w is None:
            return
        for n, t in tables.items():
            if t is None:
                continue
            try:
                w.append_samples(n, t)
            except Exception as exc:  # a full disk must not kill the sampling
                self._flush_errors += 1
                self._notes.add("flush", f"writing samples to the trace failed ({type(exc).__name__}: {exc}); kept in memory")

    # ----------------------------------------------------------------- lifecycle

    def start(self, writer=None) -> None:
        """Start sampling in a background thread; flush to ``writer.append_samples`` ~every ``flush_s``."""
        if self._thread is not None:
            raise RuntimeError("Sampler already started")
        self._writer = writer
        self._thread = threading.Thread(target=self._run, name="engramprof-sampler", daemon=True)
        self._thread.start()

    @property
    def native_id(self) -> int | None:
        """OS thread id of the sampling thread (for measuring its own CPU cost)."""
        return self._thread.native_id if self._thread else None

    def _run(self) -> None:
        period = 1e9 / self.hz
        # with a writer: hand batches over every flush_s; without: compact rows into Arrow
        # tables every 10 s (memory), as building tables costs more than sampling once
        every = self.flush_s * 1e9 if self._writer is not None else max(10.0, self.flush_s) * 1e9
        nxt = time.monotonic_ns()
        last_flush = nxt
        while not self._stop.is_set():
            try:
                self.sample_now()
            except Exception as exc:  # never let one bad read end the sampling
                self._notes.add(f"err-{type(exc).__name__}", f"sampling error ({type(exc).__name__}: {exc})")
            now = time.monotonic_ns()
            if now - last_flush >= every:
                self.flush(force=self._writer is None)
                last_flush = now
            nxt += period
            if nxt < now:
                self.behind += int((now - nxt) // period) + 1
                nxt = now + period
            self._stop.wait((nxt - time.monotonic_ns()) / 1e9)

    def stop(self) -> None:
        """Stop the thread, take a last round, flush everything; idempotent.

        Stop the sampler before closing the writer: it records its metadata with
        ``writer.update_meta(sampler=...)``.
        """
        if self._stop.is_set() and self.stop_ns is not None:
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        try:
            self.sample_now()  # the window ends now, not up to 1/hz earlier
        except Exception:
            pass
        self.stop_ns = self.clock()
        if self.behind:
            self._notes.add("behind", f"sampler fell behind its {self.hz:g} Hz schedule {self.behind} times")
        self.flush()
        self._fdc.close()
        w = self._writer
        if w is not None and not getattr(w, "closed", False):
            w.update_meta(sampler=self.info())

    # ----------------------------------------------------------------- results

    def info(self) -> dict:
        """Static facts about this sampling run (stored as meta['sampler'] in a TRACE)."""
        cg = self.cgroup
        return {
            "hz": self.hz,
            "pid": self.pid,
            "target_name": self.target_name,
            "followed": {str(p): n for p, n in self.followed_names.items()} if self.follow is not None else None,
            # per process sampled: does it run CPython (host/interpreter.runs_cpython; thread kinds)
            "cpython": {str(p): {"cpython": c[0], "evidence": c[1]} for p, c in sorted(self.cpython_of.items())},
            "target_exited": self.target_exited.is_set(),
            "target_exit_ns": self.target_exit_ns,
            "start_ns": self.start_ns,
            "stop_ns": self.stop_ns,
            "rounds": self.rounds,
            "psi_resources": list(self.psi_resources),
            "kswapd": {str(k): v for k, v in self.kswapd.items()},
            "cgroup": {
                "version": cg.version,
                "v1_memory": cg.v1_memory,
                "v2": cg.v2,
                "v2_has_memory": cg.v2_has_memory,
            },
            "proc_root": self.proc_root,
            "sys_root": self.sys_root,
            "notes": list(self.notes),
        }

    def frames(self) -> dict[str, pd.DataFrame]:
        """Everything recorded so far, one DataFrame per series."""
        with self._lock:
            return {n: s.frame() for n, s in self.rows.series.items()}

    def summary(self) -> dict:
        """:func:`summarize` over the window recorded so far."""
        return summarize(self.frames(), self.info())

    def status_line(self) -> str:
        """One line for a live view: PSI memory/io, refaults/s, reclaim, target wakeups."""
        with self._lock:
            recent = list(self.rows.recent)
        if len(recent) < 2:
            return "sampler: waiting for data"
        # about the last second
        end = recent[-1]
        start = next((r for r in recent if end[0] - r[0] <= 1.05e9), recent[0])
        if start is end:
            start = recent[-2]
        dt = (end[0] - start[0]) / 1e9 or 1e-9
        parts = [_psi_status(start, end, dt)]

        def rate(key):
            a, b = start[2].get(key), end[2].get(key)
            return None if a is None or b is None else (b - a) / dt

        rf = rate("workingset_refault_file")
        txt = f"refaults {rf:,.0f}/s" if rf is not None else "refaults n/a"
        if end[4] is not None and start[4] is not None:
            txt += f" (cgroup {(end[4] - start[4]) / dt:,.0f}/s)"
        parts.append(txt)
        kcpu = (end[3] - start[3]) / dt * 100
        direct = rate("pgscan_direct")
        scan = [rate(f"pgscan_{x}") for x in ("anon", "file")]
        glob = sum(rate(f"pgscan_{x}") or 0 for x in RECLAIMERS)
        memcg = None if None in scan else max(0.0, sum(scan) - glob)
        rec = f"kswapd {kcpu:.0f}% cpu" if kcpu > 0 else "kswapd idle"
        if direct:
            rec += f", direct scan {direct:,.0f}/s"
        if memcg:
            rec += f", cgroup scan {memcg:,.0f}/s"
        parts.append(rec)
        if self.pid is not None:
            if self.target_exited.is_set():
                parts.append(f"pid {self.pid} exited")
            else:
                parts.append(f"target {max(0, end[5] - start[5]) / dt:,.0f} cs/s")
        return " | ".join(parts)


def _psi_status(start: tuple, end: tuple, dt: float) -> str:
    psi = []
    for r, label in (("memory", "mem"), ("io", "io")):
        if r in end[1] and r in start[1]:
            some = (end[1][r][0] - start[1][r][0]) / (dt * 1e6) * 100
            full = (end[1][r][1] - start[1][r][1]) / (dt * 1e6) * 100
            psi.append(f"{label} {some:.1f}%/{full:.1f}%")
    return "PSI some/full " + " ".join(psi) if psi else "PSI n/a"
