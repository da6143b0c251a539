"""The device baseline (analysis/baseline.py) and thread kinds (analysis/thread_kinds.py) on
hand-built traces: the rules, each with a case that the old rule gets wrong.  No root."""
from __future__ import annotations

import json
import os
import subprocess
import time

import numpy as np
import pandas as pd
import pytest

from engramprof.analysis import baseline, thread_kinds
from engramprof.analysis.attribution import analyse
from engramprof.markers import MarkerWriter
from engramprof.sampling.rows import RowRecorder
from engramprof.sampling.sources import Notes, parse_diskstats

MS = 1_000_000
PAGES_PER_WINDOW = 2048  # an 8 MiB readahead window


def fault_rows(n: int, *, pages: int, bios: int, bio_ns: int, wait_ns: int, tid: int = 1, gap_ns: int = 50 * MS,
               kind: str = "fault") -> pd.DataFrame:
    """``n`` reads, one per marked batch, each bringing in ``pages`` pages in ``bios`` bios whose
    queue -> complete times sum to ``bio_ns``, waiting ``wait_ns`` off-CPU."""
    ts = np.arange(n, dtype=np.int64) * gap_ns + MS
    df = pd.DataFrame({"ts_ns": ts, "dur_ns": wait_ns + 100_000, "pid": 1, "tid": tid, "path": "/t.idx",
                       "offset": np.arange(n) * (pages * 4096), "size": 4096, "ret": np.nan, "flags": 0,
                       "pages_added": pages, "bio_count": bios, "bio_ns": bio_ns, "reclaim_ns": 0,
                       "offcpu_ns": wait_ns, "runq_ns": 0})
    df["kind"] = pd.Categorical([kind] * n, categories=["syscall", "fault"])
    return df


def marks(calls: pd.DataFrame, tid: int = 1, before_ns: int = 0, after_ns: int = 0) -> pd.DataFrame:
    return pd.DataFrame({"start_ns": calls["ts_ns"] - before_ns,
                         "end_ns": calls["ts_ns"] + calls["dur_ns"] + after_ns, "tid": tid})


# ------------------------------------------------------------------------------ baseline --

def test_readahead_sized_fault_on_a_healthy_device_is_residency():
    # each fault waits 20 ms for an 8 MiB readahead window: 8 bios of 1 MiB, 10 ms each
    # queue -> complete (they queue behind one another): the device's normal for 1 MiB reads.
    # Under the old rule (normal capped at 1000 us whatever the size) this was 90% storage.
    calls = fault_rows(20, pages=PAGES_PER_WINDOW, bios=8, bio_ns=8 * 10 * MS, wait_ns=20 * MS)
    _, s = analyse(calls, marks(calls))
    assert s["verdict"] == "residency", s["share"]
    assert s["share"]["storage"] < 0.05
    base = s["device_baseline"]
    assert base["classes"] == [{"bytes": 1 << 20, "normal_us": 10_000.0, "ios": 160,
                                "ceiling_us": pytest.approx(1000 + (1 << 20) / 100e6 * 1e6, abs=0.1)}]
    assert "device baseline" in s["normal_miss_source"]


def test_a_healthy_devices_spread_is_not_storage():
    # 4 KiB faults, one bio each, served as a queue serves: exponentially, mean 40 us (CI run
    # 12's residency-mmap case on a noisier disk said storage 55%).  Against the median, every
    # read above it was "slower than normal": about half of all miss time (1/e^ln2).  Against
    # the p90 of the device's own service, the spread left is 1/e^ln10 = 10%.
    rng = np.random.default_rng(7)
    bio = (rng.exponential(40_000, 2000) + 5_000).astype(np.int64)
    calls = fault_rows(2000, pages=1, bios=1, bio_ns=bio, wait_ns=bio, gap_ns=MS)
    _, s = analyse(calls, marks(calls))
    assert s["verdict"] == "residency", s["share"]
    assert s["share"]["storage"] < 0.15, s["share"]
    normal = s["device_baseline"]["classes"][0]["normal_us"]
    assert normal == pytest.approx(np.percentile(bio, 90) / 1e3, rel=0.02)


def test_a_device_slow_for_a_spell_is_storage():
    # the same device, healthy at 30 us, but one read in twenty took 800 us (a spell of slow
    # service, under the 1 ms ceiling): past the device's own p90, most of the miss time
    bio = np.full(2000, 30_000, dtype=np.int64)
    bio[::20] = 800_000
    calls = fault_rows(2000, pages=1, bios=1, bio_ns=bio, wait_ns=bio, gap_ns=MS)
    calls["dur_ns"] = bio + 5_000  # 5 us on a CPU: the fault is its wait
    _, s = analyse(calls, marks(calls))
    assert s["verdict"] == "storage", s["share"]


