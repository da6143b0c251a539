"""The faults the lab scenarios inject: one object per scenario, each with its own set-up,
teardown and expected evidence.

A :class:`Impairment` is driven by :class:`engramprof.lab.scenarios.Scenario` (the runner) in this
order::

    place_table(sc)     put the table where the fault needs it (default: the workdir)
    setup(sc)           make the fault; returns the cgroup.procs files the reader joins
    on_reader_pid(sc)   only if ``arms_on_reader_pid``: the reader printed its pid
    stats()             the fault's counters now (at ready and at the end)
    halt()              the scenario is closing: stop acting (the reader may still run)
    teardown(sc)        the reader is gone: remove what the fault made

``counters`` name the evidence that rises while the fault acts (reported as end minus
ready), ``levels`` the evidence reported as it is at the end.  ``sc`` is the running
Scenario: its ``say``, ``workdir``, ``table_path``, ``make_table`` and ``use_table``.
"""
from __future__ import annotations

import os
import shutil
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from engramprof.lab import host
from engramprof.lab import table as table_mod
from engramprof.lab.host import Cgroup, ScenarioError

if TYPE_CHECKING:
    from engramprof.lab.scenarios import Scenario

DEFAULT_EVICT_MS = 20.0
DEFAULT_MEMORY_MIB = 16.0
DEFAULT_IOPS = 400


@dataclass(frozen=True)
class Spec:
    name: str
    reader: str
    cache: str  # "warm" | "cold": what the reader does to the table before it starts
    summary: str


class Impairment:
    """A scenario without an injected fault: the reader and the table's cache state alone."""

    spec: Spec
    needs_root = False
    arms_on_reader_pid = False
    counters: tuple[str, ...] = ()
    levels: tuple[str, ...] = ("table_resident",)

    def __init__(self, **_options):
        self.cgroups: dict[str, Cgroup] = {}

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def table_must_be_droppable(self) -> bool:
        """Whether the table, where :meth:`place_table` puts it, must be on a filesystem whose
        page cache can be dropped (not tmpfs)."""
        return self.spec.cache == "cold"

    def place_table(self, sc: "Scenario") -> None:
        if sc.user_table is not None:
            sc.use_table(sc.user_table)
        else:
            sc.make_table(os.path.join(sc.workdir, "engram.safetensors"))

    def setup(self, sc: "Scenario") -> list[str]:
        return []

    def on_reader_pid(self, sc: "Scenario") -> None:
        pass

    def stats(self) -> dict:
        return {}

    def info(self) -> dict:
        return {f"{ctl}_cgroup": cg.path for ctl, cg in self.cgroups.items()}

    def failure_hint(self, stats_at_end: dict) -> str:
        return ""

    def halt(self) -> None:
        pass

    def teardown(self, sc: "Scenario") -> tuple[list[str], list[str]]:
        """Remove what the fault made: (what was removed, problems met)."""
        done, problems = [], []
        for cg in self.cgroups.values():
            try:
                cg.remove()
                done.append(f"cgroup {cg.path}")
            except ScenarioError as exc:
                problems.append(str(exc))
        return done, problems

    def _make_cgroup(self, controller: str, missing: str) -> Cgroup:
        h = host.find_hierarchy(controller)
        if h is None:
            raise ScenarioError(missing)
        cg = self.cgroups[controller] = Cgroup(h, self.name)
        return cg


class PythonSchedulingImpairment(Impairment):
    """Nothing injected: the 32-thread pool's futures, wakeups and GIL on a cached table."""

    spec = Spec("python-scheduling", "pool", "warm",
                "32-thread pool reader, fully cached table: the time goes to futures, wakeups and the GIL")


class HealthyImpairment(Impairment):
    """Nothing injected, and a reader that does not hold its batches back: the control."""

    spec = Spec("healthy", "nowait", "warm",
                "RWF_NOWAIT-first reader, fully cached table: nothing holds the batches back")


