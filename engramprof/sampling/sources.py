"""What one sampling round reads: system sources (PSI, vmstat, kswapd), the target's memory
cgroup, the target process and its threads.  Each reader returns cumulative values (and gauges);
turning them into per-interval rows is engramprof/sampling/rows.py's job.
"""
from __future__ import annotations

import errno
import os
import re
from typing import Callable, Iterable

from engramprof.errors import UserError
from engramprof.host.interpreter import runs_cpython
from engramprof.sampling.procfs import (
    CLK_TCK,
    PAGE_SIZE,
    CgroupInfo,
    FdCache,
    is_gone,
    parse_kv,
    parse_psi,
    parse_stat,
    pick,
    read_file,
    status_int,
)
from engramprof.trace.schema import PSI_RESOURCES, VMSTAT_COUNTERS

# Older kernels (< 5.9) name the workingset counters without the _file suffix (anon+file).
VMSTAT_ALIASES = {
    "workingset_refault_file": "workingset_refault",
    "workingset_activate_file": "workingset_activate",
    "workingset_restore_file": "workingset_restore",
}


class Notes:
    """Plain-language notes about what could not be measured, each said once."""

    def __init__(self):
        self.items: list[str] = []
        self._keys: set[str] = set()

    def add(self, key: str, text: str) -> None:
        if key in self._keys:
            return
        self._keys.add(key)
        self.items.append(text)

    def __contains__(self, key: str) -> bool:
        return key in self._keys


Rel = Callable[[int | None], str]  # " at +1.23 s" for a timestamp (or "" before the first round)


class SystemSources:
    """PSI, /proc/vmstat and the kswapd threads: which exist is found out once, at set-up."""

    def __init__(self, proc_root: str, fdc: FdCache, notes: Notes):
        self.proc_root = proc_root
        self.fdc = fdc
        self.notes = notes
        self.psi_resources = self._find_psi()
        self.vmstat_keys: dict[str, str] = {}
        self._vmstat_src: tuple[str, ...] = ()
        self._find_vmstat()
        self.kswapd = self._find_kswapd()
        if not self.kswapd:
            notes.add("kswapd", "no kswapd threads found: kswapd activity not sampled")

    def _find_psi(self) -> list[str]:
        found = []
        for r in PSI_RESOURCES:
            p = f"{self.proc_root}/pressure/{r}"
            try:
                if parse_psi(read_file(p)):
                    found.append(r)
            except OSError as exc:
                if exc.errno == errno.EOPNOTSUPP:
                    self.notes.add("psi", "PSI is compiled in but disabled (boot with psi=1): no pressure stall data")
                elif not os.path.isdir(f"{self.proc_root}/pressure"):
                    self.notes.add("psi", f"PSI not available ({self.proc_root}/pressure missing: kernel without CONFIG_PSI): no pressure stall data")
                else:
                    self.notes.add(f"psi-{r}", f"{p} unreadable ({exc.strerror}): no {r} pressure data")
        return found

    def _find_vmstat(self) -> None:
        try:
            vm = parse_kv(read_file(f"{self.proc_root}/vmstat"))
        except OSError as exc:
            self.notes.add("vmstat", f"{self.proc_root}/vmstat unreadable ({exc.strerror}): no reclaim/refault counters")
            return
        missing = []
        for c in VMSTAT_COUNTERS:
            if c in vm:
                self.vmstat_keys[c] = c
            elif VMSTAT_ALIASES.get(c) in vm:
                self.vmstat_keys[c] = VMSTAT_ALIASES[c]
                self.notes.add("vmstat-alias", f"old kernel: {c} taken from {VMSTAT_ALIASES[c]} (anon + file)")
            else:
                missing.append(c)
        important = [c for c in missing if not c.endswith(("_device", "_dma", "khugepaged", "proactive"))]
        if important:
            self.notes.add("vmstat-missing", "vmstat counters absent on this kernel (left empty): " + ", ".join(important))
        self._vmstat_src = tuple(sorted(set(self.vmstat_keys.values())))

    def _find_kswapd(self) -> dict[int, str]:
        out: dict[int, str] = {}
        try:
            entries = os.listdir(self.proc_root)
        except OSError:
            return out
        for e in entries:
            if not e.isdigit():
                continue
            try:
                comm = read_file(f"{self.proc_root}/{e}/comm").strip().decode(errors="replace")
            except OSError:
                continue
            if re.fullmatch(r"kswapd\d+(:\d+)?", comm):
                out[int(e)] = comm
        return dict(sorted(out.items()))

    def read_psi(self, root: str | None = None, resources: Iterable[str] | None = None) -> dict[str, dict | None]:
        root = root or f"{self.proc_root}/pressure"
        out = {}
        for r in self.psi_resources if resources is None else resources:
            try:
                out[r] = parse_psi(self.fdc.read(f"{root}/{r}"))
            except OSError:
                out[r] = None
        return out

    def read_vmstat(self) -> dict[str, int] | None:
        if not self.vmstat_keys:
            return None
        try:
            vm = pick(self.fdc.read(f"{self.proc_root}/vmstat"), self._vmstat_src)
        except OSError:
            return None
        return {c: vm.get(k) for c, k in self.vmstat_keys.items()}

    def read_disks(self) -> dict[int, tuple] | None:
        """Each block device's cumulative counters: {dev_t: (name, reads, reads_merged,
        read_sectors, read_ticks_ms, in_flight, writes, write_sectors, flushes)} from
        /proc/diskstats; None: unreadable."""
        try:
            text = self.fdc.read(f"{self.proc_root}/diskstats")
        except OSError:
            self.notes.add("diskstats", f"{self.proc_root}/diskstats unreadable: no device service baseline")
            return None
        return parse_diskstats(text)

    def read_kswapd(self) -> list[tuple[int, str, str, float]]:
        out = []
        for pid, name in self.kswapd.items():
            try:
                _, f = parse_stat(self.fdc.read(f"{self.proc_root}/{pid}/stat"))
                out.append((pid, name, f[0].decode(), (int(f[11]) + int(f[12])) / CLK_TCK))
            except (OSError, IndexError, ValueError):
                self.notes.add(f"kswapd-{pid}", f"kswapd thread {pid} ({name}) vanished")
        return out


