"""Fault-injection scenarios: the lab reader run under one real cause at a time.

Each scenario makes (or reuses) an Engram table, sets up one real kernel-level fault, starts
the lab reader (``python -m engramprof lab run ...``) as a child process with its own pid,
and removes everything it made when it ends::

    from engramprof.lab.scenarios import Scenario

    with Scenario("reclaim", duration=10) as sc:   # set-up happens on enter
        attach_tracer(sc.pid)                      # the reader's pid
        summary = sc.wait()                        # the lab's own JSON summary
        markers = sc.markers_path                  # ground-truth batch markers (JSON lines)
    # cgroups, loop device, mount, temporary table and directory are gone here

The scenarios (see ``SCENARIOS``):

- ``python-scheduling``: the 32-thread pool reader on a fully cached (warm) table.
- ``healthy``: the RWF_NOWAIT-first reader on a fully cached table.
- ``residency``: pool reader, cold table, and a side thread in *this* process (not the
  reader's) that drops the table from the page cache with ``POSIX_FADV_DONTNEED`` every
  ``evict_ms`` (default 20 ms); fadvise never reads a page.
- ``reclaim``: pool reader inside a memory cgroup (v1: ``memory.limit_in_bytes``; v2:
  ``memory.max``) limited to the reader's own non-file memory plus ``memory_mib`` (default
  16 MiB) of page cache, far below the table's working set: rows are reclaimed and refault.
  The reader joins the group before it runs any code of its own (an exec wrapper writes its
  pid to ``cgroup.procs`` and then execs the reader, so the pid does not change) and the
  table is evicted inside the group first, so its page cache is charged to the group.
- ``storage``: the table on an ext4 filesystem on a loop device (``--direct-io=on``, so the
  backing file's own cache cannot serve reads) whose reads are throttled to ``iops`` per
  second for the reader's blkio cgroup (v1 ``blkio.throttle.read_iops_device``; v2 ``io.max``
  ``riops``); the table is evicted before the run.

Names of what a scenario makes, so leftovers of a killed scenario can be recognised and
removed (:func:`cleanup_stale`, run at every start; only for scenario processes that are
gone): cgroups ``engramprof-<scenario>-<pid>[-n]`` directly under each controller's
hierarchy, and a private directory ``engramprof-scenario-<pid>-*`` (table, loop image, mount
point ``mnt``).  ``<pid>`` is the scenario process, not the reader.
"""
from __future__ import annotations

import atexit
import errno
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from engramprof.errors import UserError

DEFAULT_ROWS = 1 << 18  # 2 layers x 262144 rows x 264 bytes = 132 MiB
DEFAULT_DURATION = 30.0
DEFAULT_GAP_MS = 10.0
DEFAULT_EVICT_MS = 20.0
DEFAULT_MEMORY_MIB = 16.0
DEFAULT_IOPS = 400
READY_TIMEOUT = 120.0
STOP_TIMEOUT = 15.0
KEEP_RUNNING_S = 10 * 365 * 86400.0  # "until stopped"
CGROUP_PREFIX = "engramprof-"
WORKDIR_PREFIX = "engramprof-scenario-"
_CG_RE = re.compile(r"^engramprof-(python-scheduling|healthy|residency|reclaim|storage)-(\d+)(?:-\d+)?$")
_WD_RE = re.compile(r"^engramprof-scenario-(\d+)-")
_PKG_ROOT = str(Path(__file__).resolve().parents[2])
PR_SET_PDEATHSIG = 1
_TMPFS_TYPES = {"tmpfs", "ramfs", "shm", "devtmpfs"}


class ScenarioError(UserError):
    """A scenario could not be set up, or its reader failed (exit code 1: environment)."""

    def __init__(self, message: str):
        super().__init__(message, 1)


@dataclass(frozen=True)
class Spec:
    name: str
    reader: str
    cache: str  # "warm" | "cold": what the reader does to the table before it starts
    summary: str


SCENARIOS: dict[str, Spec] = {s.name: s for s in (
    Spec("python-scheduling", "pool", "warm",
         "32-thread pool reader, fully cached table: the time goes to futures, wakeups and the GIL"),
    Spec("healthy", "nowait", "warm",
         "RWF_NOWAIT-first reader, fully cached table: nothing holds the batches back"),
    Spec("residency", "pool", "cold",
         "pool reader; the table is dropped from the page cache (POSIX_FADV_DONTNEED) every few ms"),
    Spec("reclaim", "pool", "cold",
         "pool reader in a memory cgroup limited far below the table's working set"),
    Spec("storage", "pool", "cold",
         "pool reader; table on a loop-device ext4 whose reads are throttled (blkio IOPS limit)"),
)}


# --------------------------------------------------------------------------- small helpers


