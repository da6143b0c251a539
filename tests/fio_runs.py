"""fio (Debian's package) under a probe, for the cross-checks with a client nobody here wrote
(tests/test_uring.py, tests/test_fio_syscalls.py).

fio is started by a forked child that waits on a pipe before exec'ing it: its pid is known, so
a probe is compiled for it and armed before fio reads anything.  With ``--thread`` fio's jobs are
threads of that one process (one tgid to trace).
"""
from __future__ import annotations

import json
import os
import subprocess
import time

import pytest


def require_fio() -> None:
    if subprocess.run(["which", "fio"], capture_output=True).returncode != 0:
        pytest.fail("fio is not installed (scripts/setup.sh installs it: apt-get install -y fio)")


def write_data_file(path: str, mb: int) -> str:
    """A file of ``mb`` MiB with real blocks (not fallocate's unwritten extents, which read as
    zeros without I/O), kept when it already has that size."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if not os.path.exists(path) or os.path.getsize(path) != mb << 20:
        with open(path, "wb") as f:
            block = os.urandom(1 << 20)
            for _ in range(mb):
                f.write(block)
            f.flush()
            os.fsync(f.fileno())
    return path


class PausedFio:
    """fio forked and waiting to exec: ``pid`` is fio's; :meth:`go` lets it run."""

    def __init__(self, argv: list[str]):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            try:
                os.close(w)
                os.read(r, 1)
                fd = os.open(os.devnull, os.O_WRONLY)
                os.dup2(fd, 1)
                os.execvp("fio", argv)
            finally:
                os._exit(127)
        os.close(r)
        self.pid, self._w = pid, w
        self.status = None

    def go(self) -> None:
        os.write(self._w, b"x")

    def wait(self, timeout_s: float, every=None) -> None:
        """Until fio exits (``every()`` called about every 50 ms meanwhile); asserts it exited 0."""
        deadline = time.monotonic() + timeout_s
        while self.status is None and time.monotonic() < deadline:
            done, st = os.waitpid(self.pid, os.WNOHANG)
            if done:
                self.status = st
            if every is not None:
                every()
            time.sleep(0.05)
        assert self.status is not None and os.waitstatus_to_exitcode(self.status) == 0, f"fio failed ({self.status})"

    def close(self) -> None:
        os.close(self._w)
        if self.status is None:  # never released or still running: not left behind
            try:
                os.kill(self.pid, 9)
                os.waitpid(self.pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass


def jobs_of(output: str) -> dict[str, dict]:
    """fio's JSON output: each job's read stats by job name."""
    with open(output) as f:
        return {j["jobname"]: j["read"] for j in json.load(f)["jobs"]}
