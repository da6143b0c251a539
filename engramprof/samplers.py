"""System and process samplers: the "memory evidence" that runs beside the eBPF probes.

A :class:`Sampler` reads, at ``hz`` (10 by default) in a background thread:

* ``/proc/pressure/{cpu,memory,io}``: PSI ``some``/``full`` stall time, from the cumulative
  ``total=`` field (µs), so short stalls are not smoothed away as in ``avg10``;
* ``/proc/vmstat``: refault, reclaim-scan/steal, allocstall, major fault and pgpgin counters;
* every node's ``kswapdN`` kernel thread: its CPU time;
* the target's memory cgroup (v1 memory controller and/or cgroup v2, found from
  ``/proc/PID/cgroup``): refaults, reclaim counters, usage, limit, limit hits, and the v2
  ``memory.pressure`` / ``io.pressure`` of the group (on a v1/v2 hybrid the v2 pressure files
  exist for the group the target has in the unified hierarchy);
* the target process and each of its threads: context switches, user/system CPU, names.

Every row carries ``ts_ns`` = ``time.monotonic_ns()`` taken at the start of its sampling round
(CLOCK_MONOTONIC, the clock of the eBPF records).  All rows of one round share that ``ts_ns``.
Counters are stored as *deltas over the interval that ends at ts_ns* (since the previous
successful read of the same counter); the first row of each series is the baseline and holds
zero deltas, so summing a delta column over a window gives the window total.  Thread and
process CPU times and context switches are stored both cumulative and as deltas.

Series (see README.md, "engramprof sample", for the full column list and units) are flushed to a
:class:`engramprof.trace.TraceWriter` with ``append_samples(name, table)`` about once a second,
in batches: ``psi``, ``vmstat``, ``kswapd``, ``cgroup``, ``process``, ``threads``.

:func:`summarize` is the pure function from those recorded frames to the JSON summary that
``engramprof sample --json`` prints; :meth:`Sampler.summary` applies it to the live window and
:func:`summarize_bundle` to a recorded TRACE.

The ``/proc`` and ``/sys`` roots are parameters so tests can point them at a fake tree.
Only /proc and /sys are read (psutil is not needed: raw reads are cheaper at 10 Hz and honour
the injected roots).
"""
from __future__ import annotations

import collections
import errno
import os
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import pandas as pd
import pyarrow as pa

from engramprof.errors import UserError

SAMPLE_NAMES = ("psi", "vmstat", "kswapd", "cgroup", "process", "threads")
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
# Older kernels (< 5.9) name the workingset counters without the _file suffix (anon+file).
_VMSTAT_ALIASES = {
    "workingset_refault_file": "workingset_refault",
    "workingset_activate_file": "workingset_activate",
    "workingset_restore_file": "workingset_restore",
}
# Derived columns: allocstall = sum(allocstall_*); pgscan_memcg / pgsteal_memcg = reclaim done
# because a memory cgroup hit its limit.  The kernel counts pgscan_anon/_file for every
# reclaimer but pgscan_kswapd/_direct/... only for global (non-cgroup) reclaim, so the
# difference is the cgroup-limit reclaim (mm/vmscan.c, shrink_inactive_list / evict_folios).
VMSTAT_DERIVED = ("allocstall", "pgscan_memcg", "pgsteal_memcg")
_RECLAIMERS = ("kswapd", "direct", "khugepaged", "proactive")

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
UNLIMITED = 1 << 62  # a cgroup limit at or above this is "no limit"

_SCHEMAS: dict[str, list[tuple[str, pa.DataType]]] = {
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
}


def schema(name: str) -> pa.Schema:
    """The Arrow schema of sample series ``name`` (every flushed part has exactly this)."""
    return pa.schema(_SCHEMAS[name])


# --------------------------------------------------------------------------------- raw reads

_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _read(path: str) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = []
        while True:
            b = os.read(fd, 65536)
            if not b:
                break
            chunks.append(b)
            if len(b) < 4096:  # proc/sysfs files return short reads at EOF
                break
        return b"".join(chunks)
    finally:
        os.close(fd)


class _FdCache:
    """Keep /proc files open and re-read them with pread(fd, n, 0).

    /proc seq files regenerate their content on a read at offset 0; skipping open/close halves
    the cost of a per-thread read.  A cached fd pins its task: once the task has exited, reads
    fail with ESRCH (a recycled pid/tid is never read by mistake).  At most ``limit`` fds are
    kept (the rest are opened per read) to stay well inside RLIMIT_NOFILE.
    """

    def __init__(self, limit: int = 400):
        self.limit = limit
        self.fds: dict[str, int] = {}
        self.lock = threading.Lock()

    def read(self, path: str, check_unlinked: bool = False) -> bytes:
        """Current content of ``path``.  ``check_unlinked``: fail with FileNotFoundError if
        the cached file was deleted (a removed cgroup's files fail with ENODEV by themselves,
        a plain file would keep returning its old content)."""
        with self.lock:
            fd = self.fds.get(path)
            if fd is not None and check_unlinked and os.fstat(fd).st_nlink == 0:
                del self.fds[path]
                os.close(fd)
                raise FileNotFoundError(errno.ENOENT, "deleted", path)
            if fd is None:
                if len(self.fds) >= self.limit:
                    return _read(path)
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
                self.fds[path] = fd
            try:
                data = os.pread(fd, 65536, 0)
            except OSError:
                del self.fds[path]
                os.close(fd)
                raise
            if len(data) == 65536:  # larger than expected: read it whole
                data = _read(path)
            return data

    def drop(self, keep: Callable[[str], bool]) -> None:
        with self.lock:
            for path in [p for p in self.fds if not keep(p)]:
                os.close(self.fds.pop(path))

    def close(self) -> None:
        self.drop(lambda p: False)


def _pick(data: bytes, keys: Iterable[str]) -> dict[str, int]:
    """Just ``keys`` from 'key value' lines (cheaper than parsing all of /proc/vmstat)."""
    data = b"\n" + data
    out = {}
    for k in keys:
        i = data.find(b"\n" + k.encode() + b" ")
        if i >= 0:
            j = data.find(b"\n", i + 1)
            try:
                out[k] = int(data[i + len(k) + 2 : j if j > 0 else None])
            except ValueError:
                pass
    return out