def test_a_slow_device_is_storage_at_every_size():
    # 1 MiB bios taking 80 ms each (12.5 MB/s): beyond the ceiling for their size
    calls = fault_rows(20, pages=PAGES_PER_WINDOW, bios=8, bio_ns=8 * 80 * MS, wait_ns=160 * MS)
    _, s = analyse(calls, marks(calls))
    assert s["verdict"] == "storage", s["share"]
    ceiling = float(baseline.ceiling_ns(1 << 20))
    assert s["share"]["storage"] == pytest.approx((1 - ceiling / (80 * MS)) * 160 / 160.1, rel=0.02)


def test_small_reads_keep_the_latency_ceiling():
    # 4 KiB reads that each take 9 ms: storage (the 1000 us cap of old still holds for them)
    calls = fault_rows(20, pages=1, bios=1, bio_ns=9 * MS, wait_ns=9 * MS)
    _, s = analyse(calls, marks(calls))
    assert s["verdict"] == "storage"


def test_normal_for_unmeasured_sizes_scales_from_the_nearest_measured_class():
    m = np.full(baseline.MAX_CLASS - baseline.MIN_CLASS + 1, np.nan)
    m[15 - baseline.MIN_CLASS] = 200_000.0  # 32 KiB reads: 200 us
    b = baseline.DeviceBaseline(m, np.zeros(len(m), dtype=np.int64), "test")
    got = b.normal_ns_for([4096, 32 << 10, 128 << 10, 8 << 20])
    assert got[0] == 200_000.0  # smaller: no faster than the measured latency
    assert got[1] == 200_000.0
    assert got[2] == 800_000.0  # bigger: bandwidth-bound, by size
    assert got[3] == 200_000.0 * 256  # 51.2 ms: under the 8 MiB ceiling (84.9 ms)
    slow = baseline.DeviceBaseline(m * 10, np.zeros(len(m), dtype=np.int64), "test")
    assert slow.normal_ns_for([8 << 20])[0] == pytest.approx(float(baseline.ceiling_ns(8 << 20)))  # capped


def test_direct_reads_are_sized_by_the_bytes_returned():
    # O_DIRECT: no page inserted, the bytes returned are what the bio read
    per = baseline.bytes_per_bio(np.array([0, 32]), np.array([2, 4]), np.array([1 << 20, 4096]))
    assert per.tolist() == [512 << 10, 32 * 4096 / 4]


