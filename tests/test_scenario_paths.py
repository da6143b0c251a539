"""`lab scenario reclaim` with the read-path readers, diagnosed for real (issue 22: "Every lab
scenario gets the right verdict with each new reader").

The reclaim fault (a memory cgroup limiting the reader's page cache to 16 MiB below the
table's working set) is the one whose answer depends on the path:

- ``uring`` (buffered io_uring READV): its misses are refaults of the table's own pages the
  group's reclaim evicted: ``reclaim``.  It also runs its whole window: the lab's io_uring
  reader once pinned every step's output array (the binding's Iovec never releases its buffer)
  and the group OOM-killed it after ~8 s;
- ``direct`` (O_DIRECT preadv from the pool): no read uses the page cache, so the limit has
  nothing of its reads to reclaim; every read waits for the device at its normal speed:
  ``residency`` with the O_DIRECT evidence, never ``reclaim`` (docs/model.md, "Read paths
  under the lab's faults").

The other scenario x reader cells are run by benchmarks/scenario_readers.py (figures in
benchmarks/RESULTS.md, "Lab scenarios"); cold and warm runs of each reader are
tests/test_paths_record.py and tests/test_uring_record.py, the storage rule on requests and
O_DIRECT calls tests/test_read_paths.py.  Each case records 5 s of a running scenario (about
25 s with set-up on an idle machine).
"""
from __future__ import annotations

import json
import subprocess

import pytest

from engramprof.analysis.paths import DIRECT_EVIDENCE
from tests.tracing import engramprof

pytestmark = pytest.mark.bpf

CASES = [("uring", "reclaim", "io_uring"), ("direct", "residency", "syscalls")]


@pytest.mark.parametrize("reader, verdict, read_path", CASES, ids=[c[0] for c in CASES])
def test_reclaim_scenario(reader, verdict, read_path, tmp_path):
    from engramprof import trace
    from engramprof.lab.scenarios import Scenario

    # a 33 MiB table: a working set that was cached and no longer fits (test_diagnose_mmap's rule)
    with Scenario("reclaim", duration=120, reader=reader, rows=1 << 16) as sc:
        r = subprocess.run(engramprof("diagnose", "--pid", sc.pid, "--duration", "5", "--json",
                                      "--markers", sc.markers_path, "--output", tmp_path / "t"), capture_output=True, text=True, timeout=240)
        evidence = sc.evidence()
        alive = sc._child.proc.poll() is None  # not OOM-killed in the group
        sc.stop()
    assert r.returncode == 0, r.stderr[-2000:]
    assert alive and evidence.get("oom_kill", 0) == 0, evidence
    d = json.loads(r.stdout)
    bt = d["batch_tail"]
    assert d["verdict"] == verdict, (bt["share"], bt["read_events"], bt["notes"])
    assert d["read_path"] == read_path
    assert bt["share"].get("unexplained", 0) < 0.1, bt["share"]
    if reader == "direct":  # (its pool's hand-offs are python-scheduling: 23-42% on this loaded VM)
        assert bt["share"]["reclaim"] < 0.05, bt["share"]
        assert any(DIRECT_EVIDENCE in str(step) for step in d["evidence"]), d["evidence"]
    else:
        assert bt["share"]["python-scheduling"] < 0.2, bt["share"]  # one ring on the step thread: no pool
        assert evidence["workingset_refault_file"] > 0 and evidence["failcnt"] > 0, evidence
        # a bio's time goes to the request that queued it, never to a later request the kernel
        # gave the same (recycled) io_kiocb: no request's bios outlast it (before the fix, 256 of
        # 23,124 requests with bios in a dropper-scenario uring run did; this run may not show it)
        calls = trace.load_bundle(tmp_path / "t").calls
        ur = calls[calls["kind"].astype(str) == "io_uring"]
        assert (ur["bio_count"] > 0).sum() > 0
        assert (ur["bio_ns"] <= ur["bio_count"] * ur["dur_ns"]).all(), ur[ur["bio_ns"] > ur["bio_count"] * ur["dur_ns"]]
