"""`diagnose` of memory-mapped readers (issue 12): the lab's numpy.memmap gather, on the calling
thread (`mmap`) and split across the 32-thread pool (`mmap-pool`), under each real fault.

A cached, mapped table makes no page fault at all: the batches hold no read event, and their
time is split by the submitting thread's off-CPU spans (the gather on a CPU is cpu-copy, waiting
for the pool is python-scheduling).  Cold rows are major faults: residency, reclaim (a memcg
limit below the working set) or storage (a throttled loop device) by the same rules as syscalls.
Each case records 6 s of a running scenario (about 30 s with set-up).
"""
from __future__ import annotations

import json
import subprocess
import time

import pytest

from tests.tracing import engramprof

CASES = [
    ("healthy", "mmap", "healthy"),
    ("python-scheduling", "mmap-pool", "python-scheduling"),
    ("residency", "mmap", "residency"),
    ("residency", "mmap-pool", "residency"),
    ("reclaim", "mmap", "reclaim"),
    ("reclaim", "mmap-pool", "reclaim"),
    ("storage", "mmap", "storage"),
    ("storage", "mmap-pool", "storage"),
]


@pytest.mark.bpf
@pytest.mark.parametrize("scenario, reader, verdict", CASES, ids=[f"{s}-{r}" for s, r, _ in CASES])
def test_mmap_readers_diagnosed(scenario, reader, verdict):
    from engramprof.lab.scenarios import Scenario

    t0 = time.monotonic()
    opts = {"rows": 1 << 16} if scenario == "reclaim" else {}  # a working set that was cached, no longer fits
    with Scenario(scenario, duration=30, reader=reader, **opts) as sc:
        r = subprocess.run(engramprof("diagnose", "--pid", sc.pid, "--duration", "6", "--json",
                                      "--markers", sc.markers_path), capture_output=True, text=True, timeout=120)
        sc.stop()
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    bt = d["batch_tail"]
    assert d["verdict"] == verdict, (bt["share"], bt["read_events"], bt["notes"])
    assert d["read_path"] == "faults"
    assert bt["read_events"].get("syscall", 0) == 0  # the gather makes no read syscall
    if verdict in ("healthy", "python-scheduling"):
        # mapped and resident: no fault, and the batches are still analysed, by off-CPU spans
        unread = bt["batches_without_read_events"]
        assert unread["batches"] >= 0.9 * bt["batches"] and unread["source"].startswith("offcpu spans")
    else:
        assert bt["read_events"]["fault"] > 0 and bt["evidence"]["misses"] > 0
    if verdict == "python-scheduling":
        assert "calling thread" in d["recommendation"]["fix"]
    if verdict == "residency":
        assert "MADV_RANDOM" in d["recommendation"]["fix"]
    assert time.monotonic() - t0 < 60