def _run(cmd: list[str], what: str, timeout: float = 120) -> str:
    try:
        p = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                           timeout=timeout)
    except FileNotFoundError:
        raise ScenarioError(f"{what}: {cmd[0]} not found (install util-linux / e2fsprogs)") from None
    except subprocess.TimeoutExpired:
        raise ScenarioError(f"{what}: {' '.join(cmd)} timed out after {timeout:.0f} s") from None
    if p.returncode != 0:
        msg = (p.stderr or p.stdout).strip().splitlines()
        raise ScenarioError(f"{what}: {' '.join(cmd)} failed: {msg[-1] if msg else p.returncode}")
    return p.stdout


def _write(path: str | Path, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _read(path: str | Path) -> str:
    with open(path) as f:
        return f.read()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _unescape(s: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), s)


def mounts() -> list[dict]:
    """/proc/self/mountinfo as dicts: mountpoint, fstype, source, options, super_options."""
    out = []
    try:
        text = _read("/proc/self/mountinfo")
    except OSError:
        return out
    for line in text.splitlines():
        left, _, right = line.partition(" - ")
        a, b = left.split(), right.split()
        if len(a) < 6 or len(b) < 3:
            continue
        out.append({"mountpoint": _unescape(a[4]), "options": a[5], "fstype": b[0],
                    "source": _unescape(b[1]), "super_options": b[2]})
    return out


def fs_type(path: str | os.PathLike) -> str:
    """The filesystem type holding ``path`` (longest mount-point prefix in mountinfo)."""
    p = os.path.realpath(path)
    best, kind = "", "?"
    for m in mounts():
        mp = m["mountpoint"]
        if (p == mp or p.startswith(mp.rstrip("/") + "/")) and len(mp) >= len(best):
            best, kind = mp, m["fstype"]
    return kind


def default_tmp_parent() -> str:
    """A disk-backed directory for tables (the page cache of tmpfs cannot be dropped)."""
    env = os.environ.get("ENGRAMPROF_SCENARIO_DIR")
    if env:
        return env
    for cand in ("/var/tmp", tempfile.gettempdir(), os.getcwd()):
        if os.path.isdir(cand) and os.access(cand, os.W_OK) and fs_type(cand) not in _TMPFS_TYPES:
            return cand
    return "/var/tmp"


# --------------------------------------------------------------------------- cgroups


@dataclass
class Hierarchy:
    """Where a controller lives: a v1 hierarchy mounted with it, or the v2 unified one."""

    controller: str  # "memory" | "blkio" (v1) / "io" (v2)
    root: str
    version: int


def find_hierarchy(controller: str) -> Hierarchy | None:
    """The v1 hierarchy with ``controller`` ("memory" or "blkio"), else cgroup2 if the
    controller ("memory" or "io") is available there; None when neither."""
    ms = mounts()
    for m in ms:
        if m["fstype"] == "cgroup" and controller in m["super_options"].split(","):
            return Hierarchy(controller, m["mountpoint"], 1)
    v2name = "io" if controller == "blkio" else controller
    for m in ms:
        if m["fstype"] == "cgroup2":
            try:
                ctrls = _read(os.path.join(m["mountpoint"], "cgroup.controllers")).split()
            except OSError:
                continue
            if v2name in ctrls:
                return Hierarchy(v2name, m["mountpoint"], 2)
    return None


class Cgroup:
    """One cgroup directory made by a scenario, removed by :meth:`remove`."""

    def __init__(self, hier: Hierarchy, scenario: str):
        self.hier = hier
        base = f"{CGROUP_PREFIX}{scenario}-{os.getpid()}"
        for n in range(1, 100):
            name = base if n == 1 else f"{base}-{n}"
            path = os.path.join(hier.root, name)
            try:
                os.mkdir(path)
            except FileExistsError:
                continue
            except OSError as exc:
                raise ScenarioError(f"cannot create cgroup {path}: {exc.strerror} (needs root)") from None
            self.path = path
            break
        else:
            raise ScenarioError(f"cannot find a free cgroup name {base}-N in {hier.root}")
        if hier.version == 2:
            ctl = _read(os.path.join(hier.root, "cgroup.subtree_control")).split()
            if hier.controller not in ctl:
                self.remove()
                raise ScenarioError(
                    f"the {hier.controller} controller is not enabled for children of {hier.root} "
                    f"(echo +{hier.controller} > {hier.root}/cgroup.subtree_control)")

    @property
    def procs(self) -> str:
        return os.path.join(self.path, "cgroup.procs")

    def file(self, name: str) -> str:
        return os.path.join(self.path, name)

    def read(self, name: str) -> str:
        return _read(self.file(name))

    def write(self, name: str, value: str) -> None:
        try:
            _write(self.file(name), value)
        except OSError as exc:
            raise ScenarioError(f"cannot write {value!r} to {self.file(name)}: {exc.strerror}") from None

    def pids(self) -> list[int]:
        try:
            return [int(x) for x in self.read("cgroup.procs").split()]
        except OSError:
            return []

    def stat(self) -> dict[str, int]:
        out = {}
        try:
            for line in self.read("memory.stat").splitlines():
                k, _, v = line.partition(" ")
                if v.strip().lstrip("-").isdigit():
                    out[k] = int(v)
        except OSError:
            pass
        return out

    def remove(self, timeout: float = 5.0) -> None:
        if not os.path.isdir(self.path):
            return
        deadline = time.monotonic() + timeout
        while True:
            try:
                os.rmdir(self.path)
                return
            except FileNotFoundError:
                return
            except OSError as exc:
                if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                    raise ScenarioError(f"cannot remove cgroup {self.path}: {exc.strerror} "
                                        f"(processes still in it: {self.pids()})") from None
                for pid in self.pids():  # only processes this scenario put there
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except OSError:
                        pass
                time.sleep(0.05)


