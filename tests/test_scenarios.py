"""Fault-injection scenarios, for real: cgroups, a loop device, mounts, page-cache eviction.

These need root (cgroups, losetup, mount) but not BPF.  Each scenario runs a few seconds on a
33 MiB table; every test checks that nothing the scenario made is left behind.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from engramprof.tables import safetensors as layout
from engramprof.errors import UserError
from engramprof.lab import scenarios
from engramprof.lab.scenarios import Scenario

REPO = Path(__file__).resolve().parent.parent
ROWS = 1 << 16  # 33 MiB table: quick to make, still 2x the reclaim budget
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="scenarios need root (cgroups, loop devices, mounts)")

# the CLI, as `engramprof` runs it
BOOT = """
import sys
from engramprof import cli
sys.argv[0] = "engramprof"
cli.main()
"""


def leftovers(owner_pid: int) -> list[str]:
    """Everything a scenario run by process ``owner_pid`` could have left behind."""
    out = []
    for ctl in ("memory", "blkio"):
        h = scenarios.find_hierarchy(ctl)
        if h and os.path.isdir(h.root):
            out += [f"cgroup {h.root}/{e}" for e in os.listdir(h.root)
                    if e.startswith("engramprof-") and (e.endswith(f"-{owner_pid}") or f"-{owner_pid}-" in e)]
    tag = f"{scenarios.WORKDIR_PREFIX}{owner_pid}-"
    out += [f"loop {d} -> {b}" for d, b in scenarios.loop_devices().items() if tag in b]
    out += [f"mount {m['mountpoint']}" for m in scenarios.mounts() if tag in m["mountpoint"]]
    parent = scenarios.default_tmp_parent()
    out += [f"dir {parent}/{e}" for e in os.listdir(parent) if e.startswith(tag)]
    return out


def require(controller: str) -> None:
    if scenarios.find_hierarchy(controller) is None:
        pytest.skip(f"no {controller} cgroup controller mounted")


def row_offsets(path: str, n: int, seed: int = 1) -> list[tuple[int, int]]:
    lay = layout.load(path)
    w = lay.tensors[0]
    rows = np.random.default_rng(seed).integers(0, w.rows, n)
    return [(w.start + int(r) * w.row_bytes, w.row_bytes) for r in rows]


def timed_reads_us(path: str, n: int = 300) -> float:
    """Median µs of single-row preadv calls on ``path`` from this process."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        buf = bytearray(256)
        ts = []
        for off, size in row_offsets(path, n):
            t0 = time.perf_counter_ns()
            os.preadv(fd, [memoryview(buf)[:size]], off)
            ts.append(time.perf_counter_ns() - t0)
        return float(np.median(ts)) / 1000
    finally:
        os.close(fd)


def markers_of(path: str) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


# --------------------------------------------------------------------------- no root needed


def test_bad_arguments():
    with pytest.raises(UserError, match="unknown scenario"):
        Scenario("nope")
    with pytest.raises(UserError, match="keep_running"):
        Scenario("healthy", keep_running=True, steps=3)
    with pytest.raises(UserError, match="not both"):
        Scenario("healthy", steps=3, duration=1)
    with pytest.raises(UserError, match="combined with table"):
        Scenario("healthy", rows=10, table="/nonexistent")
    assert set(scenarios.SCENARIOS) == {"python-scheduling", "healthy", "residency", "reclaim", "storage", "dropper",
                                        "boot-stream"}


# --------------------------------------------------------------------------- scenarios


@pytest.fixture(scope="module")
def cached_baseline():
    """python-scheduling: pool reader on a warm table -- the cached baseline of the others."""
    if os.geteuid() != 0:
        pytest.skip("scenarios need root")
    with Scenario("python-scheduling", rows=ROWS, steps=60, gap_ms=5) as sc:
        assert sc.pid and sc.pid != os.getpid()
        summary = sc.wait()
        row_us = timed_reads_us(sc.table_path)
        marks = markers_of(sc.markers_path)
        resident = scenarios.residency_fraction(sc.table_path)
        workdir = sc.workdir
    assert not os.path.exists(workdir)
    assert leftovers(os.getpid()) == []
    return {"summary": summary, "row_us": row_us, "markers": marks, "resident": resident}


@needs_root
def test_python_scheduling_warm_pool(cached_baseline):
    s = cached_baseline["summary"]
    assert s["reader"] == "pool" and s["cache"] == "warm" and s["steps"] == 60
    assert cached_baseline["resident"] == 1.0
    assert cached_baseline["row_us"] < 100, "a cached row read should take microseconds"
    m = cached_baseline["markers"]
    assert len(m) == 60 and all(r["start_ns"] <= r["end_ns"] for r in m)
    assert m[0]["reader"] == "pool"


@needs_root
def test_healthy_nowait_faster_than_pool(cached_baseline):
    with Scenario("healthy", rows=ROWS, steps=60, gap_ms=5) as sc:
        s = sc.wait()
        assert scenarios.residency_fraction(sc.table_path) == 1.0
    assert s["reader"] == "nowait" and s["eagain"] == 0 and s["fallback_rows"] == 0
    assert s["batch_ms"]["p50"] < cached_baseline["summary"]["batch_ms"]["p50"]
    assert leftovers(os.getpid()) == []