def parse_diskstats(text: bytes) -> dict[int, tuple]:
    """/proc/diskstats: major minor name, then reads completed, reads merged, sectors read, ms
    reading, writes completed, writes merged, sectors written, ms writing, in flight, ...,
    flushes completed (the 16th counter after the name, kernel 5.5; 0 before)
    (Documentation/admin-guide/iostats.rst); malformed lines are skipped.  Per device: (name,
    reads, reads_merged, read_sectors, read_ticks_ms, in_flight, writes, write_sectors,
    flushes)."""
    out = {}
    for line in text.splitlines():
        f = line.split()
        if len(f) < 12:
            continue
        try:
            dev = os.makedev(int(f[0]), int(f[1]))
            out[dev] = (f[2].decode(errors="replace"), int(f[3]), int(f[4]), int(f[5]), int(f[6]), int(f[11]),
                        int(f[7]), int(f[9]), int(f[18]) if len(f) >= 20 else 0)
        except ValueError:
            continue
    return out


def _num(b: bytes | None) -> int | None:
    """An integer file's value; None for "max" (no limit), garbage or an unreadable file."""
    if b is None:
        return None
    s = b.strip()
    if s == b"max":
        return None
    try:
        return int(s)
    except ValueError:
        return None


# memory.stat keys per column: v1 (hierarchical ``total_*`` first) and v2
_V1_STAT_KEYS = (
    ("refault_file", ("total_workingset_refault_file", "workingset_refault_file", "total_workingset_refault", "workingset_refault")),
    ("activate_file", ("total_workingset_activate_file", "workingset_activate_file")),
    ("restore_file", ("total_workingset_restore_file", "workingset_restore_file")),
    ("pgscan", ("total_pgscan", "pgscan")),
    ("pgsteal", ("total_pgsteal", "pgsteal")),
    ("pgmajfault", ("total_pgmajfault", "pgmajfault")),
    ("pgpgin", ("total_pgpgin", "pgpgin")),
    ("pgpgout", ("total_pgpgout", "pgpgout")),
)
_V2_STAT_KEYS = (
    ("refault_file", "workingset_refault_file"),
    ("activate_file", "workingset_activate_file"),
    ("restore_file", "workingset_restore_file"),
    ("pgscan", "pgscan"),
    ("pgsteal", "pgsteal"),
    ("pgmajfault", "pgmajfault"),
)


