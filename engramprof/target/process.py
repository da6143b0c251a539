"""The traced process: checks before tracing, and noticing its exit (pidfd)."""
from __future__ import annotations

import os
import re
import select
import shlex

from engramprof.errors import UserError
from engramprof.host import doctor


def pid_state(pid: int) -> str | None:
    """'R', 'S', 'Z', ... or None when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
        return data[data.rindex(b")") + 2:][:1].decode()
    except (OSError, ValueError):
        return None


def check_target(pid: int, tid: int = 0) -> None:
    st = pid_state(pid)
    if st is None or st in ("Z", "X"):
        raise UserError(f"no process with pid {pid}", code=2)
    if tid and not os.path.isdir(f"/proc/{pid}/task/{tid}"):
        raise UserError(f"pid {pid} has no thread {tid}", code=2)


def check_privileges() -> None:
    """One-line error unless this process may load and attach the probes (doctor's check)."""
    c = doctor.check_privileges()
    if c.status == doctor.FAIL:
        raise UserError(c.detail.split("; engramprof syscalls")[0] + ": tracing needs root or CAP_BPF + CAP_PERFMON",
                        code=1)


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return shlex.join(a.decode(errors="replace") for a in f.read().split(b"\0") if a)
    except OSError:
        return ""


#: the file name of a CPython interpreter's code: the python3.X executable (Debian links libpython
#: into it) or libpython3.X.so (a program embedding the interpreter: uwsgi, a C++ server)
_CPYTHON_FILE = re.compile(r"^(lib)?python([23](\.\d+)?[a-z]*)?(\.so(\.[\d.]+)?)?$")


def runs_cpython(pid: int, proc_root: str = "/proc") -> tuple[bool | None, str]:
    """Whether ``pid`` runs a CPython interpreter, and why: one of its executable file mappings
    is a python3.X executable or a libpython3.X.so (True), none is (False), or /proc/PID/maps
    could not be read (None).  Reads the process's maps only, never its memory.  A program that
    links the interpreter statically under another name is taken as not CPython (its threads
    native); a stack sampler that finds the interpreter overrides this (analysis/thread_kinds)."""
    try:
        with open(f"{proc_root}/{pid}/maps") as f:
            files = {line.split(None, 5)[5].strip() for line in f
                     if line.count(" ") >= 5 and "x" in line.split(None, 2)[1] and "/" in line}
    except (OSError, IndexError) as exc:
        return None, f"/proc/{pid}/maps unreadable ({getattr(exc, 'strerror', None) or exc})"
    files = {f for f in files if f.startswith("/")}
    hits = sorted(f for f in files if _CPYTHON_FILE.match(os.path.basename(f.removesuffix(" (deleted)"))))
    if hits:
        return True, f"maps {hits[0]}"
    return False, f"none of its {len(files)} executable file mappings is python3.X or libpython3.X"


class ExitWatch:
    """A pidfd of the target: readable once it has exited."""

    def __init__(self, pid: int):
        try:
            self.fd: int | None = os.pidfd_open(pid)
        except OSError:
            raise UserError(f"no process with pid {pid}", code=2) from None

    def exited(self) -> bool:
        if self.fd is None:
            return False
        r, _, _ = select.select([self.fd], [], [], 0)
        return bool(r)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