def _kv(data: bytes) -> dict[str, int]:
    """Parse 'key value' lines (vmstat, memory.stat, memory.events, io) into ints."""
    out: dict[str, int] = {}
    for line in data.split(b"\n"):
        k, _, v = line.partition(b" ")
        try:
            out[k.rstrip(b":").decode()] = int(v)  # /proc/PID/io uses 'key: value' 
        except ValueError:
            continue
    return out


_PSI_RE = re.compile(rb"(some|full) avg10=([\d.]+) avg60=[\d.]+ avg300=[\d.]+ total=(\d+)")


def parse_psi(data: bytes) -> dict[str, tuple[int, float]]:
    """``{'some': (total_us, avg10), 'full': (...)}`` from one pressure file."""
    return {m.group(1).decode(): (int(m.group(3)), float(m.group(2))) for m in _PSI_RE.finditer(data)}


def parse_stat(data: bytes) -> tuple[str, list[bytes]]:
    """(comm, fields from field 3 on) of a /proc/PID[/task/TID]/stat line."""
    lp, rp = data.find(b"("), data.rfind(b")")
    return data[lp + 1 : rp].decode(errors="replace"), data[rp + 2 :].split()


def _status_int(data: bytes, key: bytes) -> int | None:
    i = data.find(b"\n" + key + b":")
    if i < 0:
        return None
    j = data.find(b"\n", i + 1)
    try:
        return int(data[i + len(key) + 2 : j if j > 0 else None])
    except ValueError:
        return None


def _gone(exc: OSError) -> bool:
    return isinstance(exc, (FileNotFoundError, ProcessLookupError)) or exc.errno in (errno.ESRCH, errno.ENOENT, errno.ENODEV)


@dataclass
class CgroupInfo:
    """Where the target's cgroup lives. Paths are absolute (under the injected sys root)."""

    v1_memory: str | None = None  # v1 memory controller directory
    v2: str | None = None  # the target's group in the unified hierarchy
    v2_has_memory: bool = False  # memory controller enabled there (pure v2 / delegated)
    v1_rel: str | None = None
    v2_rel: str | None = None

    @property
    def version(self) -> str | None:
        if self.v1_memory and self.v2:
            return "hybrid"  # v1 memory counters + v2 pressure files
        if self.v1_memory:
            return "v1"
        if self.v2:
            return "v2"
        return None


def find_cgroup(pid: int, proc_root: str = "/proc", sys_root: str = "/sys") -> tuple[CgroupInfo, list[str]]:
    """Locate PID's memory cgroup (v1 memory controller) and its cgroup v2 group."""
    notes: list[str] = []
    info = CgroupInfo()
    try:
        text = _read(f"{proc_root}/{pid}/cgroup").decode(errors="replace")
    except OSError as exc:
        return info, [f"cannot read /proc/{pid}/cgroup ({exc.strerror}): no cgroup evidence"]
    base = Path(sys_root) / "fs" / "cgroup"
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hier, ctrls, rel = parts
        rel = rel.strip() or "/"
        if hier == "0" and ctrls == "":
            # hybrid: cgroup2 at fs/cgroup/unified; pure v2: at fs/cgroup itself
            for root in (base / "unified", base):
                ctl = root / "cgroup.controllers"
                if not ctl.exists():
                    continue
                d = root / rel.lstrip("/")
                if d.is_dir():
                    info.v2, info.v2_rel = str(d), rel
                    info.v2_has_memory = (d / "memory.current").exists() or (
                        rel == "/" and b"memory" in _safe_read(ctl).split()
                    )
                else:
                    notes.append(f"cgroup v2 group {rel} not found under {root}")
                break
        elif "memory" in ctrls.split(","):
            for root in (base / "memory", base / ctrls):
                d = root / rel.lstrip("/")
                if (d / "memory.stat").exists():
                    info.v1_memory, info.v1_rel = str(d), rel
                    break
            else:
                notes.append(f"memory cgroup {rel} (v1) not found under {base}")
    if info.v2 and info.v2_rel == "/" and not info.v1_memory:
        notes.append("target is in the root cgroup: cgroup counters are system-wide")
    elif info.v2 and info.v2_rel == "/":
        notes.append("target's cgroup v2 group is the root: its pressure files are system-wide")
    if info.version is None:
        notes.append(f"no memory cgroup found for pid {pid}")
    return info, notes


def _safe_read(p: Path) -> bytes:
    try:
        return _read(str(p))
    except OSError:
        return b""


# ---------------------------------------------------------------------------- the sampler


@dataclass
class _Series:
    name: str
    cols: list[tuple[str, pa.DataType]]
    rows: list[tuple] = field(default_factory=list)
    tables: list[pa.Table] = field(default_factory=list)

    def take(self) -> pa.Table | None:
        if not self.rows:
            return None
        rows, self.rows = self.rows, []
        columns = list(zip(*rows))
        t = pa.table({c: pa.array(columns[i], type=ty) for i, (c, ty) in enumerate(self.cols)})
        self.tables.append(t)
        return t

    def frame(self) -> pd.DataFrame:
        tables = self.tables + ([self._peek()] if self.rows else [])
        if not tables:
            return pa.schema(self.cols).empty_table().to_pandas()
        return pa.concat_tables(tables).to_pandas()

    def _peek(self) -> pa.Table:
        columns = list(zip(*self.rows))
        return pa.table({c: pa.array(columns[i], type=ty) for i, (c, ty) in enumerate(self.cols)})


FLUSH_MIN_ROWS = 64
FLUSH_MAX_S = 10.0