class ResidencyImpairment(Impairment):
    """A thread of this process (not the reader's) drops the table from the page cache with
    ``POSIX_FADV_DONTNEED`` every ``evict_ms``; fadvise never reads a page.  Evidence: the
    evictions done, the table mostly not resident."""

    spec = Spec("residency", "pool", "cold",
                "pool reader; the table is dropped from the page cache (POSIX_FADV_DONTNEED) every few ms")
    counters = ("evictions",)

    def __init__(self, *, evict_ms: float = DEFAULT_EVICT_MS, **_options):
        super().__init__()
        self.evict_ms = evict_ms
        self.evictions = 0
        self._fd: int | None = None
        self._sc = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def setup(self, sc: "Scenario") -> list[str]:
        self._fd = os.open(sc.table_path, os.O_RDONLY | os.O_CLOEXEC)
        host.evict(self._fd)
        self._sc = sc
        self._thread = threading.Thread(target=self._evictor, name="engramprof-evictor", daemon=True)
        self._thread.start()
        sc.say(f"evicting the table from the page cache every {self.evict_ms:g} ms "
               f"(POSIX_FADV_DONTNEED, from pid {os.getpid()})")
        return []

    def _evictor(self) -> None:
        period = self.evict_ms / 1000
        while not self._stop.wait(period):
            fd = self._fd
            if fd is None:
                return
            try:
                pid = getattr(self._sc, "pid", None) if self._sc is not None else None
                if pid and str(getattr(self._sc, "reader", "")).startswith("mmap"):
                    # a memory-mapped reader keeps mapped pages through fadvise: page them out
                    host.page_out_mappings(pid, self._sc.table_path)
                host.evict(fd)
                self.evictions += 1
            except OSError:
                return

    def stats(self) -> dict:
        return {"evictions": self.evictions}

    def info(self) -> dict:
        return {"evict_ms": self.evict_ms, **super().info()}

    def halt(self) -> None:
        self._stop.set()

    def teardown(self, sc: "Scenario") -> tuple[list[str], list[str]]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)
        return super().teardown(sc)


class ReclaimImpairment(Impairment):
    """The reader in a memory cgroup (v1 ``memory.limit_in_bytes``, v2 ``memory.max``) limited
    to its own non-file memory plus ``memory_mib`` of page cache, far below the table's working
    set.  The reader joins the group before it runs any code of its own; the limit is set when
    it prints its pid (imports done, no row read).  Evidence: the limit hit (failcnt /
    max events), file refaults, the table's residency held near the budget, no OOM kill."""

    spec = Spec("reclaim", "pool", "cold",
                "pool reader in a memory cgroup limited far below the table's working set")
    needs_root = True
    arms_on_reader_pid = True
    counters = ("workingset_refault_file", "pgpgin", "pgpgout", "failcnt", "pgscan", "pgsteal",
                "max_events", "oom_kill")
    levels = ("table_resident", "max_usage_bytes", "limit_bytes")

    def __init__(self, *, memory_mib: float = DEFAULT_MEMORY_MIB, **_options):
        super().__init__()
        self.memory_mib = memory_mib
        self.memory_limit: int | None = None

    def setup(self, sc: "Scenario") -> list[str]:
        cg = self._make_cgroup("memory", "no memory cgroup controller (v1 memory hierarchy or cgroup2 "
                                         "with the memory controller) is mounted")
        sc.say(f"memory cgroup {cg.path} (cgroup v{cg.hier.version})")
        return [cg.procs]

    def on_reader_pid(self, sc: "Scenario") -> None:
        """Limit the group to what the reader holds besides page cache plus the budget.
        Subtracting the group's file pages makes the limit right even if it is set late."""
        cg = self.cgroups["memory"]
        st = cg.stat()
        budget = int(self.memory_mib * 2**20)
        if cg.hier.version == 1:
            usage = int(cg.read("memory.usage_in_bytes"))
            base = max(0, usage - st.get("total_cache", st.get("cache", 0)))
            limit_file = "memory.limit_in_bytes"
        else:
            usage = int(cg.read("memory.current"))
            base = max(0, usage - st.get("file", 0))
            limit_file = "memory.max"
        self.memory_limit = base + budget
        cg.write(limit_file, str(self.memory_limit))
        sc.say(f"memory limit {self.memory_limit / 2**20:.1f} MiB = reader's own "
               f"{base / 2**20:.1f} MiB + {self.memory_mib:g} MiB of page cache "
               f"(table {os.path.getsize(sc.table_path) / 2**20:.1f} MiB)")

    def stats(self) -> dict:
        cg = self.cgroups.get("memory")
        if cg is None or not os.path.isdir(cg.path):
            return {}
        return self._stats_v1(cg) if cg.hier.version == 1 else self._stats_v2(cg)

    @staticmethod
    def _stats_v1(cg: Cgroup) -> dict:
        st = cg.stat()
        keys = ("workingset_refault_file", "pgpgin", "pgpgout", "cache", "rss")
        d = {k: st.get(f"total_{k}", st.get(k)) for k in keys}
        for f, k in (("memory.failcnt", "failcnt"), ("memory.usage_in_bytes", "usage_bytes"),
                     ("memory.max_usage_in_bytes", "max_usage_bytes"),
                     ("memory.limit_in_bytes", "limit_bytes")):
            try:
                d[k] = int(cg.read(f))
            except (OSError, ValueError):
                pass
        try:
            for line in cg.read("memory.oom_control").splitlines():
                k, _, v = line.partition(" ")
                if k == "oom_kill":
                    d["oom_kill"] = int(v)
        except OSError:
            pass
        return d

    @staticmethod
    def _stats_v2(cg: Cgroup) -> dict:
        st = cg.stat()
        keys = ("workingset_refault_file", "pgscan", "pgsteal", "pgmajfault", "file", "anon")
        d = {k: st.get(k) for k in keys}
        try:
            ev = dict(line.split() for line in cg.read("memory.events").splitlines())
            d["max_events"] = int(ev.get("max", 0))
            d["oom_kill"] = int(ev.get("oom_kill", 0))
            d["usage_bytes"] = int(cg.read("memory.current"))
        except (OSError, ValueError):
            pass
        return d

    def info(self) -> dict:
        d = super().info()
        if self.memory_limit is not None:
            d["memory_limit_bytes"] = self.memory_limit
        return d

    def failure_hint(self, stats_at_end: dict) -> str:
        oom = stats_at_end.get("oom_kill")
        if oom:
            return f" (the memory cgroup OOM-killed it {oom} time(s); raise the page-cache budget memory_mib)"
        return ""


