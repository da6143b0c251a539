"""The host pieces the lab scenarios use: mounts, cgroups, loop devices, page-cache eviction.

Everything here acts on the real machine (as root for cgroups, loop devices and mounts) and
raises :class:`ScenarioError` (a one-line :class:`~engramprof.errors.UserError`, exit code 1)
when the environment does not allow it.
"""
from __future__ import annotations

import ctypes
import errno
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from engramprof.errors import UserError
from engramprof.host import residency

CGROUP_PREFIX = "engramprof-"
TMPFS_TYPES = {"tmpfs", "ramfs", "shm", "devtmpfs"}


class ScenarioError(UserError):
    """A scenario could not be set up, or its reader failed (exit code 1: environment)."""

    def __init__(self, message: str):
        super().__init__(message, 1)


def run_tool(cmd: list[str], what: str, timeout: float = 120) -> str:
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


def write_text(path: str | Path, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def read_text(path: str | Path) -> str:
    with open(path) as f:
        return f.read()


def pid_alive(pid: int) -> bool:
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
        text = read_text("/proc/self/mountinfo")
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
        if os.path.isdir(cand) and os.access(cand, os.W_OK) and fs_type(cand) not in TMPFS_TYPES:
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
                ctrls = read_text(os.path.join(m["mountpoint"], "cgroup.controllers")).split()
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
            ctl = read_text(os.path.join(hier.root, "cgroup.subtree_control")).split()
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
        return read_text(self.file(name))

    def write(self, name: str, value: str) -> None:
        try:
            write_text(self.file(name), value)
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


def detach_loop(dev: str) -> None:
    for _ in range(50):
        try:
            run_tool(["losetup", "-d", dev], "detach loop device", timeout=30)
        except ScenarioError:
            if dev not in loop_devices():
                return
            time.sleep(0.1)
            continue
        return
    if dev in loop_devices():
        raise ScenarioError(f"cannot detach {dev}")


def umount(mp: str) -> None:
    for _ in range(50):
        if not any(m["mountpoint"] == mp for m in mounts()):
            return
        try:
            run_tool(["umount", mp], "unmount", timeout=30)
            return
        except ScenarioError:
            time.sleep(0.1)
    run_tool(["umount", "-l", mp], "unmount (lazy)", timeout=30)


def remove_workdir(workdir: str) -> tuple[list[str], list[str]]:
    """Unmount / detach anything left under a scenario's workdir (set-up interrupted between
    making a mount or loop device and recording it), then remove the workdir.  Returns (what
    was removed, problems met)."""
    done, problems = [], []
    tag = os.path.realpath(workdir) + "/"
    for mp in [m["mountpoint"] for m in mounts() if m["mountpoint"].startswith(tag)]:
        try:
            umount(mp)
            done.append(f"mount {mp}")
        except ScenarioError as exc:
            problems.append(str(exc))
    for dev in [d for d, b in loop_devices().items() if b.startswith(tag)]:
        try:
            detach_loop(dev)
            done.append(f"loop device {dev}")
        except ScenarioError as exc:
            problems.append(str(exc))
    if os.path.isdir(workdir):
        if any(m["mountpoint"].startswith(tag) for m in mounts()):
            problems.append(f"something is still mounted under {workdir}; left it")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
            done.append(f"directory {workdir}")
    return done, problems


# --------------------------------------------------------------------------- page cache


def residency_fraction(path: str | os.PathLike) -> float | None:
    """Share of the file's pages in the page cache now (cachestat, else mincore; no reads)."""
    try:
        return round(residency.file_residency(path).residency.fraction, 4)
    except Exception:
        return None


def evict(fd: int) -> None:
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)


MADV_PAGEOUT = 21
_SYS_PROCESS_MADVISE = 440  # the same number on x86_64 and arm64 (the generic table)


class _IoVec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


def mapped_ranges(pid: int, path: str) -> list[tuple[int, int]]:
    """[start, end) of every mapping of ``path`` in process ``pid`` (from /proc/PID/maps)."""
    real = os.path.realpath(path)
    out = []
    try:
        with open(f"/proc/{pid}/maps") as f:
            for line in f:
                parts = line.split(None, 5)
                if len(parts) == 6 and parts[5].strip() == real:
                    a, b = parts[0].split("-")
                    out.append((int(a, 16), int(b, 16)))
    except OSError:
        return []
    return out


def page_out_mappings(pid: int, path: str) -> int:
    """Reclaim the pages of ``path`` that process ``pid`` has mapped (process_madvise
    MADV_PAGEOUT: clean file pages are unmapped and dropped; nothing is read).  fadvise
    DONTNEED alone skips pages a process has mapped, so a memory-mapped reader would keep its
    rows.  Returns the bytes advised (0: no mapping, or the kernel refused)."""
    ranges = mapped_ranges(pid, path)
    if not ranges:
        return 0
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:
        return 0
    try:
        iov = (_IoVec * len(ranges))(*[_IoVec(a, b - a) for a, b in ranges])
        libc = ctypes.CDLL(None, use_errno=True)
        n = libc.syscall(_SYS_PROCESS_MADVISE, pidfd, iov, len(ranges), MADV_PAGEOUT, 0)
        return max(0, int(n))
    finally:
        os.close(pidfd)