# --------------------------------------------------------------------------- loop device


def loop_devices() -> dict[str, str]:
    """Attached loop devices: /dev/loopN -> backing file (from sysfs)."""
    out = {}
    for d in Path("/sys/block").glob("loop*"):
        try:
            out[f"/dev/{d.name}"] = (d / "loop" / "backing_file").read_text().strip()
        except OSError:
            continue
    return out


def _detach_loop(dev: str) -> None:
    for _ in range(50):
        try:
            _run(["losetup", "-d", dev], "detach loop device", timeout=30)
        except ScenarioError:
            if dev not in loop_devices():
                return
            time.sleep(0.1)
            continue
        return
    if dev in loop_devices():
        raise ScenarioError(f"cannot detach {dev}")


def _umount(mp: str) -> None:
    for _ in range(50):
        if not any(m["mountpoint"] == mp for m in mounts()):
            return
        try:
            _run(["umount", mp], "unmount", timeout=30)
            return
        except ScenarioError:
            time.sleep(0.1)
    _run(["umount", "-l", mp], "unmount (lazy)", timeout=30)


# --------------------------------------------------------------------------- stale leftovers


def cleanup_stale() -> list[str]:
    """Remove what scenarios whose process is gone left behind (a SIGKILLed scenario):
    mounts and loop devices under ``engramprof-scenario-<pid>-*`` directories, those
    directories, and ``engramprof-<scenario>-<pid>`` cgroups with no processes.  Items of
    live scenario processes are never touched.  Returns what was removed."""
    removed: list[str] = []
    parent = default_tmp_parent()

    def dead(component: str) -> bool:  # a workdir name of a scenario process that is gone
        m = _WD_RE.match(component)
        return bool(m) and int(m.group(1)) != os.getpid() and not _pid_alive(int(m.group(1)))

    for m in mounts():
        mp = m["mountpoint"]
        if os.path.basename(mp) == "mnt" and dead(os.path.basename(os.path.dirname(mp))):
            try:
                _umount(mp)
                removed.append(f"mount {mp}")
            except ScenarioError:
                pass
    for dev, backing in loop_devices().items():
        if any(dead(part) for part in backing.split("/")):
            try:
                _detach_loop(dev)
                removed.append(f"loop {dev}")
            except ScenarioError:
                pass
    mounted = {m["mountpoint"] for m in mounts()}
    try:
        entries = os.listdir(parent)
    except OSError:
        entries = []
    for e in entries:
        path = os.path.join(parent, e)
        if dead(e) and os.path.isdir(path) \
                and not any(mp == path or mp.startswith(path + "/") for mp in mounted):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(f"dir {path}")
    for ctl in ("memory", "blkio"):
        h = find_hierarchy(ctl)
        if h is None:
            continue
        try:
            names = os.listdir(h.root)
        except OSError:
            continue
        for e in names:
            m = _CG_RE.match(e)
            if not m or int(m.group(2)) == os.getpid() or _pid_alive(int(m.group(2))):
                continue
            path = os.path.join(h.root, e)
            try:
                if _read(os.path.join(path, "cgroup.procs")).split():
                    continue
                os.rmdir(path)
                removed.append(f"cgroup {path}")
            except OSError:
                pass
    return removed


# --------------------------------------------------------------------------- the child

# Runs in the child between fork and the reader: (optionally) die with the parent, join the
# cgroups, then exec the reader -- the pid stays the same, and no reader code runs outside
# the groups.  argv: ppid pdeathsig n_procs procs... cmd...
_WRAPPER = r"""
import ctypes, os, sys
ppid, sig, n = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
procs, cmd = sys.argv[4:4 + n], sys.argv[4 + n:]
if sig:
    ctypes.CDLL(None).prctl(1, sig, 0, 0, 0)
    if os.getppid() != ppid:
        os._exit(1)
for p in procs:
    with open(p, "w") as f:
        f.write(str(os.getpid()))
os.execv(cmd[0], cmd)
"""


def residency_fraction(path: str | os.PathLike) -> float | None:
    """Share of the file's pages in the page cache now (cachestat, else mincore; no reads)."""
    try:
        from engramprof import residency

        return round(residency.file_residency(path).residency.fraction, 4)
    except Exception:
        return None


def _evict(fd: int) -> None:
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)


# --------------------------------------------------------------------------- Scenario


