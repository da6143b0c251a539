"""fio (Debian's package) as the reference reader for the read-path probes (tests/test_uring.py,
tests/test_libaio.py): a file with real blocks, and fio run under a probe compiled for its pid.

fio runs with ``--thread`` (its job is a thread of the fio process, so the target is one tgid)
and is started by a forked child that waits on a pipe before exec'ing fio: its pid is known, so
the probe is compiled for it and armed before fio submits anything.
"""
from __future__ import annotations

import json
import os
import subprocess
import numpy as np

from engramprof.host.files import kernel_dev
from tests.fio_runs import PausedFio, write_data_file

FILE_MB = 512
RUNTIME_S = 2
DATA_DIR = "/var/tmp/engramprof-uring-test"  # one file for every engine's tests


def data_file() -> str:
    """A file with real blocks (not fallocate's unwritten extents, which read as zeros without I/O)
    on the root disk; made once, kept between runs (FILE_MB)."""
    if subprocess.run(["which", "fio"], capture_output=True).returncode != 0:
        raise AssertionError("fio is not installed (scripts/setup.sh installs it: apt-get install -y fio)")
    return write_data_file(os.path.join(DATA_DIR, "data.bin"), FILE_MB)


def fio_argv(path: str, engine: str, out: str, *opts: str) -> list[str]:
    """Random 4k reads of ``path`` for RUNTIME_S with ``engine``, iodepth 1, lat percentiles, JSON."""
    return ["fio", f"--name={engine}", f"--filename={path}", f"--ioengine={engine}", "--rw=randread", "--bs=4k",
            f"--size={FILE_MB}M", f"--runtime={RUNTIME_S}", "--time_based", "--thread", "--iodepth=1",
            "--lat_percentiles=1", "--output-format=json", f"--output={out}", *opts]


def run_fio(load_probe, path: str, engine: str, *opts: str, watch_workers: bool = False):
    """fio under the probe ``load_probe(pid)`` returns (loaded, not armed).  Returns (fio's read
    stats, the probe's records, its totals, fio's pid, {tid: comm} of fio's threads seen while it
    ran, the probe object's ``summary_totals()`` when it has one)."""
    out = path + f".{engine}.json"
    fio = PausedFio(fio_argv(path, engine, out, *opts))
    probe = None
    parts, threads = [], {}

    def drain() -> None:
        parts.append(probe.drain())
        if watch_workers and fio.status is None and os.path.isdir(f"/proc/{fio.pid}/task"):
            for tid in os.listdir(f"/proc/{fio.pid}/task"):
                try:
                    threads[int(tid)] = open(f"/proc/{fio.pid}/task/{tid}/comm").read().strip()
                except OSError:
                    pass

    try:
        probe = load_probe(fio.pid)
        probe.arm()
        fio.go()
        fio.wait(RUNTIME_S + 60, every=drain)
        parts.append(probe.drain())
        totals = probe.summary_totals() if hasattr(probe, "summary_totals") else probe.totals()
        recs = np.concatenate(parts)
    finally:
        fio.close()
        if probe is not None:
            probe.close()
    pid = fio.pid
    with open(out) as f:
        stats = json.load(f)["jobs"][0]["read"]
    return stats, recs, totals, pid, threads


def identity(path: str) -> tuple[int, int]:
    """(device in the kernel's encoding, inode) of ``path``: what a probe records."""
    st = os.stat(path)
    return kernel_dev(st.st_dev), st.st_ino


def check_latency(stats, durations) -> None:
    """The probe's p50 and p99 against fio's ``lat`` (slat + clat: from before the submitting
    syscall to after the reap, so each probe interval lies inside fio's): within 15% below, and
    above by at most fio's histogram bin error (bins ~1.6% wide: 64 per power of two)."""
    fio = stats["lat_ns"]["percentile"]
    for q, key in ((50, "50.000000"), (99, "99.000000")):
        ours = float(np.percentile(durations, q))
        ref = float(fio[key])
        assert 0.85 * ref <= ours <= 1.02 * ref, f"p{q}: probe {ours / 1e3:.1f} us, fio lat {ref / 1e3:.1f} us"
