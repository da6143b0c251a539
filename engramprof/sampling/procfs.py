"""Raw reads and parsers of /proc and /sys files (no state beyond an fd cache).

The roots are parameters of the callers, so tests can point them at a fake tree.
"""
from __future__ import annotations

import errno
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def read_file(path: str) -> bytes:
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


class FdCache:
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
                    return read_file(path)
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
                self.fds[path] = fd
            try:
                data = os.pread(fd, 65536, 0)
            except OSError:
                del self.fds[path]
                os.close(fd)
                raise
            if len(data) == 65536:  # larger than expected: read it whole
                data = read_file(path)
            return data

    def drop(self, keep: Callable[[str], bool]) -> None:
        with self.lock:
            for path in [p for p in self.fds if not keep(p)]:
                os.close(self.fds.pop(path))

    def close(self) -> None:
        self.drop(lambda p: False)


def pick(data: bytes, keys: Iterable[str]) -> dict[str, int]:
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


def parse_kv(data: bytes) -> dict[str, int]:
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


def status_int(data: bytes, key: bytes) -> int | None:
    i = data.find(b"\n" + key + b":")
    if i < 0:
        return None
    j = data.find(b"\n", i + 1)
    try:
        return int(data[i + len(key) + 2 : j if j > 0 else None])
    except ValueError:
        return None


def is_gone(exc: OSError) -> bool:
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
        text = read_file(f"{proc_root}/{pid}/cgroup").decode(errors="replace")
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
                        rel == "/" and b"memory" in safe_read(ctl).split()
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


def safe_read(p: Path) -> bytes:
    try:
        return read_file(str(p))
    except OSError:
        return b""