def _delta(cur: int | float | None, prev: int | float | None):
    if cur is None or prev is None:
        return None
    d = cur - prev
    return d if d >= 0 else None  # a counter went back: reset (group recreated): unknown


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
    ):
        if not (0 < hz <= 1000):
            raise UserError(f"--sample-hz must be in (0, 1000], got {hz}")
        self.pid = pid
        self.hz = float(hz)
        self.proc_root = str(proc_root)
        self.sys_root = str(sys_root)
        self.flush_s = flush_s
        self.clock = clock
        self.notes: list[str] = []
        self._noted: set[str] = set()
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self.target_exited = threading.Event()
        self.target_exit_ns: int | None = None
        self._thread: threading.Thread | None = None
        self._writer = None
        self._series = {n: _Series(n, _SCHEMAS[n]) for n in SAMPLE_NAMES}
        self._prev: dict[str, Any] = {}
        self._recent: collections.deque = collections.deque(maxlen=max(3, int(self.hz * 2) + 2))
        self.rounds = 0
        self.behind = 0
        self.start_ns: int | None = None
        self.stop_ns: int | None = None
        self._flush_errors = 0
        self.target_name: str | None = None
        self._starttime: bytes | None = None
        self._fdc = _FdCache()
        self._cached_tids: set[str] = set()
        self._tcache: dict[str, tuple] = {}
        self._target_reads = 0
        self._schedstat = True

        if pid is not None:
            self._check_pid(pid)  # UserError before anything else is set up
        # PSI availability
        self.psi_resources = []
        for r in PSI_RESOURCES:
            p = f"{self.proc_root}/pressure/{r}"
            try:
                if parse_psi(_read(p)):
                    self.psi_resources.append(r)
            except OSError as exc:
                if exc.errno == errno.EOPNOTSUPP:
                    self._note("psi", "PSI is compiled in but disabled (boot with psi=1): no pressure stall data")
                elif not os.path.isdir(f"{self.proc_root}/pressure"):
                    self._note("psi", f"PSI not available ({self.proc_root}/pressure missing: kernel without CONFIG_PSI): no pressure stall data")
                else:
                    self._note(f"psi-{r}", f"{p} unreadable ({exc.strerror}): no {r} pressure data")
        # vmstat availability and aliases
        self.vmstat_keys: dict[str, str] = {}
        try:
            vm = _kv(_read(f"{self.proc_root}/vmstat"))
            missing = []
            for c in VMSTAT_COUNTERS:
                if c in vm:
                    self.vmstat_keys[c] = c
                elif _VMSTAT_ALIASES.get(c) in vm:
                    self.vmstat_keys[c] = _VMSTAT_ALIASES[c]
                    self._note("vmstat-alias", f"old kernel: {c} taken from {_VMSTAT_ALIASES[c]} (anon + file)")
                else:
                    missing.append(c)
            important = [c for c in missing if not c.endswith(("_device", "_dma", "khugepaged", "proactive"))]
            if important:
                self._note("vmstat-missing", "vmstat counters absent on this kernel (left empty): " + ", ".join(important))
            self._vmstat_src = tuple(sorted(set(self.vmstat_keys.values())))
        except OSError as exc:
            self._note("vmstat", f"{self.proc_root}/vmstat unreadable ({exc.strerror}): no reclaim/refault counters")
        # kswapd threads
        self.kswapd = self._find_kswapd()
        if not self.kswapd:
            self._note("kswapd", "no kswapd threads found: kswapd activity not sampled")
        # target
        self.cgroup = CgroupInfo()
        if pid is not None:
            info, notes = find_cgroup(pid, self.proc_root, self.sys_root)
            self.cgroup = info
            for n in notes:
                self._note(n, n)

    # ----------------------------------------------------------------- setup helpers

    def _note(self, key: str, text: str) -> None:
        if key in self._noted:
            return
        self._noted.add(key)
        self.notes.append(text)

    def _rel(self, ts: int | None = None) -> str:
        if self.start_ns is None:
            return ""
        return f" at +{((ts or self.clock()) - self.start_ns) / 1e9:.2f} s"

    def _check_pid(self, pid: int) -> None:
        if pid <= 0:
            raise UserError(f"invalid pid {pid}")
        try:
            comm, f = parse_stat(_read(f"{self.proc_root}/{pid}/stat"))
        except OSError:
            raise UserError(f"no process with pid {pid}") from None
        if f and f[0] in (b"Z", b"X"):
            raise UserError(f"pid {pid} ({comm}) has already exited (zombie)")
        self.target_name = comm
        self._starttime = f[19] if len(f) > 19 else None

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
                comm = _read(f"{self.proc_root}/{e}/comm").strip().decode(errors="replace")
            except OSError:
                continue
            if re.fullmatch(r"kswapd\d+(:\d+)?", comm):
                out[int(e)] = comm
        return dict(sorted(out.items()))

    # ----------------------------------------------------------------- raw readings

    def _read_psi(self, root: str, resources: Iterable[str]) -> dict[str, dict[str, tuple[int, float]]]:
        out = {}
        for r in resources:
            try:
                out[r] = parse_psi(self._fdc.read(f"{root}/{r}"))
            except OSError:
                out[r] = None
        return out

    def _read_cgroup(self, ts: int) -> dict[str, int | None] | None:
        cg = self.cgroup
        if cg.version is None:
            return None
        vals: dict[str, int | None] = {}

        def rd(d: str, fname: str) -> bytes | None:
            p = f"{d}/{fname}"
            try:
                return self._fdc.read(p, check_unlinked=True)
            except OSError as exc:
                why = "disappeared (cgroup removed?)" if _gone(exc) else f"unreadable ({exc.strerror})"
                self._note(f"cg-{p}", f"cgroup file {p} {why}{self._rel(ts)}: its values are empty from then on")
                return None

        def num(b: bytes | None) -> int | None:
            if b is None:
                return None
            s = b.strip()
            if s == b"max":
                return None
            try:
                return int(s)
            except ValueError:
                return None

        if cg.v1_memory:
            d = cg.v1_memory
            st = rd(d, "memory.stat")
            st = _kv(st) if st is not None else None
            if st is not None:
                for col, keys in (
                    ("refault_file", ("total_workingset_refault_file", "workingset_refault_file", "total_workingset_refault", "workingset_refault")),
                    ("activate_file", ("total_workingset_activate_file", "workingset_activate_file")),
                    ("restore_file", ("total_workingset_restore_file", "workingset_restore_file")),
                    ("pgscan", ("total_pgscan", "pgscan")),
                    ("pgsteal", ("total_pgsteal", "pgsteal")),
                    ("pgmajfault", ("total_pgmajfault", "pgmajfault")),
                    ("pgpgin", ("total_pgpgin", "pgpgin")),
                    ("pgpgout", ("total_pgpgout", "pgpgout")),
                ):
                    vals[col] = next((st[k] for k in keys if k in st), None)
            vals["usage_bytes"] = num(rd(d, "memory.usage_in_bytes"))
            lim = num(rd(d, "memory.limit_in_bytes"))
            if st is not None and "hierarchical_memory_limit" in st:
                lim = min(x for x in (lim, st["hierarchical_memory_limit"]) if x is not None)
            vals["limit_bytes"] = lim
            vals["failcnt"] = num(rd(d, "memory.failcnt"))
        if cg.v2:
            d = cg.v2
            if cg.v2_has_memory and not cg.v1_memory:
                st = rd(d, "memory.stat")
                st = _kv(st) if st is not None else None
                if st is not None:
                    for col, key in (
                        ("refault_file", "workingset_refault_file"),
                        ("activate_file", "workingset_activate_file"),
                        ("restore_file", "workingset_restore_file"),
                        ("pgscan", "pgscan"),
                        ("pgsteal", "pgsteal"),
                        ("pgmajfault", "pgmajfault"),
                    ):
                        vals[col] = st.get(key, st.get(key.removesuffix("_file")) if key.endswith("_file") else None)
                if cg.v2_rel != "/":
                    vals["usage_bytes"] = num(rd(d, "memory.current"))
                    vals["limit_bytes"] = num(rd(d, "memory.max"))
                    ev = rd(d, "memory.events")
                    if ev is not None:
                        e = _kv(ev)
                        vals["events_high"], vals["events_max"], vals["events_oom"] = e.get("high"), e.get("max"), e.get("oom")
            for res, pre in (("memory", "mem"), ("io", "io")):
                b = rd(d, f"{res}.pressure")
                p = parse_psi(b) if b is not None else {}
                vals[f"{pre}_some_us"] = p["some"][0] if "some" in p else None
                vals[f"{pre}_full_us"] = p["full"][0] if "full" in p else None
        return vals

    def _read_target(self, ts: int) -> tuple[dict | None, list[tuple] | None]:
        """(process reading, [(tid, name, vcsw, ivcsw, utime_s, stime_s, run_ns, runq_ns, timeslices)])
        or (None, None) once the process is gone.

        A thread's stat (name, tick-based utime/stime) is re-read once a second; between those
        reads the name and user/system split are carried over (they move in 10 ms ticks anyway);
        schedstat's on-CPU ns give the precise per-interval CPU.

        /proc/PID/task/TID/schedstat (on-CPU ns, run-queue wait ns, times scheduled in) is read
        first: when it has not changed since the last read the thread has not been switched in
        or out since, so its stat and status are not re-read (idle pool threads cost one small
        read each)."""
        pid = self.pid
        base = f"{self.proc_root}/{pid}"
        try:
            comm, f = parse_stat(self._fdc.read(f"{base}/stat", check_unlinked=True))
        except OSError:
            self._fdc.drop(lambda p: not p.startswith(base + "/"))
            return None, None
        if not f or f[0] in (b"Z", b"X") or (self._starttime is not None and len(f) > 19 and f[19] != self._starttime):
            return None, None
        proc = {
            "state": f[0].decode(),
            "utime_s": int(f[11]) / _CLK_TCK,
            "stime_s": int(f[12]) / _CLK_TCK,
            "minflt": int(f[7]),
            "majflt": int(f[9]),
            "num_threads": int(f[17]),
            "rss_bytes": int(f[21]) * _PAGE,
            "rchar": None,
            "read_bytes": None,
            "syscr": None,
        }
        if "io-denied" not in self._noted:
            try:
                io = _kv(self._fdc.read(f"{base}/io"))
                proc.update(rchar=io.get("rchar"), read_bytes=io.get("read_bytes"), syscr=io.get("syscr"))
            except PermissionError:
                self._note("io-denied", f"/proc/{pid}/io not readable (needs root or same user): no rchar/read_bytes")
            except OSError:
                pass
        threads = []
        try:
            tids = os.listdir(f"{base}/task")
        except OSError:
            tids = []
        live = set(tids)
        if self._cached_tids - live:
            tp = f"{base}/task/"
            self._fdc.drop(lambda p: not p.startswith(tp) or p[len(tp) :].split("/", 1)[0] in live)
        self._cached_tids = live
        cache = self._tcache
        fresh: dict[str, tuple] = {}
        self._target_reads += 1
        refresh_stat = (self._target_reads - 1) % max(1, round(self.hz)) == 0
        for t in tids:
            tp = f"{base}/task/{t}/"
            sched = None
            if self._schedstat:
                try:
                    sched = self._fdc.read(tp + "schedstat")
                except FileNotFoundError:
                    if not os.path.exists(tp + "stat"):
                        continue  # thread exited
                    self._schedstat = False  # kernel without CONFIG_SCHED_INFO
                    self._note("schedstat", "no /proc/PID/task/TID/schedstat (CONFIG_SCHED_INFO off): per-thread run_ns/runq_ns empty")
                except OSError:
                    continue  # thread exited
            hit = cache.get(t)
            if sched is not None and hit is not None and hit[0] == sched:
                row = hit[1]  # not scheduled since the last read: nothing in stat/status moved
            else:
                try:
                    if hit is None or sched is None or refresh_stat:
                        tcomm, tf = parse_stat(self._fdc.read(tp + "stat"))
                        ut, stt = int(tf[11]) / _CLK_TCK, int(tf[12]) / _CLK_TCK
                    else:  # name and tick-based user/system split: refreshed once a second
                        tcomm, ut, stt = hit[1][1], hit[1][4], hit[1][5]
                    st = self._fdc.read(tp + "status")
                except OSError:
                    continue  # thread exited between listdir and read
                run = sched.split() if sched else ()
                row = (
                    int(t),
                    tcomm,
                    _status_int(st, b"voluntary_ctxt_switches"),
                    _status_int(st, b"nonvoluntary_ctxt_switches"),
                    ut,
                    stt,
                    int(run[0]) if len(run) == 3 else None,
                    int(run[1]) if len(run) == 3 else None,
                    int(run[2]) if len(run) == 3 else None,
                )
            fresh[t] = (sched, row)
            threads.append(row)
        self._tcache = fresh
        return proc, threads

    def _read_kswapd(self) -> list[tuple[int, str, str, float]]:
        out = []
        for pid, name in self.kswapd.items():
            try:
                _, f = parse_stat(self._fdc.read(f"{self.proc_root}/{pid}/stat"))
                out.append((pid, name, f[0].decode(), (int(f[11]) + int(f[12])) / _CLK_TCK))
            except (OSError, IndexError, ValueError):
                self._note(f"kswapd-{pid}", f"kswapd thread {pid} ({name}) vanished")
        return out

    def _read_vmstat(self) -> dict[str, int] | None:
        if not self.vmstat_keys:
            return None
        try:
            vm = _pick(self._fdc.read(f"{self.proc_root}/vmstat"), self._vmstat_src)
        except OSError:
            return None
        return {c: vm.get(k) for c, k in self.vmstat_keys.items()}

    def snapshot(self) -> dict:
        """One fresh reading of every source, cumulative values, not recorded.

        ``{"ts_ns", "psi": {res: {"some": (total_us, avg10), "full": ...}}, "vmstat": {counter: n},
        "kswapd": [(pid, name, state, cpu_total_s)], "cgroup": {col: cumulative or gauge},
        "process": {...} | None, "threads": [(tid, name, vcsw, ivcsw, utime_s, stime_s, run_ns, runq_ns, timeslices)] | None}``
        """
        ts = self.clock()
        snap: dict[str, Any] = {"ts_ns": ts}
        snap["psi"] = self._read_psi(f"{self.proc_root}/pressure", self.psi_resources)
        snap["vmstat"] = self._read_vmstat()
        snap["kswapd"] = self._read_kswapd()
        snap["cgroup"] = self._read_cgroup(ts)
        if self.pid is not None and not self.target_exited.is_set():
            snap["process"], snap["threads"] = self._read_target(ts)
        else:
            snap["process"], snap["threads"] = None, None
        return snap

    # ----------------------------------------------------------------- recording

    def sample_now(self) -> None:
        """Take one sampling round and record it (the background thread calls this)."""
        snap = self.snapshot()
        with self._lock:
            self._record(snap)

    def _record(self, s: dict) -> None:
        ts = s["ts_ns"]
        if self.start_ns is None:
            self.start_ns = ts
        prev = self._prev
        first = self.rounds == 0
        self.rounds += 1
        ser = self._series
        # psi
        for r, v in s["psi"].items():
            key = f"psi:{r}"
            if v is None:
                self._note(f"psi-lost-{r}", f"/proc/pressure/{r} became unreadable{self._rel(ts)}")
                continue
            some, full = v.get("some"), v.get("full")
            cur = (some[0] if some else None, full[0] if full else None)
            p = prev.get(key, cur)
            ser["psi"].rows.append(
                (ts, r, _delta(cur[0], p[0]), _delta(cur[1], p[1]), cur[0], cur[1], some[1] if some else None, full[1] if full else None)
            )
            prev[key] = cur
        # vmstat
        vm = s["vmstat"]
        if vm is not None:
            p = prev.get("vmstat", vm)
            deltas = {c: _delta(vm.get(c), p.get(c)) for c in VMSTAT_COUNTERS}
            stalls = [deltas[c] for c in VMSTAT_COUNTERS if c.startswith("allocstall_") and deltas[c] is not None]
            deltas["allocstall"] = sum(stalls) if stalls else None
            for kind in ("pgscan", "pgsteal"):
                tot = [deltas.get(f"{kind}_anon"), deltas.get(f"{kind}_file")]
                if None in tot:
                    deltas[f"{kind}_memcg"] = None
                else:
                    glob = sum(deltas.get(f"{kind}_{r}") or 0 for r in _RECLAIMERS)
                    deltas[f"{kind}_memcg"] = max(0, sum(tot) - glob)
            ser["vmstat"].rows.append((ts,) + tuple(deltas[c] for c in VMSTAT_COUNTERS + VMSTAT_DERIVED))
            prev["vmstat"] = vm
        # kswapd
        for pid, name, state, cpu in s["kswapd"]:
            key = f"kswapd:{pid}"
            ser["kswapd"].rows.append((ts, pid, name, state, max(0.0, cpu - prev.get(key, cpu)), cpu))
            prev[key] = cpu
        # cgroup
        cg = s["cgroup"]
        if cg is not None:
            p = prev.setdefault("cgroup", {})
            row = [ts] + [cg.get(c) for c in CGROUP_GAUGES]
            for c in CGROUP_COUNTERS:
                cur = cg.get(c)
                if cur is None:
                    row.append(None)
                    continue
                if c not in p:
                    row.append(0 if first or "cg_seen" not in prev else None)
                else:
                    d = _delta(cur, p[c])
                    if d is None:
                        self._note(f"cg-reset-{c}", f"cgroup counter {c} went backwards{self._rel(ts)} (group recreated?)")
                    row.append(d)
                p[c] = cur
            prev["cg_seen"] = True
            ser["cgroup"].rows.append(tuple(row))
        # process + threads
        if self.pid is not None and not self.target_exited.is_set():
            proc, threads = s["process"], s["threads"]
            if proc is None:
                self.target_exited.set()
                self.target_exit_ns = ts
                if first:
                    self._note("exit", f"pid {self.pid} exited before the first sample")
                else:
                    self._note("exit", f"pid {self.pid} exited{self._rel(ts)}; its samples up to then are kept")
            else:
                pp = prev.get("process", proc)
                cpu = proc["utime_s"] + proc["stime_s"]
                ser["process"].rows.append(
                    (
                        ts,
                        self.pid,
                        proc["state"],
                        proc["utime_s"],
                        proc["stime_s"],
                        max(0.0, cpu - pp["utime_s"] - pp["stime_s"]),
                        proc["num_threads"],
                        proc["rss_bytes"],
                        _delta(proc["minflt"], pp["minflt"]),
                        _delta(proc["majflt"], pp["majflt"]),
                        _delta(proc["rchar"], pp["rchar"]),
                        _delta(proc["read_bytes"], pp["read_bytes"]),
                        _delta(proc["syscr"], pp["syscr"]),
                    )
                )
                prev["process"] = proc
                known: dict = prev.setdefault("threads", {})
                seen = {}
                for tid, name, vcs, ivcs, ut, stt, run, runq, slices in threads:
                    # a thread absent from the previous round was born after it: its whole
                    # count falls in this interval; threads of the very first round: baseline
                    cur = (vcs, ivcs, ut, stt, run, runq, slices)
                    base = known.get(tid) or (cur if first else (0, 0, 0.0, 0.0, 0, 0, 0))
                    ser["threads"].rows.append(
                        (
                            ts,
                            self.pid,
                            tid,
                            name,
                            vcs,
                            ivcs,
                            _delta(vcs, base[0]),
                            _delta(ivcs, base[1]),
                            ut,
                            stt,
                            (run - base[4]) / 1e9 if run is not None and base[4] is not None else max(0.0, ut + stt - base[2] - base[3]),
                            _delta(run, base[4]),
                            _delta(runq, base[5]),
                            _delta(slices, base[6]),
                        )
                    )
                    seen[tid] = cur
                prev["threads"] = seen
        # recent window for status_line()
        ks = sum(x[3] for x in s["kswapd"])
        self._recent.append(
            (
                ts,
                {r: (v.get("some", (0, 0))[0], v.get("full", (0, 0))[0]) for r, v in s["psi"].items() if v},
                vm or {},
                ks,
                (cg or {}).get("refault_file"),
                sum((t[2] or 0) + (t[3] or 0) for t in (s.get("threads") or [])),
            )
        )

    def flush(self, force: bool = True) -> None:
        """Move buffered rows into Arrow tables and hand them to the writer (if any).

        ``force=False`` (the periodic flush) skips series with fewer than ``FLUSH_MIN_ROWS``
        rows buffered unless their oldest row is ``FLUSH_MAX_S`` old: every Parquet part costs
        about a millisecond to write whatever its size, so the 10-rows-a-second system series
        go out every 10 s and the per-thread series every ``flush_s``.
        """
        now = self.clock()
        with self._lock:
            tables = {
                n: s.take()
                for n, s in self._series.items()
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
                self._note("flush", f"writing samples to the trace failed ({type(exc).__name__}: {exc}); kept in memory")

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
                self._note(f"err-{type(exc).__name__}", f"sampling error ({type(exc).__name__}: {exc})")
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
            self._note("behind", f"sampler fell behind its {self.hz:g} Hz schedule {self.behind} times")
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
            return {n: s.frame() for n, s in self._series.items()}

    def summary(self) -> dict:
        """:func:`summarize` over the window recorded so far."""
        return summarize(self.frames(), self.info())

    def status_line(self) -> str:
        """One line for a live view: PSI memory/io, refaults/s, reclaim, target wakeups."""
        with self._lock:
            recent = list(self._recent)
        if len(recent) < 2:
            return "sampler: waiting for data"
        # about the last second
        end = recent[-1]
        start = next((r for r in recent if end[0] - r[0] <= 1.05e9), recent[0])
        if start is end:
            start = recent[-2]
        dt = (end[0] - start[0]) / 1e9 or 1e-9
        parts = []
        psi = []
        for r, label in (("memory", "mem"), ("io", "io")):
            if r in end[1] and r in start[1]:
                some = (end[1][r][0] - start[1][r][0]) / (dt * 1e6) * 100
                full = (end[1][r][1] - start[1][r][1]) / (dt * 1e6) * 100
                psi.append(f"{label} {some:.1f}%/{full:.1f}%")
        parts.append("PSI some/full " + " ".join(psi) if psi else "PSI n/a")

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
        glob = sum(rate(f"pgscan_{x}") or 0 for x in _RECLAIMERS)
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


# ------------------------------------------------------------------------------ analysis


def _py(x):
    """numpy/pandas scalar -> JSON-able Python value (NaN/NA -> None)."""
    if x is None:
        return None
    try:
        if pd.isna(x):
            return None
    except (TypeError, ValueError):
        pass
    if hasattr(x, "item"):
        x = x.item()
    if isinstance(x, float):
        return round(x, 6)
    return x


def _sum(s: pd.Series):
    """Sum of a counter column; int (nullable int columns arrive as float from Parquet)."""
    s = s.dropna()
    if s.empty:
        return None
    v = _py(s.sum())
    return int(v) if isinstance(v, float) and v.is_integer() else v


def _window(frames: Mapping[str, pd.DataFrame | None], info: Mapping | None) -> tuple[int | None, int | None]:
    lo, hi = None, None
    for df in frames.values():
        if df is None or df.empty:
            continue
        a, b = int(df["ts_ns"].min()), int(df["ts_ns"].max())
        lo = a if lo is None else min(lo, a)
        hi = b if hi is None else max(hi, b)
    return lo, hi


def _pct(us, window_us):
    if us is None or not window_us:
        return None
    return round(100.0 * us / window_us, 3)


def summarize(frames: Mapping[str, pd.DataFrame | None], info: Mapping | None = None) -> dict:
    """The JSON summary of recorded sample frames (pure: the frames and run info in, dict out).

    ``frames`` maps series names (``psi``, ``vmstat``, ``kswapd``, ``cgroup``, ``process``,
    ``threads``) to DataFrames with the columns of :func:`schema`; missing ones are skipped.
    ``info`` is :meth:`Sampler.info` (``meta["sampler"]`` in a TRACE); it adds the pid, cgroup
    paths and notes.
    """
    info = dict(info or {})
    notes = list(info.get("notes") or [])
    lo, hi = _window(frames, info)
    dur_ns = (hi - lo) if lo is not None else 0
    win_us = dur_ns / 1e3
    out: dict[str, Any] = {
        "window": {
            "start_ns": lo,
            "end_ns": hi,
            "duration_s": round(dur_ns / 1e9, 3),
            "samples": len(set().union(*(set(df["ts_ns"].unique()) for df in frames.values() if df is not None and not df.empty))) if lo is not None else 0,
            "hz": info.get("hz"),
        }
    }
    if dur_ns == 0:
        notes.append("fewer than two samples: no interval to report (window too short)")

    # PSI
    psi = frames.get("psi")
    out["psi"] = {}
    if psi is not None and not psi.empty:
        for r, g in psi.sort_values("ts_ns").groupby("resource", sort=False):
            some, full = _sum(g["some_us"]), _sum(g["full_us"])
            dt = g["ts_ns"].diff() / 1e3
            peak = (g["some_us"] / dt).where(dt > 0).max()
            out["psi"][r] = {
                "some_us": some,
                "full_us": full,
                "some_pct": _pct(some, win_us),
                "full_pct": _pct(full, win_us),
                "some_peak_pct": None if pd.isna(peak) else round(100 * float(peak), 3),
                "some_avg10_end": _py(g["some_avg10"].iloc[-1]),
                "full_avg10_end": _py(g["full_avg10"].iloc[-1]),
            }
    else:
        notes.append("no PSI data: pressure stall time not reported")

    # vmstat
    vm = frames.get("vmstat")
    if vm is not None and not vm.empty:
        out["vmstat"] = {c: _sum(vm[c]) for c in vm.columns if c != "ts_ns"}
        secs = dur_ns / 1e9
        out["vmstat_per_s"] = {
            c: (round(v / secs, 3) if v is not None and secs else None)
            for c, v in out["vmstat"].items()
            if c in ("workingset_refault_file", "pgscan_kswapd", "pgscan_direct", "pgscan_memcg", "allocstall", "pgmajfault", "pgpgin")
        }
    else:
        out["vmstat"] = {}
        notes.append("no /proc/vmstat data")

    # kswapd
    ks = frames.get("kswapd")
    if ks is not None and not ks.empty:
        threads = []
        for (pid, name), g in ks.groupby(["pid", "name"]):
            threads.append({"pid": int(pid), "name": name, "cpu_s": _py(g["cpu_s"].sum()), "busy_intervals": int((g["cpu_s"] > 0).sum()), "intervals": max(0, len(g) - 1)})
        tot = sum(t["cpu_s"] or 0 for t in threads)
        out["kswapd"] = {"cpu_s": round(tot, 6), "cpu_pct": _pct(tot * 1e6, win_us), "threads": threads}
    else:
        out["kswapd"] = None

    # cgroup
    cg = frames.get("cgroup")
    cgi = info.get("cgroup") or {}
    if cgi.get("version") or (cg is not None and not cg.empty):
        sec: dict[str, Any] = {
            "version": cgi.get("version"),
            "v1_memory": cgi.get("v1_memory"),
            "v2": cgi.get("v2"),
        }
        if cg is not None and not cg.empty:
            cg = cg.sort_values("ts_ns")
            usage = cg["usage_bytes"].dropna()
            lim = cg["limit_bytes"].dropna()
            sec["usage_bytes"] = _py(usage.iloc[-1]) if not usage.empty else None
            sec["usage_max_bytes"] = _py(usage.max()) if not usage.empty else None
            limit = _py(lim.iloc[-1]) if not lim.empty else None
            sec["limit_bytes"] = limit if limit is not None and limit < UNLIMITED else None
            sec["limited"] = limit is not None and limit < UNLIMITED
            for c in CGROUP_COUNTERS:
                sec[c] = _sum(cg[c])
            sec["pressure"] = {
                "memory": {"some_us": sec.pop("mem_some_us"), "full_us": sec.pop("mem_full_us")},
                "io": {"some_us": sec.pop("io_some_us"), "full_us": sec.pop("io_full_us")},
            }
            for r in ("memory", "io"):
                p = sec["pressure"][r]
                p["some_pct"], p["full_pct"] = _pct(p["some_us"], win_us), _pct(p["full_us"], win_us)
        out["cgroup"] = sec
    elif info.get("pid") is not None:
        out["cgroup"] = None

    # process + threads
    pr, th = frames.get("process"), frames.get("threads")
    if info.get("pid") is not None or (pr is not None and not pr.empty):
        psec: dict[str, Any] = {
            "pid": info.get("pid"),
            "name": info.get("target_name"),
            "exited": bool(info.get("target_exited")),
        }
        if info.get("target_exit_ns") is not None and lo is not None:
            psec["exited_after_s"] = round((info["target_exit_ns"] - lo) / 1e9, 3)
        if pr is not None and not pr.empty:
            pr = pr.sort_values("ts_ns")
            span = (int(pr["ts_ns"].iloc[-1]) - int(pr["ts_ns"].iloc[0])) / 1e9
            cpu = _sum(pr["cpu_s"])
            psec.update(
                samples=int(len(pr)),
                span_s=round(span, 3),
                cpu_user_s=round(float(pr["utime_s"].iloc[-1] - pr["utime_s"].iloc[0]), 3),
                cpu_system_s=round(float(pr["stime_s"].iloc[-1] - pr["stime_s"].iloc[0]), 3),
                cpu_pct=round(100 * cpu / span, 2) if cpu is not None and span else None,
                num_threads=_py(pr["num_threads"].iloc[-1]),
                rss_bytes=_py(pr["rss_bytes"].iloc[-1]),
                minflt=_sum(pr["minflt"]),
                majflt=_sum(pr["majflt"]),
                rchar=_sum(pr["rchar"]),
                read_bytes=_sum(pr["read_bytes"]),
                syscr=_sum(pr["syscr"]),
            )
        else:
            psec["samples"] = 0
        if th is not None and not th.empty:
            g = th.sort_values("ts_ns").groupby("tid")
            cols = {
                "name": g["name"].last(),
                "ctx_voluntary": g["ctx_voluntary_delta"].sum(),
                "ctx_involuntary": g["ctx_involuntary_delta"].sum(),
                "cpu_s": g["cpu_s"].sum(),
            }
            has_sched = "run_ns" in th.columns and th["run_ns"].notna().any()
            if has_sched:
                cols["run_s"] = g["run_ns"].sum() / 1e9
                cols["runq_s"] = g["runq_ns"].sum() / 1e9
            per = pd.DataFrame(cols).sort_values(["ctx_voluntary", "ctx_involuntary"], ascending=False)
            vol, invol = int(per["ctx_voluntary"].sum()), int(per["ctx_involuntary"].sum())
            span = psec.get("span_s") or dur_ns / 1e9
            psec.update(
                threads_seen=int(len(per)),
                ctx_voluntary=vol,
                ctx_involuntary=invol,
                ctx_per_s=round((vol + invol) / span, 1) if span else None,
                run_s=round(float(per["run_s"].sum()), 6) if has_sched else None,
                runq_s=round(float(per["runq_s"].sum()), 6) if has_sched else None,
                threads=[
                    {"tid": int(tid), "name": r["name"], "ctx_voluntary": int(r["ctx_voluntary"]), "ctx_involuntary": int(r["ctx_involuntary"]), "cpu_s": round(float(r["cpu_s"]), 3)}
                    | ({"run_s": round(float(r["run_s"]), 6), "runq_s": round(float(r["runq_s"]), 6)} if has_sched else {})
                    for tid, r in per.head(64).iterrows()
                ],
            )
            if len(per) > 64:
                notes.append(f"process.threads lists the 64 busiest of {len(per)} threads")
        out["process"] = psec
    out["interpretation"] = interpret(out)
    out["notes"] = notes
    return out


# thresholds for the interpretation lines
PSI_MEM_PCT = 1.0  # memory some above this share of the window: pressure worth reporting
PSI_IO_PCT = 5.0
KSWAPD_BUSY_PCT = 1.0


def interpret(s: Mapping) -> list[str]:
    """Short plain-language reading of a summary (what the memory evidence says)."""
    lines: list[str] = []
    vm = s.get("vmstat") or {}
    psi = s.get("psi") or {}
    dur = (s.get("window") or {}).get("duration_s") or 0
    if not dur:
        return ["window too short to interpret"]
    mem = psi.get("memory") or {}
    ks = s.get("kswapd") or {}
    kcpu = ks.get("cpu_pct") or 0
    scan_k = vm.get("pgscan_kswapd") or 0
    scan_d = vm.get("pgscan_direct") or 0
    stalls = vm.get("allocstall") or 0
    memcg = vm.get("pgscan_memcg") or 0
    refaults = vm.get("workingset_refault_file") or 0
    mem_some = mem.get("some_pct")
    kswapd_idle = kcpu < KSWAPD_BUSY_PCT and scan_k == 0
    if kswapd_idle and scan_d == 0 and stalls == 0 and memcg == 0 and (mem_some or 0) < 0.05:
        psi_txt = "PSI memory 0" if mem_some is not None else "PSI n/a"
        lines.append(f"no reclaim: kswapd idle, no direct reclaim, {psi_txt}")
    else:
        bits = []
        if not kswapd_idle:
            bits.append(f"kswapd busy ({kcpu:.1f}% of a core, {scan_k:,} pages scanned)")
        if scan_d or stalls:
            bits.append(f"direct reclaim ({scan_d:,} pages scanned, {stalls:,} allocation stalls)")
        if memcg:
            bits.append(f"cgroup-limit reclaim ({memcg:,} pages scanned)")
        if bits:
            lines.append("reclaim: " + "; ".join(bits))
        if mem_some is not None and mem_some >= 0.05:
            lines.append(
                f"memory pressure: some task stalled on memory {mem_some:.1f}% of the window, "
                f"all non-idle tasks at once {mem.get('full_pct') or 0:.1f}%"
                + (" (significant)" if mem_some >= PSI_MEM_PCT else " (slight)")
            )
    if refaults:
        rate = refaults / dur
        if kswapd_idle and not scan_d and not memcg:
            lines.append(f"file refaults {refaults:,} ({rate:,.0f}/s) with no reclaim in the window: pages evicted earlier are being read back")
        else:
            lines.append(f"file refaults {refaults:,} ({rate:,.0f}/s): recently evicted pages are being read back (thrashing)")
    io = psi.get("io") or {}
    if (io.get("some_pct") or 0) >= PSI_IO_PCT:
        lines.append(f"io pressure: tasks waited on I/O {io['some_pct']:.1f}% of the window (full {io.get('full_pct') or 0:.1f}%)")
    cg = s.get("cgroup") or {}
    if cg.get("version"):
        cref = cg.get("refault_file") or 0
        hits = (cg.get("failcnt") or 0) + (cg.get("events_max") or 0)
        if cref or hits or cg.get("pgscan"):
            lim = cg.get("limit_bytes")
            use = cg.get("usage_max_bytes")
            at = f" (usage up to {use / 2**20:.1f} MiB of a {lim / 2**20:.1f} MiB limit)" if lim and use else ""
            lines.append(f"target's memory cgroup is reclaiming{at}: {cref:,} refaults, {hits:,} limit hits")
        cp = (cg.get("pressure") or {}).get("memory") or {}
        if (cp.get("some_pct") or 0) >= 0.05:
            lines.append(f"target's cgroup memory pressure: some {cp['some_pct']:.1f}%, full {cp.get('full_pct') or 0:.1f}% of the window")
    pr = s.get("process") or {}
    if pr.get("samples"):
        if pr.get("read_bytes") is not None and pr.get("rchar"):
            frac = pr["read_bytes"] / pr["rchar"] if pr["rchar"] else 0
            lines.append(
                f"target read {pr['rchar'] / 2**20:,.1f} MiB through syscalls, {pr['read_bytes'] / 2**20:,.1f} MiB of it from storage"
                + (" (page-cache hits)" if frac < 0.01 else "")
            )
        if pr.get("ctx_per_s") is not None:
            lines.append(f"target: {pr['ctx_per_s']:,.0f} context switches/s over {pr.get('threads_seen', 0)} threads, {pr.get('cpu_pct') or 0:.0f}% CPU")
    if pr.get("exited"):
        lines.append(f"target exited after {pr.get('exited_after_s', '?')} s")
    return lines


def summarize_bundle(path: str | os.PathLike) -> dict:
    """:func:`summarize` applied to the sample series of a recorded TRACE."""
    from engramprof.trace import load_bundle

    tr = load_bundle(path)
    frames = {n: tr.samples(n) for n in SAMPLE_NAMES}
    return summarize(frames, tr.meta.get("sampler") or {})
