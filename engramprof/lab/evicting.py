"""Scenarios in which another process evicts a warm reader's table (issue 14).

* ``dropper``: a separate process (``python -m engramprof.lab.dropper``) drops the table from
  the page cache with ``POSIX_FADV_DONTNEED`` every ``evict_ms`` while a pool reader reads it
  warm: the misses are residency, and the eviction records name the dropper's pid and command
  line (the cron job of the public record, confined to the table's file).
* ``boot-stream``: the reader and a second process share one memory cgroup whose limit holds
  the reader's own memory, the table and ``memory_mib`` more; the second process streams a
  sparse file four times the limit through the page cache again and again, touching each
  chunk twice (a checkpoint parsed, then copied, at boot: its pages reach the active list as
  the table's do), so memcg reclaim in the streamer evicts the table's pages: the misses are
  reclaim, by the streamer.  How many pages it pushes out varies from run to run (the
  kernel's LRU keeps the table's often-read pages active): ``diagnose``'s ``evicted_by``
  names the streamer; the verdict may still be the pool's python-scheduling.

Each is a :class:`~engramprof.lab.impairments.Impairment` (driven by engramprof.lab.scenarios).
"""
from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
from typing import TYPE_CHECKING

from engramprof.lab import host
from engramprof.lab.helper_loop import PARENT_ENV
from engramprof.lab.host import ScenarioError
from engramprof.lab.impairments import (
    DEFAULT_EVICT_MS,
    DEFAULT_MEMORY_MIB,
    Impairment,
    ReclaimImpairment,
    Spec,
)

if TYPE_CHECKING:
    from engramprof.lab.scenarios import Scenario

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """preexec_fn: the child gets SIGKILL when the scenario process exits."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):
        pass


class _Helper:
    """A helper process of a scenario: started, its stdout's last JSON line read at the end."""

    def __init__(self, cmd: list[str], procs: str | None = None):
        self.cmd = cmd

        env = dict(os.environ, **{PARENT_ENV: str(os.getpid())})
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                     preexec_fn=_die_with_parent, close_fds=True, env=env)
        self.result: dict = {}
        if procs is not None:
            try:
                host.write_text(procs, str(self.proc.pid))
            except OSError as exc:
                self.stop()
                raise ScenarioError(f"cannot move pid {self.proc.pid} into {procs}: {exc.strerror}") from None

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def cmdline(self) -> str:
        return " ".join(self.cmd)

    def stop(self) -> None:
        p = self.proc
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
        try:
            out, _ = p.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            out, _ = p.communicate()
        for line in reversed((out or b"").decode(errors="replace").splitlines()):
            try:
                self.result = json.loads(line)
                break
            except ValueError:
                continue


class DropperImpairment(Impairment):
    """A separate process drops the table from the page cache every ``evict_ms`` while a warm
    pool reader runs.  Evidence: the drops done, the dropper's pid and command line."""

    spec = Spec("dropper", "pool", "warm",
                "pool reader on a warm table; a separate process drops the table from the page cache "
                "(POSIX_FADV_DONTNEED) every few ms")
    counters = ("drops",)

    def __init__(self, *, evict_ms: float = DEFAULT_EVICT_MS, **_options):
        super().__init__()
        self.evict_ms = evict_ms
        self.helper: _Helper | None = None
        self.count_file: str | None = None
        self.log_file: str | None = None

    @property
    def table_must_be_droppable(self) -> bool:
        return True

    def setup(self, sc: "Scenario") -> list[str]:
        self.count_file = os.path.join(sc.workdir, "dropper.count")
        self.log_file = os.path.join(sc.workdir, "dropper.log")
        self.helper = _Helper([sys.executable, "-m", "engramprof.lab.dropper", "--every-ms", f"{self.evict_ms:g}",
                               "--count-file", self.count_file, "--log", self.log_file, sc.table_path])
        sc.say(f"dropper pid {self.helper.pid}: drops the table every {self.evict_ms:g} ms (POSIX_FADV_DONTNEED)")
        return []

    def stats(self) -> dict:
        h = self.helper
        if h is not None and h.result:
            return {"drops": h.result.get("drops", 0)}
        try:
            with open(self.count_file) as f:
                return {"drops": int(f.read().strip() or 0)}
        except (OSError, ValueError, TypeError):
            return {"drops": 0} if h is not None else {}

    def info(self) -> dict:
        h = self.helper
        return {"evict_ms": self.evict_ms, "dropper_pid": h.pid if h else None,
                "dropper_cmdline": h.cmdline if h else None, "dropper_log": self.log_file, **super().info()}

    def halt(self) -> None:
        if self.helper is not None:
            self.helper.stop()

    def teardown(self, sc: "Scenario") -> tuple[list[str], list[str]]:
        self.halt()
        return super().teardown(sc)


class BootStreamImpairment(ReclaimImpairment):
    """The warm reader and a streaming process in one memory cgroup sized for the reader and
    its table: the stream's page cache pushes the table out (memcg reclaim in the streamer)."""

    spec = Spec("boot-stream", "pool", "warm",
                "pool reader on a warm table; a second process in its memory cgroup streams a large file "
                "through the page cache (a checkpoint at boot), evicting the table")
    counters = ReclaimImpairment.counters + ("passes",)

    def __init__(self, *, memory_mib: float = DEFAULT_MEMORY_MIB, **options):
        super().__init__(memory_mib=memory_mib, **options)
        self.helper: _Helper | None = None
        self.stream_path: str | None = None
        self.count_file: str | None = None
        self.log_file: str | None = None

    @property
    def table_must_be_droppable(self) -> bool:
        return True

    def on_reader_pid(self, sc: "Scenario") -> None:
        """Limit: the reader's own memory, the whole table and ``memory_mib``; then the stream."""
        cg = self.cgroups["memory"]
        table = os.path.getsize(sc.table_path)
        budget = self.memory_mib
        self.memory_mib = round(budget + table / 2**20, 1)
        try:
            super().on_reader_pid(sc)
        finally:
            self.memory_mib = budget
        self.stream_path = os.path.join(sc.workdir, "checkpoint.bin")
        size = 4 * int(self.memory_limit or table)
        with open(self.stream_path, "wb") as f:  # sparse: streamed through the page cache, no disk
            f.truncate(size)
        self.count_file = os.path.join(sc.workdir, "streamer.count")
        self.helper = _Helper([sys.executable, "-m", "engramprof.lab.streamer", self.stream_path, self.count_file],
                              procs=cg.procs)
        sc.say(f"streamer pid {self.helper.pid} in {cg.path}: reads {size / 2**20:.0f} MiB again and again")

    def stats(self) -> dict:
        d = super().stats()
        if self.helper is not None and self.helper.result:
            d["passes"] = self.helper.result.get("passes", 0)
        elif self.helper is not None:
            try:
                with open(self.count_file) as f:
                    d["passes"] = int(f.read().strip() or 0)
            except (OSError, ValueError):
                d["passes"] = 0
        return d

    def info(self) -> dict:
        h = self.helper
        return {**super().info(), "streamer_pid": h.pid if h else None, "stream_path": self.stream_path}

    def halt(self) -> None:
        if self.helper is not None:
            self.helper.stop()

    def teardown(self, sc: "Scenario") -> tuple[list[str], list[str]]:
        self.halt()
        return super().teardown(sc)


EVICTING_IMPAIRMENTS = (DropperImpairment, BootStreamImpairment)