@needs_root
def test_residency_table_stays_cold_and_reads_slow(cached_baseline):
    with Scenario("residency", rows=ROWS, steps=80, gap_ms=5) as sc:
        during = []
        for _ in range(4):
            time.sleep(0.15)
            during.append(scenarios.residency_fraction(sc.table_path))
        s = sc.wait()
        ev = sc.evidence()
        workdir = sc.workdir
    assert max(during) < 0.2, during  # mostly not resident while it runs (cachestat, no reads)
    assert ev["evictions"] > 10
    assert s["cache"] == "cold" and s["steps"] == 80
    base = cached_baseline["summary"]["batch_ms"]
    # slower than the cached pool by the device's reads: on this VM's disk (a 4 KiB read in ~30 us,
    # 96 rows a step over 32 threads) that is 1.45-2x the pool's own 1.7 ms (CI run 10: 2.44 vs
    # 1.68 ms); the margin is the device's, not the pool's overhead
    assert s["batch_ms"]["p50"] > 1.25 * base["p50"], (s["batch_ms"], base)
    assert not os.path.exists(workdir) and leftovers(os.getpid()) == []


@needs_root
def test_reclaim_cgroup_refaults():
    require("memory")
    with Scenario("reclaim", rows=ROWS, steps=150, gap_ms=2, memory_mib=8) as sc:
        cg = sc.cgroups["memory"]
        assert os.path.isdir(cg.path)
        assert sc.pid in cg.pids()  # moved in before it read anything, same pid
        table_bytes = os.path.getsize(sc.table_path)
        s = sc.wait()
        ev = sc.evidence()
        cg_path = cg.path
    assert s["steps"] == 150
    assert ev["failcnt"] > 0 or ev.get("max_events", 0) > 0  # the limit was hit
    assert ev["workingset_refault_file"] > 0  # reclaimed rows were read again
    assert ev.get("oom_kill", 0) == 0
    assert ev["table_resident"] * table_bytes < 12 * 2**20  # cache held near the 8 MiB budget
    assert not os.path.exists(cg_path) and leftovers(os.getpid()) == []


@needs_root
def test_storage_throttled_reads_take_milliseconds(cached_baseline):
    require("blkio")
    with Scenario("storage", rows=ROWS, steps=3, gap_ms=0, reader="serial", iops=200) as sc:
        assert sc.loop_dev in scenarios.loop_devices()
        assert any(m["mountpoint"] == sc.mountpoint for m in scenarios.mounts())
        assert sc.table_path.startswith(sc.mountpoint)
        throttle = sc.cgroups["blkio"].read("blkio.throttle.read_iops_device") \
            if sc.cgroups["blkio"].hier.version == 1 else sc.cgroups["blkio"].read("io.max")
        assert sc.loop_devno in throttle
        s = sc.wait()
        ev = sc.evidence()
    per_call_ms = s["batch_ms"]["mean"] * s["steps"] / s["calls"]  # serial: calls back to back
    assert per_call_ms >= 2.0, s  # throttled cold row reads: milliseconds ...
    assert cached_baseline["row_us"] < 100  # ... where cached ones take microseconds
    assert ev["throttled_reads"] > 100
    assert leftovers(os.getpid()) == []


# --------------------------------------------------------------------------- the CLI, signals


def _cli(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", BOOT, "lab", "scenario", *args], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_line(stream, pred, timeout: float = 60) -> list[str]:
    seen, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = stream.readline()
        if not line:
            break
        seen.append(line.rstrip("\n"))
        if pred(seen[-1]):
            return seen
    raise AssertionError(f"line not seen; got {seen}")


@needs_root
def test_cli_sigint_while_running_cleans_up(tmp_path):
    require("blkio")
    markers = tmp_path / "m.jsonl"
    p = _cli("storage", "--rows", str(ROWS), "--keep-running", "--json", "--markers", str(markers))
    try:
        ready = json.loads(p.stdout.readline())
        assert ready["event"] == "ready" and ready["scenario"] == "storage"
        err = _wait_line(p.stderr, lambda l: l.startswith("scenario: ready"))
        assert f"scenario: pid {ready['pid']}" in err and "lab: ready" in err
        assert leftovers(p.pid)  # cgroup, loop, mount, dir exist while it runs
        time.sleep(1.0)
        p.send_signal(signal.SIGINT)
        out, rest = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0, rest
    done = json.loads(out.strip().splitlines()[-1])
    assert done["event"] == "done" and done["summary"]["steps"] >= 1
    assert done["evidence"]["throttled_reads"] > 0
    assert len(markers_of(str(markers))) == done["summary"]["steps"]
    assert "scenario: removed" in rest
    assert leftovers(p.pid) == []
    assert not scenarios._pid_alive(ready["pid"])


@needs_root
def test_cli_sigint_during_setup_cleans_up(tmp_path):
    require("blkio")
    p = _cli("storage", "--rows", str(ROWS), "--keep-running", "--markers", str(tmp_path / "m"))
    try:
        _wait_line(p.stderr, lambda l: l.startswith("scenario: loop device"))  # mounted, not started
        p.send_signal(signal.SIGINT)
        _, rest = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode != 0
    assert leftovers(p.pid) == []


@needs_root
def test_killed_scenario_leftovers_are_removed_by_cleanup_stale(tmp_path):
    require("blkio")
    p = _cli("storage", "--rows", str(ROWS), "--keep-running", "--json", "--markers", str(tmp_path / "m"))
    try:
        ready = json.loads(p.stdout.readline())
        p.kill()  # no chance to clean up; the reader dies with it (PR_SET_PDEATHSIG)
        p.wait(10)
    finally:
        if p.poll() is None:
            p.kill()
    for _ in range(50):
        if not scenarios._pid_alive(ready["pid"]):
            break
        time.sleep(0.1)
    assert not scenarios._pid_alive(ready["pid"])
    left = leftovers(p.pid)
    assert any(x.startswith("mount") for x in left) and any(x.startswith("cgroup") for x in left)
    removed = scenarios.cleanup_stale()
    assert removed and leftovers(p.pid) == []
