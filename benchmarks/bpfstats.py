"""BPF programs' own run time, for the overhead benchmarks (shared by every benchmarks/*.py).

The kernel counts run_time_ns / run_cnt per program only while statistics are enabled.  The
sysctl ``kernel.bpf_stats_enabled`` is one global switch: a benchmark that sets it to 1 and back
to 0 at its end turns it off under any other benchmark running at the same time (it happened
here: RESULTS.md, "Target selectors", 2026-12-01 13:21).  ``bpf(BPF_ENABLE_STATS)`` instead
returns an fd that keeps statistics on for as long as it is open, counted by the kernel with
every other holder and with the sysctl, so holders never turn them off for one another.
:func:`stats_enabled` holds that fd for a ``with`` block; only where the command is missing
(kernels before 5.8) it falls back to the sysctl, and then leaves it on.

:func:`prog_stats_of_pid` reads every program fd a process holds (``/proc/PID/fdinfo``, no
bpftool); :func:`prog_stats_of_bcc` the programs of a BCC object loaded in this process.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import platform
import subprocess

BPF_ENABLE_STATS = 32  # enum bpf_cmd
BPF_STATS_RUN_TIME = 0  # enum bpf_stats_type
SYS_BPF = {"x86_64": 321, "aarch64": 280, "arm64": 280}


def _enable_stats_fd() -> int | None:
    nr = SYS_BPF.get(platform.machine())
    if nr is None:
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    attr = (ctypes.c_uint32 * 4)(BPF_STATS_RUN_TIME, 0, 0, 0)  # union bpf_attr.enable_stats.type
    fd = libc.syscall(nr, BPF_ENABLE_STATS, ctypes.byref(attr), ctypes.sizeof(attr))
    return fd if fd >= 0 else None


@contextlib.contextmanager
def stats_enabled():
    """Keep BPF run-time statistics on for the block; yields True when they are on."""
    fd = _enable_stats_fd()
    if fd is not None:
        try:
            yield True
        finally:
            os.close(fd)
        return
    on = subprocess.run(["sysctl", "-qw", "kernel.bpf_stats_enabled=1"]).returncode == 0
    yield on  # left on: turning it off could blind another benchmark running now


def _fdinfo(path: str) -> dict[str, str]:
    with open(path) as f:
        return dict(line.split(":\t", 1) for line in f.read().splitlines() if ":\t" in line)


def prog_stats_of_pid(pid: int) -> dict[int, tuple[int, int]]:
    """prog_id -> (run_time_ns, run_cnt) of every BPF program fd process ``pid`` holds."""
    out: dict[int, tuple[int, int]] = {}
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return out
    for fd in fds:
        try:
            if "bpf-prog" not in os.readlink(f"/proc/{pid}/fd/{fd}"):
                continue
            kv = _fdinfo(f"/proc/{pid}/fdinfo/{fd}")
            out[int(kv["prog_id"])] = (int(kv["run_time_ns"]), int(kv["run_cnt"]))
        except (OSError, KeyError, ValueError):
            continue
    return out


def prog_stats_of_bcc(bpf) -> dict[str, tuple[int, int]]:
    """program name -> (run_time_ns, run_cnt) of a BCC object loaded in this process."""
    out: dict[str, tuple[int, int]] = {}
    for name, fn in getattr(bpf, "funcs", {}).items():
        try:
            kv = _fdinfo(f"/proc/self/fdinfo/{fn.fd}")
            out[name] = (int(kv["run_time_ns"]), int(kv["run_cnt"]))
        except (OSError, KeyError, ValueError, AttributeError):
            continue
    return out