def test_device_counters_are_the_baseline_when_the_trace_has_no_bios():
    # a throttled device: the bios are queued by the throttle's worker, not by the reader, so
    # no read event has a bio; the device itself served each 128 KiB read in 400 us
    calls = fault_rows(10, pages=32, bios=0, bio_ns=0, wait_ns=5 * MS)
    calls["dev"] = os.makedev(7, 3)
    t0, t1 = int(calls["ts_ns"].min()), int((calls["ts_ns"] + calls["dur_ns"]).max())
    disks = pd.DataFrame({"ts_ns": [t0 - 1, t1 // 2, t1 + 1, t1 + 10 * MS], "dev": [os.makedev(7, 3)] * 3 + [1],
                          "name": ["loop3"] * 3 + ["vda"], "reads": [0, 5, 5, 1000],
                          "read_sectors": [0, 1280, 1280, 8000], "read_ticks_ms": [0, 2, 2, 9000]})
    b = baseline.from_disk_counters(disks, [os.makedev(7, 3)], (t0, t1))
    assert b.source.startswith("the device's own counters")
    assert b.devices == [{"dev": "7:3", "name": "loop3", "reads": 10, "bytes_per_read": 131072,
                          "service_us_per_read": 400.0}]
    _, s = analyse(calls, marks(calls), samples={"disks": disks}, meta={})
    assert s["device_baseline"]["source"].startswith("the device's own counters")
    assert s["verdict"] == "storage" and s["share"]["storage"] > 0.9, s["share"]
    # the old rule had nothing to compare with: all of it residency
    _, s_old = analyse(calls, marks(calls))
    assert s_old["verdict"] == "residency"


def test_diskstats_rows_are_deltas_of_devices_that_read_or_wrote():
    notes = Notes()
    rows = RowRecorder(None, notes, lambda ts=None: "", None, 4)
    # loop0: an old kernel's 11 counters (no flush fields); vda: 17 (5.5+: discards, flushes)
    text = (b"   7       0 loop0 0 0 0 0 0 0 0 0 0 0 0\n"
            b" 254       0 vda 100 5 800 40 1 2 3 4 2 50 60 0 0 0 0 7 9\n")
    snap = {"ts_ns": 1, "psi": {}, "vmstat": None, "kswapd": [], "cgroup": None, "process": None, "threads": None,
            "disks": parse_diskstats(text)}
    assert snap["disks"][os.makedev(254, 0)][6:] == (1, 3, 7) and snap["disks"][os.makedev(7, 0)][6:] == (0, 0, 0)
    rows.record(snap)
    text2 = text.replace(b"vda 100 5 800 40", b"vda 110 5 880 52")
    rows.record({**snap, "ts_ns": 2, "disks": parse_diskstats(text2)})
    rows.record({**snap, "ts_ns": 3, "disks": parse_diskstats(text2)})  # nothing read or written: no row
    text4 = text2.replace(b"52 1 2 3 4 2 50 60 0 0 0 0 7 9", b"52 5 2 2051 4 2 50 60 0 0 0 0 9 9")
    rows.record({**snap, "ts_ns": 4, "disks": parse_diskstats(text4)})  # writes and flushes only: a row
    df = rows.series["disks"].frame()
    assert df[df["ts_ns"] == 2][["name", "reads", "read_sectors", "read_ticks_ms", "in_flight"]].values.tolist() == \
        [["vda", 10, 80, 12, 2]]
    assert df[df["ts_ns"] == 4][["reads", "writes", "write_sectors", "flushes"]].values.tolist() == [[0, 4, 2048, 2]]
    assert len(df) == 4  # two baselines, two deltas
    assert df["dev"].iloc[1] == os.makedev(254, 0)


def test_device_traffic_is_what_the_files_device_served_in_the_window():
    from engramprof.analysis.diagnose import traffic_line
    vda, loop = os.makedev(254, 0), os.makedev(7, 3)
    disks = pd.DataFrame({"ts_ns": [0, 5, 10, 15, 30], "dev": [vda, vda, loop, vda, vda],
                          "name": ["vda", "vda", "loop3", "vda", "vda"], "reads": [0, 10, 99, 20, 1000],
                          "read_sectors": [0, 80, 800, 160, 8000], "read_ticks_ms": [0, 1, 9, 2, 50],
                          "writes": [0, 100, 7, 300, 9999], "write_sectors": [0, 2048, 56, 2048, 1 << 20],
                          "flushes": [0, 2, 0, 3, 50]})
    t = baseline.device_traffic(disks, lambda: [vda], (1, 12))  # rounds 5 and 15 (the one after the end)
    assert (t["reads"], t["writes"], t["write_bytes"], t["flushes"]) == (30, 400, 4096 * 512, 5)
    assert t["seconds"] == pytest.approx(11e-9) and [d["name"] for d in t["devices"]] == ["vda"]
    line = traffic_line(t)
    assert "(vda) wrote 2.0 MiB in 400 writes and 5 cache flushes" in line
    # older traces (no write counters) and a device that wrote nothing: no line
    assert baseline.device_traffic(disks.drop(columns=["flushes"]), [vda], (1, 12)) is None
    quiet = disks.assign(writes=0, write_sectors=0, flushes=0)
    assert traffic_line(baseline.device_traffic(quiet, [vda], (1, 12))) == ""


# -------------------------------------------------------------------------- thread kinds --

def test_markers_carry_the_interpreter_threads(tmp_path):
    p = tmp_path / "m.jsonl"
    w = MarkerWriter(p)
    w.write(1, 2)
    w.write(3, 4)
    w.close()
    lines = [json.loads(x) for x in p.read_text().splitlines()]
    assert lines[0]["python_tids"] == sorted({os.getpid()} | {t for t in lines[0]["python_tids"]})
    assert os.getpid() in lines[0]["python_tids"]  # the main thread's kernel id is the pid
    assert "python_tids" not in lines[1]  # unchanged: not repeated


def test_kinds_from_the_interpreter_list_then_names():
    threads = pd.DataFrame({"pid": [10, 10, 10, 10], "tid": [10, 11, 12, 13],
                            "name": ["python", "python", "iou-wrk-10", "rocksdb:low"]})
    listed = pd.DataFrame({"start_ns": [0], "end_ns": [1], "tid": [10], "python_tids": [[10, 11]]})
    k = thread_kinds.thread_kinds([10, 11, 12, 13, 14], listed, threads).set_index("tid")["kind"].to_dict()
    assert k == {10: "python", 11: "python", 12: "native", 13: "native", 14: "native"}
    k = thread_kinds.thread_kinds([10, 11, 12, 13], None, threads).set_index("tid")["kind"].to_dict()
    assert k == {10: "python", 11: "unknown", 12: "native", 13: "native"}
    table = pd.DataFrame({"tid": [11], "kind": ["native"], "source": ["py-spy: no Python frames"]})
    k = thread_kinds.thread_kinds([10, 11], listed, threads, table).set_index("tid")
    assert k.loc[11, "kind"] == "native" and k.loc[11, "source"].startswith("py-spy")


def test_a_process_that_is_not_cpython_has_only_native_threads():
    threads = pd.DataFrame({"pid": [10, 10, 20], "tid": [10, 11, 20], "name": ["fio", "fio", "python3"]})
    meta = {"processes": [{"pid": 10, "cpython": False, "cpython_evidence": "none of its 9 executable file mappings"},
                          {"pid": 20, "cpython": True, "cpython_evidence": "maps /usr/bin/python3.11"},
                          {"pid": 30, "cpython": None}]}
    no = thread_kinds.not_cpython_pids(meta)
    assert list(no) == [10] and "not CPython" in no[10]
    # tid 12: no name sampled, of the analysed process 10
    k = thread_kinds.thread_kinds([10, 11, 12, 20], None, threads, None, no, pid=10).set_index("tid")["kind"]
    assert k.to_dict() == {10: "native", 11: "native", 12: "native", 20: "python"}
    # a stack sampler that read an interpreter in the process overrides the mappings
    assert thread_kinds.not_cpython_pids({**meta, "stacks": {"processes": [10]}}) == {}
    # the sampler's word for the processes it followed (--children's forks, a cgroup's members);
    # the recorder's own for a process selected at the start comes first
    sampled = {"sampler": {"cpython": {"40": {"cpython": False, "evidence": "none of its 3"},
                                       "20": {"cpython": False, "evidence": "read while it was forking"}}}}
    assert sorted(thread_kinds.not_cpython_pids({**meta, **sampled})) == [10, 40]
    # before the recorder said: the main thread of any process runs the interpreter
    assert thread_kinds.thread_kinds([10], None, threads).set_index("tid").loc[10, "kind"] == "python"


@pytest.mark.parametrize("name, cpython", [
    ("python3.11", True), ("python3", True), ("python", True), ("python3.12d", True),
    ("libpython3.11.so.1.0", True), ("libpython3.so", True),
    ("fio", False), ("python3-config", False), ("pythonista", False), ("libpypy3-c.so", False),
    ("librocksdb.so.8", False)])
def test_cpython_file_names(name, cpython):
    from engramprof.host.interpreter import _CPYTHON_FILE

    assert bool(_CPYTHON_FILE.match(name)) is cpython


def test_runs_cpython_from_the_maps():
    from engramprof.host.interpreter import runs_cpython

    ok, why = runs_cpython(os.getpid())
    assert ok is True and "python" in why, why
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        for _ in range(100):  # until exec has replaced the forked Python
            ok, why = runs_cpython(sleeper.pid)
            if ok is False:
                break
            time.sleep(0.01)
        assert ok is False and "executable file mappings" in why, why
    finally:
        sleeper.kill()
        sleeper.wait()
    assert runs_cpython(2 ** 22 + 1)[0] is None  # no such process: unknown


def _pool_batch(worker_kind_listed: bool):
    """A marked batch [0, 10 ms]: the submitter (tid 1) hands two reads to a worker (tid 2);
    1 ms passes before the first read and 4 ms between them (the worker off a CPU)."""
    calls = pd.DataFrame({"ts_ns": [1 * MS, 6 * MS], "dur_ns": [1 * MS, 1 * MS], "pid": 1, "tid": 2, "path": "/t",
                          "offset": [0, 4096], "size": 4096, "ret": 4096, "flags": 0, "pages_added": 0,
                          "bio_count": 0, "bio_ns": 0, "reclaim_ns": 0, "offcpu_ns": 0, "runq_ns": 0})
    m = pd.DataFrame({"start_ns": [0], "end_ns": [10 * MS], "tid": [1],
                      "python_tids": [[1, 2] if worker_kind_listed else [1]]})
    return calls, m


def test_a_native_pools_gaps_are_not_python_scheduling():
    calls, m = _pool_batch(worker_kind_listed=True)
    _, py = analyse(calls, m)
    assert py["share"]["python-scheduling"] > 0.7  # a Python pool's hand-offs: 8 of 10 ms
    calls, m = _pool_batch(worker_kind_listed=False)
    _, nat = analyse(calls, m)
    assert nat["share"]["python-scheduling"] == 0.0
    assert nat["verdict"] == "healthy"
    assert nat["native_pool_wait"]["ms"] == pytest.approx(8.0, abs=0.01)  # less the 2 us loop allowance
    assert nat["thread_kinds"]["counts"]["native"] == 1


def test_a_mapped_batch_waiting_for_a_native_thread_is_a_native_pool_wait():
    # no read event: rows mapped and resident.  The submitter (tid 1) is off a CPU for 8 of the
    # batch's 10 ms, woken by tid 2: a Python worker (python-scheduling) or an OpenMP one
    calls = fault_rows(0, pages=0, bios=0, bio_ns=0, wait_ns=0)
    offcpu = pd.DataFrame({"tid": [1, 2], "start_ns": [1 * MS, 9 * MS], "end_ns": [9 * MS, 9_500_000],
                           "preempted": [False, False], "waker_tid": [2, 1], "waker_pid": [1, 1]})
    meta = {"fault_probe": True, "start_ns": 0, "end_ns": 10 * MS}
    for listed, cause in (([1, 2], "python-scheduling"), ([1], "cpu-copy")):
        m = pd.DataFrame({"start_ns": [0], "end_ns": [10 * MS], "tid": [1], "python_tids": [listed]})
        _, s = analyse(calls, m, samples={"offcpu": offcpu}, meta=meta)
        assert s["share"][cause] == pytest.approx(1.0 if cause == "cpu-copy" else 0.8), (listed, s["share"])


def test_threads_the_interpreter_list_never_held_are_native_without_markers_lists():
    # markers without python_tids; a sampler's table read the interpreter at its rounds: tid 1
    # Python, tid 3 native.  Tid 2 lived between two rounds (faiss's per-search prefetch
    # threads live ~13 ms): never listed, so native; the submitter's preempted wait while it ran
    # is that pool's, not python-scheduling.  Without the table, tid 2 is unknown (Python).
    calls = fault_rows(0, pages=0, bios=0, bio_ns=0, wait_ns=0)
    offcpu = pd.DataFrame({"tid": [1, 2], "start_ns": [1 * MS, 1 * MS], "end_ns": [9 * MS, 2 * MS],
                           "preempted": [True, True], "waker_tid": [-1, 1], "waker_pid": [-1, 1]})
    meta = {"fault_probe": True, "start_ns": 0, "end_ns": 10 * MS}
    m = pd.DataFrame({"start_ns": [0], "end_ns": [10 * MS], "tid": [1]})
    table = pd.DataFrame({"pid": [1, 1], "tid": [1, 3], "kind": ["python", "native"],
                          "source": ["py-spy: a Python thread state", "py-spy: in /proc/PID/task"]})
    k = thread_kinds.thread_kinds([1, 2, 3], m, None, table).set_index("tid")
    assert k.loc[2, "kind"] == "native" and "never in the interpreter" in k.loc[2, "source"]
    assert thread_kinds.thread_kinds([1, 2], m, None, None).set_index("tid").loc[2, "kind"] == "unknown"

    class WithTable:  # a Trace-like input: its calls, samples and tables
        def __init__(self):
            self.calls, self.meta = calls, meta

        def samples(self, name):
            return offcpu if name == "offcpu" else None

        def table(self, name):
            return table if name == "thread_kinds" else None

    _, s = analyse(WithTable(), m)
    assert s["share"]["cpu-copy"] == pytest.approx(1.0), s["share"]
    _, s = analyse(calls, m, samples={"offcpu": offcpu}, meta=meta)  # no table: the old answer
    assert s["share"]["python-scheduling"] == pytest.approx(0.8), s["share"]


def _queued_windows(mb_s: float, batches: int = 4, threads: int = 8) -> pd.DataFrame:
    """``threads`` threads each fault an 8 MiB readahead window (8 bios of 1 MiB) at the same
    instant, every batch: the device serves the 64 MiB at ``mb_s``, so each fault and each of
    its bios waits for the whole queue (the reader's own readahead ahead of it)."""
    wait = int(threads * 8 * (1 << 20) / (mb_s * 1e6) * 1e9)
    rows = []
    for b in range(batches):
        for t in range(threads):
            rows.append(fault_rows(1, pages=PAGES_PER_WINDOW, bios=8, bio_ns=8 * wait, wait_ns=wait, tid=t + 1)
                        .assign(ts_ns=MS + b * (wait + 50 * MS)))
    return pd.concat(rows, ignore_index=True)


def test_a_queue_of_the_readers_own_windows_on_a_healthy_device_is_residency():
    # 8 threads x 8 MiB at 200 MB/s: each 1 MiB bio takes 335 ms queue -> complete, far past the
    # ceiling for 1 MiB (11.5 ms) -- but behind 56 MiB of the reader's own reads beside it,
    # which a device at the 100 MB/s floor serves in 587 ms: normal.  (The old rule: 97% storage.)
    calls = _queued_windows(200)
    m = pd.DataFrame({"start_ns": calls.groupby(calls.index // 8)["ts_ns"].min().to_numpy(),
                      "end_ns": (calls["ts_ns"] + calls["dur_ns"]).groupby(calls.index // 8).max().to_numpy(),
                      "tid": 1})
    _, s = analyse(calls, m)
    assert s["verdict"] == "residency" and s["share"]["storage"] < 0.02, s["share"]
    # the same queue on a device at 12.5 MB/s (5.4 s a batch): slower than the floor allows
    calls = _queued_windows(12.5)
    m = pd.DataFrame({"start_ns": calls.groupby(calls.index // 8)["ts_ns"].min().to_numpy(),
                      "end_ns": (calls["ts_ns"] + calls["dur_ns"]).groupby(calls.index // 8).max().to_numpy(),
                      "tid": 1})
    _, s = analyse(calls, m)
    assert s["verdict"] == "storage" and s["share"]["storage"] > 0.8, s["share"]


def test_bytes_read_beside_is_the_overlap_weighted_sum_of_the_other_reads():
    from engramprof.analysis.components import bytes_read_beside

    rng = np.random.default_rng(3)
    n = 120
    s = rng.integers(0, 10**6, n)  # unsorted on purpose
    e = s + rng.integers(0, 10**5, n)  # some of zero length
    own = rng.random(n) < 0.7
    b = rng.integers(0, 10**6, n).astype(float)
    want = [sum(b[j] * max(0, min(e[i], e[j]) - max(s[i], s[j])) / (e[j] - s[j])
                for j in range(n) if own[j] and j != i and e[j] > s[j]) for i in range(n)]
    assert bytes_read_beside(s, e, own, b) == pytest.approx(want, rel=1e-9, abs=1e-6)
    at = rng.random(n) < 0.3  # only some events' figures asked: the others 0, the rate unchanged
    assert bytes_read_beside(s, e, own, b, at) == pytest.approx(np.where(at, want, 0.0), rel=1e-9, abs=1e-6)


def test_diagnose_limits_do_not_speak_of_python_for_a_native_reader():
    from engramprof.analysis.diagnose import limits

    rec = {"duration_s": 8.0, "end_reason": "duration"}
    native = limits({"thread_kinds": {"counts": {"python": 0, "native": 3, "unknown": 0}}}, rec, 8.0, False)
    assert not any("Python" in x for x in native) and any("hand-offs to its threads" in x for x in native)
    assert any("Python scheduling is under-counted" in x for x in limits({}, rec, 8.0, False))


def test_storage_fix_names_the_writes_when_the_device_wrote_more_than_it_read():
    from engramprof.analysis.advice import advice_for
    traffic = {"reads": 2_900, "read_bytes": 12 << 20, "writes": 400, "write_bytes": 64 << 20, "flushes": 30,
               "seconds": 9.0, "devices": [{"dev": "254:0", "name": "vda", "writes": 400, "flushes": 30}]}
    fix = advice_for("storage", "syscalls", {"device_traffic": traffic})["fix"]
    assert fix.startswith("The device (vda) wrote 64 MiB in 400 writes and served 30 cache flushes while it read "
                          "12 MiB"), fix
    # a device that read more than it wrote, no counters, or another verdict: the plain advice
    plain = advice_for("storage", "syscalls", {})["fix"]
    assert advice_for("storage", "syscalls", {"device_traffic": {**traffic, "write_bytes": 1 << 20}})["fix"] == plain
    assert advice_for("storage", "syscalls", {"device_traffic": None})["fix"] == plain
    assert "wrote" not in advice_for("residency", "syscalls", {"device_traffic": traffic})["fix"]
