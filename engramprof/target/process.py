"""The traced process: checks before tracing, and noticing its exit (pidfd)."""
from __future__ import annotations

import os
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