class LoopFilesystem:
    """An ext4 filesystem on a loop device (``--direct-io=on``, so the backing file's own cache
    cannot serve reads), mounted under a workdir; :meth:`remove` unmounts and detaches it."""

    def __init__(self):
        self.dev: str | None = None
        self.devno: str | None = None  # "MAJ:MIN"
        self.dio: bool | None = None
        self.mountpoint: str | None = None

    def create(self, workdir: str, size: int) -> None:
        img = os.path.join(workdir, "disk.img")
        size -= size % (1 << 20)
        with open(img, "wb") as f:
            f.truncate(size)
        dev = host.run_tool(["losetup", "-f", "--show", "--direct-io=on", img], "attach loop device").strip()
        if not dev.startswith("/dev/loop"):
            raise ScenarioError(f"losetup printed {dev!r}, not a loop device")
        self.dev = dev
        st = os.stat(dev)
        self.devno = f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}"
        try:
            self.dio = host.read_text(f"/sys/block/{os.path.basename(dev)}/loop/dio").strip() == "1"
        except OSError:
            self.dio = None
        host.run_tool(["mkfs.ext4", "-q", "-F", "-m", "0", "-E", "lazy_itable_init=0,lazy_journal_init=0",
                       dev], "mkfs.ext4")
        mp = os.path.join(workdir, "mnt")
        os.mkdir(mp)
        host.run_tool(["mount", "-t", "ext4", "-o", "noatime,nosuid,nodev", dev, mp], "mount")
        self.mountpoint = mp

    def describe(self) -> str:
        dio = "on" if self.dio else "off" if self.dio is False else "?"
        return f"loop device {self.dev} ({self.devno}, direct-io {dio}) ext4 mounted at {self.mountpoint}"

    def remove(self) -> tuple[list[str], list[str]]:
        done, problems = [], []
        if self.mountpoint:
            try:
                host.umount(self.mountpoint)
                done.append(f"mount {self.mountpoint}")
            except ScenarioError as exc:
                problems.append(str(exc))
        if self.dev:
            try:
                host.detach_loop(self.dev)
                done.append(f"loop device {self.dev}")
            except ScenarioError as exc:
                problems.append(str(exc))
        return done, problems