class CgroupReader:
    """The target's memory cgroup: v1 memory controller counters, v2 counters when the memory
    controller is enabled there, and the v2 group's memory / io pressure."""

    def __init__(self, info: CgroupInfo, fdc: FdCache, notes: Notes, rel: Rel):
        self.info = info
        self.fdc = fdc
        self.notes = notes
        self.rel = rel

    def _rd(self, d: str, fname: str, ts: int) -> bytes | None:
        p = f"{d}/{fname}"
        try:
            return self.fdc.read(p, check_unlinked=True)
        except OSError as exc:
            why = "disappeared (cgroup removed?)" if is_gone(exc) else f"unreadable ({exc.strerror})"
            self.notes.add(f"cg-{p}", f"cgroup file {p} {why}{self.rel(ts)}: its values are empty from then on")
            return None

    def read(self, ts: int) -> dict[str, int | None] | None:
        cg = self.info
        if cg.version is None:
            return None
        vals: dict[str, int | None] = {}
        if cg.v1_memory:
            self._read_v1(cg.v1_memory, ts, vals)
        if cg.v2:
            if cg.v2_has_memory and not cg.v1_memory:
                self._read_v2_memory(cg.v2, ts, vals)
            for res, pre in (("memory", "mem"), ("io", "io")):
                b = self._rd(cg.v2, f"{res}.pressure", ts)
                p = parse_psi(b) if b is not None else {}
                vals[f"{pre}_some_us"] = p["some"][0] if "some" in p else None
                vals[f"{pre}_full_us"] = p["full"][0] if "full" in p else None
        return vals

    def _read_v1(self, d: str, ts: int, vals: dict) -> None:
        st = self._rd(d, "memory.stat", ts)
        st = parse_kv(st) if st is not None else None
        if st is not None:
            for col, keys in _V1_STAT_KEYS:
                vals[col] = next((st[k] for k in keys if k in st), None)
        vals["usage_bytes"] = _num(self._rd(d, "memory.usage_in_bytes", ts))
        lim = _num(self._rd(d, "memory.limit_in_bytes", ts))
        if st is not None and "hierarchical_memory_limit" in st:
            lim = min(x for x in (lim, st["hierarchical_memory_limit"]) if x is not None)
        vals["limit_bytes"] = lim
        vals["failcnt"] = _num(self._rd(d, "memory.failcnt", ts))

    def _read_v2_memory(self, d: str, ts: int, vals: dict) -> None:
        st = self._rd(d, "memory.stat", ts)
        st = parse_kv(st) if st is not None else None
        if st is not None:
            for col, key in _V2_STAT_KEYS:
                vals[col] = st.get(key, st.get(key.removesuffix("_file")) if key.endswith("_file") else None)
        if self.info.v2_rel != "/":
            vals["usage_bytes"] = _num(self._rd(d, "memory.current", ts))
            vals["limit_bytes"] = _num(self._rd(d, "memory.max", ts))
            ev = self._rd(d, "memory.events", ts)
            if ev is not None:
                e = parse_kv(ev)
                vals["events_high"], vals["events_max"], vals["events_oom"] = e.get("high"), e.get("max"), e.get("oom")