class Scenario:
    """Set up one scenario, run the lab reader under it, tear everything down.

    ``start()`` (or entering the ``with`` block) makes the table and the fault, starts the
    reader and returns once the reader is ready (its ``lab: ready``) and the fault is in
    place; ``pid`` is then the reader's pid.  ``wait()`` returns the reader's own JSON summary
    (``engramprof lab run --json``).  ``stop()`` asks the reader to finish its current batch
    and exit.  ``close()`` (the end of the ``with`` block, an exception, Ctrl-C, SIGTERM when
    started from the main thread, interpreter exit) stops the reader and removes every
    cgroup, mount, loop device, temporary table and directory the scenario made.

    ``log`` receives progress lines (``scenario: ...``) and the reader's stderr lines; None
    keeps quiet (they are still collected in ``lines``).
    """

    def __init__(
        self,
        name: str,
        *,
        steps: int | None = None,
        duration: float | None = None,
        tokens: int = 4,
        gap_ms: float = DEFAULT_GAP_MS,
        rows: int | None = None,
        table: str | os.PathLike | None = None,
        markers: str | os.PathLike | None = None,
        keep_markers: bool = False,
        start_delay: float = 0.0,
        keep_running: bool = False,
        reader: str | None = None,
        threads: int = 32,
        seed: int = 0,
        evict_ms: float = DEFAULT_EVICT_MS,
        memory_mib: float = DEFAULT_MEMORY_MIB,
        iops: int = DEFAULT_IOPS,
        tmp_parent: str | os.PathLike | None = None,
        python: str | None = None,
        log: Callable[[str], None] | None = None,
        ready_timeout: float = READY_TIMEOUT,
    ):
        if name not in SCENARIOS:
            raise UserError(f"unknown scenario {name!r}; choose one of {', '.join(SCENARIOS)}")
        if keep_running and (steps is not None or duration is not None):
            raise UserError("--keep-running runs until stopped: do not combine it with --steps/--duration")
        if steps is not None and duration is not None:
            raise UserError("give --steps or --duration, not both")
        for label, v in (("--steps", steps), ("--duration", duration), ("--gap-ms", gap_ms),
                         ("--start-delay", start_delay)):
            if v is not None and v < 0:
                raise UserError(f"{label} must be >= 0")
        if tokens < 1:
            raise UserError("--tokens must be at least 1")
        if rows is not None and table is not None:
            raise UserError("--rows makes a new table; it cannot be combined with --table")
        if rows is not None and rows < 1:
            raise UserError("--rows must be at least 1")
        if evict_ms <= 0 or memory_mib <= 0 or iops < 1:
            raise UserError("--evict-ms, --memory-mib and --iops must be positive")
        self.spec = SCENARIOS[name]
        self.name = name
        self.reader = reader or self.spec.reader
        if steps is None and duration is None and not keep_running:
            duration = DEFAULT_DURATION
        self.steps, self.duration, self.keep_running = steps, duration, keep_running
        self.tokens, self.gap_ms, self.seed, self.threads = tokens, gap_ms, seed, threads
        self.rows = rows if rows is not None else DEFAULT_ROWS
        self.user_table = os.path.realpath(table) if table is not None else None
        self.markers_arg = os.fspath(markers) if markers is not None else None
        self.keep_markers = keep_markers or markers is not None
        self.start_delay = start_delay
        self.evict_ms, self.memory_mib, self.iops = evict_ms, memory_mib, iops
        self.tmp_parent = os.fspath(tmp_parent) if tmp_parent is not None else None
        self.python = python or sys.executable
        self.log = log
        self.ready_timeout = ready_timeout

        self.pid: int | None = None
        self.table_path: str | None = None
        self.markers_path: str | None = None
        self.workdir: str | None = None
        self.markers_dir: str | None = None  # kept private dir of default markers (CLI)
        self.mountpoint: str | None = None
        self.loop_dev: str | None = None
        self.loop_devno: str | None = None
        self.loop_dio: bool | None = None
        self.cgroups: dict[str, Cgroup] = {}
        self.memory_limit: int | None = None
        self.info: dict = {}
        self.lines: list[str] = []  # scenario log + reader stderr, in order
        self.summary: dict | None = None
        self.returncode: int | None = None
        self.evictions = 0
        self.stats_at_ready: dict = {}
        self.stats_at_end: dict = {}

        self._proc: subprocess.Popen | None = None
        self._child_ready = threading.Event()
        self._limit_set = threading.Event()
        self._stdout: list[str] = []
        self._threads: list[threading.Thread] = []
        self._stop_evict = threading.Event()
        self._evict_fd: int | None = None
        self._lock = threading.RLock()
        self._started = self._closed = False
        self._stop_requested = False
        self._old_handlers: dict = {}
        self._post_ready_error: BaseException | None = None

    # ------------------------------------------------------------------ logging

    def _say(self, text: str) -> None:
        line = f"scenario: {text}"
        self.lines.append(line)
        if self.log:
            self.log(line)

    def _relay(self, line: str) -> None:
        self.lines.append(line)
        if self.log:
            self.log(line)

    # ------------------------------------------------------------------ context manager

    def __enter__(self) -> "Scenario":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ set-up

    def start(self) -> "Scenario":
        with self._lock:
            if self._started:
                raise RuntimeError("Scenario already started")
            self._started = True
        if os.geteuid() != 0 and self.name in ("reclaim", "storage"):
            raise ScenarioError(f"scenario {self.name} needs root (cgroups, loop devices, mounts)")
        atexit.register(self.close)
        self._install_signal_handlers()
        try:
            self._setup()
        except BaseException:
            self.close()
            raise
        return self

    def _install_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return

        def on_term(signum, frame):
            raise SystemExit(128 + signum)

        for sig in (signal.SIGTERM, signal.SIGHUP):
            try:
                if signal.getsignal(sig) in (signal.SIG_DFL, None):
                    self._old_handlers[sig] = signal.signal(sig, on_term)
            except (ValueError, OSError):
                pass

    def _setup(self) -> None:
        stale = cleanup_stale()
        for item in stale:
            self._say(f"removed a leftover of a dead scenario: {item}")
        self._say(f"{self.name}: {self.spec.summary}")
        parent = self.tmp_parent or default_tmp_parent()
        self.workdir = tempfile.mkdtemp(prefix=f"{WORKDIR_PREFIX}{os.getpid()}-", dir=parent)
        needs_evict = self.spec.cache == "cold"
        if needs_evict and self.name != "storage" and fs_type(self.user_table or self.workdir) in _TMPFS_TYPES:
            raise ScenarioError(f"{self.user_table or self.workdir} is on tmpfs, whose pages cannot "
                                "be dropped from memory; use a disk-backed directory "
                                "(ENGRAMPROF_SCENARIO_DIR)")
        # markers
        if self.markers_arg is not None:
            self.markers_path = os.path.abspath(self.markers_arg)
            d = os.path.dirname(self.markers_path)
            if not os.path.isdir(d) or not os.access(d, os.W_OK):
                raise UserError(f"--markers {self.markers_arg}: {d} is not a writable directory")
            if os.path.lexists(self.markers_path) and not os.path.isfile(self.markers_path):
                raise UserError(f"--markers {self.markers_arg}: exists and is not a regular file")
        elif self.keep_markers:
            self.markers_dir = tempfile.mkdtemp(prefix="engramprof-markers-", dir=parent)
            self.markers_path = os.path.join(self.markers_dir, f"{self.name}.jsonl")
        else:
            self.markers_path = os.path.join(self.workdir, "markers.jsonl")
        # table (+ loop device for storage)
        if self.name == "storage":
            self._setup_loop()
        elif self.user_table is not None:
            self._use_table(self.user_table)
        else:
            self._make_table(os.path.join(self.workdir, "engram.safetensors"))
        self._say(f"table {self.table_path} ({os.path.getsize(self.table_path) / 2**20:.1f} MiB)")
        self._say(f"markers {self.markers_path}")
        # the fault
        procs: list[str] = []
        if self.name == "reclaim":
            h = find_hierarchy("memory")
            if h is None:
                raise ScenarioError("no memory cgroup controller (v1 memory hierarchy or cgroup2 "
                                    "with the memory controller) is mounted")
            cg = self.cgroups["memory"] = Cgroup(h, self.name)
            procs.append(cg.procs)
            self._say(f"memory cgroup {cg.path} (cgroup v{h.version})")
        elif self.name == "storage":
            h = find_hierarchy("blkio")
            if h is None:
                raise ScenarioError("no blkio/io cgroup controller is mounted")
            cg = self.cgroups["blkio"] = Cgroup(h, self.name)
            if h.version == 1:
                cg.write("blkio.throttle.read_iops_device", f"{self.loop_devno} {self.iops}")
            else:
                cg.write("io.max", f"{self.loop_devno} riops={self.iops}")
            procs.append(cg.procs)
            self._say(f"blkio cgroup {cg.path} (cgroup v{h.version}): reads of {self.loop_dev} "
                      f"({self.loop_devno}) limited to {self.iops} IOPS")
        elif self.name == "residency":
            self._evict_fd = os.open(self.table_path, os.O_RDONLY | os.O_CLOEXEC)
            _evict(self._evict_fd)
            t = threading.Thread(target=self._evictor, name="engramprof-evictor", daemon=True)
            t.start()
            self._threads.append(t)
            self._say(f"evicting the table from the page cache every {self.evict_ms:g} ms "
                      f"(POSIX_FADV_DONTNEED, from pid {os.getpid()})")
        if self.name not in ("reclaim",):
            self._limit_set.set()
        self._start_child(procs)
        self._wait_ready()

    def _make_table(self, path: str) -> None:
        from engramprof.lab import table

        t0 = time.monotonic()
        table.make_table(path, self.rows, seed=self.seed)
        self.table_path = path
        self._say(f"made a {self.rows}-row table in {time.monotonic() - t0:.2f} s")

    def _use_table(self, path: str) -> None:
        from engramprof import layout

        if not os.path.isfile(path):
            raise UserError(f"--table {path}: no such file")
        layout.load(path)  # a one-line UserError if it is not a safetensors table
        self.table_path = path

    def _setup_loop(self) -> None:
        from engramprof.lab import table as table_mod

        if self.user_table is not None:
            self._use_table(self.user_table)
            need = os.path.getsize(self.user_table)
        else:
            need = table_mod.data_bytes(self.rows, table_mod.DEFAULT_DIM, table_mod.DEFAULT_LAYERS) + 4096
        img = os.path.join(self.workdir, "disk.img")
        size = need + need // 8 + (32 << 20)
        size -= size % (1 << 20)
        with open(img, "wb") as f:
            f.truncate(size)
        dev = _run(["losetup", "-f", "--show", "--direct-io=on", img], "attach loop device").strip()
        if not dev.startswith("/dev/loop"):
            raise ScenarioError(f"losetup printed {dev!r}, not a loop device")
        self.loop_dev = dev
        st = os.stat(dev)
        self.loop_devno = f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}"
        try:
            self.loop_dio = _read(f"/sys/block/{os.path.basename(dev)}/loop/dio").strip() == "1"
        except OSError:
            self.loop_dio = None
        if self.loop_dio is False:
            self._say(f"warning: {dev} runs without direct I/O: reads may be served from the "
                      "backing file's page cache")
        _run(["mkfs.ext4", "-q", "-F", "-m", "0", "-E", "lazy_itable_init=0,lazy_journal_init=0",
              dev], "mkfs.ext4")
        mp = os.path.join(self.workdir, "mnt")
        os.mkdir(mp)
        _run(["mount", "-t", "ext4", "-o", "noatime,nosuid,nodev", dev, mp], "mount")
        self.mountpoint = mp
        path = os.path.join(mp, "engram.safetensors")
        if self.user_table is not None:
            t0 = time.monotonic()
            shutil.copyfile(self.user_table, path)
            self._say(f"copied {self.user_table} into the loop filesystem in "
                      f"{time.monotonic() - t0:.2f} s")
            self.table_path = path
        else:
            self._make_table(path)
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
            _evict(fd)
        finally:
            os.close(fd)
        self._say(f"loop device {dev} ({self.loop_devno}, direct-io "
                  f"{'on' if self.loop_dio else 'off' if self.loop_dio is False else '?'}) "
                  f"ext4 mounted at {mp}")

    def _child_cmd(self, procs: list[str], pdeath: int) -> list[str]:
        cmd = [self.python, "-m", "engramprof", "lab", "run", "--table", self.table_path,
               "--reader", self.reader, "--json", "--markers", self.markers_path,
               "--tokens", str(self.tokens), "--gap-ms", f"{self.gap_ms:g}", "--seed", str(self.seed),
               "--threads", str(self.threads), "--start-delay", f"{self.start_delay:g}",
               "--warm" if self.spec.cache == "warm" else "--cold"]
        if self.steps is not None:
            cmd += ["--steps", str(self.steps)]
        else:
            cmd += ["--duration", f"{self.duration if self.duration is not None else KEEP_RUNNING_S:g}"]
        return [self.python, "-c", _WRAPPER, str(os.getpid()), str(pdeath), str(len(procs)),
                *procs, *cmd]

    def _start_child(self, procs: list[str]) -> None:
        # die with this process (not with a thread that may end first)
        pdeath = int(signal.SIGKILL) if threading.current_thread() is threading.main_thread() else 0
        env = dict(os.environ)
        env["PYTHONPATH"] = _PKG_ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env["PYTHONUNBUFFERED"] = "1"
        self._proc = subprocess.Popen(
            self._child_cmd(procs, pdeath), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, env=env, close_fds=True)
        self.pid = self._proc.pid
        for target, name in ((self._read_stderr, "stderr"), (self._read_stdout, "stdout")):
            t = threading.Thread(target=target, name=f"engramprof-scenario-{name}", daemon=True)
            t.start()
            self._threads.append(t)
        self._say(f"pid {self.pid}")

    def _read_stderr(self) -> None:
        assert self._proc is not None and self._proc.stderr is not None
        for raw in self._proc.stderr:
            line = raw.rstrip("\n")
            if line.startswith("lab: pid ") and self.name == "reclaim":
                self._set_memory_limit()
            if line.strip() == "lab: ready":
                self._child_ready.set()
                self._limit_set.wait(30)
            self._relay(line)

    def _read_stdout(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for raw in self._proc.stdout:
            self._stdout.append(raw)

    def _set_memory_limit(self) -> None:
        """Limit the group to what the reader holds besides page cache plus the budget.

        Runs when the reader prints its pid: its imports are done and it has not read a row.
        Subtracting the group's file pages makes the limit right even if it is set late."""
        try:
            cg = self.cgroups["memory"]
            st = cg.stat()
            budget = int(self.memory_mib * 2**20)
            if cg.hier.version == 1:
                usage = int(cg.read("memory.usage_in_bytes"))
                base = max(0, usage - st.get("total_cache", st.get("cache", 0)))
                self.memory_limit = base + budget
                cg.write("memory.limit_in_bytes", str(self.memory_limit))
            else:
                usage = int(cg.read("memory.current"))
                base = max(0, usage - st.get("file", 0))
                self.memory_limit = base + budget
                cg.write("memory.max", str(self.memory_limit))
            self._say(f"memory limit {self.memory_limit / 2**20:.1f} MiB = reader's own "
                      f"{base / 2**20:.1f} MiB + {self.memory_mib:g} MiB of page cache "
                      f"(table {os.path.getsize(self.table_path) / 2**20:.1f} MiB)")
        except BaseException as exc:  # reported by _wait_ready
            self._post_ready_error = exc
        finally:
            self._limit_set.set()

    def _wait_ready(self) -> None:
        assert self._proc is not None
        deadline = time.monotonic() + self.ready_timeout
        while not (self._child_ready.is_set() and self._limit_set.is_set()):
            if self._proc.poll() is not None:
                for t in self._threads:
                    if t.name.endswith(("stderr", "stdout")):
                        t.join(2)
                raise ScenarioError(f"the reader exited ({self._proc.returncode}) before it was "
                                    f"ready:\n" + "\n".join(self.lines[-8:]))
            if time.monotonic() > deadline:
                raise ScenarioError(f"the reader was not ready after {self.ready_timeout:g} s")
            self._child_ready.wait(0.05)
        if self._post_ready_error is not None:
            raise self._post_ready_error
        self.stats_at_ready = self.fault_stats()
        self.info = self._info()

    def _info(self) -> dict:
        d = {"scenario": self.name, "pid": self.pid, "reader": self.reader,
             "markers": self.markers_path, "table": self.table_path, "workdir": self.workdir,
             "cache": self.spec.cache, "tokens": self.tokens, "gap_ms": self.gap_ms,
             "steps": self.steps, "duration": self.duration, "keep_running": self.keep_running}
        if self.name == "residency":
            d["evict_ms"] = self.evict_ms
        for ctl, cg in self.cgroups.items():
            d[f"{ctl}_cgroup"] = cg.path
        if self.memory_limit is not None:
            d["memory_limit_bytes"] = self.memory_limit
        if self.loop_dev:
            d.update(loop_device=self.loop_dev, loop_devno=self.loop_devno, loop_dio=self.loop_dio,
                     mount=self.mountpoint, read_iops=self.iops)
        return d

    def _evictor(self) -> None:
        period = self.evict_ms / 1000
        while not self._stop_evict.wait(period):
            fd = self._evict_fd
            if fd is None:
                return
            try:
                _evict(fd)
                self.evictions += 1
            except OSError:
                return

    # ------------------------------------------------------------------ running

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def stop(self) -> None:
        """Ask the reader to finish its current batch and exit (SIGTERM); wait() then returns."""
        self._stop_requested = True
        if self.alive:
            try:
                self._proc.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass

    def wait(self, timeout: float | None = None) -> dict:
        """Wait for the reader to exit; returns its summary (``lab run --json``).

        Raises ``subprocess.TimeoutExpired`` on timeout and ScenarioError if the reader
        failed.  The fault's evidence at the end is left in ``stats_at_end``."""
        if self._proc is None:
            raise RuntimeError("Scenario not started")
        self._proc.wait(timeout)
        return self._finish()

    def _finish(self) -> dict:
        assert self._proc is not None
        for t in self._threads:
            if t.name.endswith(("stderr", "stdout")):
                t.join(5)
        if self.returncode is None:
            self.returncode = self._proc.returncode
            self.stats_at_end = self.fault_stats()
        if self.summary is None:
            for line in reversed(self._stdout):
                if line.strip().startswith("{"):
                    try:
                        self.summary = json.loads(line)
                    except ValueError:
                        pass
                    break
        if self.returncode != 0 or self.summary is None:
            hint = ""
            if self.name == "reclaim":
                oom = self.stats_at_end.get("oom_kill")
                if oom:
                    hint = f" (the memory cgroup OOM-killed it {oom} time(s); raise --memory-mib)"
            raise ScenarioError(f"the reader (pid {self.pid}) exited with {self.returncode}{hint}:\n"
                                + "\n".join(self.lines[-8:]))
        return self.summary

    def fault_stats(self) -> dict:
        """The fault's evidence now: table residency, and per scenario the evictions done,
        the memory cgroup's counters, or the throttled device's serviced reads."""
        d: dict = {}
        if self.table_path and os.path.exists(self.table_path):
            d["table_resident"] = residency_fraction(self.table_path)
        if self.name == "residency":
            d["evictions"] = self.evictions
        cg = self.cgroups.get("memory")
        if cg is not None and os.path.isdir(cg.path):
            st = cg.stat()
            if cg.hier.version == 1:
                keys = ("workingset_refault_file", "pgpgin", "pgpgout", "cache", "rss")
                d.update({k: st.get(f"total_{k}", st.get(k)) for k in keys})
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
            else:
                keys = ("workingset_refault_file", "pgscan", "pgsteal", "pgmajfault", "file", "anon")
                d.update({k: st.get(k) for k in keys})
                try:
                    ev = dict(line.split() for line in cg.read("memory.events").splitlines())
                    d["max_events"] = int(ev.get("max", 0))
                    d["oom_kill"] = int(ev.get("oom_kill", 0))
                    d["usage_bytes"] = int(cg.read("memory.current"))
                except (OSError, ValueError):
                    pass
        cg = self.cgroups.get("blkio")
        if cg is not None and os.path.isdir(cg.path) and self.loop_devno:
            try:
                if cg.hier.version == 1:
                    for line in cg.read("blkio.throttle.io_serviced").splitlines():
                        p = line.split()
                        if len(p) == 3 and p[0] == self.loop_devno and p[1] == "Read":
                            d["throttled_reads"] = int(p[2])
                else:
                    for line in cg.read("io.stat").splitlines():
                        p = line.split()
                        if p and p[0] == self.loop_devno:
                            kv = dict(x.split("=", 1) for x in p[1:])
                            d["throttled_reads"] = int(kv.get("rios", 0))
            except (OSError, ValueError):
                pass
        return d

    def evidence(self) -> dict:
        """Counters that rise during the run: end minus ready (end: now, if still running)."""
        end = self.stats_at_end or self.fault_stats()
        out = {}
        for k in ("workingset_refault_file", "pgpgin", "pgpgout", "failcnt",
                  "pgscan", "pgsteal", "max_events", "oom_kill", "throttled_reads", "evictions"):
            if end.get(k) is not None:
                out[k] = end[k] - (self.stats_at_ready.get(k) or 0)
        for k in ("table_resident", "max_usage_bytes", "limit_bytes"):
            if end.get(k) is not None:
                out[k] = end[k]
        return out

    # ------------------------------------------------------------------ teardown

    def close(self) -> list[str]:
        """Stop the reader and remove everything the scenario made; idempotent.  Returns the
        problems met (each also logged); raises nothing."""
        with self._lock:
            if self._closed:
                return []
            self._closed = True
        problems: list[str] = []
        masked = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # finish the clean-up
                try:
                    masked[sig] = signal.signal(sig, signal.SIG_IGN)
                except (ValueError, OSError):
                    pass
        try:
            self._stop_evict.set()
            if self._proc is not None:
                if self._proc.poll() is None:
                    self.stop()
                    try:
                        self._proc.wait(STOP_TIMEOUT)
                    except subprocess.TimeoutExpired:
                        self._proc.kill()
                        self._proc.wait()
                try:
                    self._finish()
                except ScenarioError:
                    pass
                for f in (self._proc.stdout, self._proc.stderr):
                    try:
                        f and f.close()
                    except OSError:
                        pass
            for t in self._threads:
                t.join(5)
            if self._evict_fd is not None:
                fd, self._evict_fd = self._evict_fd, None
                os.close(fd)
            done = []
            for cg in self.cgroups.values():
                try:
                    cg.remove()
                    done.append(f"cgroup {cg.path}")
                except ScenarioError as exc:
                    problems.append(str(exc))
            # what was recorded, plus anything under the workdir (set-up interrupted between
            # making a mount / loop device and recording it)
            tag = os.path.realpath(self.workdir) + "/" if self.workdir else None
            mps = [self.mountpoint] if self.mountpoint else []
            mps += [m["mountpoint"] for m in mounts()
                    if tag and m["mountpoint"].startswith(tag) and m["mountpoint"] not in mps]
            for mp in mps:
                try:
                    _umount(mp)
                    done.append(f"mount {mp}")
                except ScenarioError as exc:
                    problems.append(str(exc))
            devs = [self.loop_dev] if self.loop_dev else []
            devs += [d for d, b in loop_devices().items() if tag and b.startswith(tag) and d not in devs]
            for dev in devs:
                try:
                    _detach_loop(dev)
                    done.append(f"loop device {dev}")
                except ScenarioError as exc:
                    problems.append(str(exc))
            if self.workdir and os.path.isdir(self.workdir):
                if any(m["mountpoint"].startswith(tag) for m in mounts()):
                    problems.append(f"something is still mounted under {self.workdir}; left it")
                else:
                    shutil.rmtree(self.workdir, ignore_errors=True)
                    done.append(f"directory {self.workdir}")
            if done:
                self._say("removed " + ", ".join(done))
            for p in problems:
                self._say(f"clean-up problem: {p}")
        finally:
            for sig, h in masked.items():
                signal.signal(sig, h)
            for sig, h in self._old_handlers.items():
                try:
                    signal.signal(sig, h)
                except (ValueError, OSError):
                    pass
            self._old_handlers = {}
            atexit.unregister(self.close)
        return problems


def run(name: str, **opts) -> dict:
    """Run a scenario to the end; returns {info, summary, evidence}."""
    with Scenario(name, **opts) as sc:
        summary = sc.wait()
        return {"info": sc.info, "summary": summary, "evidence": sc.evidence()}
