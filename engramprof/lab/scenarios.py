"""Impairment-injection scenarios: the lab reader run under one real cause at a time.

Each scenario makes (or reuses) an Engram table, sets up one real kernel-level fault, starts
the lab reader (``python -m engramprof lab run ...``) as a child process with its own pid,
and removes everything it made when it ends::

    from engramprof.lab.scenarios import Scenario

    with Scenario("reclaim", duration=10) as sc:   # set-up happens on enter
        attach_tracer(sc.pid)                      # the reader's pid
        summary = sc.wait()                        # the lab's own JSON summary
        markers = sc.markers_path                  # ground-truth batch markers (JSON lines)
    # cgroups, loop device, mount, temporary table and directory are gone here

The scenarios (see ``SCENARIOS``; each one's fault, with its own set-up, teardown and expected
evidence, is a class in :mod:`engramprof.lab.impairments`; the host pieces are in
:mod:`engramprof.lab.host`):

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
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
from typing import Callable

from engramprof.errors import UserError
from engramprof.lab import host, table
from engramprof.lab.catalog import IMPAIRMENTS, SCENARIOS
from engramprof.lab.host import (  # noqa: F401
    CGROUP_PREFIX,
    Cgroup,
    Hierarchy,
    ScenarioError,
    default_tmp_parent,
    find_hierarchy,
    fs_type,
    loop_devices,
    mounts,
    residency_fraction,
)
from engramprof.lab.impairments import (
    DEFAULT_EVICT_MS,
    DEFAULT_IOPS,
    DEFAULT_MEMORY_MIB,
    Impairment,
    Spec,
)
from engramprof.lab.reader_process import (  # noqa: F401  (KEEP_RUNNING_S, STOP_TIMEOUT: their old home)
    KEEP_RUNNING_S,
    STOP_TIMEOUT,
    ReaderProcess,
    exit_on_term,
    ignore_stop_signals,
    reader_command,
    restore_signals,
)
from engramprof.tables import safetensors as layout

DEFAULT_ROWS = 1 << 18  # 2 layers x 262144 rows x 264 bytes = 132 MiB
DEFAULT_DURATION = 30.0
DEFAULT_GAP_MS = 10.0
READY_TIMEOUT = 120.0
WORKDIR_PREFIX = "engramprof-scenario-"
_CG_RE = re.compile(rf"^{CGROUP_PREFIX}({'|'.join(map(re.escape, SCENARIOS))})-(\d+)(?:-\d+)?$")
_WD_RE = re.compile(rf"^{WORKDIR_PREFIX}(\d+)-")
_pid_alive = host.pid_alive  # the name the tests use


# --------------------------------------------------------------------------- stale leftovers


def _dead_workdir(component: str) -> bool:
    """Whether a path component is the workdir name of a scenario process that is gone."""
    m = _WD_RE.match(component)
    return bool(m) and int(m.group(1)) != os.getpid() and not host.pid_alive(int(m.group(1)))


def _stale_mounts_and_loops() -> list[str]:
    removed = []
    for m in mounts():
        mp = m["mountpoint"]
        if os.path.basename(mp) == "mnt" and _dead_workdir(os.path.basename(os.path.dirname(mp))):
            try:
                host.umount(mp)
                removed.append(f"mount {mp}")
            except ScenarioError:
                pass
    for dev, backing in loop_devices().items():
        if any(_dead_workdir(part) for part in backing.split("/")):
            try:
                host.detach_loop(dev)
                removed.append(f"loop {dev}")
            except ScenarioError:
                pass
    return removed


def _stale_dirs(parent: str) -> list[str]:
    removed = []
    mounted = {m["mountpoint"] for m in mounts()}
    try:
        entries = os.listdir(parent)
    except OSError:
        entries = []
    for e in entries:
        path = os.path.join(parent, e)
        if _dead_workdir(e) and os.path.isdir(path) \
                and not any(mp == path or mp.startswith(path + "/") for mp in mounted):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(f"dir {path}")
    return removed


def _stale_cgroups() -> list[str]:
    removed = []
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
            if not m or int(m.group(2)) == os.getpid() or host.pid_alive(int(m.group(2))):
                continue
            path = os.path.join(h.root, e)
            try:
                if host.read_text(os.path.join(path, "cgroup.procs")).split():
                    continue
                os.rmdir(path)
                removed.append(f"cgroup {path}")
            except OSError:
                pass
    return removed


def cleanup_stale() -> list[str]:
    """Remove what scenarios whose process is gone left behind (a SIGKILLed scenario):
    mounts and loop devices under ``engramprof-scenario-<pid>-*`` directories, those
    directories, and ``engramprof-<scenario>-<pid>`` cgroups with no processes.  Items of
    live scenario processes are never touched.  Returns what was removed."""
    return _stale_mounts_and_loops() + _stale_dirs(default_tmp_parent()) + _stale_cgroups()


# --------------------------------------------------------------------------- the child

# Runs in the child between fork and the reader: (optionally) die with the parent, join the
# cgroups, then exec the reader -- the pid stays the same, and no reader code runs outside
# the groups.  argv: ppid pdeathsig n_procs procs... cmd...
# --------------------------------------------------------------------------- Scenario


def _check_options(name, steps, duration, keep_running, tokens, gap_ms, rows, table, start_delay,
                   evict_ms, memory_mib, iops, workers=0, faulty_rank=None) -> None:
    """One-line UserErrors naming the parameter (the CLI's flags have the same names)."""
    if name not in SCENARIOS:
        raise UserError(f"unknown scenario {name!r}; choose one of {', '.join(SCENARIOS)}")
    if workers < 0 or workers > 64:
        raise UserError(f"workers must be between 0 and 64 (got {workers})")
    if faulty_rank is not None and (workers < 2 or not 0 <= faulty_rank < workers):
        raise UserError(f"faulty_rank needs workers >= 2 and must be one of its ranks 0-{max(workers, 1) - 1} "
                        f"(got faulty_rank {faulty_rank}, workers {workers})")
    if keep_running and (steps is not None or duration is not None):
        raise UserError("keep_running runs until stopped: do not combine it with steps or duration")
    if steps is not None and duration is not None:
        raise UserError("give steps or duration, not both")
    for label, v in (("steps", steps), ("duration", duration), ("gap_ms", gap_ms),
                     ("start_delay", start_delay)):
        if v is not None and v < 0:
            raise UserError(f"{label} must be >= 0")
    if tokens < 1:
        raise UserError("tokens must be at least 1")
    if rows is not None and table is not None:
        raise UserError("rows sizes a new table; it cannot be combined with table (an existing one)")
    if rows is not None and rows < 1:
        raise UserError("rows must be at least 1")
    if evict_ms <= 0 or memory_mib <= 0 or iops < 1:
        raise UserError("evict_ms, memory_mib and iops must be positive")


class Scenario:
    """Set up one scenario, run the lab reader under it, tear everything down.

    ``start()`` (or entering the ``with`` block) makes the table and the fault, starts the
    reader and returns once the reader is ready (its ``lab: ready``) and the fault is in
    place; ``pid`` is then the reader's pid.  ``wait()`` returns the reader's own JSON summary
    (``engramprof lab run --json``).  ``stop()`` asks the reader to finish its current batch
    and exit.  ``close()`` (the end of the ``with`` block, an exception, Ctrl-C, SIGTERM when
    started from the main thread, interpreter exit) stops the reader and removes every
    cgroup, mount, loop device, temporary table and directory the scenario made.

    The fault itself (set-up, teardown, evidence) is ``fault``, one of
    :data:`engramprof.lab.catalog.IMPAIRMENTS`.  ``log`` receives progress lines (``scenario: ...``)
    and the reader's stderr lines; None keeps quiet (they are still collected in ``lines``).
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
        workers: int = 0,
        faulty_rank: int | None = None,
    ):
        _check_options(name, steps, duration, keep_running, tokens, gap_ms, rows, table, start_delay,
                       evict_ms, memory_mib, iops, workers, faulty_rank)
        # workers: `lab run --workers N` (N ranks forked from one reader process, pid = that
        # parent); faulty_rank: the fault applies to that rank only (its table, its cgroups); the
        # others run the healthy scenario's reader on a table of their own, kept cached
        self.workers, self.faulty_rank = workers, faulty_rank
        self.healthy_table: str | None = None
        self.rank_pids: dict[int, int] = {}
        self.fault: Impairment = IMPAIRMENTS[name](evict_ms=evict_ms, memory_mib=memory_mib, iops=iops)
        self.spec: Spec = self.fault.spec
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
        self.info: dict = {}
        self.lines: list[str] = []  # scenario log + reader stderr, in order
        self.summary: dict | None = None
        self.returncode: int | None = None
        self.stats_at_ready: dict = {}
        self.stats_at_end: dict = {}

        self.rank_join: list[str] = []
        self._armed = threading.Event()  # the fault is in place (reclaim: once the limit is set)
        self._child = ReaderProcess(self._relay, self._on_reader_pid, self._armed)
        self._lock = threading.RLock()
        self._started = self._closed = False
        self._old_handlers: dict = {}
        self._post_ready_error: BaseException | None = None

    # ------------------------------------------------------------------ what the fault made

    @property
    def cgroups(self) -> dict[str, Cgroup]:
        return self.fault.cgroups

    def _loop(self, attr: str):
        loop = getattr(self.fault, "loop", None)
        return getattr(loop, attr) if loop is not None else None

    @property
    def loop_dev(self) -> str | None:
        return self._loop("dev")

    @property
    def loop_devno(self) -> str | None:
        return self._loop("devno")

    @property
    def loop_dio(self) -> bool | None:
        return self._loop("dio")

    @property
    def mountpoint(self) -> str | None:
        return self._loop("mountpoint")

    @property
    def memory_limit(self) -> int | None:
        return getattr(self.fault, "memory_limit", None)

    @property
    def evictions(self) -> int:
        return getattr(self.fault, "evictions", 0)

    # ------------------------------------------------------------------ logging

    def say(self, text: str) -> None:
        self._relay(f"scenario: {text}")

    def _relay(self, line: str) -> None:
        if line.startswith("lab: rank ") and " pid " in line:  # lab run --workers: "lab: rank R pid X"
            r, _, pid = line[len("lab: rank "):].partition(" pid ")
            if r.isdigit() and pid.strip().isdigit():
                self.rank_pids[int(r)] = int(pid)
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
        if os.geteuid() != 0 and self.fault.needs_root:
            raise ScenarioError(f"scenario {self.name} needs root (cgroups, loop devices, mounts)")
        atexit.register(self.close)
        self._old_handlers = exit_on_term()
        try:
            self._setup()
        except BaseException:
            self.close()
            raise
        return self

    def _setup(self) -> None:
        for item in cleanup_stale():
            self.say(f"removed a leftover of a dead scenario: {item}")
        self.say(f"{self.name}: {self.spec.summary}")
        parent = self.tmp_parent or default_tmp_parent()
        self.workdir = tempfile.mkdtemp(prefix=f"{WORKDIR_PREFIX}{os.getpid()}-", dir=parent)
        if self.fault.table_must_be_droppable and fs_type(self.user_table or self.workdir) in host.TMPFS_TYPES:
            raise ScenarioError(f"{self.user_table or self.workdir} is on tmpfs, whose pages cannot "
                                "be dropped from memory; use a disk-backed directory "
                                "(ENGRAMPROF_SCENARIO_DIR)")
        self._place_markers(parent)
        self.fault.place_table(self)
        self.say(f"table {self.table_path} ({os.path.getsize(self.table_path) / 2**20:.1f} MiB)")
        self.say(f"markers {self.markers_path}")
        if self.faulty_rank is not None:
            self._make_healthy_table()
        procs = self.fault.setup(self)
        if self.faulty_rank is not None:  # only the faulty rank joins the fault's groups
            self.rank_join, procs = procs, []
        if not self.fault.arms_on_reader_pid:
            self._armed.set()
        # die with this process (not with a thread that may end first)
        pdeath = int(signal.SIGKILL) if threading.current_thread() is threading.main_thread() else 0
        self.pid = self._child.start(reader_command(self, procs, pdeath))
        self.say(f"pid {self.pid}")
        self._wait_ready()

    def _place_markers(self, parent: str) -> None:
        if self.markers_arg is not None:
            self.markers_path = os.path.abspath(self.markers_arg)
            d = os.path.dirname(self.markers_path)
            if not os.path.isdir(d) or not os.access(d, os.W_OK):
                raise UserError(f"markers file {self.markers_arg}: {d} is not a writable directory")
            if os.path.lexists(self.markers_path) and not os.path.isfile(self.markers_path):
                raise UserError(f"markers file {self.markers_arg}: exists and is not a regular file")
        elif self.keep_markers:
            self.markers_dir = tempfile.mkdtemp(prefix="engramprof-markers-", dir=parent)
            self.markers_path = os.path.join(self.markers_dir, f"{self.name}.jsonl")
        else:
            self.markers_path = os.path.join(self.workdir, "markers.jsonl")

    def make_table(self, path: str) -> None:
        """Make a new table of ``rows`` rows at ``path`` (it becomes ``table_path``)."""
        t0 = time.monotonic()
        table.make_table(path, self.rows, seed=self.seed)
        self.table_path = path
        self.say(f"made a {self.rows}-row table in {time.monotonic() - t0:.2f} s")

    def _make_healthy_table(self) -> None:
        """The healthy ranks' own table (the fault acts on ``table_path``, the faulty rank's)."""
        path = os.path.join(self.workdir, "healthy.safetensors")
        rows = self.rows
        if self.user_table is not None:
            rows = min(t.rows for t in layout.load(self.user_table).tensors)
        table.make_table(path, rows, seed=self.seed + 1)
        self.healthy_table = path
        self.say(f"healthy ranks' table {path} ({os.path.getsize(path) / 2**20:.1f} MiB, kept cached)")

    def use_table(self, path: str) -> None:
        """Read an existing table at ``path`` (it becomes ``table_path``)."""
        if not os.path.isfile(path):
            raise UserError(f"table {path}: no such file")
        layout.load(path)  # a one-line UserError if it is not a safetensors table
        self.table_path = path

    def _on_reader_pid(self) -> None:
        """The reader printed its pid: its imports are done and it has not read a row."""
        if not self.fault.arms_on_reader_pid:
            return
        try:
            self.fault.on_reader_pid(self)
        except BaseException as exc:  # reported by _wait_ready
            self._post_ready_error = exc
        finally:
            self._armed.set()

    def _wait_ready(self) -> None:
        proc = self._child.proc
        deadline = time.monotonic() + self.ready_timeout
        while not (self._child.ready.is_set() and self._armed.is_set()):
            if proc.poll() is not None:
                self._child.join_relays(2)
                raise ScenarioError(f"the reader exited ({proc.returncode}) before it was "
                                    f"ready:\n" + "\n".join(self.lines[-8:]))
            if time.monotonic() > deadline:
                raise ScenarioError(f"the reader was not ready after {self.ready_timeout:g} s")
            self._child.ready.wait(0.05)
        if self._post_ready_error is not None:
            raise self._post_ready_error
        self.stats_at_ready = self.fault_stats()
        self.info = self._info()

    def _info(self) -> dict:
        d = {"scenario": self.name, "pid": self.pid, "reader": self.reader,
             "markers": self.markers_path, "table": self.table_path, "workdir": self.workdir,
             "cache": self.spec.cache, "tokens": self.tokens, "gap_ms": self.gap_ms,
             "steps": self.steps, "duration": self.duration, "keep_running": self.keep_running}
        if self.workers:
            d.update(workers=self.workers, faulty_rank=self.faulty_rank,
                     ranks={str(r): p for r, p in sorted(self.rank_pids.items())}, healthy_table=self.healthy_table)
        d.update(self.fault.info())
        return d

    # ------------------------------------------------------------------ running

    @property
    def alive(self) -> bool:
        return self._child.alive

    def stop(self) -> None:
        """Ask the reader to finish its current batch and exit (SIGTERM); wait() then returns."""
        if self.alive:
            try:
                self._child.proc.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass

    def wait(self, timeout: float | None = None) -> dict:
        """Wait for the reader to exit; returns its summary (``lab run --json``).

        Raises ``subprocess.TimeoutExpired`` on timeout and ScenarioError if the reader
        failed.  The fault's evidence at the end is left in ``stats_at_end``."""
        if self._child.proc is None:
            raise RuntimeError("Scenario not started")
        self._child.proc.wait(timeout)
        return self._finish()

    def _finish(self) -> dict:
        proc = self._child.proc
        self._child.join_relays(5)
        if self.returncode is None:
            self.returncode = proc.returncode
            self.stats_at_end = self.fault_stats()
        if self.summary is None:
            self.summary = self._child.summary()
        if self.returncode != 0 or self.summary is None:
            hint = self.fault.failure_hint(self.stats_at_end)
            raise ScenarioError(f"the reader (pid {self.pid}) exited with {self.returncode}{hint}:\n"
                                + "\n".join(self.lines[-8:]))
        return self.summary

    def fault_stats(self) -> dict:
        """The fault's evidence now: table residency, and what the fault counts (evictions
        done, the memory cgroup's counters, the throttled device's serviced reads)."""
        d: dict = {}
        if self.table_path and os.path.exists(self.table_path):
            d["table_resident"] = residency_fraction(self.table_path)
        d.update(self.fault.stats())
        return d

    def evidence(self) -> dict:
        """The fault's expected evidence: its counters as end minus ready (end: now, if still
        running), its levels as they are at the end."""
        end = self.stats_at_end or self.fault_stats()
        out = {}
        for k in self.fault.counters:
            if end.get(k) is not None:
                out[k] = end[k] - (self.stats_at_ready.get(k) or 0)
        for k in self.fault.levels:
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
        masked = ignore_stop_signals()  # finish the clean-up
        try:
            self.fault.halt()
            self._stop_reader()
            done, problems = self.fault.teardown(self)
            more_done, more_problems = host.remove_workdir(self.workdir) if self.workdir else ([], [])
            done, problems = done + more_done, problems + more_problems
            if done:
                self.say("removed " + ", ".join(done))
            for p in problems:
                self.say(f"clean-up problem: {p}")
        finally:
            restore_signals(masked, self._old_handlers)
            self._old_handlers = {}
            atexit.unregister(self.close)
        return problems

    def _stop_reader(self) -> None:
        if self._child.proc is None:
            return
        self._child.terminate_and_reap()
        try:
            self._finish()
        except ScenarioError:
            pass
        self._child.close_pipes()
        self._child.join_relays(5)


def run(name: str, **opts) -> dict:
    """Run a scenario to the end; returns {info, summary, evidence}."""
    with Scenario(name, **opts) as sc:
        summary = sc.wait()
        return {"info": sc.info, "summary": summary, "evidence": sc.evidence()}