class TargetReader:
    """The target process (/proc/PID/stat, io) and each of its threads (schedstat, stat, status).

    Raises :class:`UserError` at construction when PID does not exist or is a zombie."""

    def __init__(self, pid: int, proc_root: str, hz: float, fdc: FdCache, notes: Notes):
        self.pid = pid
        self.base = f"{proc_root}/{pid}"
        self.hz = hz
        self.fdc = fdc
        self.notes = notes
        self.name, self._starttime = self._check(pid)
        # whether it runs a CPython interpreter, from its executable mappings (analysis/thread_kinds)
        self.cpython = runs_cpython(pid, proc_root)
        self._cached_tids: set[str] = set()
        self._tcache: dict[str, tuple] = {}
        self._reads = 0
        self._schedstat = True

    def _check(self, pid: int) -> tuple[str, bytes | None]:
        if pid <= 0:
            raise UserError(f"invalid pid {pid}")
        try:
            comm, f = parse_stat(read_file(f"{self.base}/stat"))
        except OSError:
            raise UserError(f"no process with pid {pid}") from None
        if f and f[0] in (b"Z", b"X"):
            raise UserError(f"pid {pid} ({comm}) has already exited (zombie)")
        return comm, (f[19] if len(f) > 19 else None)

    def read(self) -> tuple[dict | None, list[tuple] | None]:
        """(process reading, [(tid, name, vcsw, ivcsw, utime_s, stime_s, run_ns, runq_ns, timeslices)])
        or (None, None) once the process is gone."""
        base = self.base
        try:
            comm, f = parse_stat(self.fdc.read(f"{base}/stat", check_unlinked=True))
        except OSError:
            self.fdc.drop(lambda p: not p.startswith(base + "/"))
            return None, None
        if not f or f[0] in (b"Z", b"X") or (self._starttime is not None and len(f) > 19 and f[19] != self._starttime):
            return None, None
        if comm != self.name:  # an exec since (a fork read before it execs fio: not CPython any more)
            self.name = comm
            self.cpython = runs_cpython(self.pid, self.base.rsplit("/", 1)[0])
        return self._process(f), self._threads()

    def _process(self, f: list[bytes]) -> dict:
        proc = {
            "state": f[0].decode(),
            "utime_s": int(f[11]) / CLK_TCK,
            "stime_s": int(f[12]) / CLK_TCK,
            "minflt": int(f[7]),
            "majflt": int(f[9]),
            "num_threads": int(f[17]),
            "rss_bytes": int(f[21]) * PAGE_SIZE,
            "rchar": None,
            "read_bytes": None,
            "syscr": None,
        }
        if "io-denied" not in self.notes:
            try:
                io = parse_kv(self.fdc.read(f"{self.base}/io"))
                proc.update(rchar=io.get("rchar"), read_bytes=io.get("read_bytes"), syscr=io.get("syscr"))
            except PermissionError:
                self.notes.add("io-denied", f"/proc/{self.pid}/io not readable (needs root or same user): no rchar/read_bytes")
            except OSError:
                pass
        return proc

    def _threads(self) -> list[tuple]:
        """Every thread's row.  A thread's stat (name, tick-based utime/stime) is re-read once a
        second; between those reads the name and user/system split are carried over (they move
        in 10 ms ticks anyway); schedstat's on-CPU ns give the precise per-interval CPU.

        /proc/PID/task/TID/schedstat (on-CPU ns, run-queue wait ns, times scheduled in) is read
        first: when it has not changed since the last read the thread has not been switched in
        or out since, so its stat and status are not re-read (idle pool threads cost one small
        read each)."""
        base = self.base
        try:
            tids = os.listdir(f"{base}/task")
        except OSError:
            tids = []
        live = set(tids)
        if self._cached_tids - live:
            tp = f"{base}/task/"
            self.fdc.drop(lambda p: not p.startswith(tp) or p[len(tp):].split("/", 1)[0] in live)
        self._cached_tids = live
        fresh: dict[str, tuple] = {}
        self._reads += 1
        refresh_stat = (self._reads - 1) % max(1, round(self.hz)) == 0
        threads = []
        for t in tids:
            got = self._thread(t, refresh_stat)
            if got is None:
                continue
            fresh[t] = got
            threads.append(got[1])
        self._tcache = fresh
        return threads

    def _thread(self, t: str, refresh_stat: bool) -> tuple[bytes | None, tuple] | None:
        """(schedstat bytes, row) of thread ``t``, or None when it has exited."""
        tp = f"{self.base}/task/{t}/"
        sched = None
        if self._schedstat:
            try:
                sched = self.fdc.read(tp + "schedstat")
            except FileNotFoundError:
                if not os.path.exists(tp + "stat"):
                    return None  # thread exited
                self._schedstat = False  # kernel without CONFIG_SCHED_INFO
                self.notes.add("schedstat", "no /proc/PID/task/TID/schedstat (CONFIG_SCHED_INFO off): per-thread run_ns/runq_ns empty")
            except OSError:
                return None  # thread exited
        hit = self._tcache.get(t)
        if sched is not None and hit is not None and hit[0] == sched:
            return sched, hit[1]  # not scheduled since the last read: nothing in stat/status moved
        try:
            if hit is None or sched is None or refresh_stat:
                tcomm, tf = parse_stat(self.fdc.read(tp + "stat"))
                ut, stt = int(tf[11]) / CLK_TCK, int(tf[12]) / CLK_TCK
            else:  # name and tick-based user/system split: refreshed once a second
                tcomm, ut, stt = hit[1][1], hit[1][4], hit[1][5]
            st = self.fdc.read(tp + "status")
        except OSError:
            return None  # thread exited between listdir and read
        run = sched.split() if sched else ()
        return sched, (
            int(t),
            tcomm,
            status_int(st, b"voluntary_ctxt_switches"),
            status_int(st, b"nonvoluntary_ctxt_switches"),
            ut,
            stt,
            int(run[0]) if len(run) == 3 else None,
            int(run[1]) if len(run) == 3 else None,
            int(run[2]) if len(run) == 3 else None,
        )