class StorageImpairment(Impairment):
    """The table on a :class:`LoopFilesystem` whose reads are throttled to ``iops`` per second
    for the reader's blkio cgroup (v1 ``blkio.throttle.read_iops_device``, v2 ``io.max``
    ``riops``); the table is evicted before the run.  Evidence: the throttled reads the group
    was serviced (the throttle holds bios before they become requests, so device time alone
    does not show it)."""

    spec = Spec("storage", "pool", "cold",
                "pool reader; table on a loop-device ext4 whose reads are throttled (blkio IOPS limit)")
    needs_root = True
    counters = ("throttled_reads",)

    def __init__(self, *, iops: int = DEFAULT_IOPS, **_options):
        super().__init__()
        self.iops = iops
        self.loop = LoopFilesystem()

    @property
    def table_must_be_droppable(self) -> bool:
        return False  # the table lives on the loop filesystem, not in the workdir

    def place_table(self, sc: "Scenario") -> None:
        if sc.user_table is not None:
            sc.use_table(sc.user_table)
            need = os.path.getsize(sc.user_table)
        else:
            need = table_mod.data_bytes(sc.rows, table_mod.DEFAULT_DIM, table_mod.DEFAULT_LAYERS) + 4096
        self.loop.create(sc.workdir, need + need // 8 + (32 << 20))
        if self.loop.dio is False:
            sc.say(f"warning: {self.loop.dev} runs without direct I/O: reads may be served from the "
                   "backing file's page cache")
        path = os.path.join(self.loop.mountpoint, "engram.safetensors")
        if sc.user_table is not None:
            t0 = time.monotonic()
            shutil.copyfile(sc.user_table, path)
            sc.say(f"copied {sc.user_table} into the loop filesystem in {time.monotonic() - t0:.2f} s")
            sc.table_path = path
        else:
            sc.make_table(path)
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
            host.evict(fd)
        finally:
            os.close(fd)
        sc.say(self.loop.describe())

    def setup(self, sc: "Scenario") -> list[str]:
        cg = self._make_cgroup("blkio", "no blkio/io cgroup controller is mounted")
        if cg.hier.version == 1:
            cg.write("blkio.throttle.read_iops_device", f"{self.loop.devno} {self.iops}")
        else:
            cg.write("io.max", f"{self.loop.devno} riops={self.iops}")
        sc.say(f"blkio cgroup {cg.path} (cgroup v{cg.hier.version}): reads of {self.loop.dev} "
               f"({self.loop.devno}) limited to {self.iops} IOPS")
        return [cg.procs]

    def stats(self) -> dict:
        cg = self.cgroups.get("blkio")
        if cg is None or not os.path.isdir(cg.path) or not self.loop.devno:
            return {}
        d = {}
        try:
            if cg.hier.version == 1:
                for line in cg.read("blkio.throttle.io_serviced").splitlines():
                    p = line.split()
                    if len(p) == 3 and p[0] == self.loop.devno and p[1] == "Read":
                        d["throttled_reads"] = int(p[2])
            else:
                for line in cg.read("io.stat").splitlines():
                    p = line.split()
                    if p and p[0] == self.loop.devno:
                        kv = dict(x.split("=", 1) for x in p[1:])
                        d["throttled_reads"] = int(kv.get("rios", 0))
        except (OSError, ValueError):
            pass
        return d

    def info(self) -> dict:
        d = super().info()
        if self.loop.dev:
            d.update(loop_device=self.loop.dev, loop_devno=self.loop.devno, loop_dio=self.loop.dio,
                     mount=self.loop.mountpoint, read_iops=self.iops)
        return d

    def teardown(self, sc: "Scenario") -> tuple[list[str], list[str]]:
        done, problems = super().teardown(sc)  # the cgroup first: nothing reads the device then
        d2, p2 = self.loop.remove()
        return done + d2, problems + p2
